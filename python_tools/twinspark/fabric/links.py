"""Whether a fabric interface is as the spark_fabric role wants it, from ``ip -j addr show dev NAME``.

Pure functions over the command's output; the role reads the output on the node and calls these through the
Ansible filters in ``filter_plugins/twinspark_fabric.py``. Every message names the node, the interface and the peer,
so a failed run says which end of which cable to look at.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

MISSING = "missing"
DOWN = "down"
ADMIN_DOWN = "admin-down"
NO_ADDRESS = "no-address"
WRONG_MTU = "wrong-mtu"

# Problems netplan apply can fix; a link without carrier is a cable or peer matter.
APPLY_FIXES = (MISSING, ADMIN_DOWN, NO_ADDRESS, WRONG_MTU)

ICMP_AND_IP_HEADER_BYTES = 28


@dataclass(frozen=True)
class LinkState:
    name: str
    exists: bool
    operstate: str = "UNKNOWN"
    flags: tuple[str, ...] = ()
    mtu: int | None = None
    ipv4: tuple[str, ...] = field(default_factory=tuple)
    speed_mbps: int | None = None  # the negotiated speed (sysfs `speed`); None: not up, or the driver does not say

    @property
    def up(self) -> bool:
        """Carrier and administratively up. Some drivers report operstate UNKNOWN; then LOWER_UP decides."""
        if "UP" not in self.flags or "NO-CARRIER" in self.flags:
            return False
        return self.operstate == "UP" or (self.operstate == "UNKNOWN" and "LOWER_UP" in self.flags)


def socket_ifnames(value: str) -> list[str]:
    """Interface names from an NCCL/GLOO socket ifname list (`^` exclusions and `=` exact markers dropped)."""
    if value.startswith("^"):
        return []
    return [token.lstrip("=") for token in value.split(",") if token.strip("= ")]


def no_fabric(env: Mapping[str, str]) -> bool:
    """Whether the env belongs to a group of one (NNODES=1, a single Spark, docs/GROUPS.md): no cable to another rank,
    so nothing about a fabric is read, judged, measured or handed to vLLM."""
    return str(env.get("NNODES") or "").strip() == "1"


def fabric_ifnames(env: Mapping[str, str]) -> list[str]:
    """A node's fabric interfaces from its env file: the ones NCCL and gloo use (NCCL_SOCKET_IFNAME, else
    GLOO_SOCKET_IFNAME)."""
    return socket_ifnames(env.get("NCCL_SOCKET_IFNAME", "") or env.get("GLOO_SOCKET_IFNAME", ""))


def parse_link(name: str, stdout: str, rc: int) -> LinkState:
    """``ip -j addr show dev NAME`` (stdout and exit status) -> LinkState; a non-zero status means no such device."""
    if rc != 0 or not stdout.strip():
        return LinkState(name=name, exists=False)
    links = json.loads(stdout)
    if not links:
        return LinkState(name=name, exists=False)
    link = links[0]
    return LinkState(
        name=name,
        exists=True,
        operstate=str(link.get("operstate", "UNKNOWN")),
        flags=tuple(link.get("flags", ())),
        mtu=link.get("mtu"),
        ipv4=tuple(a["local"] for a in link.get("addr_info", ()) if a.get("family") == "inet" and "local" in a),
    )


def problems(state: LinkState, address: str, mtu: int) -> list[str]:
    """Problem codes for one interface, in the order a person would check them."""
    if not state.exists:
        return [MISSING]
    found = []
    if "UP" not in state.flags:
        found.append(ADMIN_DOWN)
    elif not state.up:
        found.append(DOWN)
    if address not in state.ipv4:
        found.append(NO_ADDRESS)
    if state.mtu != mtu:
        found.append(WRONG_MTU)
    return found


def needs_apply(states: list[LinkState], addresses: list[str], mtu: int) -> bool:
    """Whether the live interfaces differ from the netplan file in a way netplan apply fixes."""
    return any(
        code in APPLY_FIXES
        for state, address in zip(states, addresses, strict=True)
        for code in problems(state, address, mtu)
    )


def describe(state: LinkState, address: str, mtu: int, host: str, peer: str) -> str:
    """One message naming the node, interface and peer for every problem found; empty when the link is right."""
    where = f"fabric interface {state.name} on {host} (cabled to {peer})"
    messages = []
    for code in problems(state, address, mtu):
        if code == MISSING:
            messages.append(
                f"{where} does not exist: check the netdev name with `ip link` or `twinspark fabric show` and set "
                "spark_fabric_interfaces"
            )
        elif code == ADMIN_DOWN:
            messages.append(f"{where} is administratively down: something ran `ip link set {state.name} down`")
        elif code == DOWN:
            flags = ",".join(state.flags) or "none"
            messages.append(
                f"{where} is down (operstate {state.operstate}, flags {flags}): check the cable and that the "
                "peer's end is up"
            )
        elif code == NO_ADDRESS:
            have = ", ".join(state.ipv4) or "none"
            messages.append(
                f"{where} lacks its address {address} (has {have}): check `netplan get` and the netplan logs, "
                "then rerun the role"
            )
        elif code == WRONG_MTU:
            messages.append(
                f"{where} has MTU {state.mtu}, expected {mtu} (spark_fabric_mtu): another netplan file or a hand "
                "setting overrides it"
            )
    return "; ".join(messages)


def ping_payload(mtu: int) -> int:
    """The ping payload that fills an IPv4 packet of exactly ``mtu`` bytes (20 IP + 8 ICMP header bytes)."""
    return mtu - ICMP_AND_IP_HEADER_BYTES


def ping_problem(interface: str, host: str, peer: str, peer_address: str, mtu: int, rc: int, output: str,
                 cable: Mapping[str, object] | None = None) -> str:
    """The message for a failed don't-fragment ping of the full MTU; empty when it passed (rc 0). `cable`: the mesh or
    ring cable the ping crossed ({cable, port, peer_port}), named in the message with how to check it."""
    if rc == 0:
        return ""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = lines[-1] if lines else "no output"
    message = (
        f"fabric interface {interface} on {host}: a don't-fragment ping of {mtu} bytes to peer {peer} "
        f"({peer_address}) failed ({said}). Both ends and everything between must carry MTU {mtu}: check "
        f"spark_fabric_mtu and `ip link show` on {peer}"
    )
    if cable:
        message += (
            f"; and the cabling: twinspark_links[{cable['cable']}] says port {cable['port']} of {host} goes to port "
            f"{cable['peer_port']} of {peer} (a cable in another port puts this end on another node's subnet)"
        )
    return message


def ping_targets(peers: Sequence[str], plan: Sequence[Mapping[str, object]],
                 peer_plans: Mapping[str, Sequence[Mapping[str, object]] | None]) -> list[dict[str, object]]:
    """Every don't-fragment ping a node makes: from each of its fabric interfaces (`plan`, in port order) to the same
    interface of every peer whose plan is known (`peer_plans`; None: the peer is not in this run). On a pair the
    one peer; through a switch every other node, port for port. On a mesh or ring (a plan whose interfaces name their
    cable, group.cable_interfaces) each interface pings the other end of its own cable, where that peer is in the run,
    and the target keeps the cable for the message."""
    targets: list[dict[str, object]] = []
    if any("cable" in interface for interface in plan):
        return [{"peer": interface["peer"], "name": interface["name"], "address": interface["peer_address"],
                 "cable": {key: interface[key] for key in ("cable", "port", "peer_port")}}
                for interface in plan if "cable" in interface and interface["peer"] in peers
                and peer_plans.get(str(interface["peer"]))]
    for peer in peers:
        theirs = peer_plans.get(peer)
        if not theirs:
            continue
        for index, interface in enumerate(plan):
            if index < len(theirs):
                targets.append({"peer": peer, "name": interface["name"], "address": theirs[index]["address"]})
    return targets


RDMA_FIRST_PORT = 18515  # ib_write_bw's own default TCP port; each run of one check takes the next


def rdma_targets(peer_addresses: Mapping[str, Sequence[str]], devices: Sequence[str],
                 first_port: int = RDMA_FIRST_PORT) -> list[dict[str, object]]:
    """The ib_write_bw runs rank 0 makes (gb10): every HCA of its selector (`devices`, in order) against every peer
    its fabric reaches (`peer_addresses`, in rank order: on a pair the worker, through a switch every other rank, on
    a mesh or ring the ranks cabled to it), the device at index i to the peer's address at index i (its first when it
    has fewer), each run on a TCP port of its own. A peer without an address is refused by name: the check would
    otherwise pass without measuring it."""
    targets: list[dict[str, object]] = []
    for peer, addresses in peer_addresses.items():
        usable = [str(address) for address in addresses if address]
        if not usable:
            raise ValueError(f"{peer}: no fabric address to measure ib_write_bw against (twinspark_fabric_address or "
                             "spark_fabric_interfaces in the inventory)")
        for index, device in enumerate(devices):
            targets.append({"peer": str(peer), "device": str(device), "twin": index,
                            "address": usable[index] if index < len(usable) else usable[0],
                            "port": first_port + len(targets)})
    return targets
