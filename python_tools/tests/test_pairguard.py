"""The pair guard's rules: from what it saw and what it did before, to what it does now."""

from __future__ import annotations

import json

import pytest

from twinspark import api as head_api
from twinspark import systemd
from twinspark.pair import guard, rules
from twinspark.pair import lifecycle as pl
from twinspark.pair.rules import Action, Attempt, Generation, GuardState, Observation, Policy, Verdict

POLICY = Policy(max_attempts=3, backoff_initial_s=30, backoff_max_s=300, flap_window_s=3600,
                startup_grace_s=600, timeout_strikes=3)
NOW = 1_000_000.0


def healthy() -> Observation:
    return Observation("active", "active", Generation.OK, "one token in 0.2 s", 120.0)


# --- what vLLM really does when one rank dies (roles/pair_guard/README.md, the table of faults) -----------


def test_worker_killed_while_idle_restarts_the_pair_even_though_the_head_looks_fine():
    # The idle head keeps answering /health; only the worker's unit tells.
    obs = Observation("active", "failed", Generation.SKIPPED, head_active_for_s=4000)
    decision = rules.decide(obs, GuardState(), POLICY, NOW)
    assert decision.action is Action.RESTART
    assert "worker" in decision.reason and "failed" in decision.reason


def test_worker_and_head_exited_with_status_zero_restarts_the_pair():
    decision = rules.decide(Observation("inactive", "inactive"), GuardState(), POLICY, NOW)
    assert decision.action is Action.RESTART
    assert "head" in decision.reason and "worker" in decision.reason


def test_head_killed_leaves_an_orphaned_worker_that_gets_restarted_with_it():
    decision = rules.decide(Observation("failed", "active"), GuardState(), POLICY, NOW)
    assert decision.action is Action.RESTART
    assert "head" in decision.reason


def test_a_failed_generation_with_both_units_active_restarts_the_pair():
    obs = Observation("active", "active", Generation.ERROR, "HTTP 500", 4000)
    decision = rules.decide(obs, GuardState(), POLICY, NOW)
    assert decision.action is Action.RESTART
    assert "HTTP 500" in decision.reason


def test_rebooted_node_with_no_unit_running_restarts_the_pair():
    decision = rules.decide(Observation("inactive", "active"), GuardState(), POLICY, NOW)
    assert decision.action is Action.RESTART


# --- patience --------------------------------------------------------------------------------------------------


def test_healthy_pair_needs_nothing():
    decision = rules.decide(healthy(), GuardState(), POLICY, NOW)
    assert (decision.verdict, decision.action) == (Verdict.HEALTHY, Action.NONE)


def test_unreachable_worker_waits_instead_of_restarting_half_a_pair():
    decision = rules.decide(Observation("active", None), GuardState(), POLICY, NOW)
    assert decision.action is Action.WAIT
    assert "SSH" in decision.reason


def test_young_head_that_is_not_ready_is_still_starting():
    obs = Observation("active", "active", Generation.NOT_READY, "connection refused", head_active_for_s=60)
    decision = rules.decide(obs, GuardState(), POLICY, NOW)
    assert (decision.verdict, decision.action) == (Verdict.STARTING, Action.WAIT)


def test_head_not_ready_long_after_the_grace_is_stuck_and_restarted():
    obs = Observation("active", "active", Generation.NOT_READY, "connection refused", head_active_for_s=601)
    decision = rules.decide(obs, GuardState(), POLICY, NOW)
    assert decision.action is Action.RESTART
    assert "601 s" in decision.reason


@pytest.mark.parametrize("state", ["activating", "deactivating"])
def test_a_unit_in_transition_is_left_alone(state):
    assert rules.decide(Observation("active", state), GuardState(), POLICY, NOW).action is Action.WAIT
    assert rules.decide(Observation(state, "active"), GuardState(), POLICY, NOW).action is Action.WAIT


def test_timeouts_count_as_strikes_before_a_busy_pair_is_restarted():
    state = GuardState()
    slow = Observation("active", "active", Generation.TIMEOUT, "no token within 120 s", 4000)
    actions = []
    for _ in range(3):
        decision = rules.decide(slow, state, POLICY, NOW)
        actions.append(decision.action)
        state = decision.state
    assert actions == [Action.WAIT, Action.WAIT, Action.RESTART]


