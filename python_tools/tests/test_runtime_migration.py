"""Role vllm_runtime's migration from the previous layout (tasks/migrate.yml), run for real on this machine
(connection local) in a temporary directory that stands in for /var/lib/twinspark and /var/lib/twinspark-control.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from twinspark import generate

ROOT = generate.repo_root()
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the tasks set owner root: run as root")


def _migrate(tmp_path: Path) -> dict:
    """Run tasks/migrate.yml once; the play recap's counts for localhost."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Migrate", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"vllm_runtime_legacy_restart_flag": str(tmp_path / "state" / "restart-pending"),
                 "vllm_runtime_legacy_key_dir": str(tmp_path / "state" / "ssh"),
                 "twinspark_layout_restart_flag": str(tmp_path / "control" / "restart-pending")},
        "tasks": [{"name": "The role's migration",
                   "ansible.builtin.import_tasks": str(ROOT / "roles/vllm_runtime/tasks/migrate.yml")}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    argv = [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
            str(playbook)]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    recap = re.search(r"^localhost\s+:\s+(.*)$", result.stdout, re.M)
    assert recap, result.stdout
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", recap.group(1))}


@pytest.fixture
def layout(tmp_path):
    (tmp_path / "state" / "ssh").mkdir(parents=True)
    (tmp_path / "control").mkdir(mode=0o700)
    (tmp_path / "state" / "ssh" / "model_sync_ed25519").write_text("old key\n")
    return tmp_path


def test_a_pending_restart_carries_over_and_the_old_flag_and_key_go(layout):
    (layout / "state" / "restart-pending").write_text("")
    stats = _migrate(layout)
    assert stats["changed"] == 2
    flag = layout / "control" / "restart-pending"
    assert flag.is_file() and (flag.stat().st_uid, flag.stat().st_mode & 0o777) == (0, 0o600)
    assert not (layout / "state" / "restart-pending").exists()
    assert not (layout / "state" / "ssh").exists()
    assert _migrate(layout)["changed"] == 0, "a second run must change nothing"


def test_a_planted_link_in_place_of_the_old_flag_is_removed_not_followed(layout):
    victim = layout / "victim"
    victim.write_text("another account's file\n")
    os.chown(victim, 65534, 65534)
    victim.chmod(0o600)
    (layout / "state" / "restart-pending").symlink_to(victim)
    (layout / "state" / "ssh").rename(layout / "state" / "ssh-real")
    (layout / "state" / "ssh").symlink_to(layout / "state" / "ssh-real")
    _migrate(layout)
    assert not (layout / "control" / "restart-pending").exists(), "a link is no pending restart"
    assert not os.path.lexists(layout / "state" / "restart-pending")
    assert not os.path.lexists(layout / "state" / "ssh")
    assert (layout / "state" / "ssh-real" / "model_sync_ed25519").exists(), "the link's target is left alone"
    info = victim.stat()
    assert (info.st_uid, info.st_mode & 0o777, victim.read_text()) == (65534, 0o600, "another account's file\n")
