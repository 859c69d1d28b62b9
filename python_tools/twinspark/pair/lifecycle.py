"""The pair's lifecycle on the head: the guard's wake-up kick, and (below) what every start and stop shares: the
lock, the ordered steps and their put-back, the pause, and whether the pair needs an ordered restart at all.

The kick. A rank that stops for any reason (killed, crashed, lost its peer and exited with status 0, stopped by
someone) runs `twinspark pair kick` from its unit's `ExecStop=`: one UDP datagram carrying a fixed token to the
head. On the head, `twinspark-pair-guard-kick.socket` listens for it (loopback for the head's own rank, the head's
fabric address for the worker's) and activates `twinspark-pair-guard.service`, which inherits the socket, reads
every datagram waiting in it (`KickInbox.drain`) and then looks at the pair as it always does. A datagram means
only "look now": its content is never interpreted beyond comparing it with the token, the guard's own rules decide
what to do, and no datagram can make it do anything a timer run would not. Kicks that arrive while a run is going
on stay queued; systemd starts one more run when the current one ends, and that run drains them all, so a burst
of kicks costs at most one extra run. The timer stays as the safety net (a lost datagram, a socket not running).

Rules (`summarize`, `listen_fds`, `trigger_line`, `parse_target`, `steps`, `put_back`, `restart_reasons`) are pure;
sockets sit in `KickInbox` and `kick`, and every step on the pair goes through `LivePair` (pair/io.py).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from twinspark import atomic, layout, safeio
from twinspark import memfit as planner
from twinspark.fleet import drain
from twinspark.pair.io import LivePair, guard_key_problem, log, router_of
from twinspark.pair.rules import Generation, rank_name, the

KICK_TOKEN = b"twinspark-pair-guard-kick/1\n"


# This node's layout (units, the lock, the pause marker), read when first needed: importing this module reads no file.
def kick_socket() -> str:
    return layout.current().unit_pair_guard_kick


def default_lock_file() -> str:
    return layout.current().pair_lock  # in the root-only (0700) control directory


def default_pause_file() -> str:
    return layout.current().guard_pause


def guard_service() -> str:
    return layout.current().unit_pair_guard


SD_LISTEN_FDS_START = 3
# A run never reads more than this many datagrams: a flood cannot keep the guard reading instead of looking.
MAX_DRAIN = 4096


# ---------------------------------------------------------------------------------------------------------------
# Kick: rules (pure)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kicks:
    """What a drain found: kicks (the token), other datagrams (ignored, never read further) and who sent them."""

    count: int = 0
    ignored: int = 0
    senders: tuple[str, ...] = ()  # addresses the kicks came from, sorted, each once

    @property
    def woken(self) -> bool:
        """Whether a rank's kick (not only the timer) is why the guard runs now."""
        return self.count > 0

    def __add__(self, other: Kicks) -> Kicks:
        return Kicks(self.count + other.count, self.ignored + other.ignored,
                     tuple(sorted(set(self.senders) | set(other.senders))))


def summarize(datagrams: Iterable[tuple[bytes, str]]) -> Kicks:
    """(payload, sender address) pairs -> Kicks. Only the exact token counts; anything else is ignored."""
    count = ignored = 0
    senders: set[str] = set()
    for payload, sender in datagrams:
        if payload == KICK_TOKEN:
            count += 1
            senders.add(sender)
        else:
            ignored += 1
    return Kicks(count, ignored, tuple(sorted(senders)))


def listen_fds(environ: Mapping[str, str], pid: int, name: str | None = None) -> list[int]:
    """The descriptors systemd passed to this process for the socket unit `name` (sd_listen_fds(3) protocol).

    None when LISTEN_PID names another process (the variables were inherited, not meant for us); when
    LISTEN_FDNAMES is set, only the descriptors carrying `name` (default: the guard's kick socket)."""
    name = kick_socket() if name is None else name
    try:
        if int(environ.get("LISTEN_PID", "0")) != pid:
            return []
        count = int(environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return []
    fds = list(range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + max(count, 0)))
    names = environ.get("LISTEN_FDNAMES")
    if names is None:
        return fds
    labels = names.split(":")
    return [fd for fd, label in zip(fds, labels, strict=False) if label == name]


