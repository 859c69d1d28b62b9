"""Keep the two vLLM ranks serving as one pair: notice a half pair and restart both ranks in order.

vLLM does not heal a TP=2 pair by itself (roles/pair_guard/README.md has the table of faults): a rank that
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

The guard restarts only what a restart can fix. Before deciding on a pair that does not serve, it looks at the
fabric (this node's NCCL/gloo interfaces in sysfs, and a TCP connect to the peer's fabric address): while the link is
down it waits, counting nothing, and past `fabric_wait_s` says so loudly, still without restarting. A guard key ssh
refuses, a rank's executable that is not there, or a full disk under the state directory holds a restart back the
same way, naming the fix. And a head restarted alone (by systemd, with its firewall unit) next to the worker's old
rank is told from a starting pair by the ranks' ages: the worker's forced command reports how long its rank has been
active.

The rules (`assess`, `decide`, `after_restart`, `track`, `probe_plan`) are pure functions over plain data in
pair/rules.py; this module is one guard run around them (look, decide, act, remember) and its state file.
systemctl, SSH and HTTP sit in `LivePair` (pair/io.py), which the rules never see; the ordered steps, the lock and the
pause are pair/lifecycle.py's; the command line is pair/cli.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from twinspark import api as head_api
from twinspark import atomic, firewall, layout
from twinspark.fleet import drain
from twinspark.pair import lifecycle, textfile
from twinspark.pair.io import LivePair, guard_key_problem, log, router_of
from twinspark.pair.rules import (
    Action,
    Generation,
    GuardState,
    Policy,
    Verdict,
    after_restart,
    decide,
    disk_problem,
    exec_path,
    runtime_problem,
    state_from_json,
    state_to_json,
)


def default_state_file() -> str:
    """Where the guard keeps its history (the layout, read when first needed: importing this module reads no file)."""
    return layout.current().guard_state


# ---------------------------------------------------------------------------------------------------------------
# The state file (its JSON shape is rules.state_to_json / state_from_json)
# ---------------------------------------------------------------------------------------------------------------


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
# One guard run: look, decide, act, remember
# ---------------------------------------------------------------------------------------------------------------


def restart_blocker(pair: LivePair) -> str | None:
    """A cause no ordered restart can cure, found cheaply on the head, in one line with its fix; None when none.

    The guard's SSH key must be one ssh accepts (0600, owned by whoever runs ssh: ssh ignores any other), the
    head's rank unit must find the executable it runs, no other local account may hold the API port, and the state
    directory's filesystem must have room for the caches a start writes. A stand-in pair without a key or unit says
    nothing."""
    # a single Spark (a group of one) reaches no other rank, so it has no key to check
    problem = None if getattr(pair, "alone", False) else guard_key_problem(getattr(pair, "ssh_key", None))
    if problem:
        return problem
    show = getattr(pair, "exec_start", None)
    path = exec_path(show()) if show is not None else None
    problem = runtime_problem(path, path is None or os.path.exists(path))
    if problem or show is None:
        return problem
    # Another local account holds the API port (vLLM could not bind it): a restart would fail the same way.
    problem = head_api.key_withheld(pair.api.url, head_api.serving_uid()) if getattr(pair, "api", None) else None
    if problem:
        return problem
    state_dir = layout.current().state_dir
    return disk_problem(state_dir, free_bytes(state_dir))


def free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def run_restart(pair: LivePair, args: argparse.Namespace, state: GuardState, policy: Policy, reason: str,
                 by_operator: bool = False) -> tuple[GuardState, bool]:
    """One ordered restart, drained from the router when the pair has one. `by_operator`: a restart that clears
    a give-up when it works, so a pair that serves again goes back in even if the guard had given up on it."""
    problem = lifecycle.preflight(pair, lifecycle.steps("restart", size=getattr(pair, "size", 2)))
    if problem:
        # Nothing was touched, so nothing is counted: a restart cannot cure this, and the next run looks again.
        log(3, f"ordered pair restart not started: {problem}")
        return state, False
    if not by_operator:
        state = replace(state, restarts=state.restarts + 1)  # what the guard's textfile counts
    started_at = time.time()
    box: dict[str, object] = {}

    def work() -> drain.WorkResult:
        try:
            ok, outcome = lifecycle.ordered_restart(pair, args.ready_timeout, args.probe_timeout)
        except (subprocess.SubprocessError, RuntimeError) as exc:
            ok, outcome = False, f"restart step failed: {exc}"
        after = after_restart(state, started_at, ok, f"{reason} -> {outcome}", policy, finished_at=time.time())
        box.update(ok=ok, outcome=outcome, state=after)
        return drain.WorkResult(served=ok, gave_up=after.gave_up_at is not None and not by_operator)

    # The guard restarts a pair it judged broken: what runs on it will not finish, so it waits for nothing (one
    # reading of /metrics, for the log); an operator's restart of a serving pair lets its requests finish.
    idle_timeout = lifecycle.drain_timeout(args) if by_operator else 0.0
    drain.drained(router_of(pair), work, log, lambda: pair.metrics(), idle_timeout)
    ok, outcome, state = bool(box["ok"]), str(box["outcome"]), box["state"]  # type: ignore[assignment]
    if ok:
        log(5, f"pair restarted: {outcome}")
    else:
        log(3, f"ordered pair restart failed ({state.failures_in_row} of {policy.max_attempts}): {outcome}")
    return state, ok


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


def firewall_missing(say: Callable[[int, str], None], state_path: str | None = None) -> bool:
    """Say at error priority, on every run while it lasts, that the firewall watcher finds the table missing (its
    watcher reloads it; this is for the moment it cannot). Nothing is decided on it: vLLM itself is unaffected."""
    code, line = firewall.judge(firewall.read_state(Path(state_path or layout.current().firewall_state)), time.time())
    if code == 2:
        say(3, f"host firewall: {line}")
    return code == 2


def report(args: argparse.Namespace, state: GuardState, policy: Policy, decision: str, serving: bool | None = None,
           fabric_up: bool | None = None, paused_for_s: float | None = None,
           pause: lifecycle.Pause | None = None) -> None:
    """Write the guard's textfile (`--textfile`, pair/textfile.py) from the state it keeps and what this run saw."""
    if getattr(args, "textfile", None):
        textfile.write(args.textfile, textfile.reading(state, policy, decision, serving, fabric_up, paused_for_s,
                                                       pause.by if pause else "", pause.reason if pause else ""), log)


