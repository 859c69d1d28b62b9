"""The pair guard's node_exporter textfile (twinspark/pair/textfile.py): what a guard run writes for Prometheus after
a restart, a give-up, a pause and a fabric outage; written before an ordered restart starts, so a restart in
progress reads as not serving; replaced atomically, never through a link; always parseable by prometheus_client."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from twinspark import atomic, cli
from twinspark.pair import cli as pair_cli
from twinspark.pair import guard, textfile
from twinspark.pair import lifecycle as pl
from twinspark.pair.rules import Generation, GuardState, Observation, Policy

# The monitoring contract's names (issue 30): the alert rules and the dashboards read exactly these.
CONTRACT = {"twinspark_guard_restarts", "twinspark_guard_attempts_left", "twinspark_guard_paused",
            "twinspark_guard_paused_seconds", "twinspark_guard_given_up",
            "twinspark_guard_last_decision_timestamp_seconds", "twinspark_guard_decision", "twinspark_guard_fabric_up",
            "twinspark_guard_serving", "twinspark_guard_pause_info"}
POLICY = Policy(max_attempts=3)


def parse(path: Path) -> dict[tuple[str, tuple], float]:
    """The textfile as Prometheus reads it: {(sample name, labels): value}; every family must be a contract name."""
    families = list(text_string_to_metric_families(path.read_text()))
    assert {family.name for family in families} <= CONTRACT
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in families for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def decision(samples: dict) -> str:
    chosen = [dict(labels)["decision"] for (name, labels), v in samples.items()
              if name == "twinspark_guard_decision" and v == 1]
    assert len(chosen) == 1, chosen
    return chosen[0]


class SeenPair:
    """Stands in for the pair's I/O (systemctl, the worker's SSH, the head's API: the real ones run on the simulated
    pair): `observe` returns what the test says the guard saw; every unit is installed and the worker answers."""

    unit = "twinspark-vllm.service"
    worker_addresses = ["10.78.0.2"]

    def __init__(self, obs: Observation):
        self.obs = obs

    def observe(self, probe_timeout, policy, state):
        return self.obs

    def head_props(self):
        return {"ActiveState": self.obs.head_state, "LoadState": "loaded"}

    def worker(self, verb):
        return self.obs.worker_state

    def metrics(self):
        return {}


def guard_args(tmp_path: Path, *extra: str):
    return cli.build_parser("pair").parse_args([
        "pair", "guard", "--worker", "10.78.0.2", "--state-file", str(tmp_path / "state.json"),
        "--pause-file", str(tmp_path / "paused"), "--lock-file", str(tmp_path / "lock"),
        "--env", str(tmp_path / "serve.env"), "--textfile", str(tmp_path / "metrics" / "guard.prom"), *extra])


@pytest.fixture
def metrics_dir(tmp_path):
    (tmp_path / "metrics").mkdir()
    return tmp_path / "metrics"


def run_guard(tmp_path: Path, obs: Observation, state: GuardState | None = None) -> int:
    args = guard_args(tmp_path)
    guard.save_state(Path(args.state_file), state or GuardState())
    return guard.run(args, SeenPair(obs), POLICY, pl.KickInbox(), "timer")


def test_a_restart_reads_as_down_while_it_runs_and_counted_once_it_served(tmp_path, metrics_dir, monkeypatch):
    during = {}

    def ordered_restart(pair, ready_timeout_s, probe_timeout_s):
        during.update(parse(metrics_dir / "guard.prom"))
        return True, "serving again"

    monkeypatch.setattr(pl, "ordered_restart", ordered_restart)
    code = run_guard(tmp_path, Observation(head_state="failed", worker_state="active"))
    assert code == 0
    # Mid-restart, Prometheus already sees a pair that does not serve.
    assert decision(during) == "restart" and value(during, "twinspark_guard_serving") == 0
    after = parse(metrics_dir / "guard.prom")
    assert decision(after) == "restart"
    assert value(after, "twinspark_guard_restarts_total") == 1
    assert value(after, "twinspark_guard_serving") == 1
    assert value(after, "twinspark_guard_attempts_left") == POLICY.max_attempts
    assert value(after, "twinspark_guard_given_up") == 0
    assert value(after, "twinspark_guard_paused") == 0 and value(after, "twinspark_guard_paused_seconds") == 0
    assert time.time() - value(after, "twinspark_guard_last_decision_timestamp_seconds") < 60


def test_a_failed_restart_leaves_fewer_attempts_and_the_counter_keeps_counting(tmp_path, metrics_dir, monkeypatch):
    monkeypatch.setattr(pl, "ordered_restart", lambda pair, ready, probe: (False, "the head did not serve"))
    assert run_guard(tmp_path, Observation(head_state="failed", worker_state="active"), GuardState(restarts=4)) == 1
    after = parse(metrics_dir / "guard.prom")
    assert value(after, "twinspark_guard_restarts_total") == 5
    assert value(after, "twinspark_guard_attempts_left") == POLICY.max_attempts - 1
    assert value(after, "twinspark_guard_serving") == 0


def test_a_restart_its_preflight_refused_is_not_counted(tmp_path, metrics_dir, monkeypatch):
    monkeypatch.setattr(pl, "preflight", lambda pair, steps: "the head's unit is not installed here")
    run_guard(tmp_path, Observation(head_state="failed", worker_state="active"), GuardState(restarts=2))
    assert value(parse(metrics_dir / "guard.prom"), "twinspark_guard_restarts_total") == 2


def test_a_give_up_says_so_with_no_attempt_left(tmp_path, metrics_dir):
    broken = GuardState(failures_in_row=POLICY.max_attempts, restarts=3)
    assert run_guard(tmp_path, Observation(head_state="failed", worker_state="active"), broken) == 1
    after = parse(metrics_dir / "guard.prom")
    assert decision(after) == "gave_up"
    assert value(after, "twinspark_guard_given_up") == 1 and value(after, "twinspark_guard_attempts_left") == 0
    assert value(after, "twinspark_guard_serving") == 0 and value(after, "twinspark_guard_restarts_total") == 3


def test_a_serving_pair_and_a_fabric_outage(tmp_path, metrics_dir):
    run_guard(tmp_path, Observation(head_state="active", worker_state="active", probe=Generation.OK))
    healthy = parse(metrics_dir / "guard.prom")
    assert decision(healthy) == "ok"
    assert value(healthy, "twinspark_guard_serving") == 1 and value(healthy, "twinspark_guard_fabric_up") == 1
    run_guard(tmp_path, Observation(head_state="active", worker_state="active", probe=Generation.TIMEOUT,
                                    fabric_down="ic0 is down (no carrier, operstate down)"))
    outage = parse(metrics_dir / "guard.prom")
    assert decision(outage) == "wait_fabric"
    assert value(outage, "twinspark_guard_fabric_up") == 0 and value(outage, "twinspark_guard_serving") == 0


def test_a_pair_that_serves_while_its_worker_is_out_of_ssh_reach_still_serves(tmp_path, metrics_dir):
    """The management link down: the guard cannot act on the worker, but the pair answered a token."""
    run_guard(tmp_path, Observation(head_state="active", worker_state=None, probe=Generation.OK))
    seen = parse(metrics_dir / "guard.prom")
    assert decision(seen) == "wait_worker" and value(seen, "twinspark_guard_serving") == 1


def test_a_paused_run_says_how_long_and_leaves_out_what_it_did_not_look_at(tmp_path, metrics_dir):
    args = guard_args(tmp_path)
    guard.save_state(Path(args.state_file), GuardState(restarts=7, last={"at": 1000.0}))
    Path(args.pause_file).write_bytes(pl.pause_record("maintenance", "root", time.time() - 1200))
    assert pair_cli.cmd_guard(args) == 0
    seen = parse(metrics_dir / "guard.prom")
    assert decision(seen) == "paused" and value(seen, "twinspark_guard_paused") == 1
    assert 1200 <= value(seen, "twinspark_guard_paused_seconds") < 1260
    assert value(seen, "twinspark_guard_restarts_total") == 7
    assert value(seen, "twinspark_guard_last_decision_timestamp_seconds") == 1000.0
    assert value(seen, "twinspark_guard_serving") is None and value(seen, "twinspark_guard_fabric_up") is None
    assert value(seen, "twinspark_guard_pause_info", by="root", reason="maintenance") == 1


def test_a_watching_guard_writes_no_pause_info():
    text = textfile.exposition(textfile.reading(GuardState(), POLICY, "ok", paused_by="root", pause_reason="x"))
    assert b"pause_info" not in text


def test_a_marker_written_by_hand_is_timed_from_its_mtime(tmp_path):
    marker = tmp_path / "paused"
    marker.write_text("stop\n")
    os.utime(marker, (time.time() - 300, time.time() - 300))
    assert 300 <= textfile.paused_seconds(None, str(marker), time.time()) < 330
    assert textfile.paused_seconds(None, str(tmp_path / "gone"), time.time()) == 0


def test_a_run_that_found_the_lock_held_says_busy(tmp_path, metrics_dir):
    args = guard_args(tmp_path)
    (tmp_path / "serve.env").write_text("VLLM_HOST=127.0.0.1\nVLLM_PORT=8000\nSERVED_MODEL_NAME=tiny\n")
    with pl.lifecycle_lock(args.lock_file, "an ordered restart by a playbook", 0):
        assert pair_cli.cmd_guard(args) == 0
    assert decision(parse(metrics_dir / "guard.prom")) == "busy"


@pytest.mark.parametrize(("verdict", "action", "kind"), [
    ("healthy", "none", "ok"), ("starting", "wait", "starting"), ("unknown", "wait", "wait_worker"),
    ("suspect", "wait", "suspect"), ("fabric_down", "wait", "wait_fabric"), ("broken", "wait", "backoff"),
    ("broken", "restart", "restart"), ("fabric_down", "hold", "hold"), ("broken", "give_up", "gave_up"),
    ("broken", "gave_up", "gave_up"),
])
def test_every_decision_has_one_kind(verdict, action, kind):
    from twinspark.pair.rules import Action, Verdict

    assert textfile.decision_kind(Verdict(verdict), Action(action)) == kind
    assert kind in textfile.DECISIONS


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown guard decision 'resting'"):
        textfile.reading(GuardState(), POLICY, "resting")


def test_the_write_replaces_a_planted_link_and_never_follows_it(metrics_dir):
    victim = metrics_dir.parent / "victim"
    victim.write_text("not yours\n")
    path = metrics_dir / "guard.prom"
    path.symlink_to(victim)
    assert textfile.write(str(path), textfile.reading(GuardState(), POLICY, "ok"), lambda *_: None)
    assert victim.read_text() == "not yours\n"
    assert path.is_file() and not path.is_symlink() and (path.stat().st_mode & 0o777) == 0o644
    assert sorted(p.name for p in metrics_dir.iterdir()) == ["guard.prom"]  # no temporary file left


def test_a_write_that_fails_midway_leaves_the_previous_file(metrics_dir, monkeypatch):
    path = metrics_dir / "guard.prom"
    textfile.write(str(path), textfile.reading(GuardState(restarts=1), POLICY, "ok"), lambda *_: None)
    before = path.read_bytes()

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full_disk)
    said = []
    assert not textfile.write(str(path), textfile.reading(GuardState(restarts=2), POLICY, "restart"),
                              lambda priority, line: said.append((priority, line)))
    assert path.read_bytes() == before and sorted(p.name for p in metrics_dir.iterdir()) == ["guard.prom"]
    assert said and said[0][0] == 4 and "No space left on device" in said[0][1]


def test_no_metrics_directory_writes_nothing_and_the_guard_goes_on(tmp_path):
    said = []
    path = tmp_path / "absent" / "guard.prom"
    assert not textfile.write(str(path), textfile.reading(GuardState(), POLICY, "ok"),
                              lambda priority, line: said.append(priority))
    assert not path.parent.exists() and said == [7]


def test_the_guards_sandbox_may_write_where_it_writes_by_default():
    """ProtectSystem=strict leaves the guard only its ReadWritePaths; its default textfile must be under one of them
    (optional, `-`: a node without the directory still starts the guard)."""
    from twinspark import generate, layout

    unit = (generate.repo_root() / "roles/pair_guard/templates/twinspark-pair-guard.service.j2").read_text()
    writable = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ReadWritePaths=")]
    assert "-{{ twinspark_layout_metrics_dir }}" in writable
    assert os.path.dirname(textfile.default_path()) == layout.default().metrics_dir


def test_a_run_whose_probe_answered_keeps_the_head_rank_that_served(tmp_path, metrics_dir):
    kept: list[str] = []

    class Remembering(SeenPair):
        def remember_served(self, invocation):
            kept.append(invocation)

    healthy = Observation("active", "active", Generation.OK, "one token", head_invocation="head-3")
    args = guard_args(tmp_path)
    assert guard.run(args, Remembering(healthy), POLICY, pl.KickInbox(), "timer") == 0
    assert kept == ["head-3"]
    starting = Observation("active", "active", Generation.NOT_READY, "refused", head_invocation="head-4")
    guard.run(args, Remembering(starting), POLICY, pl.KickInbox(), "timer")
    assert kept == ["head-3"]  # only a rank that answered is kept


def test_a_playbooks_check_that_finds_the_pair_serving_keeps_the_head_rank(tmp_path, monkeypatch, capsys):
    kept: list[str] = []

    class Checked(SeenPair):
        def remember_served(self, invocation):
            kept.append(invocation)

    seen = {"obs": Observation("active", "active", Generation.OK, "one token", head_invocation="head-9")}
    monkeypatch.setattr(pair_cli, "_pair_from_args", lambda args: Checked(seen["obs"]))
    argv = ["pair", "check", "--worker", "10.78.0.2", "--state-file", str(tmp_path / "state.json")]
    assert cli.main(argv) == 0 and kept == ["head-9"]
    seen["obs"] = Observation("active", "active", Generation.NOT_READY, "refused", head_invocation="head-10",
                              head_active_for_s=3.0, worker_active_for_s=40.0, head_alone_s=30.0)
    assert cli.main(argv) == 1 and kept == ["head-9"]  # the alone head is broken at once, and not kept
    assert "started after the pair last served" in capsys.readouterr().out
