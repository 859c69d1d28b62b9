"""Groups: one model served by N Sparks with ranks 0..N-1 (docs/GROUPS.md). Pure rules over the inventory.

A pair is the group of two: its head is rank 0, its worker rank 1, and nothing about today's inventories changes.
What a group adds to the pair, read from the inventory (rank 0's variables hold the group's own):

  * `twinspark_rank` on each host (0..N-1; a pair's head and worker need none: 0 and 1);
  * `twinspark_topology`: `single` (one node, no fabric), `direct` (two nodes cabled to each other: today's pair),
    `switch` (every node's ports on one QSFP switch), `mesh` (three nodes, each cabled to both others) or `ring`
    (four to eight nodes in a closed ring, port 0 to the next node's port 1, no switch); default: `single` for one
    node, `direct` for two, none for more (a group of three or more must say how it is cabled);
  * `twinspark_links` for a mesh or ring: the cables, each `{a: host, a_port: 0|1, b: host, b_port: 0|1}`;
  * `twinspark_tensor_parallel` x `twinspark_pipeline_parallel` = N (default: TP = N, PP = 1).

What it decides, each in one function the roles, the launcher and validation share:

  * `problems`: every refusal before any host is touched, one line each naming the variable and the fix (ranks,
    layout against the group's size and the recipe's heads and pipeline support, the topology's node count, a ring
    that does not close, a mesh that is not complete, a node in two groups, a fabric address used twice);
  * `nccl_env`: the NCCL settings the topology needs beyond the profile's;
  * `launch_args`: vLLM's own multi-node flags for a rank (no Ray): `--nnodes`, `--node-rank`, `--master-addr`,
    `--master-port`, and `--headless` on every rank but 0, which alone serves the API, /health and /metrics;
  * `fabric_plan`: each node's fabric addresses, derived from the group and its links (twin ports on separate
    subnets);
  * `pass_mark`: the all_gather bandwidth the bandwidth check must reach on this topology;
  * `start_order` / `stop_order`: ranks N-1..1 then 0; 0 first then 1..N-1.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from twinspark import recipe

RANK_VAR = "twinspark_rank"
TOPOLOGY_VAR = "twinspark_topology"
LINKS_VAR = "twinspark_links"
TP_VAR = "twinspark_tensor_parallel"
PP_VAR = "twinspark_pipeline_parallel"
FABRIC_ADDRESS_VAR = "twinspark_fabric_address"
FABRIC_NETWORK_VAR = "twinspark_fabric_network"
# The inventory variables a group reads (not knobs: nothing of them reaches an env file).
GROUP_VARS = frozenset({RANK_VAR, TOPOLOGY_VAR, LINKS_VAR, TP_VAR, PP_VAR, FABRIC_NETWORK_VAR})
# The inventory group of a group other than a pair (docs/GROUPS.md): every node, each with its twinspark_rank. Only
# the plays that already take N nodes (playbooks/fabric.yml) run on it; the pair's groups are twinspark_head and
# twinspark_worker.
GROUP_GROUP = "twinspark_group"
HEAD_GROUP = "twinspark_head"
WORKER_GROUP = "twinspark_worker"
TOPOLOGIES = ("single", "direct", "switch", "mesh", "ring")
# Node counts each topology can be built with: a mesh is three nodes cabled to each other; a ring closes four to eight
# (three nodes cabled in a circle are the mesh); a switch takes any number; direct is two cabled to each other.
NODE_COUNTS = {"single": (1,), "direct": (2,), "switch": tuple(range(2, 9)), "mesh": (3,), "ring": tuple(range(4, 9))}
# All_gather pass marks (GB/s, busbw) NVIDIA's Spark playbooks give: direct or through a switch, and a three-node mesh.
PASS_MARK_GBPS = {"direct": 21.875, "switch": 21.875, "mesh": 10.0, "ring": 10.0}
PORTS = (0, 1)
DEFAULT_MASTER_PORT = 29501  # vLLM's ParallelConfig default
# The fabric's address plan (fabric_plan): one /24 per subnet from this /16, never the management network's; rank 0's
# twinspark_fabric_network sets another.
DEFAULT_FABRIC_NETWORK = "10.200.0.0/16"
# The netdev of each (port, twin) on a mesh or ring node, per profile (cable_interfaces). A Spark's ConnectX-7 shows
# each of its two ports twice; the simulation cables one veth per port, twin 0 only.
CABLE_NETDEVS = {
    "gb10": {(0, 0): "enp1s0f0np0", (0, 1): "enP2p1s0f0np0", (1, 0): "enp1s0f1np1", (1, 1): "enP2p1s0f1np1"},
    "cpu": {(0, 0): "ic0", (1, 0): "ic1"},
}
# The four RoCE devices of a Spark's ConnectX-7 (two ports, each seen twice): a mesh or ring uses all of them.
ALL_ROCE_DEVICES = "rocep1s0f0,roceP2p1s0f0,rocep1s0f1,roceP2p1s0f1"


@dataclass(frozen=True)
class Link:
    a: str
    a_port: int
    b: str
    b_port: int

    def ends(self) -> tuple[tuple[str, int], tuple[str, int]]:
        return (self.a, self.a_port), (self.b, self.b_port)


@dataclass(frozen=True)
class Group:
    """N nodes serving one model: `ranks[r]` is the host of rank r (rank 0 serves the API)."""

    name: str
    ranks: tuple[str, ...]
    topology: str
    tp: int
    pp: int
    links: tuple[Link, ...] = ()
    problems: tuple[str, ...] = field(default=(), compare=False)
    network: str = DEFAULT_FABRIC_NETWORK

    @property
    def size(self) -> int:
        return len(self.ranks)

    def rank_of(self, host: str) -> int:
        return self.ranks.index(host)


def _members(groups: Mapping[str, Sequence[str]], name: str) -> list[str]:
    return list(groups.get(name) or [])


def _int(value: Any, what: str, problems: list[str]) -> int | None:
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        problems.append(f"{what} must be a whole number (got {value!r})")
        return None
    return number


def _links(raw: Any, where: str, problems: list[str]) -> tuple[Link, ...]:
    if raw in (None, ""):
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        problems.append(f"{LINKS_VAR} on {where} must be a list of cables {{a, a_port, b, b_port}} (got {raw!r})")
        return ()
    found = []
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping) or set(item) != {"a", "a_port", "b", "b_port"}:
            problems.append(f"{LINKS_VAR}[{index}] on {where} must have exactly a, a_port, b, b_port (got {item!r})")
            continue
        ports = [_int(item["a_port"], f"{LINKS_VAR}[{index}].a_port", problems),
                 _int(item["b_port"], f"{LINKS_VAR}[{index}].b_port", problems)]
        if None in ports:
            continue
        if any(port not in PORTS for port in ports):
            problems.append(f"{LINKS_VAR}[{index}] on {where}: a Spark has ports 0 and 1 (got {ports})")
            continue
        found.append(Link(str(item["a"]), int(ports[0]), str(item["b"]), int(ports[1])))
    return tuple(found)


def read(name: str, hosts: Sequence[str], host_vars: Mapping[str, Mapping[str, Any]],
         groups: Mapping[str, Sequence[str]]) -> Group:
    """The group of `hosts` (an inventory group, or the one pair's head and worker), ranks in order. Problems of the
    reading itself (a rank missing or repeated, a value that is not a number) are kept in Group.problems."""
    problems: list[str] = []
    heads = set(_members(groups, HEAD_GROUP))
    workers = set(_members(groups, WORKER_GROUP))
    ranked: dict[int, str] = {}
    for host in hosts:
        own = host_vars.get(host, {})
        if RANK_VAR in own:
            rank = _int(own[RANK_VAR], f"{RANK_VAR} on {host}", problems)
        elif host in heads:
            rank = 0
        elif host in workers and len(hosts) == 2:
            rank = 1
        else:
            problems.append(f"{host} in group {name} has no {RANK_VAR}: give each of its {len(hosts)} nodes one "
                            f"of 0..{len(hosts) - 1} (0 serves the API)")
            continue
        if rank is None:
            continue
        if rank in ranked:
            problems.append(f"{RANK_VAR} {rank} is given to both {ranked[rank]} and {host} in group {name}: each "
                            "rank belongs to one node")
            continue
        ranked[rank] = host
    order = tuple(ranked[r] for r in sorted(ranked))
    if ranked and sorted(ranked) != list(range(len(hosts))):
        problems.append(f"the ranks of group {name} are {sorted(ranked)}: they must be 0..{len(hosts) - 1}, one per "
                        "node")
    first = host_vars.get(order[0], {}) if order else {}
    size = len(hosts)
    topology = str(first.get(TOPOLOGY_VAR) or {1: "single", 2: "direct"}.get(size, ""))
    tp = _int(first.get(TP_VAR, size), f"{TP_VAR} of group {name}", problems) or size
    pp = _int(first.get(PP_VAR, 1), f"{PP_VAR} of group {name}", problems) or 1
    links = _links(first.get(LINKS_VAR), order[0] if order else name, problems)
    network = str(first.get(FABRIC_NETWORK_VAR) or DEFAULT_FABRIC_NETWORK)
    problems += _network_problems(network, name, len(links))
    return Group(name, order, topology, tp, pp, links, tuple(problems), network)


def _network_problems(network: str, name: str, cables: int) -> list[str]:
    """The fabric network must hold one /24 per subnet the plan hands out (two per cable, four per switch port)."""
    try:
        parsed = ipaddress.ip_network(network)
    except ValueError:
        return [f"{FABRIC_NETWORK_VAR} of group {name} is {network!r}: give an IPv4 network such as "
                f"{DEFAULT_FABRIC_NETWORK}"]
    wanted = max(2 * cables, 2 * len(PORTS))
    if parsed.version != 4 or parsed.prefixlen > 24 or 2 ** (24 - parsed.prefixlen) < wanted:
        return [f"{FABRIC_NETWORK_VAR} of group {name} is {network}: it must be an IPv4 network holding {wanted} /24 "
                f"subnets (a /{24 - (wanted - 1).bit_length()} or larger)"]
    return []


def ring_order(group: Group) -> list[str] | None:
    """The nodes in ring order when the links close one ring through every node, port 0 to the next node's port 1;
    None otherwise."""
    nexts: dict[str, str] = {}
    for link in group.links:
        ends = dict((port, host) for host, port in link.ends())
        if set(ends) != {0, 1}:
            return None
        if ends[0] in nexts:
            return None
        nexts[ends[0]] = ends[1]
    if set(nexts) != set(group.ranks) or set(nexts.values()) != set(group.ranks):
        return None
    order = [group.ranks[0]]
    while len(order) < group.size:
        order.append(nexts[order[-1]])
        if order[-1] == order[0]:
            return None
    return order if nexts[order[-1]] == order[0] else None


def _topology_problems(group: Group) -> list[str]:
    found = []
    if group.topology not in TOPOLOGIES:
        hint = " (a group of three or more must say how it is cabled)" if not group.topology else ""
        return [f"{TOPOLOGY_VAR} of group {group.name} is {group.topology or 'unset'}{hint}: one of "
                f"{', '.join(TOPOLOGIES)}"]
    if group.size not in NODE_COUNTS[group.topology]:
        counts = NODE_COUNTS[group.topology]
        mesh_hint = group.topology == "ring" and group.size == 3
        extra = " (three nodes cabled to each other are the mesh)" if mesh_hint else ""
        found.append(f"{TOPOLOGY_VAR} {group.topology} takes {counts[0]}"
                     f"{'' if len(counts) == 1 else f'-{counts[-1]}'} node(s), group {group.name} has "
                     f"{group.size}{extra}")
        return found
    unknown = sorted({host for link in group.links for host, _ in link.ends()} - set(group.ranks))
    if unknown:
        found.append(f"{LINKS_VAR} of group {group.name} names {', '.join(unknown)}, not in the group")
    used: dict[tuple[str, int], int] = {}
    for index, link in enumerate(group.links):
        for end in link.ends():
            if end in used:
                found.append(f"{LINKS_VAR} of group {group.name}: port {end[1]} of {end[0]} is cabled twice "
                             f"(cables {used[end]} and {index})")
            used.setdefault(end, index)
        if link.a == link.b:
            found.append(f"{LINKS_VAR}[{index}] of group {group.name} cables {link.a} to itself")
    if group.topology == "ring" and not found and ring_order(group) is None:
        found.append(f"{LINKS_VAR} of group {group.name} does not close one ring through all {group.size} nodes with "
                     "each node's port 0 cabled to the next node's port 1 (port 0 to port 0 fails at the first "
                     "all-reduce): list one cable per neighbour pair, a_port 0 to b_port 1")
    if group.topology == "mesh" and not found:
        pairs = {frozenset((link.a, link.b)) for link in group.links}
        wanted = {frozenset((a, b)) for i, a in enumerate(group.ranks) for b in group.ranks[i + 1:]}
        if pairs != wanted:
            missing = sorted("-".join(sorted(pair)) for pair in wanted - pairs)
            found.append(f"{LINKS_VAR} of group {group.name}: a mesh cables every node to both others; missing "
                         f"{', '.join(missing) or 'nothing, but extra cables are listed'}")
    if group.topology in ("single", "direct", "switch") and group.links:
        found.append(f"{LINKS_VAR} of group {group.name} lists cables, which only a mesh or a ring reads: remove "
                     "them or set the topology")
    return found


def layout_problems(group: Group, chosen: recipe.Recipe | None) -> list[str]:
    """TP x PP against the group's size and the recipe: its heads, its pipeline support, its layouts."""
    found = []
    if group.tp < 1 or group.pp < 1:
        return [f"{TP_VAR} and {PP_VAR} of group {group.name} must be at least 1 (got {group.tp} x {group.pp})"]
    if group.tp * group.pp != group.size:
        found.append(f"{TP_VAR} x {PP_VAR} of group {group.name} is {group.tp} x {group.pp} = {group.tp * group.pp}, "
                     f"but the group has {group.size} node(s): the product must equal the node count")
    if chosen is None:
        return found
    heads = chosen.architecture.get("num_attention_heads")
    if heads and int(heads) % group.tp:
        found.append(f"{TP_VAR} {group.tp} of group {group.name} does not divide recipe {chosen.name}'s "
                     f"{heads} attention heads (vLLM refuses it): use a TP that divides them and pipeline "
                     f"parallelism for the rest ({PP_VAR})")
    if group.pp > 1 and not chosen.pipeline:
        found.append(f"{PP_VAR} {group.pp} of group {group.name}: recipe {chosen.name} does not support pipeline "
                     "parallelism (its parallel.pipeline is false)")
    if not found and recipe.Layout(group.tp, group.pp) not in chosen.layouts:
        found.append(f"recipe {chosen.name} is not laid out for TP{group.tp}xPP{group.pp} (its layouts: "
                     f"{', '.join(str(x) for x in chosen.layouts)}): choose one of them or add it to the recipe "
                     "after `twinspark recipe check`")
    return found


def problems(found: Sequence[Group], host_vars: Mapping[str, Mapping[str, Any]],
             chosen: Mapping[str, recipe.Recipe | None] | None = None) -> list[str]:
    """Every problem of these groups, one line each, before any host is touched."""
    lines: list[str] = []
    owner: dict[str, str] = {}
    addresses: dict[str, str] = {}
    for group in found:
        lines += list(group.problems)
        for host in group.ranks:
            if host in owner and owner[host] != group.name:
                lines.append(f"{host} is in groups {owner[host]} and {group.name}: a node serves one group")
            owner.setdefault(host, group.name)
            address = str(host_vars.get(host, {}).get(FABRIC_ADDRESS_VAR) or "").split("/")[0]
            if address and address in addresses and addresses[address] != host:
                lines.append(f"{FABRIC_ADDRESS_VAR} {address} is given to both {addresses[address]} and {host}: "
                             "each node needs its own")
            if address:
                addresses.setdefault(address, host)
        if group.problems:
            continue
        lines += _topology_problems(group)
        lines += layout_problems(group, (chosen or {}).get(group.name))
    return lines


def pair_support_problems(pair: Group) -> list[str]:
    """What the roles cannot serve yet on two nodes (docs/GROUPS.md, "Not built yet"): the pair is cabled directly
    and laid out TP2xPP1; a pair declared otherwise is refused rather than served as if it were not."""
    found = []
    if pair.topology != "direct":
        found.append(f"{TOPOLOGY_VAR} {pair.topology} for a pair: the fabric role builds the direct cable only so far "
                     "(docs/GROUPS.md); remove the variable or set it to direct")
    if (pair.tp, pair.pp) != (2, 1):
        found.append(f"{TP_VAR} x {PP_VAR} {pair.tp} x {pair.pp} for a pair: the pair serves TP2xPP1 so far "
                     "(docs/GROUPS.md); remove both variables")
    return found


def nccl_env(group: Group, management_interface: str = "") -> dict[str, str]:
    """The NCCL settings the group's topology needs beyond the profile's (docs/GROUPS.md, "NCCL per topology").
    Direct and switch need none beyond it; a mesh or ring routes by subnet over all four RoCE devices, keeps NCCL's
    own plugin out, bootstraps over the management network, and a ring of four or more keeps NCCL to its
    neighbours."""
    if group.topology not in ("mesh", "ring"):
        return {}
    env = {"NCCL_NET_PLUGIN": "none", "NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_IB_MERGE_NICS": "0",
           "NCCL_IB_HCA": ALL_ROCE_DEVICES}
    if management_interface:
        env["NCCL_SOCKET_IFNAME"] = management_interface
    if group.topology == "ring":
        env["NCCL_ALGO"] = "Ring"
    return env


def launch_args(group: Group, rank: int, master_addr: str, master_port: int = DEFAULT_MASTER_PORT) -> list[str]:
    """vLLM's own multi-node flags for `rank` (the multiprocessing executor, no Ray): every rank but 0 is headless."""
    if not 0 <= rank < group.size:
        raise ValueError(f"rank {rank} is not in group {group.name} (0..{group.size - 1})")
    args = ["--tensor-parallel-size", str(group.tp), "--pipeline-parallel-size", str(group.pp)]
    if group.size == 1:
        return args
    args += ["--nnodes", str(group.size), "--node-rank", str(rank), "--master-addr", master_addr,
             "--master-port", str(master_port)]
    return args + (["--headless"] if rank else [])


def start_order(group: Group) -> list[str]:
    """Ranks N-1..1, then rank 0 (the API comes up last, when every rank it waits for is there)."""
    return list(reversed(group.ranks[1:])) + list(group.ranks[:1])


def stop_order(group: Group) -> list[str]:
    """Rank 0 first (clients see the API go before the ranks it needs), then 1..N-1."""
    return list(group.ranks)


def pass_mark(group: Group) -> float | None:
    """The all_gather bus bandwidth (GB/s) the bandwidth check must reach; None for one node (no fabric)."""
    return PASS_MARK_GBPS.get(group.topology)


def fabric_plan(group: Group, network: str = DEFAULT_FABRIC_NETWORK) -> dict[str, list[dict[str, object]]]:
    """Each node's fabric addresses, one /24 per subnet from `network`: {host: [{port, twin, address, peer}]}.

    Each port of a Spark shows up twice (twin interfaces); twins always sit on separate subnets, so that no node has
    two interfaces on one subnet (the kernel would choose the egress and NCCL can hang without a word).
      * switch (and direct): port p, twin t of every node on subnet 2p + t, the rank's host number on it;
      * mesh and ring: each cable gets two subnets (its two twins), its two ends .1 (a) and .2 (b); each entry also
        names the cable (its index in twinspark_links) and the peer's address on it.
    """
    base = ipaddress.ip_network(network)
    subnets = list(base.subnets(new_prefix=24))
    plan: dict[str, list[dict[str, object]]] = {host: [] for host in group.ranks}

    def address(subnet: int, host_number: int) -> str:
        net = subnets[subnet]
        return f"{net.network_address + host_number}/{net.prefixlen}"

    if group.topology in ("direct", "switch"):
        for rank, host in enumerate(group.ranks):
            for port in PORTS:
                for twin in (0, 1):
                    peers = [other for other in group.ranks if other != host]
                    plan[host].append({"port": port, "twin": twin, "address": address(2 * port + twin, rank + 1),
                                       "peer": peers[0] if group.topology == "direct" else "switch"})
        return plan
    for index, link in enumerate(group.links):
        for twin in (0, 1):
            subnet = 2 * index + twin
            a_end, b_end = address(subnet, 1), address(subnet, 2)
            plan[link.a].append({"port": link.a_port, "twin": twin, "address": a_end, "peer": link.b, "cable": index,
                                 "peer_port": link.b_port, "peer_address": b_end})
            plan[link.b].append({"port": link.b_port, "twin": twin, "address": b_end, "peer": link.a, "cable": index,
                                 "peer_port": link.a_port, "peer_address": a_end})
    return plan


def cable_interfaces(group: Group, host: str, profile: str) -> list[dict[str, object]]:
    """A mesh or ring node's fabric interfaces, from the link list (fabric_plan), in port and twin order: {name,
    address, prefix, port, twin, peer, peer_port, peer_address, cable}, the netdev named per profile
    (CABLE_NETDEVS). Role spark_fabric writes them into its netplan file and pings each cable's other end over it.
    [] for any other topology (the role's spark_fabric_interfaces then) or a host outside the group."""
    if group.topology not in ("mesh", "ring") or host not in group.ranks or profile not in CABLE_NETDEVS:
        return []
    netdevs = CABLE_NETDEVS[profile]
    found = []
    for entry in sorted(fabric_plan(group, group.network)[host], key=lambda e: (e["port"], e["twin"])):
        name = netdevs.get((int(entry["port"]), int(entry["twin"])))
        if name is None:
            continue
        address, prefix = str(entry["address"]).split("/")
        found.append({"name": name, "address": address, "prefix": int(prefix), "port": entry["port"],
                      "twin": entry["twin"], "peer": entry["peer"], "peer_port": entry["peer_port"],
                      "peer_address": str(entry["peer_address"]).split("/")[0], "cable": entry["cable"]})
    return found


def fabric_peers(host: str, groups: Mapping[str, Sequence[str]], host_vars: Mapping[str, Mapping[str, Any]],
                 pair_hosts: Sequence[str] = ()) -> list[str]:
    """The nodes `host`'s fabric links reach, in rank order: the other members of its group (inventory group
    twinspark_group) when it is in one (on a mesh or ring, those cabled to it), else the other node of its pair
    (`pair_hosts`)."""
    members = list(_members(groups, GROUP_GROUP))
    if host in members:
        found = read(GROUP_GROUP, members, host_vars, groups)
        if found.topology in ("mesh", "ring"):
            cabled = {other for link in found.links for me, other in ((link.a, link.b), (link.b, link.a))
                      if me == host}
            return [node for node in found.ranks if node in cabled]
        return [node for node in found.ranks if node != host]
    return [node for node in pair_hosts if node != host]

