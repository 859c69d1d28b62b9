"""Ansible filters for the nvidia_driver role: thin adapters over twinspark.gpu and twinspark.driver_plan.

The decisions live in Python (unit-tested there); these filters only convert Ansible data to and from it and turn
PlanError into a task failure whose message names the variable and the fix.
"""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))  # python_tools/ on sys.path

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from twinspark import driver_plan, gpu


def _plan_errors(function):
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except driver_plan.PlanError as error:
            raise AnsibleFilterError(str(error)) from None

    wrapper.__name__ = function.__name__
    wrapper.__doc__ = function.__doc__
    return wrapper


@_plan_errors
def twinspark_driver_default_mode(profile):
    """twinspark_profile -> the nvidia_driver_mode used when inventory sets none."""
    return driver_plan.default_mode(str(profile))


@_plan_errors
def twinspark_driver_plan(facts):
    """A mapping of node facts and role variables -> the plan (see driver_plan.install_plan)."""
    facts = dict(facts)
    for flag in ("dgx_os", "nccl_install"):
        if flag in facts:
            facts[flag] = boolean(facts[flag], strict=False)
    return driver_plan.install_plan(**facts)


def twinspark_nvidia_smi_query_args(_unused=None):
    """The nvidia-smi arguments whose output twinspark.gpu parses (one list, kept in Python)."""
    return gpu.query_command("nvidia-smi")[1:]


def twinspark_driver_assess(probe):
    """Probe results -> {'gpu': ..., 'reboot_reasons': [...], 'findings': [...], 'action': ..., 'message': ...}.

    probe keys: mode, rebooted, reboot_allowed, smi_present, smi_path, smi_rc, smi_stdout, smi_stderr,
    loaded_module_version, installed_module_version, branch, expected_gpu_name, require_persistence.
    """
    if boolean(probe.get("smi_present", False), strict=False):
        query = gpu.parse_query_output(
            probe.get("smi_stdout") or "",
            probe.get("smi_stderr") or "",
            int(probe.get("smi_rc") or 0),
        )
    else:
        query = gpu.missing_binary(probe.get("smi_path") or gpu.DEFAULT_NVIDIA_SMI)
    assessment = driver_plan.assess(
        query,
        loaded_module_version=probe.get("loaded_module_version"),
        installed_module_version=probe.get("installed_module_version"),
        required_branch=int(probe["branch"]),
        expected_gpu_name=probe.get("expected_gpu_name") or "",
        require_persistence=boolean(
            probe.get("require_persistence", True), strict=False
        ),
    )
    step = driver_plan.next_step(
        probe["mode"],
        assessment,
        rebooted=boolean(probe.get("rebooted", False), strict=False),
        reboot_allowed=boolean(probe.get("reboot_allowed", True), strict=False),
    )
    return {
        "gpu": query.to_dict(),
        "summary": driver_plan.summary(query),
        "reboot_reasons": list(assessment.reboot_reasons),
        "findings": list(assessment.findings),
        "action": step.action,
        "message": step.message,
    }


@_plan_errors
def twinspark_driver_holds(dpkg_query_output, branch, cuda_version, nccl):
    """dpkg-query output -> the installed packages to hold (driver branch, toolkit, NCCL)."""
    installed = driver_plan.parse_dpkg_query(dpkg_query_output or "")
    return driver_plan.packages_to_hold(
        installed,
        branch=int(branch),
        cuda_version=str(cuda_version),
        nccl=boolean(nccl, strict=False),
    )


@_plan_errors
def twinspark_driver_releases(dpkg_query_output, branch):
    """dpkg-query output -> installed packages of other driver branches (unheld before a branch change)."""
    return driver_plan.packages_to_release(
        driver_plan.parse_dpkg_query(dpkg_query_output or ""), branch=int(branch)
    )


def twinspark_gpg_fingerprints(colons_output):
    """`gpg --show-keys --with-colons` output -> primary key fingerprints."""
    return driver_plan.gpg_fingerprints(colons_output or "")


class FilterModule:
    def filters(self):
        return {
            "twinspark_driver_default_mode": twinspark_driver_default_mode,
            "twinspark_driver_plan": twinspark_driver_plan,
            "twinspark_driver_assess": twinspark_driver_assess,
            "twinspark_driver_holds": twinspark_driver_holds,
            "twinspark_driver_releases": twinspark_driver_releases,
            "twinspark_gpg_fingerprints": twinspark_gpg_fingerprints,
            "twinspark_nvidia_smi_query_args": twinspark_nvidia_smi_query_args,
        }
