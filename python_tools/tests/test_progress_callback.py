"""callback_plugins/twinspark_progress.py: a task that polls prints one readable progress line per poll, never
"FAILED - RETRYING", through a real ansible-playbook run on localhost with the project's ansible.cfg."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "callback_plugins" / "twinspark_progress.py"


def load_plugin():
    spec = importlib.util.spec_from_file_location("twinspark_progress", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_progress_line_says_what_how_long_and_why_not_yet():
    line = load_plugin().progress_line("node1", "Wait until both ranks serve", 4, 60, 10,
                                       "x\nstarting: head active 31 s\n")
    assert line == ("waiting [node1]: Wait until both ranks serve - 40 s of 600 s (poll 4 of 60): "
                    "starting: head active 31 s")


def test_a_long_last_line_is_cut_and_no_output_adds_nothing():
    plugin = load_plugin()
    assert plugin.progress_line("h", "t", 1, 2, 5, "").endswith("(poll 1 of 2)")
    last = plugin.progress_line("h", "t", 1, 2, 5, "y" * 500).split("(poll 1 of 2): ", 1)[1]
    assert len(last) == plugin.LAST_LINE_LIMIT and last.endswith("...")


@pytest.mark.usefixtures("ansible_playbook")
def test_a_polling_task_prints_progress_lines_not_failed_retrying(tmp_path):
    counter = tmp_path / "count"
    playbook = tmp_path / "poll.yml"
    playbook.write_text(f"""
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Wait until the third poll succeeds
      ansible.builtin.shell: >-
        n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}; echo "not yet: poll $n"; test "$n" -ge 2
      register: polled
      until: polled.rc == 0
      retries: 5
      delay: 1
      changed_when: false
""")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_CALLBACK_PLUGINS", None)
    env.pop("ANSIBLE_STDOUT_CALLBACK", None)
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    waits = [line for line in done.stdout.splitlines() if line.startswith("waiting [localhost]")]
    assert waits == [
        "waiting [localhost]: Wait until the third poll succeeds - 1 s of 6 s (poll 1 of 6): not yet: poll 0",
        "waiting [localhost]: Wait until the third poll succeeds - 2 s of 6 s (poll 2 of 6): not yet: poll 1",
    ]
    assert "FAILED - RETRYING" not in done.stdout
