"""The pair guard's stall rules: vLLM's counters on /metrics tell a frozen pair from a busy one.

Timelines here imitate the guard's timer (a run every `INTERVAL` s after the previous one ended, a timed-out probe
lasting the short probe timeout) with plain numbers; the real pair is frozen by molecule/default/faults/stall.yml.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from twinspark import api as head_api
from twinspark.pair import cli as pair_cli
from twinspark.pair import guard, rules
from twinspark.pair import io as pair_io
from twinspark.pair import lifecycle as pl
from twinspark.pair.rules import Action, Generation, GuardState, Observation, Policy, Progress, Sample, Verdict

POLICY = Policy(stall_window_s=30, short_probe_timeout_s=15, timeout_strikes=3, startup_grace_s=600)
INTERVAL = 20.0  # vllm_service_guard_interval_s
HEAD_AGE = 4000.0  # the head's unit has been active this long
T0 = 1_000_000.0
RECORDED = Path(__file__).parent / "fixtures" / "health" / "recorded_vllm_cpu_0_32_metrics.txt"


def counted(at: float, running: float, tokens: float, kv: float = 0.1) -> Sample:
    return Sample(at=at, running=running, tokens=tokens, kv=kv)


UNREACHABLE = dict(error="no answer within the timeout", unreachable=True)


def served(at: float) -> GuardState:
    """A pair the guard has seen serve at `at` (and nothing else yet)."""
    return GuardState(served_at=at)


def run(state: GuardState, now: float, probe: Generation, samples: tuple[Sample, ...], age: float = HEAD_AGE):
    obs = Observation("active", "active", probe, "no token within 15 s" if probe is Generation.TIMEOUT else "",
                      head_active_for_s=age, samples=samples)
    return rules.decide(obs, state, POLICY, now)


# --- the metric names vLLM really exports -----------------------------------------------------------------------


def test_recorded_vllm_metrics_carry_the_counters_the_guard_watches():
    metrics = head_api.parse_metrics(RECORDED.read_text())
    assert (metrics["generation_tokens"], metrics["prompt_tokens"]) == (1.0, 2.0)
    sample = rules.sample_from_metrics(metrics, T0)
    assert (sample.running, sample.tokens, sample.counted, sample.error) == (0.0, 3.0, True, "")


def test_metrics_without_vllms_counters_are_not_counted_and_say_why():
    sample = rules.sample_from_metrics(head_api.parse_metrics("# TYPE up gauge\nup 1\n"), T0)
    assert not sample.counted and not sample.unreachable
    assert "vllm:num_requests_*" in sample.error


def test_a_closed_metrics_port_is_unreachable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    metrics = head_api.read_metrics(f"http://127.0.0.1:{port}", 2)
    sample = rules.sample_from_metrics(metrics, T0)
    assert sample.unreachable and not sample.counted
    assert sample.error


# --- frozen: requests running, counters flat --------------------------------------------------------------------


def freeze_to_restart(freeze_after_s: float) -> tuple[float, str]:
    """Simulated seconds from a freeze under load (tokens flow at 40/s until it) to the guard's restart decision."""
    state, now, freeze = served(T0 - 10), T0, T0 + freeze_after_s

    def tokens(at: float) -> float:
        return 5000.0 + 40 * (min(at, freeze) - T0)

    for _ in range(50):
        first = counted(now, 6, tokens(now))
        plan = rules.probe_plan(first, rules.track(state.progress, (first,), POLICY), True, POLICY, 120)
        if plan is None:  # the counters already show the stall: no probe needed
            decision, end = run(state, now, Generation.SKIPPED, (first,)), now
        else:
            assert plan == POLICY.short_probe_timeout_s
            end = now + plan
            probe = Generation.TIMEOUT if end >= freeze else Generation.OK
            second = (first, counted(end, 6, tokens(end))) if probe is Generation.TIMEOUT else (first,)
            decision = run(state, end, probe, second)
        state = decision.state
        if decision.action is Action.RESTART:
            return end - freeze, decision.reason
        assert decision.action in (Action.NONE, Action.WAIT), decision.reason
        now = end + INTERVAL
    raise AssertionError("the frozen pair was never restarted")


