"""The guard's kick: a stopped rank's datagram wakes the guard, which empties the socket before it looks.

The loopback tests send real datagrams to a real UDP socket on 127.0.0.1 (nothing leaves this machine).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from twinspark import cli
from twinspark.pair import guard
from twinspark.pair import lifecycle as pl
from twinspark.pair.lifecycle import KICK_TOKEN, Kicks

# --- rules -----------------------------------------------------------------------------------------------------


def test_only_the_exact_token_counts_as_a_kick():
    kicks = pl.summarize([(KICK_TOKEN, "10.77.0.2"), (KICK_TOKEN, "127.0.0.1"), (KICK_TOKEN, "10.77.0.2"),
                          (b"systemctl stop everything", "10.77.0.2"), (KICK_TOKEN + b"x", "127.0.0.1")])
    assert kicks == Kicks(count=3, ignored=2, senders=("10.77.0.2", "127.0.0.1"))


def test_kicks_add_up_and_keep_each_sender_once():
    assert Kicks(1, 0, ("a",)) + Kicks(2, 1, ("a", "b")) == Kicks(3, 1, ("a", "b"))


def test_listen_fds_are_ours_only_when_listen_pid_names_us():
    env = {"LISTEN_PID": "42", "LISTEN_FDS": "2"}
    assert pl.listen_fds(env, 42) == [3, 4]
    assert pl.listen_fds(env, 43) == []  # inherited from a parent: not meant for this process
    assert pl.listen_fds({}, 42) == []
    assert pl.listen_fds({"LISTEN_PID": "x", "LISTEN_FDS": "1"}, 42) == []


def test_listen_fds_keep_only_the_kick_sockets_when_systemd_names_them():
    kick = pl.kick_socket()
    env = {"LISTEN_PID": "7", "LISTEN_FDS": "3", "LISTEN_FDNAMES": f"{kick}:other.socket:{kick}"}
    assert pl.listen_fds(env, 7) == [3, 5]


@pytest.mark.parametrize(("kicks", "listening", "expected"), [
    (Kicks(2, 0, ("10.77.0.2", "127.0.0.1")), True, "woken by 2 kick(s) from 10.77.0.2, 127.0.0.1"),
    (Kicks(1, 3, ("127.0.0.1",)), True, "woken by 1 kick(s) from 127.0.0.1; 3 other datagram(s) ignored"),
    (Kicks(), True, "run by the timer, no kick waiting"),
    (Kicks(0, 1, ()), True, "run by the timer, no kick waiting (1 datagram(s) that are not a kick ignored)"),
    (Kicks(), False, f"run without the kick socket (is {pl.kick_socket()} running?)"),
])
def test_trigger_line_says_why_the_guard_runs(kicks, listening, expected):
    assert pl.trigger_line(kicks, listening) == expected


@pytest.mark.parametrize(("state", "kicks"), [("running", True), ("degraded", True), ("starting", True), ("", True),
                                              ("offline", True), ("stopping", False), ("stopping\n", False)])
def test_a_rank_stopped_by_its_node_shutting_down_does_not_kick(state, kicks):
    assert pl.should_kick(state) is kicks


def test_the_kick_command_sends_nothing_while_the_node_shuts_down(kick_socket, monkeypatch, capsys):
    monkeypatch.setattr(pl, "system_state", lambda timeout_s=3.0: "stopping")
    assert cli.main(["pair", "kick", "--to", f"127.0.0.1:{kick_socket.getsockname()[1]}"]) == 0
    assert not _readable(kick_socket)
    assert "not sent, this node is shutting down" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "target"), [("127.0.0.1:25001", ("127.0.0.1", 25001)),
                                              ("[fd00::1]:25001", ("fd00::1", 25001))])
def test_kick_targets_parse(text, target):
    assert pl.parse_target(text) == target


@pytest.mark.parametrize("text", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":25001", "host:port"])
def test_a_malformed_kick_target_names_the_flag_and_the_form(text):
    with pytest.raises(ValueError, match=r"--to .*expected ADDRESS:PORT"):
        pl.parse_target(text)


# --- loopback: real datagrams ----------------------------------------------------------------------------------


@pytest.fixture
def kick_socket():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0.2)[0])


def test_kicks_sent_over_loopback_are_drained_and_the_socket_is_left_empty(kick_socket):
    port = kick_socket.getsockname()[1]
    assert pl.kick([("127.0.0.1", port)] * 3) == []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        other.sendto(b"rm -rf /", ("127.0.0.1", port))
    assert _readable(kick_socket)
    inbox = pl.KickInbox([kick_socket])
    assert inbox.drain() == Kicks(count=3, ignored=1, senders=("127.0.0.1",))
    assert not _readable(kick_socket)
    assert inbox.drain() == Kicks()


def test_a_drain_stops_at_its_limit(kick_socket):
    port = kick_socket.getsockname()[1]
    pl.kick([("127.0.0.1", port)] * 5)
    _readable(kick_socket)
    assert pl.KickInbox([kick_socket]).drain(limit=2).count == 2
    assert pl.KickInbox([kick_socket]).drain().count == 3


def _activations(sock: socket.socket, run) -> int:
    """Imitates systemd's rule for a datagram socket with Accept=no: start the service whenever the socket is
    readable and the service is not running (here: after the previous run returned)."""
    runs = 0
    while _readable(sock) and runs < 50:
        runs += 1
        run(runs)
    return runs


def test_a_burst_of_kicks_costs_one_run(kick_socket):
    port = kick_socket.getsockname()[1]
    pl.kick([("127.0.0.1", port)] * 20)
    seen = []
    assert _activations(kick_socket, lambda _: seen.append(pl.KickInbox([kick_socket]).drain().count)) == 1
    assert seen == [20]


def test_kicks_arriving_during_a_run_cost_exactly_one_more_run(kick_socket):
    port = kick_socket.getsockname()[1]
    pl.kick([("127.0.0.1", port)] * 4)
    seen = []

    def run(number: int) -> None:
        seen.append(pl.KickInbox([kick_socket]).drain().count)  # the guard drains first, then looks
        if number == 1:  # while it looks, both ranks' stops kick again
            pl.kick([("127.0.0.1", port)] * 7)

    assert _activations(kick_socket, run) == 2
    assert seen == [4, 7]


def test_the_kick_command_sends_one_datagram_and_exits_0(kick_socket):
    port = kick_socket.getsockname()[1]
    assert cli.main(["pair", "kick", "--to", f"127.0.0.1:{port}"]) == 0
    _readable(kick_socket)
    assert pl.KickInbox([kick_socket]).drain() == Kicks(1, 0, ("127.0.0.1",))


def test_the_kick_command_refuses_a_malformed_target_with_exit_2(capsys):
    assert cli.main(["pair", "kick", "--to", "10.77.0.1"]) == 2
    assert "--to '10.77.0.1': expected ADDRESS:PORT" in capsys.readouterr().err


def test_a_guard_run_empties_the_inherited_socket_first_even_when_it_then_fails(kick_socket, tmp_path: Path):
    """The real `twinspark pair guard`, handed the socket as systemd does (fd 3, LISTEN_PID, LISTEN_FDS): it drains
    before reading its env files, so a broken env never leaves a datagram that would restart it in a loop."""
    port = kick_socket.getsockname()[1]
    pl.kick([("127.0.0.1", port)] * 2)
    _readable(kick_socket)
    fd = kick_socket.fileno()
    argv = [sys.executable, "-m", "twinspark.cli", "pair", "guard", "--env", str(tmp_path / "missing.env"),
            "--worker", "127.0.0.1", "--state-file", str(tmp_path / "s.json"),
            "--pause-file", str(tmp_path / "paused")]
    # fd 3 and LISTEN_PID of the very process that runs the guard (exec keeps the PID), as systemd does it
    wrapper = (f"import os, sys; os.dup2({fd}, 3, inheritable=True); os.environ.update(LISTEN_PID=str(os.getpid()), "
               f"LISTEN_FDS='1', LISTEN_FDNAMES={pl.kick_socket()!r}); os.execv(sys.executable, {argv!r})")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_") and k != "JOURNAL_STREAM"}
    result = subprocess.run([sys.executable, "-c", wrapper], pass_fds=(fd,), capture_output=True, text=True,
                            timeout=60, env=env, check=False)
    assert result.returncode == 2, result.stderr
    assert "pair guard run: woken by 2 kick(s) from 127.0.0.1" in result.stderr
    assert "missing.env" in result.stderr
    assert not _readable(kick_socket)


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None, reason="no systemd-socket-activate here")
def test_systemd_socket_activation_hands_the_guard_its_kicks(tmp_path: Path):
    """systemd's own socket-activation tool listens on loopback, starts `twinspark pair guard` when the first
    datagram arrives and hands it the socket (LISTEN_FDS, LISTEN_FDNAMES): the guard, paused here so it does nothing
    else, reads every kick and says it was woken by them."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    paused = tmp_path / "paused"
    pl.write_pause(str(paused), "a test", "pytest")
    argv = ["systemd-socket-activate", "--datagram", "-l", f"127.0.0.1:{port}", f"--fdname={pl.kick_socket()}",
            sys.executable, "-m", "twinspark.cli", "pair", "guard", "--pause-file", str(paused),
            "--worker", "127.0.0.1", "--state-file", str(tmp_path / "s.json")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_") and k != "JOURNAL_STREAM"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(f"Listening on 127.0.0.1:{port}")
        assert pl.kick([("127.0.0.1", port)] * 2) == []
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, out
    assert "pair guard run: woken by 2 kick(s) from 127.0.0.1" in out
    assert "pair guard paused by pytest" in out and "not looking" in out


def _scripted(states):
    """The unit states each read returns, and a clock that one sleep moves by one second."""
    seen = iter(states)
    now = [0.0]

    def sleep(seconds):
        now[0] += 1.0

    return (lambda: next(seen)), (lambda: now[0]), sleep


def test_a_kicked_guard_waits_for_a_stopping_rank_to_finish_before_judging():
    read, clock, sleep = _scripted([("active", "deactivating"), ("active", "deactivating"), ("active", "failed")])
    head, worker, waited = guard.settle(read, timeout_s=30, clock=clock, sleep=sleep)
    assert (head, worker) == ("active", "failed")
    assert waited == 2.0


def test_settling_gives_up_at_its_bound_and_returns_what_it_last_saw():
    read, clock, sleep = _scripted([("deactivating", "active")] * 10)
    head, worker, waited = guard.settle(read, timeout_s=3, clock=clock, sleep=sleep)
    assert (head, worker) == ("deactivating", "active")
    assert waited == 3.0


def test_settling_does_not_wait_when_no_rank_is_stopping():
    read, clock, sleep = _scripted([("active", "inactive")])
    assert guard.settle(read, timeout_s=30, clock=clock, sleep=sleep) == ("active", "inactive", 0.0)


# --- the watch: a kick the moment the rank's main process ends --------------------------------------------------


def _kick_cli(*args: str) -> subprocess.Popen:
    root = Path(__file__).resolve().parents[1]
    return subprocess.Popen([sys.executable, "-I", "-m", "twinspark.cli", "pair", "kick", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(root)}, cwd=root)


def test_a_detached_watch_returns_at_once_and_kicks_only_when_the_process_ends(kick_socket):
    """The rank unit's ExecStartPost= (`pair kick --watch-pid $MAINPID --detach`), on a real process: the command
    ends at once, nothing is sent while the watched process runs, one kick arrives after it is SIGKILLed."""
    if not hasattr(os, "pidfd_open"):
        pytest.skip("this Python has no os.pidfd_open")
    rank = subprocess.Popen(["sleep", "300"])
    try:
        watch = _kick_cli("--to", f"127.0.0.1:{kick_socket.getsockname()[1]}", "--watch-pid", str(rank.pid),
                          "--detach")
        assert watch.wait(timeout=30) == 0
        assert not _readable(kick_socket), "no kick while the watched process runs"
        rank.kill()
        rank.wait(timeout=10)
        assert select.select([kick_socket], [], [], 30)[0], "no kick after the watched process was killed"
        payload, _ = kick_socket.recvfrom(512)
        assert payload == KICK_TOKEN
        assert not _readable(kick_socket), "exactly one kick"
    finally:
        if rank.poll() is None:
            rank.kill()


def test_a_watch_of_a_process_already_gone_kicks_at_once(kick_socket, monkeypatch, capsys):
    monkeypatch.setattr(pl, "system_state", lambda timeout_s=3.0: "running")
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=10)
    assert cli.main(["pair", "kick", "--to", f"127.0.0.1:{kick_socket.getsockname()[1]}",
                     "--watch-pid", str(gone.pid)]) == 0
    assert kick_socket.recvfrom(512)[0] == KICK_TOKEN
    assert "main process" in capsys.readouterr().err
    # The watch ignored SIGTERM only while it watched: left ignored, every process this one starts afterwards would
    # inherit the ignore (a test's terminate() of its child then hung until its timeout).
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_watch_that_cannot_watch_says_so_and_sends_nothing(kick_socket, monkeypatch, capsys):
    monkeypatch.setattr(pl, "wait_exit", lambda pid: "cannot watch it ([Errno 1] Operation not permitted)")
    assert cli.main(["pair", "kick", "--to", f"127.0.0.1:{kick_socket.getsockname()[1]}",
                     "--watch-pid", "12345"]) == 0
    assert not _readable(kick_socket)
    assert "ExecStopPost= kick remains" in capsys.readouterr().err
    assert cli.main(["pair", "kick", "--to", "127.0.0.1:9", "--watch-pid", "0"]) == 2


