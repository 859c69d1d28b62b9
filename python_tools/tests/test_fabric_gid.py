"""GID index auto-resolution (twinspark/fabric/gid.py, docs/FABRIC.md) on fake sysfs trees of a GB10 pair node."""

from __future__ import annotations

from pathlib import Path

import fake_sysfs
import pytest
from fake_sysfs import ROCE_V1, ROCE_V2, Device, Gid, Port

from twinspark.fabric import gid
from twinspark.fabric.gid import GidResolutionError, resolve, resolve_gid_index

TWINS = "=rocep1s0f1,roceP2p1s0f1"
HEAD_IP = "192.168.100.10"
OWN_ADDRESSES = fake_sysfs.addresses_of(fake_sysfs.GB10_ADDRESSES)


@pytest.fixture
def fake_sysfs_gb10(tmp_path: Path) -> Path:
    """A GB10 with the f1 QSFP port cabled (both twins ACTIVE with an IPv4 each) and f0 DOWN."""
    return fake_sysfs.build(tmp_path, fake_sysfs.gb10_devices())


@pytest.fixture
def fake_sysfs_gb10_twins_differ(tmp_path: Path) -> Path:
    """The second twin also carries a global IPv6 address added first, so its IPv4 GIDs sit at 4/5, not 2/3."""
    devices = fake_sysfs.gb10_devices()
    devices[3].ports[0].gids = [
        Gid(0, "fe80::5a4a:9aff:fe00:21", ROCE_V1),
        Gid(1, "fe80::5a4a:9aff:fe00:21", ROCE_V2),
        Gid(2, "2001:db8::21", ROCE_V1),
        Gid(3, "2001:db8::21", ROCE_V2),
        Gid(4, "192.168.101.10", ROCE_V1),
        Gid(5, "192.168.101.10", ROCE_V2),
    ]
    return fake_sysfs.build(tmp_path, devices)


def one_device(tmp_path: Path, gids: list[Gid], **port) -> Path:
    device = Device("rocep1s0f1", "0000:01:00.1", "enp1s0f1np1", [Port(1, gids=gids, **port)])
    return fake_sysfs.build(tmp_path, [device])


def failure(selector: str, match_ip: str, root: Path, addresses=OWN_ADDRESSES) -> GidResolutionError:
    with pytest.raises(GidResolutionError) as caught:
        resolve(selector, match_ip, root, addresses)
    return caught.value


def test_twins_resolve_to_their_shared_ipv4_roce_v2_index(fake_sysfs_gb10):
    resolution = resolve(TWINS, HEAD_IP, fake_sysfs_gb10, OWN_ADDRESSES)
    assert resolution.index == 3  # 2 is the same address as RoCE v1
    assert resolution.usable == {"rocep1s0f1:1": {3: "match-ip"}, "roceP2p1s0f1:1": {3: "own-addr"}}


def test_down_sibling_port_is_filtered_before_selecting(fake_sysfs_gb10):
    # A prefix that also names the uncabled f0 twins: they are skipped, not members that fail the resolve.
    resolution = resolve("rocep1s0f,roceP2p1s0f", HEAD_IP, fake_sysfs_gb10, OWN_ADDRESSES)
    assert resolution.index == 3
    assert sorted(resolution.usable) == ["roceP2p1s0f1:1", "rocep1s0f1:1"]
    assert {(s.label, s.reason) for s in resolution.skipped} >= {
        ("rocep1s0f0:1", "state DOWN"),
        ("roceP2p1s0f0:1", "state DOWN"),
    }


def test_empty_selector_uses_every_active_port(fake_sysfs_gb10):
    assert resolve("", HEAD_IP, fake_sysfs_gb10, OWN_ADDRESSES).index == 3


def test_match_ip_alone_is_enough_for_the_port_carrying_it(fake_sysfs_gb10):
    no_addresses = fake_sysfs.addresses_of({})
    assert resolve("=rocep1s0f1", HEAD_IP, fake_sysfs_gb10, no_addresses).index == 3


