"""callback_plugins/twinspark_plugin_preload.py: the filter plugins load once, in ansible-playbook's own process,
and the per-task worker processes inherit them instead of loading them again (a real ansible-playbook run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FILTER = """
import os

with open(os.environ["PRELOAD_LOG"], "a", encoding="utf-8") as log:
    log.write(f"{os.getpid()}\\n")


class FilterModule:
    def filters(self):
        return {"preload_probe_double": lambda value: value * 2}
"""

PLAYBOOK = """
- name: Use the filter in several tasks
  hosts: localhost
  gather_facts: false
  tasks:
"""


def run(tmp_path: Path, callback_plugins: str, stdout_callback: str) -> list[str]:
    (tmp_path / "filters").mkdir(exist_ok=True)
    (tmp_path / "filters" / "preload_probe.py").write_text(FILTER)
    tasks = "".join(f"    - name: Task {n}\n      ansible.builtin.debug:\n"
                    f"        msg: \"{{{{ {n} | preload_probe_double }}}}\"\n" for n in range(4))
    (tmp_path / "play.yml").write_text(PLAYBOOK + tasks)
    log = tmp_path / f"imports-{stdout_callback}.log"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_CALLBACK_PLUGINS=callback_plugins,
               ANSIBLE_STDOUT_CALLBACK=stdout_callback, ANSIBLE_NOCOLOR="1", PRELOAD_LOG=str(log),
               ANSIBLE_FILTER_PLUGINS=f"{tmp_path / 'filters'}:{REPO / 'filter_plugins'}")
    done = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
                           str(tmp_path / "play.yml")], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count('"msg": 6') + done.stdout.count("msg: 6") == 1, done.stdout
    return log.read_text().split()


@pytest.mark.usefixtures("ansible_playbook")
def test_the_filter_plugins_load_once_in_the_playbook_process(tmp_path):
    pids = run(tmp_path, str(REPO / "callback_plugins"), "twinspark_progress")
    assert len(pids) == 1, pids


@pytest.mark.usefixtures("ansible_playbook")
def test_without_the_preload_every_task_worker_loads_them_again(tmp_path):
    empty = tmp_path / "no-callbacks"
    empty.mkdir()
    pids = run(tmp_path, str(empty), "default")
    assert len(set(pids)) == 4, pids  # the control: one load per task, each in its own fork