@pytest.mark.parametrize("freeze_after_s", [0.5, 7.5, 14.9, 15.1, 25.0, 34.9, 35.1, 50.0])
def test_frozen_pair_under_load_is_restarted_once_the_counters_stay_flat_for_the_window(freeze_after_s):
    seconds, reason = freeze_to_restart(freeze_after_s)
    assert "stalled" in reason and "6 request(s) running" in reason
    # never before the counters were flat for the window, and within the goal of 60 s (timer time)
    assert POLICY.stall_window_s <= seconds <= 60


def test_counters_flat_for_less_than_the_window_wait_without_counting_strikes():
    state = served(T0 - 100)
    decision = run(state, T0 + 15, Generation.TIMEOUT, (counted(T0, 3, 900), counted(T0 + 15, 3, 900)))
    assert (decision.verdict, decision.action) == (Verdict.SUSPECT, Action.WAIT)
    assert decision.state.timeout_strikes == 0
    assert "unchanged for 15 s of the 30 s" in decision.reason


def test_a_request_that_arrived_between_two_runs_is_not_timed_from_before_it():
    # idle at T0 with counter 900; at T0 + 40 a long prompt is being prefilled (running 1, counter still 900)
    state = run(served(T0 - 10), T0, Generation.OK, (counted(T0, 0, 900),)).state
    later = run(state, T0 + 40, Generation.TIMEOUT, (counted(T0 + 40, 1, 900), counted(T0 + 55, 1, 900)))
    assert later.action is Action.WAIT
    assert later.state.progress.flat_for() == 15


def test_a_saved_sample_older_than_the_limit_is_not_compared_with():
    old = Progress(at=T0 - 1000, tokens=900, kv=0.1, running=2, moved=False, flat_since=T0 - 1000)
    progress = rules.track(old, (counted(T0, 2, 900),), POLICY)
    assert progress.moved is None and progress.flat_for() == 0
    assert not rules.stalled(progress, POLICY)


def test_counters_that_went_down_mean_vllm_restarted_not_progress():
    old = Progress(at=T0 - 20, tokens=900, kv=0.1, running=2, moved=True, flat_since=None)
    progress = rules.track(old, (counted(T0, 2, 12),), POLICY)
    assert progress.moved is None and progress.tokens == 12


# --- busy: the probe times out but tokens flow ------------------------------------------------------------------


@pytest.mark.parametrize("per_run", [1.0, 37.0, 5000.0])
def test_busy_pair_whose_probe_always_times_out_is_never_restarted(per_run):
    # 500 runs (about 3 hours of timer) of a saturated pair: every probe times out, the counter keeps moving,
    # sometimes by a single token between two samples.
    state, now, tokens = GuardState(), T0, 10_000.0
    for _ in range(500):
        first = counted(now, 6, tokens)
        plan = rules.probe_plan(first, rules.track(state.progress, (first,), POLICY), True, POLICY, 120)
        assert plan is not None
        tokens += per_run
        second = counted(now + plan, 6, tokens)
        decision = run(state, now + plan, Generation.TIMEOUT, (first, second))
        assert decision.action is Action.NONE, decision.reason
        assert decision.verdict is Verdict.HEALTHY and "busy" in decision.reason
        state = decision.state
        tokens += per_run
        now += plan + INTERVAL
    assert state.timeout_strikes == 0


def test_an_idle_pair_whose_running_gauge_stays_up_is_never_restarted_while_its_probe_answers():
    # Should /metrics keep reporting requests running with flat counters while the pair idles, the probe that
    # answers proves the engine works: the stretch is timed again from the next sample, never skipped into a stall.
    state, now = served(T0 - 10), T0
    for _ in range(100):
        first = counted(now, 3, 900)
        plan = rules.probe_plan(first, rules.track(state.progress, (first,), POLICY), True, POLICY, 120)
        assert plan == POLICY.short_probe_timeout_s
        decision = run(state, now + 1, Generation.OK, (first,))
        assert decision.action is Action.NONE
        state, now = decision.state, now + 1 + INTERVAL