def test_a_healthy_run_clears_timeout_strikes():
    slow = Observation("active", "active", Generation.TIMEOUT, "no token within 120 s", 4000)
    state = rules.decide(slow, GuardState(), POLICY, NOW).state
    state = rules.decide(slow, state, POLICY, NOW).state
    state = rules.decide(healthy(), state, POLICY, NOW).state
    assert rules.decide(slow, state, POLICY, NOW).action is Action.WAIT


# --- bounded restarts ------------------------------------------------------------------------------------------


def broken() -> Observation:
    return Observation("active", "inactive", head_active_for_s=4000)


def test_backoff_doubles_with_recent_restarts_and_is_capped():
    assert [POLICY.backoff_s(n) for n in range(6)] == [0, 30, 60, 120, 240, 300]


def test_second_restart_waits_for_the_backoff():
    state = rules.after_restart(GuardState(), NOW - 10, False, "worker inactive -> not serving", POLICY)
    waiting = rules.decide(broken(), state, POLICY, NOW)
    assert waiting.action is Action.WAIT
    assert "next attempt in 20 s" in waiting.reason
    assert rules.decide(broken(), state, POLICY, NOW + 21).action is Action.RESTART


def test_restarts_that_keep_succeeding_still_slow_down_a_flapping_pair():
    state = GuardState()
    for at in (NOW - 100, NOW - 50):
        state = rules.after_restart(state, at, True, "ok", POLICY)
    assert state.failures_in_row == 0
    # two recent restarts: 60 s after the latest (NOW - 50) is not yet over
    assert rules.decide(broken(), state, POLICY, NOW).action is Action.WAIT
    assert rules.decide(broken(), state, POLICY, NOW + 11).action is Action.RESTART


def test_restarts_outside_the_flap_window_are_forgotten():
    state = rules.after_restart(GuardState(), NOW - 7200, True, "ok", POLICY)
    state = rules.after_restart(state, NOW - 10, True, "ok", POLICY)
    assert [a.at for a in state.attempts] == [NOW - 10]


def test_gives_up_loudly_after_max_failed_restarts_in_a_row():
    state = GuardState()
    for i in range(POLICY.max_attempts):
        state = rules.after_restart(state, NOW - 10_000 + i, False, "not serving after 1800 s", POLICY)
    decision = rules.decide(broken(), state, POLICY, NOW)
    assert decision.action is Action.GIVE_UP
    assert decision.state.gave_up_at == NOW
    assert "3 ordered restarts in a row" in decision.reason
    assert "restart.yml" in decision.reason
    # and it stays given up on later runs, restarting nothing
    later = rules.decide(broken(), decision.state, POLICY, NOW + 10_000)
    assert later.action is Action.GAVE_UP


def test_a_pair_repaired_by_an_operator_clears_the_give_up():
    state = GuardState(failures_in_row=3, gave_up_at=NOW - 60, gave_up_reason="x")
    decision = rules.decide(healthy(), state, POLICY, NOW)
    assert decision.action is Action.NONE
    assert (decision.state.gave_up_at, decision.state.failures_in_row) == (None, 0)
    assert rules.decide(broken(), decision.state, POLICY, NOW + 1).action is Action.RESTART


def test_a_successful_restart_resets_the_failure_count():
    state = rules.after_restart(GuardState(), NOW - 500, False, "x", POLICY)
    state = rules.after_restart(state, NOW - 400, True, "y", POLICY)
    assert state.failures_in_row == 0
    assert [a.ok for a in state.attempts] == [False, True]


# --- the API as the env files describe it ----------------------------------------------------------------------


@pytest.mark.parametrize(("bind", "url"), [
    ("0.0.0.0", "http://127.0.0.1:8888"),
    ("", "http://127.0.0.1:8888"),
    ("::", "http://[::1]:8888"),
    ("10.78.0.1", "http://10.78.0.1:8888"),
    ("fd00::1", "http://[fd00::1]:8888"),
])
def test_probe_url_reaches_the_bind_address_from_the_head(bind, url):
    assert head_api.api_from_env({"VLLM_HOST": bind, "SERVED_MODEL_NAME": "m"}).url == url


def test_probe_sends_the_first_of_several_keys_and_never_shows_it():
    api = head_api.api_from_env({"VLLM_PORT": "08080", "SERVED_MODEL_NAME": "m", "DSPARK_API_KEYS": "k1  k2",
                           "MAX_MODEL_LEN": "512"})
    assert api.url.endswith(":8080")
    assert api.headers() == {"Authorization": "Bearer k1"}
    assert api.max_model_len == 512
    assert "k1" not in repr(api)