def test_own_address_alone_is_enough_without_a_match_ip(fake_sysfs_gb10):
    resolution = resolve(TWINS, "", fake_sysfs_gb10, OWN_ADDRESSES)
    assert resolution.index == 3
    assert set(resolution.usable["rocep1s0f1:1"].values()) == {"own-addr"}


def test_entry_point_keeps_the_launchers_signature(fake_sysfs_gb10):
    index, notes = resolve_gid_index("=rocep1s0f1", HEAD_IP, fake_sysfs_gb10)
    assert (index, notes) == (3, [])


@pytest.mark.parametrize("state", ["1: DOWN", "5: ACTIVE_DEFER", "2: INIT", "3: ARMED"])
def test_only_active_ports_are_candidates(tmp_path, state):
    root = one_device(tmp_path, fake_sysfs.roce_table(HEAD_IP, "fe80::1"), state=state)
    error = failure("", HEAD_IP, root)
    assert error.exit_code == 1
    assert f"rocep1s0f1:1 (state {state.split(': ')[1]})" in str(error)


@pytest.mark.parametrize("link_layer", ["Ethernet", "InfiniBand"])
def test_ethernet_and_infiniband_ports_are_candidates(tmp_path, link_layer):
    root = one_device(tmp_path, fake_sysfs.roce_table(HEAD_IP, "fe80::1"), link_layer=link_layer)
    assert resolve("", HEAD_IP, root, OWN_ADDRESSES).index == 3


def test_other_link_layers_are_skipped(tmp_path):
    root = one_device(tmp_path, fake_sysfs.roce_table(HEAD_IP, "fe80::1"), link_layer="Unknown")
    error = failure("", HEAD_IP, root)
    assert "rocep1s0f1:1 (link layer Unknown)" in str(error)


@pytest.mark.parametrize("attribute", ["state", "link_layer"])
def test_unreadable_attribute_keeps_the_port(tmp_path, attribute):
    root = one_device(tmp_path, fake_sysfs.roce_table(HEAD_IP, "fe80::1"), **{attribute: None})
    resolution = resolve("", HEAD_IP, root, OWN_ADDRESSES)
    assert resolution.index == 3
    assert any(f"rocep1s0f1:1: {attribute} unreadable" in note for note in resolution.notes)


def test_nothing_selected_names_the_selector_and_every_skipped_port(fake_sysfs_gb10):
    error = failure("=rocep1s0f0,roceP2p1s0f0", HEAD_IP, fake_sysfs_gb10)
    assert error.exit_code == 1
    message = str(error)
    assert "NCCL_IB_HCA='=rocep1s0f0,roceP2p1s0f0'" in message
    for skipped in (
        "rocep1s0f0:1 (state DOWN)",
        "roceP2p1s0f0:1 (state DOWN)",
        "rocep1s0f1:1 (not selected by NCCL_IB_HCA)",
        "roceP2p1s0f1:1 (not selected by NCCL_IB_HCA)",
    ):
        assert skipped in message


def test_a_typo_in_the_selector_selects_nothing(fake_sysfs_gb10):
    assert failure("=rocep1s0f1x", HEAD_IP, fake_sysfs_gb10).exit_code == 1


def test_bare_caret_selects_nothing(fake_sysfs_gb10):
    assert failure("^", HEAD_IP, fake_sysfs_gb10).exit_code == 1


def test_no_rdma_devices_at_all(tmp_path):
    root = tmp_path / "sys" / "class" / "infiniband"
    root.mkdir(parents=True)
    error = failure("", HEAD_IP, root)
    assert error.exit_code == 1
    assert "selects no ACTIVE" in str(error) and "infiniband" in str(error)


def test_a_missing_root_is_invalid_input_naming_the_directory(tmp_path):
    root = tmp_path / "sys" / "class" / "infiniband"
    error = failure("", HEAD_IP, root)
    assert error.exit_code == 2
    assert str(error).startswith(f"{root}: does not exist; pass --sysfs-root")


