"""The pair guard's rules: what a look at the pair means and what to do about it, as pure functions over plain data.

`assess` judges one observation (both units, the one-token probe, vLLM's counters on /metrics, the fabric); `decide`
turns a verdict and the remembered state into an action (none, wait, restart, hold, give up) with backoff; it never
restarts for what a restart cannot cure (the fabric down, the guard's key unusable, the runtime missing);
`after_restart` records how a restart ended; `track` and `probe_plan` follow the counters between runs so that a
busy pair is told from a stalled one. No systemctl, SSH, HTTP or clock here (the one file read is the node's layout,
once per process, for the rank's unit name, when a line first names it; importing reads nothing): twinspark.pair does
the I/O and hands these functions what it saw (roles/pair_guard/README.md describes the faults they answer).
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum

from twinspark import api as head_api
from twinspark import layout, systemd
from twinspark.fabric import links
from twinspark.fabric.links import LinkState
from twinspark.health import checks

RESTART_HINT = "ansible-playbook playbooks/restart.yml (or `twinspark pair reset` on the head once fixed)"


def rank_unit() -> str:
    """The rank's unit on this node (layout.yml, overlaid by the node file), read when first needed."""
    return layout.current().unit_vllm


# What a group of one (a single Spark) calls the other ranks it does not have (pair.io.LivePair.alone).
NO_OTHER_RANK = "no other rank"


def rank_name(rank: int, size: int = 2) -> str:
    """What the lifecycle, the guard and their lines call rank `rank` of a group of `size`: a pair keeps its head and
    worker (the words its tools and logs have always used); a larger group says rank 0..N-1."""
    if size == 2:
        return ("head", "worker")[rank]
    return f"rank {rank}"


def the(name: str) -> str:
    """A rank's name as a line says it: "the head", "the worker", but "rank 2" (a number needs no article)."""
    return name if name.startswith("rank ") else f"the {name}"


# systemd states in which a unit is on its way somewhere: judge it on a later run.
TRANSITIONAL = frozenset({"activating", "deactivating", "reloading", "refreshing"})


# ---------------------------------------------------------------------------------------------------------------
# Rules (pure)
# ---------------------------------------------------------------------------------------------------------------


class Generation(StrEnum):
    """The result of asking the head's API for one generated token."""

    OK = "ok"  # /v1/models lists the served model and one token came back
    NOT_READY = "not_ready"  # the API does not answer yet, or does not list the served model
    TIMEOUT = "timeout"  # the generation did not finish in time: broken, or only busy
    ERROR = "error"  # the generation failed (HTTP 5xx, connection reset, no token)
    SKIPPED = "skipped"  # not asked, because a unit is already known to be down


class Verdict(StrEnum):
    HEALTHY = "healthy"
    STARTING = "starting"  # give it time
    UNKNOWN = "unknown"  # cannot see (or act on) the worker
    SUSPECT = "suspect"  # a generation timed out: maybe only busy, count strikes
    BROKEN = "broken"  # restart the pair
    FABRIC_DOWN = "fabric_down"  # the link between the nodes is down: a restart cannot fix it, wait for the link


class Action(StrEnum):
    NONE = "none"  # healthy
    WAIT = "wait"  # look again next run
    RESTART = "restart"  # ordered pair restart now
    HOLD = "hold"  # broken, but a restart cannot cure the cause (named in the reason): none is made, loudly
    GIVE_UP = "give_up"  # too many failed restarts: stop trying, loudly
    GAVE_UP = "gave_up"  # already given up; an operator must act


@dataclass(frozen=True)
class Sample:
    """One reading of the head's /metrics: vLLM's running requests and its token counters at a unix time."""

    at: float
    running: float | None = None  # vllm:num_requests_running
    tokens: float | None = None  # vllm:generation_tokens_total + vllm:prompt_tokens_total (None: not exported)
    kv: float | None = None  # vllm:kv_cache_usage_perc: moves while a long prompt is prefilled in chunks
    error: str = ""  # why the counters are missing
    unreachable: bool = False  # /metrics did not answer at all (refused, timed out, HTTP error)

    @property
    def counted(self) -> bool:
        return self.tokens is not None and self.running is not None