def test_a_long_chunked_prefill_moves_the_kv_cache_and_counts_as_progress():
    state = served(T0 - 10)
    samples = (counted(T0, 1, 900, kv=0.20), counted(T0 + 15, 1, 900, kv=0.35))
    decision = run(state, T0 + 15, Generation.TIMEOUT, samples)
    assert decision.verdict is Verdict.HEALTHY


# --- idle: nothing running, the short probe times out -----------------------------------------------------------


def test_idle_pair_whose_probe_times_out_and_metrics_do_not_answer_is_broken_at_once():
    state = served(T0 - 25)
    samples = (Sample(T0, **UNREACHABLE), Sample(T0 + 15, **UNREACHABLE))
    assert rules.probe_plan(samples[0], None, True, POLICY, 120) == 15  # not 120 s, and not three times
    decision = run(state, T0 + 15, Generation.TIMEOUT, samples)
    assert (decision.verdict, decision.action) == (Verdict.BROKEN, Action.RESTART)
    assert "/metrics does not answer" in decision.reason


def test_an_api_frozen_right_after_tokens_flowed_is_broken_not_busy():
    # Seen on a single Spark: its API process stopped (SIGSTOP) just after a client's tokens moved the counters.
    # The remembered progress still said "moved", and every run after read it as tokens flowing, for minutes.
    state = replace(served(T0 - 5), progress=Progress(T0 - 5, 1458, 0.1, 0, True, None))
    samples = (Sample(T0 + 15, **UNREACHABLE), Sample(T0 + 30, **UNREACHABLE))
    decision = run(state, T0 + 30, Generation.TIMEOUT, samples)
    assert (decision.verdict, decision.action) == (Verdict.BROKEN, Action.RESTART)
    assert "the API process hangs" in decision.reason
    assert decision.state.progress is not None and decision.state.progress.moved is None
    assert decision.state.served_at == T0 - 5  # not served now: nothing moved that this run saw


def test_idle_pair_whose_probe_times_out_with_flat_counters_is_broken_at_once():
    decision = run(served(T0 - 25), T0 + 15, Generation.TIMEOUT, (counted(T0, 0, 900), counted(T0 + 15, 0, 900)))
    assert (decision.verdict, decision.action) == (Verdict.BROKEN, Action.RESTART)
    assert "idle" in decision.reason and "frozen" in decision.reason


def test_a_young_pair_that_never_served_gets_the_long_probe_and_strikes_for_its_first_generation():
    # The first generation after a start compiles kernels; vLLM's counters do not move meanwhile.
    state = served(T0 - 5000)  # served before the head's latest start (active for 60 s)
    first = counted(T0, 0, 0)
    assert rules.probe_plan(first, None, rules.warm(state.served_at, 60, T0), POLICY, 120) == 120
    decision = run(state, T0 + 120, Generation.TIMEOUT, (first, counted(T0 + 120, 0, 0)), age=60)
    assert (decision.verdict, decision.action) == (Verdict.SUSPECT, Action.WAIT)
    assert decision.state.timeout_strikes == 1


def test_metrics_unreachable_while_the_probe_answers_is_healthy():
    decision = run(served(T0 - 25), T0 + 1, Generation.OK, (Sample(T0, **UNREACHABLE),))
    assert (decision.verdict, decision.action) == (Verdict.HEALTHY, Action.NONE)
    assert decision.state.served_at == T0 + 1


def test_metrics_without_counters_fall_back_to_the_long_probe_and_strikes():
    bare = Sample(T0, error="no vllm:num_requests_* metrics in the answer (is this vLLM?)")
    assert rules.probe_plan(bare, None, True, POLICY, 120) == 120
    state = served(T0 - 25)
    actions = []
    for i in range(3):
        decision = run(state, T0 + 140 * i, Generation.TIMEOUT, (bare,))
        actions.append(decision.action)
        state = decision.state
    assert actions == [Action.WAIT, Action.WAIT, Action.RESTART]


# --- the state file and a restart -------------------------------------------------------------------------------


