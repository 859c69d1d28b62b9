"""The front door: a real (tiny, harmless) playbook run through ansible-runner against localhost."""

from __future__ import annotations

import io
import json
import os
import signal
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


@pytest.mark.usefixtures("ansible_playbook")
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


@pytest.mark.usefixtures("ansible_playbook")
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


@pytest.mark.usefixtures("ansible_playbook")
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


@pytest.mark.usefixtures("ansible_playbook")
def test_a_verb_ends_with_the_health_sweep_of_the_same_inventory(project, monkeypatch, capsys):
    """The closing table is `twinspark health -i INVENTORY`'s own, asked through its function: its exit code is
    the verb's."""
    from twinspark.health import command as health

    asked = []
    monkeypatch.setattr(health, "check_inventory", lambda inventory, timeout=10.0: asked.append(inventory) or 1)
    inventory = str(project / "inventory.ini")
    assert cli.main(["deploy", "-i", inventory]) == 1
    assert asked == [inventory]


@pytest.fixture
def fleet_project(project):
    """The tiny project with an upgrade, a rollback and a recipe playbook, and a loopback fleet inventory of two
    pairs."""
    import yaml
    from test_fleet_inventory import fleet_inventory

    (project / "playbooks").mkdir()
    for verb in ("upgrade", "rollback", "recipe"):
        (project / "playbooks" / f"{verb}.yml").write_text(PLAYBOOK)
    tree = fleet_inventory()
    for number, pair in enumerate(tree["all"]["children"]["twinspark_pair"]["children"].values()):
        for offset, host in enumerate(pair["hosts"].values(), start=1):
            host["ansible_host"] = f"127.0.0.{10 * (number + 1) + offset}"
    tree["all"]["children"]["twinspark_router"]["hosts"]["r1"]["ansible_host"] = "127.0.0.9"
    tree["all"]["vars"]["vllm_service_api_allowed_networks"] = ["127.0.0.0/8"]
    (project / "fleet.yml").write_text(yaml.safe_dump(tree))
    return project


def _fake_runs(monkeypatch, codes=None):
    """Record each playbook run's extra arguments instead of running it; exit codes by --limit from `codes`."""
    runs = []

    def run_playbook(playbook, inventory, artifacts, view, project, extra_cmdline=None):
        extra = list(extra_cmdline or [])
        runs.append((playbook.name, extra))
        limit = extra[extra.index("--limit") + 1] if "--limit" in extra else None
        return (codes or {}).get(limit, 0), artifacts / "run"

    monkeypatch.setattr(frontdoor, "run_playbook", run_playbook)
    return runs


def _fake_health(monkeypatch, codes):
    """`twinspark health` answering the given exit codes in turn (the last one from then on)."""
    from twinspark.health import command as health

    asked = []

    def check(inventory, timeout=10.0):
        asked.append(inventory)
        code = codes[min(len(asked), len(codes)) - 1]
        print(f"HEALTH TABLE exit {code}")
        return code

    monkeypatch.setattr(health, "check_inventory", check)
    monkeypatch.setattr(frontdoor, "GATE_INTERVAL", 0.0)
    return asked


def test_the_pairs_of_a_fleet_inventory_in_order(fleet_project):
    assert frontdoor.fleet_pairs(str(fleet_project / "fleet.yml")) == ["pair_a", "pair_b"]
    root = Path(__file__).resolve().parents[2]
    assert frontdoor.fleet_pairs(str(root / "inventory" / "sim")) == []


@pytest.mark.parametrize("verb", ["upgrade", "rollback"])
def test_a_fleet_upgrade_walks_the_pairs_one_run_each_with_a_health_gate_after_each(fleet_project, monkeypatch,
                                                                                    capsys, verb):
    runs, asked = _fake_runs(monkeypatch), _fake_health(monkeypatch, [0])
    inventory = str(fleet_project / "fleet.yml")
    assert cli.main([verb, "-i", inventory]) == 0
    assert runs == [(f"{verb}.yml", ["--limit", "pair_a"]), (f"{verb}.yml", ["--limit", "pair_b"])]
    assert asked == [inventory, inventory]
    out, err = capsys.readouterr()
    assert f"twinspark {verb}: pair pair_a (1 of 2): playbooks/{verb}.yml --limit pair_a" in err
    assert "pair pair_b done, fleet healthy" in err
    assert out.count("HEALTH TABLE exit 0") == 2


def test_a_failed_pair_stops_the_walk_before_the_next_pair(fleet_project, monkeypatch, capsys):
    runs, asked = _fake_runs(monkeypatch, {"pair_a": 2}), _fake_health(monkeypatch, [0])
    assert cli.main(["upgrade", "-i", str(fleet_project / "fleet.yml")]) == 2
    assert [extra for _, extra in runs] == [["--limit", "pair_a"]]
    assert asked == []
    assert "twinspark upgrade: pair pair_a failed (exit 2); stopped before the pairs left: pair_b" in \
        capsys.readouterr().err


