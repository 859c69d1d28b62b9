"""Run one of tests/playbooks/ with this venv's ansible-playbook against localhost (local connection).

`run(playbook, extra, *options)` returns (exit code, stdout+stderr, the recap's ok/changed/failed counts for
localhost, empty when there is no recap); skips the test when ansible-playbook is not installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
PLAYBOOKS = Path(__file__).parent / "playbooks"
_RECAP = re.compile(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)")


def environment() -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}


def run(playbook: str, extra: dict, *options: str, inventory: str = "localhost,", env: dict | None = None,
        timeout: int = 300) -> tuple[int, str, dict]:
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK} not installed (pip install the controller extras)")
    connection = ["-c", "local"] if inventory == "localhost," else []
    done = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", inventory, *connection, str(PLAYBOOKS / playbook), "-e", json.dumps(extra),
         *options],
        cwd=ROOT, env=env or environment(), capture_output=True, text=True, timeout=timeout, check=False)
    output = done.stdout + done.stderr
    recap = _RECAP.search(output)
    counts = dict(zip(("ok", "changed", "failed"), map(int, recap.groups()), strict=True)) if recap else {}
    return done.returncode, output, counts
