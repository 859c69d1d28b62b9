"""Ansible filters for the spark_fabric role: thin adapters over twinspark.fabric.links.

The role reads `ip -j addr show dev NAME` on the node; whether that is right, and the message when it is not, are
decided in Python (unit-tested there).
"""

from __future__ import annotations

from twinspark.fabric import links


def _state(result):
    return links.parse_link(str(result["item"]["name"]), result.get("stdout", ""), int(result.get("rc", 1)))


def twinspark_fabric_link_problem(result, address, mtu, host, peer):
    """One registered `ip -j addr show dev NAME` result (item = the interface) -> '' when right, else the message."""
    return links.describe(_state(result), str(address), int(mtu), str(host), str(peer))


def twinspark_fabric_needs_apply(results, mtu):
    """The registered loop results (item = {name, address}) -> whether netplan apply would change something."""
    items = list(results.get("results", []))
    states = [_state(result) for result in items]
    return links.needs_apply(states, [str(result["item"]["address"]) for result in items], int(mtu))


def twinspark_fabric_ping_payload(mtu):
    """The don't-fragment ping payload that fills a packet of exactly MTU bytes."""
    return links.ping_payload(int(mtu))


class FilterModule:
    def filters(self):
        return {
            "twinspark_fabric_link_problem": twinspark_fabric_link_problem,
            "twinspark_fabric_needs_apply": twinspark_fabric_needs_apply,
            "twinspark_fabric_ping_payload": twinspark_fabric_ping_payload,
        }
