"""The pair guard restarts only what a restart can fix: a fabric that is down, a key ssh refuses and a missing
runtime hold it back; a head restarted alone next to the worker's old rank is a half pair at once.

Rules with plain data; the reads with the real thing where it runs here: a sysfs-shaped directory, a TCP listener
on 127.0.0.1, the worker's forced command run by /bin/sh."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from twinspark.fabric.links import LinkState
from twinspark.pair import cli as pair_cli
from twinspark.pair import guard, rules
from twinspark.pair import io as pair_io
from twinspark.pair.rules import Action, Generation, GuardState, Observation, Policy, Progress, Sample, Verdict

REPO = Path(__file__).resolve().parents[2]
POLICY = Policy(max_attempts=3, backoff_initial_s=30, backoff_max_s=300, flap_window_s=3600, startup_grace_s=600,
                timeout_strikes=3, fabric_wait_s=300)
T0 = 1_000_000.0
IC0_DOWN = "ic0 is down (no carrier, operstate lowerlayerdown)"


def idle_timeout(at: float, fabric_down: str | None = IC0_DOWN, **extra) -> Observation:
    """An idle serving pair whose short probe timed out and whose counters did not move: what a fabric outage
    looks like to the guard (today broken at once)."""
    flat = Sample(at, running=0.0, tokens=900.0, kv=0.0)
    return Observation("active", "active", Generation.TIMEOUT, "no token within 15 s", 4000.0, (flat, flat),
                       fabric_down=fabric_down, **extra)


def served_state(at: float) -> GuardState:
    return GuardState(progress=Progress(at - 20, 900.0, 0.0, 0.0, None, None), served_at=at - 20)


def through_the_file(state: GuardState, tmp_path: Path) -> GuardState:
    path = tmp_path / "state.json"
    guard.save_state(path, state)
    return guard.load_state(path)


# --- the fabric: rules ------------------------------------------------------------------------------------------


def test_without_the_fabric_look_the_same_run_restarts_the_pair():
    # The behaviour the fabric look replaces: an idle pair that served, short probe timed out, counters flat.
    assert rules.decide(idle_timeout(T0, fabric_down=None), served_state(T0), POLICY, T0).action is Action.RESTART


def test_fabric_down_waits_names_the_interface_and_counts_nothing():
    state = served_state(T0)
    decision = rules.decide(idle_timeout(T0), state, POLICY, T0)
    assert (decision.verdict, decision.action) == (Verdict.FABRIC_DOWN, Action.WAIT)
    assert "ic0 is down" in decision.reason and "a restart cannot fix a link" in decision.reason
    assert decision.state.fabric_down_since == T0
    assert (decision.state.timeout_strikes, decision.state.failures_in_row, decision.state.attempts) == (0, 0, ())


def test_fabric_down_outranks_a_dead_rank_and_an_unreachable_worker():
    for obs in (Observation("inactive", "active", fabric_down=IC0_DOWN),
                Observation("active", None, fabric_down="the peer's fabric address 10.77.0.2 (TCP 22) does not "
                                                        "answer within 1.5 s")):
        decision = rules.decide(obs, GuardState(), POLICY, T0)
        assert (decision.verdict, decision.action) == (Verdict.FABRIC_DOWN, Action.WAIT), decision.reason


def test_a_pair_that_serves_is_healthy_whatever_an_interface_says():
    obs = Observation("active", "active", Generation.OK, "one token", 4000.0, fabric_down=IC0_DOWN)
    assert rules.decide(obs, GuardState(), POLICY, T0).action is Action.NONE


def test_the_outage_is_timed_from_the_first_run_that_saw_it_across_runs(tmp_path):
    state = rules.decide(idle_timeout(T0), served_state(T0), POLICY, T0).state
    state = through_the_file(state, tmp_path)
    later = rules.decide(idle_timeout(T0 + 120), state, POLICY, T0 + 120)
    assert later.action is Action.WAIT and "120 s of 300 s" in later.reason
    assert later.state.fabric_down_since == T0


def test_past_the_bound_the_guard_reports_loudly_and_still_does_not_restart():
    state = replace_since(served_state(T0), T0 - 301)
    decision = rules.decide(idle_timeout(T0), state, POLICY, T0)
    assert (decision.verdict, decision.action) == (Verdict.FABRIC_DOWN, Action.HOLD)
    assert "gave the fabric 301 s" in decision.reason and "ic0 is down" in decision.reason
    assert decision.state.failures_in_row == 0 and decision.state.attempts == ()


def replace_since(state: GuardState, since: float) -> GuardState:
    from dataclasses import replace

    return replace(state, fabric_down_since=since)


def test_link_back_and_serving_means_no_restart_and_the_clock_is_cleared():
    obs = Observation("active", "active", Generation.OK, "one token", 4000.0)
    decision = rules.decide(obs, replace_since(GuardState(), T0 - 600), POLICY, T0)
    assert decision.action is Action.NONE
    assert decision.state.fabric_down_since is None and "the fabric is back after 600 s" in decision.reason


def test_link_back_but_not_serving_waits_for_the_connections_then_falls_to_the_usual_rules(tmp_path):
    """Every rank runs and the link is back: the ranks' TCP connections resume at their next retransmission, which
    after a long outage can come up to TCP_RTO_MAX later; the guard waits fabric_recovery_s before the usual rules."""
    first = rules.decide(idle_timeout(T0, fabric_down=None), replace_since(served_state(T0), T0 - 600), POLICY, T0)
    assert first.action is Action.WAIT and first.state.fabric_down_since is None
    assert "the fabric is back after 600 s" in first.reason
    assert f"giving the ranks' connections up to {POLICY.fabric_recovery_s:.0f} s to resume" in first.reason
    state = through_the_file(first.state, tmp_path)
    assert state.fabric_back_at == T0
    still = rules.decide(idle_timeout(T0 + 60, fabric_down=None), state, POLICY, T0 + 60)
    assert still.action is Action.WAIT and "came back 60 s ago" in still.reason
    later = T0 + POLICY.fabric_recovery_s
    assert rules.decide(idle_timeout(later, fabric_down=None), state, POLICY, later).action is Action.RESTART


def test_a_rank_that_died_after_the_link_came_back_is_restarted_at_once():
    from dataclasses import replace

    state = replace(served_state(T0), fabric_back_at=T0 - 10)
    decision = rules.decide(Observation("active", "failed"), state, POLICY, T0)
    assert (decision.verdict, decision.action) == (Verdict.BROKEN, Action.RESTART)


def test_serving_again_after_the_link_came_back_clears_the_recovery_clock():
    from dataclasses import replace

    obs = Observation("active", "active", Generation.OK, "one token", 4000.0)
    decision = rules.decide(obs, replace(GuardState(), fabric_back_at=T0 - 10), POLICY, T0)
    assert decision.action is Action.NONE and decision.state.fabric_back_at is None


def test_a_long_outage_ends_in_one_restart_after_the_link_is_back_never_during(tmp_path):
    """Runs every 20 s: ten minutes without the link (one rank gives up and exits meanwhile), then the link back
    with the pair not serving, then serving after the guard's one ordered restart."""
    state, actions, at = served_state(T0), [], T0
    for step in range(30):
        obs = idle_timeout(at) if step < 15 else Observation("inactive", "active", fabric_down=IC0_DOWN)
        decision = rules.decide(obs, state, POLICY, at)
        state, at = through_the_file(decision.state, tmp_path), at + 20
        actions.append(decision.action)
    assert Action.RESTART not in actions and actions[-1] is Action.HOLD
    decision = rules.decide(Observation("inactive", "active"), state, POLICY, at)
    assert decision.action is Action.RESTART and "back after 600 s" in decision.reason
    state = rules.after_restart(decision.state, at, True, decision.reason, POLICY, finished_at=at + 60)
    after = rules.decide(Observation("active", "active", Generation.OK, "one token", 60.0), state, POLICY, at + 80)
    assert after.action is Action.NONE and len(after.state.attempts) == 1


