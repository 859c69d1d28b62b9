"""The one "Mark the pair for an ordered restart" handler (role twinspark_layout, which every role depends on), run for
real on this machine (connection local) against a restart flag that another account replaced with a link: the link's
target keeps its owner, mode and content (issue 15, item 1: with the default `follow`, such a link turned another
account's 0600 file into root:root 0644). The handler's own task definition is used, read from the role.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from twinspark import generate

ROOT = generate.repo_root()
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the handlers set owner root: run as root")


def _handler() -> dict:
    handlers = yaml.safe_load((ROOT / "roles" / "twinspark_layout" / "handlers" / "main.yml").read_text())
    return next(h for h in handlers if h["name"] == "Mark the pair for an ordered restart")


def test_no_other_role_defines_its_own_restart_handler():
    """One handler body: a role with its own copy (or its own flag variable) would mark a different file."""
    for path in sorted((ROOT / "roles").glob("*/handlers/main.yml")):
        if path.parts[-3] == "twinspark_layout":
            continue
        names = [h.get("name") for h in yaml.safe_load(path.read_text()) or []]
        assert "Mark the pair for an ordered restart" not in names, f"{path}: use role twinspark_layout's handler"


@pytest.mark.usefixtures("ansible_playbook")
def test_the_handler_does_not_follow_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("another account's file\n")
    os.chown(victim, 65534, 65534)
    victim.chmod(0o600)
    flag = tmp_path / "restart-pending"
    flag.symlink_to(victim)
    task = {k: v for k, v in _handler().items() if k != "name"}
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Run the handler's task", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"twinspark_layout_restart_flag": str(flag)}, "tasks": [{"name": "The handler", **task}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    argv = [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
            str(playbook)]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr  # it still marks the pair (a failure proves nothing)
    info = victim.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (65534, 65534, 0o600), result.stdout
    assert victim.read_text() == "another account's file\n"
