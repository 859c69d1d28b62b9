"""The front door: a real (tiny, harmless) playbook run through ansible-runner against localhost."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from twinspark import cli, frontdoor

PLAYBOOK = """\
- name: Tiny play
  hosts: all
  gather_facts: false
  tasks:
    - name: Say hello
      ansible.builtin.debug:
        msg: hello
    - name: Touch a marker
      ansible.builtin.file:
        path: "{{ marker }}"
        state: touch
        mode: "0644"
    - name: Fail when asked
      ansible.builtin.fail:
        msg: asked to fail
      when: fail_now | default(false) | bool
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "site.yml").write_text(PLAYBOOK)
    (tmp_path / "inventory.ini").write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable} "
        f"marker={tmp_path / 'marker'}\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_run_counts_per_host_keeps_its_events_and_draws_a_compact_view(project):
    stream = io.StringIO()
    view = frontdoor.LiveView(stream=stream, redraw=False)
    rc, run_dir = frontdoor.run_playbook(project / "site.yml", str(project / "inventory.ini"),
                                         project / "artifacts", view, project)
    assert rc == 0
    assert (project / "marker").exists()
    count = view.hosts["localhost"]
    assert (count.ok, count.changed, count.failed) == (2, 1, 0)
    assert run_dir.parent == project / "artifacts"
    events = [json.loads(p.read_text()) for p in (run_dir / "job_events").glob("*.json")]
    assert {"playbook_on_play_start", "runner_on_ok", "playbook_on_stats"} <= {e["event"] for e in events}
    assert (run_dir / "rc").read_text().strip() == "0"
    assert "\x1b[" not in (run_dir / "stdout").read_text(), "the kept log reads as plain text"
    assert stream.getvalue().splitlines() == ["play: Tiny play", "done: localhost: ok=2 changed=1"]


def test_a_failure_is_printed_as_it_happens_naming_host_play_task_and_message(project):
    stream = io.StringIO()
    view = frontdoor.LiveView(stream=stream, redraw=False)
    rc, _ = frontdoor.run_playbook(project / "site.yml", str(project / "inventory.ini"), project / "artifacts",
                                   view, project, ["-e", "fail_now=true"])
    assert rc != 0
    assert "FAILED: localhost: [Tiny play] Fail when asked: asked to fail" in stream.getvalue()
    assert view.hosts["localhost"].failed == 1


def test_redrawn_view_keeps_one_status_line():
    stream = io.StringIO()
    view = frontdoor.LiveView(stream=stream, redraw=True)
    view.on_event({"event": "playbook_on_play_start", "event_data": {"play": "Serve"}})
    view.on_event({"event": "playbook_on_task_start", "event_data": {"task": "Start the worker"}})
    view.on_event({"event": "runner_on_ok", "event_data": {"host": "node2", "res": {"changed": True}}})
    view.on_event({"event": "runner_on_ok", "event_data": {"host": "node1", "res": {}}})
    assert view.status_line() == "[Serve] Start the worker  |  node1: ok=1 changed=0  node2: ok=1 changed=1"
    assert "\n" not in stream.getvalue(), "progress redraws in place"
    assert stream.getvalue().endswith(view.status_line())


def test_deploy_runs_site_yml_from_the_checkout_and_exits_with_its_status(project, capsys):
    code = cli.main(["deploy", "-i", str(project / "inventory.ini"), "--no-health"])
    err = capsys.readouterr().err
    assert code == 0
    assert "twinspark deploy: site.yml on" in err
    assert "events and output kept in" in err
    assert len(list((project / "artifacts").iterdir())) == 1


def test_a_missing_playbook_is_named(project, capsys):
    assert cli.main(["start", "-i", str(project / "inventory.ini")]) == 2
    assert "playbooks/start.yml does not exist" in capsys.readouterr().err


def test_a_failing_loop_names_the_failing_item_not_all_items_completed():
    stream = io.StringIO()
    view = frontdoor.LiveView(stream=stream, redraw=False)
    view.on_event({"event": "playbook_on_play_start", "event_data": {"play": "Show the state of the pair"}})
    res = {"msg": "All items completed", "results": [
        {"item": "node1", "changed": False},
        {"item": "node2", "unreachable": True, "msg": "ssh: connect to host 10.78.0.2 port 22: Connection refused"}]}
    view.on_event({"event": "runner_on_unreachable", "event_data": {"host": "node1", "task": "Read the units",
                                                                    "res": res}})
    assert ("UNREACHABLE: node1: [Show the state of the pair] Read the units: item node2: ssh: connect to host "
            "10.78.0.2 port 22: Connection refused") in stream.getvalue()


def test_upgrade_and_rollback_run_their_playbooks():
    for verb in ("upgrade", "rollback"):
        playbook = frontdoor.PLAYBOOKS[verb]
        assert playbook == f"playbooks/{verb}.yml" and (Path(__file__).resolve().parents[2] / playbook).is_file()
        assert cli.COMMANDS[verb][0] == "twinspark.frontdoor"


def test_a_verb_ends_with_the_health_sweep_of_the_same_inventory(project, monkeypatch, capsys):
    """The closing table is `twinspark health -i INVENTORY`'s own, asked through its function: its exit code is
    the verb's."""
    from twinspark.health import command as health

    asked = []
    monkeypatch.setattr(health, "check_inventory", lambda inventory, timeout=10.0: asked.append(inventory) or 1)
    inventory = str(project / "inventory.ini")
    assert cli.main(["deploy", "-i", inventory]) == 1
    assert asked == [inventory]