def test_the_fabric_clock_survives_in_the_state_file_and_an_older_file_reads_without_it(tmp_path):
    assert through_the_file(replace_since(GuardState(), T0), tmp_path).fabric_down_since == T0
    assert rules.state_from_json({"attempts": []}).fabric_down_since is None


# --- the fabric: what the look reads (pure) --------------------------------------------------------------------


def test_the_fabric_interfaces_and_the_peer_come_from_the_env_file():
    head = {"NODE_RANK": "0", "NCCL_SOCKET_IFNAME": "=ic0", "MASTER_ADDR": "10.77.0.1", "WORKER_HOST": "10.77.0.2"}
    assert (rules.fabric_ifnames(head), rules.fabric_peer(head)) == (["ic0"], "10.77.0.2")
    worker = {**head, "NODE_RANK": "1", "NCCL_SOCKET_IFNAME": "", "GLOO_SOCKET_IFNAME": "ic1,ic2"}
    assert (rules.fabric_ifnames(worker), rules.fabric_peer(worker)) == (["ic1", "ic2"], "10.77.0.1")
    assert (rules.fabric_ifnames({}), rules.fabric_peer({})) == ([], None)


@pytest.mark.parametrize(("link", "said"), [
    (LinkState("ic0", True, "UP", ("UP", "LOWER_UP")), None),
    (LinkState("ic0", True, "LOWERLAYERDOWN", ("UP", "NO-CARRIER")), IC0_DOWN),
    (LinkState("ic0", True, "DOWN", ()), "ic0 is down (administratively down, operstate down)"),
    (LinkState("ic0", False), "ic0 does not exist on this node"),
])
def test_each_interface_is_named_with_why_it_is_down(link, said):
    assert rules.link_problem(link) == said


