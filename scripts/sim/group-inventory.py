#!/usr/bin/env python3
"""Print the inventory (hosts.yml) of a simulated group of N nodes (scripts/sim/lib/common.sh, TWINSPARK_SIM_GROUP).

    python3 scripts/sim/group-inventory.py N [--topology switch|mesh|ring] [--write DIR]

Nodes node1..nodeN in inventory group twinspark_group, under twinspark_pair (docs/GROUPS.md), ranks 0..N-1 in that
order (node1 also in twinspark_head, the others in twinspark_worker), TP = N; the topology one node: single, two:
direct, three or more: --topology (TWINSPARK_SIM_TOPOLOGY, default switch). Addresses are the harness's: management
10.78.0.<n>, fabric 10.77.0.<n> (a switch group; a single node has no fabric and gives its management address as
its twinspark_fabric_address). A mesh or ring lists its cables in twinspark_links as the harness
lays them (port 0 of node i to port 1 of node i+1, the last back to node1) and takes its addresses from them, one
/24 per cable inside 10.77.0.0/16 (twinspark_fabric_network), which the harness's safety net keeps on this machine.
With --write DIR it writes DIR/hosts.yml and links DIR/group_vars/all to inventory/sim/group_vars/all (the fabric
and serving settings of the simulated pair).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

MAX_NODES = 8  # scripts/sim/lib/common.sh MAX_SIM_GROUP
MGMT = "10.78.0"
FABRIC = "10.77.0"
CABLE_NETWORK = "10.77.0.0/16"  # the harness's safety net blackholes it on this machine (scripts/sim/lib/common.sh)
TOPOLOGIES = {"switch": range(3, 9), "mesh": (3,), "ring": range(4, 9)}  # scripts/sim/lib/common.sh SIM_TOPOLOGY


def topology(count: int, chosen: str = "") -> str:
    return {1: "single", 2: "direct"}.get(count, chosen or "switch")


def cables(count: int) -> list[str]:
    """twinspark_links of a mesh or ring as the harness cables it, one YAML flow mapping per cable."""
    return [f"{{a: node{i}, a_port: 0, b: node{i % count + 1}, b_port: 1}}" for i in range(1, count + 1)]


def hosts_yml(count: int, chosen: str = "") -> str:
    shape = topology(count, chosen)
    lines = [
        "---",
        f"# A simulated group of {count} node(s) built by scripts/sim (TWINSPARK_SIM_GROUP={count}), written by",
        "# scripts/sim/group-inventory.py. Management over tsbr0 (10.78.0.0/24); "
        + ({"mesh": "a mesh: one veth per cable, ic0 (port 0) to the next node's ic1 (port 1).",
            "ring": "a ring: one veth per cable, ic0 (port 0) to the next node's ic1 (port 1)."}.get(shape)
           or "fabric ic0 (10.77.0.0/24)" + (", through the simulated switch tsfab0." if shape == "switch" else ".")),
        "all:",
        "  children:",
        "    twinspark_pair:",
        "      vars:",
        "        ansible_user: root",
        "        ansible_ssh_private_key_file: /var/tmp/twinspark-sim/ssh/id_ed25519",
        "        ansible_ssh_common_args: -F /var/tmp/twinspark-sim/ssh/config -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null",
        "      children:",
        "        twinspark_group:",
        "          hosts:",
    ]
    for index in range(1, count + 1):
        lines += [f"            node{index}:",
                  f"              ansible_host: {MGMT}.{index}"]
        if shape == "single":  # no fabric: the node's own management address (docs/GROUPS.md, "A single Spark")
            lines += [f"              twinspark_fabric_address: {MGMT}.{index}"]
        elif shape not in ("mesh", "ring"):
            lines += [f"              twinspark_fabric_address: {FABRIC}.{index}"]
        lines += [f"              twinspark_rank: {index - 1}"]
        if index == 1:
            lines += [f"              twinspark_topology: {shape}",
                      f"              twinspark_tensor_parallel: {count}"]
            if shape in ("mesh", "ring"):
                lines += [f"              twinspark_fabric_network: {CABLE_NETWORK}",
                          "              twinspark_links:"]
                lines += [f"                - {cable}" for cable in cables(count)]
    # Rank 0 is also the head and every other rank a worker: the plays that act on the head (start, stop, health)
    # and on the headless ranks target these groups, as on a pair.
    lines += ["        twinspark_head:", "          hosts:", "            node1:"]
    if count > 1:
        lines += ["        twinspark_worker:", "          hosts:"]
        lines += [f"            node{index}:" for index in range(2, count + 1)]
    return "\n".join(lines) + "\n"


def write(directory: Path, count: int, chosen: str = "") -> None:
    repo = Path(__file__).resolve().parents[2]
    (directory / "group_vars").mkdir(parents=True, exist_ok=True)
    (directory / "hosts.yml.tmp").write_text(hosts_yml(count, chosen))
    os.replace(directory / "hosts.yml.tmp", directory / "hosts.yml")
    link = directory / "group_vars" / "all"
    target = repo / "inventory" / "sim" / "group_vars" / "all"
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    if link.is_symlink():
        link.unlink()
    link.symlink_to(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("nodes", type=int)
    parser.add_argument("--topology", choices=sorted(TOPOLOGIES), default="")
    parser.add_argument("--write", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= MAX_NODES:
        print(f"group-inventory.py: {args.nodes} nodes: use 1 to {MAX_NODES}", file=sys.stderr)
        return 2
    if args.topology and args.nodes not in TOPOLOGIES[args.topology]:
        print(f"group-inventory.py: --topology {args.topology} with {args.nodes} nodes: use switch (3-8 nodes), "
              "mesh (3) or ring (4-8)", file=sys.stderr)
        return 2
    if args.write:
        write(args.write, args.nodes, args.topology)
    else:
        sys.stdout.write(hosts_yml(args.nodes, args.topology))
    return 0


if __name__ == "__main__":
    sys.exit(main())
