"""How root runs `twinspark runtime check` during provisioning: as the serving account, in a sandboxed transient unit.

The argv is a pure function of the layout (twinspark.runtime_sandbox); test_unit_hardening.py checks the same argv as
the vllm_service role renders it from the simulated pair's and the example inventory's values.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from twinspark import layout, runtime_sandbox

LAYOUT = layout.default()
COMMAND = runtime_sandbox.check_command(LAYOUT.venv + "/bin/python", [LAYOUT.serve_env, LAYOUT.secrets_env])


def _properties(argv: list[str]) -> list[str]:
    return [word.removeprefix("--property=") for word in argv[:argv.index("--")] if word.startswith("--property=")]


@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_root_only_asks_systemd_to_start_the_check_as_the_serving_account(profile):
    argv = runtime_sandbox.wrap(COMMAND, profile, LAYOUT.service_user, LAYOUT.secrets_env)
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
    argv = runtime_sandbox.wrap(runtime_sandbox.check_command("/py", ["/serve.env", secrets]), "cpu",
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
        runtime_sandbox.wrap(COMMAND, "cpu", user, LAYOUT.secrets_env)


def test_an_unknown_profile_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="profile must be one of cpu, gb10"):
        runtime_sandbox.properties("tpu", LAYOUT.service_user, LAYOUT.secrets_env)


def test_the_filter_the_roles_call_is_the_rule_itself():
    from test_first_boot_budget import load_filters

    filters = load_filters("twinspark_service")
    assert filters.twinspark_runtime_check_sandbox(COMMAND, "gb10", "twinspark", LAYOUT.secrets_env) == \
        runtime_sandbox.wrap(COMMAND, "gb10", "twinspark", LAYOUT.secrets_env)
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="never as root"):
        filters.twinspark_runtime_check_sandbox(COMMAND, "gb10", "root", LAYOUT.secrets_env)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_the_check_units_exposure_is_below_the_ranks(tmp_path, profile):
    """The same properties as a unit file, measured like the installed units (test_unit_hardening.py): well below
    the rank's own ceiling (3.0), since the check has no network and no device beyond the GPU."""
    unit = tmp_path / "twinspark-runtime-check.service"
    unit.write_text(runtime_sandbox.unit_text(COMMAND, profile, LAYOUT.service_user, LAYOUT.secrets_env))
    done = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
                          capture_output=True, text=True, timeout=60, check=False)
    if "Overall exposure level" not in done.stdout:
        pytest.skip("this systemd-analyze has no --offline")
    score = float(done.stdout.split("Overall exposure level for")[1].split(":")[1].split()[0])
    assert score <= 1.5, done.stdout[-2000:]