def test_an_unhealthy_fleet_after_a_pair_stops_the_walk_once_the_gate_times_out(fleet_project, monkeypatch, capsys):
    runs, asked = _fake_runs(monkeypatch), _fake_health(monkeypatch, [1])
    monkeypatch.setattr(frontdoor.time, "sleep", lambda seconds: None)
    code = cli.main(["upgrade", "-i", str(fleet_project / "fleet.yml"), "--gate-timeout", "0"])
    assert code == 1
    assert [extra for _, extra in runs] == [["--limit", "pair_a"]]
    assert len(asked) == 1
    out, err = capsys.readouterr()
    assert "the fleet is not healthy after pair pair_a (health exit 1" in err and "pairs left: pair_b" in err
    assert "HEALTH TABLE exit 1" in out, "the failing gate shows its health table"


@pytest.mark.slow(10)
def test_the_gate_waits_for_the_fleet_to_become_healthy(fleet_project, monkeypatch, capsys):
    runs, asked = _fake_runs(monkeypatch), _fake_health(monkeypatch, [1, 1, 0])
    assert cli.main(["upgrade", "-i", str(fleet_project / "fleet.yml"), "--gate-timeout", "60"]) == 0
    assert len(runs) == 2 and len(asked) == 4
    out, err = capsys.readouterr()
    assert err.count("health gate after pair_a: not healthy yet (health exit 1)") == 2
    assert "HEALTH TABLE exit 1" not in out, "only the gate's last table is shown"


def test_a_limited_or_checked_fleet_run_is_one_run(fleet_project, monkeypatch):
    runs, asked = _fake_runs(monkeypatch), _fake_health(monkeypatch, [0])
    inventory = str(fleet_project / "fleet.yml")
    assert cli.main(["upgrade", "-i", inventory, "--limit", "pair_b", "--no-health"]) == 0
    assert runs == [("upgrade.yml", ["--limit", "pair_b"])]
    runs.clear()
    assert cli.main(["upgrade", "-i", inventory, "--check"]) == 0
    assert runs == [("upgrade.yml", ["--check", "--limit", "pair_a"]),
                    ("upgrade.yml", ["--check", "--limit", "pair_b"])]
    assert asked == [], "--check changes nothing, so there is nothing to gate"


@pytest.mark.usefixtures("ansible_playbook")
def test_extra_vars_reach_the_playbook_intact(project):
    """-e passes through ansible-runner's command line as one argument, spaces and quotes included."""
    vars_json = '{"fail_now": true, "marker": "' + str(project / "a marker") + '"}'
    assert cli.main(["deploy", "-i", str(project / "inventory.ini"), "--no-health", "-e", vars_json]) != 0
    assert (project / "a marker").exists()


@pytest.mark.usefixtures("ansible_playbook")
def test_a_run_keeps_no_environment_and_no_extra_vars_value_on_disk(project, monkeypatch, capsys):
    """ansible-runner writes the whole environment and argv to artifacts/<run>/command: a token exported before the
    run, or passed with -e, must not stay there (nor anywhere else in the run's folder)."""
    monkeypatch.setenv("TWINSPARK_TEST_TOKEN", "hunter2-exported-token")
    assert cli.main(["deploy", "-i", "inventory.ini", "--no-health", "-e", "api_key=sekrit-extra-value"]) == 0
    [run] = list((project / "artifacts").iterdir())
    for path in run.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "hunter2-exported-token" not in text and "sekrit-extra-value" not in text, path
    recorded = json.loads((run / "command").read_text())
    assert recorded["command"][:3] == ["ansible-playbook", "--extra-vars", frontdoor.REDACTED]
    assert "env" not in recorded and (run / "command").stat().st_mode & 0o077 == 0
    assert (project / "marker").exists(), "the extra value still reached the run"


@pytest.mark.usefixtures("ansible_playbook")
def test_only_the_newest_runs_are_kept_and_nothing_else_is_touched(project, capsys):
    artifacts = project / "artifacts"
    for name in ("20250101T000000", "20250101T000001", "20250101T000001-2", "notes", "20250101T000002.txt"):
        (artifacts / name).mkdir(parents=True)
    assert cli.main(["deploy", "-i", "inventory.ini", "--no-health", "--keep-runs", "2"]) == 0
    left = sorted(p.name for p in artifacts.iterdir())
    assert "notes" in left and "20250101T000002.txt" in left, "only folders named like a run are removed"
    runs = [name for name in left if frontdoor.RUN_DIR.match(name)]
    assert len(runs) == 2 and runs[0] == "20250101T000001-2" and runs[1] > "2026", runs
    assert "removed 2 older run folder(s)" in capsys.readouterr().err