def test_progress_survives_the_state_file(tmp_path):
    path = tmp_path / "state.json"
    state = GuardState(progress=Progress(T0, 900.0, None, 2.0, False, T0 - 12), served_at=T0 - 40)
    guard.save_state(path, state)
    assert guard.load_state(path) == state


def test_a_state_file_from_before_stall_detection_still_loads(tmp_path):
    path = tmp_path / "state.json"
    path.write_text('{"attempts": [], "failures_in_row": 2, "timeout_strikes": 1, "gave_up_at": null}')
    state = guard.load_state(path)
    assert (state.failures_in_row, state.progress, state.served_at) == (2, None, None)


def test_a_restart_forgets_the_counters_of_the_processes_it_replaced():
    state = GuardState(progress=Progress(T0, 900.0, 0.1, 2.0, False, T0 - 40), served_at=T0 - 60)
    after = rules.after_restart(state, T0, True, "stalled -> serving", POLICY, finished_at=T0 + 70)
    assert (after.progress, after.served_at) == (None, T0 + 70)
    failed = rules.after_restart(state, T0, False, "stalled -> not serving", POLICY, finished_at=T0 + 70)
    assert (failed.progress, failed.served_at) == (None, None)


# --- the I/O order of one run -----------------------------------------------------------------------------------


class ScriptedPair(pair_io.LivePair):
    """Both units active; /metrics and the probe answer from scripts, recording what was asked and when."""

    def __init__(self, samples, probe):
        super().__init__(api=rules.Api("http://127.0.0.1:9", "tiny", None), worker_addresses=["127.0.0.1"])
        self.samples = list(samples)
        self.answer = probe
        self.calls: list[str] = []

    def head_props(self):
        return {"ActiveState": "active", "ActiveEnterTimestampMonotonic": "1"}

    def worker(self, verb):
        return "active"

    def sample(self, timeout_s):
        self.calls.append("metrics")
        return self.samples.pop(0)

    def probe(self, timeout_s):
        self.calls.append(f"probe {timeout_s:.0f}")
        return self.answer, "no token within the timeout"


def test_one_run_reads_metrics_probes_short_and_reads_metrics_again_after_a_timeout():
    pair = ScriptedPair([counted(T0, 0, 900), counted(T0 + 15, 0, 900)], Generation.TIMEOUT)
    import time

    obs = pair.observe(120, POLICY, served(time.time() - 1))
    assert pair.calls == ["metrics", "probe 15", "metrics"]
    assert len(obs.samples) == 2


def test_one_run_skips_the_probe_when_the_saved_counters_already_show_a_stall():
    stuck = Progress(T0 - 20, 900.0, 0.1, 4.0, False, T0 - 35)
    pair = ScriptedPair([counted(T0, 4, 900)], Generation.OK)
    obs = pair.observe(120, POLICY, GuardState(progress=stuck))
    assert pair.calls == ["metrics"]
    assert rules.decide(obs, GuardState(progress=stuck), POLICY, T0).action is Action.RESTART


def test_without_a_policy_a_run_is_the_units_and_the_probe_as_before():
    pair = ScriptedPair([], Generation.OK)
    obs = pair.observe(120)
    assert pair.calls == ["probe 120"] and obs.samples == ()


def test_guard_and_check_accept_the_stall_knobs():
    import argparse

    parser = argparse.ArgumentParser()
    pair_cli.register(parser.add_subparsers())
    args = parser.parse_args(["pair", "check", "--worker", "10.0.0.2", "--stall-window", "45",
                              "--short-probe-timeout", "10", "--metrics-timeout", "3", "--probe-timeout", "90"])
    args.startup_grace = 600
    policy = pair_cli._policy_from_args(args)
    assert (policy.stall_window_s, policy.short_probe_timeout_s, policy.metrics_timeout_s) == (45, 10, 3)
    defaults = parser.parse_args(["pair", "guard", "--worker", "10.0.0.2"])
    assert (defaults.stall_window, defaults.short_probe_timeout, defaults.probe_timeout) == (30.0, 15.0, 120.0)


