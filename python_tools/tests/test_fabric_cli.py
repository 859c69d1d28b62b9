"""`twinspark fabric resolve-gid` and `fabric show`: exit codes, the one-line stdout contract, JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import fake_sysfs
import pytest
from fake_sysfs import ROCE_V1, ROCE_V2, Gid

from twinspark import cli
from twinspark.fabric import sysfs

TWINS = "=rocep1s0f1,roceP2p1s0f1"


@pytest.fixture
def fake_sysfs_gb10(tmp_path: Path) -> Path:
    return fake_sysfs.build(tmp_path, fake_sysfs.gb10_devices())


@pytest.fixture
def fake_sysfs_gb10_twins_differ(tmp_path: Path) -> Path:
    devices = fake_sysfs.gb10_devices()
    twin_address = "192.168.101.10"
    devices[3].ports[0].gids = [Gid(1, "fe80::21", ROCE_V2), Gid(4, twin_address, ROCE_V1), Gid(5, twin_address)]
    return fake_sysfs.build(tmp_path, devices)


@pytest.fixture
def gb10_addresses(monkeypatch):
    """The fake netdevs exist only in the tree: stand in for the kernel's address list."""
    monkeypatch.setattr(sysfs, "netdev_ipv4", fake_sysfs.addresses_of(fake_sysfs.GB10_ADDRESSES))


def twinspark(*args: str) -> subprocess.CompletedProcess:
    """The installed console script, as the launcher and operators run it."""
    command = shutil.which("twinspark", path=str(Path(sys.executable).parent)) or "twinspark"
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=60, check=False)


def test_console_script_prints_exactly_one_line_the_index(fake_sysfs_gb10):
    result = twinspark(
        "fabric", "resolve-gid", "--hca", "=rocep1s0f1", "--sysfs-root", str(fake_sysfs_gb10),
        "--match-ip", "192.168.100.10",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "3\n"


def test_notes_go_to_stderr_not_stdout(fake_sysfs_gb10, gb10_addresses, capsys):
    # A prefix naming the DOWN siblings too, and more than 32 selector entries: notes, but stdout stays one line.
    selector = ",".join(["rocep1s0f", "roceP2p1s0f"] + [f"unused{i}" for i in range(40)])
    code = cli.main(["fabric", "resolve-gid", "--hca", selector, "--sysfs-root", str(fake_sysfs_gb10),
                     "--match-ip", "192.168.100.10"])
    out, err = capsys.readouterr()
    assert code == 0
    assert out == "3\n"
    assert "selector list truncated" in err


def test_nothing_usable_exits_1_with_empty_stdout(fake_sysfs_gb10):
    result = twinspark("fabric", "resolve-gid", "--hca", "=rocep1s0f0", "--sysfs-root", str(fake_sysfs_gb10))
    assert result.returncode == 1
    assert result.stdout == ""
    assert "rocep1s0f0:1 (state DOWN)" in result.stderr


def test_member_without_gid_exits_1(fake_sysfs_gb10, capsys):
    code = cli.main(["fabric", "resolve-gid", "--hca", TWINS, "--sysfs-root", str(fake_sysfs_gb10),
                     "--match-ip", "192.168.100.10"])
    out, err = capsys.readouterr()
    # No fake netdev has an address in this namespace, so the second twin has no usable GID.
    assert (code, out) == (1, "")
    assert "roceP2p1s0f1:1" in err


def test_no_common_index_exits_3(fake_sysfs_gb10_twins_differ, gb10_addresses, capsys):
    code = cli.main(["fabric", "resolve-gid", "--hca", TWINS, "--sysfs-root", str(fake_sysfs_gb10_twins_differ)])
    out, err = capsys.readouterr()
    assert (code, out) == (3, "")
    assert "roceP2p1s0f1:1=5 rocep1s0f1:1=3" in err


def test_bad_match_ip_exits_2(fake_sysfs_gb10):
    result = twinspark("fabric", "resolve-gid", "--hca", TWINS, "--sysfs-root", str(fake_sysfs_gb10),
                       "--match-ip", "spark-1")
    assert (result.returncode, result.stdout) == (2, "")
    assert "'spark-1'" in result.stderr


def test_json_reports_members_and_skipped_ports(fake_sysfs_gb10, gb10_addresses, capsys):
    code = cli.main(["fabric", "resolve-gid", "--hca", "", "--sysfs-root", str(fake_sysfs_gb10),
                     "--match-ip", "192.168.100.10", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["index"] == 3
    assert report["members"] == {"rocep1s0f1:1": {"3": "match-ip"}, "roceP2p1s0f1:1": {"3": "own-addr"}}
    assert {"port": "rocep1s0f0:1", "reason": "state DOWN"} in report["skipped"]


def test_show_lists_every_port_like_ibdev2netdev(fake_sysfs_gb10, gb10_addresses, capsys):
    assert cli.main(["fabric", "show", "--sysfs-root", str(fake_sysfs_gb10)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["device", "port", "netdev", "state", "link", "layer", "mtu", "ipv4", "roce", "v2",
                                "gids"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["rocep1s0f1"] == ["rocep1s0f1", "1", "enp1s0f1np1", "ACTIVE", "Ethernet", "9000", "192.168.100.10",
                                  "3"]
    assert rows["rocep1s0f0"] == ["rocep1s0f0", "1", "enp1s0f0np0", "DOWN", "Ethernet", "9000", "-", "-"]


def test_show_json(fake_sysfs_gb10, gb10_addresses, capsys):
    assert cli.main(["fabric", "show", "--sysfs-root", str(fake_sysfs_gb10), "--json"]) == 0
    ports = json.loads(capsys.readouterr().out)["ports"]
    assert [p["device"] for p in ports] == ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    assert ports[1] == {
        "device": "roceP2p1s0f1",
        "port": 1,
        "netdev": "enP2p1s0f1np1",
        "state": "ACTIVE",
        "link_layer": "Ethernet",
        "mtu": 9000,
        "ipv4": ["192.168.101.10"],
        "roce_v2_gid_indexes": [3],
    }


def test_show_without_rdma_devices_exits_1(tmp_path, capsys):
    assert cli.main(["fabric", "show", "--sysfs-root", str(tmp_path)]) == 1
    assert "no RDMA device ports" in capsys.readouterr().err


def test_show_finds_the_netdev_of_an_infiniband_port_through_the_pci_device(tmp_path, capsys):
    # IB ports have no RoCE GIDs naming a netdev; ibdev2netdev then goes through device/net/<netdev>/dev_port.
    device = fake_sysfs.Device("mlx5_0", "0000:03:00.0", "ibp3s0", [fake_sysfs.Port(1, link_layer="InfiniBand")],
                               mtu=4092)
    root = fake_sysfs.build(tmp_path, [device])
    assert cli.main(["fabric", "show", "--sysfs-root", str(root), "--json"]) == 0
    port = json.loads(capsys.readouterr().out)["ports"][0]
    assert (port["netdev"], port["mtu"], port["link_layer"]) == ("ibp3s0", 4092, "InfiniBand")
