"""`twinspark doctor`'s rules over handshaped facts (fixtures/handshaped_doctor_*.json: written by hand in the shape
`twinspark doctor --collect` prints, from the failures Spark pair owners reported; none was collected from a Spark).

One test per failure the issue names: the ENOMEM kernel with and without kho=off, a ConnectX-7 function at x2 of x4,
a missing twin port, the pip-bundled NCCL, MTU 1500 on one node, different kernels, a clock offset; then what the
preflight counts, acknowledgements, and the command's exit codes and outputs.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from twinspark import cli
from twinspark.doctor import command, findings, rules

FIXTURES = Path(__file__).parent / "fixtures"


def facts(name: str) -> dict:
    return json.loads((FIXTURES / f"handshaped_doctor_gb10_{name}.json").read_text(encoding="utf-8"))


def judge(*items: dict, **settings: str) -> rules.Report:
    """Judge one node or a pair, with `settings` laid over each node's recorded ones."""
    by_host = {item["hostname"]: item for item in items}
    envs = {host: rules.settings_of(item, settings) for host, item in by_host.items()}
    return rules.judge_pair(by_host, envs)


def ids(report: rules.Report) -> list[str]:
    return sorted(f.id for f in report.findings)


def finding(report: rules.Report, finding_id: str) -> rules.Finding:
    found = [f for f in report.findings if f.id == finding_id]
    assert len(found) == 1, ids(report)
    return found[0]


def netdev(item: dict, name: str) -> dict:
    return next(n for n in item["netdevs"] if n["name"] == name)


def test_a_healthy_pair_is_clean():
    report = judge(facts("head"), facts("worker"))
    assert report.findings == [] and report.later == []
    assert report.exit_code() == 0


# ------------------------------------------------------------------------------------------- the failures


def test_the_enomem_kernel_without_kho_off_stops_and_names_both_fixes():
    fresh = facts("fresh_worker")
    found = finding(judge(fresh), "kernel.cma-enomem")
    assert found.severity == findings.STOP and not found.fixed_by
    assert "7.0.0-1019-nvidia" in found.message and "ENOMEM" in found.message
    assert "kho=off" in found.fix and "6.17 kernel" in found.fix


@pytest.mark.parametrize("kernel", ["7.0.0-1019-nvidia", "7.0.0-31-generic"])
def test_kho_off_on_the_command_line_clears_the_enomem_kernel(kernel):
    fresh = facts("fresh_worker")
    fresh["kernel"] = kernel
    assert "kernel.cma-enomem" in ids(judge(fresh))
    fresh["cmdline"] += " kho=off"
    assert "kernel.cma-enomem" not in ids(judge(fresh))


@pytest.mark.parametrize("kernel", ["7.0.0-310-generic", "7.0.0-10190-nvidia", "6.17.0-1014-nvidia"])
def test_other_kernels_are_not_the_enomem_ones(kernel):
    head = facts("head")
    head["kernel"] = kernel
    assert "kernel.cma-enomem" not in ids(judge(head))


def test_a_connectx7_function_at_x2_when_it_can_do_x4_is_found():
    found = finding(judge(facts("degraded_cx7")), "pcie.link-degraded")
    assert found.severity == findings.STOP
    assert "0000:01:00.0" in found.message and "x2" in found.message and "x4" in found.message
    assert "power" in found.fix


def test_a_slower_pcie_link_is_found_too():
    head = facts("head")
    head["pcie"][1]["lnksta"]["speed"] = "16.0 GT/s PCIe"
    assert "0000:01:00.1" in finding(judge(head), "pcie.link-degraded").message


def test_a_fatal_pcie_error_is_found():
    head = facts("head")
    head["pcie"][0]["aer_fatal"] = 1
    assert finding(judge(head), "pcie.fatal-error").severity == findings.STOP


def test_one_twin_port_missing_is_found():
    found = finding(judge(facts("degraded_cx7")), "rdma.twin-missing")
    assert "roceP2p1s0f0 is not there" in found.message and found.severity == findings.STOP