def trigger_line(kicks: Kicks, listening: bool) -> str:
    """Why this guard run happened, in the words its journal lines carry."""
    if kicks.count:
        extra = f"; {kicks.ignored} other datagram(s) ignored" if kicks.ignored else ""
        return f"woken by {kicks.count} kick(s) from {', '.join(kicks.senders)}{extra}"
    extra = f" ({kicks.ignored} datagram(s) that are not a kick ignored)" if kicks.ignored else ""
    if listening:
        return f"run by the timer, no kick waiting{extra}"
    return f"run without the kick socket (is {kick_socket()} running?){extra}"


def should_kick(system_state: str) -> bool:
    """Whether a stopping rank wakes the guard, given `systemctl is-system-running`. Not while its node shuts down
    (a reboot): the guard would try to start the rank again on a node that refuses new jobs, count a failed restart
    and back off; its timer finds the rebooted node instead. Any other answer (or none) kicks."""
    return system_state.strip() != "stopping"


def parse_target(text: str) -> tuple[str, int]:
    """'HOST:PORT' or '[IPV6]:PORT' -> (host, port); ValueError naming the expected form."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--to {text!r}: expected ADDRESS:PORT (or [IPV6]:PORT), e.g. 127.0.0.1:25001")
    return host, int(port)


# ---------------------------------------------------------------------------------------------------------------
# Kick: I/O
# ---------------------------------------------------------------------------------------------------------------


def stop_asked(job: str) -> bool:
    """Whether systemd has a job on the rank's unit (`systemctl show -P Job`: an id while a stop or restart asked
    for runs, empty otherwise): then its main process ended because someone stopped it, and the stop's own grace
    applies. Without a job it was killed, crashed or exited after losing its peer."""
    return bool(job.strip()) and job.strip() != "0"


def cgroup_path(proc_self_cgroup: str) -> str | None:
    """This process's cgroup v2 path ('0::/system.slice/x.service' -> '/system.slice/x.service'); None without one."""
    for line in proc_self_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or None
    return None


def leftovers(procs: Iterable[int], own: int) -> list[int]:
    """The processes of the unit's cgroup other than this one, in the order read."""
    return [pid for pid in procs if pid != own]


def own_unit_cgroup(path: str | None, unit: str) -> bool:
    """Whether a cgroup path is exactly the cgroup of service `unit` (…/<unit>), never a slice or the root."""
    return bool(path) and unit.endswith(".service") and path.rstrip("/").rsplit("/", 1)[-1] == unit


def finish_the_kill(unit: str, log: Callable[[int, str], None]) -> list[int]:
    """SIGKILL the other processes of this process's own unit (same cgroup, same user): what systemd does anyway
    once TimeoutStopSec= has passed, done now because nothing is left for them to do; the PIDs signalled.

    Acts only when this process's cgroup is `unit`'s own: anywhere else (a shell, a test, a slice) it does nothing."""
    try:
        path = cgroup_path(Path("/proc/self/cgroup").read_text())
    except OSError:
        path = None
    if path is None or not own_unit_cgroup(path, unit):
        log(4, f"not in {unit}'s own cgroup ({path}); its leftovers are left to systemd's stop timeout")
        return []
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        try:
            procs = [int(p) for p in Path(f"{root}{path}/cgroup.procs").read_text().split()]
            break
        except (OSError, ValueError):
            continue
    else:
        log(4, f"cannot read the processes of cgroup {path}; systemd stops them after its stop timeout")
        return []
    killed = []
    for pid in leftovers(procs, os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def wait_exit(pid: int) -> str:
    """Block until process `pid` ends, without polling (a pidfd: Linux 5.3, Python 3.9); how it ended the wait:
    'ended', 'gone' (it had ended before the watch began), or why it cannot be watched."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return "gone"
    except (AttributeError, OSError) as exc:  # no pidfd_open here, or refused (EPERM from a syscall filter)
        return f"cannot watch it ({exc})"
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():  # no timeout: returns once the process has ended
            pass
    finally:
        os.close(fd)
    return "ended"


def system_state(timeout_s: float = 3.0) -> str:
    """`systemctl is-system-running`'s answer ('' when it cannot be asked: then the kick goes out)."""
    try:
        out = subprocess.run(["systemctl", "is-system-running"], capture_output=True, text=True, timeout=timeout_s,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def kick(targets: Sequence[tuple[str, int]], timeout_s: float = 1.0) -> list[str]:
    """Send the token once to each target; the problems (one line each), empty when every datagram left."""
    problems = []
    for host, port in targets:
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0][0]
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.settimeout(timeout_s)
                sock.sendto(KICK_TOKEN, (host, port))
        except OSError as exc:
            problems.append(f"{host}:{port}: {exc.strerror or exc}")
    return problems


class KickInbox:
    """The kick socket(s) a guard run inherited from systemd (none when started without them)."""

    def __init__(self, sockets: Sequence[socket.socket] = ()) -> None:
        self.sockets = list(sockets)

    @classmethod
    def inherited(cls, environ: Mapping[str, str] | None = None) -> KickInbox:
        environ = os.environ if environ is None else environ
        socks = []
        for fd in listen_fds(environ, os.getpid()):
            try:
                sock = socket.socket(fileno=fd)
            except OSError:
                continue
            if sock.type != socket.SOCK_DGRAM:
                sock.detach()
                continue
            sock.setblocking(False)
            socks.append(sock)
        for variable in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):  # not for ssh or systemctl
            os.environ.pop(variable, None)
        return cls(socks)

    @property
    def listening(self) -> bool:
        return bool(self.sockets)

    def drain(self, limit: int = MAX_DRAIN) -> Kicks:
        """Read every datagram waiting (at most `limit`), without blocking."""
        seen: list[tuple[bytes, str]] = []
        for sock in self.sockets:
            while len(seen) < limit:
                try:
                    payload, sender = sock.recvfrom(len(KICK_TOKEN) + 1)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                seen.append((payload, str(sender[0]) if sender else "?"))
        return summarize(seen)