def sample_from_metrics(metrics: Mapping[str, object], at: float) -> Sample:
    """twinspark.api.read_metrics' answer -> a Sample."""

    def number(key: str) -> float | None:
        value = metrics.get(key)
        return float(value) if isinstance(value, int | float) else None

    generated, prefilled = number("generation_tokens"), number("prompt_tokens")
    tokens = None if generated is None else generated + (prefilled or 0.0)
    error = str(metrics.get("error") or "")
    if not error and tokens is None:
        error = "no vllm:generation_tokens_total in /metrics"
    return Sample(at=at, running=number("running"), tokens=tokens, kv=number("kv_cache_usage"), error=error,
                  unreachable=bool(metrics.get("unreachable")))


@dataclass(frozen=True)
class Progress:
    """What the counters say across samples (kept in the state file between runs)."""

    at: float  # when the latest counted sample was taken
    tokens: float
    kv: float | None
    running: float
    moved: bool | None  # the counters changed since the sample before (None: nothing to compare with)
    flat_since: float | None  # first sample of the current stretch with requests running and unchanged counters

    def flat_for(self) -> float:
        return 0.0 if self.flat_since is None else self.at - self.flat_since


@dataclass(frozen=True)
class Observation:
    """What one guard run saw."""

    head_state: str  # ActiveState of the head's twinspark-vllm.service
    worker_state: str | None  # the worker's, or None when the worker could not be reached over SSH
    probe: Generation = Generation.SKIPPED
    probe_detail: str = ""
    head_active_for_s: float | None = None  # how long the head's unit has been active
    samples: tuple[Sample, ...] = ()  # /metrics before (and after a timed-out probe), oldest first
    worker_active_for_s: float | None = None  # how long the worker's unit has been active (None: an older worker
    # whose forced command does not say, or not active)
    fabric_down: str | None = None  # why the link between the nodes is down, in one line; None: up, or not looked at
    cannot_restart: str | None = None  # a cause no restart can cure (the guard's key, the runtime, a full disk)
    head_invocation: str = ""  # systemd's InvocationID of the head's rank: which start of the unit this is
    head_alone_s: float | None = None  # `head_replaced_since_served`: the pair served this long ago with the
    # worker's current rank and an earlier head rank (None: not so, or not known)
    worker_name: str = "worker"  # whose state worker_state is: the pair's worker, or in a larger group the first
    # rank that is not active (else its youngest), e.g. "rank 2"


@dataclass(frozen=True)
class Policy:
    max_attempts: int = 5  # failed restarts in a row before giving up
    backoff_initial_s: float = 30.0  # wait after the first restart before another one
    backoff_max_s: float = 900.0
    flap_window_s: float = 3600.0  # restarts this recent count towards the backoff, even successful ones
    startup_grace_s: float = 1800.0  # a head this young that is not ready yet is still starting (JIT)
    timeout_strikes: int = 3  # timed-out generations in a row before a busy-looking pair counts as broken
    # (only where /metrics shows no vLLM counters, or before the pair served its first generation)
    stall_window_s: float = 30.0  # requests running and no token for this long: stalled
    short_probe_timeout_s: float = 15.0  # the probe's timeout once /metrics can judge progress
    sample_max_age_s: float = 300.0  # an older saved sample is not compared with (the guard was not running)
    metrics_timeout_s: float = 5.0  # how long one read of /metrics may take
    fabric_wait_s: float = 300.0  # the fabric down this long is reported loudly (still no restart: none fixes a link)
    # Once the fabric is back, this long for the ranks' TCP connections to resume before a pair whose ranks all run
    # but answer no generation counts as broken: a connection that lost its link retransmits with a backoff that
    # doubles up to 120 s (Linux's TCP_RTO_MAX), so after an outage of a minute the next retry can come a minute later.
    fabric_recovery_s: float = 150.0
    # An ordered start starts the head seconds after the worker (Type=exec returns once the launcher runs); a head
    # whose rank became active this much later than the worker's was started alone and cannot join that worker.
    pair_start_skew_s: float = 60.0

    def backoff_s(self, recent_attempts: int) -> float:
        """Seconds to wait after the latest restart, given how many restarts happened within the flap window."""
        if recent_attempts <= 0:
            return 0.0
        return min(self.backoff_initial_s * 2 ** (recent_attempts - 1), self.backoff_max_s)