def test_member_without_a_usable_gid_fails_naming_it(fake_sysfs_gb10):
    # The second twin's netdev lost its address: its IPv4 GID is gone from what the kernel reports as its own.
    only_first = fake_sysfs.addresses_of({"enp1s0f1np1": HEAD_IP})
    error = failure(TWINS, HEAD_IP, fake_sysfs_gb10, only_first)
    assert error.exit_code == 1
    assert "roceP2p1s0f1:1 have no usable RoCE v2 GID" in str(error)
    assert "rocep1s0f1:1=3" in str(error)


def test_roce_v1_gids_are_never_usable(tmp_path):
    root = one_device(tmp_path, [Gid(0, "fe80::1", ROCE_V1), Gid(1, HEAD_IP, ROCE_V1)])
    error = failure("", HEAD_IP, root)
    assert error.exit_code == 1
    assert "rocep1s0f1:1" in str(error)


def test_ipv6_roce_v2_gids_are_never_usable(tmp_path):
    root = one_device(tmp_path, [Gid(1, "fe80::1", ROCE_V2), Gid(3, "2001:db8::10", ROCE_V2)])
    assert failure("", HEAD_IP, root).exit_code == 1


def test_gid_must_end_in_the_ipv4_mapped_prefix(tmp_path):
    # 0a4d:0001 alone (IPv4-compatible, no ffff) is not the mapped form the kernel writes for IPv4.
    root = one_device(tmp_path, [Gid(3, "0000:0000:0000:0000:0000:0000:c0a8:640a", ROCE_V2)])
    assert failure("", HEAD_IP, root).exit_code == 1


def test_own_address_is_looked_up_on_the_gids_own_netdev(tmp_path):
    # GID 3 belongs to a VLAN netdev (gid_attrs/ndevs); the address must be on that netdev, not the parent.
    gids = [Gid(1, "fe80::1", ROCE_V2), Gid(3, "10.9.0.1", ROCE_V2, ndev="enp1s0f1np1.100")]
    root = one_device(tmp_path, gids)
    on_parent = fake_sysfs.addresses_of({"enp1s0f1np1": "10.9.0.1"})
    assert failure("", "", root, on_parent).exit_code == 1
    on_vlan = fake_sysfs.addresses_of({"enp1s0f1np1.100": "10.9.0.1"})
    assert resolve("", "", root, on_vlan).index == 3


def test_members_with_no_common_index_exit_3_listing_each_set(fake_sysfs_gb10_twins_differ):
    error = failure(TWINS, HEAD_IP, fake_sysfs_gb10_twins_differ)
    assert error.exit_code == 3
    assert "roceP2p1s0f1:1=5 rocep1s0f1:1=3" in str(error)
    assert "Narrow NCCL_IB_HCA" in str(error)


def test_narrowing_the_selector_resolves_twins_that_differ(fake_sysfs_gb10_twins_differ):
    assert resolve("=roceP2p1s0f1", "", fake_sysfs_gb10_twins_differ, OWN_ADDRESSES).index == 5


def test_index_reached_through_the_match_ip_wins_over_a_lower_one(tmp_path):
    # The netdev carries two addresses: 10.9.0.1 (GID 3) and the match IP (GID 5). Both are usable; 5 is chosen.
    gids = [Gid(1, "fe80::1", ROCE_V2), Gid(3, "10.9.0.1", ROCE_V2), Gid(5, HEAD_IP, ROCE_V2)]
    root = one_device(tmp_path, gids)
    both = fake_sysfs.addresses_of({"enp1s0f1np1": "10.9.0.1"})
    resolution = resolve("", HEAD_IP, root, both)
    assert (resolution.index, resolution.via) == (5, "match-ip")
    assert resolution.usable["rocep1s0f1:1"] == {3: "own-addr", 5: "match-ip"}


def test_lowest_shared_index_without_a_match_ip_hit(tmp_path):
    gids = [Gid(3, "10.9.0.1", ROCE_V2), Gid(5, "10.9.0.2", ROCE_V2)]
    root = one_device(tmp_path, gids)
    lookup = fake_sysfs.addresses_of({"enp1s0f1np1": "10.9.0.2"})
    assert resolve("", "", root, lambda netdev: ["10.9.0.1", *lookup(netdev)]).index == 3


