"""Which pairs an inventory holds, and what is wrong with them as a fleet: pure rules over groups and host vars.

The layout (docs/FLEET.md, "Inventory"):
  * One pair, as before: hosts in `twinspark_head` and `twinspark_worker`, no `twinspark_pair_name` anywhere. The
    pair is called `twinspark_pair` (the group the one-pair inventories already have) and nothing else changes.
  * Several pairs: each pair is an inventory group of its own (its name is the pair's name, so `--limit pair_a`
    means that pair) holding its two hosts and the group variable `twinspark_pair_name: <the group's name>`; each
    host is also in `twinspark_head` or `twinspark_worker` as before.
  * The pair groups sit under the group `twinspark_pair`, the group every node play targets (one-pair inventories
    have it already), so one site.yml run provisions every pair; the router is not in it.
  * A router: hosts in `twinspark_router`. It fronts every pair, or the pairs named in `twinspark_router_pairs`.

`own_pair(host, host_vars, groups)` is the one rule that tells a node which pair it belongs to (its head, worker and
both hosts); the roles read it through the filter twinspark_own_pair.

`problems(host_vars, groups)` returns one line per problem, each naming the host, group or variable and the fix.
Only the fleet's own rules live here; each pair's settings are still checked by nodeenv.pair_envs, pair by pair
(`pair_groups` gives the two-host view it expects).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinspark import api, group, layout, nodeenv

HEAD_GROUP = "twinspark_head"
WORKER_GROUP = "twinspark_worker"
ROUTER_GROUP = "twinspark_router"
SINGLE_PAIR = "twinspark_pair"
PAIR_VAR = "twinspark_pair_name"
ROUTER_PAIRS_VAR = "twinspark_router_pairs"
API_PORT_VAR = "twinspark_vllm_port"
ROUTER_PORT_VAR = "twinspark_router_port"
ROUTER_METRICS_PORT_VAR = "twinspark_router_metrics_port"
ROUTER_ADMIN_PORT_VAR = "twinspark_router_admin_port"
# Where the controller keeps the router's certificate (role router fetches it there), for its own admin calls
# (`twinspark health`'s router view, the drills): the router host's variable, else controller_router_ca's default.
ROUTER_CA_FILE_VAR = "twinspark_router_ca_file"
FABRIC_ADDRESS_VAR = "twinspark_fabric_address"
# Drain before touch (docs/FLEET.md): the router in front of a pair, and the pair's head as that router lists it.
ROUTER_URL_VAR = "twinspark_router_url"
ROUTER_PAIR_URL_VAR = "twinspark_router_pair_url"
API_ALLOWED_VAR = "vllm_service_api_allowed_networks"
ADMIN_KEY_VAR = "twinspark_router_admin_key"
CLIENT_KEY_VAR = "twinspark_vllm_api_key"
DEFAULT_ROUTER_PORT = int(layout.default().router_port)
DEFAULT_ROUTER_METRICS_PORT = int(layout.default().router_metrics_port)
DEFAULT_ROUTER_ADMIN_PORT = int(layout.default().router_admin_port)
RESERVED = frozenset({"all", "ungrouped", HEAD_GROUP, WORKER_GROUP, ROUTER_GROUP, SINGLE_PAIR})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class FleetPair:
    name: str
    head: str
    worker: str
    more: tuple[str, ...] = ()  # a group of three or more (docs/GROUPS.md): ranks 2..N-1, in rank order

    @property
    def hosts(self) -> list[str]:
        """The pair's hosts, head first (a group's in rank order); a partial one-pair inventory (see own_pair) lists
        only those it has."""
        return [host for host in (self.head, self.worker, *self.more) if host]


def group_of(host_vars: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]]) -> group.Group | None:
    """The inventory's group (docs/GROUPS.md: its nodes in inventory group twinspark_group, rank 0 also in
    twinspark_head, the other ranks in twinspark_worker); None on a pair or fleet inventory."""
    members = _members(groups, group.GROUP_GROUP)
    return group.read(group.GROUP_GROUP, members, host_vars, groups) if members else None


def group_placement_problems(found: group.Group, groups: Mapping[str, Sequence[str]]) -> list[str]:
    """Where a group's ranks sit: rank 0 alone in twinspark_head, every other rank in twinspark_worker, as the plays
    that act on the head (start, stop, health) and on the headless ranks expect."""
    if found.problems or not found.ranks:
        return []
    heads, workers = _members(groups, HEAD_GROUP), _members(groups, WORKER_GROUP)
    lines = []
    if heads != [found.ranks[0]]:
        lines.append(f"group {HEAD_GROUP}: must hold exactly rank 0 of group {group.GROUP_GROUP}, "
                     f"{found.ranks[0]}; it holds {', '.join(heads) or 'none'}. Fix the inventory's hosts.yml")
    if sorted(workers) != sorted(found.ranks[1:]):
        lines.append(f"group {WORKER_GROUP}: must hold every other rank of group {group.GROUP_GROUP} "
                     f"({', '.join(found.ranks[1:]) or 'none'}); it holds {', '.join(workers) or 'none'}. Fix the "
                     "inventory's hosts.yml")
    return lines


def _members(groups: Mapping[str, Sequence[str]], name: str) -> list[str]:
    return list(groups.get(name) or [])


def is_fleet(host_vars: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]]) -> bool:
    """Whether the inventory names its pairs (some head or worker has twinspark_pair_name)."""
    nodes = _members(groups, HEAD_GROUP) + _members(groups, WORKER_GROUP)
    return any(host_vars.get(host, {}).get(PAIR_VAR) not in (None, "") for host in nodes)


def pair_groups(pair: FleetPair) -> dict[str, list[str]]:
    """The groups view of one pair alone, as the one-pair rules read it."""
    return {HEAD_GROUP: [pair.head], WORKER_GROUP: [pair.worker], "all": [pair.head, pair.worker]}


def _address(host: str, host_vars: Mapping[str, Any]) -> str:
    return str(host_vars.get("ansible_host") or host)


def _port(host_vars: Mapping[str, Any], var: str, default: int) -> int | None:
    value = host_vars.get(var, default)
    try:
        return int(str(value))
    except ValueError:
        return None


def pairs(host_vars: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]]) -> tuple[list[FleetPair],
                                                                                                   list[str]]:
    """The well-formed pairs and the problems of the rest (pair membership rules only). A group inventory is its one
    group (docs/GROUPS.md), when its ranks are read and placed well (validation says what is wrong otherwise)."""
    found_group = group_of(host_vars, groups)
    if found_group is not None:
        ranks = list(found_group.ranks)
        if not ranks or found_group.problems or group_placement_problems(found_group, groups):
            return [], []
        # a single Spark (a group of one) has no worker: "" (FleetPair.hosts leaves it out)
        return [FleetPair(group.GROUP_GROUP, ranks[0], ranks[1] if len(ranks) > 1 else "", tuple(ranks[2:]))], []
    heads, workers = _members(groups, HEAD_GROUP), _members(groups, WORKER_GROUP)
    if not is_fleet(host_vars, groups):
        if len(heads) == 1 and len(workers) == 1 and heads != workers:
            return [FleetPair(SINGLE_PAIR, heads[0], workers[0])], []
        return [], []  # the one-pair rules (group_problems) say what is wrong, as they always have
    problems: list[str] = []
    names: dict[str, list[str]] = {}
    for host in dict.fromkeys(heads + workers):
        name = host_vars.get(host, {}).get(PAIR_VAR)
        if name in (None, ""):
            problems.append(f"{host}: is a head or worker but has no {PAIR_VAR}; once one pair is named every pair "
                            f"must be: put {host} in its pair's group and set {PAIR_VAR} there")
            continue
        names.setdefault(str(name), []).append(host)
    for name in sorted(names):
        if not _NAME.match(name) or name in RESERVED:
            problems.append(f"{PAIR_VAR}: {name!r} cannot name a pair; use a plain group name (letters, digits, _) "
                            f"other than {', '.join(sorted(RESERVED))}")
        elif name not in groups:
            problems.append(f"pair {name}: no inventory group is called {name}; make the pair a group of that name "
                            "holding its head and worker (so --limit {name} means the pair)".replace("{name}", name))
        elif sorted(_members(groups, name)) != sorted(names[name]):
            strays = sorted(set(_members(groups, name)) ^ set(names[name]))
            problems.append(f"pair {name}: group {name} and the hosts whose {PAIR_VAR} is {name} differ "
                            f"({', '.join(strays)}); set {PAIR_VAR} as a group variable of group {name} only")
    # a node in two pairs: member of two pair groups (group variables let only one of the names win)
    for host in dict.fromkeys(heads + workers):
        inside = sorted(name for name in names if host in _members(groups, name))
        if len(inside) > 1:
            problems.append(f"{host}: is in two pairs ({', '.join(inside)}); a node belongs to exactly one pair, "
                            "remove it from all but one of those groups")
    found: list[FleetPair] = []
    for name in sorted(names):
        members = names[name]
        pair_heads = [h for h in members if h in heads]
        pair_workers = [h for h in members if h in workers]
        broken = False
        for role, role_group, chosen in (("head", HEAD_GROUP, pair_heads), ("worker", WORKER_GROUP, pair_workers)):
            if len(chosen) != 1:
                broken = True
                problems.append(f"pair {name}: has {len(chosen)} {role}s ({', '.join(chosen) or 'none'}); it needs "
                                f"exactly one host that is both in group {name} and in {role_group}")
        both = sorted(set(pair_heads) & set(pair_workers))
        if both:
            broken = True
            problems.append(f"pair {name}: {', '.join(both)} is in both {HEAD_GROUP} and {WORKER_GROUP}; the head "
                            "and the worker must be two different hosts")
        if not broken:
            found.append(FleetPair(name, pair_heads[0], pair_workers[0]))
    return found, problems


def own_pair(host: str, host_vars: Mapping[str, Mapping[str, Any]],
             groups: Mapping[str, Sequence[str]]) -> FleetPair | None:
    """The pair `host` belongs to. On a fleet inventory: the well-formed pair (pairs()) holding it, None when no such
    pair holds it. On a one-pair inventory: the one pair, named SINGLE_PAIR (nodeenv.pair_hosts); when its groups are
    not exactly one head and one worker (a role run on one host, say), the first host of each group, "" for an empty
    one, exactly as the roles always read it: playbooks/validate.yml and the roles' asserts name what is wrong. On a
    group inventory (group_of): the group, named twinspark_group, its rank 0 as head, rank 1 as worker and ranks
    2..N-1 as `more`; None for a host outside it."""
    found = group_of(host_vars, groups)
    if found is not None:
        ranks = list(found.ranks)
        if host not in ranks:
            return None
        return FleetPair(group.GROUP_GROUP, ranks[0], ranks[1] if len(ranks) > 1 else "", tuple(ranks[2:]))
    if not is_fleet(host_vars, groups):
        if not nodeenv.group_problems(groups):
            return FleetPair(SINGLE_PAIR, *nodeenv.pair_hosts(groups))
        heads, workers = _members(groups, HEAD_GROUP), _members(groups, WORKER_GROUP)
        return FleetPair(SINGLE_PAIR, heads[0] if heads else "", workers[0] if workers else "")
    return next((pair for pair in pairs(host_vars, groups)[0] if host in (pair.head, pair.worker)), None)


def placement_problems(host_vars: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]]) -> list[str]:
    """Where pair nodes and routers sit: on a fleet every pair node is in group twinspark_pair (the group the node
    plays target, so one site.yml run reaches every pair); on any inventory a router is not."""
    lines: list[str] = []
    inside = set(_members(groups, SINGLE_PAIR))
    if is_fleet(host_vars, groups):
        for pair in pairs(host_vars, groups)[0]:
            lines += [f"{host}: is a node of pair {pair.name} but not in group {SINGLE_PAIR}, so no node play reaches "
                      f"it; put the pair groups under {SINGLE_PAIR} (children of {SINGLE_PAIR} in hosts.yml)"
                      for host in (pair.head, pair.worker) if host not in inside]
    lines += [f"{router}: is in {ROUTER_GROUP} and in {SINGLE_PAIR}, so the node plays would run on the router; "
              f"keep the router beside the pair groups, out of {SINGLE_PAIR}"
              for router in _members(groups, ROUTER_GROUP) if router in inside]
    return lines


def router_pairs(router_vars: Mapping[str, Any], known: Sequence[FleetPair]) -> tuple[list[FleetPair], list[str]]:
    """The pairs one router fronts, and the problems of its twinspark_router_pairs."""
    chosen = router_vars.get(ROUTER_PAIRS_VAR)
    if chosen is None:
        return list(known), []
    if isinstance(chosen, str) or not isinstance(chosen, Sequence):
        return [], [f"{ROUTER_PAIRS_VAR}: must be a list of pair names, got {type(chosen).__name__}"]
    by_name = {pair.name: pair for pair in known}
    unknown = [str(name) for name in chosen if str(name) not in by_name]
    problems = [f"{ROUTER_PAIRS_VAR}: {', '.join(unknown)} is not a pair of this inventory (pairs: "
                f"{', '.join(by_name) or 'none'})"] if unknown else []
    return [by_name[str(name)] for name in chosen if str(name) in by_name], problems


def head_url(head: Mapping[str, Any], name: str) -> str:
    """A pair's head API as the router lists it: http(s)://<ansible_host or name>:<API port>, the port as the head's
    env file will carry it (twinspark_vllm_port through nodeenv, else the registry's default) and https when the
    head serves TLS: the same URL `twinspark health` and bench build from the inventory (twinspark.api.base_url).
    Raises ValueError naming twinspark_vllm_port when it is not a port."""
    port = nodeenv.head_setting(head, "VLLM_PORT") or api.default_port()
    return api.base_url(str(head.get("ansible_host") or name), port, tls=api.tls_ca_from_inventory(head) is not None)


def router_url(router: Mapping[str, Any], name: str) -> str:
    """The router's own base URL, as clients (and `twinspark health`) reach it."""
    return _router_base(router, name, "http", ROUTER_PORT_VAR, DEFAULT_ROUTER_PORT)


def router_admin_url(router: Mapping[str, Any], name: str) -> str:
    """The router front's admin listener (TLS, issue 43 row 8), where the admin key goes and nowhere else."""
    return _router_base(router, name, "https", ROUTER_ADMIN_PORT_VAR, DEFAULT_ROUTER_ADMIN_PORT)


def _router_base(router: Mapping[str, Any], name: str, scheme: str, var: str, default: int) -> str:
    address = str(router.get("ansible_host") or name)
    port = int(str(router.get(var, default)))
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


def controller_router_ca(router: Mapping[str, Any], name: str, home: str | None = None) -> str:
    """Where the controller keeps router `name`'s certificate (role router fetches it after making it): its
    twinspark_router_ca_file, else ~/.cache/twinspark/routers/<name>.pem of the account that runs Ansible."""
    chosen = str(router.get(ROUTER_CA_FILE_VAR) or "").strip()
    if chosen:
        return chosen
    return str(Path(home or Path.home()) / ".cache" / "twinspark" / "routers" / f"{name}.pem")


def drain_heads(host_vars: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]],
                router: str) -> list[str]:
    """The heads whose drain goes to `router` (drain_defaults, or a URL set by hand that names it): each gets the
    router's admin listener (its URL and certificate, the drain's only trust anchor; issue 43 row 8)."""
    found, _ = pairs(host_vars, groups)
    fronted, _ = router_pairs(host_vars.get(router, {}), found)
    mine = router_url(host_vars.get(router, {}), router)
    heads = []
    for pair in fronted:
        head_vars = host_vars.get(pair.head, {})
        url = head_vars.get(ROUTER_URL_VAR)
        url = drain_defaults(pair.head, host_vars, groups).get(ROUTER_URL_VAR) if url is None else str(url)
        if url and url.rstrip("/") == mine:
            heads.append(pair.head)
    return heads