@dataclass(frozen=True)
class Attempt:
    at: float  # unix time the restart began
    ok: bool
    reason: str  # why the pair was restarted, and how it ended


@dataclass(frozen=True)
class GuardState:
    """What the guard remembers between runs (the state file)."""

    attempts: tuple[Attempt, ...] = ()
    failures_in_row: int = 0
    timeout_strikes: int = 0
    gave_up_at: float | None = None
    gave_up_reason: str = ""
    last: Mapping[str, object] = field(default_factory=dict)  # the latest run: at, verdict, action, reason
    progress: Progress | None = None  # the latest /metrics counters, to compare with on the next run
    served_at: float | None = None  # when the pair last answered a probe or moved its counters
    fabric_down_since: float | None = None  # when the guard first saw the fabric down (None: up at the last look)
    fabric_back_at: float | None = None  # when the guard saw the fabric back after an outage (None: none since the
    # pair last served)
    restarts: int = 0  # ordered restarts the guard started, ever (its textfile's counter; `pair reset` zeroes it)

    def recent_attempts(self, now: float, window_s: float) -> tuple[Attempt, ...]:
        return tuple(a for a in self.attempts if now - a.at < window_s)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    action: Action
    reason: str
    state: GuardState  # the state to keep after this run (a restart's outcome is added by `after_restart`)


def track(previous: Progress | None, samples: Sequence[Sample], policy: Policy) -> Progress | None:
    """Fold this run's /metrics samples into the progress remembered from earlier runs.

    A sample without counters changes nothing. A saved sample older than `sample_max_age_s`, or counters that went
    down (vLLM restarted), start afresh. A stretch of unchanged counters counts as flat only from the first sample
    that saw requests running in it, so a request that arrived between two samples is never timed from before it.
    A run that took samples and counted none (/metrics did not answer) saw nothing move: the remembered progress
    comes back with `moved` unknown, so counters that moved before the API froze never read as tokens flowing now.
    """
    progress = previous
    if samples and progress is not None and not any(sample.counted for sample in samples):
        return replace(progress, moved=None)
    for sample in samples:
        if not sample.counted:
            continue
        assert sample.tokens is not None and sample.running is not None
        busy = sample.running > 0
        fresh = (progress is None or sample.at - progress.at > policy.sample_max_age_s
                 or sample.tokens < progress.tokens)
        if fresh:
            progress = Progress(sample.at, sample.tokens, sample.kv, sample.running, None,
                                sample.at if busy else None)
            continue
        assert progress is not None
        moved = sample.tokens != progress.tokens or sample.kv != progress.kv
        if moved or not busy:
            flat_since = None if not busy else sample.at
        else:
            flat_since = progress.flat_since if progress.flat_since is not None else sample.at
        progress = Progress(sample.at, sample.tokens, sample.kv, sample.running, moved, flat_since)
    return progress


def stalled(progress: Progress | None, policy: Policy) -> bool:
    """Requests running and vLLM's counters unchanged for at least the stall window."""
    return (progress is not None and progress.running > 0 and progress.flat_since is not None
            and progress.flat_for() >= policy.stall_window_s)


def warm(served_at: float | None, head_active_for_s: float | None, now: float) -> bool:
    """Whether the pair has served (a probe answered, or its counters moved) since the head's unit became active:
    before that, a slow first generation is the kernels compiling, not a stall."""
    return served_at is not None and head_active_for_s is not None and served_at >= now - head_active_for_s


def probe_plan(first: Sample | None, progress: Progress | None, is_warm: bool, policy: Policy,
               long_timeout_s: float) -> float | None:
    """How long the one-token probe may take after the first /metrics sample of a run; None: do not probe, the
    counters already show a stall. The counters judge progress, so the probe can be short where they are visible
    (and where /metrics does not answer on a pair that served before); elsewhere the long timeout and strikes."""
    if stalled(progress, policy):
        return None
    if first is not None and first.counted and (is_warm or (first.running or 0) > 0):
        return policy.short_probe_timeout_s
    if first is not None and first.unreachable and is_warm:
        return policy.short_probe_timeout_s
    return long_timeout_s


def _counters(progress: Progress) -> str:
    return f"{progress.running:.0f} request(s) running, token counter at {progress.tokens:.0f}"