def test_the_pip_bundled_nccl_instead_of_the_os_one_is_found():
    head = facts("head")
    bundled = "/opt/twinspark/runtimes/abc/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"
    head["nccl"] = {"path": bundled, "exists": True, "source": "bundled", "version": "2.28.7", "os_package": None}
    found = finding(judge(head, VLLM_NCCL_SO_PATH=""), "nccl.bundled")
    assert found.severity == findings.STOP and bundled in found.message and "twinspark_vllm_nccl_so_path" in found.fix
    # Pointing VLLM_NCCL_SO_PATH itself into a venv is the same mistake.
    head["nccl"]["resolved"] = bundled
    assert "nccl.bundled" in ids(judge(head, VLLM_NCCL_SO_PATH=bundled))


def test_the_os_nccl_is_not_a_finding_and_a_missing_one_waits_for_the_drivers_play():
    assert "nccl.bundled" not in ids(judge(facts("head")))
    missing = finding(judge(facts("fresh_worker")), "nccl.missing")
    assert missing.fixed_by == findings.DRIVERS_PLAY


def test_mtu_1500_on_one_node_is_found():
    worker = facts("worker")
    netdev(worker, "enp1s0f0np0")["mtu"] = 1500
    report = judge(facts("head"), worker)
    node = finding(report, "fabric.mtu")
    assert node.host == "spark-b" and "enp1s0f0np0 has MTU 1500, not 9000" in node.message
    pair = finding(report, "pair.mtu")
    assert pair.severity == findings.STOP and "spark-a 9000, spark-b 1500" in pair.message


def _with_prefixes(item: dict, **wanted: list[str]) -> dict:
    """The facts as the collector now writes them (ipv4_cidr beside ipv4), /24s unless `wanted` names a netdev's."""
    for entry in item["netdevs"]:
        entry["ipv4_cidr"] = wanted.get(entry["name"], [f"{a}/{8 if entry['name'] == 'lo' else 24}"
                                                         for a in entry["ipv4"]])
    return item


def test_twin_netdevs_on_their_own_subnets_are_clean_and_on_one_subnet_stop():
    head = _with_prefixes(facts("head"))
    assert "fabric.shared-subnet" not in ids(judge(head, _with_prefixes(facts("worker"))))
    # The port's twin given an address on the first twin's /24 (netplan written by hand, not by the role).
    worker = _with_prefixes(facts("worker"), enP2p1s0f0np0=["192.168.100.111/24"])
    found = finding(judge(head, worker), "fabric.shared-subnet")
    assert found.host == "spark-b" and found.severity == findings.STOP
    assert "enP2p1s0f0np0 (192.168.100.111/24), enp1s0f0np0 (192.168.100.11/24) share the subnet 192.168.100.0/24" \
        in found.message and "spark_fabric_twin_network" in found.fix


def test_a_wider_subnet_that_overlaps_a_fabric_one_is_found_and_two_lan_ports_are_not_the_fabrics_business():
    head = _with_prefixes(facts("head"), enP7s7=["192.168.0.20/16"])  # the management port's /16 covers the fabric
    found = finding(judge(head), "fabric.shared-subnet")
    assert "192.168.0.0/16" in found.message and "enp1s0f0np0 (192.168.100.10/24)" in found.message
    # Two management-side netdevs on one LAN (wired and wireless): no fabric netdev is involved.
    lan = _with_prefixes(facts("head"), enP7s7=["10.0.0.20/24"], enp1s0f1np1=["10.0.0.21/24"])
    assert "fabric.shared-subnet" not in ids(judge(lan))
    # Facts from a collector before ipv4_cidr: nothing to judge.
    assert "fabric.shared-subnet" not in ids(judge(facts("head")))


def test_two_nodes_with_different_kernels_are_found_by_the_pair_comparison():
    worker = facts("worker")
    worker["kernel"] = "6.17.0-1020-nvidia"
    found = finding(judge(facts("head"), worker), "pair.kernel")
    assert found.host == "spark-a+spark-b"
    assert "spark-a 6.17.0-1014-nvidia, spark-b 6.17.0-1020-nvidia" in found.message
    assert ids(judge(facts("head"), facts("worker"))) == []


