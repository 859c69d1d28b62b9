"""Ansible filters for the vllm_service role: thin adapters over twinspark.api, twinspark.pair.lifecycle and
twinspark.runtime.sandbox.

How the head's API is reached (wildcard bind -> loopback, the first key), what makes the pair need an ordered
restart and how root starts the runtime check (as the serving account, sandboxed) are decided in Python, once, for
the playbooks and the pair guard alike.
"""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))  # python_tools/ on sys.path

from ansible.errors import AnsibleFilterError
from twinspark import api as head_api
from twinspark import budget
from twinspark.pair import lifecycle
from twinspark.runtime import sandbox


def twinspark_pair_api(env):
    """The head's node env (twinspark_node_env) -> {url, served_name, max_model_len, headers, keyed, ca} for probes
    (ca: the file on the head that its certificate is verified against; None when the API speaks plain HTTP).

    `headers` carries the API key: tasks using it set no_log.
    """
    try:
        api = head_api.api_from_env({str(k): str(v) for k, v in dict(env).items() if v is not None})
    except ValueError as error:
        raise AnsibleFilterError(str(error)) from None
    return {"url": api.url, "served_name": api.served_name, "max_model_len": api.max_model_len,
            "headers": api.headers(), "keyed": bool(api.api_key), "ca": api.ca}


def twinspark_first_boot_timers(env):
    """The head's node env (twinspark_node_env) -> every first-boot timer in seconds (twinspark.budget), from its
    TWINSPARK_PROFILE and TWINSPARK_FIRST_BOOT_BUDGET_S."""
    env = dict(env)
    try:
        return budget.first_boot_timers(str(env.get("TWINSPARK_PROFILE", "")), env.get(budget.BUDGET_ENV, ""))
    except ValueError as error:
        raise AnsibleFilterError(str(error)) from None


def twinspark_first_boot_retired(host_vars):
    """Lines naming each retired timer variable a host's inventory still sets (empty when none)."""
    return budget.retired_problems(host_vars)


def twinspark_pair_restart_reasons(probes, flag_path="restart-pending", unit="the rank's unit"):
    """Why the pair needs an ordered restart, one line per reason; empty when it does not
    (twinspark.pair.lifecycle.restart_reasons decides)."""
    return lifecycle.restart_reasons(probes, flag_path, unit)


def twinspark_runtime_check_sandbox(command, profile, user, secrets_env):
    """The runtime check's argv (a list) -> the argv root runs: systemd-run starting it as `user` in a sandboxed
    transient unit, with `secrets_env` as its credential (twinspark.runtime.sandbox.wrap)."""
    try:
        return sandbox.wrap([str(word) for word in command], str(profile), str(user), str(secrets_env))
    except ValueError as error:
        raise AnsibleFilterError(f"twinspark_runtime_check_sandbox: {error}") from None


def twinspark_fabric_bench_sandbox(command, profile, user, environment, timeout_s):
    """`twinspark fabric bench`'s argv -> the argv root runs: systemd-run starting it as `user` in a sandboxed
    transient unit with the network, the profile's devices and `environment` (twinspark.runtime.sandbox)."""
    try:
        return sandbox.wrap_fabric_bench([str(word) for word in command], str(profile), str(user),
                                         {str(k): str(v) for k, v in dict(environment).items()},
                                         int(timeout_s))
    except ValueError as error:
        raise AnsibleFilterError(f"twinspark_fabric_bench_sandbox: {error}") from None


class FilterModule:
    def filters(self):
        return {
            "twinspark_pair_api": twinspark_pair_api,
            "twinspark_pair_restart_reasons": twinspark_pair_restart_reasons,
            "twinspark_first_boot_timers": twinspark_first_boot_timers,
            "twinspark_first_boot_retired": twinspark_first_boot_retired,
            "twinspark_runtime_check_sandbox": twinspark_runtime_check_sandbox,
            "twinspark_fabric_bench_sandbox": twinspark_fabric_bench_sandbox,
        }
