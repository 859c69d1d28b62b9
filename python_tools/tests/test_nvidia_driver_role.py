"""The nvidia_driver role's own tasks, run by ansible-playbook on localhost with facts supplied.

Nothing on this host is changed: the playbook (python_tools/tests/playbooks/nvidia_driver_decisions.yml) runs
only the role's decision and rendering tasks, renders the repository's sources file into a temporary directory,
feeds the verdict tasks the handshaped_nvidia_smi_* fixtures in place of a GPU, and runs the whole role in skip
mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
REPO = TESTS.parent.parent
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
UBUNTU_2404_ARM64 = {"distribution": "Ubuntu", "distribution_version": "24.04", "architecture": "aarch64"}

# Every test here runs the role through ansible-playbook (module fixture): the fixture marks them slow.
pytestmark = pytest.mark.usefixtures("ansible_playbook")

@pytest.fixture(scope="module")
def role_run(tmp_path_factory):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK} not installed (pip install the controller extras)")
    out_dir = tmp_path_factory.mktemp("nvidia_driver")
    extra = {
        "out_dir": str(out_dir),
        "fixtures_dir": str(TESTS / "fixtures"),
        "ansible_python_interpreter": sys.executable,
        "ansible_facts": UBUNTU_2404_ARM64,
    }
    completed = subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            "-i",
            "localhost,",
            "-c",
            "local",
            str(TESTS / "playbooks" / "nvidia_driver_decisions.yml"),
            "-e",
            json.dumps(extra),
        ],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    return out_dir, completed.stdout


@pytest.mark.slow(13)
def test_rendered_sources_file_is_nvidias_sbsa_repository_signed_by_the_pinned_keyring(role_run):
    out_dir, _ = role_run
    lines = (out_dir / "nvidia-cuda.sources").read_text().splitlines()
    assert lines[1] == "# Ansible managed"
    fields = dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))
    assert fields == {
        "Types": "deb",
        "URIs": "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/",
        "Suites": "/",
        "Architectures": "arm64",
        "Signed-By": "/etc/apt/keyrings/nvidia-cuda.asc",
    }


def test_role_plans_the_pinned_driver_toolkit_nccl_and_key_for_ubuntu_arm64(role_run):
    out_dir, _ = role_run
    plan = json.loads((out_dir / "plan_install.json").read_text())
    assert plan["driver_packages"] == ["nvidia-driver-580-open"]
    assert plan["toolkit_packages"] == ["cuda-toolkit-13-0"]
    assert plan["nccl_packages"] == ["libnccl2", "libnccl-dev"]
    assert plan["repository"]["key_url"].endswith("/ubuntu2404/sbsa/3bf863cc.pub")
    assert plan["repository"]["key_fingerprint"] == "EB693B3035CD5710E231E123A4B469963BF863CC"


def test_role_refuses_install_on_debian_naming_the_mode_and_the_release(role_run):
    out_dir, _ = role_run
    message = (out_dir / "plan_debian_error.txt").read_text()
    assert "nvidia_driver_mode=install supports Ubuntu 24.04 (this node runs Debian 12)" in message


def verdicts(role_run) -> dict:
    return json.loads((role_run[0] / "verdicts.json").read_text())


def test_role_verify_passes_on_handshaped_gb10_and_reports_it(role_run):
    verdict = verdicts(role_run)["verify_gb10_ok"]
    assert verdict["failed"] is False
    assert verdict["summary"] == "GPU 0 NVIDIA GB10, driver 580.95.05 (branch 580), persistence on"


def test_role_verify_fails_on_handshaped_mismatch_and_asks_for_a_reboot_it_does_not_do(role_run):
    verdict = verdicts(role_run)["verify_mismatch"]
    assert verdict["failed"] is True
    assert verdict["message"].startswith("localhost: this node needs a reboot: nvidia-smi reports a driver/library")
    assert "nvidia_driver_mode=verify changes nothing" in verdict["message"]


@pytest.mark.parametrize("case", ["install_mismatch", "install_module_changed", "install_fresh_module_not_loaded"])
def test_role_install_reboots_on_handshaped_mismatch_changed_or_unloaded_module(role_run, case):
    verdict = verdicts(role_run)[case]
    assert verdict["action"] == "reboot" and verdict["failed"] is False
    assert verdict["message"].startswith("rebooting to load the NVIDIA driver: ")


@pytest.mark.parametrize(
    ("case", "finding"),
    [
        ("verify_old_branch", "GPU 0 runs driver 575.57.08, but TwinSpark needs branch 580 or newer"),
        ("verify_persistence_off", "persistence mode is off on GPU 0 (NVIDIA GB10)"),
        ("verify_no_devices", "the NVIDIA driver is loaded but reports no GPU"),
    ],
)
def test_role_verify_fails_on_handshaped_outputs_with_the_exact_finding(role_run, case, finding):
    verdict = verdicts(role_run)[case]
    assert verdict["failed"] is True
    assert verdict["message"].startswith(f"localhost: {finding}")


def test_skip_mode_prints_one_reason_and_runs_nothing_else(role_run):
    _, stdout = role_run
    skip_play = stdout[stdout.index("PLAY [Run the whole role in skip mode") :]
    tasks = [line for line in skip_play.splitlines() if line.startswith("TASK [")]
    # First the shared layout the role depends on (its profile): its argument check and its rules, which change
    # nothing on the node.
    assert [task.split("]")[0] for task in tasks] == [
        "TASK [twinspark_layout : Validating arguments against arg spec 'main' - The node layout every TwinSpark role "
        "shares (paths, unit names, pair id)",
        "TASK [twinspark_layout : Refuse per-role copies of the shared layout that are no longer read, and check the "
        "layout's own rules",
        "TASK [nvidia_driver : Validating arguments against arg spec 'main' - NVIDIA driver, CUDA toolkit and NCCL in "
        "verify, install or skip mode",
        "TASK [nvidia_driver : Say why the driver is left alone, and stop (skip mode)",
        "TASK [nvidia_driver : Report that the NVIDIA driver is skipped",
        "TASK [nvidia_driver : End the role here in skip mode",
    ]
    assert "nvidia_driver_mode=skip (the default for twinspark_profile=cpu" in " ".join(skip_play.split())
