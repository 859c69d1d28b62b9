"""`twinspark pair ...`: the command line of the pair guard and of the pair's lifecycle (runs on the head).

Exit codes: 0 done (or serving), 1 not done (broken, a lock held, a give-up), 2 invalid input, 3 not yet (`check`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from twinspark import api as head_api
from twinspark import envfile, layout
from twinspark.fleet import drain
from twinspark.pair import guard, lifecycle, textfile
from twinspark.pair.io import DEFAULT_KNOWN_HOSTS, DEFAULT_SSH_KEY, SERVED_FILE_NAME, LivePair, Rank, log
from twinspark.pair.rules import (
    Generation,
    GuardState,
    Policy,
    Verdict,
    _counters,
    assess,
    fabric_ifnames,
    fabric_peer,
    state_to_json,
    track,
    warm,
)


def default_env_files() -> tuple[str, str]:
    """This node's serve.env and secrets.env (the layout, read when first needed: importing reads no file)."""
    return layout.current().serve_env, layout.current().secrets_env


def _read_env(paths: Sequence[str]) -> dict[str, str]:
    read = envfile.read_files(paths)
    if read.refused:  # missing, unreadable, not UTF-8, or not a small regular file (a FIFO, /dev/zero)
        raise ValueError("; ".join(read.refused) + " (the guard runs as root; render the files with site.yml)")
    return dict(read.values)


def group_ranks(words: Sequence[str] | None) -> tuple[Rank, ...]:
    """--rank R:ADDRESS, repeated -> ranks 2..N-1 of a group of three or more, each with its addresses in the order
    given (fabric first, then management). ValueError naming the word and the fix when a word is not R:ADDRESS with
    R from 2, or the ranks leave a gap."""
    found: dict[int, list[str]] = {}
    for word in words or ():
        number, _, address = word.partition(":")
        if not number.isdigit() or int(number) < 2 or not address.strip():
            raise ValueError(f"--rank {word!r}: give RANK:ADDRESS with RANK from 2 up (rank 1 is --worker), e.g. "
                             "--rank 2:10.77.0.3")
        found.setdefault(int(number), []).append(address.strip())
    missing = sorted(set(range(2, max(found, default=1) + 1)) - set(found))
    if missing:
        raise ValueError(f"--rank: no address for rank {', '.join(map(str, missing))}; give every rank from 2 to "
                         f"{max(found)} (--rank R:ADDRESS)")
    return tuple(Rank(number, tuple(addresses)) for number, addresses in sorted(found.items()))


def _pair_from_args(args: argparse.Namespace) -> LivePair:
    alone = bool(getattr(args, "alone", False))
    if alone and (args.worker or getattr(args, "rank", None)):
        raise ValueError("--alone (a group of one) takes no --worker and no --rank; give either --alone or the "
                         "other ranks' addresses")
    env = _read_env(args.env)
    api = head_api.api_from_env(env)
    # the router's admin key (its front refuses the clients' key on the admin paths), never the pair's API key
    where = layout.current()
    ref = drain.router_from_env(env, drain.read_key(Path(where.router_drain_key)),
                                drain.read_admin(Path(where.router_drain_admin)))
    return LivePair(api=api, worker_addresses=[] if alone else args.worker, alone=alone, ssh_user=args.ssh_user,
                    ssh_key=args.ssh_key, known_hosts=args.known_hosts,
                    router=None if ref is None else drain.Router(ref),
                    fabric_ifnames=fabric_ifnames(env), fabric_peer=fabric_peer(env), env=env,
                    served_file=str(Path(args.state_file).with_name(SERVED_FILE_NAME)),
                    more_ranks=group_ranks(getattr(args, "rank", None)))


def _pair_or_none(args: argparse.Namespace, what: str) -> LivePair | None:
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


def cmd_guard(args: argparse.Namespace) -> int:
    # First of all, empty the kick socket: a datagram left in it would make systemd start the guard again at once.
    inbox = lifecycle.KickInbox.inherited()
    kicks = inbox.drain()
    trigger = lifecycle.trigger_line(kicks, inbox.listening)
    log(6 if kicks.woken else 7, f"pair guard run: {trigger}")
    pause = lifecycle.read_pause(args.pause_file)
    if pause is not None and lifecycle.pause_expired(pause, time.time()):
        # The run that took it did not end it (it failed, or its controller died): the pair is the guard's again.
        log(4, f"pair guard was {lifecycle.pause_line(pause, time.time())}; the pause is over, looking again")
        try:
            lifecycle.remove_pause(args.pause_file)
        except OSError as exc:
            log(3, f"pair guard: cannot remove the expired pause marker {args.pause_file} ({exc.strerror or exc})")
        pause = None
    if pause is not None:
        log(6 if kicks.woken else 7, f"pair guard {lifecycle.pause_line(pause, time.time())}; not looking "
            f"(`twinspark pair resume`, `twinspark pair start|restart` or playbooks/start.yml end the pause)")
        guard.report(args, guard.peek_state(Path(args.state_file)), _policy_from_args(args), "paused",
                     paused_for_s=textfile.paused_seconds(pause.since, args.pause_file, time.time()), pause=pause)
        return 0
    pair = _pair_or_none(args, "pair guard")
    if pair is None:
        return 2
    policy = _policy_from_args(args)
    # The guard never waits for the lifecycle lock: whoever holds it is starting, stopping or restarting the pair,
    # and the pair it would see now is that operation's business. The next run (or kick) looks again.
    try:
        with lifecycle.lifecycle_lock(args.lock_file, "the pair guard's run", 0):
            return guard.run(args, pair, policy, inbox, trigger, kicks.woken)
    except lifecycle.LockBusy as exc:
        log(5, f"pair guard: not looking now, {exc.holder} holds the pair's lifecycle lock; the next run looks again")
        guard.report(args, guard.peek_state(Path(args.state_file)), policy, "busy")
        return 0
    except lifecycle.LockError as exc:
        log(3, f"pair guard: {exc}")
        return 2