def test_a_head_whose_api_hangs_entirely_is_a_timeout_and_with_metrics_silent_broken():
    # e.g. the head's processes frozen: /v1/models, the generation and /metrics all accept and never answer
    hung = {"error": "no answer within the timeout", "elapsed": 15.0}
    api = rules.Api("http://127.0.0.1:8888", "tiny", 512)
    probe, detail = rules.classify_probe({"models": hung, "generate": hung}, api, 15)
    assert probe is Generation.TIMEOUT and "/v1/models" in detail
    obs = Observation("active", "active", probe, detail, HEAD_AGE, (Sample(T0, **UNREACHABLE),
                                                                    Sample(T0 + 15, **UNREACHABLE)))
    assert rules.decide(obs, served(T0 - 20), POLICY, T0 + 15).action is Action.RESTART


def test_a_starting_head_that_refuses_connections_is_still_not_ready():
    refused = {"error": "ConnectionError: Connection refused"}
    api = rules.Api("http://127.0.0.1:8888", "tiny", None)
    probe, _ = rules.classify_probe({"models": refused, "generate": refused}, api, 15)
    assert probe is Generation.NOT_READY


def test_state_command_shows_the_counters_the_guard_compares_with(tmp_path, capsys):
    from twinspark import cli

    path = tmp_path / "state.json"
    guard.save_state(path, GuardState(progress=Progress(T0, 900.0, 0.1, 2.0, False, T0 - 12)))
    assert cli.main(["pair", "state", "--state-file", str(path)]) == 0
    assert "2 request(s) running, token counter at 900, unchanged for 12 s" in capsys.readouterr().out


# --- whole guard runs through the CLI: a stand-in vLLM API on loopback, systemctl/SSH and the restart replaced ---

METRICS_TEMPLATE = RECORDED.read_text()