def test_the_fabric_line_joins_the_interfaces_and_the_peer():
    up = LinkState("ic0", True, "UP", ("UP", "LOWER_UP"))
    assert rules.fabric_problem([up], None) is None
    said = rules.fabric_problem([up, LinkState("ic1", False)], "peer gone")
    assert said == "ic1 does not exist on this node; peer gone"


@pytest.mark.parametrize(("error", "reachable"), [
    (None, True),
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), True),  # the host itself said no
    (TimeoutError("timed out"), False),
    (OSError(errno.EHOSTUNREACH, "No route to host"), False),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), False),
    (PermissionError(errno.EPERM, "Operation not permitted"), True),  # says nothing about the path: not held back
])
def test_a_tcp_connect_tells_a_reachable_peer_from_an_unreachable_one(error, reachable):
    problem = rules.connect_problem("10.77.0.2", 22, error, 1.5)
    assert (problem is None) is reachable
    if problem:
        assert "10.77.0.2 (TCP 22)" in problem


# --- the fabric: the reads, for real --------------------------------------------------------------------------


def make_netdev(root: Path, name: str, flags: str, operstate: str, carrier: str | None) -> None:
    """A /sys/class/net/<name> directory shaped like the kernel's (handshaped)."""
    base = root / name
    base.mkdir(parents=True)
    (base / "flags").write_text(f"{flags}\n")
    (base / "operstate").write_text(f"{operstate}\n")
    (base / "mtu").write_text("9000\n")
    if carrier is not None:
        (base / "carrier").write_text(f"{carrier}\n")


@pytest.fixture
def listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


