"""The spark_fabric role's link verdicts (twinspark.fabric.links), on `ip -j addr show dev NAME` output."""

from __future__ import annotations

import json

import pytest

from twinspark.fabric import links


def ip_addr(name="ic0", flags=("BROADCAST", "MULTICAST", "UP", "LOWER_UP"), operstate="UP", mtu=9000,
            ipv4=("10.77.0.1",)) -> str:
    """The shape iproute2 prints (fields as in `ip -j addr show dev NAME` on Debian 12)."""
    addr_info = [{"family": "inet", "local": a, "prefixlen": 24, "scope": "global", "label": name} for a in ipv4]
    addr_info.append({"family": "inet6", "local": "fe80::1", "prefixlen": 64, "scope": "link"})
    return json.dumps([{"ifindex": 2, "link_index": 2, "ifname": name, "flags": list(flags), "mtu": mtu,
                        "qdisc": "noqueue", "operstate": operstate, "group": "default", "link_type": "ether",
                        "address": "5a:4a:9a:00:00:11", "broadcast": "ff:ff:ff:ff:ff:ff", "link_netnsid": 0,
                        "addr_info": addr_info}])


def check(stdout: str, rc: int = 0, address: str = "10.77.0.1", mtu: int = 9000) -> list[str]:
    return links.problems(links.parse_link("ic0", stdout, rc), address, mtu)


def test_a_configured_link_has_no_problem():
    assert check(ip_addr()) == []


def test_missing_interface():
    assert check("", rc=1) == [links.MISSING]


def test_link_without_carrier_is_down():
    flags = ("NO-CARRIER", "BROADCAST", "MULTICAST", "UP")
    assert check(ip_addr(flags=flags, operstate="LOWERLAYERDOWN")) == [links.DOWN]


def test_administratively_down_is_for_netplan_to_fix():
    state = links.parse_link("ic0", ip_addr(flags=("BROADCAST", "MULTICAST"), operstate="DOWN"), 0)
    assert links.problems(state, "10.77.0.1", 9000) == [links.ADMIN_DOWN]
    assert links.needs_apply([state], ["10.77.0.1"], 9000)


def test_unknown_operstate_with_carrier_counts_as_up():
    assert check(ip_addr(operstate="UNKNOWN")) == []


def test_state_as_the_harness_leaves_ic0_before_the_role():
    assert check(ip_addr(mtu=1500, ipv4=())) == [links.NO_ADDRESS, links.WRONG_MTU]


def test_another_address_is_not_the_address():
    assert check(ip_addr(ipv4=("10.77.0.9",))) == [links.NO_ADDRESS]


def test_apply_is_needed_for_what_netplan_fixes_not_for_a_pulled_cable():
    down = links.parse_link("ic0", ip_addr(flags=("NO-CARRIER", "UP"), operstate="DOWN"), 0)
    assert not links.needs_apply([down], ["10.77.0.1"], 9000)
    wrong_mtu = links.parse_link("ic0", ip_addr(mtu=1500), 0)
    assert links.needs_apply([wrong_mtu], ["10.77.0.1"], 9000)
    assert links.needs_apply([links.parse_link("ic0", "", 1)], ["10.77.0.1"], 9000)


def test_message_names_node_interface_and_peer():
    state = links.parse_link("ic0", ip_addr(mtu=1500), 0)
    message = links.describe(state, "10.77.0.1", 9000, "node1", "node2")
    assert message.startswith("fabric interface ic0 on node1 (cabled to node2)")
    assert "MTU 1500, expected 9000" in message
    assert links.describe(links.parse_link("ic0", ip_addr(), 0), "10.77.0.1", 9000, "node1", "node2") == ""


@pytest.mark.parametrize(("mtu", "payload"), [(9000, 8972), (1500, 1472)])
def test_ping_payload_fills_the_mtu(mtu, payload):
    assert links.ping_payload(mtu) == payload


def test_failed_ping_message_names_interface_peer_and_what_ping_said():
    output = (
        "PING 10.77.0.2 (10.77.0.2) from 10.77.0.1 ic0: 8972(9000) bytes of data.\n"
        "ping: sendmsg: No buffer space available\n"
    )
    message = links.ping_problem("ic0", "node1", "node2", "10.77.0.2", 9000, 1, output)
    assert message.startswith("fabric interface ic0 on node1: a don't-fragment ping of 9000 bytes to peer node2 ")
    assert "(ping: sendmsg: No buffer space available)" in message
    assert links.ping_problem("ic0", "node1", "node2", "10.77.0.2", 9000, 0, "") == ""
