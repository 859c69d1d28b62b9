"""Keep the two vLLM ranks serving as one pair: notice a half pair and restart both ranks in order.

vLLM does not heal a TP=2 pair by itself (roles/vllm_service/README.md has the table of faults): a rank that
loses its peer exits with status 0 (so `Restart=on-failure` never fires), the headless worker outlives a dead head
forever, an idle head keeps answering /health after its worker died, and restarting one side alone hangs in the
rendezvous. So the head runs `twinspark pair guard` from `twinspark-pair-guard.timer`; each run looks at both
units (the worker's over SSH, through a key that may only ask for `state`, `stop` and `start`) and at a real
one-token generation, and when the pair is broken restarts both ranks in the one order that works: stop head, stop
worker, start worker, start head, then wait until the head serves again. Restarts are bounded: backoff between
attempts, and after `max_attempts` failed restarts in a row the guard gives up loudly (journal at error priority,
the state file, exit 1) until an operator restarts the pair (playbooks/restart.yml, or `twinspark pair reset`).

A pair can also stall: both units active, every process alive, no token coming out (a rank frozen, a collective
that never returns). A slow one-token probe alone cannot tell that from a busy pair, so the guard also reads vLLM's
own counters on the head's /metrics (requests running, tokens generated and prefilled) before and after the probe,
and keeps the latest sample in its state file so that successive runs compare: requests running and no token for
`stall_window_s` is a stall; a probe that times out while tokens still flow is a busy pair, never restarted; an
idle pair (nothing running) whose short probe times out with no progress on /metrics, or with /metrics not
answering, is broken once it has served since its start (a young pair's first generation compiles kernels).

The rules (`assess`, `decide`, `after_restart`, `track`, `probe_plan`) are pure functions over plain data;
systemctl, SSH and HTTP sit in `Pair`, which the rules never see.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from twinspark import api as head_api
from twinspark import atomic, layout, pairlife

UNIT = layout.current().unit_vllm
DEFAULT_ENV_FILES = ("/etc/twinspark/serve.env", "/etc/twinspark/secrets.env")
DEFAULT_STATE_FILE = "/var/lib/twinspark-pair-guard/state.json"
DEFAULT_SSH_KEY = "/etc/twinspark/pair-guard/id_ed25519"
DEFAULT_KNOWN_HOSTS = "/etc/twinspark/pair-guard/known_hosts"
LOCK_FILE = pairlife.DEFAULT_LOCK_FILE
LOCK_TIMEOUT_S = pairlife.DEFAULT_LOCK_TIMEOUT_S
PAUSE_FILE = pairlife.DEFAULT_PAUSE_FILE
RESTART_HINT = "ansible-playbook playbooks/restart.yml (or `twinspark pair reset` on the head once fixed)"

# systemd states in which a unit is on its way somewhere: judge it on a later run.
TRANSITIONAL = frozenset({"activating", "deactivating", "reloading", "refreshing"})
# What the worker's forced SSH command accepts (roles/vllm_service/templates/twinspark-peer-control.j2).
PEER_VERBS = ("state", "stop", "start")


# ---------------------------------------------------------------------------------------------------------------
# Rules (pure)
# ---------------------------------------------------------------------------------------------------------------


class Probe(StrEnum):
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


class Action(StrEnum):
    NONE = "none"  # healthy
    WAIT = "wait"  # look again next run
    RESTART = "restart"  # ordered pair restart now
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
    probe: Probe = Probe.SKIPPED
    probe_detail: str = ""
    head_active_for_s: float | None = None  # how long the head's unit has been active
    samples: tuple[Sample, ...] = ()  # /metrics before (and after a timed-out probe), oldest first


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
    """
    progress = previous
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


def assess(obs: Observation, policy: Policy, progress: Progress | None = None,
           is_warm: bool = False) -> tuple[Verdict, str]:
    """Judge the pair from one observation, the /metrics progress (`track`) and whether it served since its start.

    Without `progress` it is tracked from this run's samples alone."""
    if progress is None:
        progress = track(None, obs.samples, policy)
    if obs.worker_state is None:
        return Verdict.UNKNOWN, "the worker cannot be reached over SSH: its rank can be neither checked nor restarted"
    for rank, state in (("head", obs.head_state), ("worker", obs.worker_state)):
        if state in TRANSITIONAL:
            return Verdict.STARTING, f"the {rank}'s {UNIT} is {state}"
    down = [f"{rank}'s {UNIT} is {state}" for rank, state in (("head", obs.head_state),
                                                            ("worker", obs.worker_state)) if state != "active"]
    if down:
        return Verdict.BROKEN, " and ".join(down) + ": a half pair never heals by itself"
    if obs.probe is Probe.OK:
        return Verdict.HEALTHY, obs.probe_detail or "one-token generation answered"
    if obs.probe in (Probe.TIMEOUT, Probe.SKIPPED) and progress is not None:
        if stalled(progress, policy):
            return Verdict.BROKEN, (f"stalled: {_counters(progress)} and unchanged for {progress.flat_for():.0f} s "
                                    f"(window {policy.stall_window_s:.0f} s): no token is coming out")
        if progress.moved:
            waited = f"the one-token probe timed out ({obs.probe_detail}) but " if obs.probe is Probe.TIMEOUT else ""
            return Verdict.HEALTHY, f"busy: {waited}tokens are flowing ({_counters(progress)})"
    if obs.probe is Probe.NOT_READY:
        age = obs.head_active_for_s
        if age is None or age < policy.startup_grace_s:
            shown = "" if age is None else f" for {age:.0f} s"
            return Verdict.STARTING, f"both ranks active, the head{shown} not ready yet ({obs.probe_detail})"
        return Verdict.BROKEN, (f"the head has been active for {age:.0f} s and is still not ready "
                                f"({obs.probe_detail}): a rank is stuck in the rendezvous")
    if obs.probe is Probe.TIMEOUT:
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
    if obs.probe is Probe.ERROR:
        return Verdict.BROKEN, f"one-token generation failed ({obs.probe_detail})"
    return Verdict.STARTING, "both ranks active, not probed"


