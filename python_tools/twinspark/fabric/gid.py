"""Which RoCE GID index NCCL should use on this node (NCCL_IB_GID_INDEX), from what sysfs says now.

The rules are pure functions over ``PortInfo`` records and an address mapping; ``resolve_gid_index`` is the entry
point that reads sysfs and applies them. It runs on each node at every vLLM start, because the index differs per node
and can move after a reboot (docs/FABRIC.md).

Rules:

1. Candidate ports are ACTIVE with link layer Ethernet or InfiniBand; an attribute that cannot be read keeps the port.
2. The NCCL_IB_HCA selector filters the candidates (filter first, then select), at most 32 members.
3. A member's usable indexes are its RoCE v2 GIDs whose IPv4-mapped address equals the match IP (``match-ip``) or
   equals an IPv4 address on the netdev named in ``gid_attrs/ndevs`` (``own-addr``).
4. Every member must have a usable index, and the members must share one.
5. Of the shared indexes, in ascending order, the first that some member reached through the match IP wins;
   otherwise the lowest.
"""

from __future__ import annotations

import ipaddress
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from twinspark.fabric import selector as hca
from twinspark.fabric import sysfs
from twinspark.fabric.sysfs import PortInfo

ACTIVE_STATE = "ACTIVE"
CANDIDATE_LINK_LAYERS = ("Ethernet", "InfiniBand")
ROCE_V2 = "RoCE v2"
VIA_MATCH_IP = "match-ip"
VIA_OWN_ADDR = "own-addr"

EXIT_NOT_SELECTED = 1
EXIT_INVALID_INPUT = 2
EXIT_NO_COMMON_INDEX = 3


class GidResolutionError(Exception):
    """Resolution failed; ``exit_code`` is what ``twinspark fabric resolve-gid`` exits with.

    1: no port selected, or a member without a usable RoCE v2 GID; 2: invalid input (match IP, a missing sysfs
    root, an attribute that is not a small regular file); 3: the members share no usable index.
    """

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Skipped:
    label: str
    reason: str


@dataclass
class Selection:
    """The outcome of rules 1-2: the member ports and what was left out, and why."""

    members: list[PortInfo]
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Resolution:
    index: int
    via: str
    usable: dict[str, dict[int, str]]
    skipped: list[Skipped]
    notes: list[str]

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "via": self.via,
            "members": {
                label: {str(index): via for index, via in sorted(found.items())}
                for label, found in self.usable.items()
            },
            "skipped": [{"port": s.label, "reason": s.reason} for s in self.skipped],
            "notes": list(self.notes),
        }


def parse_match_ip(text: str | None) -> str | None:
    """A dotted-quad match IP, or None when none was given; raises GidResolutionError (2) otherwise."""
    if not text:
        return None
    try:
        return str(ipaddress.IPv4Address(text.strip()))
    except ipaddress.AddressValueError:
        raise GidResolutionError(
            f"match IP must be an IPv4 address in dotted-quad form (got {text!r}); pass the node's own fabric "
            "address, or leave it empty to match GIDs against the netdev's own addresses only",
            EXIT_INVALID_INPUT,
        ) from None


def gid_ipv4(gid: str | None) -> str | None:
    """The IPv4 address inside an IPv4-mapped GID (``...:ffff:0a4d:0001`` -> ``10.77.0.1``), else None."""
    if not gid:
        return None
    try:
        mapped = ipaddress.IPv6Address(gid.strip()).ipv4_mapped
    except ipaddress.AddressValueError:
        return None
    return str(mapped) if mapped is not None else None


def skip_reason(port: PortInfo) -> str | None:
    """Why a port is not a candidate (rule 1), or None when it is."""
    if port.state is not None and port.state != ACTIVE_STATE:
        return f"state {port.state}"
    if port.link_layer is not None and port.link_layer not in CANDIDATE_LINK_LAYERS:
        return f"link layer {port.link_layer}"
    return None


def select_members(selector_text: str, ports: Iterable[PortInfo]) -> Selection:
    """Rules 1 and 2: candidates first, then the selector, then the cap of 32."""
    parsed = hca.parse_selector(selector_text)
    notes = list(parsed.notes)
    skipped: list[Skipped] = []
    candidates: dict[tuple[str, int], PortInfo] = {}
    for port in ports:
        reason = skip_reason(port)
        if reason is not None:
            skipped.append(Skipped(port.label, reason))
            continue
        for attribute in ("state", "link_layer"):
            if getattr(port, attribute) is None:
                notes.append(f"{port.label}: {attribute} unreadable, port kept as a candidate")
        candidates[(port.device, port.port)] = port
    chosen, cap_notes = hca.select_ports(parsed, candidates)
    notes.extend(cap_notes)
    chosen_keys = set(chosen)
    for key, port in sorted(candidates.items()):
        if key not in chosen_keys and not hca.selects(parsed, *key):
            skipped.append(Skipped(port.label, "not selected by NCCL_IB_HCA"))
    return Selection(members=[candidates[key] for key in chosen], skipped=skipped, notes=notes)


def usable_indexes(port: PortInfo, match_ip: str | None, addresses: Mapping[str, Sequence[str]]) -> dict[int, str]:
    """Rule 3: index -> how it was reached (``match-ip`` wins over ``own-addr`` for the same index)."""
    found: dict[int, str] = {}
    for entry in port.gids:
        if entry.type != ROCE_V2:
            continue
        ipv4 = gid_ipv4(entry.gid)
        if ipv4 is None:
            continue
        if match_ip is not None and ipv4 == match_ip:
            found[entry.index] = VIA_MATCH_IP
        elif entry.ndev and ipv4 in addresses.get(entry.ndev, ()):
            found[entry.index] = VIA_OWN_ADDR
    return found


