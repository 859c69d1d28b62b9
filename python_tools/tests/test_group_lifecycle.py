"""The pair's lifecycle and guard for a group of three or more ranks: the order (stop 0..N-1, start N-1..1 then 0),
the put-back after a rank fails midway, the group's ranks judged as one "worker side" by the guard (the first rank
that is not active, named), and `--rank R:ADDRESS` on the command line. A pair's steps and words are unchanged
(tests/test_pair_safety.py and the guard's tests hold them)."""

from __future__ import annotations

import subprocess

import pytest

from twinspark.pair import cli as pair_cli
from twinspark.pair import io as pair_io
from twinspark.pair import lifecycle as pl
from twinspark.pair.rules import Generation, Observation, Policy, Verdict, assess, rank_name, worker_status


class GroupStand:
    """Stands in for systemctl on rank 0 and every other rank's forced command: records each step, answers `state`
    per rank, and fails the steps named in `fail` as the real ones do. Real SSH to several ranks runs in the
    simulation; this holds the order and the put-back."""

    def __init__(self, size=4, states=None, fail=(), unreachable=()):
        self.size = size
        self.more_ranks = tuple(pair_io.Rank(rank, (f"10.78.0.{rank + 1}",)) for rank in range(2, size))
        self.worker_addresses = ["10.78.0.2"]
        self.states = dict(states or {})
        self.fail = set(fail)
        self.unreachable = set(unreachable)
        self.calls: list[str] = []
        self.ssh_key = None
        self.unit = "twinspark-vllm.service"

    def head_props(self):
        return {"ActiveState": self.states.get(0, "active"), "LoadState": "loaded"}

    def head(self, verb):
        if f"rank 0 {verb}" in self.fail:
            raise subprocess.CalledProcessError(1, ["systemctl", verb], stderr="Job failed")
        self.calls.append(f"rank 0 {verb}")

    def rank(self, number, verb):
        if number in self.unreachable:
            return None
        if f"rank {number} {verb}" in self.fail:
            raise RuntimeError(f"rank {number}: `{verb}` failed (exit 1): Job failed")
        if verb in ("start", "stop"):
            self.calls.append(f"rank {number} {verb}")
        return self.states.get(number, "active")

    def peers(self):
        return [pair_io.Rank(1, tuple(self.worker_addresses)), *self.more_ranks]

    def peer_status(self):
        for peer in self.peers():
            state = self.rank(peer.rank, "state")
            if state != "active":
                return rank_name(peer.rank, self.size), state, None
        return rank_name(1, self.size), "active", None

    def worker(self, verb):
        return self.peer_status()[1]


# --- the order -------------------------------------------------------------------------------------------------


def test_a_pair_keeps_its_head_and_worker_steps():
    assert pl.steps("restart") == pl.RESTART_STEPS
    assert pl.steps("stop") == pl.STOP_STEPS
    assert pl.steps("restart", size=2) == pl.RESTART_STEPS


def test_a_group_of_four_stops_rank_0_first_and_starts_it_last():
    assert [f"{rank} {verb}" for rank, verb in pl.steps("restart", size=4)] == [
        "rank 0 stop", "rank 1 stop", "rank 2 stop", "rank 3 stop",
        "rank 3 start", "rank 2 start", "rank 1 start", "rank 0 start"]
    assert pl.steps("stop", size=3) == (("rank 0", "stop"), ("rank 1", "stop"), ("rank 2", "stop"))


def test_a_start_of_a_serving_group_does_nothing_and_of_a_broken_one_restarts_all():
    assert pl.steps("start", "active", "active", size=8) == ()
    assert len(pl.steps("start", "active", "failed", size=8)) == 16


def test_the_group_restart_runs_every_step_in_order():
    group = GroupStand(size=4)
    ok, outcome = pl.run_steps(group, pl.steps("restart", size=4))
    assert ok, outcome
    assert group.calls == ["rank 0 stop", "rank 1 stop", "rank 2 stop", "rank 3 stop",
                           "rank 3 start", "rank 2 start", "rank 1 start", "rank 0 start"]
    assert outcome.startswith("rank 0 stopped, rank 1 stopped")


# --- a rank that fails midway: put back what this run stopped, highest rank first --------------------------------


def test_put_back_starts_the_stopped_ranks_in_the_groups_start_order():
    plan = pl.steps("restart", size=4)
    done = plan[:4] + (("rank 3", "start"),)
    assert pl.put_back(done, plan) == (("rank 2", "start"), ("rank 1", "start"), ("rank 0", "start"))