def test_the_pair_comparison_finds_driver_nccl_firmware_and_os():
    worker = facts("worker")
    worker["driver_version"] = "580.82.07"
    worker["nccl"]["version"] = "2.27.3"
    worker["rdma"][0]["fw_ver"] = "28.43.1014"
    worker["os_release"]["VERSION_ID"] = "22.04"
    report = judge(facts("head"), worker)
    assert {"pair.driver", "pair.nccl", "pair.firmware", "pair.os"} <= set(ids(report))
    assert finding(report, "pair.nccl").severity == findings.STOP


def test_a_clock_offset_above_the_bound_is_found():
    worker = facts("worker")
    worker["clock"]["offset_s"] = 0.8
    report = judge(facts("head"), worker)
    own = finding(report, "clock.offset")
    assert own.host == "spark-b" and "+0.800 s" in own.message
    assert "0.800 s apart" in finding(report, "pair.clock").message
    worker["clock"]["offset_s"] = findings.CLOCK_OFFSET_BOUND_S * 0.9
    assert not {"clock.offset", "pair.clock"} & set(ids(judge(facts("head"), worker)))


def _rank(item: dict, name: str) -> dict:
    """A copy of a handshaped node's facts under another hostname: a third or fourth rank of a group."""
    other = copy.deepcopy(item)
    other["hostname"] = name
    return other


def test_a_group_of_four_is_compared_across_every_rank():
    worker = facts("worker")
    ranks = [facts("head"), worker, _rank(worker, "spark-c"), _rank(worker, "spark-d")]
    assert ids(judge(*ranks)) == []
    ranks[3]["kernel"] = "6.17.0-1020-nvidia"
    ranks[2]["clock"]["offset_s"] = 0.45
    ranks[3]["clock"]["offset_s"] = -0.2
    report = judge(*ranks)
    kernel = finding(report, "pair.kernel")
    assert kernel.host == "spark-a+spark-b+spark-c+spark-d"
    assert kernel.message.endswith("spark-c 6.17.0-1014-nvidia, spark-d 6.17.0-1020-nvidia")
    assert "every node of the group" in kernel.fix
    # each clock within the bound of its source, but two ranks 0.65 s apart
    assert "clock.offset" not in ids(report)
    assert "up to 0.650 s apart" in finding(report, "pair.clock").message


def test_one_rank_of_a_group_with_another_mtu_stops_the_group():
    worker = facts("worker")
    ranks = [facts("head"), worker, _rank(worker, "spark-c")]
    for item in ranks[2]["netdevs"]:
        if item.get("mtu") == 9000:
            item["mtu"] = 1500
    found = finding(judge(*ranks), "pair.mtu")
    assert found.severity == findings.STOP and "spark-c 1500" in found.message