@pytest.mark.parametrize(("job", "asked"), [("", False), ("\n", False), ("0", False), ("4711", True),
                                             ("unknown", True)])
def test_a_stop_counts_as_asked_only_while_systemd_has_a_job_on_the_unit(job, asked):
    assert pl.stop_asked(job) is asked


def test_the_cgroup_path_and_whose_it_is():
    text = "9:name=systemd:/system.slice/twinspark-vllm.service\n0::/system.slice/twinspark-vllm.service\n"
    assert pl.cgroup_path(text) == "/system.slice/twinspark-vllm.service"
    assert pl.cgroup_path("1:cpu:/\n") is None
    assert pl.own_unit_cgroup("/system.slice/twinspark-vllm.service", "twinspark-vllm.service")
    for path in ("/", "/system.slice", "/user.slice/user-0.slice/session-1.scope", None):
        assert not pl.own_unit_cgroup(path, "twinspark-vllm.service")
    assert not pl.own_unit_cgroup("/system.slice", "system.slice")
    assert pl.leftovers([10, 11, 12], own=11) == [10, 12]


def test_finishing_the_kill_outside_the_units_cgroup_signals_nothing(monkeypatch):
    said = []
    monkeypatch.setattr(guard.os, "kill", lambda pid, sig: pytest.fail(f"signalled {pid}"))
    assert pl.finish_the_kill("twinspark-vllm.service", lambda p, m: said.append(m)) == []
    assert said and "left to systemd's stop timeout" in said[0]