# ---------------------------------------------------------------------------------------------------------------
# The lifecycle lock (issue 13): one flock on the head, taken by everything that starts, stops or changes the pair
# ---------------------------------------------------------------------------------------------------------------

DEFAULT_LOCK_TIMEOUT_S = 120.0
MAX_HOLDER_BYTES = 4096


class LockBusy(Exception):
    """Another operation holds the lifecycle lock; the message names it and says what to do."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class LockError(Exception):
    """The lock file cannot be used at all (missing directory, a link, no permission)."""


def holder_text(content: str, now: float) -> str:
    """The lock file's content (written by whoever holds it) -> who that is, in words."""
    try:
        data = json.loads(content)
        what, pid, since = str(data["what"]), int(data["pid"]), float(data["since"])
    except (ValueError, KeyError, TypeError):
        return "a process that did not say who it is (the lock file names no holder)"
    stamp = time.strftime("%H:%M:%S UTC", time.gmtime(since))
    return f"{what} (pid {pid}, since {stamp}, {max(0.0, now - since):.0f} s ago)"


def busy_message(path: str, holder: str, waited_s: float, what: str) -> str:
    return (f"{what}: the pair's lifecycle lock {path} is held by {holder}; waited {waited_s:.0f} s. Let it finish "
            "(journalctl -u twinspark-pair-guard, or the playbook that runs), or pause the guard first "
            "(`twinspark pair pause`), then try again")


@contextlib.contextmanager
def lifecycle_lock(path: str, what: str, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep, poll_s: float = 0.5) -> Iterator[None]:
    """Hold the pair's lifecycle lock for the `with` block, waiting at most `timeout_s` (0: do not wait).

    The holder writes who it is into the file, so a waiter can name it. Raises LockBusy after the wait, LockError
    when the file cannot be opened (it is never followed as a link)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        hint = ("is a link; remove it" if exc.errno == errno.ELOOP
                else "create the control directory with the serving role (site.yml), and run as root")
        raise LockError(f"{what}: cannot open the pair's lifecycle lock {path} ({exc.strerror}): {hint}") from exc
    try:
        started = clock()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = clock() - started
                if waited >= timeout_s:
                    content = os.pread(fd, MAX_HOLDER_BYTES, 0).decode("utf-8", "replace")
                    holder = holder_text(content, time.time())
                    raise LockBusy(busy_message(path, holder, waited, what), holder) from None
                sleep(min(poll_s, max(timeout_s - waited, 0.01)))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"what": what, "pid": os.getpid(), "since": time.time()}).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


# ---------------------------------------------------------------------------------------------------------------
# Start, stop, restart: which rank does what, in which order (pure)
# ---------------------------------------------------------------------------------------------------------------

HEAD, WORKER = "head", "worker"
RESTART_STEPS = ((HEAD, "stop"), (WORKER, "stop"), (WORKER, "start"), (HEAD, "start"))
STOP_STEPS = ((HEAD, "stop"), (WORKER, "stop"))


def rank_names(size: int = 2) -> tuple[str, ...]:
    """The ranks' names in rank order: a pair's head and worker, a larger group's rank 0..N-1 (rules.rank_name)."""
    return tuple(rank_name(rank, size) for rank in range(size))