def admin_record(router: Mapping[str, Any], name: str, ca: str) -> dict[str, str]:
    """What role router writes on each head whose drain comes to router `name` (layout router_drain_admin): the
    router's URL as those heads' env files name it, its front's admin listener, and where the head keeps the
    router's certificate (twinspark.fleet.drain.admin_listener reads it)."""
    return {"router": router_url(router, name), "url": router_admin_url(router, name), "ca": str(ca)}


def drain_defaults(host: str, host_vars: Mapping[str, Mapping[str, Any]],
                   groups: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """The drain settings host's pair gets from the inventory when they are not set by hand: the URL of the first
    router (twinspark_router) that fronts the pair, and the pair's head API as that router lists it in its
    --worker-urls. {} when no router fronts the pair (a pair on its own: no drain)."""
    routers = _members(groups, ROUTER_GROUP)
    pair = own_pair(host, host_vars, groups) if routers else None
    if pair is None:
        return {}
    known, _ = pairs(host_vars, groups)
    for router in routers:
        fronted, _ = router_pairs(host_vars.get(router, {}), known)
        if any(candidate.name == pair.name for candidate in fronted):
            return {ROUTER_URL_VAR: router_url(host_vars.get(router, {}), router),
                    ROUTER_PAIR_URL_VAR: head_url(host_vars.get(pair.head, {}), pair.head)}
    return {}


def problems(host_vars: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]]) -> list[str]:
    """Every fleet-level problem, one line each: pair membership, the router, port and fabric-address clashes."""
    found, lines = pairs(host_vars, groups)
    lines += placement_problems(host_vars, groups)
    routers = _members(groups, ROUTER_GROUP)
    for router in routers:
        fronted, router_lines = router_pairs(host_vars.get(router, {}), found)
        lines += [f"{router}: {line}" for line in router_lines]
        if not fronted and not router_lines:
            lines.append(f"{router}: is in {ROUTER_GROUP} but fronts no pair; add pairs to the inventory "
                         f"(a head and a worker each) or take {router} out of {ROUTER_GROUP}")
        elif not fronted:
            lines.append(f"{router}: fronts no pair; list at least one pair in {ROUTER_PAIRS_VAR} or leave it unset")
    lines += admin_key_problems(host_vars, found, routers)
    # each fronted pair's firewall must let its router in (roles/vllm_service: only listed networks reach the API)
    for router in routers:
        fronted, _ = router_pairs(host_vars.get(router, {}), found)
        lines += [line for pair in fronted
                  if (line := router_admission_problem(router, host_vars.get(router, {}), pair,
                                                       host_vars.get(pair.head, {})))]
    # port clashes: every listening endpoint the fleet defines, per address
    endpoints: dict[tuple[str, int], list[str]] = {}

    def listen(host: str, var: str, default: int, what: str) -> None:
        port = _port(host_vars.get(host, {}), var, default)
        if port is None:
            lines.append(f"{host}: {var} must be a port number, got {host_vars.get(host, {}).get(var)!r}")
            return
        endpoints.setdefault((_address(host, host_vars.get(host, {})), port), []).append(f"{host} {what} ({var})")

    for pair in found:
        listen(pair.head, API_PORT_VAR, api.default_port(), f"pair {pair.name} API")
    for router in routers:
        listen(router, ROUTER_PORT_VAR, DEFAULT_ROUTER_PORT, "router API")
        listen(router, ROUTER_METRICS_PORT_VAR, DEFAULT_ROUTER_METRICS_PORT, "router metrics")
        listen(router, ROUTER_ADMIN_PORT_VAR, DEFAULT_ROUTER_ADMIN_PORT, "router admin API (TLS)")
    for (address, port), users in sorted(endpoints.items()):
        if len(users) > 1:
            lines.append(f"port clash on {address}:{port}: {'; '.join(users)} would all listen there; give each "
                         "its own port (or address)")
    # each pair its own fabric: no fabric address shared across pairs (within a pair, nodeenv's rules say it)
    fabric: dict[str, list[tuple[str, str]]] = {}
    for pair in found:
        for host in pair.hosts:
            address = host_vars.get(host, {}).get(FABRIC_ADDRESS_VAR)
            if address not in (None, ""):
                fabric.setdefault(str(address), []).append((host, pair.name))
    for address, owners in sorted(fabric.items()):
        if len({name for _, name in owners}) > 1:
            users = [f"{host} (pair {name})" for host, name in owners]
            lines.append(f"{FABRIC_ADDRESS_VAR}: {address} is set on {', '.join(users)}; every node needs its own "
                         "fabric address")
    return lines