def test_a_rank_start_that_fails_midway_starts_the_rest_again_and_says_which_failed():
    group = GroupStand(size=4, fail={"rank 2 start"})
    ok, outcome = pl.run_steps(group, pl.steps("restart", size=4))
    assert not ok
    assert group.calls == ["rank 0 stop", "rank 1 stop", "rank 2 stop", "rank 3 stop", "rank 3 start",
                           "rank 1 start", "rank 0 start"]
    assert "rank 2's start failed" in outcome and "could not start rank 2 again" in outcome
    assert "rank 1 started again" in outcome and "rank 0 started again" in outcome


def test_an_unreachable_rank_is_named_when_a_step_cannot_reach_it():
    group = GroupStand(size=3, unreachable={2})
    unreached: list[int] = []
    ok, outcome = pl.run_steps(group, pl.steps("stop", size=3), unreached=unreached)
    assert not ok and group.calls == ["rank 0 stop", "rank 1 stop"]
    assert outcome.startswith("rank 2 could not be reached to stop it") and unreached == [2]


def test_a_stop_goes_on_past_a_rank_it_cannot_reach_and_stops_the_rest():
    # Seen on the simulated group of four: rank 2 cut off, `pair stop` stopped ranks 0 and 1 and left rank 3 serving.
    group = GroupStand(size=4, unreachable={2})
    unreached: list[int] = []
    ok, outcome = pl.run_steps(group, pl.steps("stop", size=4), "twinspark pair stop", unreached)
    assert not ok and group.calls == ["rank 0 stop", "rank 1 stop", "rank 3 stop"]
    assert outcome == "rank 2 could not be reached to stop it (rank 0 stopped, rank 1 stopped, rank 3 stopped)"
    assert unreached == [2]


def test_a_failed_rank_command_is_not_counted_as_unreached():
    group = GroupStand(size=4, fail={"rank 1 stop"})
    unreached: list[int] = []
    ok, outcome = pl.run_steps(group, pl.steps("stop", size=4), unreached=unreached)
    assert not ok and unreached == [] and group.calls == ["rank 0 stop", "rank 2 stop", "rank 3 stop"]
    assert outcome.startswith("rank 1's stop failed")


def test_a_restart_still_stops_at_the_first_unreachable_rank_and_puts_back():
    group = GroupStand(size=4, unreachable={3})
    unreached: list[int] = []
    ok, outcome = pl.run_steps(group, pl.steps("restart", size=4), unreached=unreached)
    assert not ok and unreached == [3]
    assert group.calls == ["rank 0 stop", "rank 1 stop", "rank 2 stop", "rank 2 start", "rank 1 start",
                           "rank 0 start"]


def test_the_preflight_names_the_rank_that_does_not_answer_and_stops_nothing():
    group = GroupStand(size=4, unreachable={3})
    problem = pl.preflight(group, pl.steps("restart", size=4))
    assert problem.startswith("rank 3 of the group does not answer over SSH at 10.78.0.4")
    assert problem.endswith("nothing was stopped") and group.calls == []


# --- the guard sees the group's ranks as one side, and names the one that is down --------------------------------


class AnsweringPair(pair_io.LivePair):
    """The real LivePair's judgement over the ranks, with each rank's forced command answered from a table."""

    answers: dict[int, str | None]

    def rank(self, number, verb):
        if verb not in pair_io.PEER_VERBS:
            raise ValueError(verb)
        answer = self.answers[number]
        if verb == "state" and answer is not None:  # `state` prints the bare ActiveState
            return worker_status(answer)[0]
        return answer


def _live(size, answers):
    pair = AnsweringPair(api=None, worker_addresses=["10.78.0.2"],
                         more_ranks=tuple(pair_io.Rank(rank, (f"10.78.0.{rank + 1}",)) for rank in range(2, size)))
    pair.answers = answers
    return pair


def since(state, active_for):
    """A forced command's `state-since` answer for a rank active `active_for` seconds (uptime 1000 s)."""
    entered = int((1000 - active_for) * 1_000_000)
    return f"ActiveState={state}\nActiveEnterTimestampMonotonic={entered}\nUptime=1000\n"


