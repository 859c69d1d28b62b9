"""The pair as the head sees it: its own rank's unit through systemctl, the worker's rank through its forced SSH
command, the head's API through twinspark.api, and the fabric in sysfs and over one TCP connect.

`LivePair` is the one I/O class the guard and the lifecycle commands act through (tests stand in for it with the same
methods); the rules that judge what it sees are pure and live in twinspark.pair.rules.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from twinspark import api as head_api
from twinspark import atomic, systemd
from twinspark.fabric import sysfs
from twinspark.fleet import drain
from twinspark.pair.rules import (
    FABRIC_PROBE_PORT,
    NO_OTHER_RANK,
    Api,
    Generation,
    GuardState,
    Observation,
    Policy,
    Sample,
    Served,
    active_for_s,
    classify_probe,
    connect_problem,
    fabric_problem,
    head_replaced_since_served,
    probe_plan,
    rank_name,
    rank_unit,
    sample_from_metrics,
    served_from_json,
    served_to_json,
    track,
    warm,
    worker_status,
)

DEFAULT_SSH_KEY = "/etc/twinspark/pair-guard/id_ed25519"
DEFAULT_KNOWN_HOSTS = "/etc/twinspark/pair-guard/known_hosts"

# What the worker's forced SSH command accepts (roles/pair_guard/templates/twinspark-peer-control.j2). `state-since`
# is `state` with the rank's age; an older worker refuses it, and the guard then asks `state`.
PEER_VERBS = ("state", "state-since", "stop", "start")

# A group of one (LivePair.alone) has no other rank: what its `worker`/`peer_status` say for the ranks it lacks
# (rules.NO_OTHER_RANK is the name they go by).
ALONE_STATE = "active"

# Beside the guard's state file: the head's rank the pair last served with (rules.Served). Kept apart from the
# state file because `twinspark pair start|restart` writes it too, and only the guard writes its state.
SERVED_FILE_NAME = "served-head.json"


def log(priority: int, message: str) -> None:
    """One line to stderr; under systemd the `<N>` prefix sets the journal priority (3 error, 4 warning, 6 info)."""
    prefix = f"<{priority}>" if os.environ.get("JOURNAL_STREAM") else ""
    print(f"{prefix}{message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Rank:
    """A rank of a group of three or more beyond its worker (rank 1): its number and the addresses its forced command
    answers at, tried in order (fabric first, then management), as --worker gives them for rank 1."""

    rank: int
    addresses: tuple[str, ...]


@dataclass
class LivePair:
    """The real pair: the head's unit through systemctl, the worker's through its forced SSH command, the API."""

    api: Api
    worker_addresses: Sequence[str]
    ssh_user: str = "root"
    ssh_key: str = DEFAULT_SSH_KEY
    known_hosts: str = DEFAULT_KNOWN_HOSTS
    ssh_timeout_s: float = 10.0
    unit: str = field(default_factory=rank_unit)
    router: drain.Router | None = None  # the fleet's router, when the env files name one (twinspark.fleet.drain)
    fabric_ifnames: Sequence[str] = ()  # this node's fabric interfaces (NCCL_SOCKET_IFNAME), read in sysfs
    fabric_peer: str | None = None  # the worker's fabric address (WORKER_HOST), knocked on over TCP
    class_net: Path = sysfs.CLASS_NET
    fabric_port: int = FABRIC_PROBE_PORT
    fabric_timeout_s: float = 1.5
    env: Mapping[str, str] = field(default_factory=dict)  # the head's env files: the planner judges a start with them
    served_file: str | None = None  # where the head's rank the pair last served with is kept (SERVED_FILE_NAME)
    more_ranks: Sequence[Rank] = ()  # a group of three or more: ranks 2..N-1 (the worker is rank 1)
    alone: bool = False  # a group of one (a single Spark, `--alone`): rank 0 and no other rank

    @property
    def size(self) -> int:
        """How many ranks the group has: 2 for a pair, 1 for a single Spark."""
        return 1 if self.alone else 2 + len(self.more_ranks)

    def peers(self) -> list[Rank]:
        """Every rank but the head, in rank order: the worker (rank 1), then the group's other ranks; none alone."""
        if self.alone:
            return []
        return [Rank(1, tuple(self.worker_addresses)), *sorted(self.more_ranks, key=lambda peer: peer.rank)]

    # -- head (local) --
    def head_props(self) -> dict[str, str]:
        out = subprocess.run(systemd.show_argv(self.unit, ("ActiveState", "ActiveEnterTimestampMonotonic",
                                                           "LoadState", "InvocationID")),
                             capture_output=True, text=True, timeout=30, check=False)
        return systemd.parse_show(out.stdout)

    def head(self, verb: str) -> None:
        subprocess.run(["systemctl", verb, self.unit], check=True, timeout=120, capture_output=True, text=True)

    # -- the head's rank the pair last served with --
    def served(self) -> Served | None:
        """The record `remember_served` keeps; None when there is none or it cannot be read (then the ranks' ages
        alone tell a head restarted alone)."""
        if not self.served_file:
            return None
        try:
            return served_from_json(json.loads(Path(self.served_file).read_text()))
        except (FileNotFoundError, PermissionError):  # none yet, or a look by an account other than root
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log(4, f"ignoring unreadable {self.served_file} ({exc})")
            return None

    def remember_served(self, head_invocation: str | None = None) -> None:
        """Keep the head's rank that just served (its InvocationID, read now when not given) and the time, unless it
        is already the one kept. Never fails the caller: without the record the guard falls back on the ranks' ages."""
        if not self.served_file:
            return
        invocation = head_invocation if head_invocation is not None else self.head_props().get("InvocationID", "")
        if not invocation:
            return
        kept = self.served()
        if kept is not None and kept.head_invocation == invocation:
            return
        text = json.dumps(served_to_json(Served(invocation, time.time()))) + "\n"
        try:
            Path(self.served_file).parent.mkdir(parents=True, exist_ok=True)
            atomic.write_atomic(Path(self.served_file), text.encode("utf-8"), mode=0o600)
        except PermissionError:  # `pair check` by an account other than root: only root's runs keep it
            return
        except OSError as exc:
            log(4, f"cannot keep the serving head's rank in {self.served_file} ({exc.strerror or exc})")

    # -- worker (SSH, forced command) --
    def worker(self, verb: str) -> str | None:
        """Run `verb` through the worker's forced command; its stdout, or None when no address answers.

        In a group of three or more it speaks for every rank but the head: `state` and `state-since` answer for the
        first rank that is not active (None when one cannot be reached), else for the youngest rank (`peer_status`);
        a start or stop goes to one rank at a time (`rank`), never to all at once.

        A group of one has no other rank: `state` answers "active" for the ranks it does not have (none of them is
        down), so every rule that waits on "the other ranks" judges rank 0 alone; a start or stop has no one to go to.
        """
        if self.alone:
            if verb not in ("state", "state-since"):
                raise ValueError(f"a group of one has no other rank to {verb}")
            return ALONE_STATE
        if not self.more_ranks:
            return self.rank(1, verb)
        if verb not in ("state", "state-since"):
            raise ValueError(f"a group's ranks are started and stopped one at a time, not with worker({verb!r})")
        return self._group_answer(verb)[1]

    def rank(self, number: int, verb: str) -> str | None:
        """Run `verb` through rank `number`'s forced command; its stdout, or None when no address answers."""
        if verb not in PEER_VERBS:
            raise ValueError(f"peer verb {verb!r} is not one of {', '.join(PEER_VERBS)}")
        found = [peer for peer in self.peers() if peer.rank == number]
        if not found:
            raise ValueError(f"rank {number} is not one of this group's ranks 1..{self.size - 1}")
        who = rank_name(number, self.size)
        for address in found[0].addresses:
            argv = ["ssh", "-i", self.ssh_key, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                    "-o", f"ConnectTimeout={int(self.ssh_timeout_s)}", "-o", "StrictHostKeyChecking=yes",
                    "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "LogLevel=ERROR",
                    f"{self.ssh_user}@{address}", verb]
            try:
                out = subprocess.run(argv, capture_output=True, text=True, check=False,
                                     timeout=self.ssh_timeout_s + 120)
            except subprocess.TimeoutExpired:
                log(4, f"{who} {address}: `{verb}` timed out")
                continue
            if out.returncode == 255:  # ssh's own failure: try the next address
                log(4, f"{who} {address} unreachable over SSH: {out.stderr.strip() or 'no answer'}")
                continue
            if out.returncode != 0:
                raise RuntimeError(f"{who} {address}: `{verb}` failed (exit {out.returncode}): "
                                   f"{out.stderr.strip() or out.stdout.strip()}")
            return out.stdout.strip()
        return None

    def _group_answer(self, verb: str) -> tuple[str, str | None]:
        """Ask every rank but the head `verb` (state or state-since), in rank order: (whose answer, the answer)."""
        answers: list[tuple[str, str]] = []
        for peer in self.peers():
            name = rank_name(peer.rank, self.size)
            text = self.rank(peer.rank, verb)
            if text is None:
                return name, None
            answers.append((name, text))
        judged = [(name, text, *worker_status(text)) for name, text in answers]
        for name, text, state, _ in judged:
            if state != "active":
                return name, text
        aged = [item for item in judged if item[3] is not None]
        name, text, _, _ = min(aged, key=lambda item: item[3]) if aged else judged[0]
        return name, text

    def peer_status(self) -> tuple[str, str | None, float | None]:
        """(whose, ActiveState, seconds active) of the worker, or in a larger group of the first rank that is not
        active, else of the youngest; the state None when that rank cannot be reached, the age None when unknown.
        A group of one: no other rank, none of them down."""
        if self.alone:
            return NO_OTHER_RANK, ALONE_STATE, None
        if not self.more_ranks:
            return (rank_name(1),) + self.worker_status()
        try:
            name, text = self._group_answer("state-since")
        except RuntimeError:  # an older forced command refuses the verb: ask what they know
            name, text = self._group_answer("state")
            return name, text, None
        if text is None:
            return name, None, None
        return (name,) + worker_status(text)

    def worker_status(self) -> tuple[str | None, float | None]:
        """The worker's ActiveState and how long its rank has been active (None: unreachable, or an older forced
        command that only says the state); in a larger group, as `peer_status` judges its ranks."""
        if self.more_ranks or self.alone:
            return self.peer_status()[1:]
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
        then whether the peer's fabric address answers a TCP connect (in a group, every other rank's)."""
        links = []
        for name in self.fabric_ifnames:
            try:
                links.append(sysfs.read_link(name, self.class_net, addresses=lambda _name: []))
            except (OSError, ValueError, sysfs.SysfsError) as exc:
                log(4, f"pair guard: cannot look at fabric interface {name} ({exc}); judging without it")
        local = fabric_problem(links, None)
        peers = [address for address in dict.fromkeys([self.fabric_peer, *(peer.addresses[0] for peer in
                                                                              self.more_ranks if peer.addresses)])
                 if address]
        if local or not peers:
            return local
        # A group: every rank's fabric address (the first --rank address of each), so a link down anywhere in the
        # group holds the restart back, not only rank 0's own.
        said = [problem for problem in (peer_problem(address, self.fabric_port, self.fabric_timeout_s)
                                        for address in peers) if problem]
        return fabric_problem((), "; ".join(said) or None)

    def exec_start(self) -> str:
        """The head's rank unit's ExecStart, as `systemctl show` says it ('' when it cannot be asked)."""
        try:
            out = subprocess.run(["systemctl", "show", self.unit, "--property=ExecStart", "--value"],
                                 capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout if out.returncode == 0 else ""

    # -- the API --
    def probe(self, timeout_s: float) -> tuple[Generation, str]:
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
        worker_name, worker_state, worker_for = self.peer_status()
        active_for = active_for_s(props, time.monotonic())
        probe, detail = Generation.SKIPPED, ""
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
                if probe is Generation.TIMEOUT and policy is not None:
                    samples.append(self.sample(policy.metrics_timeout_s))
        # Only a pair that does not serve needs the look (and the worker's sshd sees no connect from a healthy one).
        fabric = self.fabric() if probe is not Generation.OK else None
        invocation = props.get("InvocationID") or ""
        alone = None
        if probe is not Generation.OK and head_state == "active":
            alone = head_replaced_since_served(self.served(), invocation, worker_for, time.time())
        return Observation(head_state, worker_state, probe, detail, active_for, tuple(samples),
                           worker_active_for_s=worker_for, fabric_down=fabric, head_invocation=invocation,
                           head_alone_s=alone, worker_name=worker_name)


def peer_problem(address: str, port: int, timeout_s: float) -> str | None:
    """Knock on the peer's fabric address over TCP (the guard's unit may open no raw socket, so no ping): None when
    it answered (connected or refused), else why not."""
    error: OSError | None = None
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            pass
    except OSError as exc:
        error = exc
    return connect_problem(address, port, error, timeout_s)


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
    return key_problem(info.st_mode, info.st_uid, os.geteuid(), key)


def router_of(pair: LivePair) -> drain.Router | None:
    """The pair's router; a pair-like object without one (a stand-in) has none, like a pair without a router."""
    return getattr(pair, "router", None)
