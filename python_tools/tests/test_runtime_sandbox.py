"""How root runs `twinspark runtime check` during provisioning: as the serving account, in a sandboxed transient unit.

The argv is a pure function of the layout (twinspark.runtime.sandbox); test_unit_hardening.py checks the same argv as
the vllm_service role renders it from the simulated pair's and the example inventory's values.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from twinspark import generate, layout
from twinspark.runtime import sandbox

ROOT = generate.repo_root()

LAYOUT = layout.default()
COMMAND = sandbox.check_command(LAYOUT.venv + "/bin/python", [LAYOUT.serve_env, LAYOUT.secrets_env])


def _properties(argv: list[str]) -> list[str]:
    return [word.removeprefix("--property=") for word in argv[:argv.index("--")] if word.startswith("--property=")]


@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_root_only_asks_systemd_to_start_the_check_as_the_serving_account(profile):
    argv = sandbox.wrap(COMMAND, profile, LAYOUT.service_user, LAYOUT.secrets_env)
    # root execs timeout and systemd-run only: the venv's interpreter is the unit's command, after "--"
    assert argv[:2] == ["timeout", "660"] and argv[2] == "systemd-run"
    assert {"--wait", "--pipe", "--collect", "--quiet"} <= set(argv[:argv.index("--")])
    assert argv[argv.index("--") + 1:] == COMMAND
    assert LAYOUT.venv not in " ".join(argv[:argv.index("--")])
    props = _properties(argv)
    assert f"User={LAYOUT.service_user}" in props and not any(p.startswith("Group=") for p in props)
    for needed in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                   "PrivateNetwork=yes", "IPAddressDeny=any", "CapabilityBoundingSet=", "AmbientCapabilities=",
                   "RuntimeMaxSec=600", "DevicePolicy=closed"):
        assert needed in props, needed
    # nothing writable but the private /tmp, and no device beyond the profile's
    assert not any(p.startswith(("ReadWritePaths=", "StateDirectory=", "CacheDirectory=")) for p in props)
    assert ("PrivateDevices=yes" in props) == (profile == "cpu")
    assert not any("infiniband" in p for p in props)


def test_secrets_reach_the_check_as_a_credential_the_launcher_finds(tmp_path):
    """No key in argv: secrets.env travels by path as a systemd credential, and the launcher reads the unit's copy
    when the path it was given is unreadable to it (here: absent)."""
    from twinspark import launcher

    secrets = str(tmp_path / "etc" / "secrets.env")
    argv = sandbox.wrap(sandbox.check_command("/py", ["/serve.env", secrets]), "cpu",
                        LAYOUT.service_user, secrets)
    (credential,) = [p.removeprefix("LoadCredential=") for p in _properties(argv) if p.startswith("LoadCredential=")]
    name, source = credential.split(":", 1)
    assert source == secrets
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / name).write_text("VLLM_API_KEY=k\n")
    assert launcher.credential_fallback([secrets], {"CREDENTIALS_DIRECTORY": str(credentials)}) == \
        [str(credentials / name)]


@pytest.mark.parametrize("user", ["root", ""])
def test_the_check_is_never_wrapped_to_run_as_root(user):
    with pytest.raises(ValueError, match="never as root"):
        sandbox.wrap(COMMAND, "cpu", user, LAYOUT.secrets_env)


def test_an_unknown_profile_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="profile must be one of cpu, gb10"):
        sandbox.properties("tpu", LAYOUT.service_user, LAYOUT.secrets_env)


def test_the_filter_the_roles_call_is_the_rule_itself():
    from test_first_boot_budget import load_filters

    filters = load_filters("twinspark_service")
    assert filters.twinspark_runtime_check_sandbox(COMMAND, "gb10", "twinspark", LAYOUT.secrets_env) == \
        sandbox.wrap(COMMAND, "gb10", "twinspark", LAYOUT.secrets_env)
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="never as root"):
        filters.twinspark_runtime_check_sandbox(COMMAND, "gb10", "root", LAYOUT.secrets_env)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_the_check_units_exposure_is_below_the_ranks(tmp_path, profile):
    """The same properties as a unit file, measured like the installed units (test_unit_hardening.py): well below
    the rank's own ceiling (3.0), since the check has no network and no device beyond the GPU."""
    unit = tmp_path / "twinspark-runtime-check.service"
    unit.write_text(sandbox.unit_text(COMMAND, profile, LAYOUT.service_user, LAYOUT.secrets_env))
    done = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
                          capture_output=True, text=True, timeout=60, check=False)
    if "Overall exposure level" not in done.stdout:
        pytest.skip("this systemd-analyze has no --offline")
    score = float(done.stdout.split("Overall exposure level for")[1].split(":")[1].split()[0])
    assert score <= 1.5, done.stdout[-2000:]



