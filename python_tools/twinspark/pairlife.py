"""The pair's lifecycle on the head: the guard's wake-up kick, and (below) what every start and stop shares.

The kick. A rank that stops for any reason (killed, crashed, lost its peer and exited with status 0, stopped by
someone) runs `twinspark pair kick` from its unit's `ExecStop=`: one UDP datagram carrying a fixed token to the
head. On the head, `twinspark-pair-guard-kick.socket` listens for it (loopback for the head's own rank, the head's
fabric address for the worker's) and activates `twinspark-pair-guard.service`, which inherits the socket, reads
every datagram waiting in it (`KickInbox.drain`) and then looks at the pair as it always does. A datagram means
only "look now": its content is never interpreted beyond comparing it with the token, the guard's own rules decide
what to do, and no datagram can make it do anything a timer run would not. Kicks that arrive while a run is going
on stay queued; systemd starts one more run when the current one ends, and that run drains them all, so a burst
of kicks costs at most one extra run. The timer stays as the safety net (a lost datagram, a socket not running).

Rules (`summarize`, `listen_fds`, `trigger_line`, `parse_target`) are pure; sockets sit in `KickInbox` and `kick`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from twinspark import layout

KICK_TOKEN = b"twinspark-pair-guard-kick/1\n"
KICK_SOCKET = layout.current().unit_pair_guard_kick
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


def listen_fds(environ: Mapping[str, str], pid: int, name: str = KICK_SOCKET) -> list[int]:
    """The descriptors systemd passed to this process for the socket unit `name` (sd_listen_fds(3) protocol).

    None when LISTEN_PID names another process (the variables were inherited, not meant for us); when
    LISTEN_FDNAMES is set, only the descriptors carrying `name`."""
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
    return f"run without the kick socket (is {KICK_SOCKET} running?){extra}"


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
    import signal

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
    import select

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
    import subprocess

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

DEFAULT_CONTROL_DIR = layout.current().control_dir  # root-only (0700), made by roles vllm_runtime and vllm_service
DEFAULT_LOCK_FILE = f"{DEFAULT_CONTROL_DIR}/pair.lock"
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


def steps(verb: str, head_state: str | None = None, worker_state: str | None = None) -> tuple[tuple[str, str], ...]:
    """The ordered steps of `twinspark pair start|stop|restart`, given the ranks' ActiveState.

    restart: stop head, stop worker, start worker, start head, whatever the states. stop: head, then worker (the
    worker then finds no head to wait for). start: nothing when both ranks are active; otherwise the whole ordered
    restart, since a rank started next to a live or orphaned peer hangs in the rendezvous (stopping a stopped rank
    costs nothing)."""
    if verb == "restart":
        return RESTART_STEPS
    if verb == "stop":
        return STOP_STEPS
    if verb == "start":
        return () if (head_state, worker_state) == ("active", "active") else RESTART_STEPS
    raise ValueError(f"pair verb {verb!r} is not one of start, stop, restart")


def put_back(done: Sequence[tuple[str, str]], plan: Sequence[tuple[str, str]] = RESTART_STEPS,
             ) -> tuple[tuple[str, str], ...]:
    """What to start again after the ordered steps of `plan` failed midway, given the steps that completed: every
    rank this run stopped and did not start again, worker first (the order a pair comes up in). Nothing when no rank
    was left stopped by the run, or when the plan only stops (a stop is meant to leave the ranks down)."""
    if not any(verb == "start" for _, verb in plan):
        return ()
    stopped = [rank for rank, verb in done if verb == "stop"]
    started = {rank for rank, verb in done if verb == "start"}
    left = [rank for rank in (WORKER, HEAD) if rank in stopped and rank not in started]
    return tuple((rank, "start") for rank in left)


def key_problem(mode: int, owner_uid: int, caller_uid: int, path: str) -> str | None:
    """Why ssh would refuse the guard's private key (its st_mode and owner), with the fix; None when it would not.

    ssh ignores a private key that its group or others may read or write ("UNPROTECTED PRIVATE KEY FILE"), and one
    not owned by the user running it; a restart that depends on that key could then stop the head and never reach
    the worker."""
    if owner_uid != caller_uid:
        return (f"the guard's SSH key {path} is owned by uid {owner_uid}, not uid {caller_uid} who runs ssh: "
                f"chown root:root {path} (ansible-playbook site.yml does)")
    if mode & 0o077:
        return (f"the guard's SSH key {path} has mode {mode & 0o777:04o}, which ssh refuses for a private key: "
                f"chmod 600 {path} (ansible-playbook site.yml does)")
    return None


# ---------------------------------------------------------------------------------------------------------------
# Pausing the guard: one marker file on the head, read by every guard run
# ---------------------------------------------------------------------------------------------------------------

DEFAULT_PAUSE_FILE = f"{DEFAULT_CONTROL_DIR}/pair-guard.paused"
GUARD_SERVICE = layout.current().unit_pair_guard


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
    from twinspark import safeio

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
    from twinspark import atomic

    now = time.time()
    expires = None if expires_in_s is None else now + expires_in_s
    atomic.write_atomic(path, pause_record(reason, by, now, expires), mode=0o600)


def remove_pause(path: str) -> Pause | None:
    """Remove the marker; what it said, or None when the guard was not paused."""
    pause = read_pause(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return pause
