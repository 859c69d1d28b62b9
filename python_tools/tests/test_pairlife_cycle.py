"""The pair's lifecycle in one place: `twinspark pair start|stop|restart`, and one way to pause the guard."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from twinspark import cli
from twinspark.pair import cli as pair_cli
from twinspark.pair import io as pair_io
from twinspark.pair import lifecycle as pl
from twinspark.pair.rules import Generation

# --- the order of the steps (pure) -----------------------------------------------------------------------------


def test_restart_is_stop_head_stop_worker_start_worker_start_head_whatever_the_states():
    expected = (("head", "stop"), ("worker", "stop"), ("worker", "start"), ("head", "start"))
    assert pl.steps("restart") == expected
    assert pl.steps("restart", "active", "active") == expected


def test_stop_is_head_first_then_worker():
    assert pl.steps("stop") == (("head", "stop"), ("worker", "stop"))


@pytest.mark.parametrize(("head", "worker", "expected"), [
    ("active", "active", ()),
    ("inactive", "inactive", pl.RESTART_STEPS),  # a stopped pair: worker starts first (stopping costs nothing)
    ("failed", "active", pl.RESTART_STEPS),  # an orphaned worker must go too: a lone start hangs
    ("active", "inactive", pl.RESTART_STEPS),
    ("activating", "active", pl.RESTART_STEPS),  # as the playbooks did: only "active" counts as up
])
def test_start_does_nothing_for_a_pair_that_runs_and_the_ordered_restart_otherwise(head, worker, expected):
    assert pl.steps("start", head, worker) == expected


def test_an_unknown_verb_names_the_allowed_ones():
    with pytest.raises(ValueError, match="not one of start, stop, restart"):
        pl.steps("reload")


# --- the pause marker (pure, and the file) -----------------------------------------------------------------------


def test_a_pause_says_who_why_and_since_when():
    pause = pl.pause_from_text(pl.pause_record("patching vLLM on node2", "ansible", 3600.0).decode())
    assert pause == pl.Pause("patching vLLM on node2", "ansible", 3600.0)
    assert pl.pause_line(pause, 3700.0) == ("paused by ansible since 1970-01-01 01:00:00 UTC (100 s): "
                                            "patching vLLM on node2")


def test_a_garbled_pause_marker_still_pauses():
    assert pl.pause_from_text("{half").reason == "a pause marker that does not say why"


def test_pause_file_round_trip_and_resume(tmp_path: Path):
    marker = str(tmp_path / "paused")
    assert pl.read_pause(marker) is None
    pl.write_pause(marker, "stopped by playbooks/stop.yml", "ops")
    assert pl.read_pause(marker).reason == "stopped by playbooks/stop.yml"
    assert oct(Path(marker).stat().st_mode & 0o777) == "0o600"
    assert pl.remove_pause(marker).by == "ops"
    assert pl.read_pause(marker) is None and pl.remove_pause(marker) is None


def test_a_fifo_as_pause_marker_is_not_read_but_keeps_the_guard_paused(tmp_path: Path):
    import os

    marker = tmp_path / "paused"
    os.mkfifo(marker)
    pause = pl.read_pause(str(marker))
    assert pause is not None and "is a FIFO" in pause.reason


# --- the CLI on the head, with the units, SSH and the API stood in for ------------------------------------------


class Head:
    """Stands in for systemctl and the worker's forced command; records every step in order."""

    def __init__(self, head_state="active", worker_state="active", worker_reachable=True):
        self.calls: list[str] = []
        self.states = {"head": head_state, "worker": worker_state}
        self.worker_reachable = worker_reachable

    def head_props(self):
        return {"ActiveState": self.states["head"]}

    def head(self, verb):
        self.calls.append(f"head {verb}")
        self.states["head"] = "active" if verb == "start" else "inactive"

    def worker(self, verb):
        if not self.worker_reachable:
            return None
        if verb == "state":
            return self.states["worker"]
        self.calls.append(f"worker {verb}")
        self.states["worker"] = "active" if verb == "start" else "inactive"
        return ""

    def probe(self, timeout_s):
        return Generation.OK, "one token"