def steps(verb: str, head_state: str | None = None, worker_state: str | None = None,
          size: int = 2) -> tuple[tuple[str, str], ...]:
    """The ordered steps of `twinspark pair start|stop|restart`, given the ranks' ActiveState.

    restart: stop head, stop worker, start worker, start head, whatever the states. stop: head, then worker (the
    worker then finds no head to wait for). start: nothing when both ranks are active; otherwise the whole ordered
    restart, since a rank started next to a live or orphaned peer hangs in the rendezvous (stopping a stopped rank
    costs nothing). A group of `size` ranks stops rank 0, then 1..N-1, and starts N-1..1, then rank 0; its
    `worker_state` speaks for all its ranks but the head (LivePair.worker)."""
    names = rank_names(size)
    stop = tuple((name, "stop") for name in names)
    restart = stop + tuple((name, "start") for name in reversed(names))
    if verb == "restart":
        return restart
    if verb == "stop":
        return stop
    if verb == "start":
        return () if (head_state, worker_state) == ("active", "active") else restart
    raise ValueError(f"pair verb {verb!r} is not one of start, stop, restart")


def put_back(done: Sequence[tuple[str, str]], plan: Sequence[tuple[str, str]] = RESTART_STEPS,
             ) -> tuple[tuple[str, str], ...]:
    """What to start again after the ordered steps of `plan` failed midway, given the steps that completed: every
    rank this run stopped and did not start again, in the order the plan starts them (worker, then head). Nothing
    when no rank was left stopped by the run, or when the plan only stops (a stop is meant to leave the ranks down)."""
    starts = [rank for rank, verb in plan if verb == "start"]
    if not starts:
        return ()
    stopped = [rank for rank, verb in done if verb == "stop"]
    started = {rank for rank, verb in done if verb == "start"}
    left = [rank for rank in starts if rank in stopped and rank not in started]
    return tuple((rank, "start") for rank in left)


# ---------------------------------------------------------------------------------------------------------------
# Pausing the guard: one marker file on the head, read by every guard run
# ---------------------------------------------------------------------------------------------------------------



@dataclass(frozen=True)
class Pause:
    reason: str
    by: str
    since: float | None
    # A pause taken for one run (a playbook's ordered restart) ends by itself at this unix time, so a run that dies
    # midway never leaves the pair without its guard; an operator's pause (`pair stop`, `pair pause`) has none.
    expires: float | None = None


def pause_record(reason: str, by: str, now: float, expires: float | None = None) -> bytes:
    record: dict[str, object] = {"reason": reason, "by": by, "since": now}
    if expires is not None:
        record["expires"] = expires
    return (json.dumps(record) + "\n").encode()


def pause_from_text(text: str) -> Pause:
    """The marker's content -> Pause. A marker that cannot be parsed still pauses: whoever wrote it meant to."""
    try:
        data = json.loads(text)
        return Pause(str(data["reason"]), str(data.get("by") or "?"),
                     float(data["since"]) if data.get("since") is not None else None,
                     float(data["expires"]) if data.get("expires") is not None else None)
    except (ValueError, KeyError, TypeError):
        return Pause("a pause marker that does not say why", "?", None)


def pause_expired(pause: Pause, now: float) -> bool:
    return pause.expires is not None and now >= pause.expires


def pause_line(pause: Pause, now: float) -> str:
    since = ("" if pause.since is None else
             f" since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(pause.since))} "
             f"({max(0.0, now - pause.since):.0f} s)")
    until = ("" if pause.expires is None else
             f", {'expired' if now >= pause.expires else 'ends by itself'} at "
             f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(pause.expires))}")
    return f"paused by {pause.by}{since}{until}: {pause.reason}"