def decide(obs: Observation, state: GuardState, policy: Policy, now: float) -> Decision:
    """What to do about the pair, given what was seen and what the guard did before."""
    progress = track(state.progress, obs.samples, policy)
    if obs.probe is Probe.OK and progress is not None:
        # A token came back: whatever the gauges say, the engine works; a flat stretch starts again from here.
        progress = replace(progress, flat_since=None)
    verdict, reason = assess(obs, policy, progress, warm(state.served_at, obs.head_active_for_s, now))
    served = obs.probe is Probe.OK or bool(progress is not None and progress.moved)
    state = replace(state, progress=progress, served_at=now if served else state.served_at)
    if verdict is Verdict.HEALTHY:
        # Healthy clears every count, including a give-up: the pair was repaired by someone.
        return Decision(verdict, Action.NONE, reason,
                        replace(state, failures_in_row=0, timeout_strikes=0, gave_up_at=None, gave_up_reason=""))
    if state.gave_up_at is not None:
        return Decision(verdict, Action.GAVE_UP,
                        f"{reason}; gave up after {state.failures_in_row} failed restart(s): {state.gave_up_reason}; "
                        f"fix the cause, then {RESTART_HINT}", state)
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


# ---------------------------------------------------------------------------------------------------------------
# Settings the guard needs from the node's env files (pure)
# ---------------------------------------------------------------------------------------------------------------


# The head's API (its URL, key, TLS verification and the probes themselves) lives in twinspark.api; these names
# stay importable from here for the filters and tests that use them.
Api = head_api.Api
probe_host = head_api.probe_host
api_from_env = head_api.api_from_env


def classify_probe(results: Mapping[str, Mapping[str, object]], api: Api, timeout_s: float) -> tuple[Probe, str]:
    """The health tools' answers from the head's API (`gather_pair`) -> what the guard makes of them.

    Judged with the health checks themselves (twinspark.health.checks): the model not listed means not ready; a
    generation without an answer in time is a timeout (maybe only busy), and so is a /v1/models that accepted the
    connection but did not answer in time (a starting head refuses connections; one that hangs does not); any
    other failed generation is an error.
    """
    from twinspark.health import checks

    models = results.get("models") or {}
    listed = checks.check_models(models, api.served_name, api.max_model_len)
    if listed.status == checks.FAILED:
        if "within the timeout" in str(models.get("error") or ""):
            return Probe.TIMEOUT, listed.message
        return Probe.NOT_READY, listed.message
    generated = results.get("generate") or {}
    live = checks.check_liveness(generated, timeout_s)
    if live.status == checks.OK:
        return Probe.OK, live.message
    if "within the timeout" in str(generated.get("error") or ""):
        return Probe.TIMEOUT, live.message
    return Probe.ERROR, live.message


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
    return GuardState(attempts=attempts, failures_in_row=int(data.get("failures_in_row") or 0),
                      timeout_strikes=int(data.get("timeout_strikes") or 0),
                      gave_up_at=float(gave_up_at) if gave_up_at is not None else None,
                      gave_up_reason=str(data.get("gave_up_reason") or ""), last=dict(data.get("last") or {}),
                      progress=progress_from_json(data.get("progress")),
                      served_at=float(served_at) if served_at is not None else None)


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


def load_state(path: Path) -> GuardState:
    try:
        return state_from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return GuardState()
    except (ValueError, KeyError, TypeError) as exc:
        log(4, f"ignoring unreadable guard state {path} ({exc}); starting from a clean slate")
        return GuardState()


def peek_state(path: Path) -> GuardState:
    """The guard's state for a look that does not act (`pair check`): a clean slate when it cannot be read, e.g.
    by a user other than root, which only makes the look more patient (no earlier sample to compare with)."""
    try:
        return state_from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return GuardState()