def head_started_late_s(obs: Observation, policy: Policy) -> float | None:
    """How much later than the worker's rank the head's rank became active, when that is more than an ordered start
    explains (`pair_start_skew_s`); None otherwise, or when a worker does not say how long its rank has run.

    The old worker rank already met (or waited out) an earlier head; it never meets a head started after it."""
    if obs.worker_active_for_s is None or obs.head_active_for_s is None:
        return None
    late = obs.worker_active_for_s - obs.head_active_for_s
    return late if late > policy.pair_start_skew_s else None


@dataclass(frozen=True)
class Served:
    """The head's rank the pair last served with (its unit's InvocationID) and when: written by every ordered
    start or restart once the pair answers, and by a guard run whose probe answered."""

    head_invocation: str
    at: float  # unix time


def head_replaced_since_served(served: Served | None, head_invocation: str, worker_active_for_s: float | None,
                               now: float) -> float | None:
    """Seconds since the pair last served, when it served with the worker's current rank and a head rank other than
    the one running now; None otherwise (no record, the same head rank, a worker rank started since, or a worker
    that does not say its age).

    That head rank was started alone after the pair served (systemd restarted it with its firewall unit, an admin
    ran `systemctl restart`): the worker's rank already met the earlier head and never meets this one. Unlike the
    ranks' ages (`head_started_late_s`), this holds however soon after an ordered start the head was restarted."""
    if served is None or not head_invocation or not served.head_invocation or worker_active_for_s is None:
        return None
    if served.head_invocation == head_invocation or now - worker_active_for_s > served.at:
        return None
    return max(0.0, now - served.at)


def served_to_json(served: Served) -> dict[str, object]:
    return asdict(served)


def served_from_json(data: Mapping[str, object]) -> Served:
    invocation, at = data["head_invocation"], data["at"]
    if not isinstance(invocation, str) or not isinstance(at, int | float):
        raise ValueError("head_invocation must be a string and at a number")
    return Served(invocation, float(at))


def assess(obs: Observation, policy: Policy, progress: Progress | None = None,
           is_warm: bool = False) -> tuple[Verdict, str]:
    """Judge the pair from one observation, the /metrics progress (`track`) and whether it served since its start.

    Without `progress` it is tracked from this run's samples alone."""
    if progress is None:
        progress = track(None, obs.samples, policy)
    if obs.fabric_down and obs.probe is not Generation.OK:
        return Verdict.FABRIC_DOWN, f"the fabric is down: {obs.fabric_down}"
    worker = obs.worker_name
    if obs.worker_state is None:
        return Verdict.UNKNOWN, (f"{the(worker)} cannot be reached over SSH: its rank can be neither checked nor "
                                 "restarted")
    for rank, state in (("head", obs.head_state), (worker, obs.worker_state)):
        if state in TRANSITIONAL:
            return Verdict.STARTING, f"{the(rank)}'s {rank_unit()} is {state}"
    down = [f"{rank}'s {rank_unit()} is {state}" for rank, state in (("head", obs.head_state),
                                                            (worker, obs.worker_state)) if state != "active"]
    if down:
        whole = ("a half pair" if worker == "worker" else "a single Spark's rank" if worker == NO_OTHER_RANK
                 else "a group missing a rank")
        return Verdict.BROKEN, " and ".join(down) + f": {whole} never heals by itself"
    if obs.probe is Generation.OK:
        return Verdict.HEALTHY, obs.probe_detail or "one-token generation answered"
    if obs.head_alone_s is not None:
        return Verdict.BROKEN, (f"the head's rank was started after the pair last served ({obs.head_alone_s:.0f} s "
                                f"ago) while {the(worker)}'s rank kept running, and it does not serve "
                                f"({obs.probe_detail or obs.probe.value}): they cannot pair (the head was restarted "
                                "alone, e.g. by systemd with its firewall unit); ordered restart")
    late = head_started_late_s(obs, policy)
    if late is not None:
        return Verdict.BROKEN, (f"the head's rank started {late:.0f} s after {the(worker)}'s rank and does not serve "
                                f"({obs.probe_detail or obs.probe.value}): they cannot pair (the head was restarted "
                                "alone, e.g. by systemd with its firewall unit); ordered restart")
    if obs.probe in (Generation.TIMEOUT, Generation.SKIPPED) and progress is not None:
        if stalled(progress, policy):
            return Verdict.BROKEN, (f"stalled: {_counters(progress)} and unchanged for {progress.flat_for():.0f} s "
                                    f"(window {policy.stall_window_s:.0f} s): no token is coming out")
        if progress.moved:
            timed_out = obs.probe is Generation.TIMEOUT
            waited = f"the one-token probe timed out ({obs.probe_detail}) but " if timed_out else ""
            return Verdict.HEALTHY, f"busy: {waited}tokens are flowing ({_counters(progress)})"
    if obs.probe is Generation.NOT_READY:
        age = obs.head_active_for_s
        if age is None or age < policy.startup_grace_s:
            shown = "" if age is None else f" for {age:.0f} s"
            return Verdict.STARTING, f"both ranks active, the head{shown} not ready yet ({obs.probe_detail})"
        return Verdict.BROKEN, (f"the head has been active for {age:.0f} s and is still not ready "
                                f"({obs.probe_detail}): a rank is stuck in the rendezvous")
    if obs.probe is Generation.TIMEOUT:
        latest = obs.samples[-1] if obs.samples else None
        if is_warm and latest is not None and latest.unreachable:
            return Verdict.BROKEN, (f"one-token generation timed out ({obs.probe_detail}) and /metrics does not "
                                    f"answer either ({latest.error}): the API process hangs")
        if (is_warm and progress is not None and progress.running == 0 and progress.moved is False
                and latest is not None and latest.counted):
            return Verdict.BROKEN, (f"one-token generation timed out ({obs.probe_detail}) on an idle pair and "
                                    f"/metrics shows no progress ({_counters(progress)}): a rank is frozen")
        if progress is not None and progress.running > 0:
            return Verdict.SUSPECT, (f"one-token generation timed out ({obs.probe_detail}); {_counters(progress)}, "
                                     f"unchanged for {progress.flat_for():.0f} s of the {policy.stall_window_s:.0f} s "
                                     "stall window")
        return Verdict.SUSPECT, f"one-token generation timed out ({obs.probe_detail})"
    if obs.probe is Generation.ERROR:
        return Verdict.BROKEN, f"one-token generation failed ({obs.probe_detail})"
    return Verdict.STARTING, "both ranks active, not probed"


