"""Builds fake sysfs trees shaped like a real kernel's, standing in for RDMA hardware this machine lacks.

Layout, as on a DGX Spark (paths under <tmp>/sys):

    devices/pci0000:00/<pci>/infiniband/<dev>/ports/<p>/{state,link_layer,gids/<g>,gid_attrs/{types,ndevs}/<g>}
    devices/pci0000:00/<pci>/net/<netdev>/{mtu,dev_port,operstate}
    class/infiniband/<dev> -> ../../devices/pci0000:00/<pci>/infiniband/<dev>
    class/infiniband/<dev>/device -> ../../../<pci>
    class/net/<netdev> -> ../../devices/pci0000:00/<pci>/net/<netdev>

Like the kernel, every port lists its whole GID table; unpopulated entries read as all zeroes and their type/ndev
attributes cannot be read (the kernel answers EINVAL). Since chmod does not stop root, "cannot be read" is modelled by
a directory where the attribute file would be: reading it raises an OSError, as EINVAL does.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
ROCE_V1 = "IB/RoCE v1"
ROCE_V2 = "RoCE v2"
GID_TABLE_SIZE = 16  # real CX-7 ports list 255 entries; the rules only care that unused ones exist


def gid_text(address: str) -> str:
    """A GID as sysfs prints it: eight groups of four hex digits (IPv4 becomes ::ffff:a.b.c.d)."""
    parsed = ipaddress.ip_address(address)
    if isinstance(parsed, ipaddress.IPv4Address):
        parsed = ipaddress.IPv6Address(f"::ffff:{address}")
    return parsed.exploded


@dataclass
class Gid:
    index: int
    address: str  # an IPv4 or IPv6 address, or a raw GID text
    type: str = ROCE_V2
    ndev: str | None = None  # default: the port's netdev


@dataclass
class Port:
    number: int = 1
    state: str | None = "4: ACTIVE"  # None: unreadable
    link_layer: str | None = "Ethernet"  # None: unreadable
    gids: list[Gid] = field(default_factory=list)


@dataclass
class Device:
    name: str
    pci: str
    netdev: str | None
    ports: list[Port] = field(default_factory=lambda: [Port()])
    mtu: int = 9000


def _write(path: Path, text: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is None:
        path.mkdir()
    else:
        path.write_text(text + "\n", encoding="utf-8")


def _relative_symlink(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def build(tmp_path: Path, devices: list[Device]) -> Path:
    """Create the tree and return the root to pass as --sysfs-root (<tmp>/sys/class/infiniband)."""
    sys_dir = tmp_path / "sys"
    class_ib = sys_dir / "class" / "infiniband"
    class_ib.mkdir(parents=True, exist_ok=True)
    (sys_dir / "class" / "net").mkdir(parents=True, exist_ok=True)
    for device in devices:
        pci_dir = sys_dir / "devices" / "pci0000:00" / device.pci
        ib_dir = pci_dir / "infiniband" / device.name
        ib_dir.mkdir(parents=True)
        _relative_symlink(ib_dir / "device", pci_dir)
        _relative_symlink(class_ib / device.name, ib_dir)
        if device.netdev:
            net_dir = pci_dir / "net" / device.netdev
            _write(net_dir / "mtu", str(device.mtu))
            _write(net_dir / "dev_port", "0")
            _write(net_dir / "operstate", "up")
            _relative_symlink(sys_dir / "class" / "net" / device.netdev, net_dir)
        for port in device.ports:
            port_dir = ib_dir / "ports" / str(port.number)
            _write(port_dir / "state", port.state)
            _write(port_dir / "link_layer", port.link_layer)
            populated = {gid.index: gid for gid in port.gids}
            for index in range(max([GID_TABLE_SIZE, *[i + 1 for i in populated]])):
                gid = populated.get(index)
                if gid is None:
                    _write(port_dir / "gids" / str(index), ZERO_GID)
                    _write(port_dir / "gid_attrs" / "types" / str(index), None)
                    _write(port_dir / "gid_attrs" / "ndevs" / str(index), None)
                    continue
                text = gid.address if gid.address.count(":") == 7 else gid_text(gid.address)
                _write(port_dir / "gids" / str(index), text)
                _write(port_dir / "gid_attrs" / "types" / str(index), gid.type)
                _write(port_dir / "gid_attrs" / "ndevs" / str(index), gid.ndev or device.netdev)
    return class_ib


def roce_table(ipv4: str | None, link_local: str, ipv6: str | None = None) -> list[Gid]:
    """The GID table the kernel builds for a RoCE netdev: each address as a v1 and a v2 entry.

    0/1 link-local (v1/v2), 2/3 the IPv4 address (v1/v2), then 4/5 a global IPv6 address when there is one.
    """
    gids = [Gid(0, link_local, ROCE_V1), Gid(1, link_local, ROCE_V2)]
    if ipv4:
        gids += [Gid(2, ipv4, ROCE_V1), Gid(3, ipv4, ROCE_V2)]
    if ipv6:
        start = len(gids)
        gids += [Gid(start, ipv6, ROCE_V1), Gid(start + 1, ipv6, ROCE_V2)]
    return gids


# A GB10's ConnectX-7: two QSFP ports, each shown as two PCIe x4 functions ("twins"). Port f1 is cabled (ACTIVE),
# the sibling f0 has no cable (DOWN). Fabric addresses are from a documentation-style private range.
GB10_ADDRESSES = {"enp1s0f1np1": "192.168.100.10", "enP2p1s0f1np1": "192.168.101.10"}


def gb10_devices() -> list[Device]:
    return [
        Device(
            "rocep1s0f0",
            "0000:01:00.0",
            "enp1s0f0np0",
            [Port(1, "1: DOWN", "Ethernet", roce_table(None, "fe80::5a4a:9aff:fe00:10"))],
        ),
        Device(
            "rocep1s0f1",
            "0000:01:00.1",
            "enp1s0f1np1",
            [Port(1, "4: ACTIVE", "Ethernet", roce_table("192.168.100.10", "fe80::5a4a:9aff:fe00:11"))],
        ),
        Device(
            "roceP2p1s0f0",
            "0002:01:00.0",
            "enP2p1s0f0np0",
            [Port(1, "1: DOWN", "Ethernet", roce_table(None, "fe80::5a4a:9aff:fe00:20"))],
        ),
        Device(
            "roceP2p1s0f1",
            "0002:01:00.1",
            "enP2p1s0f1np1",
            [Port(1, "4: ACTIVE", "Ethernet", roce_table("192.168.101.10", "fe80::5a4a:9aff:fe00:21"))],
        ),
    ]


def addresses_of(mapping: dict[str, str]):
    """A netdev -> IPv4 lookup standing in for the kernel's (the fake netdevs exist only in the tree)."""

    def lookup(netdev: str) -> list[str]:
        return [mapping[netdev]] if netdev in mapping else []

    return lookup