def test_the_command_judges_up_to_eight_facts_files(tmp_path, capsys):
    paths = []
    for index, name in enumerate(("spark-a", "spark-b", "spark-c")):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(_rank(facts("head" if index == 0 else "worker"), name)), encoding="utf-8")
        paths.append(str(path))
    assert cli.main(["doctor", *[w for path in paths for w in ("--facts", path)], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []
    assert cli.main(["doctor", *[w for _ in range(9) for w in ("--facts", paths[0])]]) == command.EXIT_BAD_INPUT
    assert "give one file (a node), or two to eight (a pair or a group)" in capsys.readouterr().err


def test_an_unsynchronised_clock_is_a_warning():
    head = facts("head")
    head["clock"]["synchronised"] = False
    assert finding(judge(head), "clock.unsynchronised").severity == findings.WARN


# ------------------------------------------------------------------------------------------- the other rules


def test_a_pinned_gid_index_that_drifted_stops():
    head = facts("head")
    found = finding(judge(head, NCCL_IB_GID_AUTO="0", NCCL_IB_GID_INDEX="5"), "gid.pinned-drift")
    assert "index 3 now" in found.message and "pin 3" in found.fix
    assert "gid.pinned-drift" not in ids(judge(head, NCCL_IB_GID_AUTO="0", NCCL_IB_GID_INDEX="3"))


def test_a_port_without_carrier_is_a_cable_not_a_play():
    head = facts("head")
    head["rdma"][0]["ports"][0]["state"] = "DOWN"
    netdev(head, "enp1s0f0np0")["carrier"] = False
    found = finding(judge(head), "rdma.port-down")
    assert "no carrier" in found.message and found.fixed_by == "" and "cable" in found.fix


def test_memory_vllm_cannot_take_stops_unless_the_rank_is_running():
    head = facts("head")
    head["memory_available_bytes"] = 90 * 2**30
    found = finding(judge(head), "memory.budget")
    assert "0.835" in found.message and "twinspark plan" in found.fix
    head["serving"]["running"] = True  # the rank itself holds that memory
    assert "memory.budget" not in ids(judge(head))


def test_little_disk_is_low_then_full():
    head = facts("head")
    head["disk_free_bytes"]["model"]["free_bytes"] = 5 * 2**30
    assert finding(judge(head), "disk.low").severity == findings.WARN
    head["disk_free_bytes"]["model"]["free_bytes"] = 2**30
    assert finding(judge(head), "disk.full").severity == findings.STOP


def test_the_cpu_profile_judges_only_its_own_rules():
    head = facts("head")
    head["kernel"] = "7.0.0-1019-nvidia"
    head["settings"] = {"TWINSPARK_PROFILE": "cpu", "NCCL_SOCKET_IFNAME": "enp1s0f0np0",
                        "VLLM_HOST_IP": "192.168.100.10"}
    report = judge(head)
    assert report.findings == []
    assert all("cpu" in findings.CATALOGUE[i].profiles for i in ("fabric.mtu", "clock.offset", "pair.mtu"))


# ------------------------------------------------------------------------------------------- the preflight's view


def test_the_preflight_counts_only_what_no_later_play_fixes():
    fresh = facts("fresh_worker")
    report = judge(fresh)
    assert {f.id for f in report.stops()} == {"kernel.cma-enomem", "nccl.missing", "fabric.address",
                                              "gid.unresolvable"}
    assert [f.id for f in report.stops(preflight=True)] == ["kernel.cma-enomem"]
    fresh["cmdline"] += " kho=off"
    after = judge(fresh)
    assert after.stops(preflight=True) == [] and after.exit_code(preflight=True) == 1  # the desktop: a warning
    assert "later  spark-b  fabric.mtu" in rules.table(after, preflight=True)


def test_facts_not_known_yet_are_reported_not_judged():
    fresh = facts("fresh_worker")
    fresh["driver_version"] = {"unavailable": "no NVIDIA kernel module loaded"}
    fresh["rdma"] = {"unavailable": "no RDMA driver loaded"}
    report = judge(fresh)
    assert {(item.fact, item.why) for item in report.later} >= {("driver_version", "no NVIDIA kernel module loaded"),
                                                                  ("rdma", "no RDMA driver loaded")}
    assert "gid.unresolvable" not in ids(report)
    assert "n/a    spark-b  rdma  not known yet: no RDMA driver loaded" in rules.table(report)


def test_an_acknowledged_finding_is_still_shown_but_no_longer_counts():
    degraded = facts("degraded_cx7")
    report = judge(degraded, TWINSPARK_DOCTOR_ACK="pcie.link-degraded rdma.twin-missing,clock.offset")
    assert all(f.acknowledged for f in report.findings) and len(report.findings) == 2
    assert report.exit_code() == 0
    assert "ack    spark-b  pcie.link-degraded" in rules.table(report)
    envs = {"spark-b": rules.settings_of(degraded, {"TWINSPARK_DOCTOR_ACK": "pcie.link-degraded clock.offset"})}
    assert rules.unused_acknowledgements(report, envs) == ["spark-b: clock.offset"]


def test_every_finding_a_rule_can_return_is_in_the_catalogue():
    source = Path(rules.__file__).read_text(encoding="utf-8")  # the rules return findings by id
    returned = set(re.findall(r'Found\(\s*"([a-z0-9.-]+)"', source))
    assert returned and returned <= set(findings.CATALOGUE)
    assert set(findings.CATALOGUE) - returned == {"pair.kernel", "pair.driver", "pair.nccl", "pair.mtu",
                                               "pair.firmware", "pair.os"}  # named through differ()


# ------------------------------------------------------------------------------------------- the command


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "twinspark.cli", "doctor", *argv], capture_output=True, text=True,
                          timeout=120, check=False)


