"""pair.cabling: each node's neighbour entry for another node's fabric address carries one of that node's MACs.

The node facts are the handshaped gb10 pair of test_doctor.py with MACs and neighbour entries laid over them (no
Spark's ARP table was recorded); the collector's part reads handshaped rtnetlink messages, this machine's own table
and a sysfs tree.
"""

from __future__ import annotations

import copy
import socket
import struct

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


def sees(item: dict, address: str, mac: str, netdev: str = "enp1s0f0np0", state: str = "REACHABLE") -> None:
    item["neighbours"].append({"ip": address, "mac": mac, "netdev": netdev, "state": state})


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
    assert "`ip neigh del 192.168.100.11 dev enp1s0f0np0` on spark-a" in found.fix
    assert "playbooks/fabric.yml" in found.fix


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


def test_a_stale_entry_is_not_judged_and_a_pinned_one_is():
    head, worker = node("spark-a", "head"), node("spark-b")
    # a worker replaced since: the head's entry still holds the old NIC's MAC until traffic checks it again
    sees(head, "192.168.100.11", "4c:bb:47:00:99:00", state="STALE")
    assert ids(judge(head, worker)) == []
    head["neighbours"][0]["state"] = "PERMANENT"
    assert ids(judge(head, worker)) == ["pair.cabling"]


def _neighbour_message(index: int, state: int, address: str, mac: bytes, family: int = socket.AF_INET) -> bytes:
    """One RTM_NEWNEIGH message as the kernel sends it (handshaped: nlmsghdr, ndmsg, NDA_DST, NDA_LLADDR)."""
    def attr(kind: int, value: bytes) -> bytes:
        return struct.pack("=HH", 4 + len(value), kind) + value + b"\0" * (-(4 + len(value)) % 4)

    body = struct.pack("=BBHiHBB", family, 0, 0, index, state, 0, 1)
    body += attr(collect.NDA_DST, socket.inet_aton(address) if family == socket.AF_INET else bytes(16))
    body += attr(collect.NDA_LLADDR, mac)
    return struct.pack("=IHHII", 16 + len(body), collect.RTM_NEWNEIGH, 2, 1, 0) + body


def test_the_neighbour_dump_is_read_from_rtnetlink_messages():
    names = {3: "ic0", 2: "mgmt0"}.__getitem__
    data = (_neighbour_message(3, 0x02, "10.77.0.2", bytes.fromhex("ae3f10000002"))
            + _neighbour_message(2, 0x04, "10.78.0.254", bytes.fromhex("02fc00000005"))
            + _neighbour_message(3, 0x02, "::", bytes.fromhex("ae3f10000003"), family=socket.AF_INET6))
    found, done = collect.parse_neighbours(data, names)
    assert found == [{"ip": "10.77.0.2", "mac": "ae:3f:10:00:00:02", "netdev": "ic0", "state": "REACHABLE"},
                     {"ip": "10.78.0.254", "mac": "02:fc:00:00:00:05", "netdev": "mgmt0", "state": "STALE"}]
    assert done is False
    assert collect.parse_neighbours(struct.pack("=IHHII", 16, collect.NLMSG_DONE, 2, 1, 0), names) == ([], True)
    with pytest.raises(OSError):
        collect.parse_neighbours(struct.pack("=IHHII", 16, collect.NLMSG_ERROR, 0, 1, 0), names)


def test_this_machines_own_neighbour_table_reads_and_each_netdev_has_its_mac(tmp_path):
    """The real kernel (a read of this machine's table, no packet sent)."""
    table = collect.neighbours()
    assert isinstance(table, list), table
    assert all(set(entry) == {"ip", "mac", "netdev", "state"} for entry in table)
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
