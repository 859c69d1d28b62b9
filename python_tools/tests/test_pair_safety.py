"""An ordered restart that cannot leave the pair down: the preflight before any step, the put-back after a step
that failed midway, and a playbook's pause of the guard that ends by itself."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from twinspark.pair import cli as pair_cli
from twinspark.pair import guard
from twinspark.pair import io as pair_io
from twinspark.pair import lifecycle as pl
from twinspark.pair.rules import GuardState, Policy

POLICY = Policy(max_attempts=3)


class StepPair:
    """Stands in for systemctl and the worker's forced command (the real ones run on the simulated pair): records
    each step, and fails the steps named in `fail` the way the real ones do."""

    def __init__(self, ssh_key=None, reachable=True, fail=(), load="loaded"):
        self.calls: list[str] = []
        self.ssh_key = ssh_key
        self.reachable = reachable
        self.fail = set(fail)
        self.load = load
        self.worker_addresses = ["10.78.0.2", "10.77.0.2"]
        self.unit = "twinspark-vllm.service"

    def head_props(self):
        return {"ActiveState": "active", "LoadState": self.load}

    def head(self, verb):
        if f"head {verb}" in self.fail:
            raise subprocess.CalledProcessError(1, ["systemctl", verb], stderr="Job failed")
        self.calls.append(f"head {verb}")

    def worker(self, verb):
        if not self.reachable:
            return None
        if f"worker {verb}" in self.fail:
            raise RuntimeError(f"worker 10.78.0.2: `{verb}` failed (exit 1): Job failed")
        if verb != "state":
            self.calls.append(f"worker {verb}")
        return "active"


def key_file(tmp_path, mode):
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(mode)
    return str(key)


# --- the preflight: prove every step can run before stopping anything ------------------------------------------


def test_a_key_others_can_read_stops_the_restart_before_anything_is_touched(tmp_path):
    pair = StepPair(ssh_key=key_file(tmp_path, 0o644))
    problem = pl.preflight(pair, pl.RESTART_STEPS)
    assert "mode 0644" in problem and "chmod 600" in problem and "nothing was stopped" in problem
    assert pair.calls == []


def test_an_unreachable_worker_stops_the_restart_before_anything_is_touched(tmp_path):
    pair = StepPair(ssh_key=key_file(tmp_path, 0o600), reachable=False)
    problem = pl.preflight(pair, pl.RESTART_STEPS)
    assert "10.78.0.2, 10.77.0.2" in problem and "nothing was stopped" in problem
    assert pair.calls == []


def test_a_missing_head_unit_stops_the_restart(tmp_path):
    problem = pl.preflight(StepPair(ssh_key=key_file(tmp_path, 0o600), load="not-found"), pl.RESTART_STEPS)
    assert "LoadState=not-found" in problem


def test_a_sound_pair_passes_the_preflight(tmp_path):
    assert pl.preflight(StepPair(ssh_key=key_file(tmp_path, 0o600)), pl.RESTART_STEPS) == ""


def test_the_guard_spends_no_attempt_on_a_restart_its_preflight_refused(tmp_path, capsys):
    pair = StepPair(ssh_key=key_file(tmp_path, 0o640))
    args = type("Args", (), {"ready_timeout": 60, "probe_timeout": 10, "drain_timeout": 0})()
    state, ok = guard.run_restart(pair, args, GuardState(), POLICY, "the worker's rank is failed")
    assert not ok and state == GuardState() and pair.calls == []
    assert "mode 0640" in capsys.readouterr().err


@pytest.mark.parametrize(("mode", "owner", "expected"), [
    (0o100600, 0, None), (0o100400, 0, None), (0o100644, 0, "mode 0644"), (0o100660, 0, "mode 0660"),
    (0o100600, 1000, "owned by uid 1000"),
])
def test_key_problem_is_what_ssh_refuses(mode, owner, expected):
    problem = pair_io.key_problem(mode, owner, 0, "/etc/twinspark/pair-guard/id_ed25519")
    assert (problem is None) if expected is None else (expected in problem)


# --- a step that fails midway: put back what this run stopped --------------------------------------------------


@pytest.mark.parametrize(("done", "expected"), [
    ((), ()),
    ((("head", "stop"),), (("head", "start"),)),
    ((("head", "stop"), ("worker", "stop")), (("worker", "start"), ("head", "start"))),
    ((("head", "stop"), ("worker", "stop"), ("worker", "start")), (("head", "start"),)),
    (pl.RESTART_STEPS, ()),
])
def test_put_back_starts_what_the_run_left_stopped_worker_first(done, expected):
    assert pl.put_back(done) == expected


def test_a_stop_that_fails_midway_puts_nothing_back():
    assert pl.put_back(((pl.HEAD, "stop"),), pl.STOP_STEPS) == ()
    pair = StepPair(reachable=False)
    ok, outcome = pl.run_steps(pair, pl.STOP_STEPS)
    assert not ok and pair.calls == ["head stop"] and "put back" not in outcome


def test_a_worker_start_that_fails_midway_starts_both_again_in_order():
    pair = StepPair(fail={"worker start"})
    ok, outcome = pl.run_steps(pair, pl.RESTART_STEPS)
    assert not ok
    # the forced command failed once; the put-back tries the worker again, then starts the head
    assert pair.calls == ["head stop", "worker stop", "head start"]
    assert "could not start the worker again" in outcome and "head started again" in outcome


def test_a_head_stop_that_fails_touches_nothing_else():
    pair = StepPair(fail={"head stop"})
    ok, outcome = pl.run_steps(pair, pl.RESTART_STEPS)
    assert not ok and pair.calls == [] and "systemctl stop of the head failed" in outcome


# --- a playbook's pause ends by itself, an operator's does not -------------------------------------------------


def test_a_pause_with_an_expiry_reads_back_and_expires():
    pause = pl.pause_from_text(pl.pause_record("ordered restart by a playbook", "root", 100.0, 700.0)
                                     .decode())
    assert pause.expires == 700.0
    assert not pl.pause_expired(pause, 699.0) and pl.pause_expired(pause, 700.0)
    assert "ends by itself" in pl.pause_line(pause, 200.0)


def test_an_operators_pause_never_expires():
    pause = pl.pause_from_text(pl.pause_record("stopped for maintenance", "root", 100.0).decode())
    assert pause.expires is None and not pl.pause_expired(pause, 10**12)


def guard_args(tmp_path, pause_file):
    from twinspark import cli

    return cli.build_parser("pair").parse_args(["pair", "guard", "--pause-file", str(pause_file), "--state-file",
                              str(tmp_path / "state.json"), "--lock-file", str(tmp_path / "lock"),
                              "--env", str(tmp_path / "missing.env"), "--worker", "10.78.0.2"])


def test_the_guard_ends_an_expired_pause_and_looks_again(tmp_path, capsys):
    pause_file = tmp_path / "pair-guard.paused"
    pause_file.write_bytes(pl.pause_record("ordered restart by a playbook", "root", time.time() - 100,
                                                 time.time() - 1))
    code = pair_cli.cmd_guard(guard_args(tmp_path, pause_file))
    err = capsys.readouterr().err
    assert "the pause is over, looking again" in err
    assert not pause_file.exists()
    assert code == 2 and "missing.env" in err  # it went on to read the env files (missing here)


def test_the_guard_keeps_a_pause_that_has_not_expired(tmp_path, capsys):
    pause_file = tmp_path / "pair-guard.paused"
    pause_file.write_bytes(pl.pause_record("ordered restart by a playbook", "root", time.time(),
                                                 time.time() + 600))
    assert pair_cli.cmd_guard(guard_args(tmp_path, pause_file)) == 0
    assert pause_file.exists() and "not looking" in capsys.readouterr().err


def test_pause_expires_in_is_written_and_refuses_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(pl, "stop_guard_run", lambda: "")
    pause_file = tmp_path / "pair-guard.paused"
    assert pl.pause_guard(str(pause_file), "by a playbook", 0) == 2 and not pause_file.exists()
    before = time.time()
    assert pl.pause_guard(str(pause_file), "by a playbook", 300) == 0
    record = json.loads(pause_file.read_text())
    assert before + 300 <= record["expires"] <= time.time() + 300
    assert oct(os.stat(pause_file).st_mode & 0o777) == "0o600"