def _secret(value: Any) -> str:
    """An inventory secret as text (a vault value decrypts on str()); "" when unset."""
    return "" if value is None else str(value).strip()


def admin_key_problems(host_vars: Mapping[str, Mapping[str, Any]], found: Sequence[FleetPair],
                       routers: Sequence[str]) -> list[str]:
    """Each router needs an admin key of its own (its front refuses the client key on the admin paths), and each
    head it fronts the same key for its drain. One line per problem, never a key."""
    lines: list[str] = []
    for router in routers:
        router_vars = host_vars.get(router, {})
        fronted, _ = router_pairs(router_vars, found)
        if not fronted:
            continue  # named already: a router without pairs
        admin = _secret(router_vars.get(ADMIN_KEY_VAR))
        client = _secret(router_vars.get("router_api_key") or router_vars.get(CLIENT_KEY_VAR))
        fix = (f"set {ADMIN_KEY_VAR} in group_vars/all with ansible-vault (for example ansible-vault encrypt_string "
               f"--name {ADMIN_KEY_VAR} \"$(openssl rand -hex 32)\")")
        if not admin:
            lines.append(f"{router}: {ADMIN_KEY_VAR} is empty; the router's admin paths (/add_worker, "
                         f"/remove_worker, ...) need a key of their own; {fix}")
            continue
        if admin == client:
            lines.append(f"{router}: {ADMIN_KEY_VAR} equals the clients' key ({CLIENT_KEY_VAR}), which would let "
                         f"every client add and remove the router's workers; {fix}")
            continue
        for pair in fronted:
            if _secret(host_vars.get(pair.head, {}).get(ADMIN_KEY_VAR)) != admin:
                lines.append(f"pair {pair.name}: {ADMIN_KEY_VAR} on its head {pair.head} differs from router "
                             f"{router}'s, so the drain would be refused (403); set it once, in group_vars/all")
    return lines


def router_admission_problem(router: str, router_vars: Mapping[str, Any], pair: FleetPair,
                             head_vars: Mapping[str, Any]) -> str | None:
    """A problem when the pair's API firewall would refuse the router; None when it admits it, or when the router's
    address is a name (not checkable here)."""
    try:
        address = ipaddress.ip_address(str(router_vars.get("ansible_host") or router))
    except ValueError:
        return None
    if address.is_loopback:
        return None
    allowed = head_vars.get(API_ALLOWED_VAR) or []
    if isinstance(allowed, str):
        allowed = [allowed]
    for network in allowed:
        try:
            if address in ipaddress.ip_network(str(network), strict=False):
                return None
        except ValueError:
            continue  # the vllm_service role's own checks name a malformed network
    return (f"{router}: its address {address} is not in {API_ALLOWED_VAR} of pair {pair.name} (head {pair.head}), "
            f"so that pair's firewall would refuse the router; add {address}/32 or its network there")
