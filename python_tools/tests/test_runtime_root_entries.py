"""Role vllm_runtime's guard on the state directory's entries (tasks/system.yml: the state directory, the look at
its entries, the stop on a link or a foreign owner), run for real on localhost on a temporary directory. Only those
tasks are taken from system.yml (the rest needs users and apt), after a probe that lists the state directory as the
role's own probe does. The probe's listing answers on an existing state directory (vars/main.yml's
vllm_runtime_root_entry_found); the stat loop answers when the directory is new (check mode on a fresh node): both
must stop on the same entries."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
TASKS = ("Create the state directory, owned by root",
         "Look at the entries of the new state directory, without following links",
         "Stop when one of them is a link or not root's")
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the tasks set owner root: run as root")


def _guard(tmp_path: Path, state: Path, *options: str) -> tuple[int, str]:
    tasks = [task for task in yaml.safe_load((ROOT / "roles/vllm_runtime/tasks/system.yml").read_text())
             if task.get("name") in TASKS]
    assert [task["name"] for task in tasks] == list(TASKS)
    role_vars = yaml.safe_load((ROOT / "roles/vllm_runtime/vars/main.yml").read_text())
    probe = {"name": "List the state directory as the role's probe does",
             "twinspark_probe": {"paths": [str(state)], "dirs": [str(state)]}, "register": "vllm_runtime_probe"}
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "The state directory's entries", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"twinspark_layout_state_dir": str(state), "vllm_runtime_root_entries": ["models", "hf", "cache",
                                                                                         "metrics"],
                 "vllm_runtime_root_owned_entries": ["models", "hf", "cache"],
                 "vllm_runtime_root_entry_found": role_vars["vllm_runtime_root_entry_found"]},
        "tasks": [probe, *tasks]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-e",
                           f"ansible_python_interpreter={sys.executable}", str(playbook), *options],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow(6)
def test_a_link_and_a_foreign_owner_stop_the_run_and_a_clean_directory_passes(tmp_path):
    state = tmp_path / "state"
    (state / "models").mkdir(parents=True)
    (state / "cache").mkdir()
    (state / "hf").symlink_to(tmp_path)
    os.chown(state / "cache", pwd.getpwnam("nobody").pw_uid, -1)
    (state / "metrics").mkdir()  # not root-owned on purpose: metrics is not among the root-owned entries
    os.chown(state / "metrics", pwd.getpwnam("nobody").pw_uid, -1)
    rc, output = _guard(tmp_path, state)
    assert rc != 0 and f"{state}/hf, {state}/cache must be a directory owned by root" in output, output[-3000:]

    (state / "hf").unlink()
    os.chown(state / "cache", 0, -1)
    rc, output = _guard(tmp_path, state)
    assert rc == 0, output[-3000:]
    assert "item=" not in output  # an existing state directory: the probe's listing, no stat per entry


@pytest.mark.slow(11)
def test_a_new_state_directory_in_check_mode_is_looked_at_by_the_stat_loop_without_a_warning(tmp_path):
    rc, output = _guard(tmp_path, tmp_path / "absent", "--check")
    assert rc == 0 and "[WARNING]" not in output, output[-3000:]
    assert re.search(r"ok: \[localhost\] => \(item=models\)", output), output[-3000:]