def decide(obs: Observation, state: GuardState, policy: Policy, now: float) -> Decision:
    """What to do about the pair, given what was seen and what the guard did before."""
    progress = track(state.progress, obs.samples, policy)
    if obs.probe is Generation.OK and progress is not None:
        # A token came back: whatever the gauges say, the engine works; a flat stretch starts again from here.
        progress = replace(progress, flat_since=None)
    verdict, reason = assess(obs, policy, progress, warm(state.served_at, obs.head_active_for_s, now))
    served = obs.probe is Generation.OK or bool(progress is not None and progress.moved)
    state = replace(state, progress=progress, served_at=now if served else state.served_at)
    fabric_waited = 0.0
    if verdict is Verdict.FABRIC_DOWN:
        since = now if state.fabric_down_since is None else state.fabric_down_since
        state, fabric_waited = replace(state, fabric_down_since=since), max(0.0, now - since)
    elif state.fabric_down_since is not None:
        reason = f"{reason} (the fabric is back after {now - state.fabric_down_since:.0f} s down)"
        state = replace(state, fabric_down_since=None, fabric_back_at=now)
    if verdict is Verdict.HEALTHY:
        # Healthy clears every count, including a give-up: the pair was repaired by someone.
        return Decision(verdict, Action.NONE, reason,
                        replace(state, failures_in_row=0, timeout_strikes=0, gave_up_at=None, gave_up_reason="",
                                fabric_back_at=None))
    recovering = state.fabric_back_at is not None and now - state.fabric_back_at < policy.fabric_recovery_s
    if (recovering and verdict in (Verdict.BROKEN, Verdict.SUSPECT) and state.gave_up_at is None
            and (obs.head_state, obs.worker_state) == ("active", "active") and obs.probe is not Generation.OK):
        # Every rank runs and the link is back: their connections resume at their next retransmission. A restart
        # now would cost the whole start-up; a rank that died is judged at once (its unit is not active).
        assert state.fabric_back_at is not None
        return Decision(verdict, Action.WAIT,
                        f"{reason}; the fabric came back {now - state.fabric_back_at:.0f} s ago: giving the ranks' "
                        f"connections up to {policy.fabric_recovery_s:.0f} s to resume before restarting", state)
    if state.gave_up_at is not None:
        return Decision(verdict, Action.GAVE_UP,
                        f"{reason}; gave up after {state.failures_in_row} failed restart(s): {state.gave_up_reason}; "
                        f"fix the cause, then {RESTART_HINT}", state)
    if verdict is Verdict.FABRIC_DOWN:
        # No restart and nothing counted, however long: a restart cannot bring a link back. Once the link is back the
        # usual rules judge the pair, so an outage ends in at most one restart, after it, and only if the pair does
        # not serve by then.
        if fabric_waited < policy.fabric_wait_s:
            return Decision(verdict, Action.WAIT,
                            f"{reason}; waiting for the link ({fabric_waited:.0f} s of {policy.fabric_wait_s:.0f} s): "
                            "a restart cannot fix a link", state)
        return Decision(verdict, Action.HOLD,
                        f"{reason}; gave the fabric {fabric_waited:.0f} s (bound {policy.fabric_wait_s:.0f} s) and it "
                        "is still down: no restart, a restart cannot fix a link; check the cable, both ports (ip link "
                        "on both nodes) and the worker's power; once the link is back the guard restarts the pair "
                        "only if it does not serve", state)
    if verdict is Verdict.UNKNOWN and obs.cannot_restart:
        # e.g. ssh refuses the guard's key, so the worker looks unreachable: the key is what needs an operator.
        return Decision(verdict, Action.HOLD, f"{reason}; {obs.cannot_restart}", state)
    if verdict in (Verdict.STARTING, Verdict.UNKNOWN):
        return Decision(verdict, Action.WAIT, reason, state)
    if verdict is Verdict.SUSPECT and progress is not None and progress.running > 0:
        # The counters are visible and requests are running: the stall window decides, not strikes.
        return Decision(verdict, Action.WAIT, reason, state)
    if verdict is Verdict.SUSPECT:
        strikes = state.timeout_strikes + 1
        state = replace(state, timeout_strikes=strikes)
        if strikes < policy.timeout_strikes:
            return Decision(verdict, Action.WAIT,
                            f"{reason}; strike {strikes} of {policy.timeout_strikes} (a busy pair answers late)", state)
        reason = f"{reason}; {strikes} timed-out generations in a row"
    if obs.cannot_restart:
        # Nothing is counted: the ordered restart could not run, or could not help, until this is fixed.
        return Decision(verdict, Action.HOLD, f"{reason}; not restarting: {obs.cannot_restart}", state)
    if state.failures_in_row >= policy.max_attempts:
        gave_up = replace(state, gave_up_at=now,
                          gave_up_reason=f"{state.failures_in_row} ordered restarts in a row did not bring the "
                                         f"pair back; last: {reason}")
        return Decision(verdict, Action.GIVE_UP, gave_up.gave_up_reason + f"; fix the cause, then {RESTART_HINT}",
                        gave_up)
    recent = state.recent_attempts(now, policy.flap_window_s)
    if recent:
        wait_s = policy.backoff_s(len(recent))
        due = recent[-1].at + wait_s
        if now < due:
            return Decision(verdict, Action.WAIT,
                            f"{reason}; backing off: {len(recent)} restart(s) in the last "
                            f"{policy.flap_window_s:.0f} s, next attempt in {due - now:.0f} s", state)
    return Decision(verdict, Action.RESTART, reason, state)