def save_state(path: Path, state: GuardState) -> None:
    """Write atomically: a crash mid-write leaves the previous state."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(state_to_json(state), indent=1, sort_keys=True) + "\n"
    atomic.write_atomic(path, text.encode("utf-8"), mode=0o600)


# ---------------------------------------------------------------------------------------------------------------
# I/O: the two units and the API
# ---------------------------------------------------------------------------------------------------------------


def log(priority: int, message: str) -> None:
    """One line to stderr; under systemd the `<N>` prefix sets the journal priority (3 error, 4 warning, 6 info)."""
    prefix = f"<{priority}>" if os.environ.get("JOURNAL_STREAM") else ""
    print(f"{prefix}{message}", file=sys.stderr, flush=True)


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p A -p B` output (A=value lines) as a mapping."""
    props = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


def active_for_s(props: Mapping[str, str], now_monotonic: float) -> float | None:
    """Seconds since the unit entered `active`, from ActiveEnterTimestampMonotonic (microseconds, 0 = never)."""
    try:
        entered = int(props.get("ActiveEnterTimestampMonotonic") or 0)
    except ValueError:
        return None
    if entered <= 0 or props.get("ActiveState") != "active":
        return None
    return max(0.0, now_monotonic - entered / 1e6)


@dataclass
class Pair:
    """The real pair: the head's unit through systemctl, the worker's through its forced SSH command, the API."""

    api: Api
    worker_addresses: Sequence[str]
    ssh_user: str = "root"
    ssh_key: str = DEFAULT_SSH_KEY
    known_hosts: str = DEFAULT_KNOWN_HOSTS
    ssh_timeout_s: float = 10.0
    unit: str = UNIT

    # -- head (local) --
    def head_props(self) -> dict[str, str]:
        out = subprocess.run(["systemctl", "show", "-p", "ActiveState", "-p", "ActiveEnterTimestampMonotonic",
                              self.unit], capture_output=True, text=True, timeout=30, check=False)
        return parse_show(out.stdout)

    def head(self, verb: str) -> None:
        subprocess.run(["systemctl", verb, self.unit], check=True, timeout=120, capture_output=True, text=True)

    # -- worker (SSH, forced command) --
    def worker(self, verb: str) -> str | None:
        """Run `verb` through the worker's forced command; its stdout, or None when no address answers."""
        if verb not in PEER_VERBS:
            raise ValueError(f"peer verb {verb!r} is not one of {', '.join(PEER_VERBS)}")
        for address in self.worker_addresses:
            argv = ["ssh", "-i", self.ssh_key, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                    "-o", f"ConnectTimeout={int(self.ssh_timeout_s)}", "-o", "StrictHostKeyChecking=yes",
                    "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "LogLevel=ERROR",
                    f"{self.ssh_user}@{address}", verb]
            try:
                out = subprocess.run(argv, capture_output=True, text=True, check=False,
                                     timeout=self.ssh_timeout_s + 120)
            except subprocess.TimeoutExpired:
                log(4, f"worker {address}: `{verb}` timed out")
                continue
            if out.returncode == 255:  # ssh's own failure: try the next address
                log(4, f"worker {address} unreachable over SSH: {out.stderr.strip() or 'no answer'}")
                continue
            if out.returncode != 0:
                raise RuntimeError(f"worker {address}: `{verb}` failed (exit {out.returncode}): "
                                   f"{out.stderr.strip() or out.stdout.strip()}")
            return out.stdout.strip()
        return None

    # -- the API --
    def probe(self, timeout_s: float) -> tuple[Probe, str]:
        """Ask the head's API the health tools' questions (twinspark.health.gather) and classify the answers."""
        results = head_api.gather(self.api.url, self.api.served_name, self.api.api_key, timeout_s, ca=self.api.ca)
        return classify_probe(results, self.api, timeout_s)

    def sample(self, timeout_s: float) -> Sample:
        """One reading of the head's /metrics (no key needed: vLLM serves it outside /v1)."""
        return sample_from_metrics(head_api.read_metrics(self.api.url, timeout_s, ca=self.api.ca), time.time())

    def observe(self, probe_timeout_s: float, policy: Policy | None = None,
                state: GuardState | None = None) -> Observation:
        """Both units, then (both active) /metrics, the one-token probe with the timeout `probe_plan` gives, and
        /metrics again after a probe that timed out. Without a policy: the units and the probe only."""
        props = self.head_props()
        head_state = props.get("ActiveState") or "unknown"
        worker_state = self.worker("state")
        active_for = active_for_s(props, time.monotonic())
        probe, detail = Probe.SKIPPED, ""
        samples: list[Sample] = []
        if head_state == "active" and worker_state == "active":
            timeout: float | None = probe_timeout_s
            if policy is not None:
                state = state or GuardState()
                samples.append(self.sample(policy.metrics_timeout_s))
                is_warm = warm(state.served_at, active_for, time.time())
                timeout = probe_plan(samples[0], track(state.progress, samples, policy), is_warm, policy,
                                     probe_timeout_s)
            if timeout is not None:
                probe, detail = self.probe(timeout)
                if probe is Probe.TIMEOUT and policy is not None:
                    samples.append(self.sample(policy.metrics_timeout_s))
        return Observation(head_state, worker_state, probe, detail, active_for, tuple(samples))


