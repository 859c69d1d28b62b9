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

The guard restarts only what a restart can fix. Before deciding on a pair that does not serve, it looks at the
fabric (this node's NCCL/gloo interfaces in sysfs, and a TCP connect to the peer's fabric address): while the link is
down it waits, counting nothing, and past `fabric_wait_s` says so loudly, still without restarting. A guard key ssh
refuses, or a rank's executable that is not there, holds a restart back the same way, naming the fix. And a head
restarted alone (by systemd, with its firewall unit) next to the worker's old rank is told from a starting pair by
the ranks' ages: the worker's forced command reports how long its rank has been active.

The rules (`assess`, `decide`, `after_restart`, `track`, `probe_plan`) are pure functions over plain data in
guard_rules.py; this module is the I/O around them: systemctl, SSH and HTTP sit in `Pair`, which the rules never
see, and the command line, the state file, the lock and the pause are here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from twinspark import api as head_api
from twinspark import atomic, drain, pairlife, systemd
from twinspark.fabric import sysfs

# The rules are pure and live in guard_rules.py; the guard's I/O below applies them, and these names stay
# importable from here for the callers and tests that use them.
from twinspark.guard_rules import (  # noqa: F401
    FABRIC_PROBE_PORT,
    RESTART_HINT,
    TRANSITIONAL,
    UNIT,
    Action,
    Api,
    Attempt,
    Decision,
    GuardState,
    Observation,
    Policy,
    Probe,
    Progress,
    Sample,
    Verdict,
    _counters,
    active_for_s,
    after_restart,
    assess,
    classify_probe,
    connect_problem,
    decide,
    exec_path,
    fabric_ifnames,
    fabric_peer,
    fabric_problem,
    probe_plan,
    progress_from_json,
    runtime_problem,
    sample_from_metrics,
    stalled,
    state_from_json,
    state_to_json,
    track,
    warm,
    worker_status,
)

DEFAULT_ENV_FILES = ("/etc/twinspark/serve.env", "/etc/twinspark/secrets.env")
DEFAULT_STATE_FILE = "/var/lib/twinspark-pair-guard/state.json"
DEFAULT_SSH_KEY = "/etc/twinspark/pair-guard/id_ed25519"
DEFAULT_KNOWN_HOSTS = "/etc/twinspark/pair-guard/known_hosts"
LOCK_FILE = pairlife.DEFAULT_LOCK_FILE
LOCK_TIMEOUT_S = pairlife.DEFAULT_LOCK_TIMEOUT_S
PAUSE_FILE = pairlife.DEFAULT_PAUSE_FILE

# What the worker's forced SSH command accepts (roles/vllm_service/templates/twinspark-peer-control.j2). `state-since`
# is `state` with the rank's age; an older worker refuses it, and the guard then asks `state`.
PEER_VERBS = ("state", "state-since", "stop", "start")


# The head's API (its URL, key, TLS verification and the probes themselves) lives in twinspark.api; these names
# stay importable from here for the filters and tests that use them.
probe_host = head_api.probe_host
api_from_env = head_api.api_from_env


# ---------------------------------------------------------------------------------------------------------------
# The state file (its JSON shape is guard_rules.state_to_json / state_from_json)
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
# I/O: the two units and the API
# ---------------------------------------------------------------------------------------------------------------


