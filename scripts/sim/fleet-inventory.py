#!/usr/bin/env python3
"""Print the inventory (hosts.yml) of the simulated fleet with N pairs (scripts/sim/lib/common.sh's layout).

    python3 scripts/sim/fleet-inventory.py N [--write DIR]

Pair k is node(2k-1) (head) + node(2k) (worker), named pair_a, pair_b, ...; the router is node(2N+1). Addresses are
the harness's: management 10.78.0.<n>, fabric 10.77.0.<n>. inventory/sim-fleet/hosts.yml is this script's output
for N=2 (a test keeps them equal). With --write DIR it writes DIR/hosts.yml and links DIR/group_vars/all to
inventory/sim/group_vars/all (the pairs' settings are the simulated pair's); `make demo FLEET=1 PAIRS=N` does this
for N other than 2, under the harness's state directory.
"""

from __future__ import annotations

import argparse
import os
import string
import sys
from pathlib import Path

MAX_PAIRS = 60  # scripts/sim/lib/common.sh MAX_SIM_PAIRS: 2 x 60 + 1 management addresses
MGMT = "10.78.0"
FABRIC = "10.77.0"


def pair_name(index: int) -> str:
    """pair_a .. pair_z, then pair_aa, pair_ab, ... (index from 1)."""
    letters = string.ascii_lowercase
    name, number = "", index
    while number:
        number, rest = divmod(number - 1, 26)
        name = letters[rest] + name
    return f"pair_{name}"


def count_words(count: int) -> str:
    return {1: "one pair", 2: "two pairs", 3: "three pairs"}.get(count, f"{count} pairs")


def hosts_yml(pairs: int) -> str:
    if not 1 <= pairs <= MAX_PAIRS:
        raise ValueError(f"pairs: use a whole number from 1 to {MAX_PAIRS}")
    router = 2 * pairs + 1
    switch = "TWINSPARK_SIM_FLEET=1" + ("" if pairs == 2 else f" TWINSPARK_SIM_PAIRS={pairs}")
    make = "make demo FLEET=1" + ("" if pairs == 2 else f" PAIRS={pairs}")
    lines = [
        "---",
        f"# The simulated fleet built by `{switch} scripts/sim/up` (`{make}`, docs/FLEET.md): {count_words(pairs)}",
        "# of systemd-booted nspawn nodes, each pair joined by its own ic0 (10.77.0.0/24, one veth per pair), and a "
        "router",
        "# node; management for every node over the bridge tsbr0 (10.78.0.0/24). The pairs' settings are the simulated",
        "# pair's (group_vars/all is inventory/sim's); this file adds only what makes it a fleet. Written by",
        f"# scripts/sim/fleet-inventory.py {pairs}.",
        "all:",
        "  vars:",
        "    ansible_user: root",
        "    ansible_ssh_private_key_file: /var/tmp/twinspark-sim/ssh/id_ed25519",
        "    # -F: the harness's SSH config, whose ProxyCommand refuses to dial a node while its route would leave the",
        "    # machine (scripts/sim/README.md, \"Network hygiene\").",
        "    ansible_ssh_common_args: -F /var/tmp/twinspark-sim/ssh/config -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null",
        "    # Drain before touch (docs/FLEET.md): every pair's restarts go through the router below. Its URL and each",
        "    # pair's URL in it (twinspark_router_url, twinspark_router_pair_url) come from this inventory.",
        "  children:",
        "    twinspark_pair:",
        "      children:",
    ]
    for index in range(1, pairs + 1):
        head, worker = 2 * index - 1, 2 * index
        lines += [
            f"        {pair_name(index)}:",
            "          vars:",
            f"            twinspark_pair_name: {pair_name(index)}",
            "          hosts:",
        ]
        for node in (head, worker):
            lines += [f"            node{node}:", f"              ansible_host: {MGMT}.{node}",
                      f"              twinspark_fabric_address: {FABRIC}.{node}"]
    lines += ["    twinspark_head:", "      hosts:"]
    lines += [f"        node{2 * index - 1}:" for index in range(1, pairs + 1)]
    lines += ["    twinspark_worker:", "      hosts:"]
    lines += [f"        node{2 * index}:" for index in range(1, pairs + 1)]
    lines += [
        "    twinspark_router:",
        "      vars:",
        "        # The router node installs vllm-router from the harness's wheelhouse, like the pairs' runtime.",
        "        router_wheelhouse: /opt/wheelhouse",
        f"        # The machine running the harness ({MGMT}.254) is the fleet's client.",
        f"        router_allowed_networks: [{MGMT}.0/24]",
        "      hosts:",
        f"        node{router}:",
        f"          ansible_host: {MGMT}.{router}",
        "    # Prometheus and Alertmanager (role monitoring, docs/MONITORING.md) on the router node: it reaches every",
        "    # pair, and the router's own metrics listen on its loopback only.",
        "    twinspark_monitor:",
        "      hosts:",
        f"        node{router}:",
    ]
    return "\n".join(lines) + "\n"


def write(directory: Path, pairs: int, repo: Path) -> None:
    """DIR/hosts.yml (atomically) and DIR/group_vars/all -> the repository's inventory/sim/group_vars/all."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "hosts.yml"
    temporary = target.with_suffix(".yml.tmp")
    temporary.write_text(hosts_yml(pairs))
    os.replace(temporary, target)
    (directory / "group_vars").mkdir(exist_ok=True)
    link = directory / "group_vars" / "all"
    source = (repo / "inventory" / "sim" / "group_vars" / "all").resolve()
    if link.is_symlink() and Path(os.readlink(link)) == source:
        return
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", help=f"how many pairs (1 to {MAX_PAIRS})")
    parser.add_argument("--write", metavar="DIR", type=Path, help="write DIR/hosts.yml and DIR/group_vars/all")
    args = parser.parse_args(argv)
    try:
        pairs = int(args.pairs)
        text = hosts_yml(pairs)
    except ValueError:
        print(f"fleet-inventory: {args.pairs!r}: use a whole number of pairs from 1 to {MAX_PAIRS}", file=sys.stderr)
        return 2
    if args.write:
        write(args.write, pairs, Path(__file__).resolve().parents[2])
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
