"""`twinspark rotate admin-key` (issue 43): playbooks/rotate.yml walks a fleet's router and heads so that the new
admin key works before the old one stops working, with nothing restarted. The order of the plays and the key
file's content are checked here; the refusal before any host is touched runs for real (connection local, the
simulated pair's inventory, which has no router: no node is reached). The front's side of a rotated admin key is
test_routerfront.py's; the whole walk on the simulated fleet is molecule/fleet/verify.yml's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
ROTATE = yaml.safe_load((ROOT / "playbooks" / "rotate.yml").read_text())
ROUTER_TASKS = yaml.safe_load((ROOT / "roles" / "router" / "tasks" / "rotate_admin_key.yml").read_text())


def _admin_steps():
    """(play name, hosts, role, tasks_from, phase) of every step that runs for admin-key, in playbook order."""
    steps = []
    for play in ROTATE:
        for task in play.get("tasks", []):
            when = str(task.get("when", ""))
            if "'admin-key'" in when and "==" in when and "ansible.builtin.include_role" in task:
                role = task["ansible.builtin.include_role"]
                steps.append((play["name"], play["hosts"], role["name"], role["tasks_from"],
                              (task.get("vars") or {}).get("router_rotate_phase")))
    return steps


def test_the_router_takes_the_new_admin_key_then_the_heads_then_the_router_drops_the_old():
    steps = _admin_steps()
    assert [(role, tasks_from, phase) for _, _, role, tasks_from, phase in steps] == [
        ("router", "rotate_admin_key", "add"), ("serve_env", "drain_key", None), ("router", "rotate_admin_key", "drop")]
    hosts = [hosts for _, hosts, *_ in steps]
    assert "twinspark_router" in hosts[0] and hosts[0] == hosts[2]
    assert "twinspark_head" in hosts[1] and "twinspark_router" in hosts[1], "only heads behind a router"
    for role, tasks_from in (("router", "rotate_admin_key"), ("serve_env", "drain_key")):
        assert (ROOT / "roles" / role / "tasks" / f"{tasks_from}.yml").is_file()
    # site.yml writes the drain key through the very same file, so a converged run after a rotation changes nothing.
    files = yaml.safe_load((ROOT / "roles" / "serve_env" / "tasks" / "files.yml").read_text())
    assert any(task.get("ansible.builtin.import_tasks") == "drain_key.yml" for task in files)
    # The per-pair play of the other kinds leaves the admin key alone.
    last = ROTATE[-1]["tasks"][0]
    assert last["when"] == "twinspark_rotate not in ['api-key', 'admin-key']"


def test_the_admin_key_file_lists_the_new_key_first_on_add_and_it_alone_on_drop():
    write = next(t for t in ROUTER_TASKS if t["name"].startswith("Write the admin key file"))
    template = jinja2.Environment(trim_blocks=True).from_string(write["ansible.builtin.copy"]["content"])
    values = {"router_rotate_admin_new": ["new"], "router_rotate_admin_old": ["old", "new"]}
    assert template.render(router_rotate_phase="add", **values) == "new\nold\n"
    assert template.render(router_rotate_phase="drop", **values) == "new\n"
    assert (write["ansible.builtin.copy"]["mode"], write["no_log"], write["diff"]) == ("0640", True, False)
    names = [t["name"] for t in ROUTER_TASKS]
    assert names.index("Refuse an empty admin key, or the clients' key as the admin key") < names.index(write["name"])
    for task in ROUTER_TASKS:
        assert task.get("no_log") is True, f"{task['name']}: a task that handles a key must not log it"
    proofs = [t for t in ROUTER_TASKS if t["name"].startswith("Prove")]
    assert [t["ansible.builtin.uri"]["url"].split("}}")[-1] for t in proofs] == ["/list_workers"] * 2
    assert proofs[1]["ansible.builtin.uri"]["status_code"] == "{{ 200 if router_rotate_phase == 'add' else 401 }}"


@pytest.mark.slow(15)
def test_an_admin_key_rotation_without_a_router_is_refused_before_any_host():
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK} not installed")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "inventory/sim", "playbooks/rotate.yml", "-l",
                           "localhost,twinspark_head",
                           "-e", "ansible_connection=local", "-e", "twinspark_rotate=admin-key"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "this inventory has no twinspark_router group" in out and "Nothing was changed." in out, out[-3000:]
    assert "Take the new admin key beside the old one" not in out
