"""Ansible filters for the spark_fabric role: thin adapters over twinspark.fabric.links.

The role reads `ip -j addr show dev NAME` on the node; whether that is right, and the message when it is not, are
decided in Python (unit-tested there).
"""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))  # python_tools/ on sys.path

from twinspark.fabric import links


def _state(result, name):
    return links.parse_link(str(name), result.get("stdout", ""), int(result.get("rc", 1)))


def twinspark_fabric_link_problem(result, interface, mtu, host, peer):
    """A registered `ip -j addr show dev NAME` result and its interface ({name, address}) -> '' when right, else
    the message naming host, interface and peer."""
    return links.describe(_state(result, interface["name"]), str(interface["address"]), int(mtu), str(host), str(peer))


def twinspark_fabric_link_problems(results, mtu, host, peer):
    """The registered loop results of `ip -j addr show dev NAME` (item = {name, address}, and the cable's peer on a mesh
    or ring) -> one message per bad link."""
    messages = (twinspark_fabric_link_problem(result, result["item"], mtu, host, result["item"].get("peer", peer))
                for result in results["results"])
    return [message for message in messages if message]


def twinspark_fabric_ping_targets(peers, plan, all_hostvars):
    """Every ping this node makes ({peer, name, address}): each of its interfaces to the same one of every peer in the
    run (links.ping_targets), e.g. spark_fabric_peers | twinspark_fabric_ping_targets(spark_fabric_plan, hostvars)."""
    plans = {str(peer): all_hostvars[peer].get("spark_fabric_plan") if peer in all_hostvars else None
             for peer in peers}
    return links.ping_targets([str(peer) for peer in peers], list(plan), plans)


def twinspark_fabric_target_problems(results, mtu, host):
    """The registered loop results of the DF pings over twinspark_fabric_ping_targets -> one message per failed
    ping, naming the peer and its address."""
    messages = []
    for result in results.get("results", []):
        if result.get("skipped"):
            continue
        item = result["item"]
        output = "\n".join([result.get("stdout", ""), result.get("stderr", "")])
        message = links.ping_problem(str(item["name"]), str(host), str(item["peer"]), str(item["address"]), int(mtu),
                                     int(result.get("rc", 1)), output, item.get("cable"))
        if message:
            messages.append(message)
    return messages


def twinspark_fabric_needs_apply(results, mtu):
    """The registered loop results (item = {name, address}) -> whether netplan apply would change something."""
    items = list(results.get("results", []))
    states = [_state(result, result["item"]["name"]) for result in items]
    return links.needs_apply(states, [str(result["item"]["address"]) for result in items], int(mtu))


def twinspark_fabric_ping_payload(mtu):
    """The don't-fragment ping payload that fills a packet of exactly MTU bytes."""
    return links.ping_payload(int(mtu))


class FilterModule:
    def filters(self):
        return {
            "twinspark_fabric_link_problem": twinspark_fabric_link_problem,
            "twinspark_fabric_link_problems": twinspark_fabric_link_problems,
            "twinspark_fabric_ping_targets": twinspark_fabric_ping_targets,
            "twinspark_fabric_target_problems": twinspark_fabric_target_problems,
            "twinspark_fabric_needs_apply": twinspark_fabric_needs_apply,
            "twinspark_fabric_ping_payload": twinspark_fabric_ping_payload,
        }
