"""The doctor's collector (twinspark/doctor/collect.py): standard library only, so the preflight can run it on a
fresh node; read against fake /sys, /proc and /etc trees shaped like a Spark's (tests/fake_sysfs.py: no ConnectX-7
here), and for real on this machine as a script without any site-packages."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import fake_sysfs

from twinspark.doctor import collect, rules

COLLECTOR = Path(collect.__file__)


def non_stdlib_imports(source: str) -> list[str]:
    """Top-level modules a source imports that the standard library does not provide."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(names - set(sys.stdlib_module_names))


def test_the_collector_imports_the_standard_library_only():
    assert non_stdlib_imports(COLLECTOR.read_text(encoding="utf-8")) == []


def test_the_rule_catches_an_import_from_outside_the_standard_library():
    assert non_stdlib_imports("import json\nimport yaml\nfrom twinspark import layout\n") == ["twinspark", "yaml"]


def test_the_collector_runs_as_a_script_without_site_packages(tmp_path):
    """As the preflight runs it on a fresh node: one file, python3 -S (no site-packages, so no twinspark, no yaml)."""
    copied = tmp_path / "collect.py"
    copied.write_text(COLLECTOR.read_text(encoding="utf-8"))
    result = subprocess.run([sys.executable, "-S", "-I", str(copied), "--path", f"state={tmp_path}/absent/dir",
                             "--nccl-so", "", "--venv", str(tmp_path / "no-venv")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["schema"] == collect.SCHEMA and facts["kernel"] == os.uname().release
    assert facts["disk_free_bytes"]["state"]["checked"] == str(tmp_path)
    assert "unavailable" in facts["nccl"] and facts["nccl"]["source"] == "bundled"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")


def fake_node(tmp_path: Path) -> dict[str, str]:
    """A Spark-shaped node: the four ConnectX-7 functions of fake_sysfs, one of them trained at x2, PCI and netdev
    attributes, /proc and /etc files, a dpkg status with libnccl2. Returns the roots."""
    class_ib = fake_sysfs.build(tmp_path, fake_sysfs.gb10_devices())
    sys_root = class_ib.parent.parent
    for device in fake_sysfs.gb10_devices():
        pci_dir = sys_root / "devices" / "pci0000:00" / device.pci
        (sys_root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
        (sys_root / "bus" / "pci" / "devices" / device.pci).symlink_to(pci_dir)
        for name, value in (("vendor", "0x15b3"), ("device", "0x1021"), ("max_link_width", "4"),
                            ("max_link_speed", "32.0 GT/s PCIe"), ("current_link_speed", "32.0 GT/s PCIe"),
                            ("current_link_width", "2" if device.pci == "0000:01:00.1" else "4"),
                            ("aer_dev_fatal", "Undefined 0\nTOTAL_ERR_FATAL 0")):
            _write(pci_dir / name, value)
        net_dir = pci_dir / "net" / device.netdev
        cabled = device.ports[0].state.endswith("ACTIVE")
        _write(net_dir / "flags", "0x1003" if cabled else "0x1002")
        if cabled:
            _write(net_dir / "carrier", "1")
            _write(net_dir / "speed", "200000")
        (net_dir / "device").symlink_to(pci_dir)
        (pci_dir / "driver").mkdir(exist_ok=True)
    proc, etc = tmp_path / "proc", tmp_path / "etc"
    _write(proc / "sys" / "kernel" / "osrelease", "7.0.0-1019-nvidia")
    _write(proc / "cmdline", "BOOT_IMAGE=/boot/vmlinuz-7.0.0-1019-nvidia ro quiet")
    _write(proc / "meminfo", "MemTotal:       125493204 kB\nMemAvailable:   120000000 kB\nSwapTotal:  0 kB\n"
                             "SwapFree:   0 kB")
    _write(proc / "driver" / "nvidia" / "gpus" / "000f:01:00.0" / "information", "Model: \t\t NVIDIA GB10\nIRQ: 1")
    _write(proc / "4242" / "comm", "earlyoom")
    _write(proc / "4343" / "comm", "gdm3")
    _write(sys_root / "module" / "nvidia" / "version", "580.95.05")
    _write(etc / "os-release", 'ID=ubuntu\nVERSION_ID="24.04"\nPRETTY_NAME="Ubuntu 24.04.3 LTS"\nHOME_URL=x')
    _write(tmp_path / "dpkg-status", "Package: libnccl2\nStatus: install ok installed\nVersion: 2.28.7-1+cuda13.0\n\n"
                                     "Package: other\nStatus: install ok installed\nVersion: 1")
    library = tmp_path / "usr" / "lib" / "libnccl.so.2.28.7"
    _write(library, "")
    (library.parent / "libnccl.so.2").symlink_to(library.name)
    return {"sys_root": str(sys_root), "proc": str(proc), "etc": str(etc), "dpkg_status": str(tmp_path / "dpkg-status"),
            "nccl": str(library.parent / "libnccl.so.2")}


def test_collect_reads_a_spark_shaped_tree(tmp_path):
    roots = fake_node(tmp_path)
    facts = collect.collect(nccl_so=roots["nccl"], venv="", paths={"model": str(tmp_path)}, unit="",
                            sys_root=roots["sys_root"], proc=roots["proc"], etc=roots["etc"],
                            dpkg_status=roots["dpkg_status"],
                            addresses={name: [address] for name, address in fake_sysfs.GB10_ADDRESSES.items()},
                            clock_reader=lambda: {"source": "stub", "synchronised": True, "offset_s": 0.0})
    assert facts["kernel"] == "7.0.0-1019-nvidia" and facts["driver_version"] == "580.95.05"
    assert facts["gpu_name"] == "NVIDIA GB10" and facts["os_release"]["VERSION_ID"] == "24.04"
    assert facts["memory_total_bytes"] == 125493204 * 1024
    assert facts["earlyoom"] == {"running": True} and facts["desktop"] == ["gdm3"]
    assert facts["nccl"]["version"] == "2.28.7" and facts["nccl"]["os_package"] == "2.28.7-1+cuda13.0"
    assert facts["nccl"]["source"] == "other"  # not under /usr/lib of the real root: only the name is judged
    functions = {f["address"]: f for f in facts["pcie"]}
    assert functions["0000:01:00.1"]["lnksta"] == {"width": 2, "speed": "32.0 GT/s PCIe"}
    assert functions["0000:01:00.1"]["netdevs"] == ["enp1s0f1np1"] and functions["0000:01:00.1"]["aer_fatal"] == 0
    devices = {d["device"]: d for d in facts["rdma"]}
    port = devices["rocep1s0f1"]["ports"][0]
    assert port["state"] == "ACTIVE" and port["netdev"] == "enp1s0f1np1"
    assert [g["index"] for g in port["gids"]] == [0, 1, 2, 3] and port["gids"][3]["type"] == "RoCE v2"
    assert devices["rocep1s0f1"]["pci"] == "0000:01:00.1"
    links = {n["name"]: n for n in facts["netdevs"]}
    assert links["enp1s0f1np1"]["speed_mbps"] == 200000 and links["enp1s0f1np1"]["ipv4"] == ["192.168.100.10"]
    assert links["enp1s0f0np0"]["admin_up"] is False and links["enp1s0f0np0"]["carrier"] is None
    # From the tree to the findings: the same rules the preflight applies.
    settings = rules.settings_of({}, {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_HCA": "=rocep1s0f1,roceP2p1s0f1",
                                      "VLLM_HOST_IP": "192.168.100.10", "NODE_RANK": "0",
                                      "VLLM_NCCL_SO_PATH": roots["nccl"]})
    found = {f.id for f in rules.judge_node("fake", facts, settings).findings}
    assert {"kernel.cma-enomem", "pcie.link-degraded", "earlyoom.running", "memory.desktop"} <= found
    assert "gid.unresolvable" not in found and "rdma.twin-missing" not in found


def test_facts_a_fresh_node_cannot_know_say_why(tmp_path):
    facts = collect.collect(nccl_so="", venv=str(tmp_path / "venv"), sys_root=str(tmp_path / "sys"),
                            proc=str(tmp_path / "proc"), etc=str(tmp_path / "etc"), unit="twinspark-vllm.service",
                            dpkg_status=str(tmp_path / "status"), addresses={}, clock_reader=dict)
    for name in ("driver_version", "gpu_name", "nccl", "rdma", "serving"):
        assert "unavailable" in facts[name], name
    assert "drivers play" in facts["driver_version"]["unavailable"]
    assert "runtime play" in facts["nccl"]["unavailable"]


def test_a_managed_file_is_read_as_the_probe_reads_it_so_the_same_gate_decides(tmp_path):
    """playbooks/layout.yml gates its write of the node's layout file on the collector's read, with the same filter
    as a twinspark_probe read: the content a copy would write is converged, a drifted byte or mode is not."""
    from twinspark import converged

    layout = tmp_path / "etc" / "layout.json"
    content = '{"pair_id": "pair1"}\n'
    _write(layout, content.rstrip("\n"))
    layout.chmod(0o644)
    sha1 = __import__("hashlib").sha1(content.encode()).hexdigest()
    read = {"paths": collect.collect(files=[str(layout)])["files"]}
    me = os.getuid()
    assert read["paths"][str(layout)]["parent_isdir"] is True and read["paths"][str(layout)]["json_object"] is True
    assert converged.probe_file_converged(read, str(layout), sha1, "0644", str(me), None)

    layout.write_text("{not json", encoding="utf-8")
    drifted = {"paths": collect.collect(files=[str(layout)])["files"]}
    assert drifted["paths"][str(layout)]["json_object"] is False  # what makes playbooks/layout.yml rewrite it
    assert not converged.probe_file_converged(drifted, str(layout), sha1, "0644", str(me), None)

    layout.write_text(content, encoding="utf-8")
    layout.chmod(0o600)
    moded = {"paths": collect.collect(files=[str(layout)])["files"]}
    assert not converged.probe_file_converged(moded, str(layout), sha1, "0644", str(me), None)

    layout.unlink()
    layout.symlink_to(tmp_path / "elsewhere.json")
    linked = collect.collect(files=[str(layout)])["files"][str(layout)]
    assert linked["islnk"] and "checksum" not in linked

    missing = collect.collect(files=[str(tmp_path / "no-dir" / "layout.json")])["files"]
    assert missing[str(tmp_path / "no-dir" / "layout.json")] == {"exists": False, "parent_isdir": False}


def test_the_preflight_asks_the_collector_for_its_managed_files():
    options = rules.collector_options({"TWINSPARK_PROFILE": "cpu"}, "/v", "/s", "u.service", "/r", ["/etc/x/l.json"])
    argv = rules.collector_argv(options)
    assert argv[argv.index("--file") + 1] == "/etc/x/l.json"
    parsed = collect.argparse.ArgumentParser()
    collect.add_arguments(parsed)
    assert parsed.parse_args(argv).files == ["/etc/x/l.json"]


def test_the_collector_keeps_each_address_with_its_prefix_beside_the_bare_one(tmp_path):
    """getifaddrs' netmask read for real on this machine (loopback is 127.0.0.1/8 everywhere), and collect() writing
    ipv4 (bare, as the fabric rules and the launcher read it) and ipv4_cidr (for fabric.shared-subnet)."""
    assert "127.0.0.1/8" in collect.ipv4_by_netdev(with_prefix=True).get("lo", [])
    assert "127.0.0.1" in collect.ipv4_by_netdev().get("lo", [])
    roots = fake_node(tmp_path)
    facts = collect.collect(nccl_so=roots["nccl"], sys_root=roots["sys_root"], proc=roots["proc"], etc=roots["etc"],
                            dpkg_status=roots["dpkg_status"],
                            addresses={"enp1s0f1np1": ["192.168.100.10/24", "192.168.100.99"]},
                            clock_reader=dict)
    link = next(n for n in facts["netdevs"] if n["name"] == "enp1s0f1np1")
    assert link["ipv4"] == ["192.168.100.10", "192.168.100.99"] and link["ipv4_cidr"] == ["192.168.100.10/24"]