def test_no_key_means_no_authorization_header():
    assert head_api.api_from_env({"SERVED_MODEL_NAME": "m", "VLLM_API_KEY": "  "}).headers() == {}


def test_missing_served_name_names_the_variable():
    with pytest.raises(ValueError, match="SERVED_MODEL_NAME"):
        head_api.api_from_env({"VLLM_PORT": "8888"})


# --- systemctl and the state file ------------------------------------------------------------------------------


def test_active_for_uses_the_monotonic_enter_timestamp():
    props = systemd.parse_show("ActiveState=active\nActiveEnterTimestampMonotonic=100000000\n")
    assert rules.active_for_s(props, 160.0) == pytest.approx(60.0)
    assert rules.active_for_s({"ActiveState": "inactive", "ActiveEnterTimestampMonotonic": "5"}, 160.0) is None


def test_state_survives_a_round_trip_through_the_file(tmp_path):
    path = tmp_path / "guard" / "state.json"
    state = GuardState(attempts=(Attempt(NOW, False, "why"),), failures_in_row=1, gave_up_at=NOW,
                       gave_up_reason="because", last={"action": "give_up"})
    guard.save_state(path, state)
    assert guard.load_state(path) == state
    assert json.loads(path.read_text())["failures_in_row"] == 1


def test_an_unreadable_state_file_starts_clean(tmp_path, capsys):
    path = tmp_path / "state.json"
    path.write_text("{truncated")
    assert guard.load_state(path) == GuardState()
    assert "unreadable" in capsys.readouterr().err


# --- the ordered restart ---------------------------------------------------------------------------------------


class RecordingPair:
    """Stands in for systemctl/SSH/HTTP to check the order of steps; the real ones run on the simulated pair."""

    def __init__(self, probes, worker_reachable=True, head_states=None, worker_states=None):
        self.calls: list[str] = []
        self.probes = list(probes)
        self.worker_reachable = worker_reachable
        self.head_states = list(head_states or [])
        self.worker_states = list(worker_states or [])
        self.worker_reads = 0

    def head(self, verb):
        self.calls.append(f"head {verb}")

    def worker(self, verb):
        if not self.worker_reachable:
            return None
        if verb != "state":
            self.calls.append(f"worker {verb}")
            return "active"
        self.worker_reads += 1
        return self.worker_states.pop(0) if self.worker_states else "active"

    def head_props(self):
        return {"ActiveState": self.head_states.pop(0) if self.head_states else "active"}

    def probe(self, timeout_s):
        self.calls.append("probe")
        return self.probes.pop(0)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_restart_order_is_stop_head_stop_worker_start_worker_start_head_then_wait():
    pair = RecordingPair([(Generation.NOT_READY, "refused"), (Generation.OK, "one token")])
    clock = FakeClock()
    ok, outcome = pl.ordered_restart(pair, 600, 60, poll_s=5, clock=clock, sleep=clock.sleep)
    assert ok, outcome
    assert pair.calls == ["head stop", "worker stop", "worker start", "head start", "probe", "probe"]


def test_a_restart_that_serves_keeps_the_head_rank_it_served_with():
    pair = RecordingPair([(Generation.NOT_READY, "refused"), (Generation.OK, "one token")])
    kept: list[object] = []
    pair.head_props = lambda: {"ActiveState": "active", "InvocationID": "head-7"}
    pair.remember_served = kept.append
    clock = FakeClock()
    ok, _ = pl.ordered_restart(pair, 600, 60, poll_s=5, clock=clock, sleep=clock.sleep)
    assert ok and kept == ["head-7"]
    kept.clear()
    pair.probes = [(Generation.NOT_READY, "refused")] * 3
    ok, _ = pl.wait_serving(pair, 10, 60, poll_s=5, clock=clock, sleep=clock.sleep)
    assert not ok and kept == []  # a pair that never served keeps nothing


def test_restart_stops_after_the_head_when_the_worker_cannot_be_reached_and_starts_the_head_again():
    pair = RecordingPair([], worker_reachable=False)
    ok, outcome = pl.ordered_restart(pair, 600, 60)
    assert not ok
    assert pair.calls == ["head stop", "head start"]
    assert "worker could not be reached" in outcome and "head started again" in outcome


def test_restart_fails_early_when_the_head_exits_while_loading():
    pair = RecordingPair([(Generation.NOT_READY, "refused")] * 3, head_states=["active", "inactive"])
    clock = FakeClock()
    ok, outcome = pl.ordered_restart(pair, 600, 60, poll_s=5, clock=clock, sleep=clock.sleep)
    assert not ok
    assert "head inactive" in outcome
    assert clock.now == 5