def run(args: argparse.Namespace, pair: LivePair, policy: Policy, inbox: lifecycle.KickInbox, trigger: str,
               woken: bool = False) -> int:
    """One guard run under the lifecycle lock: look, decide, act, remember. `woken`: a rank's kick started this run
    (then a stopping rank is given time to finish stopping before the pair is judged)."""
    state_path = Path(args.state_file)
    state = load_state(state_path)
    if woken and args.settle > 0:
        head, worker, waited = settle(lambda: (pair.head_props().get("ActiveState") or "unknown", pair.worker("state")),
                                      args.settle)
        if waited >= 0.5:
            size = getattr(pair, "size", 2)
            others = ("" if size == 1 else f", worker {worker or 'unreachable'}" if size == 2
                      else f", the other ranks {worker or 'unreachable'}")
            log(6, f"waited {waited:.1f} s for a stopping rank to finish stopping (head {head}{others})")
    firewall_missing(log)
    obs = pair.observe(args.probe_timeout, policy, state)
    if obs.probe is Generation.OK and hasattr(pair, "remember_served"):
        pair.remember_served(obs.head_invocation)
    if obs.probe is not Generation.OK:
        obs = replace(obs, cannot_restart=restart_blocker(pair))
    now = time.time()
    decision = decide(obs, state, policy, now)
    state = replace(decision.state, last={"at": now, "verdict": decision.verdict.value,
                                          "action": decision.action.value, "reason": decision.reason})
    kind = textfile.decision_kind(decision.verdict, decision.action)
    serving, fabric_up = textfile.served(obs, decision.verdict), obs.fabric_down is None
    code = 0
    if decision.action is Action.NONE:
        log(7, f"pair healthy: {decision.reason}")
        # A pair drained while it did not serve (a failed restart, a give-up the operator has since repaired) goes
        # back behind the router now that it serves; one read of the router's list otherwise.
        drain.keep_in(router_of(pair), log)
    elif decision.action is Action.WAIT:
        log(4 if decision.verdict in (Verdict.UNKNOWN, Verdict.SUSPECT, Verdict.FABRIC_DOWN) else 6,
            f"pair {decision.verdict.value}: {decision.reason}")
    elif decision.action is Action.HOLD:
        # A restart cannot cure it: say so at error priority on every run, and fail the run, until it is fixed.
        log(3, f"pair {decision.verdict.value}, NOT restarting: {decision.reason}")
        code = 1
    elif decision.action in (Action.GIVE_UP, Action.GAVE_UP):
        log(3, f"pair guard GAVE UP: {decision.reason}")
        # A router restarted since the pair left lists it again: take it out on every run while given up.
        drain.keep_out(router_of(pair), log)
        code = 1
    else:
        size = getattr(pair, "size", 2)
        ranks = {1: "restarting its one rank", 2: "restarting both ranks in order"}.get(
            size, f"restarting all {size} ranks in order")
        log(4, f"pair broken ({trigger}), {ranks}: {decision.reason}")
        save_state(state_path, state)  # a crash mid-restart still counts the attempt's start
        report(args, state, policy, kind, serving, fabric_up)  # Prometheus sees the pair down while this restart runs
        state, serving = run_restart(pair, args, state, policy, decision.reason)
        code = 0 if serving else 1
        # The restart's own stops kicked the socket (both ranks' ExecStop=/ExecStopPost=): those kicks are not news.
        own = inbox.drain()
        if own.count:
            log(7, f"dropped {own.count} kick(s) sent by this restart's own stops")
    if args.json:
        print(json.dumps({"observation": {**asdict(obs), "probe": obs.probe.value}, "verdict": decision.verdict.value,
                          "action": decision.action.value, "reason": decision.reason,
                          "failures_in_row": state.failures_in_row}, indent=1))
    save_state(state_path, state)
    report(args, state, policy, kind, serving, fabric_up)
    return code