def _format_skipped(skipped: Sequence[Skipped]) -> str:
    if not skipped:
        return "none"
    return ", ".join(f"{s.label} ({s.reason})" for s in skipped)


def _format_sets(usable: Mapping[str, Mapping[int, str]]) -> str:
    return " ".join(f"{label}={','.join(str(i) for i in sorted(found)) or '-'}" for label, found in usable.items())


def choose_index(
    selector_text: str,
    selection: Selection,
    match_ip: str | None,
    addresses: Mapping[str, Sequence[str]],
    where: str = "",
) -> Resolution:
    """Rules 3-5 over the selected members; raises GidResolutionError (1 or 3). ``where`` names the sysfs root."""
    shown_selector = f"NCCL_IB_HCA={selector_text!r}"
    if not selection.members:
        under = f" under {where}" if where else ""
        raise GidResolutionError(
            f"{shown_selector} selects no ACTIVE Ethernet/InfiniBand port{under}; skipped: "
            f"{_format_skipped(selection.skipped)}. Fix the selector or bring the fabric link up.",
            EXIT_NOT_SELECTED,
        )
    usable = {member.label: usable_indexes(member, match_ip, addresses) for member in selection.members}
    empty = [label for label, found in usable.items() if not found]
    if empty:
        wanted = f"the match IP {match_ip} or " if match_ip else ""
        raise GidResolutionError(
            f"{shown_selector}: member(s) {', '.join(empty)} have no usable RoCE v2 GID (an IPv4-mapped GID equal "
            f"to {wanted}an IPv4 address on the port's netdev); usable sets: {_format_sets(usable)}; skipped: "
            f"{_format_skipped(selection.skipped)}. Give the port's netdev its fabric address, or leave the port "
            "out of NCCL_IB_HCA.",
            EXIT_NOT_SELECTED,
        )
    common = set.intersection(*(set(found) for found in usable.values()))
    if not common:
        raise GidResolutionError(
            f"{shown_selector}: the selected ports share no usable GID index: {_format_sets(usable)}. "
            "Narrow NCCL_IB_HCA to ports that share an index (for example one device with '=name').",
            EXIT_NO_COMMON_INDEX,
        )
    ordered = sorted(common)
    by_match_ip = [i for i in ordered if any(found.get(i) == VIA_MATCH_IP for found in usable.values())]
    index = by_match_ip[0] if by_match_ip else ordered[0]
    via = VIA_MATCH_IP if by_match_ip else VIA_OWN_ADDR
    notes = list(selection.notes)
    if len(ordered) > 1:
        notes.append(f"GID indexes usable on every member: {','.join(map(str, ordered))}; chose {index} ({via})")
    return Resolution(index=index, via=via, usable=usable, skipped=selection.skipped, notes=notes)


def resolve(
    selector: str,
    match_ip: str | None,
    sysfs_root: pathlib.Path,
    netdev_addresses: Callable[[str], Sequence[str]] | None = None,
) -> Resolution:
    """Read sysfs under ``sysfs_root`` and apply every rule; raises GidResolutionError.

    ``netdev_addresses`` maps a netdev to its IPv4 addresses (default: the kernel's, via ``sysfs.netdev_ipv4``).
    """
    lookup = netdev_addresses or sysfs.netdev_ipv4
    parsed_ip = parse_match_ip(match_ip)
    try:
        sysfs.check_root(sysfs_root)
        ports = sysfs.read_ports(sysfs_root)
    except sysfs.SysfsError as error:
        raise GidResolutionError(str(error), EXIT_INVALID_INPUT) from None
    selection = select_members(selector, ports)
    netdevs = sorted({g.ndev for m in selection.members for g in m.gids if g.ndev and g.type == ROCE_V2})
    addresses = {netdev: list(lookup(netdev)) for netdev in netdevs}
    return choose_index(selector, selection, parsed_ip, addresses, where=str(sysfs_root))


def resolve_gid_index(selector: str, match_ip: str, sysfs_root: pathlib.Path) -> tuple[int, list[str]]:
    """The GID index for NCCL_IB_GID_INDEX on this node, and notes worth logging.

    ``selector`` is the NCCL_IB_HCA value, ``match_ip`` the node's match IP (empty: own addresses only),
    ``sysfs_root`` normally ``/sys/class/infiniband``. Raises GidResolutionError with ``exit_code`` 1, 2 or 3.
    """
    resolution = resolve(selector, match_ip, sysfs_root)
    return resolution.index, resolution.notes


def match_ip(values: Mapping[str, str], interface_addresses: Callable[[str], list[str]]) -> str:
    """This node's GID match IP, in the one order the launcher and health both use: GID_MATCH_IP, else the first
    IPv4 address on NCCL_SOCKET_IFNAME, else VLLM_HOST_IP, else MASTER_ADDR (head) or WORKER_HOST (worker); empty
    when none is known. `interface_addresses` names an interface's IPv4 addresses (the I/O stays with the caller)."""
    if values.get("GID_MATCH_IP"):
        return values["GID_MATCH_IP"]
    ifname = values.get("NCCL_SOCKET_IFNAME", "").removeprefix("=")
    if ifname and not ifname.startswith("^") and "," not in ifname:
        addresses = interface_addresses(ifname)
        if addresses:
            return addresses[0]
    if values.get("VLLM_HOST_IP"):
        return values["VLLM_HOST_IP"]
    fallback = values.get("WORKER_HOST" if values.get("NODE_RANK") == "1" else "MASTER_ADDR", "")
    return fallback.rsplit("@", 1)[-1]