def test_a_verb_names_where_the_inventorys_prometheus_and_alertmanager_answer(fleet_project, monkeypatch, capsys):
    """Before the health table: the monitor's URLs (the head of the first pair, without a twinspark_monitor
    group), from the inventory; none after stop, and none when the inventory turns monitoring off."""
    _fake_runs(monkeypatch)
    _fake_health(monkeypatch, [0])
    (fleet_project / "playbooks" / "stop.yml").write_text(PLAYBOOK)
    inventory = str(fleet_project / "fleet.yml")
    assert cli.main(["deploy", "-i", inventory]) == 0
    line = "monitoring: Prometheus http://127.0.0.11:9090, Alertmanager http://127.0.0.1:9093"
    assert line in capsys.readouterr().err
    assert cli.main(["stop", "-i", inventory]) == 0
    assert "monitoring:" not in capsys.readouterr().err
    assert frontdoor.monitor_line(str(fleet_project / "inventory.ini")) is None  # no pair, no monitor
    import yaml

    tree = yaml.safe_load((fleet_project / "fleet.yml").read_text())
    tree["all"]["vars"]["monitoring_enabled"] = False
    (fleet_project / "off.yml").write_text(yaml.safe_dump(tree))
    assert frontdoor.monitor_line(str(fleet_project / "off.yml")) is None


ROTATE_PLAYBOOK = """\
- name: Record what rotate was asked
  hosts: all
  gather_facts: false
  tasks:
    - name: Write the kind, phase and grace
      ansible.builtin.copy:
        content: "{{ [twinspark_rotate, key_rotation_phase, key_rotation_grace_s] | to_json }}"
        dest: "{{ marker }}"
        mode: "0644"
"""


@pytest.mark.usefixtures("ansible_playbook")
def test_rotate_hands_its_kind_phase_and_grace_to_the_rotate_playbook(project, capsys):
    (project / "playbooks").mkdir()
    (project / "playbooks" / "rotate.yml").write_text(ROTATE_PLAYBOOK)
    inventory = str(project / "inventory.ini")
    assert cli.main(["rotate", "api-key", "-i", inventory, "--phase", "add", "--grace", "30", "--no-health"]) == 0
    assert json.loads((project / "marker").read_text()) == ["api-key", "add", 30]
    assert "twinspark rotate: playbooks/rotate.yml on" in capsys.readouterr().err
    assert cli.main(["rotate", "guard-key", "-i", inventory, "--no-health"]) == 0
    assert json.loads((project / "marker").read_text()) == ["guard-key", "all", 0]
    assert cli.main(["rotate", "admin-key", "-i", inventory, "--phase", "drop", "--no-health"]) == 0
    assert json.loads((project / "marker").read_text()) == ["admin-key", "drop", 0]


def test_rotate_refuses_a_kind_it_does_not_know(project, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["rotate", "hf-token", "-i", str(project / "inventory.ini")])
    assert stopped.value.code == 2
    assert "invalid choice: 'hf-token'" in capsys.readouterr().err
    assert not (project / "marker").exists()


@pytest.mark.usefixtures("ansible_playbook")
def test_a_hang_up_midway_still_scrubs_the_runs_environment(project, monkeypatch):
    """The scrub is in a `finally`: a SIGHUP (a closed terminal) during the run ends it as an exit, and the run's
    `command` file keeps no environment (issue 43)."""
    monkeypatch.setenv("TWINSPARK_TEST_TOKEN", "hunter2-exported-token")
    (project / "site.yml").write_text(PLAYBOOK.replace(
        "    - name: Touch a marker\n",
        "    - name: Hang up the front door\n      ansible.builtin.command: kill -HUP {{ front_pid }}\n"
        "      changed_when: true\n    - name: Touch a marker\n"))
    view = frontdoor.LiveView(stream=io.StringIO(), redraw=False)
    with pytest.raises(SystemExit) as ended:
        frontdoor.run_playbook(project / "site.yml", str(project / "inventory.ini"), project / "artifacts", view,
                               project, ["-e", f"front_pid={os.getpid()}"])
    assert ended.value.code == 128 + signal.SIGHUP
    [run] = list((project / "artifacts").iterdir())
    recorded = json.loads((run / "command").read_text())
    assert "env" not in recorded and "hunter2-exported-token" not in (run / "command").read_text()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL, "the previous handler is back"


def test_a_recipe_switch_walks_the_fleet_with_the_recipe_and_names_an_unknown_one_before_any_run(fleet_project,
                                                                                                monkeypatch, capsys):
    runs, asked = _fake_runs(monkeypatch), _fake_health(monkeypatch, [0])
    inventory = str(fleet_project / "fleet.yml")
    assert cli.main(["recipe", "switch", "tiny-qwen3", "-i", inventory]) == 0
    wanted = ["--extra-vars", json.dumps({"twinspark_recipe_switch_to": "tiny-qwen3"})]
    assert runs == [("recipe.yml", wanted + ["--limit", "pair_a"]), ("recipe.yml", wanted + ["--limit", "pair_b"])]
    assert asked == [inventory, inventory]
    err = capsys.readouterr().err
    assert "twinspark recipe switch: pair pair_a (1 of 2): playbooks/recipe.yml --limit pair_a" in err
    assert "set twinspark_recipe: tiny-qwen3 there, or the next site.yml goes back" in err
    runs.clear()
    assert cli.main(["recipe", "switch", "tiny-qwen", "-i", inventory]) == 2
    assert runs == [] and "no recipe named 'tiny-qwen'" in capsys.readouterr().err