def read_pause(path: str) -> Pause | None:
    """The pause marker, or None when the guard is not paused. A marker that is not a small regular file (a link,
    a FIFO) is refused by reading it as a pause that says so: the guard stays paused rather than guess."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Pause(f"the pause marker {path} cannot be looked at ({exc.strerror})", "?", None)
    try:
        return pause_from_text(safeio.read_bounded(path, MAX_HOLDER_BYTES).decode("utf-8", "replace"))
    except FileNotFoundError:
        return None
    except safeio.RefusedFile as exc:
        return Pause(f"the pause marker cannot be read ({exc})", "?", None)


def write_pause(path: str, reason: str, by: str, expires_in_s: float | None = None) -> None:
    now = time.time()
    expires = None if expires_in_s is None else now + expires_in_s
    atomic.write_atomic(path, pause_record(reason, by, now, expires), mode=0o600)


def remove_pause(path: str) -> Pause | None:
    """Remove the marker; what it said, or None when the guard was not paused."""
    pause = read_pause(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return pause


def start_ends_pause(pause: Pause, now: float) -> bool:
    """The one rule for when a pause ends: starting the pair (a playbook, `twinspark pair start|restart` by hand,
    the front door) ends the guard's pause, whoever took it (a stop, `pair pause`): a pair that serves is the guard's
    to watch. Only a playbook's pause for its own run, which carries an end time, outlives a start made inside that
    run; the playbook ends it when the run ends, or it ends by itself at that time."""
    return pause.expires is None or pause_expired(pause, now)


def guard_after_start(path: str, what: str) -> str | None:
    """After `what` (a start or restart that held the lifecycle lock, whatever its outcome) ran: end the guard's
    pause when `start_ends_pause` says so. The line said about the guard, or None when it was not paused."""
    pause = read_pause(path)
    if pause is None:
        return None
    now = time.time()
    if not start_ends_pause(pause, now):
        line = pause_line(pause, now)
        log(5, f"note: the pair guard is {line}; the run that took the pause ends it")
        return line
    try:
        remove_pause(path)
    except OSError as exc:
        line = pause_line(pause, now)
        log(4, f"note: the pair guard is still {line}: {what} could not end the pause ({exc.strerror or exc}); "
               "`twinspark pair resume` as root on the head")
        return line
    line = f"resumed by {what} (was {pause_line(pause, now)})"
    log(5, f"pair guard {line}")
    return line


# ---------------------------------------------------------------------------------------------------------------
# Running the steps on the pair: preflight, the ordered steps, put-back, the wait until it serves
# ---------------------------------------------------------------------------------------------------------------


def run_steps(pair: LivePair, steps: Sequence[tuple[str, str]], what: str = "ordered pair restart",
              unreached: list[int] | None = None) -> tuple[bool, str]:
    """Carry out `steps` in order: the head through systemctl, the worker through its forced command.

    Returns (ok, what was done). At the first step that fails (the worker unreachable, a systemctl or forced command
    failing) it stops and puts back what this run stopped (`put_back`: worker, then head), so a failure
    midway never leaves a rank down that was up before; the message says what was put back. A plan that only stops
    (`twinspark pair stop`) goes on to stop every other rank instead: a stop is meant to leave the ranks down, and one
    rank that cannot be reached must not keep the others running. `unreached` collects the number of every rank that
    could not be reached."""
    done: list[tuple[str, str]] = []
    problems: list[str] = []
    only_stops = all(verb == "stop" for _, verb in steps)
    for rank, verb in steps:
        log(5, f"{what}: {'stopping' if verb == 'stop' else 'starting'} {the(rank)}")
        problem = _step(pair, rank, verb)
        if problem and unreached is not None and isinstance(problem, Unreached):
            unreached.append(rank_number(rank))
        if problem and only_stops:
            problems.append(problem)
            continue
        if problem:
            said = ", ".join(_done_words(done))
            message = problem + (f" ({said})" if said else "")
            back = put_back(done, steps)
            if back:
                message += "; " + _put_back(pair, back, what)
            return False, message
        done.append((rank, verb))
    if problems:
        said = ", ".join(_done_words(done))
        return False, "; ".join(problems) + (f" ({said})" if said else "")
    return True, ", ".join(_done_words(done)) or "nothing to do"


class Unreached(str):
    """A step's problem that is the rank not answering at any of its addresses (not a command that failed)."""


def rank_number(rank: str) -> int:
    """A step's rank name as its number: the head 0, the worker 1, "rank r" r."""
    named = {HEAD: 0, WORKER: 1}
    return named[rank] if rank in named else int(rank.removeprefix("rank "))


def _done_words(done: Sequence[tuple[str, str]]) -> list[str]:
    return [f"{rank} {'stopped' if verb == 'stop' else 'started'}" for rank, verb in done]


