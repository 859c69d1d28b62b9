"""pair.cabling: each node's neighbour entry for another node's fabric address carries one of that node's MACs.

The node facts are the handshaped gb10 pair of test_doctor.py with MACs and neighbour entries laid over them (no
Spark's ARP table was recorded); the collector's part reads a handshaped /proc/net/arp and sysfs tree.
"""

from __future__ import annotations

import copy

import pytest
from test_doctor import facts, finding, ids, judge

from twinspark.doctor import collect, findings

MACS = {
    host: {"enp1s0f0np0": f"4c:bb:47:00:{n}:00", "enP2p1s0f0np0": f"4c:bb:47:00:{n}:02",
           "enP7s7": f"4c:bb:47:00:{n}:07"}
    for host, n in (("spark-a", "0a"), ("spark-b", "0b"), ("spark-c", "0c"))
}


def node(name: str, base: str = "worker", address: str | None = None) -> dict:
    """A handshaped node with each netdev's MAC (lo's all zeros), its socket interface at `address`, no neighbours."""
    item = copy.deepcopy(facts(base))
    item["hostname"] = name
    for netdev in item["netdevs"]:
        netdev["mac"] = MACS[name].get(netdev["name"], "00:00:00:00:00:00" if netdev["name"] == "lo"
                                       else f"4c:bb:47:00:{name[-1] * 2}:ff")
        if address and netdev["name"] == "enp1s0f0np0":
            netdev["ipv4"] = [address]
    item["neighbours"] = []
    return item


def sees(item: dict, address: str, mac: str, netdev: str = "enp1s0f0np0") -> None:
    item["neighbours"].append({"ip": address, "mac": mac, "netdev": netdev})


def test_each_peer_answering_from_its_own_port_is_clean_and_so_is_its_twin():
    head, worker = node("spark-a", "head"), node("spark-b")
    sees(head, "192.168.100.11", MACS["spark-b"]["enp1s0f0np0"])
    # Linux answers ARP for any of its addresses on any of its netdevs: the twin's MAC is still the worker's own
    sees(head, "192.168.101.11", MACS["spark-b"]["enp1s0f0np0"], "enP2p1s0f0np0")
    sees(worker, "192.168.100.10", MACS["spark-a"]["enP2p1s0f0np0"])
    assert ids(judge(head, worker)) == []


def test_another_rank_answering_for_a_peers_address_stops_the_group_naming_it():
    head, worker, third = node("spark-a", "head"), node("spark-b"), node("spark-c", address="192.168.100.12")
    sees(head, "192.168.100.11", MACS["spark-c"]["enp1s0f0np0"])
    sees(head, "192.168.100.12", MACS["spark-c"]["enp1s0f0np0"])
    found = finding(judge(head, worker, third), "pair.cabling")
    assert found.severity == findings.STOP and found.host == "spark-a+spark-b+spark-c"
    assert found.message == ("spark-a reaches spark-b's fabric address 192.168.100.11 (enp1s0f0np0) at "
                             "4c:bb:47:00:0c:00 on enp1s0f0np0, which is spark-c's enp1s0f0np0, not spark-b")
    assert "ip neigh flush to 192.168.100.11` on spark-a" in found.fix and "playbooks/fabric.yml" in found.fix


def test_a_machine_outside_the_group_answering_is_named_as_none_of_it():
    head, worker = node("spark-a", "head"), node("spark-b")
    sees(worker, "192.168.100.10", "02:42:ac:11:00:02")
    found = finding(judge(head, worker), "pair.cabling")
    assert found.message.startswith("spark-b reaches spark-a's fabric address 192.168.100.10 (enp1s0f0np0) at "
                                    "02:42:ac:11:00:02")
    assert found.message.endswith("which is no node of the group, not spark-a")


def test_only_fabric_addresses_are_judged_and_a_missing_entry_or_old_facts_are_not():
    head, worker = node("spark-a", "head"), node("spark-b")
    sees(head, "10.0.0.21", "02:42:ac:11:00:02", "enP7s7")  # the management port is not the fabric's business
    assert ids(judge(head, worker)) == []
    # facts collected before neighbours and MACs were: the observer's table unknown, or the peer's own MACs
    sees(head, "192.168.100.11", "02:42:ac:11:00:02")
    old_head = {k: v for k, v in head.items() if k != "neighbours"}
    assert ids(judge(old_head, worker)) == []
    for netdev in worker["netdevs"]:
        netdev.pop("mac")
    assert ids(judge(head, worker)) == []


def test_a_single_node_has_no_peer_to_judge():
    head = node("spark-a", "head")
    sees(head, "192.168.100.11", "02:42:ac:11:00:02")
    assert "pair.cabling" not in ids(judge(head))


ARP = """IP address       HW type     Flags       HW address            Mask     Device
10.77.0.2        0x1         0x2         AE:3F:10:00:00:02     *        ic0
10.77.0.9        0x1         0x0         00:00:00:00:00:00     *        ic0
10.78.0.254      0x1         0x6         02:fc:00:00:00:05     *        mgmt0
garbage line
"""


def test_the_collector_keeps_complete_neighbour_entries_and_each_netdevs_mac(tmp_path):
    (tmp_path / "proc" / "net").mkdir(parents=True)
    (tmp_path / "proc" / "net" / "arp").write_text(ARP, encoding="utf-8")
    assert collect.neighbours(str(tmp_path / "proc")) == [
        {"ip": "10.77.0.2", "mac": "ae:3f:10:00:00:02", "netdev": "ic0"},
        {"ip": "10.78.0.254", "mac": "02:fc:00:00:00:05", "netdev": "mgmt0"},
    ]
    assert "unavailable" in collect.neighbours(str(tmp_path / "absent"))
    net = tmp_path / "sys" / "class" / "net"
    for name, mac in (("ic0", "AE:3F:10:00:00:01\n"), ("lo", "00:00:00:00:00:00\n")):
        (net / name).mkdir(parents=True)
        (net / name / "address").write_text(mac, encoding="utf-8")
        (net / name / "flags").write_text("0x1003\n", encoding="utf-8")
    macs = {n["name"]: n["mac"] for n in collect.netdevs(str(tmp_path / "sys"), {})}
    assert macs == {"ic0": "ae:3f:10:00:00:01", "lo": "00:00:00:00:00:00"}


@pytest.mark.parametrize("mac", ["4C:BB:47:00:0B:00", "4c:bb:47:00:0b:00"])
def test_macs_compare_without_case(mac):
    head, worker = node("spark-a", "head"), node("spark-b")
    sees(head, "192.168.100.11", mac)
    assert ids(judge(head, worker)) == []
