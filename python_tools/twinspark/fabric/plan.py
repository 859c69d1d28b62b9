"""``twinspark fabric plan INVENTORY``: each node's fabric as the inventory lays it out, judged before any cable is
plugged or any host is touched (docs/GROUPS.md).

For the inventory's group (inventory group twinspark_group) or its pair: the topology, the layout, the bandwidth pass
mark, every node's fabric interfaces (on a mesh or ring the netdev, address and peer of each cable end, as role
spark_fabric writes them; elsewhere the node's twinspark_fabric_address) and the NCCL settings the topology adds.
Nothing is contacted. Exit codes: 0 the layout holds, 2 the rules refuse it (one line each on stderr, naming the
variable), 3 the inventory cannot be read or holds neither a group nor one pair.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from twinspark import group, inventory

EXIT_OK, EXIT_REFUSED, EXIT_BAD_INPUT = 0, 2, 3


def plan(host_vars: dict[str, dict[str, Any]], groups: dict[str, list[str]]) -> dict[str, Any]:
    """The inventory's fabric plan as one JSON-ready dict; `problems` non-empty when the rules refuse it. Raises
    ValueError when the inventory holds neither a group nor one pair."""
    members = [str(host) for host in groups.get(group.GROUP_GROUP) or []]
    if members:
        found = group.read(group.GROUP_GROUP, members, host_vars, groups)
    else:
        heads, workers = groups.get(group.HEAD_GROUP) or [], groups.get(group.WORKER_GROUP) or []
        if len(heads) != 1 or len(workers) != 1:
            raise ValueError(f"no inventory group {group.GROUP_GROUP} and not one pair ({group.HEAD_GROUP}: "
                             f"{len(heads)} host(s), {group.WORKER_GROUP}: {len(workers)})")
        found = group.read("pair", [str(heads[0]), str(workers[0])], host_vars, groups)
    problems = group.problems([found], host_vars)
    first = host_vars.get(found.ranks[0], {}) if found.ranks else {}
    profile = str(first.get("twinspark_profile") or "gb10")
    nodes = []
    for rank, host in enumerate(found.ranks):
        cables = [] if problems else group.cable_interfaces(found, host, profile)
        address = str(host_vars.get(host, {}).get(group.FABRIC_ADDRESS_VAR) or "")
        nodes.append({"rank": rank, "host": host, "interfaces": cables,
                      "fabric_address": None if cables else (address or None)})
    return {"group": found.name, "topology": found.topology, "nodes": found.size, "profile": profile,
            "tp": found.tp, "pp": found.pp, "network": found.network if found.topology in ("mesh", "ring") else None,
            "pass_mark_gbps": group.pass_mark(found), "nccl_env": group.nccl_env(found, "<management interface>"),
            "ranks": nodes, "problems": problems}


def table(result: dict[str, Any]) -> str:
    mark = result["pass_mark_gbps"]
    lines = [f"group {result['group']}: {result['nodes']} node(s), {result['topology']}, "
             f"TP{result['tp']}xPP{result['pp']}, profile {result['profile']}"
             + (f", all_gather pass mark {mark} GB/s" if mark is not None else ", no fabric")]
    rows = [("rank", "host", "netdev", "address", "cable", "peer")]
    for node in result["ranks"]:
        for interface in node["interfaces"]:
            rows.append((str(node["rank"]), node["host"], interface["name"],
                         f"{interface['address']}/{interface['prefix']}", f"twinspark_links[{interface['cable']}]",
                         f"{interface['peer']} port {interface['peer_port']} ({interface['peer_address']})"))
        if not node["interfaces"]:
            rows.append((str(node["rank"]), node["host"], "spark_fabric_interfaces",
                         node["fabric_address"] or "-", "-", "-"))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    if result["nccl_env"]:
        lines.append("NCCL settings this topology adds: "
                     + " ".join(f"{name}={value}" for name, value in sorted(result["nccl_env"].items())))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        host_vars, groups = inventory.read_hosts(args.inventory)
        result = plan(host_vars, groups)
    except (ValueError, OSError) as error:
        print(f"twinspark fabric plan: {args.inventory}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as error:  # noqa: BLE001 - Ansible's own parse errors: one line naming the inventory
        print(f"twinspark fabric plan: {args.inventory}: cannot read it ({type(error).__name__}: "
              f"{str(error).splitlines()[0] if str(error) else 'no detail'})", file=sys.stderr)
        return EXIT_BAD_INPUT
    for problem in result["problems"]:
        print(f"twinspark fabric plan: {problem}", file=sys.stderr)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return EXIT_REFUSED if result["problems"] else EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inventory", help="an inventory directory or hosts file (never contacted)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