def log(priority: int, message: str) -> None:
    """One line to stderr; under systemd the `<N>` prefix sets the journal priority (3 error, 4 warning, 6 info)."""
    prefix = f"<{priority}>" if os.environ.get("JOURNAL_STREAM") else ""
    print(f"{prefix}{message}", file=sys.stderr, flush=True)


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
    router: drain.Router | None = None  # the fleet's router, when the env files name one (twinspark.drain)
    fabric_ifnames: Sequence[str] = ()  # this node's fabric interfaces (NCCL_SOCKET_IFNAME), read in sysfs
    fabric_peer: str | None = None  # the worker's fabric address (WORKER_HOST), knocked on over TCP
    class_net: Path = sysfs.CLASS_NET
    fabric_port: int = FABRIC_PROBE_PORT
    fabric_timeout_s: float = 1.5

    # -- head (local) --
    def head_props(self) -> dict[str, str]:
        out = subprocess.run(systemd.show_argv(self.unit, ("ActiveState", "ActiveEnterTimestampMonotonic",
                                                           "LoadState")),
                             capture_output=True, text=True, timeout=30, check=False)
        return systemd.parse_show(out.stdout)

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

    def worker_status(self) -> tuple[str | None, float | None]:
        """The worker's ActiveState and how long its rank has been active (None: unreachable, or an older forced
        command that only says the state)."""
        try:
            text = self.worker("state-since")
        except RuntimeError:  # an older forced command refuses the verb: ask what it knows
            text = self.worker("state")
            return text, None
        if text is None:
            return None, None
        return worker_status(text)

    # -- what a restart cannot cure --
    def fabric(self) -> str | None:
        """Why the fabric is down, in one line (None: up, or nothing to look at): this node's interfaces in sysfs,
        then whether the peer's fabric address answers a TCP connect."""
        links = []
        for name in self.fabric_ifnames:
            try:
                links.append(sysfs.read_link(name, self.class_net, addresses=lambda _name: []))
            except (OSError, ValueError, sysfs.SysfsError) as exc:
                log(4, f"pair guard: cannot look at fabric interface {name} ({exc}); judging without it")
        local = fabric_problem(links, None)
        if local or not self.fabric_peer:
            return local
        return fabric_problem((), peer_problem(self.fabric_peer, self.fabric_port, self.fabric_timeout_s))

    def exec_start(self) -> str:
        """The head's rank unit's ExecStart, as `systemctl show` says it ('' when it cannot be asked)."""
        try:
            out = subprocess.run(["systemctl", "show", self.unit, "--property=ExecStart", "--value"],
                                 capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout if out.returncode == 0 else ""

    # -- the API --
    def probe(self, timeout_s: float) -> tuple[Probe, str]:
        """Ask the head's API the health tools' questions (twinspark.health.gather) and classify the answers."""
        results = head_api.gather(self.api.url, self.api.served_name, self.api.api_key, timeout_s, ca=self.api.ca)
        return classify_probe(results, self.api, timeout_s)

    def metrics(self, timeout_s: float = 10.0) -> dict[str, object]:
        """The head's /metrics, summarised (running and waiting requests: what the drain waits on)."""
        return head_api.read_metrics(self.api.url, timeout_s, ca=self.api.ca)

    def sample(self, timeout_s: float) -> Sample:
        """One reading of the head's /metrics (no key needed: vLLM serves it outside /v1)."""
        return sample_from_metrics(head_api.read_metrics(self.api.url, timeout_s, ca=self.api.ca), time.time())

    def observe(self, probe_timeout_s: float, policy: Policy | None = None,
                state: GuardState | None = None) -> Observation:
        """Both units, then (both active) /metrics, the one-token probe with the timeout `probe_plan` gives, and
        /metrics again after a probe that timed out. Without a policy: the units and the probe only."""
        props = self.head_props()
        head_state = props.get("ActiveState") or "unknown"
        worker_state, worker_for = self.worker_status()
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
        # Only a pair that does not serve needs the look (and the worker's sshd sees no connect from a healthy one).
        fabric = self.fabric() if probe is not Probe.OK else None
        return Observation(head_state, worker_state, probe, detail, active_for, tuple(samples),
                           worker_active_for_s=worker_for, fabric_down=fabric)


def peer_problem(address: str, port: int, timeout_s: float) -> str | None:
    """Knock on the peer's fabric address over TCP (the guard's unit may open no raw socket, so no ping): None when
    it answered (connected or refused), else why not."""
    import socket

    error: OSError | None = None
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            pass
    except OSError as exc:
        error = exc
    return connect_problem(address, port, error, timeout_s)


def guard_key_problem(key: str | None) -> str | None:
    """Why ssh would not use the guard's private key (missing, unreadable, a mode or owner it refuses), with the fix;
    None when it would, or when there is no key to look at (a stand-in pair)."""
    if not key:
        return None
    try:
        info = os.stat(key)
    except FileNotFoundError:
        return f"the guard's SSH key {key} does not exist: ansible-playbook site.yml makes it"
    except OSError as exc:
        return f"the guard's SSH key {key} cannot be looked at ({exc.strerror or exc}): run the guard as root"
    return pairlife.key_problem(info.st_mode, info.st_uid, os.geteuid(), key)


def restart_blocker(pair: Pair) -> str | None:
    """A cause no ordered restart can cure, found cheaply on the head, in one line with its fix; None when none.

    The guard's SSH key must be one ssh accepts (0600, owned by whoever runs ssh: ssh ignores any other), and the
    head's rank unit must find the executable it runs. A stand-in pair without a key or unit says nothing."""
    problem = guard_key_problem(getattr(pair, "ssh_key", None))
    if problem:
        return problem
    show = getattr(pair, "exec_start", None)
    path = exec_path(show()) if show is not None else None
    return runtime_problem(path, path is None or os.path.exists(path))


# ---------------------------------------------------------------------------------------------------------------
# The ordered restart
# ---------------------------------------------------------------------------------------------------------------


def run_steps(pair: Pair, steps: Sequence[tuple[str, str]], what: str = "ordered pair restart") -> tuple[bool, str]:
    """Carry out `pairlife.steps` in order: the head through systemctl, the worker through its forced command.

    Returns (ok, what was done). At the first step that fails (the worker unreachable, a systemctl or forced command
    failing) it stops and puts back what this run stopped (`pairlife.put_back`: worker, then head), so a failure
    midway never leaves a rank down that was up before; the message says what was put back."""
    done: list[tuple[str, str]] = []
    for rank, verb in steps:
        log(5, f"{what}: {'stopping' if verb == 'stop' else 'starting'} the {rank}")
        problem = _step(pair, rank, verb)
        if problem:
            said = ", ".join(_done_words(done))
            message = problem + (f" ({said})" if said else "")
            back = pairlife.put_back(done, steps)
            if back:
                message += "; " + _put_back(pair, back, what)
            return False, message
        done.append((rank, verb))
    return True, ", ".join(_done_words(done)) or "nothing to do"


def _done_words(done: Sequence[tuple[str, str]]) -> list[str]:
    return [f"{rank} {'stopped' if verb == 'stop' else 'started'}" for rank, verb in done]


def _step(pair: Pair, rank: str, verb: str) -> str:
    """One step; '' when it worked, else why not."""
    try:
        if rank == pairlife.HEAD:
            pair.head(verb)
        elif pair.worker(verb) is None:
            return f"the worker could not be reached to {verb} it"
    except subprocess.CalledProcessError as exc:
        return f"systemctl {verb} of the {rank} failed (exit {exc.returncode}): {(exc.stderr or '').strip()}"
    except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
        return f"the {rank}'s {verb} failed: {exc}"
    return ""


def _put_back(pair: Pair, steps: Sequence[tuple[str, str]], what: str) -> str:
    """Start again the ranks a failed run stopped; a line saying what came back and what could not."""
    said = []
    for rank, verb in steps:
        log(4, f"{what} failed midway: putting back the {rank} (starting it again)")
        problem = _step(pair, rank, verb)
        said.append(f"could not start the {rank} again: {problem}" if problem else f"{rank} started again")
    return "put back what this run stopped: " + ", ".join(said)


def preflight(pair: Pair, steps: Sequence[tuple[str, str]]) -> str:
    """Before any step: prove each one can run. '' when they can, else the cause and its fix (nothing touched).

    The head's unit must be installed; where a step touches the worker, the guard's key must be one ssh accepts
    and the worker must answer its forced command at one of its addresses. Stopping the head of a pair whose worker
    cannot be reached would leave the pair down with no way to bring it back from here."""
    if not steps:
        return ""
    load = pair.head_props().get("LoadState", "loaded")  # a stand-in that does not say is taken as installed
    if load != "loaded":
        return (f"the head's {pair.unit} is not installed here (LoadState={load or 'unknown'}): "
                "run ansible-playbook site.yml; nothing was stopped")
    if not any(rank == pairlife.WORKER for rank, _ in steps):
        return ""
    problem = guard_key_problem(getattr(pair, "ssh_key", None))
    if problem:
        return problem + "; nothing was stopped"
    try:
        state = pair.worker("state")
    except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
        return f"the worker's forced command does not answer `state` ({exc}); nothing was stopped"
    if state is None:
        return (f"the worker does not answer over SSH at {', '.join(pair.worker_addresses)} with the guard's key: "
                "check that it is up and its sshd runs (ssh -i <key> <user>@<worker> state on the head says why); "
                "nothing was stopped")
    return ""


def wait_serving(pair: Pair, ready_timeout_s: float, probe_timeout_s: float, poll_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 worker_every_s: float = 5.0) -> tuple[bool, str]:
    """Wait until the head answers a generation; gives up early when a rank's unit leaves `active`.

    Polls every `poll_s` (a refused or unready head API answers at once, so a short poll costs little and finds
    the pair serving sooner); the head's unit is read each poll (local), the worker's every `worker_every_s` (one
    SSH round trip each)."""
    started = clock()
    deadline = started + ready_timeout_s
    next_note = started
    next_worker = started
    worker_state: str | None = "active"
    while True:
        head_state = pair.head_props().get("ActiveState", "unknown")
        if clock() >= next_worker:
            worker_state = pair.worker("state")
            next_worker = clock() + worker_every_s
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


def ordered_restart(pair: Pair, ready_timeout_s: float, probe_timeout_s: float, poll_s: float = 0.5,
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
    env = _read_env(args.env)
    api = api_from_env(env)
    ref = drain.router_from_env(env, api.api_key)
    return Pair(api=api, worker_addresses=args.worker, ssh_user=args.ssh_user, ssh_key=args.ssh_key,
                known_hosts=args.known_hosts, router=None if ref is None else drain.Router(ref),
                fabric_ifnames=fabric_ifnames(env), fabric_peer=fabric_peer(env))


def _pair_or_none(args: argparse.Namespace, what: str) -> Pair | None:
    """The pair from the command line, or None after one error line naming what is wrong (the caller exits 2)."""
    try:
        return _pair_from_args(args)
    except (ValueError, OSError) as exc:
        log(3, f"{what}: {exc}")
        return None


def _policy_from_args(args: argparse.Namespace) -> Policy:
    return Policy(max_attempts=args.max_attempts, backoff_initial_s=args.backoff_initial,
                  backoff_max_s=args.backoff_max, startup_grace_s=args.startup_grace,
                  timeout_strikes=args.timeout_strikes, stall_window_s=args.stall_window,
                  short_probe_timeout_s=args.short_probe_timeout, metrics_timeout_s=args.metrics_timeout,
                  fabric_wait_s=args.fabric_wait)


def _router_of(pair: Pair) -> drain.Router | None:
    """The pair's router; a pair-like object without one (a stand-in) has none, like a pair without a router."""
    return getattr(pair, "router", None)


def _drain_timeout(args: argparse.Namespace) -> float:
    return float(getattr(args, "drain_timeout", drain.DEFAULT_IDLE_TIMEOUT_S))


def _run_restart(pair: Pair, args: argparse.Namespace, state: GuardState, policy: Policy, reason: str,
                 by_operator: bool = False) -> tuple[GuardState, bool]:
    """One ordered restart, drained from the router when the pair has one. `by_operator`: a restart that clears
    a give-up when it works, so a pair that serves again goes back in even if the guard had given up on it."""
    problem = preflight(pair, pairlife.RESTART_STEPS)
    if problem:
        # Nothing was touched, so nothing is counted: a restart cannot cure this, and the next run looks again.
        log(3, f"ordered pair restart not started: {problem}")
        return state, False
    started_at = time.time()
    box: dict[str, object] = {}

    def work() -> drain.WorkResult:
        try:
            ok, outcome = ordered_restart(pair, args.ready_timeout, args.probe_timeout)
        except (subprocess.SubprocessError, RuntimeError) as exc:
            ok, outcome = False, f"restart step failed: {exc}"
        after = after_restart(state, started_at, ok, f"{reason} -> {outcome}", policy, finished_at=time.time())
        box.update(ok=ok, outcome=outcome, state=after)
        return drain.WorkResult(served=ok, gave_up=after.gave_up_at is not None and not by_operator)

    # The guard restarts a pair it judged broken: what runs on it will not finish, so it waits for nothing (one
    # reading of /metrics, for the log); an operator's restart of a serving pair lets its requests finish.
    idle_timeout = _drain_timeout(args) if by_operator else 0.0
    drain.drained(_router_of(pair), work, log, lambda: pair.metrics(), idle_timeout)
    ok, outcome, state = bool(box["ok"]), str(box["outcome"]), box["state"]  # type: ignore[assignment]
    if ok:
        log(5, f"pair restarted: {outcome}")
    else:
        log(3, f"ordered pair restart failed ({state.failures_in_row} of {policy.max_attempts}): {outcome}")
    return state, ok


def cmd_guard(args: argparse.Namespace) -> int:
    # First of all, empty the kick socket: a datagram left in it would make systemd start the guard again at once.
    inbox = pairlife.KickInbox.inherited()
    kicks = inbox.drain()
    trigger = pairlife.trigger_line(kicks, inbox.listening)
    log(6 if kicks.woken else 7, f"pair guard run: {trigger}")
    pause = pairlife.read_pause(args.pause_file)
    if pause is not None and pairlife.pause_expired(pause, time.time()):
        # The run that took it did not end it (it failed, or its controller died): the pair is the guard's again.
        log(4, f"pair guard was {pairlife.pause_line(pause, time.time())}; the pause is over, looking again")
        try:
            pairlife.remove_pause(args.pause_file)
        except OSError as exc:
            log(3, f"pair guard: cannot remove the expired pause marker {args.pause_file} ({exc.strerror or exc})")
        pause = None
    if pause is not None:
        log(6 if kicks.woken else 7, f"pair guard {pairlife.pause_line(pause, time.time())}; not looking "
            f"(`twinspark pair resume`, playbooks/start.yml or restart.yml end the pause)")
        return 0
    pair = _pair_or_none(args, "pair guard")
    if pair is None:
        return 2
    policy = _policy_from_args(args)
    # The guard never waits for the lifecycle lock: whoever holds it is starting, stopping or restarting the pair,
    # and the pair it would see now is that operation's business. The next run (or kick) looks again.
    try:
        with pairlife.lifecycle_lock(args.lock_file, "the pair guard's run", 0):
            return _guard_run(args, pair, policy, inbox, trigger, kicks.woken)
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


def _guard_run(args: argparse.Namespace, pair: Pair, policy: Policy, inbox: pairlife.KickInbox, trigger: str,
               woken: bool = False) -> int:
    """One guard run under the lifecycle lock: look, decide, act, remember. `woken`: a rank's kick started this run
    (then a stopping rank is given time to finish stopping before the pair is judged)."""
    state_path = Path(args.state_file)
    state = load_state(state_path)
    if woken and args.settle > 0:
        head, worker, waited = settle(lambda: (pair.head_props().get("ActiveState") or "unknown", pair.worker("state")),
                                      args.settle)
        if waited >= 0.5:
            log(6, f"waited {waited:.1f} s for a stopping rank to finish stopping (head {head}, "
                   f"worker {worker or 'unreachable'})")
    obs = pair.observe(args.probe_timeout, policy, state)
    if obs.probe is not Probe.OK:
        obs = replace(obs, cannot_restart=restart_blocker(pair))
    now = time.time()
    decision = decide(obs, state, policy, now)
    state = replace(decision.state, last={"at": now, "verdict": decision.verdict.value,
                                          "action": decision.action.value, "reason": decision.reason})
    code = 0
    if decision.action is Action.NONE:
        log(7, f"pair healthy: {decision.reason}")
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
        drain.keep_out(_router_of(pair), log)
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
    pair = _pair_or_none(args, "pair check")
    if pair is None:
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
    pair = _pair_or_none(args, "pair restart")
    if pair is None:
        return 2
    if args.no_wait:
        return _lifecycle(args, pair, "restart")
    policy = _policy_from_args(args)
    state_path = Path(args.state_file)
    try:
        with pairlife.lifecycle_lock(args.lock_file, "twinspark pair restart", args.lock_timeout):
            state, ok = _run_restart(pair, args, load_state(state_path), policy, "requested by an operator",
                                     by_operator=True)
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


def _pause(path: str, reason: str, expires_in_s: float | None = None) -> int:
    if expires_in_s is not None and expires_in_s <= 0:
        log(3, f"pair pause: --expires-in must be a number of seconds above 0 (got {expires_in_s:g})")
        return 2
    try:
        pairlife.write_pause(path, reason, _who(), expires_in_s)
    except OSError as exc:
        log(3, f"pair pause: cannot write {path} ({exc.strerror or exc}); run as root on the head, after site.yml")
        return 2
    problem = stop_guard_run()
    if problem:
        log(4, f"pair pause: the marker is written, so no new guard run acts, but a run in progress may still: "
               f"{problem}")
        return 1
    now = time.time()
    expires = None if expires_in_s is None else now + expires_in_s
    log(5, f"pair guard {pairlife.pause_line(pairlife.Pause(reason, _who(), now, expires), now)}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    """Pause the guard: every run from now on (timer or kick) does nothing; a run in progress is stopped."""
    return _pause(args.pause_file, args.reason, args.expires_in)


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
            problem = preflight(pair, plan) if verb != "stop" else ""
            if problem:
                raise RuntimeError(problem)

            def work() -> drain.WorkResult:
                ok, done = run_steps(pair, plan, what)
                result.update(steps=[f"{rank} {step}" for rank, step in plan], done=done,
                              worker_reached=ok or "worker could not be reached" not in done)
                waited = ok and verb != "stop" and not args.no_wait
                if waited:
                    ok, done = wait_serving(pair, args.ready_timeout, args.probe_timeout)
                    result["serving"] = done
                result["ok"] = ok
                return drain.WorkResult(served=ok and waited)

            # nothing to do (a start of a serving pair) touches nothing, so it leaves the router alone
            _, said = drain.drained(_router_of(pair) if plan else None, work, log, lambda: pair.metrics(),
                                    _drain_timeout(args), stopping=verb == "stop")
            if said:
                result["router"] = said
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
    pair = _pair_or_none(args, f"pair {verb}")
    if pair is None:
        return 2
    return _lifecycle(args, pair, verb)


def cmd_start(args: argparse.Namespace) -> int:
    """Bring the pair to serving: nothing when both ranks are active, else the ordered restart, then wait."""
    return _lifecycle_from_args(args, "start")


def cmd_stop(args: argparse.Namespace) -> int:
    """Pause the guard, then stop the head and the worker (exit 1 naming the worker when it cannot be reached)."""
    return _lifecycle_from_args(args, "stop")


def cmd_rejoin(args: argparse.Namespace) -> int:
    """Put the pair back behind the fleet's router once it serves (after a --no-wait restart, a give-up cleared by
    hand, or a router that was down). Exit 0 when it is back (or no router is named), 1 when it is not, 2 invalid."""
    pair = _pair_or_none(args, "pair rejoin")
    if pair is None:
        return 2
    if pair.router is None:
        log(6, f"pair rejoin: the env files name no router ({drain.ROUTER_URL_ENV}); nothing to do")
        return 0
    state = load_state(Path(args.state_file))
    probe, detail = pair.probe(args.probe_timeout)
    reason = drain.stay_out_reason(probe is Probe.OK, state.gave_up_at is not None, stopping=False)
    if reason is not None:
        log(3, f"pair rejoin: the pair stays out of router {pair.router.ref.url}: {reason} ({detail or probe.value}); "
               "`twinspark pair restart` first")
        return 1
    back, line = pair.router.call("add")
    log(5 if back else 3, f"pair rejoin: {line}")
    return 0 if back else 1


def cmd_kick(args: argparse.Namespace) -> int:
    """Send the kick token to each --to; exit 0 when every datagram left, 1 otherwise, 2 on a malformed --to."""
    try:
        targets = [pairlife.parse_target(text) for text in args.to]
    except ValueError as exc:
        log(3, f"pair kick: {exc}")
        return 2
    if args.watch_pid is not None:
        return _watch_then_kick(args.watch_pid, targets, args.detach, args.unit)
    if args.detach or args.unit:
        log(3, "pair kick: --detach and --unit only go with --watch-pid PID (the rank's $MAINPID); add it or drop them")
        return 2
    return _kick_now(targets)


def _kick_now(targets: Sequence[tuple[str, int]]) -> int:
    state = pairlife.system_state()
    if not pairlife.should_kick(state):
        log(6, f"pair kick: not sent, this node is shutting down (systemd: {state}); the guard's timer looks")
        return 0
    problems = pairlife.kick(targets)
    for problem in problems:
        log(4, f"pair kick: {problem}; the guard's timer still looks within its interval")
    return 1 if problems else 0


def _unit_job(unit: str) -> str:
    """`systemctl show -P Job UNIT`: '' when no job runs on it, 'unknown' when it cannot be asked (which counts as a
    stop asked, so nothing is killed on a guess)."""
    try:
        out = subprocess.run(["systemctl", "show", "--property=Job", "--value", unit], capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def _watch_then_kick(pid: int, targets: Sequence[tuple[str, int]], detach: bool, unit: str | None = None) -> int:
    """Kick the moment process `pid` (the rank's main process: the unit's $MAINPID, from ExecStartPost=) ends.

    The unit's own ExecStopPost= kick comes only once systemd has stopped the rank's leftover processes, which a
    killed or crashed rank leaves behind and which outlive SIGTERM (up to TimeoutStopSec=); this one comes at
    once, however the main process ended. With `detach`, the command returns at once (ExecStartPost= must end
    for the start to finish) and a child in the unit's own cgroup watches; it ignores SIGTERM, so that a stop of
    the rank, which signals every process of the unit, still gets its kick once the main process is gone."""
    if pid <= 0:
        log(3, f"pair kick: --watch-pid {pid}: expected the rank's main PID ($MAINPID)")
        return 2
    if detach:
        sys.stderr.flush()
        if os.fork() > 0:
            return 0
        os.setsid()
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = 0
    try:
        seen = pairlife.wait_exit(pid)
        if seen in ("ended", "gone"):
            log(6, f"pair kick: the rank's main process {pid} {seen}; waking the guard")
            code = _kick_now(targets)
            if unit and not pairlife.stop_asked(_unit_job(unit)):
                # Killed, crashed or exited after losing its peer: its leftovers would only wait out TimeoutStopSec=.
                killed = pairlife.finish_the_kill(unit, log)
                if killed:
                    log(5, f"pair kick: no stop was asked of {unit}; killed its {len(killed)} leftover process(es) "
                           "now instead of after the stop timeout")
        else:
            log(4, f"pair kick: the rank's main process {pid}: {seen}; the unit's ExecStopPost= kick remains")
    finally:
        if detach:
            sys.stderr.flush()
            os._exit(code)
    return code


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
        if state.fabric_down_since is not None:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.fabric_down_since))
            print(f"fabric:          down since {stamp} ({time.time() - state.fabric_down_since:.0f} s)")
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
        sub.add_argument("--fabric-wait", type=float, default=Policy.fabric_wait_s, metavar="S",
                         help="the fabric down this long is reported at error priority (the guard never restarts "
                              "while it is down: a restart cannot fix a link)")
        sub.add_argument("--json", action="store_true", help="print what was seen and decided as JSON")
        sub.add_argument("--lock-file", default=LOCK_FILE, metavar="FILE",
                         help="the pair's lifecycle lock, taken by every start, stop and restart (the guard never "
                              "waits for it)")
        sub.add_argument("--lock-timeout", type=float, default=LOCK_TIMEOUT_S, metavar="S",
                         help="how long a start, stop or restart waits for the lifecycle lock before giving up")
        sub.add_argument("--drain-timeout", type=float, default=drain.DEFAULT_IDLE_TIMEOUT_S, metavar="S",
                         help="with a router named in the env files: how long to wait, once the pair is out of the "
                              "router, for its requests in flight to finish before it is touched")

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
    pause.add_argument("--expires-in", type=float, default=None, metavar="SECONDS",
                       help="end the pause by itself after SECONDS (a playbook's pause for one run, so a run that "
                            "dies midway never leaves the pair without its guard); default: until resumed")
    pause.set_defaults(func=cmd_pause)
    resume = verbs.add_parser("resume", help="end a pause: the guard's next run looks at the pair again")
    common(resume, acts=False)
    resume.set_defaults(func=cmd_resume)
    rejoin = verbs.add_parser("rejoin", help="put the pair back behind the fleet's router once it serves a "
                                             "generation (never a pair the guard gave up on)")
    common(rejoin, acts=True)
    rejoin.set_defaults(func=_with_defaults(cmd_rejoin))
    kick = verbs.add_parser("kick", help="wake the head's pair guard now (a rank's ExecStop=): one datagram, "
                                         "no command")
    kick.add_argument("--to", action="append", required=True, metavar="ADDRESS:PORT",
                      help="the head's kick socket (twinspark-pair-guard-kick.socket); repeat for more")
    kick.add_argument("--watch-pid", type=int, metavar="PID",
                      help="kick only once this process ends (the rank's $MAINPID, from the unit's ExecStartPost=)")
    kick.add_argument("--detach", action="store_true",
                      help="with --watch-pid: return at once and watch from a child process")
    kick.add_argument("--unit", metavar="UNIT",
                      help="with --watch-pid: the rank's unit; when its main process ends with no stop asked of it "
                           "(killed, crashed), the unit's other processes are killed at once, not after its stop "
                           "timeout")
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