def test_the_wait_polls_the_head_often_and_the_worker_over_ssh_only_every_few_seconds():
    pair = RecordingPair([(Generation.NOT_READY, "refused")] * 20 + [(Generation.OK, "one token")])
    clock = FakeClock()
    ok, outcome = pl.wait_serving(pair, 600, 60, poll_s=0.5, clock=clock, sleep=clock.sleep, worker_every_s=5)
    assert ok, outcome
    assert clock.now == 10.0, "found serving on the first poll that answered, 0.5 s apart"
    assert pair.worker_reads == 3, "the worker's unit read at 0, 5 and 10 s only"


def test_the_wait_stops_when_the_worker_leaves_active():
    pair = RecordingPair([(Generation.NOT_READY, "refused")] * 40, worker_states=["active", "failed"])
    clock = FakeClock()
    ok, outcome = pl.wait_serving(pair, 600, 60, poll_s=0.5, clock=clock, sleep=clock.sleep, worker_every_s=5)
    assert not ok and "worker failed" in outcome
    assert clock.now == 5.0


def test_restart_gives_up_waiting_at_the_ready_timeout():
    pair = RecordingPair([(Generation.NOT_READY, "refused")] * 100)
    clock = FakeClock()
    ok, outcome = pl.ordered_restart(pair, 60, 10, poll_s=5, clock=clock, sleep=clock.sleep)
    assert not ok
    assert "not serving 60 s after the head started" in outcome
    assert clock.now == 60


# --- the CLI an operator uses on the head -----------------------------------------------------------------------


def test_state_command_exits_1_and_says_so_when_the_guard_gave_up(tmp_path, capsys):
    from twinspark import cli

    path = tmp_path / "state.json"
    guard.save_state(path, GuardState(failures_in_row=5, gave_up_at=NOW, gave_up_reason="5 ordered restarts failed"))
    assert cli.main(["pair", "state", "--state-file", str(path)]) == 1
    assert "5 ordered restarts failed" in capsys.readouterr().out


def test_reset_command_lets_the_guard_act_again(tmp_path):
    from twinspark import cli

    path = tmp_path / "state.json"
    guard.save_state(path, GuardState(failures_in_row=5, gave_up_at=NOW, gave_up_reason="x"))
    assert cli.main(["pair", "reset", "--state-file", str(path)]) == 0
    assert cli.main(["pair", "state", "--state-file", str(path)]) == 0
    assert rules.decide(broken(), guard.load_state(path), POLICY, NOW).action is Action.RESTART


def test_guard_with_unreadable_env_files_exits_2_naming_the_file(tmp_path, capsys):
    from twinspark import cli

    missing = tmp_path / "serve.env"
    code = cli.main(["pair", "guard", "--env", str(missing), "--worker", "127.0.0.1",
                     "--state-file", str(tmp_path / "state.json")])
    assert code == 2
    assert str(missing) in capsys.readouterr().err


# --- what the head's API answered (shaped like twinspark.api.gather) -----------------------------

API = rules.Api(url="http://127.0.0.1:8888", served_name="tiny", max_model_len=512, api_key="k")
LISTED = {"status_code": 200, "json": {"data": [{"id": "tiny", "max_model_len": 512}]}}


def test_one_token_back_is_ok():
    probe, _ = rules.classify_probe({"models": LISTED, "generate": {"status_code": 200, "tokens": 1}}, API, 60)
    assert probe is Generation.OK


def test_model_not_listed_yet_is_not_ready():
    results = {"models": {"error": "ConnectionError: Connection refused"}, "generate": {"error": "refused"}}
    probe, detail = rules.classify_probe(results, API, 60)
    assert probe is Generation.NOT_READY
    assert "Connection refused" in detail


def test_generation_failing_after_the_worker_died_is_an_error():
    results = {"models": LISTED, "generate": {"status_code": 500}}
    probe, detail = rules.classify_probe(results, API, 60)
    assert probe is Generation.ERROR
    assert "HTTP 500" in detail


def test_generation_without_an_answer_in_time_is_a_timeout():
    import requests

    class SlowSession:
        def request(self, *args, **kwargs):
            raise requests.ReadTimeout("read timed out")

    generated, _ = head_api.request(SlowSession(), "POST", "http://127.0.0.1:8888/v1/completions", 1)
    probe, _ = rules.classify_probe({"models": LISTED, "generate": generated}, API, 1)
    assert probe is Generation.TIMEOUT