def after_restart(state: GuardState, started_at: float, ok: bool, reason: str, policy: Policy,
                  finished_at: float | None = None) -> GuardState:
    """The state after an ordered restart that began at `started_at` and succeeded (`ok`: served a generation at
    `finished_at`) or not."""
    attempts = (*state.recent_attempts(started_at, policy.flap_window_s), Attempt(started_at, ok, reason))
    # vLLM's counters start from zero in the new processes: compare only with samples taken after the restart.
    if ok:
        return replace(state, attempts=attempts, failures_in_row=0, timeout_strikes=0, progress=None,
                       served_at=finished_at)
    return replace(state, attempts=attempts, failures_in_row=state.failures_in_row + 1, timeout_strikes=0,
                   progress=None, served_at=None)


# The head's API as the guard judges it (the client itself is twinspark.api).
Api = head_api.Api


def classify_probe(results: Mapping[str, Mapping[str, object]], api: Api, timeout_s: float) -> tuple[Generation, str]:
    """The health tools' answers from the head's API (`gather_pair`) -> what the guard makes of them.

    Judged with the health checks themselves (twinspark.health.checks): the model not listed means not ready; a
    generation without an answer in time is a timeout (maybe only busy), and so is a /v1/models that accepted the
    connection but did not answer in time (a starting head refuses connections; one that hangs does not); any
    other failed generation is an error.
    """
    models = results.get("models") or {}
    listed = checks.check_models(models, api.served_name, api.max_model_len)
    if listed.status == checks.FAILED:
        if "within the timeout" in str(models.get("error") or ""):
            return Generation.TIMEOUT, listed.message
        return Generation.NOT_READY, listed.message
    generated = results.get("generate") or {}
    live = checks.check_liveness(generated, timeout_s)
    if live.status == checks.OK:
        return Generation.OK, live.message
    if "within the timeout" in str(generated.get("error") or ""):
        return Generation.TIMEOUT, live.message
    return Generation.ERROR, live.message