def _step(pair: LivePair, rank: str, verb: str) -> str:
    """One step; '' when it worked, else why not. The head (or rank 0) through systemctl, the pair's worker through
    its forced command, a larger group's rank r through its own."""
    try:
        if rank in (HEAD, "rank 0"):
            pair.head(verb)
        elif rank == WORKER:
            if pair.worker(verb) is None:
                return Unreached(f"the worker could not be reached to {verb} it")
        elif pair.rank(int(rank.removeprefix("rank ")), verb) is None:
            return Unreached(f"{rank} could not be reached to {verb} it")
    except subprocess.CalledProcessError as exc:
        return f"systemctl {verb} of {the(rank)} failed (exit {exc.returncode}): {(exc.stderr or '').strip()}"
    except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
        return f"{the(rank)}'s {verb} failed: {exc}"
    return ""


def _put_back(pair: LivePair, steps: Sequence[tuple[str, str]], what: str) -> str:
    """Start again the ranks a failed run stopped; a line saying what came back and what could not."""
    said = []
    for rank, verb in steps:
        log(4, f"{what} failed midway: putting back {the(rank)} (starting it again)")
        problem = _step(pair, rank, verb)
        said.append(f"could not start {the(rank)} again: {problem}" if problem else f"{rank} started again")
    return "put back what this run stopped: " + ", ".join(said)


def preflight(pair: LivePair, steps: Sequence[tuple[str, str]]) -> str:
    """Before any step: prove each one can run. '' when they can, else the cause and its fix (nothing touched).

    The head's unit must be installed; a start must fit the node's memory (twinspark plan, unless
    TWINSPARK_PLAN_FIT=warn); where a step touches the worker, the guard's key must be one ssh accepts
    and the worker must answer its forced command at one of its addresses. Stopping the head of a pair whose worker
    cannot be reached would leave the pair down with no way to bring it back from here."""
    if not steps:
        return ""
    load = pair.head_props().get("LoadState", "loaded")  # a stand-in that does not say is taken as installed
    if load != "loaded":
        return (f"the head's {pair.unit} is not installed here (LoadState={load or 'unknown'}): "
                "run ansible-playbook site.yml; nothing was stopped")
    env = getattr(pair, "env", None)  # a stand-in without env files is not planned
    if env and any(verb == "start" for _, verb in steps):
        fit = planner.fit_here(env)
        if fit.warning:
            log(4, fit.warning)
        if fit.refusal:
            return fit.refusal + "; nothing was stopped"
    if all(rank in (HEAD, "rank 0") for rank, _ in steps):
        return ""
    problem = guard_key_problem(getattr(pair, "ssh_key", None))
    if problem:
        return problem + "; nothing was stopped"
    try:
        state = pair.worker("state")
    except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
        return f"the worker's forced command does not answer `state` ({exc}); nothing was stopped"
    if state is None and getattr(pair, "more_ranks", ()):
        who, _, _ = pair.peer_status()
        where = ", ".join(next(peer.addresses for peer in pair.peers() if rank_name(peer.rank, pair.size) == who))
        return (f"{who} of the group does not answer over SSH at {where} with the guard's key: check that it is up "
                f"and its sshd runs (ssh -i <key> <user>@<{who}> state on the head says why); nothing was stopped")
    if state is None:
        return (f"the worker does not answer over SSH at {', '.join(pair.worker_addresses)} with the guard's key: "
                "check that it is up and its sshd runs (ssh -i <key> <user>@<worker> state on the head says why); "
                "nothing was stopped")
    return ""