@pytest.fixture
def full_listener():
    """A listener on 127.0.0.1 whose accept queue is full: the kernel drops further SYNs, so a connect times out,
    as it does towards a peer behind a dead link."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    waiting = []
    for _ in range(3):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", port))
        waiting.append(client)
    import time

    time.sleep(0.2)
    yield port
    for client in waiting:
        client.close()
    server.close()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fabric_pair(class_net: Path, port: int, peer: str | None = "127.0.0.1") -> pair_io.LivePair:
    return pair_io.LivePair(api=rules.Api("http://127.0.0.1:9", "tiny", None), worker_addresses=["127.0.0.1"],
                   fabric_ifnames=["ic0"], fabric_peer=peer, class_net=class_net, fabric_port=port,
                   fabric_timeout_s=0.5)


def test_a_peer_that_listens_or_refuses_answers(listener):
    assert pair_io.peer_problem("127.0.0.1", listener, 1.0) is None
    assert pair_io.peer_problem("127.0.0.1", closed_port(), 1.0) is None


def test_a_peer_that_never_answers_is_unreachable(full_listener):
    problem = pair_io.peer_problem("127.0.0.1", full_listener, 0.3)
    assert problem is not None and "does not answer within 0.3 s" in problem


def test_the_fabric_look_reads_the_interface_in_sysfs_then_the_peer(tmp_path, listener, full_listener):
    make_netdev(tmp_path, "ic0", "0x1003", "lowerlayerdown", "0")
    assert fabric_pair(tmp_path, listener).fabric() == IC0_DOWN
    (tmp_path / "ic0" / "carrier").write_text("1\n")
    (tmp_path / "ic0" / "operstate").write_text("up\n")
    assert fabric_pair(tmp_path, listener).fabric() is None
    assert fabric_pair(tmp_path, listener, peer=None).fabric() is None
    assert f"(TCP {full_listener}) does not answer" in fabric_pair(tmp_path, full_listener).fabric()


def test_a_run_that_cannot_look_at_an_interface_says_so_and_holds_nothing_back(tmp_path, listener, capsys):
    (tmp_path / "ic0").mkdir()
    (tmp_path / "ic0" / "operstate").mkdir()  # unreadable, as EINVAL would be
    (tmp_path / "ic0" / "flags").write_text("0x1003\n")
    (tmp_path / "ic0" / "mtu").write_text("9000\n")
    assert fabric_pair(tmp_path, listener).fabric() is None
    assert "cannot look at fabric interface ic0" in capsys.readouterr().err


class ScriptedUnits(pair_io.LivePair):
    """The units and the API stood in for (no systemd or vLLM here); the fabric read for real."""

    def __init__(self, class_net: Path, port: int, probe: Generation, worker_answers: dict[str, object]):
        super().__init__(api=rules.Api("http://127.0.0.1:9", "tiny", None), worker_addresses=["127.0.0.1"],
                         fabric_ifnames=["ic0"], fabric_peer="127.0.0.1", class_net=class_net, fabric_port=port,
                         fabric_timeout_s=0.5)
        self.answer = probe
        self.worker_answers = worker_answers
        self.asked: list[str] = []

    def head_props(self):
        return {"ActiveState": "active", "ActiveEnterTimestampMonotonic": "1"}

    def worker(self, verb):
        self.asked.append(verb)
        answer = self.worker_answers[verb]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def probe(self, timeout_s):
        return self.answer, "no token within 15 s"


def test_one_run_looks_at_the_fabric_only_when_the_pair_does_not_serve(tmp_path, listener):
    make_netdev(tmp_path, "ic0", "0x1003", "lowerlayerdown", "0")
    answers = {"state-since": "ActiveState=active\nActiveEnterTimestampMonotonic=1000000\nUptime=4001.5\n"}
    obs = ScriptedUnits(tmp_path, listener, Generation.TIMEOUT, answers).observe(120)
    assert obs.fabric_down == IC0_DOWN and obs.worker_active_for_s == pytest.approx(4000.5)
    assert ScriptedUnits(tmp_path, listener, Generation.OK, answers).observe(120).fabric_down is None


def test_an_older_worker_that_refuses_state_since_is_asked_state(tmp_path, listener):
    refused = RuntimeError("worker 127.0.0.1: `state-since` failed (exit 2): twinspark-peer-control: refused")
    pair = ScriptedUnits(tmp_path, listener, Generation.OK, {"state-since": refused, "state": "active"})
    obs = pair.observe(120)
    assert pair.asked == ["state-since", "state"]
    assert (obs.worker_state, obs.worker_active_for_s) == ("active", None)


# --- a head restarted alone next to the worker's old rank --------------------------------------------------------


def test_a_head_restarted_alone_is_a_half_pair_at_once():
    obs = Observation("active", "active", Generation.NOT_READY, "connection refused", head_active_for_s=40.0,
                      worker_active_for_s=3640.0)
    decision = rules.decide(obs, GuardState(), POLICY, T0)
    assert (decision.verdict, decision.action) == (Verdict.BROKEN, Action.RESTART)
    assert "the head's rank started 3600 s after the worker's rank" in decision.reason
    assert "cannot pair" in decision.reason


def test_an_ordered_start_starts_the_head_seconds_after_the_worker_and_is_still_starting():
    obs = Observation("active", "active", Generation.NOT_READY, "connection refused", head_active_for_s=40.0,
                      worker_active_for_s=43.0)
    assert rules.decide(obs, GuardState(), POLICY, T0).verdict is Verdict.STARTING


def test_a_head_restarted_alone_soon_after_an_ordered_start_is_a_half_pair_by_its_invocation():
    # The edge the ranks' ages miss: the firewall unit restarted 50 s after an ordered start, inside the 60 s skew.
    served = rules.Served("head-a", T0 - 45)  # the ordered start saw head-a serve 5 s after the worker started
    alone = rules.head_replaced_since_served(served, "head-b", worker_active_for_s=50.0, now=T0)
    assert alone == pytest.approx(45.0)
    obs = Observation("active", "active", Generation.NOT_READY, "connection refused", head_active_for_s=2.0,
                      worker_active_for_s=50.0, head_invocation="head-b", head_alone_s=alone)
    assert rules.head_started_late_s(obs, POLICY) is None  # the ages alone would wait out the startup grace
    decision = rules.decide(obs, GuardState(), POLICY, T0)
    assert (decision.verdict, decision.action) == (Verdict.BROKEN, Action.RESTART)
    assert "started after the pair last served (45 s ago)" in decision.reason and "cannot pair" in decision.reason


@pytest.mark.parametrize("served, invocation, worker_for", [
    (None, "head-b", 50.0),  # nothing kept yet (a pair that never served since the guard came)
    (rules.Served("head-b", T0 - 45), "head-b", 50.0),  # the head that served is the one running
    (rules.Served("head-a", T0 - 45), "head-b", 30.0),  # the worker's rank started after the pair served: a new pair
    (rules.Served("head-a", T0 - 45), "head-b", None),  # an older worker that does not say its age
    (rules.Served("head-a", T0 - 45), "", 50.0),  # systemd did not say which start of the unit this is
])
def test_a_head_is_not_called_alone_without_the_evidence(served, invocation, worker_for):
    assert rules.head_replaced_since_served(served, invocation, worker_for, T0) is None


def test_the_served_record_round_trips_and_an_unreadable_one_is_ignored(tmp_path, capsys):
    pair = pair_io.LivePair(api=rules.Api("http://127.0.0.1:9", "tiny", None), worker_addresses=["127.0.0.1"],
                        served_file=str(tmp_path / "guard" / pair_io.SERVED_FILE_NAME))
    assert pair.served() is None
    pair.remember_served("head-a")
    kept = pair.served()
    assert kept is not None and kept.head_invocation == "head-a" and abs(kept.at - time.time()) < 60
    assert oct((tmp_path / "guard" / pair_io.SERVED_FILE_NAME).stat().st_mode & 0o777) == "0o600"
    pair.remember_served("head-a")  # the same rank again keeps the first time it served
    assert pair.served() == kept
    Path(pair.served_file).write_text("{not json")
    assert pair.served() is None and "ignoring unreadable" in capsys.readouterr().err


def test_one_run_calls_a_head_alone_from_the_kept_record_and_the_units(tmp_path, listener):
    make_netdev(tmp_path, "ic0", "0x1003", "up", "1")
    answers = {"state-since": "ActiveState=active\nActiveEnterTimestampMonotonic=1000000\nUptime=51\n"}

    class Restarted(ScriptedUnits):
        def head_props(self):
            return {"ActiveState": "active", "ActiveEnterTimestampMonotonic": "1", "InvocationID": "head-b"}

    pair = Restarted(tmp_path, listener, Generation.NOT_READY, answers)
    pair.served_file = str(tmp_path / "served.json")
    assert pair.observe(120).head_alone_s is None  # nothing kept: the ranks' ages decide
    rules_served = rules.Served("head-a", time.time() - 40)
    Path(pair.served_file).write_text(json.dumps(rules.served_to_json(rules_served)))
    obs = pair.observe(120)
    assert obs.head_invocation == "head-b" and obs.head_alone_s == pytest.approx(40, abs=5)


def test_an_older_worker_that_does_not_say_its_age_leaves_the_old_rule():
    obs = Observation("active", "active", Generation.NOT_READY, "connection refused", head_active_for_s=40.0)
    assert rules.decide(obs, GuardState(), POLICY, T0).verdict is Verdict.STARTING


@pytest.mark.parametrize(("text", "expected"), [
    ("ActiveState=active\nActiveEnterTimestampMonotonic=100000000\nUptime=160.25", ("active", 60.25)),
    ("ActiveState=inactive\nActiveEnterTimestampMonotonic=0\nUptime=160.25", ("inactive", None)),
    ("ActiveState=active\nActiveEnterTimestampMonotonic=100000000", ("active", None)),
    ("active", ("active", None)),  # what `state` and an older worker print
])
def test_the_worker_status_is_read_from_the_forced_command(text, expected):
    assert rules.worker_status(text) == expected


def render_peer_control(tmp_path: Path) -> Path:
    import jinja2

    source = (REPO / "roles/pair_guard/templates/twinspark-peer-control.j2").read_text()
    env = jinja2.Environment(keep_trailing_newline=True)
    env.filters["comment"] = lambda text: f"# {text}"
    script = tmp_path / "twinspark-peer-control"
    script.write_text(env.from_string(source).render(ansible_managed="managed", vllm_service_guard_ssh_user="root",
                                                     twinspark_layout_unit_vllm="twinspark-vllm.service"))
    return script


def run_peer_control(tmp_path: Path, verb: str) -> subprocess.CompletedProcess:
    """The rendered forced command under /bin/sh, with a fake_systemctl standing in for systemd (not running here)
    that answers `show` as systemd does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "systemctl"
    fake.write_text('#!/bin/sh\n# fake_systemctl\necho "$*" >> "$FAKE_SYSTEMCTL_LOG"\n'
                    'case "$*" in\n'
                    '  *--value*) echo active ;;\n'
                    '  *) printf "ActiveState=active\\nActiveEnterTimestampMonotonic=1000000\\n" ;;\n'
                    'esac\n')
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SSH_ORIGINAL_COMMAND": verb,
           "FAKE_SYSTEMCTL_LOG": str(tmp_path / "systemctl.log")}
    return subprocess.run(["/bin/sh", str(render_peer_control(tmp_path))], env=env, capture_output=True, text=True,
                          check=False, timeout=30)