# ---------------------------------------------------------------------------------------------------------------
# The state file
# ---------------------------------------------------------------------------------------------------------------


def state_to_json(state: GuardState) -> dict[str, object]:
    data = asdict(state)
    data["last"] = dict(state.last)
    return data


def state_from_json(data: Mapping[str, object]) -> GuardState:
    attempts = tuple(Attempt(float(a["at"]), bool(a["ok"]), str(a.get("reason", "")))
                     for a in data.get("attempts") or [])
    gave_up_at = data.get("gave_up_at")
    served_at = data.get("served_at")
    fabric_down_since = data.get("fabric_down_since")
    fabric_back_at = data.get("fabric_back_at")
    return GuardState(attempts=attempts, failures_in_row=int(data.get("failures_in_row") or 0),
                      timeout_strikes=int(data.get("timeout_strikes") or 0),
                      gave_up_at=float(gave_up_at) if gave_up_at is not None else None,
                      gave_up_reason=str(data.get("gave_up_reason") or ""), last=dict(data.get("last") or {}),
                      progress=progress_from_json(data.get("progress")),
                      served_at=float(served_at) if served_at is not None else None,
                      fabric_down_since=float(fabric_down_since) if fabric_down_since is not None else None,
                      fabric_back_at=float(fabric_back_at) if fabric_back_at is not None else None,
                      restarts=int(data.get("restarts") or 0))


def progress_from_json(data: object) -> Progress | None:
    """The saved /metrics progress; None (compare afresh) when absent, as written by an older guard."""
    if not isinstance(data, Mapping):
        return None

    def optional(key: str) -> float | None:
        value = data.get(key)
        return None if value is None else float(value)

    moved = data.get("moved")
    return Progress(at=float(data["at"]), tokens=float(data["tokens"]), kv=optional("kv"),
                    running=float(data["running"]), moved=None if moved is None else bool(moved),
                    flat_since=optional("flat_since"))



def active_for_s(props: Mapping[str, str], now_monotonic: float) -> float | None:
    """Seconds since the unit entered `active`, from ActiveEnterTimestampMonotonic (microseconds, 0 = never)."""
    try:
        entered = int(props.get("ActiveEnterTimestampMonotonic") or 0)
    except ValueError:
        return None
    if entered <= 0 or props.get("ActiveState") != "active":
        return None
    return max(0.0, now_monotonic - entered / 1e6)


# ---------------------------------------------------------------------------------------------------------------
# What a restart cannot cure (pure): the fabric, the worker's rank's age, the unit's executable
# ---------------------------------------------------------------------------------------------------------------

# Where the guard knocks on the worker's fabric address: its sshd (the guard's own SSH goes there first, and the
# firewall accepts the SSH ports before any TwinSpark rule). A refusal counts as an answer: the host is there.
FABRIC_PROBE_PORT = 22


def fabric_ifnames(env: Mapping[str, str]) -> list[str]:
    """This node's fabric interfaces: the ones NCCL and gloo use (NCCL_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME); none
    on a group of one (NNODES=1), which has no fabric."""
    if links.no_fabric(env):
        return []
    return links.fabric_ifnames(env)