def cmd_check(args: argparse.Namespace) -> int:
    """One look at the pair, judged like the guard judges it, without acting: for waits in playbooks.

    Exit 0 serving, 1 broken (a rank is down, or not ready after the grace), 3 not yet (starting, worker
    unreachable, a generation timed out), 2 invalid input.
    """
    pair = _pair_or_none(args, "pair check")
    if pair is None:
        return 2
    policy = _policy_from_args(args)
    state = guard.peek_state(Path(args.state_file))
    obs = pair.observe(args.probe_timeout, policy, state)
    if obs.probe is Generation.OK:  # a playbook's wait after its ordered start: the head rank the pair serves with
        pair.remember_served(obs.head_invocation)
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
        return lifecycle.run_verb(args, pair, "restart")
    policy = _policy_from_args(args)
    state_path = Path(args.state_file)
    try:
        with lifecycle.lifecycle_lock(args.lock_file, "twinspark pair restart", args.lock_timeout):
            state, ok = guard.run_restart(pair, args, guard.load_state(state_path), policy, "requested by an operator",
                                     by_operator=True)
            if ok:
                state = replace(state, gave_up_at=None, gave_up_reason="", failures_in_row=0)
            guard.save_state(state_path, state)
    except lifecycle.LockBusy as exc:
        log(3, str(exc))
        return 1
    except lifecycle.LockError as exc:
        log(3, str(exc))
        return 2
    lifecycle.guard_after_start(args.pause_file, "twinspark pair restart")
    return 0 if ok else 1


def cmd_pause(args: argparse.Namespace) -> int:
    """Pause the guard: every run from now on (timer or kick) does nothing; a run in progress is stopped."""
    return lifecycle.pause_guard(args.pause_file, args.reason, args.expires_in)


def cmd_resume(args: argparse.Namespace) -> int:
    """End a pause: the next run (timer or kick) looks at the pair again."""
    try:
        pause = lifecycle.remove_pause(args.pause_file)
    except OSError as exc:
        log(3, f"pair resume: cannot remove {args.pause_file} ({exc.strerror or exc}); run as root on the head")
        return 2
    log(5, "pair guard resumed" + (f" (was {lifecycle.pause_line(pause, time.time())})" if pause else
                                   " (it was not paused)"))
    return 0


def _lifecycle_from_args(args: argparse.Namespace, verb: str) -> int:
    """The pair from the command line (exit 2 naming what is wrong), then `_lifecycle` with `verb`."""
    pair = _pair_or_none(args, f"pair {verb}")
    if pair is None:
        return 2
    return lifecycle.run_verb(args, pair, verb)


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
    state = guard.load_state(Path(args.state_file))
    probe, detail = pair.probe(args.probe_timeout)
    reason = drain.stay_out_reason(probe is Generation.OK, state.gave_up_at is not None, stopping=False)
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
        targets = [lifecycle.parse_target(text) for text in args.to]
    except ValueError as exc:
        log(3, f"pair kick: {exc}")
        return 2
    if args.watch_pid is not None:
        return lifecycle.watch_then_kick(args.watch_pid, targets, args.detach, args.unit)
    if args.detach or args.unit:
        log(3, "pair kick: --detach and --unit only go with --watch-pid PID (the rank's $MAINPID); add it or drop them")
        return 2
    return lifecycle.kick_now(targets)


def cmd_reset(args: argparse.Namespace) -> int:
    """Forget failed attempts and a give-up, so the guard acts again on its next run."""
    guard.save_state(Path(args.state_file), GuardState())
    log(5, f"pair guard state reset ({args.state_file})")
    return 0