# ---------------------------------------------------------------------------------------------------------------
# The ordered restart
# ---------------------------------------------------------------------------------------------------------------


def run_steps(pair: Pair, steps: Sequence[tuple[str, str]], what: str = "ordered pair restart") -> tuple[bool, str]:
    """Carry out `pairlife.steps` in order: the head through systemctl, the worker through its forced command.

    Returns (ok, what was done). Stops at the first worker step that cannot reach the worker."""
    done: list[str] = []
    for rank, verb in steps:
        log(5, f"{what}: {'stopping' if verb == 'stop' else 'starting'} the {rank}")
        if rank == pairlife.HEAD:
            pair.head(verb)
        elif pair.worker(verb) is None:
            return False, (f"the worker could not be reached to {verb} it"
                           + (f" ({', '.join(done)})" if done else ""))
        done.append(f"{rank} {verb.replace('stop', 'stopped').replace('start', 'started')}")
    return True, ", ".join(done) or "nothing to do"


def wait_serving(pair: Pair, ready_timeout_s: float, probe_timeout_s: float, poll_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 ) -> tuple[bool, str]:
    """Wait until the head answers a generation; gives up early when a rank's unit leaves `active`."""
    started = clock()
    deadline = started + ready_timeout_s
    next_note = started
    while True:
        head_state = pair.head_props().get("ActiveState", "unknown")
        worker_state = pair.worker("state")
        if head_state not in ("active", "activating") or worker_state not in ("active", "activating"):
            return False, (f"a rank left active while starting (head {head_state}, "
                           f"worker {worker_state or 'unreachable'}); see journalctl -u twinspark-vllm -n 120 on "
                           "both nodes")
        probe, detail = pair.probe(probe_timeout_s)
        waited = clock() - started
        if probe is Probe.OK:
            return True, f"serving again {waited:.0f} s after the head started ({detail})"
        if clock() >= deadline:
            return False, f"not serving {ready_timeout_s:.0f} s after the head started ({detail})"
        if clock() >= next_note:
            log(6, f"waiting for the pair: {waited:.0f} s of {ready_timeout_s:.0f} s ({detail})")
            next_note = clock() + 30
        sleep(poll_s)


def ordered_restart(pair: Pair, ready_timeout_s: float, probe_timeout_s: float, poll_s: float = 2.0,
                    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                    ) -> tuple[bool, str]:
    """Stop head, stop worker, start worker, start head, then wait until the head answers a generation.

    Returns (ok, what happened). Gives up early when a rank's unit leaves `active` while waiting.
    """
    ok, done = run_steps(pair, pairlife.RESTART_STEPS)
    if not ok:
        return False, done
    return wait_serving(pair, ready_timeout_s, probe_timeout_s, poll_s, clock, sleep)


# ---------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------


def _read_env(paths: Sequence[str]) -> dict[str, str]:
    from twinspark import envfile

    read = envfile.read_files(paths)
    if read.refused:  # missing, unreadable, not UTF-8, or not a small regular file (a FIFO, /dev/zero)
        raise ValueError("; ".join(read.refused) + " (the guard runs as root; render the files with site.yml)")
    return dict(read.values)


def _pair_from_args(args: argparse.Namespace) -> Pair:
    api = api_from_env(_read_env(args.env))
    return Pair(api=api, worker_addresses=args.worker, ssh_user=args.ssh_user, ssh_key=args.ssh_key,
                known_hosts=args.known_hosts)


def _policy_from_args(args: argparse.Namespace) -> Policy:
    return Policy(max_attempts=args.max_attempts, backoff_initial_s=args.backoff_initial,
                  backoff_max_s=args.backoff_max, startup_grace_s=args.startup_grace,
                  timeout_strikes=args.timeout_strikes, stall_window_s=args.stall_window,
                  short_probe_timeout_s=args.short_probe_timeout, metrics_timeout_s=args.metrics_timeout)


def _run_restart(pair: Pair, args: argparse.Namespace, state: GuardState, policy: Policy, reason: str,
                 ) -> tuple[GuardState, bool]:
    started_at = time.time()
    try:
        ok, outcome = ordered_restart(pair, args.ready_timeout, args.probe_timeout)
    except (subprocess.SubprocessError, RuntimeError) as exc:
        ok, outcome = False, f"restart step failed: {exc}"
    state = after_restart(state, started_at, ok, f"{reason} -> {outcome}", policy, finished_at=time.time())
    if ok:
        log(5, f"pair restarted: {outcome}")
    else:
        log(3, f"ordered pair restart failed ({state.failures_in_row} of {policy.max_attempts}): {outcome}")
    return state, ok


