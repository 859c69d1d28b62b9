"""The pair's lifecycle lock: one flock on the head that every start, stop and restart takes, and the guard too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from twinspark import cli
from twinspark.pair import guard, rules
from twinspark.pair import io as pair_io
from twinspark.pair import lifecycle as pl


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_holder_is_written_into_the_lock_and_cleared_on_release(tmp_path: Path):
    lock = tmp_path / "pair.lock"
    with pl.lifecycle_lock(str(lock), "twinspark pair restart", 0):
        held = json.loads(lock.read_text())
        assert held["what"] == "twinspark pair restart" and held["pid"] == os.getpid()
        assert oct(lock.stat().st_mode & 0o777) == "0o600"
    assert lock.read_text() == ""


def test_a_held_lock_is_refused_at_once_with_timeout_0_naming_the_holder(tmp_path: Path):
    lock = str(tmp_path / "pair.lock")
    with pl.lifecycle_lock(lock, "the pair guard's run", 0), pytest.raises(pl.LockBusy) as busy, \
            pl.lifecycle_lock(lock, "twinspark pair stop", 0):
        pytest.fail("two holders at once")
    message = str(busy.value)
    assert message.startswith(f"twinspark pair stop: the pair's lifecycle lock {lock} is held by the pair guard's run "
                              f"(pid {os.getpid()}, since ")
    assert "waited 0 s" in message and "twinspark pair pause" in message
    assert busy.value.holder.startswith("the pair guard's run (pid ")


def test_a_wait_for_the_lock_is_bounded_by_its_timeout(tmp_path: Path):
    lock = str(tmp_path / "pair.lock")
    clock = FakeClock()
    with pl.lifecycle_lock(lock, "playbooks/restart.yml", 0), \
            pytest.raises(pl.LockBusy, match=r"held by playbooks/restart\.yml .*waited 3 s"), \
            pl.lifecycle_lock(lock, "twinspark pair start", 3.0, clock=clock, sleep=clock.sleep, poll_s=0.5):
        pytest.fail("two holders at once")
    assert sum(clock.sleeps) == pytest.approx(3.0) and len(clock.sleeps) == 6


def test_the_lock_is_taken_again_once_released(tmp_path: Path):
    lock = str(tmp_path / "pair.lock")
    with pl.lifecycle_lock(lock, "first", 0):
        pass
    with pl.lifecycle_lock(lock, "second", 0):
        assert json.loads(Path(lock).read_text())["what"] == "second"


def test_a_planted_link_is_never_followed(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    lock = tmp_path / "pair.lock"
    lock.symlink_to(victim)
    with pytest.raises(pl.LockError, match=r"pair\.lock .*is a link; remove it"), \
            pl.lifecycle_lock(str(lock), "twinspark pair restart", 0):
        pytest.fail("a link was opened")
    assert victim.read_text() == "keep"


def test_a_missing_control_directory_says_how_to_make_it(tmp_path: Path):
    with pytest.raises(pl.LockError, match=r"create the control directory with the serving role \(site\.yml\)"), \
            pl.lifecycle_lock(str(tmp_path / "nowhere" / "pair.lock"), "twinspark pair stop", 0):
        pytest.fail("opened a lock in a missing directory")


@pytest.mark.parametrize(("content", "expected"), [
    (json.dumps({"what": "twinspark pair stop", "pid": 12, "since": 100.0}),
     "twinspark pair stop (pid 12, since 00:01:40 UTC, 50 s ago)"),
    ("", "a process that did not say who it is (the lock file names no holder)"),
    ("{not json", "a process that did not say who it is (the lock file names no holder)"),
])
def test_holder_text(content, expected):
    assert pl.holder_text(content, 150.0) == expected


# --- the guard and `pair restart` under the lock -----------------------------------------------------------------


@pytest.fixture
def head(tmp_path: Path, monkeypatch):
    env = tmp_path / "serve.env"
    env.write_text("VLLM_HOST=127.0.0.1\nVLLM_PORT=9\nSERVED_MODEL_NAME=tiny\n")
    looked: list[str] = []
    monkeypatch.setattr(pair_io.LivePair, "observe",
                        lambda self, *a, **k: looked.append("observe") or rules.Observation("failed", "active"))
    monkeypatch.setattr(pl, "ordered_restart", lambda pair, *a, **k: (looked.append("restart") or (True, "ok")))
    monkeypatch.setattr(pl, "preflight", lambda pair, steps: "")  # no real worker here (tests/test_pair_safety.py)
    monkeypatch.setattr(guard, "restart_blocker", lambda pair: None)  # no guard key here (test_pairguard_unfixable.py)
    args = ["--env", str(env), "--worker", "127.0.0.1", "--state-file", str(tmp_path / "state.json"),
            "--lock-file", str(tmp_path / "pair.lock"), "--pause-file", str(tmp_path / "paused")]
    return args, looked, str(tmp_path / "pair.lock")


def test_the_guard_does_not_even_look_while_another_operation_holds_the_lock(head, capsys):
    args, looked, lock = head
    with pl.lifecycle_lock(lock, "twinspark pair restart", 0):
        assert cli.main(["pair", "guard", *args]) == 0
    assert looked == []
    assert "not looking now, twinspark pair restart (pid " in capsys.readouterr().err
    assert cli.main(["pair", "guard", *args]) == 0  # free again: it looks, finds a dead head, restarts
    assert looked == ["observe", "restart"]


def test_pair_restart_gives_up_after_its_lock_timeout_naming_the_holder(head, capsys):
    args, looked, lock = head
    with pl.lifecycle_lock(lock, "the pair guard's run", 0):
        assert cli.main(["pair", "restart", *args, "--lock-timeout", "0.2"]) == 1
    assert looked == []
    err = capsys.readouterr().err
    assert "twinspark pair restart: the pair's lifecycle lock" in err and "held by the pair guard's run" in err
    assert cli.main(["pair", "restart", *args]) == 0 and looked == ["restart"]


@pytest.mark.parametrize(("kicks", "settles"), [
    (pl.Kicks(1, 0, ("127.0.0.1",)), True),  # a rank's kick: let a stopping rank finish stopping first
    (pl.Kicks(0, 2, ()), False),  # datagrams that are not kicks wake nothing
    (pl.Kicks(), False),  # the timer
])
def test_the_guard_waits_for_a_stopping_rank_only_when_a_kick_woke_it(head, monkeypatch, kicks, settles):
    """Whether the run was woken comes from the kick reader's count, not from the words of the journal line."""
    args, looked, _lock = head
    assert kicks.woken is settles

    class Inbox:
        listening = True

        def drain(self):
            return kicks if not looked else pl.Kicks()

    monkeypatch.setattr(pl.KickInbox, "inherited", classmethod(lambda cls, environ=None: Inbox()))
    monkeypatch.setattr(guard, "settle", lambda read, timeout_s: looked.append("settle") or ("failed", "active", 0.0))
    assert cli.main(["pair", "guard", *args, "--settle", "5"]) == 0
    assert looked == (["settle"] if settles else []) + ["observe", "restart"]
