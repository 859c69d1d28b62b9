#!/usr/bin/env python3
"""Print the inventory (hosts.yml) of a simulated group of N nodes (scripts/sim/lib/common.sh, TWINSPARK_SIM_GROUP).

    python3 scripts/sim/group-inventory.py N [--write DIR]

Nodes node1..nodeN in inventory group twinspark_group, under twinspark_pair (docs/GROUPS.md), ranks 0..N-1 in
that order, the switch topology for three or more (one node: single; two: direct), TP = N. Addresses are the
harness's: management 10.78.0.<n>, fabric 10.77.0.<n>. With --write DIR it writes DIR/hosts.yml and links
DIR/group_vars/all to inventory/sim/group_vars/all (the fabric and serving settings of the simulated pair).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

MAX_NODES = 8  # scripts/sim/lib/common.sh MAX_SIM_GROUP
MGMT = "10.78.0"
FABRIC = "10.77.0"


def topology(count: int) -> str:
    return {1: "single", 2: "direct"}.get(count, "switch")


def hosts_yml(count: int) -> str:
    lines = [
        "---",
        f"# A simulated group of {count} node(s) built by scripts/sim (TWINSPARK_SIM_GROUP={count}), written by",
        "# scripts/sim/group-inventory.py. Management over tsbr0 (10.78.0.0/24); fabric ic0 (10.77.0.0/24),",
        "# through the simulated switch tsfab0 for three nodes or more.",
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
                  f"              ansible_host: {MGMT}.{index}",
                  f"              twinspark_fabric_address: {FABRIC}.{index}",
                  f"              twinspark_rank: {index - 1}"]
        if index == 1:
            lines += [f"              twinspark_topology: {topology(count)}",
                      f"              twinspark_tensor_parallel: {count}"]
    return "\n".join(lines) + "\n"


def write(directory: Path, count: int) -> None:
    repo = Path(__file__).resolve().parents[2]
    (directory / "group_vars").mkdir(parents=True, exist_ok=True)
    (directory / "hosts.yml.tmp").write_text(hosts_yml(count))
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
    parser.add_argument("--write", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= MAX_NODES:
        print(f"group-inventory.py: {args.nodes} nodes: use 1 to {MAX_NODES}", file=sys.stderr)
        return 2
    if args.write:
        write(args.write, args.nodes)
    else:
        sys.stdout.write(hosts_yml(args.nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