@pytest.fixture
def on_head(tmp_path: Path, monkeypatch):
    env = tmp_path / "serve.env"
    env.write_text("VLLM_HOST=127.0.0.1\nVLLM_PORT=9\nSERVED_MODEL_NAME=tiny\n")
    box: dict[str, object] = {"head": Head(), "guard_stops": 0}
    monkeypatch.setattr(pair_cli, "_pair_from_args", lambda args: box["head"])

    def stop_run(timeout_s=150.0):
        box["guard_stops"] = int(box["guard_stops"]) + 1
        return ""

    monkeypatch.setattr(pl, "stop_guard_run", stop_run)
    args = ["--env", str(env), "--worker", "127.0.0.1", "--state-file", str(tmp_path / "state.json"),
            "--lock-file", str(tmp_path / "pair.lock"), "--pause-file", str(tmp_path / "paused")]
    box["args"], box["pause"], box["lock"] = args, str(tmp_path / "paused"), str(tmp_path / "pair.lock")
    return box


def test_pair_stop_pauses_the_guard_first_then_stops_head_then_worker(on_head, capsys):
    code = cli.main(["pair", "stop", *on_head["args"], "--reason", "playbooks/stop.yml", "--json"])
    assert code == 0
    assert on_head["head"].calls == ["head stop", "worker stop"]
    assert on_head["guard_stops"] == 1  # a guard run in progress was ended before the ranks were touched
    assert pl.read_pause(on_head["pause"]).reason == "playbooks/stop.yml"
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["done"] == "head stopped, worker stopped"
    assert result["worker_reached"] is True and result["unreached"] == []


def test_pair_stop_with_the_worker_unreachable_stops_the_head_and_exits_1_naming_the_worker(on_head, capsys):
    on_head["head"] = Head(worker_reachable=False)
    assert cli.main(["pair", "stop", *on_head["args"], "--json"]) == 1
    assert on_head["head"].calls == ["head stop"]
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert result["worker_reached"] is False and result["done"] == "the worker could not be reached to stop it " \
                                                                   "(head stopped)"
    assert result["unreached"] == [1]  # rank numbers, as playbooks/stop.yml reads them
    assert "twinspark pair stop: the worker could not be reached" in out.err


def test_pair_start_leaves_a_serving_pair_alone(on_head):
    assert cli.main(["pair", "start", *on_head["args"]]) == 0
    assert on_head["head"].calls == []


def test_pair_start_restarts_a_half_pair_in_order_and_waits_until_it_serves(on_head, capsys):
    on_head["head"] = Head(head_state="failed", worker_state="active")
    assert cli.main(["pair", "start", *on_head["args"], "--json"]) == 0
    assert on_head["head"].calls == ["head stop", "worker stop", "worker start", "head start"]
    assert "serving again" in json.loads(capsys.readouterr().out)["serving"]


def test_pair_start_refuses_when_the_worker_cannot_be_seen(on_head, capsys):
    on_head["head"] = Head(head_state="inactive", worker_reachable=False)
    assert cli.main(["pair", "start", *on_head["args"]]) == 1
    assert on_head["head"].calls == []
    assert "the worker cannot be reached over SSH" in capsys.readouterr().err


def test_pair_restart_no_wait_runs_the_four_steps_and_leaves_the_guard_history_alone(on_head, tmp_path):
    assert cli.main(["pair", "restart", *on_head["args"], "--no-wait"]) == 0
    assert on_head["head"].calls == ["head stop", "worker stop", "worker start", "head start"]
    assert not (tmp_path / "state.json").exists()


def test_start_and_stop_wait_for_the_lock_and_give_up_naming_its_holder(on_head, capsys):
    with pl.lifecycle_lock(on_head["lock"], "the pair guard's run", 0):
        assert cli.main(["pair", "start", *on_head["args"], "--lock-timeout", "0.2"]) == 1
        assert cli.main(["pair", "stop", *on_head["args"], "--lock-timeout", "0.2"]) == 1
    assert on_head["head"].calls == []
    assert capsys.readouterr().err.count("is held by the pair guard's run (pid ") == 2


