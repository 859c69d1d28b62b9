"""``twinspark fabric``: resolve-gid, show, bench and plan.

``resolve-gid`` exit codes: 0 resolved (stdout is exactly one line, the index; notes go to stderr), 1 no port
selected or a member without a usable RoCE v2 GID, 2 invalid input, 3 the members share no index.
``show`` exits 0 (1 when no RDMA device is found, 2 when an attribute is a FIFO, a device or oversized).
``bench``: see ``twinspark.fabric.bench``. ``plan``: see ``twinspark.fabric.plan`` (0 holds, 2 refused, 3 bad input).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from twinspark.fabric import bench, gid, sysfs
from twinspark.fabric import plan as fabric_plan


def _resolve_gid(args: argparse.Namespace) -> int:
    try:
        resolution = gid.resolve(args.hca, args.match_ip, Path(args.sysfs_root))
    except gid.GidResolutionError as error:
        print(f"twinspark fabric resolve-gid: {error}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(error), "exit_code": error.exit_code}))
        return error.exit_code
    for note in resolution.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(resolution.as_dict()))
    else:
        print(resolution.index)
    return 0


def port_rows(ports: list[sysfs.PortInfo], addresses: dict[str, list[str]]) -> list[dict[str, object]]:
    """One record per port: what ibdev2netdev shows plus state, link layer, MTU, IPv4 and usable RoCE v2 GIDs."""
    rows = []
    for port in ports:
        ipv4 = addresses.get(port.netdev or "", [])
        usable = sorted(gid.usable_indexes(port, None, addresses))
        rows.append(
            {
                "device": port.device,
                "port": port.port,
                "netdev": port.netdev,
                "state": port.state,
                "link_layer": port.link_layer,
                "mtu": port.mtu,
                "ipv4": ipv4,
                "roce_v2_gid_indexes": usable,
            }
        )
    return rows


def format_ports(rows: list[dict[str, object]]) -> str:
    header = ("device", "port", "netdev", "state", "link layer", "mtu", "ipv4", "roce v2 gids")

    def cell(value: object) -> str:
        if value is None or value == []:
            return "-"
        if isinstance(value, list):
            return ",".join(str(v) for v in value)
        return str(value)

    table = [header] + [
        tuple(
            cell(row[key])
            for key in ("device", "port", "netdev", "state", "link_layer", "mtu", "ipv4", "roce_v2_gid_indexes")
        )
        for row in rows
    ]
    widths = [max(len(line[column]) for line in table) for column in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in table)


def _show(args: argparse.Namespace) -> int:
    root = Path(args.sysfs_root)
    try:
        ports = sysfs.read_ports(root)
    except sysfs.SysfsError as error:
        print(f"twinspark fabric show: {error}", file=sys.stderr)
        return 2
    netdevs = sorted({p.netdev for p in ports if p.netdev} | {g.ndev for p in ports for g in p.gids if g.ndev})
    addresses = {netdev: sysfs.netdev_ipv4(netdev) for netdev in netdevs}
    rows = port_rows(ports, addresses)
    if args.json:
        print(json.dumps({"sysfs_root": str(root), "ports": rows}, indent=2))
    elif rows:
        print(format_ports(rows))
    if not rows:
        print(f"twinspark fabric show: no RDMA device ports under {root} (is rdma-core installed and the "
              "driver loaded?)", file=sys.stderr)
        return 1
    return 0


def register(subparsers) -> None:
    fabric = subparsers.add_parser("fabric", help="the interconnect: GID index, port table, bandwidth benchmark")
    verbs = fabric.add_subparsers(dest="verb", required=True, metavar="VERB")

    resolve = verbs.add_parser(
        "resolve-gid",
        help="the RoCE GID index NCCL should use on this node",
        description="Print the GID index for NCCL_IB_GID_INDEX (one line). Exit 0 ok, 1 nothing usable selected, "
        "2 invalid input, 3 the selected ports share no index.",
    )
    resolve.add_argument("--hca", required=True, help="the NCCL_IB_HCA selector, e.g. '=rocep1s0f1,roceP2p1s0f1'")
    resolve.add_argument("--sysfs-root", default=str(sysfs.DEFAULT_ROOT), help="default /sys/class/infiniband")
    resolve.add_argument("--match-ip", default="", help="the node's fabric IPv4 address the GID should carry")
    resolve.add_argument("--json", action="store_true", help="print the resolution as JSON")
    resolve.set_defaults(func=_resolve_gid)

    show = verbs.add_parser("show", help="RDMA ports, their netdevs, state, MTU, addresses and usable GIDs")
    show.add_argument("--sysfs-root", default=str(sysfs.DEFAULT_ROOT), help="default /sys/class/infiniband")
    show.add_argument("--json", action="store_true", help="print JSON instead of the table")
    show.set_defaults(func=_show)

    bench_parser = verbs.add_parser(
        "bench",
        help="all_reduce bandwidth between the two nodes (run on both)",
        description="Run on both nodes at once; exit 1 when the peak busbw is below the threshold.",
    )
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(func=bench.main)

    plan_parser = verbs.add_parser(
        "plan",
        help="each node's fabric as an inventory lays it out (interfaces, cables, NCCL settings); contacts nothing",
        description="The inventory's group or pair: topology, layout, pass mark, each node's fabric interfaces (a "
        "mesh's or ring's cable ends) and the NCCL settings the topology adds. Exit 0 the layout holds, 2 the rules "
        "refuse it (one line each on stderr), 3 the inventory cannot be read.",
    )
    fabric_plan.add_arguments(plan_parser)
    plan_parser.set_defaults(func=fabric_plan.run)