def test_a_watch_with_a_stop_asked_leaves_the_leftovers_to_systemd(kick_socket, monkeypatch):
    monkeypatch.setattr(pl, "system_state", lambda timeout_s=3.0: "running")
    monkeypatch.setattr(pl, "unit_job", lambda unit: "4711")
    monkeypatch.setattr(pl, "finish_the_kill", lambda unit, log: pytest.fail("a stop was asked"))
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=10)
    assert cli.main(["pair", "kick", "--to", f"127.0.0.1:{kick_socket.getsockname()[1]}", "--watch-pid",
                     str(gone.pid), "--unit", "twinspark-vllm.service"]) == 0
    assert kick_socket.recvfrom(512)[0] == KICK_TOKEN
    killed = []
    monkeypatch.setattr(pl, "unit_job", lambda unit: "")
    monkeypatch.setattr(pl, "finish_the_kill", lambda unit, log: killed.append(unit) or [1, 2])
    assert cli.main(["pair", "kick", "--to", f"127.0.0.1:{kick_socket.getsockname()[1]}", "--watch-pid",
                     str(gone.pid), "--unit", "twinspark-vllm.service"]) == 0
    assert killed == ["twinspark-vllm.service"]


def test_detach_or_unit_without_a_pid_to_watch_is_refused_naming_the_flag(kick_socket, capsys):
    port = kick_socket.getsockname()[1]
    for extra in (["--detach"], ["--unit", "twinspark-vllm.service"]):
        assert cli.main(["pair", "kick", "--to", f"127.0.0.1:{port}", *extra]) == 2
        assert "only go with --watch-pid" in capsys.readouterr().err
    assert not _readable(kick_socket)