def cmd_guard(args: argparse.Namespace) -> int:
    # First of all, empty the kick socket: a datagram left in it would make systemd start the guard again at once.
    inbox = pairlife.KickInbox.inherited()
    trigger = pairlife.trigger_line(inbox.drain(), inbox.listening)
    log(6 if "woken" in trigger else 7, f"pair guard run: {trigger}")
    pause = pairlife.read_pause(args.pause_file)
    if pause is not None:
        log(6 if "woken" in trigger else 7, f"pair guard {pairlife.pause_line(pause, time.time())}; not looking "
            f"(`twinspark pair resume`, playbooks/start.yml or restart.yml end the pause)")
        return 0
    try:
        pair = _pair_from_args(args)
    except (ValueError, OSError) as exc:
        log(3, f"pair guard: {exc}")
        return 2
    policy = _policy_from_args(args)
    # The guard never waits for the lifecycle lock: whoever holds it is starting, stopping or restarting the pair,
    # and the pair it would see now is that operation's business. The next run (or kick) looks again.
    try:
        with pairlife.lifecycle_lock(args.lock_file, "the pair guard's run", 0):
            return _guard_run(args, pair, policy, inbox, trigger)
    except pairlife.LockBusy as exc:
        log(5, f"pair guard: not looking now, {exc.holder} holds the pair's lifecycle lock; the next run looks again")
        return 0
    except pairlife.LockError as exc:
        log(3, f"pair guard: {exc}")
        return 2


def settle(read: Callable[[], tuple[str, str | None]], timeout_s: float, poll_s: float = 0.5,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
           ) -> tuple[str, str | None, float]:
    """Wait, at most `timeout_s`, until neither rank's unit is `deactivating`; (head, worker, seconds waited).

    A kick arrives the moment a rank's main process is gone, while systemd still stops its leftover processes
    (`deactivating`). Judged then, a dying rank would read as a rank in transition and be left alone; judged once it
    settled (inactive or failed), it is the half pair it is."""
    started = clock()
    while True:
        head, worker = read()
        waited = clock() - started
        if "deactivating" not in (head, worker) or waited >= timeout_s:
            return head, worker, waited
        sleep(poll_s)


def _guard_run(args: argparse.Namespace, pair: Pair, policy: Policy, inbox: pairlife.KickInbox, trigger: str) -> int:
    """One guard run under the lifecycle lock: look, decide, act, remember."""
    state_path = Path(args.state_file)
    state = load_state(state_path)
    if "woken" in trigger and args.settle > 0:
        head, worker, waited = settle(lambda: (pair.head_props().get("ActiveState") or "unknown", pair.worker("state")),
                                      args.settle)
        if waited >= 0.5:
            log(6, f"waited {waited:.1f} s for a stopping rank to finish stopping (head {head}, "
                   f"worker {worker or 'unreachable'})")
    obs = pair.observe(args.probe_timeout, policy, state)
    now = time.time()
    decision = decide(obs, state, policy, now)
    state = replace(decision.state, last={"at": now, "verdict": decision.verdict.value,
                                          "action": decision.action.value, "reason": decision.reason})
    code = 0
    if decision.action is Action.NONE:
        log(7, f"pair healthy: {decision.reason}")
    elif decision.action is Action.WAIT:
        log(4 if decision.verdict in (Verdict.UNKNOWN, Verdict.SUSPECT) else 6, f"pair {decision.verdict.value}: "
            f"{decision.reason}")
    elif decision.action in (Action.GIVE_UP, Action.GAVE_UP):
        log(3, f"pair guard GAVE UP: {decision.reason}")
        code = 1
    else:
        log(4, f"pair broken ({trigger}), restarting both ranks in order: {decision.reason}")
        save_state(state_path, state)  # a crash mid-restart still counts the attempt's start
        state, ok = _run_restart(pair, args, state, policy, decision.reason)
        code = 0 if ok else 1
        # The restart's own stops kicked the socket (both ranks' ExecStop=/ExecStopPost=): those kicks are not news.
        own = inbox.drain()
        if own.count:
            log(7, f"dropped {own.count} kick(s) sent by this restart's own stops")
    if args.json:
        print(json.dumps({"observation": {**asdict(obs), "probe": obs.probe.value}, "verdict": decision.verdict.value,
                          "action": decision.action.value, "reason": decision.reason,
                          "failures_in_row": state.failures_in_row}, indent=1))
    save_state(state_path, state)
    return code