def test_match_ip_hit_on_any_member_decides(fake_sysfs_gb10):
    # The match IP is on the second twin only; the chosen index is still the shared one it reached.
    resolution = resolve(TWINS, "192.168.101.10", fake_sysfs_gb10, OWN_ADDRESSES)
    assert (resolution.index, resolution.via) == (3, "match-ip")


@pytest.mark.parametrize("bad", ["10.0.0", "node1", "2001:db8::1", "10.0.0.256"])
def test_invalid_match_ip_is_input_error(fake_sysfs_gb10, bad):
    error = failure(TWINS, bad, fake_sysfs_gb10)
    assert error.exit_code == 2
    assert repr(bad) in str(error)


@pytest.mark.parametrize("selector", ["../../../evil", "=../evil", "rocep1s0f1/../../evil", "=/", "."])
def test_selector_is_never_used_as_a_path(tmp_path, selector):
    root = fake_sysfs.build(tmp_path, fake_sysfs.gb10_devices())
    # A complete, valid-looking device outside the infiniband class that only a path join could reach.
    fake_sysfs.build(tmp_path / "outside", [Device("evil", "0000:09:00.0", "evil0", [Port(1, gids=[Gid(3, HEAD_IP)])])])
    (root.parent / "evil").symlink_to(tmp_path / "outside" / "sys" / "class" / "infiniband" / "evil")
    (tmp_path / "evil").symlink_to(tmp_path / "outside" / "sys" / "class" / "infiniband" / "evil")
    error = failure(selector, HEAD_IP, root)
    assert error.exit_code == 1


def many_devices(tmp_path: Path, count: int, down_below: int = 0, bad: set[int] | None = None) -> Path:
    devices = []
    for number in range(count):
        address = "10.9.0.99" if bad and number in bad else HEAD_IP
        state = "1: DOWN" if number < down_below else "4: ACTIVE"
        gids = [Gid(3, address, ROCE_V2)]
        pci = f"0000:{number + 1:02x}:00.0"
        devices.append(Device(f"dev{number:02d}", pci, f"eth{number}", [Port(1, state, gids=gids)]))
    return fake_sysfs.build(tmp_path, devices)


def test_members_are_capped_at_32_by_name_and_the_rest_named(tmp_path):
    # dev32 and dev33 have no usable GID, but they are the 33rd and 34th ports: ignored, as NCCL ignores them.
    root = many_devices(tmp_path, 34, bad={32, 33})
    resolution = resolve("", HEAD_IP, root, OWN_ADDRESSES)
    assert resolution.index == 3
    assert len(resolution.usable) == 32
    assert any("dev32:1" in note and "dev33:1" in note for note in resolution.notes)


def test_cap_applies_after_filtering_down_ports(tmp_path):
    # 32 DOWN ports sort first; the two ACTIVE ones after them must still be the members.
    root = many_devices(tmp_path, 34, down_below=32)
    resolution = resolve("", HEAD_IP, root, OWN_ADDRESSES)
    assert sorted(resolution.usable) == ["dev32:1", "dev33:1"]


def test_selector_entries_after_the_32nd_are_ignored_with_a_note(tmp_path):
    root = many_devices(tmp_path, 2)
    thirty_one = ",".join(f"x{i}" for i in range(31))
    assert failure(f"{thirty_one},x31,dev00", HEAD_IP, root).exit_code == 1  # dev00 is the 33rd entry
    resolution = resolve(f"{thirty_one},dev00,dev01", HEAD_IP, root, OWN_ADDRESSES)
    assert resolution.usable.keys() == {"dev00:1"}
    assert any("selector list truncated" in note for note in resolution.notes)


def test_gid_ipv4_reads_only_the_mapped_form():
    assert gid.gid_ipv4("0000:0000:0000:0000:0000:ffff:c0a8:640a") == "192.168.100.10"
    assert gid.gid_ipv4("fe80:0000:0000:0000:5a4a:9aff:fe00:0011") is None
    assert gid.gid_ipv4(None) is None
    assert gid.gid_ipv4("garbage") is None