def test_the_forced_command_reports_the_rank_and_its_age_and_keeps_state_as_it_was(tmp_path):
    since = run_peer_control(tmp_path, "state-since")
    assert since.returncode == 0, since.stderr
    state, age = rules.worker_status(since.stdout)
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    assert state == "active" and age is not None and abs(age - (uptime - 1.0)) < 60
    plain = run_peer_control(tmp_path, "state")
    assert plain.stdout == "active\n"  # what every guard, old or new, reads from `state`
    refused = run_peer_control(tmp_path, "state-since; reboot")
    assert refused.returncode == 2 and "refused" in refused.stderr
    assert (tmp_path / "systemctl.log").read_text().splitlines() == [
        "show --property=ActiveState,ActiveEnterTimestampMonotonic twinspark-vllm.service",
        "show --property=ActiveState --value twinspark-vllm.service"]


def test_state_since_is_a_verb_the_guard_may_ask():
    assert "state-since" in pair_io.PEER_VERBS


# --- the guard's key and the runtime -----------------------------------------------------------------------------


def broken_pair() -> Observation:
    return Observation("active", "failed", head_active_for_s=4000.0)


def test_a_broken_pair_is_not_restarted_when_the_key_cannot_work_and_nothing_is_counted():
    blocked = Observation("active", "failed", head_active_for_s=4000.0,
                          cannot_restart="the guard's SSH key /k has mode 0644, which ssh refuses")
    decision = rules.decide(blocked, GuardState(), POLICY, T0)
    assert (decision.verdict, decision.action) == (Verdict.BROKEN, Action.HOLD)
    assert "not restarting: the guard's SSH key /k has mode 0644" in decision.reason
    assert decision.state.failures_in_row == 0 and decision.state.attempts == ()
    assert rules.decide(broken_pair(), GuardState(), POLICY, T0).action is Action.RESTART


