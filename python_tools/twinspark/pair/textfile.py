"""The pair guard's node_exporter textfile: what its last run saw and decided, as metrics Prometheus reads.

node exporter's textfile collector (role monitoring) reads every *.prom file of the layout's metrics directory,
where the head's health sweep writes its verdict once a minute. The guard writes `guard.prom` beside it on every
run: after its decision, and also just before an ordered restart starts, so that a restart in progress reads as a
pair that does not serve (the alert rules, roles/monitoring/templates/twinspark.rules.yml.j2, page on it within
one scrape, where the sweep alone would miss an outage the guard heals in under a minute). A run that does not look
at the pair (paused, or the lifecycle lock held by a start, stop or restart) writes the same file without the
serving and fabric figures, which it did not see.

  twinspark_guard_restarts_total                  ordered restarts the guard started (`pair reset` zeroes it)
  twinspark_guard_attempts_left                   failed restarts left before the guard gives up (0 once it has)
  twinspark_guard_given_up                        1 while the guard has given up
  twinspark_guard_paused, _paused_seconds         1 while paused; how long the pause has lasted (0 when not)
  twinspark_guard_pause_info{by, reason}          1 while paused: who paused the guard and why (the marker is
                                                  root's; `twinspark health` reads them here)
  twinspark_guard_last_decision_timestamp_seconds when the guard last decided (a paused run decides nothing)
  twinspark_guard_decision{decision}              1 for this run's kind of decision (DECISIONS), 0 for the others
  twinspark_guard_fabric_up                       the guard's fabric look: 1 up (or a token came back), 0 down
  twinspark_guard_serving                         1 when the pair served (a token, or tokens flowing) on this run

`reading` and `decision_kind` are pure; `write` renders with prometheus_client and replaces the file atomically
(twinspark.atomic: a temporary file of its own and a rename, so a link planted in the directory, which the serving
account may write, is replaced, never followed).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from twinspark import atomic, layout
from twinspark.pair.rules import Action, Generation, GuardState, Observation, Policy, Verdict

FILE_NAME = "guard.prom"
# The pause's `by` and `reason` are label values: cut to this many characters.
MAX_LABEL = 200

# Every kind of decision a run can end in, each exported as its own series so a dashboard sees 0 as well as 1.
DECISIONS = ("ok", "starting", "wait_worker", "suspect", "wait_fabric", "backoff", "restart", "hold", "gave_up",
             "paused", "busy")
ACTION_KIND = {Action.NONE: "ok", Action.RESTART: "restart", Action.HOLD: "hold", Action.GIVE_UP: "gave_up",
               Action.GAVE_UP: "gave_up"}
# What a run that waits is waiting for: a start, the worker's SSH, a timed-out probe, the link, the restart backoff.
WAIT_KIND = {Verdict.STARTING: "starting", Verdict.UNKNOWN: "wait_worker", Verdict.SUSPECT: "suspect",
             Verdict.FABRIC_DOWN: "wait_fabric", Verdict.BROKEN: "backoff", Verdict.HEALTHY: "ok"}


def default_path() -> str:
    return os.path.join(layout.current().metrics_dir, FILE_NAME)


@dataclass(frozen=True)
class Reading:
    """One guard run as the textfile says it."""

    decision: str  # one of DECISIONS
    restarts: int
    attempts_left: int
    given_up: bool
    decided_at: float | None  # the last decision's unix time (None: the guard never decided)
    paused_for_s: float | None = None  # None: not paused
    serving: bool | None = None  # None: this run did not look at the pair
    fabric_up: bool | None = None
    paused_by: str = ""  # who paused the guard (the pause marker's `by`), while paused
    pause_reason: str = ""  # why, as the marker says


def decision_kind(verdict: Verdict, action: Action) -> str:
    return WAIT_KIND[verdict] if action is Action.WAIT else ACTION_KIND[action]


def served(obs: Observation, verdict: Verdict) -> bool:
    """Whether the pair served on this look: a token came back, or vLLM's counters moved (a busy pair)."""
    return obs.probe is Generation.OK or verdict is Verdict.HEALTHY


