"""Role vllm_runtime's migration from the previous layout (tasks/migrate.yml), run for real on this machine
(connection local) in a temporary directory that stands in for /var/lib/twinspark and /var/lib/twinspark-control.
Each case runs twice: alone (every path is looked at, as when system.yml's find in the state directory did not run)
and after that find, which lets a converged node skip the stat and the removals.
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


def _migrate(tmp_path: Path, with_find: bool) -> tuple[dict, str]:
    """Run tasks/migrate.yml once (after system.yml's find when with_find); the recap's counts, the output."""
    find = [{"name": "Look at the entries of the state directory as system.yml does",
             "ansible.builtin.find": {"paths": str(tmp_path / "state"), "file_type": "any", "hidden": True},
             "register": "vllm_runtime_root_entry_found"}] if with_find else []
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Migrate", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"vllm_runtime_legacy_restart_flag": str(tmp_path / "state" / "restart-pending"),
                 "vllm_runtime_legacy_key_dir": str(tmp_path / "state" / "ssh"),
                 "twinspark_layout_restart_flag": str(tmp_path / "control" / "restart-pending"),
                 "twinspark_layout_state_dir": str(tmp_path / "state")},
        "tasks": [*find, {"name": "The role's migration",
                   "ansible.builtin.import_tasks": str(ROOT / "roles/vllm_runtime/tasks/migrate.yml")}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    argv = [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
            str(playbook)]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    recap = re.search(r"^localhost\s+:\s+(.*)$", result.stdout, re.M)
    assert recap, result.stdout
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", recap.group(1))}, result.stdout


@pytest.fixture
def layout(tmp_path):
    (tmp_path / "state" / "ssh").mkdir(parents=True)
    (tmp_path / "control").mkdir(mode=0o700)
    (tmp_path / "state" / "ssh" / "model_sync_ed25519").write_text("old key\n")
    return tmp_path


@pytest.mark.slow(12)
@pytest.mark.parametrize("with_find", [False, True])
def test_a_pending_restart_carries_over_and_the_old_flag_and_key_go(layout, with_find):
    (layout / "state" / "restart-pending").write_text("")
    stats, _ = _migrate(layout, with_find)
    assert stats["changed"] == 2
    flag = layout / "control" / "restart-pending"
    assert flag.is_file() and (flag.stat().st_uid, flag.stat().st_mode & 0o777) == (0, 0o600)
    assert not (layout / "state" / "restart-pending").exists()
    assert not (layout / "state" / "ssh").exists()
    stats, output = _migrate(layout, with_find)
    assert stats["changed"] == 0, "a second run must change nothing"
    # After the find, a converged node is not even looked at again: no stat, no removal visited.
    assert ("item=" not in output) == with_find, output[-3000:]


@pytest.mark.slow(7)
@pytest.mark.parametrize("with_find", [False, True])
def test_a_planted_link_in_place_of_the_old_flag_is_removed_not_followed(layout, with_find):
    victim = layout / "victim"
    victim.write_text("another account's file\n")
    os.chown(victim, 65534, 65534)
    victim.chmod(0o600)
    (layout / "state" / "restart-pending").symlink_to(victim)
    (layout / "state" / "ssh").rename(layout / "state" / "ssh-real")
    (layout / "state" / "ssh").symlink_to(layout / "state" / "ssh-real")
    _migrate(layout, with_find)
    assert not (layout / "control" / "restart-pending").exists(), "a link is no pending restart"
    assert not os.path.lexists(layout / "state" / "restart-pending")
    assert not os.path.lexists(layout / "state" / "ssh")
    assert (layout / "state" / "ssh-real" / "model_sync_ed25519").exists(), "the link's target is left alone"
    info = victim.stat()
    assert (info.st_uid, info.st_mode & 0o777, victim.read_text()) == (65534, 0o600, "another account's file\n")