def test_pause_then_resume_through_the_cli(on_head, capsys):
    assert cli.main(["pair", "pause", "--pause-file", on_head["pause"], "--reason", "patching node2"]) == 0
    assert on_head["guard_stops"] == 1
    assert cli.main(["pair", "state", "--pause-file", on_head["pause"], "--state-file", "/nonexistent/s"]) == 0
    assert "guard:           paused by " in capsys.readouterr().out
    assert cli.main(["pair", "resume", "--pause-file", on_head["pause"]]) == 0
    assert pl.read_pause(on_head["pause"]) is None
    assert "pair guard resumed (was paused by " in capsys.readouterr().err


def test_pair_stop_then_pair_start_by_hand_leaves_the_guard_watching(on_head, capsys):
    """Issue 42: `pair stop` then `pair start` on the head left the guard paused while the pair served."""
    assert cli.main(["pair", "stop", *on_head["args"]]) == 0
    assert pl.read_pause(on_head["pause"]) is not None
    assert cli.main(["pair", "start", *on_head["args"], "--json"]) == 0
    assert pl.read_pause(on_head["pause"]) is None
    captured = capsys.readouterr()
    assert "pair guard resumed by twinspark pair start (was paused by " in captured.err
    assert json.loads(captured.out[captured.out.index("{"):])["guard"].startswith("resumed by twinspark pair start")


@pytest.mark.parametrize("argv", [["start"], ["restart"], ["restart", "--no-wait"]])
def test_every_start_ends_an_operators_pause(on_head, capsys, argv):
    pl.write_pause(on_head["pause"], "stopped by playbooks/stop.yml", "ops")
    assert cli.main(["pair", *argv, *on_head["args"]]) == 0
    assert pl.read_pause(on_head["pause"]) is None
    assert "(was paused by ops since " in capsys.readouterr().err


def test_a_playbooks_pause_for_its_own_run_outlives_the_restart_inside_that_run(on_head, capsys):
    pl.write_pause(on_head["pause"], "ordered pair restart by a playbook", "ansible", expires_in_s=600)
    assert cli.main(["pair", "restart", *on_head["args"], "--no-wait"]) == 0
    assert pl.read_pause(on_head["pause"]) is not None
    assert "the run that took the pause ends it" in capsys.readouterr().err


def test_an_expired_run_pause_is_ended_by_a_start(on_head):
    pl.write_pause(on_head["pause"], "ordered pair restart by a playbook", "ansible", expires_in_s=600)
    pause = pl.read_pause(on_head["pause"])
    assert not pl.start_ends_pause(pause, pause.since + 599)
    assert pl.start_ends_pause(pause, pause.since + 600)


def test_a_start_that_cannot_take_the_lock_leaves_the_pause_alone(on_head):
    pl.write_pause(on_head["pause"], "stopped by playbooks/stop.yml", "ops")
    with pl.lifecycle_lock(on_head["lock"], "someone else's stop", 0):
        assert cli.main(["pair", "start", *on_head["args"], "--lock-timeout", "0.2"]) == 1
    assert pl.read_pause(on_head["pause"]) is not None


def test_a_paused_guard_drains_its_kicks_and_does_not_look(on_head, monkeypatch, capsys):
    """A kick (a real datagram over loopback) wakes a paused guard: it empties the socket and does nothing else."""
    looked = []
    monkeypatch.setattr(pair_io.LivePair, "observe", lambda self, *a, **k: looked.append("observe"))
    monkeypatch.setattr(pair_cli, "_pair_from_args", lambda args: looked.append("env") or on_head["head"])
    pl.write_pause(on_head["pause"], "stopped by playbooks/stop.yml", "ops")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        pl.kick([("127.0.0.1", sock.getsockname()[1])] * 3)
        inbox = pl.KickInbox([sock])
        monkeypatch.setattr(pl.KickInbox, "inherited", classmethod(lambda cls, environ=None: inbox))
        import select
        select.select([sock], [], [], 1)
        assert cli.main(["pair", "guard", *on_head["args"]]) == 0
        assert inbox.drain() == pl.Kicks()
    assert looked == [] and on_head["head"].calls == []
    err = capsys.readouterr().err
    assert "pair guard run: woken by 3 kick(s) from 127.0.0.1" in err
    assert "pair guard paused by ops" in err and "not looking" in err
