"""`twinspark rotate tls` (playbooks/rotate.yml, role key_rotation, tasks/tls.yml): the refusals that come before any
host is touched, run for real on this machine (connection local, the simulated pair's inventory; no node is
reached). What happens on a serving head is proven by test_tls_refresh.py (vLLM's own refresher, the same
`twinspark tls` steps the role runs) and by the live check on a TLS-enabled simulated pair (README.md, "tls")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from twinspark import tls

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def rotate(*extra: str) -> tuple[int, str]:
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK} not installed")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "inventory/sim", "playbooks/rotate.yml", "-l",
                           "localhost,twinspark_head", "-e", "ansible_connection=local", "-e", "twinspark_rotate=tls",
                           *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow(15)
def test_rotating_tls_on_a_pair_without_tls_is_refused_and_changes_nothing():
    code, out = rotate()
    assert code != 0, out
    assert "TLS is off in the inventory" in out and "Nothing was changed." in out, out[-3000:]
    assert "changed=0" in out and "Read the head rank's unit" not in out


@pytest.mark.slow(15)
def test_a_new_key_that_is_not_the_certificates_own_stops_before_any_host(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    for name in "AB":
        tls.make_cert(tmp_path / name / "server.crt", tmp_path / name / "server.key", [], days=1)
    code, out = rotate("-e", f"twinspark_vllm_tls_cert={tmp_path}/A/server.crt",
                       "-e", f"twinspark_vllm_tls_key={tmp_path}/B/server.key")
    assert code != 0, out
    assert "twinspark_vllm_tls_key: " in out and "does not load with" in out, out[-3000:]
    assert "Rotate it on this pair" not in out, "the head was reached"
