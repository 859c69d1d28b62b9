"""Reading RDMA ports and their netdevs from the running system: the only I/O of the fabric package.

Paths are built only from directory listings under the root, never from a selector or other user text. Every
attribute that cannot be read comes back as None; the rules in ``gid.py`` decide what that means (an unreadable
state or link layer keeps the port, as NCCL does).

Layout read, relative to the root (default ``/sys/class/infiniband``)::

    <dev>/ports/<port>/state                 "4: ACTIVE"
    <dev>/ports/<port>/link_layer            "Ethernet" | "InfiniBand"
    <dev>/ports/<port>/gids/<g>              "0000:0000:0000:0000:0000:ffff:0a4d:0001"
    <dev>/ports/<port>/gid_attrs/types/<g>   "RoCE v2" | "IB/RoCE v1"
    <dev>/ports/<port>/gid_attrs/ndevs/<g>   "enp1s0f1np1"
    <dev>/device/net/<netdev>/dev_port       0-based port of a netdev without GID entries (InfiniBand)
    ../net/<netdev>/mtu                      the netdev's MTU (``/sys/class/net``)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from twinspark import safeio
from twinspark.doctor.collect import ipv4_by_netdev
from twinspark.fabric.links import LinkState

DEFAULT_ROOT = Path("/sys/class/infiniband")
MAX_ATTRIBUTE_BYTES = 1 << 16
"""A sysfs attribute is at most one page (4 KiB, or 64 KiB on 64K-page kernels); anything larger is not one."""


class SysfsError(Exception):
    """The tree under the root is not what the kernel makes: a missing root, or an attribute that is a FIFO, a
    device or oversized. The message is one line naming the path."""


@dataclass(frozen=True)
class GidEntry:
    """One row of a port's GID table; None where the kernel would not say."""

    index: int
    gid: str | None
    type: str | None
    ndev: str | None


@dataclass(frozen=True)
class PortInfo:
    """What sysfs says about one RDMA device port."""

    device: str
    port: int
    state: str | None
    link_layer: str | None
    gids: tuple[GidEntry, ...]
    netdev: str | None
    mtu: int | None

    @property
    def label(self) -> str:
        return f"{self.device}:{self.port}"


def _read(path: Path) -> str | None:
    """An attribute's text; None when it is missing or the kernel will not show it (raises SysfsError for a file
    that is not a regular one or is larger than an attribute can be)."""
    try:
        data = safeio.read_bounded(path, MAX_ATTRIBUTE_BYTES)
    except (FileNotFoundError, safeio.UnreadableFile):
        return None
    except safeio.RefusedFile as exc:
        raise SysfsError(f"{exc}; a sysfs attribute is a small regular file") from None
    return data.decode("utf-8", errors="replace").strip()


def check_root(root: Path) -> None:
    """Raise SysfsError naming `root` when it is not a directory."""
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise SysfsError(f"{root}: {what}; pass --sysfs-root the directory listing the RDMA devices "
                         f"(default {DEFAULT_ROOT}, present once the RDMA driver is loaded)")


def _numbered_children(path: Path) -> list[int]:
    try:
        names = [entry.name for entry in path.iterdir()]
    except OSError:
        return []
    return sorted(int(name) for name in names if name.isdigit())


def _state_name(text: str | None) -> str | None:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; the kernel prefixes the numeric state."""
    if text is None:
        return None
    return text.split(":", 1)[-1].strip() or None


def _read_gids(port_dir: Path) -> tuple[GidEntry, ...]:
    entries = []
    for index in _numbered_children(port_dir / "gids"):
        entries.append(
            GidEntry(
                index=index,
                gid=_read(port_dir / "gids" / str(index)),
                type=_read(port_dir / "gid_attrs" / "types" / str(index)),
                ndev=_read(port_dir / "gid_attrs" / "ndevs" / str(index)) or None,
            )
        )
    return tuple(entries)


def _netdev_by_port(device_dir: Path) -> dict[int, str]:
    """Netdevs under the device's PCI function, keyed by 1-based port (``dev_port`` is 0-based)."""
    found: dict[int, str] = {}
    net_dir = device_dir / "device" / "net"
    try:
        names = sorted(entry.name for entry in net_dir.iterdir())
    except OSError:
        return found
    for name in names:
        dev_port = _read(net_dir / name / "dev_port")
        port = int(dev_port) + 1 if dev_port and dev_port.isdigit() else 1
        found.setdefault(port, name)
    return found