@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_the_fabric_bench_runs_as_the_serving_account_with_the_network_and_its_variables(profile):
    command = [LAYOUT.python, "-I", "-m", "twinspark.cli", "fabric", "bench", "--rank", "0"]
    argv = sandbox.wrap_fabric_bench(command, profile, LAYOUT.service_user, {"NCCL_IB_HCA": "=roce0"}, 780)
    assert argv[:3] == ["timeout", "840", "systemd-run"] and argv[argv.index("--") + 1:] == command
    assert "--setenv=NCCL_IB_HCA==roce0" in argv
    props = _properties(argv)
    assert f"User={LAYOUT.service_user}" in props and "RuntimeMaxSec=780" in props
    assert "LimitMEMLOCK=infinity" in props and "CapabilityBoundingSet=" in props
    # it measures the fabric: the network stays, and on gb10 the RDMA verbs are open to it
    assert "PrivateNetwork=yes" not in props and "IPAddressDeny=any" not in props
    assert ("DeviceAllow=char-infiniband_verbs rw" in props) == (profile == "gb10")
    assert not any(p.startswith("LoadCredential=") for p in props)


# A task that starts the runtime's code (vLLM or torch) by one of these verbs must build its argv through a sandbox
# filter; a variable holding such an argv is checked where it is rendered (test_unit_hardening.py).
RUNTIME_VERBS = re.compile(r"\bruntime\b\W+check\b|\bfabric\b\W+bench\b")
COMMAND_KEYS = ("ansible.builtin.command", "ansible.builtin.shell", "command", "shell")


def _unsandboxed(text: str) -> list[str]:
    from test_entry_points import _tasks

    found = []
    for task in _tasks(yaml.safe_load(text)):
        for key in COMMAND_KEYS:
            spec = str(task.get(key, ""))
            if RUNTIME_VERBS.search(spec) and "_sandbox(" not in spec:
                found.append(str(task.get("name")))
    return found


def test_no_task_starts_the_runtime_check_or_the_fabric_bench_as_root():
    from test_entry_points import _yaml_files

    offenders = {str(path.relative_to(ROOT)): names for path in _yaml_files()
                 if (names := _unsandboxed(path.read_text()))}
    assert offenders == {}


# Two tasks as they were before the check was sandboxed (playbooks/upgrade.yml, playbooks/fabric-check.yml).
ROOTS_TASKS = """
- name: A play
  hosts: twinspark_pair
  tasks:
    - name: Ask the new runtime's vLLM whether it accepts this node's env files
      ansible.builtin.command:
        argv: [timeout, "600", /opt/twinspark/runtimes/new/venv/bin/twinspark, runtime, check,
               --env, /etc/twinspark/serve.env, --env, /etc/twinspark/secrets.env]
    - name: Bench
      block:
        - name: Run the all_reduce benchmark on both nodes at once
          ansible.builtin.command:
            argv: "{{ [fabric_check_twinspark, 'fabric', 'bench', '--rank', '0'] }}"
    - name: Runtime facts are no check
      ansible.builtin.command:
        argv: [/opt/twinspark/venv/bin/twinspark, runtime, facts, --json]
"""


def test_the_rule_names_the_tasks_that_started_the_check_as_root():
    assert _unsandboxed(ROOTS_TASKS) == ["Ask the new runtime's vLLM whether it accepts this node's env files",
                                         "Run the all_reduce benchmark on both nodes at once"]
    sandboxed = ROOTS_TASKS.replace("'--rank', '0'] }}", "'--rank', '0'] | twinspark_fabric_bench_sandbox('cpu') }}")
    assert _unsandboxed(sandboxed) == ["Ask the new runtime's vLLM whether it accepts this node's env files"]


def test_the_workers_check_gets_no_secret():
    """Issue 43, row 11: the worker's rank never gets secrets.env, so its runtime check must not either."""
    argv = sandbox.wrap(sandbox.check_command("/py", ["/serve.env"]), "cpu", LAYOUT.service_user, "")
    assert not [p for p in _properties(argv) if p.startswith("LoadCredential=")]
    assert "secrets.env" not in " ".join(argv)