def cmd_state(args: argparse.Namespace) -> int:
    state = guard.load_state(Path(args.state_file))
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
        pause = lifecycle.read_pause(args.pause_file)
        print(f"guard:           {lifecycle.pause_line(pause, time.time()) if pause else 'watching (not paused)'}")
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
        sub.add_argument("--state-file", default=guard.default_state_file(), help="where the guard keeps its history")
        sub.add_argument("--pause-file", default=lifecycle.default_pause_file(), metavar="FILE",
                         help="the guard's pause marker (`twinspark pair pause`/`resume` write and remove it)")
        if not acts:
            return
        sub.set_defaults(verb_parser=sub)  # re-parses recorded defaults when --worker is not given (_with_recorded)
        sub.add_argument("--env", action="append", default=None, metavar="FILE",
                         help="env file(s), later ones override earlier (default: serve.env then secrets.env)")
        sub.add_argument("--worker", action="append", default=None, metavar="ADDRESS",
                         help="the worker's address for SSH; repeat to try more (fabric first, then management). "
                              "Without it, every option comes first from what site.yml recorded on the head "
                              f"({layout.current().pair_args}), and the options given here win")
        sub.add_argument("--alone", action="store_true",
                         help="a group of one (a single Spark): rank 0 and no other rank, so no --worker")
        sub.add_argument("--rank", action="append", default=None, metavar="RANK:ADDRESS",
                         help="a group of three or more: rank RANK's address for SSH (RANK from 2; rank 1 is "
                              "--worker); repeat for every rank, and for more addresses of one rank (fabric first)")
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
        sub.add_argument("--lock-file", default=lifecycle.default_lock_file(), metavar="FILE",
                         help="the pair's lifecycle lock, taken by every start, stop and restart (the guard never "
                              "waits for it)")
        sub.add_argument("--lock-timeout", type=float, default=lifecycle.DEFAULT_LOCK_TIMEOUT_S, metavar="S",
                         help="how long a start, stop or restart waits for the lifecycle lock before giving up")
        sub.add_argument("--drain-timeout", type=float, default=drain.DEFAULT_IDLE_TIMEOUT_S, metavar="S",
                         help="with a router named in the env files: how long to wait, once the pair is out of the "
                              "router, for its requests in flight to finish before it is touched")

    guard_verb = verbs.add_parser("guard",
                                  help="one guard run: look at both ranks, restart the pair in order if broken")
    common(guard_verb, acts=True)
    guard_verb.add_argument("--textfile", default=textfile.default_path(), metavar="PATH",
                            help="the guard's node_exporter textfile, rewritten on every run (default: guard.prom in "
                                 "the layout's metrics directory, which node exporter reads); '' writes none")
    guard_verb.add_argument("--settle", type=float, default=30.0, metavar="S",
                            help="woken by a kick, wait at most this long for a rank that is still stopping to "
                                 "finish (the rank's stop grace and a margin) before judging the pair")
    guard_verb.set_defaults(func=_with_defaults(cmd_guard))
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


# Options that may repeat: one given on the command line replaces every recorded one (the others just come later).
REPEATED = ("--worker", "--env", "--rank")


def recorded_args(path: str) -> tuple[list[str] | None, str]:
    """The words site.yml recorded on the head for every pair verb (layout pair_args), or None and why not."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{path} does not exist (site.yml writes it on the head)"
    except (OSError, ValueError) as exc:
        return None, f"{path}: {getattr(exc, 'strerror', None) or exc}"
    words = data.get("argv") if isinstance(data, dict) else None
    if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
        return None, f"{path} holds no 'argv' list of strings; rerun site.yml to rewrite it"
    return words, ""


def merged_words(recorded: Sequence[str], given: Sequence[str]) -> list[str]:
    """The recorded words, then the given ones (argparse keeps the last value of an option, so the given win); a
    repeated option given at all (--worker, --env, --rank) drops all of its recorded values."""
    replaced = {word.split("=", 1)[0] for word in given if word.split("=", 1)[0] in REPEATED}
    kept: list[str] = []
    words = iter(recorded)
    for word in words:
        name = word.split("=", 1)[0]
        if name in replaced:
            if "=" not in word:
                next(words, None)
            continue
        kept.append(word)
    return [*kept, *given]


def _given_words(args: argparse.Namespace) -> list[str]:
    """What was typed after `pair VERB` (cli.main keeps the words as `args.argv`)."""
    typed = list(getattr(args, "argv", None) or [])
    try:
        return typed[typed.index(args.verb, typed.index("pair") + 1) + 1:]
    except ValueError:
        return []


def _with_recorded(args: argparse.Namespace) -> argparse.Namespace | None:
    """Without --worker: the verb's options parsed from the recorded words with the typed ones laid over them; None
    after one line saying what is missing."""
    recorded, why = recorded_args(layout.current().pair_args)
    if recorded is None:
        print(f"twinspark pair {args.verb}: give --worker ADDRESS (and the other options the guard runs with): {why}",
              file=sys.stderr)
        return None
    merged = args.verb_parser.parse_args(merged_words(recorded, _given_words(args)))
    merged.argv, merged.verb = args.argv, args.verb
    return merged


def _with_defaults(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        if args.worker is None and not args.alone:
            found = _with_recorded(args)
            if found is None:
                return 2
            args = found
        if args.env is None:
            args.env = list(default_env_files())
        if args.startup_grace is None:
            args.startup_grace = args.ready_timeout
        return func(args)

    return run