def _mtu(class_net: Path, netdev: str | None) -> int | None:
    if not netdev:
        return None
    text = _read(class_net / netdev / "mtu")
    return int(text) if text and text.isdigit() else None


def read_ports(root: Path = DEFAULT_ROOT) -> list[PortInfo]:
    """Every port of every RDMA device under root, in device-name then port order.

    Raises SysfsError when an attribute is a FIFO, a device or oversized (a missing root reads as no ports; see
    check_root)."""
    try:
        devices = sorted(entry.name for entry in root.iterdir())
    except OSError:
        return []
    class_net = root.parent / "net"
    ports = []
    for device in devices:
        device_dir = root / device
        by_port = _netdev_by_port(device_dir)
        for number in _numbered_children(device_dir / "ports"):
            port_dir = device_dir / "ports" / str(number)
            gids = _read_gids(port_dir)
            netdev = next((g.ndev for g in gids if g.ndev), None) or by_port.get(number)
            ports.append(
                PortInfo(
                    device=device,
                    port=number,
                    state=_state_name(_read(port_dir / "state")),
                    link_layer=_read(port_dir / "link_layer"),
                    gids=gids,
                    netdev=netdev,
                    mtu=_mtu(class_net, netdev),
                )
            )
    return ports


def netdev_ipv4(netdev: str) -> list[str]:
    """The IPv4 addresses on a netdev of this network namespace, from getifaddrs(3), which works inside a hardened
    unit where `ip` does not (twinspark.doctor.collect.ipv4_by_netdev says why)."""
    return ipv4_by_netdev().get(netdev, [])


IFF_UP = 0x1
CLASS_NET = Path("/sys/class/net")


def read_link(name: str, class_net: Path = CLASS_NET,
              addresses: Callable[[str], list[str]] = netdev_ipv4) -> LinkState:
    """One netdev as `ip -j addr show dev NAME` would describe it, from sysfs and getifaddrs(3) (both work inside
    a hardened unit). The name must be a plain interface name: it is never a path. Raises SysfsError when the
    interface exists but its attributes cannot be read (the caller says it could not look)."""
    if not name or "/" in name or name in (".", ".."):
        return LinkState(name=name, exists=False)
    base = class_net / name
    if not base.exists():
        return LinkState(name=name, exists=False)
    flags_text = _read(base / "flags")
    operstate = _read(base / "operstate")
    mtu_text = _read(base / "mtu")
    if flags_text is None or operstate is None or mtu_text is None:
        raise SysfsError(f"{base}: flags, operstate or mtu cannot be read")
    up = bool(int(flags_text, 16) & IFF_UP)
    flags = ["UP"] if up else []
    # carrier reads only while the interface is administratively up (EINVAL otherwise).
    carrier = _read(base / "carrier") if up else None
    if carrier == "1":
        flags.append("LOWER_UP")
    elif up:
        flags.append("NO-CARRIER")
    # speed likewise needs a carrier; a virtual link without one reads -1 (or refuses). Only a finding's detail:
    # a speed that cannot be read leaves the link judged on the rest.
    try:
        speed = _read(base / "speed") if carrier == "1" else None
    except SysfsError:
        speed = None
    return LinkState(name=name, exists=True, operstate=operstate.upper(), flags=tuple(flags),
                     mtu=int(mtu_text) if mtu_text.isdigit() else None, ipv4=tuple(addresses(name)),
                     speed_mbps=int(speed) if speed and speed.isdigit() and int(speed) > 0 else None)