def cmd_check(args: argparse.Namespace) -> int:
    """One look at the pair, judged like the guard judges it, without acting: for waits in playbooks.

    Exit 0 serving, 1 broken (a rank is down, or not ready after the grace), 3 not yet (starting, worker
    unreachable, a generation timed out), 2 invalid input.
    """
    try:
        pair = _pair_from_args(args)
    except (ValueError, OSError) as exc:
        log(3, f"pair check: {exc}")
        return 2
    policy = _policy_from_args(args)
    state = peek_state(Path(args.state_file))
    obs = pair.observe(args.probe_timeout, policy, state)
    verdict, reason = assess(obs, policy, track(state.progress, obs.samples, policy),
                             warm(state.served_at, obs.head_active_for_s, time.time()))
    if args.json:
        print(json.dumps({"observation": {**asdict(obs), "probe": obs.probe.value}, "verdict": verdict.value,
                          "reason": reason}, indent=1))
    else:
        print(f"{verdict.value}: {reason}")
    if verdict is Verdict.HEALTHY:
        return 0
    return 1 if verdict is Verdict.BROKEN else 3


def cmd_restart(args: argparse.Namespace) -> int:
    """An operator's (or playbook's) ordered restart: always runs, and clears a give-up when it works."""
    try:
        pair = _pair_from_args(args)
    except (ValueError, OSError) as exc:
        log(3, f"pair restart: {exc}")
        return 2
    if args.no_wait:
        return _lifecycle(args, pair, "restart")
    policy = _policy_from_args(args)
    state_path = Path(args.state_file)
    try:
        with pairlife.lifecycle_lock(args.lock_file, "twinspark pair restart", args.lock_timeout):
            state, ok = _run_restart(pair, args, load_state(state_path), policy, "requested by an operator")
            if ok:
                state = replace(state, gave_up_at=None, gave_up_reason="", failures_in_row=0)
            save_state(state_path, state)
    except pairlife.LockBusy as exc:
        log(3, str(exc))
        return 1
    except pairlife.LockError as exc:
        log(3, str(exc))
        return 2
    return 0 if ok else 1


def _who() -> str:
    return os.environ.get("SUDO_USER") or os.environ.get("USER") or f"uid {os.getuid()}"