def fabric_peer(env: Mapping[str, str]) -> str | None:
    """The other node's fabric address: the worker's (WORKER_HOST) on the head, the head's (MASTER_ADDR) on the
    worker; None when the env file does not say, or on a group of one (NNODES=1: no other node)."""
    if links.no_fabric(env):
        return None
    key = "WORKER_HOST" if env.get("NODE_RANK", "0") == "0" else "MASTER_ADDR"
    return env.get(key) or None


def link_problem(link: LinkState) -> str | None:
    """Why one fabric interface cannot carry the pair, in words; None when it is up with a carrier."""
    if not link.exists:
        return f"{link.name} does not exist on this node"
    if link.up:
        return None
    if "UP" not in link.flags:
        why = "administratively down"
    elif "NO-CARRIER" in link.flags:
        why = "no carrier"
    else:
        why = "not up"
    return f"{link.name} is down ({why}, operstate {link.operstate.lower()})"


def connect_problem(address: str, port: int, error: OSError | None, timeout_s: float) -> str | None:
    """A TCP connect to the peer's fabric address -> why the peer is not reachable; None when it answered (connected,
    or refused: a refusal comes from the host itself) or when the error says nothing about the path (then a restart
    is not held back on a guess)."""
    where = f"the peer's fabric address {address} (TCP {port})"
    if error is None or isinstance(error, ConnectionRefusedError):
        return None
    if isinstance(error, TimeoutError):
        return f"{where} does not answer within {timeout_s:g} s (the link, or the peer is off)"
    if error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN):
        return f"{where} is unreachable ({error.strerror or error})"
    return None


def fabric_problem(links: Sequence[LinkState], peer_problem: str | None) -> str | None:
    """This node's fabric interfaces and the peer's answer -> one line saying why the fabric is down; None: up."""
    said = [problem for problem in map(link_problem, links) if problem]
    if peer_problem:
        said.append(peer_problem)
    return "; ".join(said) or None


def worker_status(text: str) -> tuple[str, float | None]:
    """The worker's forced command's `state-since` answer -> (ActiveState, seconds its rank has been active).

    It prints `systemctl show`'s ActiveState and ActiveEnterTimestampMonotonic and the node's Uptime (seconds since
    boot; the same clock as the monotonic timestamp on a node that does not suspend). A bare state (what `state`
    prints, and all an older worker says) comes back with no age."""
    if "=" not in text:
        return (text.strip() or "unknown"), None
    props = systemd.parse_show(text)
    try:
        uptime = float(props.get("Uptime", ""))
    except ValueError:
        uptime = None
    state = props.get("ActiveState") or "unknown"
    return state, None if uptime is None else active_for_s(props, uptime)


def exec_path(exec_start: str) -> str | None:
    """`systemctl show -P ExecStart` ('{ path=/opt/x/bin/python ; argv[]=... }') -> the executable; None if absent."""
    for field_text in exec_start.strip().strip("{}").split(";"):
        key, sep, value = field_text.strip().partition("=")
        if sep and key == "path" and value.strip():
            return value.strip()
    return None


def runtime_problem(path: str | None, present: bool) -> str | None:
    """The rank's executable (its unit's ExecStart) and whether it is there -> why no restart can start the rank."""
    if path is None or present:
        return None
    return (f"the runtime is missing: {path}, which {rank_unit()} runs, is not there; ansible-playbook site.yml "
            "installs it (role vllm_runtime)")


# Below this much free space under the state directory (models, HF_HOME, the JIT and compile caches) a rank cannot
# write what it needs to start: the figure below which the health sweep calls that filesystem failed.
DISK_FULL_BYTES = checks.DISK_FAILED_BYTES


def disk_problem(path: str, free_bytes: int | None) -> str | None:
    """Free bytes on the filesystem of `path` (None: could not look) -> why no restart can start the ranks."""
    if free_bytes is None or free_bytes >= DISK_FULL_BYTES:
        return None
    return (f"the disk under {path} is full ({free_bytes / 2**30:.1f} GiB free, a start needs at least "
            f"{DISK_FULL_BYTES / 2**30:.0f} GiB for its caches): free space there (old JIT caches, logs, unused "
            "model revisions); a restart cannot fix it")