def test_a_worker_unreachable_because_of_the_key_names_the_key():
    obs = Observation("active", None, cannot_restart="the guard's SSH key /k is owned by uid 1000, not uid 0")
    decision = rules.decide(obs, GuardState(), POLICY, T0)
    assert decision.action is Action.HOLD and "owned by uid 1000" in decision.reason
    assert rules.decide(Observation("active", None), GuardState(), POLICY, T0).action is Action.WAIT


class KeyAndUnit:
    """A stand-in for the head's unit (`systemctl show -P ExecStart`) with a real key file."""

    def __init__(self, ssh_key: str, exec_start: str):
        self.ssh_key = ssh_key
        self._exec_start = exec_start

    def exec_start(self) -> str:
        return self._exec_start


def key_file(tmp_path: Path, mode: int) -> str:
    path = tmp_path / f"id_{mode:o}"
    path.write_text("key\n")
    path.chmod(mode)
    return str(path)


def test_the_blocker_reads_the_key_and_the_units_executable(tmp_path):
    here = f"{{ path={sys.executable} ; argv[]={sys.executable} -I -m twinspark.cli serve ; ignore_errors=no }}"
    gone = "{ path=/nonexistent/venv/bin/python ; argv[]=/nonexistent/venv/bin/python -I -m twinspark.cli serve }"
    assert guard.restart_blocker(KeyAndUnit(key_file(tmp_path, 0o600), here)) is None
    assert "mode 0644" in guard.restart_blocker(KeyAndUnit(key_file(tmp_path, 0o644), here))
    assert "does not exist" in guard.restart_blocker(KeyAndUnit(str(tmp_path / "none"), here))
    missing = guard.restart_blocker(KeyAndUnit(key_file(tmp_path, 0o600), gone))
    assert missing.startswith("the runtime is missing: /nonexistent/venv/bin/python")
    assert guard.restart_blocker(KeyAndUnit(key_file(tmp_path, 0o600), "")) is None  # cannot ask: not held back


