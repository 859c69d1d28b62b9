"""fabric.sysfs.read_link: a netdev as `ip -j addr` describes it, read from sysfs and getifaddrs(3), the way that
works inside the health timer's and the guard's sandboxes (where `ip` is refused its capset and prints nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinspark.fabric import sysfs
from twinspark.health import checks, gather, report


def make_netdev(root: Path, name: str, flags: str, operstate: str, mtu: int, carrier: str | None,
                speed: str | None = None) -> None:
    """A /sys/class/net/<name> directory shaped like the kernel's (handshaped, not recorded)."""
    base = root / name
    base.mkdir(parents=True)
    (base / "flags").write_text(f"{flags}\n")
    (base / "operstate").write_text(f"{operstate}\n")
    (base / "mtu").write_text(f"{mtu}\n")
    if carrier is not None:
        (base / "carrier").write_text(f"{carrier}\n")
    if speed is not None:
        (base / "speed").write_text(f"{speed}\n")


def addresses(table):
    return lambda name: table.get(name, [])


def test_an_interface_up_with_carrier_reads_as_ip_shows_it(tmp_path):
    make_netdev(tmp_path, "ic0", "0x1003", "up", 9000, "1")
    state = sysfs.read_link("ic0", tmp_path, addresses({"ic0": ["10.77.0.1"]}))
    assert state.exists and state.up and state.mtu == 9000 and state.operstate == "UP"
    assert state.ipv4 == ("10.77.0.1",)


@pytest.mark.parametrize(("speed", "read"), [("200000", 200000), ("-1", None), (None, None)])
def test_the_negotiated_speed_is_read_with_a_carrier(tmp_path, speed, read):
    make_netdev(tmp_path, "ic0", "0x1003", "up", 9000, "1", speed)
    assert sysfs.read_link("ic0", tmp_path, addresses({})).speed_mbps == read


def test_a_speed_that_cannot_be_read_leaves_the_link_judged_on_the_rest(tmp_path):
    make_netdev(tmp_path, "ic0", "0x1003", "up", 9000, "1")
    (tmp_path / "ic0" / "speed").write_text("1" * (sysfs.MAX_ATTRIBUTE_BYTES + 1))  # larger than an attribute: refused
    state = sysfs.read_link("ic0", tmp_path, addresses({}))
    assert state.up and state.mtu == 9000 and state.speed_mbps is None


def test_a_gb10_link_that_came_up_at_100g_is_degraded_and_the_cpu_profile_does_not_judge_speed(tmp_path):
    make_netdev(tmp_path, "ic0", "0x1003", "up", 9000, "1", "100000")
    env = {"NCCL_SOCKET_IFNAME": "ic0", "VLLM_HOST_IP": "10.77.0.1"}

    def read(name):
        return sysfs.read_link(name, tmp_path, addresses({"ic0": ["10.77.0.1"]}))

    slow = checks.check_fabric("node1", gather.read_fabric(env, gb10=True, read_link=read))
    assert slow.status == checks.DEGRADED and "ic0 at 100 Gb/s, not 200" in slow.message and "ethtool" in slow.fix
    assert checks.check_fabric("node1", gather.read_fabric(env, gb10=False, read_link=read)).status == checks.OK


def test_an_interface_without_carrier_is_down(tmp_path):
    make_netdev(tmp_path, "ic0", "0x1003", "down", 9000, "0")
    state = sysfs.read_link("ic0", tmp_path, addresses({}))
    assert state.exists and not state.up and "NO-CARRIER" in state.flags


def test_an_administratively_down_interface_is_down_and_carrier_is_not_read(tmp_path):
    make_netdev(tmp_path, "ic0", "0x1002", "down", 9000, None)  # the kernel refuses carrier (EINVAL) then
    state = sysfs.read_link("ic0", tmp_path, addresses({}))
    assert state.exists and not state.up and "UP" not in state.flags


def test_a_missing_interface_and_a_name_that_is_a_path_do_not_exist(tmp_path):
    make_netdev(tmp_path / "x", "ic0", "0x1003", "up", 9000, "1")
    assert not sysfs.read_link("ic1", tmp_path, addresses({})).exists
    assert not sysfs.read_link("x/ic0", tmp_path, addresses({})).exists
    assert not sysfs.read_link("..", tmp_path, addresses({})).exists


def test_an_interface_whose_attributes_cannot_be_read_makes_the_fabric_check_unknown_not_failed(tmp_path):
    (tmp_path / "ic0").mkdir()  # there, but flags/operstate/mtu unreadable
    facts = gather.read_fabric({"NCCL_SOCKET_IFNAME": "ic0", "VLLM_HOST_IP": "10.77.0.1"}, gb10=False,
                               read_link=lambda name: sysfs.read_link(name, tmp_path, addresses({})))
    result = checks.check_fabric("node1", facts)
    assert result.status == checks.UNKNOWN and "could not look" in result.message
    assert checks.exit_code(checks.overall([checks.ok("node1", "unit", "active"), result])) == 1


def test_the_real_loopback_through_sysfs_and_getifaddrs():
    state = sysfs.read_link("lo")
    assert state.exists and "127.0.0.1" in state.ipv4 and state.mtu and state.mtu >= 1500
    assert "127.0.0.1" in sysfs.netdev_ipv4("lo")


def test_a_healthy_fabric_read_from_sysfs_passes_the_check(tmp_path):
    make_netdev(tmp_path, "ic0", "0x1003", "up", 9000, "1")
    facts = gather.read_fabric({"NCCL_SOCKET_IFNAME": "ic0", "VLLM_HOST_IP": "10.77.0.1"}, gb10=False,
                               read_link=lambda name: sysfs.read_link(name, tmp_path,
                                                                      addresses({"ic0": ["10.77.0.1"]})))
    assert checks.check_fabric("node1", facts).status == checks.OK


@pytest.mark.parametrize(("status", "check_value", "overall_value"), [
    (checks.OK, 0, 0), (checks.UNKNOWN, -1, 1), (checks.FAILED, 2, 2)])
def test_the_textfile_writes_unknown_as_minus_one_and_never_as_failed(tmp_path, status, check_value, overall_value):
    results = [checks.ok("node1", "unit", "active"), checks.CheckResult("node1", "fabric", status, "m", "f")]
    path = tmp_path / "twinspark.prom"
    report.write_prom_file(path, results, 0.1)
    text = path.read_text()
    assert f'twinspark_health_check_status{{check="fabric",node="node1"}} {float(check_value)}' in text
    assert f"twinspark_health_status {float(overall_value)}" in text


def test_the_table_counts_unknown_checks_only_when_there_are_some():
    plain = report.table([checks.ok("n", "unit", "active")])
    assert plain.splitlines()[-1] == "OK: 1 ok, 0 degraded, 0 failed (exit 0)"
    mixed = report.table([checks.ok("n", "unit", "active"), checks.unknown("n", "fabric", "could not look", "f")])
    assert mixed.splitlines()[-1] == "UNKNOWN: 1 ok, 0 degraded, 0 failed, 1 unknown (exit 1)"