def test_doctor_facts_exit_codes_and_json(tmp_path):
    clean = run("--facts", str(FIXTURES / "handshaped_doctor_gb10_head.json"),
                "--facts", str(FIXTURES / "handshaped_doctor_gb10_worker.json"))
    assert clean.returncode == 0 and clean.stdout.startswith("CLEAN")
    stopped = run("--facts", str(FIXTURES / "handshaped_doctor_gb10_degraded_cx7.json"), "--json")
    assert stopped.returncode == 2
    shown = json.loads(stopped.stdout)
    assert shown["exit_code"] == 2
    assert {f["id"] for f in shown["findings"]} == {"pcie.link-degraded", "rdma.twin-missing"}
    fresh = facts("fresh_worker")
    fresh["cmdline"] += " kho=off"
    (tmp_path / "fresh.json").write_text(json.dumps(fresh))
    assert run("--facts", str(tmp_path / "fresh.json"), "--preflight").returncode == 1


def test_doctor_refuses_bad_input_in_one_line(tmp_path):
    (tmp_path / "not-facts.json").write_text('{"hello": 1}')
    for argv, says in ((["--facts", str(tmp_path / "nope.json")], "no such file"),
                       (["--facts", str(tmp_path / "not-facts.json")], "not a facts file"),
                       (["--collect", "--facts", str(tmp_path / "nope.json")], "exclude each other")):
        result = run(*argv)
        assert result.returncode == 3 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and says in result.stderr


def test_doctor_is_registered():
    assert cli.COMMANDS["doctor"][0] == "twinspark.doctor.command"


def test_collect_here_then_judge_that_file(tmp_path):
    """The real collector on this machine (no GPU, no RDMA: those facts say why they are not known)."""
    collected = run("--collect", "--profile", "cpu")
    assert collected.returncode == 0, collected.stderr
    here = json.loads(collected.stdout)
    assert here["kernel"] == Path("/proc/sys/kernel/osrelease").read_text().strip()
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    assert here["memory_total_bytes"] == int(meminfo["MemTotal"].split()[0]) * 1024
    assert here["settings"]["TWINSPARK_PROFILE"] == "cpu"
    (tmp_path / "here.json").write_text(collected.stdout)
    judged = run("--facts", str(tmp_path / "here.json"), "--json")
    assert judged.returncode in (0, 1, 2)
    assert json.loads(judged.stdout)["exit_code"] == judged.returncode


def test_settings_of_fills_defaults_under_the_recorded_ones():
    head = copy.deepcopy(facts("head"))
    values = rules.settings_of(head)
    assert values["NCCL_IB_HCA"] == "=rocep1s0f0,roceP2p1s0f0" and values["MAX_NUM_SEQS"] == "6"
    assert rules.settings_of(head, {"GPU_MEMORY_UTILIZATION": "0.5"})["GPU_MEMORY_UTILIZATION"] == "0.5"


def test_docs_doctor_md_names_every_finding():
    text = (Path(__file__).parents[2] / "docs" / "DOCTOR.md").read_text(encoding="utf-8")
    missing = [finding for finding in findings.CATALOGUE if f"`{finding}`" not in text]
    assert not missing, f"document these finding ids in docs/DOCTOR.md: {missing}"


def test_an_acknowledged_id_must_exist():
    from twinspark import validate

    problems = validate.validate({"TWINSPARK_PROFILE": "cpu", "NODE_RANK": "0", "MASTER_ADDR": "10.77.0.1",
                                  "WORKER_HOST": "10.77.0.2", "VLLM_HOST_IP": "10.77.0.1",
                                  "TWINSPARK_DOCTOR_ACK": "pcie.link-degraded,clock.ofset"}).problems
    assert [str(p) for p in problems] == [
        "TWINSPARK_DOCTOR_ACK: 'clock.ofset' is not a doctor finding id; did you mean clock.offset? (got "
        "'pcie.link-degraded,clock.ofset') (allowed: doctor finding ids (docs/DOCTOR.md) separated by spaces or "
        "commas)"]