def reading(state: GuardState, policy: Policy, decision: str, serving: bool | None = None,
            fabric_up: bool | None = None, paused_for_s: float | None = None, paused_by: str = "",
            pause_reason: str = "") -> Reading:
    """The textfile's figures from the state the guard keeps, this run's decision and what it saw."""
    if decision not in DECISIONS:
        raise ValueError(f"unknown guard decision {decision!r} (known: {', '.join(DECISIONS)})")
    given_up = state.gave_up_at is not None
    at = state.last.get("at")
    return Reading(decision=decision, restarts=state.restarts,
                   attempts_left=0 if given_up else max(0, policy.max_attempts - state.failures_in_row),
                   given_up=given_up, decided_at=float(at) if isinstance(at, int | float) else None,
                   paused_for_s=paused_for_s, serving=serving, fabric_up=fabric_up,
                   paused_by=paused_by[:MAX_LABEL] if paused_for_s is not None else "",
                   pause_reason=pause_reason[:MAX_LABEL] if paused_for_s is not None else "")


def paused_seconds(since: float | None, marker: str, now: float) -> float:
    """How long a pause has lasted: from the marker's own `since`, else (a marker written by hand) its mtime."""
    if since is None:
        try:
            since = os.lstat(marker).st_mtime
        except OSError:
            return 0.0
    return max(0.0, now - since)


def exposition(value: Reading) -> bytes:
    """The textfile's text, in Prometheus' exposition format (prometheus_client renders it)."""
    # Measured: prometheus_client adds ~130 ms at import (-X importtime); only the textfile needs it.
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    def gauge(name: str, documentation: str, number: float) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"twinspark_guard_{name}", documentation, value=number)

    families = [
        CounterMetricFamily("twinspark_guard_restarts", "Ordered pair restarts the guard started",
                            value=value.restarts),
        gauge("attempts_left", "Failed ordered restarts left before the guard gives up", value.attempts_left),
        gauge("given_up", "1 while the guard has given up on the pair", int(value.given_up)),
        gauge("paused", "1 while the guard is paused", int(value.paused_for_s is not None)),
        gauge("paused_seconds", "How long the current pause has lasted (0 when not paused)", value.paused_for_s or 0.0),
    ]
    if value.paused_for_s is not None:
        info = GaugeMetricFamily("twinspark_guard_pause_info", "1 while paused: who paused the guard and why",
                                 labels=["by", "reason"])
        info.add_metric([value.paused_by or "?", value.pause_reason or "?"], 1)
        families.append(info)
    if value.decided_at is not None:
        families.append(gauge("last_decision_timestamp_seconds", "When the guard last decided (Unix time)",
                              value.decided_at))
    kinds = GaugeMetricFamily("twinspark_guard_decision", "1 for the kind of decision of the guard's last run",
                              labels=["decision"])
    for kind in DECISIONS:
        kinds.add_metric([kind], int(kind == value.decision))
    families.append(kinds)
    if value.fabric_up is not None:
        families.append(gauge("fabric_up", "The guard's look at the fabric: 1 up, 0 down", int(value.fabric_up)))
    if value.serving is not None:
        families.append(gauge("serving", "1 when the pair served on the guard's last look", int(value.serving)))

    registry = CollectorRegistry()
    registry.register(_Families(families))
    return generate_latest(registry)


class _Families:
    """A collector that hands prometheus_client metric families made beforehand."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


def write(path: str, value: Reading, say: Callable[[int, str], None]) -> bool:
    """Replace the textfile; False after one line saying why not. A missing directory (no monitoring on this node:
    the health timer's role makes it) is said at debug priority only; the guard's work never depends on the file."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        say(7, f"pair guard: no textfile written, {directory} does not exist")
        return False
    try:
        atomic.write_atomic(path, exposition(value), mode=0o644)
    except OSError as exc:
        say(4, f"pair guard: cannot write its textfile {path} ({exc.strerror or exc}); Prometheus keeps reading the "
               "previous one")
        return False
    return True