def stop_guard_run(timeout_s: float = 150.0) -> str:
    """End a guard run in progress (it may be in the middle of an ordered restart); '' or why it could not."""
    try:
        out = subprocess.run(["systemctl", "stop", pairlife.GUARD_SERVICE], capture_output=True, text=True,
                             timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemctl stop {pairlife.GUARD_SERVICE}: {exc}"
    if out.returncode not in (0, 5):  # 5: no such unit (the guard is not installed here)
        return f"systemctl stop {pairlife.GUARD_SERVICE}: exit {out.returncode}: {out.stderr.strip()}"
    return ""


def _pause(path: str, reason: str) -> int:
    try:
        pairlife.write_pause(path, reason, _who())
    except OSError as exc:
        log(3, f"pair pause: cannot write {path} ({exc.strerror or exc}); run as root on the head, after site.yml")
        return 2
    problem = stop_guard_run()
    if problem:
        log(4, f"pair pause: the marker is written, so no new guard run acts, but a run in progress may still: "
               f"{problem}")
        return 1
    log(5, f"pair guard {pairlife.pause_line(pairlife.Pause(reason, _who(), time.time()), time.time())}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    """Pause the guard: every run from now on (timer or kick) does nothing; a run in progress is stopped."""
    return _pause(args.pause_file, args.reason)


def cmd_resume(args: argparse.Namespace) -> int:
    """End a pause: the next run (timer or kick) looks at the pair again."""
    try:
        pause = pairlife.remove_pause(args.pause_file)
    except OSError as exc:
        log(3, f"pair resume: cannot remove {args.pause_file} ({exc.strerror or exc}); run as root on the head")
        return 2
    log(5, "pair guard resumed" + (f" (was {pairlife.pause_line(pause, time.time())})" if pause else
                                   " (it was not paused)"))
    return 0


def _lifecycle(args: argparse.Namespace, pair: Pair, verb: str) -> int:
    """`twinspark pair start|stop|restart --no-wait`: the ordered steps under the lifecycle lock."""
    what = f"twinspark pair {verb}"
    if verb == "stop":  # an operator's stop must stay stopped: the guard would otherwise restart the pair at once
        code = _pause(args.pause_file, args.reason or f"the pair was stopped ({what})")
        if code == 2:
            return code
    result: dict[str, object] = {"verb": verb, "ok": False}
    try:
        with pairlife.lifecycle_lock(args.lock_file, what, args.lock_timeout):
            if verb == "start":
                head_state = pair.head_props().get("ActiveState") or "unknown"
                worker_state = pair.worker("state")
                result.update(head_state=head_state, worker_state=worker_state)
                if worker_state is None:
                    raise RuntimeError("the worker cannot be reached over SSH: its rank can be neither checked nor "
                                       "started, and the head alone would hang in the rendezvous")
                plan = pairlife.steps(verb, head_state, worker_state)
            else:
                plan = pairlife.steps(verb)
            ok, done = run_steps(pair, plan, what)
            result.update(steps=[f"{rank} {step}" for rank, step in plan], done=done,
                          worker_reached=ok or "worker could not be reached" not in done)
            if ok and plan and verb != "stop" and not args.no_wait:
                ok, done = wait_serving(pair, args.ready_timeout, args.probe_timeout)
                result["serving"] = done
            result["ok"] = ok
    except pairlife.LockBusy as exc:
        result["error"] = str(exc)
    except pairlife.LockError as exc:
        log(3, str(exc))
        return 2
    except (subprocess.SubprocessError, RuntimeError) as exc:
        result["error"] = f"{what}: {exc}"
    if verb != "stop":
        pause = pairlife.read_pause(args.pause_file)
        if pause is not None:
            result["guard"] = pairlife.pause_line(pause, time.time())
            log(5, f"note: the pair guard is {result['guard']}; `twinspark pair resume` once it should watch again")
    if args.json:
        print(json.dumps(result, indent=1))
    if result.get("error"):
        log(3, str(result["error"]))
    elif not result["ok"]:
        log(3, f"{what}: {result.get('serving') or result.get('done')}")
    else:
        log(5, f"{what}: {result.get('serving') or result.get('done')}")
    return 0 if result["ok"] else 1


def _lifecycle_from_args(args: argparse.Namespace, verb: str) -> int:
    """The pair from the command line (exit 2 naming what is wrong), then `_lifecycle` with `verb`."""
    try:
        pair = _pair_from_args(args)
    except (ValueError, OSError) as exc:
        log(3, f"pair {verb}: {exc}")
        return 2
    return _lifecycle(args, pair, verb)


def cmd_start(args: argparse.Namespace) -> int:
    """Bring the pair to serving: nothing when both ranks are active, else the ordered restart, then wait."""
    return _lifecycle_from_args(args, "start")


def cmd_stop(args: argparse.Namespace) -> int:
    """Pause the guard, then stop the head and the worker (exit 1 naming the worker when it cannot be reached)."""
    return _lifecycle_from_args(args, "stop")


def cmd_kick(args: argparse.Namespace) -> int:
    """Send the kick token to each --to; exit 0 when every datagram left, 1 otherwise, 2 on a malformed --to."""
    try:
        targets = [pairlife.parse_target(text) for text in args.to]
    except ValueError as exc:
        log(3, f"pair kick: {exc}")
        return 2
    state = pairlife.system_state()
    if not pairlife.should_kick(state):
        log(6, f"pair kick: not sent, this node is shutting down (systemd: {state}); the guard's timer looks")
        return 0
    problems = pairlife.kick(targets)
    for problem in problems:
        log(4, f"pair kick: {problem}; the guard's timer still looks within its interval")
    return 1 if problems else 0


def cmd_reset(args: argparse.Namespace) -> int:
    """Forget failed attempts and a give-up, so the guard acts again on its next run."""
    save_state(Path(args.state_file), GuardState())
    log(5, f"pair guard state reset ({args.state_file})")
    return 0


def cmd_state(args: argparse.Namespace) -> int:
    state = load_state(Path(args.state_file))
    if args.json:
        print(json.dumps(state_to_json(state), indent=1, sort_keys=True))
    else:
        last = state.last
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(last["at"]))) if last.get("at") else "never"
        print(f"last run:        {when}: {last.get('verdict', '-')} -> {last.get('action', '-')}")
        print(f"reason:          {last.get('reason', '-')}")
        print(f"failed in a row: {state.failures_in_row}")
        print(f"gave up:         {state.gave_up_reason or 'no'}")
        pause = pairlife.read_pause(args.pause_file)
        print(f"guard:           {pairlife.pause_line(pause, time.time()) if pause else 'watching (not paused)'}")
        progress = state.progress
        if progress is not None:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(progress.at))
            flat = f", unchanged for {progress.flat_for():.0f} s" if progress.flat_since is not None else ""
            print(f"vLLM counters:   {stamp}: {_counters(progress)}{flat}")
        for attempt in state.attempts[-5:]:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(attempt.at))
            print(f"restart {stamp}  {'ok    ' if attempt.ok else 'FAILED'}  {attempt.reason}")
    return 1 if state.gave_up_at is not None else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("pair", help="keep the two ranks serving as one pair (runs on the head)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def common(sub: argparse.ArgumentParser, acts: bool) -> None:
        sub.add_argument("--state-file", default=DEFAULT_STATE_FILE, help="where the guard keeps its history")
        sub.add_argument("--pause-file", default=PAUSE_FILE, metavar="FILE",
                         help="the guard's pause marker (`twinspark pair pause`/`resume` write and remove it)")
        if not acts:
            return
        sub.add_argument("--env", action="append", default=None, metavar="FILE",
                         help="env file(s), later ones override earlier (default: serve.env then secrets.env)")
        sub.add_argument("--worker", action="append", required=True, metavar="ADDRESS",
                         help="the worker's address for SSH; repeat to try more (fabric first, then management)")
        sub.add_argument("--ssh-user", default="root")
        sub.add_argument("--ssh-key", default=DEFAULT_SSH_KEY)
        sub.add_argument("--known-hosts", default=DEFAULT_KNOWN_HOSTS)
        sub.add_argument("--ready-timeout", type=float, default=1800.0, metavar="S",
                         help="how long a restarted pair may take to serve (first-boot JIT is long)")
        sub.add_argument("--probe-timeout", type=float, default=120.0, metavar="S",
                         help="how long one one-token generation may take")
        sub.add_argument("--max-attempts", type=int, default=Policy.max_attempts)
        sub.add_argument("--backoff-initial", type=float, default=Policy.backoff_initial_s, metavar="S")
        sub.add_argument("--backoff-max", type=float, default=Policy.backoff_max_s, metavar="S")
        sub.add_argument("--startup-grace", type=float, default=None, metavar="S",
                         help="a head active this long but not ready counts as stuck (default: --ready-timeout)")
        sub.add_argument("--timeout-strikes", type=int, default=Policy.timeout_strikes,
                         help="timed-out probes in a row before a pair whose progress /metrics cannot show is broken")
        sub.add_argument("--stall-window", type=float, default=Policy.stall_window_s, metavar="S",
                         help="requests running and vLLM's token counters unchanged this long: stalled, restart")
        sub.add_argument("--short-probe-timeout", type=float, default=Policy.short_probe_timeout_s, metavar="S",
                         help="the one-token probe's timeout once /metrics shows vLLM's counters (judged by them)")
        sub.add_argument("--metrics-timeout", type=float, default=Policy.metrics_timeout_s, metavar="S",
                         help="how long one read of the head's /metrics may take")
        sub.add_argument("--json", action="store_true", help="print what was seen and decided as JSON")
        sub.add_argument("--lock-file", default=LOCK_FILE, metavar="FILE",
                         help="the pair's lifecycle lock, taken by every start, stop and restart (the guard never "
                              "waits for it)")
        sub.add_argument("--lock-timeout", type=float, default=LOCK_TIMEOUT_S, metavar="S",
                         help="how long a start, stop or restart waits for the lifecycle lock before giving up")

    guard = verbs.add_parser("guard", help="one guard run: look at both ranks, restart the pair in order if broken")
    common(guard, acts=True)
    guard.add_argument("--settle", type=float, default=30.0, metavar="S",
                       help="woken by a kick, wait at most this long for a rank that is still stopping to finish "
                            "(the rank's stop grace and a margin) before judging the pair")
    guard.set_defaults(func=_with_defaults(cmd_guard))
    check = verbs.add_parser("check", help="one look at the pair without acting (exit 0 serving, 1 broken, 3 not yet)")
    common(check, acts=True)
    check.set_defaults(func=_with_defaults(cmd_check))
    restart = verbs.add_parser("restart", help="ordered pair restart now (stop head, stop worker, start worker, "
                                               "start head, wait until serving)")
    common(restart, acts=True)
    restart.add_argument("--no-wait", action="store_true",
                         help="only the four ordered steps, no readiness wait and no guard history (for playbooks, "
                              "which wait with `pair check`)")
    restart.set_defaults(func=_with_defaults(cmd_restart))
    start = verbs.add_parser("start", help="bring the pair to serving: nothing if both ranks are active, else the "
                                           "ordered restart (worker starts first), then wait until serving")
    common(start, acts=True)
    start.add_argument("--no-wait", action="store_true", help="only the ordered steps, no readiness wait")
    start.set_defaults(func=_with_defaults(cmd_start))
    stop = verbs.add_parser("stop", help="pause the guard, then stop the head and the worker (head first)")
    common(stop, acts=True)
    stop.add_argument("--reason", default="", help="why, as the pause marker will say")
    stop.set_defaults(func=_with_defaults(cmd_stop))
    pause = verbs.add_parser("pause", help="pause the guard (every run does nothing) and end a run in progress")
    common(pause, acts=False)
    pause.add_argument("--reason", default="paused by an operator", help="why, as the guard's journal will say")
    pause.set_defaults(func=cmd_pause)
    resume = verbs.add_parser("resume", help="end a pause: the guard's next run looks at the pair again")
    common(resume, acts=False)
    resume.set_defaults(func=cmd_resume)
    kick = verbs.add_parser("kick", help="wake the head's pair guard now (a rank's ExecStop=): one datagram, "
                                         "no command")
    kick.add_argument("--to", action="append", required=True, metavar="ADDRESS:PORT",
                      help="the head's kick socket (twinspark-pair-guard-kick.socket); repeat for more")
    kick.set_defaults(func=cmd_kick)
    reset = verbs.add_parser("reset", help="forget failed restarts and a give-up")
    common(reset, acts=False)
    reset.set_defaults(func=cmd_reset)
    state = verbs.add_parser("state", help="what the guard last saw and did (exit 1 when it gave up)")
    common(state, acts=False)
    state.add_argument("--json", action="store_true")
    state.set_defaults(func=cmd_state)


def _with_defaults(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        if args.env is None:
            args.env = list(DEFAULT_ENV_FILES)
        if args.startup_grace is None:
            args.startup_grace = args.ready_timeout
        return func(args)

    return run