class StandInVllm:
    """Serves /metrics (the recorded vLLM text with the running gauge and generation counter set by the test),
    /v1/models, and a one-token generation that answers at once or hangs for `hang_s`."""

    def __init__(self):
        import http.server
        import threading

        self.running, self.tokens, self.step = 0, 1, 0  # step: added to the counter at every /metrics read
        self.hang_s, self.metrics_status = 0.0, 200
        self.generations = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body, kind="application/json"):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/metrics":
                    if outer.metrics_status != 200:
                        return self._send(outer.metrics_status, "{}")
                    outer.tokens += outer.step
                    text = (METRICS_TEMPLATE
                            .replace('vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
                                     f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {outer.running}.0')
                            .replace('vllm:generation_tokens_total{engine="0",model_name="tiny"} 1.0',
                                     f'vllm:generation_tokens_total{{engine="0",model_name="tiny"}} {outer.tokens}.0'))
                    return self._send(200, text, "text/plain; version=0.0.4")
                if self.path == "/v1/models":
                    return self._send(200, '{"data": [{"id": "tiny", "max_model_len": 512}]}')
                return self._send(404, "{}")

            def do_POST(self):
                import time

                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.generations += 1
                if outer.hang_s:
                    time.sleep(outer.hang_s)
                self._send(200, '{"choices": [{"text": "!"}], "usage": {"completion_tokens": 1}}')

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.port = self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def guarded(tmp_path, monkeypatch):
    """(stand-in API, run the guard once -> (exit code, its JSON), restarts asked for, state file)."""
    import json

    from twinspark import cli

    vllm = StandInVllm()
    env = tmp_path / "serve.env"
    env.write_text(f"VLLM_HOST=127.0.0.1\nVLLM_PORT={vllm.port}\nSERVED_MODEL_NAME=tiny\nMAX_MODEL_LEN=512\n")
    state_file = tmp_path / "state.json"
    restarts: list[str] = []
    monkeypatch.setattr(pair_io.LivePair, "head_props",
                        lambda self: {"ActiveState": "active", "ActiveEnterTimestampMonotonic": "1"})
    monkeypatch.setattr(pair_io.LivePair, "worker", lambda self, verb: "active")
    # The guard's key as site.yml leaves it, and a rank unit whose executable is there: nothing holds a restart back.
    key = tmp_path / "id_ed25519"
    key.write_text("key\n")
    key.chmod(0o600)
    monkeypatch.setattr(pair_io.LivePair, "exec_start",
                        lambda self: f"{{ path={sys.executable} ; argv[]={sys.executable} }}")
    probe = pair_io.LivePair.probe

    def timed_probe(self, timeout_s):
        vllm.probe_timeouts.append(timeout_s)
        return probe(self, timeout_s)

    vllm.probe_timeouts = []
    monkeypatch.setattr(pair_io.LivePair, "probe", timed_probe)

    def fake_restart(pair, ready_timeout_s, probe_timeout_s):
        restarts.append("ordered restart")
        return True, "serving again 1 s after the head started (one token)"

    monkeypatch.setattr(pl, "ordered_restart", fake_restart)

    def run_json(capsys):
        argv = ["pair", "guard", "--env", str(env), "--worker", "127.0.0.1", "--state-file", str(state_file),
                "--ssh-key", str(key), "--short-probe-timeout", "0.3", "--metrics-timeout", "2", "--stall-window", "30",
                "--json",
                "--lock-file", str(tmp_path / "pair.lock"), "--pause-file", str(tmp_path / "paused")]
        code = cli.main(argv)
        return code, json.loads(capsys.readouterr().out)

    yield vllm, run_json, restarts, state_file
    vllm.close()


def test_guard_cli_frozen_under_load_skips_the_probe_and_restarts(guarded, capsys):
    import time

    vllm, run_json, restarts, state_file = guarded
    vllm.running, vllm.tokens = 6, 4242
    kv = head_api.parse_metrics(RECORDED.read_text())["kv_cache_usage"]
    now = time.time()
    # the previous run (20 s ago) saw the same counters: 4242 generated + 2 prefilled tokens, flat for 20 s already
    guard.save_state(state_file, GuardState(progress=Progress(now - 20, 4244.0, kv, 6.0, False, now - 40),
                                         served_at=now - 60))
    code, seen = run_json(capsys)
    assert code == 0 and restarts == ["ordered restart"]
    assert seen["action"] == "restart" and "stalled" in seen["reason"]
    assert vllm.generations == 0  # the saved counters already showed the stall
    state = guard.load_state(state_file)
    assert state.progress is None and "stalled" in state.attempts[-1].reason


def test_guard_cli_busy_pair_with_hanging_probes_is_never_restarted(guarded, capsys):
    vllm, run_json, restarts, state_file = guarded
    vllm.running, vllm.step, vllm.hang_s = 6, 7, 1.0
    for _ in range(4):
        code, seen = run_json(capsys)
        assert code == 0 and seen["action"] == "none", seen["reason"]
    assert "busy" in seen["reason"] and "timed out" in seen["reason"]
    assert restarts == [] and vllm.generations == 4


def test_guard_cli_idle_pair_that_served_and_now_hangs_is_restarted_after_one_short_probe(guarded, capsys):
    vllm, run_json, restarts, state_file = guarded
    code, seen = run_json(capsys)  # serving: the guard notes when
    assert seen["verdict"] == "healthy" and guard.load_state(state_file).served_at is not None
    vllm.hang_s = 1.0  # frozen: the generation never answers in time, the idle counters stay put
    code, seen = run_json(capsys)
    assert seen["action"] == "restart" and "frozen" in seen["reason"], seen["reason"]
    assert restarts == ["ordered restart"]
    # the first look, before the pair had served, allowed the long probe; the frozen one got the short one, once
    assert vllm.probe_timeouts == [120.0, 0.3]
    assert [s["running"] for s in seen["observation"]["samples"]] == [0.0, 0.0]


def test_guard_cli_metrics_failing_while_the_probe_answers_is_healthy(guarded, capsys):
    vllm, run_json, restarts, state_file = guarded
    vllm.metrics_status = 500
    code, seen = run_json(capsys)
    assert (code, seen["verdict"], seen["action"]) == (0, "healthy", "none")
    assert seen["observation"]["samples"][0]["unreachable"] is True
    assert restarts == []