def wait_serving(pair: LivePair, ready_timeout_s: float, probe_timeout_s: float, poll_s: float = 0.5,
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
        props = pair.head_props()
        head_state = props.get("ActiveState", "unknown")
        if clock() >= next_worker:
            worker_state = pair.worker("state")
            next_worker = clock() + worker_every_s
        if head_state not in ("active", "activating") or worker_state not in ("active", "activating"):
            others = "worker" if getattr(pair, "size", 2) == 2 else "the other ranks"
            return False, (f"a rank left active while starting (head {head_state}, "
                           f"{others} {worker_state or 'unreachable'}); see journalctl -u twinspark-vllm -n 120 on "
                           f"{'both nodes' if others == 'worker' else 'every node'}")
        probe, detail = pair.probe(probe_timeout_s)
        waited = clock() - started
        if probe is Generation.OK:
            remember = getattr(pair, "remember_served", None)  # a stand-in pair keeps nothing
            if remember is not None:
                remember(props.get("InvocationID") or None)
            return True, f"serving again {waited:.0f} s after the head started ({detail})"
        if clock() >= deadline:
            return False, f"not serving {ready_timeout_s:.0f} s after the head started ({detail})"
        if clock() >= next_note:
            log(6, f"waiting for the pair: {waited:.0f} s of {ready_timeout_s:.0f} s ({detail})")
            next_note = clock() + 30
        sleep(poll_s)


def ordered_restart(pair: LivePair, ready_timeout_s: float, probe_timeout_s: float, poll_s: float = 0.5,
                    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                    ) -> tuple[bool, str]:
    """Stop head, stop worker, start worker, start head, then wait until the head answers a generation.

    Returns (ok, what happened). Gives up early when a rank's unit leaves `active` while waiting.
    """
    ok, done = run_steps(pair, steps("restart", size=getattr(pair, "size", 2)))
    if not ok:
        return False, done
    return wait_serving(pair, ready_timeout_s, probe_timeout_s, poll_s, clock, sleep)


# ---------------------------------------------------------------------------------------------------------------
# Start, stop, restart, pause: what `twinspark pair start|stop|restart|pause` do, under the lock
# ---------------------------------------------------------------------------------------------------------------


def drain_timeout(args: argparse.Namespace) -> float:
    return float(getattr(args, "drain_timeout", drain.DEFAULT_IDLE_TIMEOUT_S))


def _who() -> str:
    return os.environ.get("SUDO_USER") or os.environ.get("USER") or f"uid {os.getuid()}"


def stop_guard_run(timeout_s: float = 150.0) -> str:
    """End a guard run in progress (it may be in the middle of an ordered restart); '' or why it could not."""
    try:
        out = subprocess.run(["systemctl", "stop", guard_service()], capture_output=True, text=True,
                             timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemctl stop {guard_service()}: {exc}"
    if out.returncode not in (0, 5):  # 5: no such unit (the guard is not installed here)
        return f"systemctl stop {guard_service()}: exit {out.returncode}: {out.stderr.strip()}"
    return ""


def pause_guard(path: str, reason: str, expires_in_s: float | None = None) -> int:
    if expires_in_s is not None and expires_in_s <= 0:
        log(3, f"pair pause: --expires-in must be a number of seconds above 0 (got {expires_in_s:g})")
        return 2
    try:
        write_pause(path, reason, _who(), expires_in_s)
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
    log(5, f"pair guard {pause_line(Pause(reason, _who(), now, expires), now)}")
    return 0


def run_verb(args: argparse.Namespace, pair: LivePair, verb: str) -> int:
    """`twinspark pair start|stop|restart --no-wait`: the ordered steps under the lifecycle lock."""
    what = f"twinspark pair {verb}"
    if verb == "stop":  # an operator's stop must stay stopped: the guard would otherwise restart the pair at once
        code = pause_guard(args.pause_file, args.reason or f"the pair was stopped ({what})")
        if code == 2:
            return code
    result: dict[str, object] = {"verb": verb, "ok": False}
    ran = False
    try:
        with lifecycle_lock(args.lock_file, what, args.lock_timeout):
            ran = True
            if verb == "start":
                head_state = pair.head_props().get("ActiveState") or "unknown"
                worker_state = pair.worker("state")
                result.update(head_state=head_state, worker_state=worker_state)
                if worker_state is None:
                    raise RuntimeError("the worker cannot be reached over SSH: its rank can be neither checked nor "
                                       "started, and the head alone would hang in the rendezvous")
                plan = steps(verb, head_state, worker_state, getattr(pair, "size", 2))
            else:
                plan = steps(verb, size=getattr(pair, "size", 2))
            problem = preflight(pair, plan) if verb != "stop" else ""
            if problem:
                raise RuntimeError(problem)

            def work() -> drain.WorkResult:
                unreached: list[int] = []
                ok, done = run_steps(pair, plan, what, unreached)
                # worker_reached: every rank the plan touched answered (a pair's worker, a group's every rank);
                # unreached: the numbers of those that did not (playbooks/stop.yml names them).
                result.update(steps=[f"{rank} {step}" for rank, step in plan], done=done,
                              worker_reached=not unreached, unreached=unreached)
                waited = ok and verb != "stop" and not args.no_wait
                if waited:
                    ok, done = wait_serving(pair, args.ready_timeout, args.probe_timeout)
                    result["serving"] = done
                result["ok"] = ok
                return drain.WorkResult(served=ok and waited)

            # nothing to do (a start of a serving pair) touches nothing, so it leaves the router alone
            _, said = drain.drained(router_of(pair) if plan else None, work, log, lambda: pair.metrics(),
                                    drain_timeout(args), stopping=verb == "stop")
            if said:
                result["router"] = said
    except LockBusy as exc:
        result["error"] = str(exc)
    except LockError as exc:
        log(3, str(exc))
        return 2
    except (subprocess.SubprocessError, RuntimeError) as exc:
        result["error"] = f"{what}: {exc}"
    if verb != "stop" and ran:
        said = guard_after_start(args.pause_file, what)
        if said is not None:
            result["guard"] = said
    elif verb != "stop":
        pause = read_pause(args.pause_file)
        if pause is not None:
            result["guard"] = pause_line(pause, time.time())
    if args.json:
        print(json.dumps(result, indent=1))
    if result.get("error"):
        log(3, str(result["error"]))
    elif not result["ok"]:
        log(3, f"{what}: {result.get('serving') or result.get('done')}")
    else:
        log(5, f"{what}: {result.get('serving') or result.get('done')}")
    return 0 if result["ok"] else 1


# ---------------------------------------------------------------------------------------------------------------
# The kick as a rank's unit sends it: now, or once its main process ends
# ---------------------------------------------------------------------------------------------------------------


def kick_now(targets: Sequence[tuple[str, int]]) -> int:
    state = system_state()
    if not should_kick(state):
        log(6, f"pair kick: not sent, this node is shutting down (systemd: {state}); the guard's timer looks")
        return 0
    problems = kick(targets)
    for problem in problems:
        log(4, f"pair kick: {problem}; the guard's timer still looks within its interval")
    return 1 if problems else 0


def unit_job(unit: str) -> str:
    """`systemctl show -P Job UNIT`: '' when no job runs on it, 'unknown' when it cannot be asked (which counts as a
    stop asked, so nothing is killed on a guess)."""
    try:
        out = subprocess.run(["systemctl", "show", "--property=Job", "--value", unit], capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def watch_then_kick(pid: int, targets: Sequence[tuple[str, int]], detach: bool, unit: str | None = None) -> int:
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
    # Ignored while it watches; a watch that runs in its caller's process (no --detach) gives the caller its own
    # handling back when it returns, as a process started afterwards would inherit the ignore (systemd-socket-activate
    # and Popen children keep ignored signals across exec).
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = 0
    try:
        seen = wait_exit(pid)
        if seen in ("ended", "gone"):
            log(6, f"pair kick: the rank's main process {pid} {seen}; waking the guard")
            code = kick_now(targets)
            if unit and not stop_asked(unit_job(unit)):
                # Killed, crashed or exited after losing its peer: its leftovers would only wait out TimeoutStopSec=.
                killed = finish_the_kill(unit, log)
                if killed:
                    log(5, f"pair kick: no stop was asked of {unit}; killed its {len(killed)} leftover process(es) "
                           "now instead of after the stop timeout")
        else:
            log(4, f"pair kick: the rank's main process {pid}: {seen}; the unit's ExecStopPost= kick remains")
    finally:
        if detach:
            sys.stderr.flush()
            os._exit(code)
        signal.signal(signal.SIGTERM, previous)
    return code


# ---------------------------------------------------------------------------------------------------------------
# Does the pair need an ordered restart? (the serving role asks through its filter)
# ---------------------------------------------------------------------------------------------------------------


def restart_reasons(probes, flag_path="restart-pending", unit="the rank's unit"):
    """Why the pair needs an ordered restart, one line per reason; empty when it does not.

    `probes` is the registered result of a loop over the nodes (`item` = host name) of twinspark_probe reading the
    rank's unit (`unit`, twinspark_layout_unit_vllm) and the restart flag (`flag_path`). A node whose answer lacks
    either counts as needing the restart, never as fine.
    """
    reasons = []
    for result in probes.get("results", []):
        state = ((result.get("units") or {}).get(unit) or {}).get("active") or "unknown"
        if state != "active":
            reasons.append(f"{result['item']}: {unit} is {state}")
    for result in probes.get("results", []):
        flag = (result.get("paths") or {}).get(flag_path)
        if flag is None or flag.get("exists"):
            reasons.append(f"{result['item']}: {flag_path} (what vLLM runs changed)"
                           if flag is not None else f"{result['item']}: {flag_path} could not be read")
    return reasons