def test_the_fabric_wait_reaches_the_policy_from_the_command_line():
    import argparse

    parser = argparse.ArgumentParser()
    pair_cli.register(parser.add_subparsers())
    args = parser.parse_args(["pair", "guard", "--worker", "10.0.0.2", "--fabric-wait", "120"])
    args.startup_grace = 600
    assert pair_cli._policy_from_args(args).fabric_wait_s == 120
    assert parser.parse_args(["pair", "check", "--worker", "10.0.0.2"]).fabric_wait == 300


def test_the_role_passes_the_fabric_wait_to_the_guard():
    import yaml

    defaults = yaml.safe_load((REPO / "roles/vllm_service/defaults/main.yml").read_text())
    specs = yaml.safe_load((REPO / "roles/vllm_service/meta/argument_specs.yml").read_text())
    assert defaults["vllm_service_guard_fabric_wait_s"] == specs["argument_specs"]["main"]["options"][
        "vllm_service_guard_fabric_wait_s"]["default"] == Policy.fabric_wait_s
    assert "'--fabric-wait', vllm_service_guard_fabric_wait_s" in (
        REPO / "roles/vllm_service/vars/main.yml").read_text()


# --- a full disk ---------------------------------------------------------------------------------------------------


def test_a_full_disk_under_the_state_directory_holds_the_restart_back(tmp_path, monkeypatch):
    here = f"{{ path={sys.executable} ; argv[]={sys.executable} -I -m twinspark.cli serve ; ignore_errors=no }}"
    seen = []
    monkeypatch.setattr(guard, "free_bytes", lambda path: seen.append(path) or 300 * 2**20)
    problem = guard.restart_blocker(KeyAndUnit(key_file(tmp_path, 0o600), here))
    assert seen == [guard.layout.current().state_dir]
    assert problem.startswith(f"the disk under {seen[0]} is full (0.3 GiB free")
    assert "a restart cannot fix it" in problem
    decision = rules.decide(Observation("active", "failed", head_active_for_s=4000.0, cannot_restart=problem),
                            GuardState(), POLICY, T0)
    assert decision.action is Action.HOLD and decision.state.failures_in_row == 0
    monkeypatch.setattr(guard, "free_bytes", lambda path: rules.DISK_FULL_BYTES)
    assert guard.restart_blocker(KeyAndUnit(key_file(tmp_path, 0o600), here)) is None


def test_the_disk_rule_and_the_real_filesystem_look():
    assert rules.disk_problem("/var/lib/twinspark", None) is None, "could not look: not held back"
    assert rules.disk_problem("/var/lib/twinspark", rules.DISK_FULL_BYTES - 1) is not None
    assert guard.free_bytes("/nonexistent/state") is None
    assert guard.free_bytes(str(Path(__file__).parent)) > 0


def test_the_guard_says_when_the_firewall_watcher_finds_the_table_missing(tmp_path):
    from twinspark import firewall

    path = tmp_path / "state.json"
    said = []
    assert guard.firewall_missing(lambda p, m: said.append((p, m)), str(path)) is False  # no watcher: nothing
    firewall.write_state(path, firewall.State("inet twinspark", True, time.time(), 2))
    assert guard.firewall_missing(lambda p, m: said.append((p, m)), str(path)) is False
    firewall.write_state(path, firewall.State("inet twinspark", False, time.time(), 2, missing_since=time.time() - 9,
                                              error="Error: syntax error"))
    assert guard.firewall_missing(lambda p, m: said.append((p, m)), str(path)) is True
    assert said == [(3, said[0][1])] and said[0][1].startswith("host firewall: nftables table inet twinspark is "
                                                               "missing for 9 s")
