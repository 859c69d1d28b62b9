"""`twinspark health` names a paused pair guard on the head: who paused it, since when and why (issue 42).

The pause marker is read where the sweep can look at it (root, the controller's sweep); the health timer's account
cannot enter the root-only control directory, so there the guard's own textfile, rewritten on every guard run, says
the same. Real files in a temporary directory, the textfile written by the guard's own code."""

from __future__ import annotations

import os
import time
from pathlib import Path

from twinspark.health import checks, gather
from twinspark.pair import lifecycle, textfile
from twinspark.pair.rules import GuardState, Policy


def _textfile(path: Path, decision: str, pause: lifecycle.Pause | None = None, now: float | None = None) -> None:
    now = time.time() if now is None else now
    paused_for = None if pause is None else now - (pause.since or now)
    value = textfile.reading(GuardState(), Policy(max_attempts=3), decision, paused_for_s=paused_for,
                             paused_by=pause.by if pause else "", pause_reason=pause.reason if pause else "")
    path.write_bytes(textfile.exposition(value))


def test_a_paused_guard_is_named_with_who_since_when_and_why_from_the_marker(tmp_path):
    marker = tmp_path / "control" / "pair-guard.paused"
    marker.parent.mkdir()
    since = time.time() - 600
    marker.write_bytes(lifecycle.pause_record("the pair was stopped (twinspark pair stop)", "alice", since))
    prom = tmp_path / "guard.prom"
    _textfile(prom, "ok")  # the guard has not run since the pause: its textfile still says watching
    guard = gather.read_guard(str(marker), str(prom))
    assert guard["paused"] and guard["by"] == "alice" and guard["since"] == since
    result = checks.check_guard("node1", guard)
    assert result.status == checks.DEGRADED
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
    assert f"paused by alice since {stamp}: the pair was stopped (twinspark pair stop)" in result.message
    assert "twinspark pair resume" in result.fix


def test_the_timers_account_reads_the_pause_from_the_guards_textfile(tmp_path, monkeypatch):
    control = tmp_path / "control"
    control.mkdir()
    marker = control / "pair-guard.paused"
    marker.write_bytes(lifecycle.pause_record("patching node2", "bob", time.time() - 60))
    prom = tmp_path / "guard.prom"
    now = time.time()
    _textfile(prom, "paused", lifecycle.Pause("patching node2", "bob", now - 60), now)
    real_lstat = os.lstat

    def refused(path, *args, **kwargs):  # what the serving account meets at the root-only 0700 control directory
        if str(path).startswith(str(control)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", refused)
    guard = gather.read_guard(str(marker), str(prom))
    assert guard["paused"] and guard["by"] == "bob" and guard["reason"] == "patching node2"
    assert abs(guard["since"] - (now - 60)) < 5
    assert "paused by bob since " in checks.check_guard("node1", guard).message


def test_a_watching_guard_is_ok_and_says_its_last_decision(tmp_path):
    marker = tmp_path / "pair-guard.paused"  # absent: not paused
    prom = tmp_path / "guard.prom"
    _textfile(prom, "ok")
    result = checks.check_guard("node1", gather.read_guard(str(marker), str(prom)))
    assert result.status == checks.OK and "watches the pair" in result.message and ": ok)" in result.message


def test_no_guard_no_check(tmp_path):
    assert gather.read_guard(str(tmp_path / "pair-guard.paused"), str(tmp_path / "guard.prom")) is None
    facts = {"unit": {}, "processes": {}}
    assert "guard" not in [r.check for r in checks.node_checks("node2", facts)]