def test_a_group_reports_the_first_rank_that_is_not_active():
    pair = _live(4, {1: since("active", 50), 2: "ActiveState=failed\n", 3: "ActiveState=inactive\n"})
    name, state, _ = pair.peer_status()
    assert (name, state) == ("rank 2", "failed")
    assert pair.worker("state") == "failed"


def test_a_serving_group_reports_its_youngest_rank():
    pair = _live(4, {1: since("active", 300), 2: since("active", 40), 3: since("active", 200)})
    name, state, age = pair.peer_status()
    assert (name, state) == ("rank 2", "active") and age == pytest.approx(40, abs=1)


def test_an_unreachable_rank_makes_the_group_unknown():
    pair = _live(3, {1: since("active", 100), 2: None})
    assert pair.peer_status()[:2] == ("rank 2", None)
    assert pair.worker("state") is None


def test_a_group_never_starts_every_rank_through_worker():
    with pytest.raises(ValueError, match="one at a time"):
        _live(3, {}).worker("start")


def test_a_pair_is_not_changed_by_the_group_code():
    pair = _live(2, {1: since("active", 10)})
    assert pair.size == 2 and pair.peer_status()[0] == "worker"


def test_the_guard_names_the_rank_whose_unit_is_down():
    obs = Observation("active", "failed", worker_name="rank 3")
    verdict, reason = assess(obs, Policy())
    assert verdict is Verdict.BROKEN
    assert "rank 3's" in reason and "a group missing a rank never heals by itself" in reason
    unknown, why = assess(Observation("active", None, worker_name="rank 2"), Policy())
    assert unknown is Verdict.UNKNOWN and why.startswith("rank 2 cannot be reached over SSH")


def test_the_pairs_guard_words_are_unchanged():
    _, reason = assess(Observation("active", "failed", Generation.SKIPPED), Policy())
    assert reason.endswith("worker's twinspark-vllm.service is failed: a half pair never heals by itself")


# --- --rank on the command line --------------------------------------------------------------------------------


def test_rank_words_give_each_rank_its_addresses_in_order():
    ranks = pair_cli.group_ranks(["2:10.77.0.3", "3:10.77.0.4", "2:10.78.0.3"])
    assert ranks == (pair_io.Rank(2, ("10.77.0.3", "10.78.0.3")), pair_io.Rank(3, ("10.77.0.4",)))
    assert pair_cli.group_ranks(None) == ()


@pytest.mark.parametrize(("words", "said"), [
    (["1:10.77.0.2"], "RANK from 2 up (rank 1 is --worker)"),
    (["x:10.77.0.3"], "give RANK:ADDRESS"),
    (["2:"], "give RANK:ADDRESS"),
    (["2:10.77.0.3", "4:10.77.0.5"], "no address for rank 3"),
])
def test_bad_rank_words_are_refused_naming_the_fix(words, said):
    with pytest.raises(ValueError, match="--rank") as caught:
        pair_cli.group_ranks(words)
    assert said in str(caught.value)


def test_a_given_rank_option_replaces_every_recorded_one():
    recorded = ["--worker", "10.77.0.2", "--rank", "2:10.77.0.3", "--rank", "3:10.77.0.4"]
    assert pair_cli.merged_words(recorded, ["--rank", "2:10.78.0.3"]) == ["--worker", "10.77.0.2", "--rank",
                                                                          "2:10.78.0.3"]


def test_the_guard_knocks_on_every_ranks_fabric_address_and_names_the_one_that_does_not_answer(monkeypatch, tmp_path):
    knocked = []

    def knock(address, port, timeout_s):
        knocked.append(address)
        return f"{address}:{port} did not answer" if address == "10.77.0.4" else None

    monkeypatch.setattr(pair_io, "peer_problem", knock)
    pair = pair_io.LivePair(api=None, worker_addresses=["10.77.0.2", "10.78.0.2"], fabric_peer="10.77.0.2",
                            class_net=tmp_path, more_ranks=(pair_io.Rank(2, ("10.77.0.3", "10.78.0.3")),
                                                            pair_io.Rank(3, ("10.77.0.4", "10.78.0.4"))))
    assert pair.fabric() == f"10.77.0.4:{pair.fabric_port} did not answer"
    assert knocked == ["10.77.0.2", "10.77.0.3", "10.77.0.4"]
    knocked.clear()
    pair_only = pair_io.LivePair(api=None, worker_addresses=["10.77.0.2"], fabric_peer="10.77.0.2", class_net=tmp_path)
    assert pair_only.fabric() is None and knocked == ["10.77.0.2"]
