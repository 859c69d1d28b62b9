"""The bandwidth check before serving: when the preflight finds it due, the record the fabric check keeps on each node
(through filter_plugins/twinspark_doctor.py), and what the record says. The facts are the handshaped gb10 pair of
test_doctor.py; the all_reduce report is what `twinspark fabric bench --json` prints (built by its own function)."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

from twinspark.doctor import bandwidth, rules
from twinspark.fabric import bench

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"


def _filters():
    spec = importlib.util.spec_from_file_location("twinspark_doctor_filters", ROOT / "filter_plugins" /
                                                  "twinspark_doctor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILTERS = _filters()


def head() -> dict:
    return json.loads((FIXTURES / "handshaped_doctor_gb10_head.json").read_text(encoding="utf-8"))


def print_of(head_facts: dict) -> str:
    return bandwidth.fingerprint(head_facts, rules.settings_of(head_facts))


def bench_result(busbw: float, rc: int = 0) -> dict:
    """A registered `twinspark fabric bench --json` run whose peak busbw is `busbw` GB/s on gb10."""
    results = [bench.size_result(1 << 30, (1 << 30) * 2 * 0.5 / (busbw * 1e9), 2)]
    verdict = bench.judge(results, bench.GB10_THRESHOLD_GBPS)
    return {"rc": rc, "stdout": json.dumps(bench.report_dict(results, verdict, "nccl", 2, 0)), "stderr": ""}


def netdev(facts: dict, name: str) -> dict:
    return next(n for n in facts["netdevs"] if n["name"] == name)


@pytest.mark.parametrize(("change", "moves"), [
    (lambda f: netdev(f, "enP2p1s0f0np0").update(mtu=1500), True),    # a selected twin
    (lambda f: f["pcie"][0]["lnksta"].update(width=2), True),
    (lambda f: f["rdma"].pop(2), True),                                 # a twin gone
    (lambda f: f["rdma"][0].update(fw_ver="28.43.1014"), True),
    (lambda f: f.update(kernel="6.17.0-1020-nvidia"), True),
    (lambda f: f["clock"].update(offset_s=0.3), False),
    (lambda f: f.update(memory_available_bytes=1), False),
    (lambda f: netdev(f, "enP7s7").update(mtu=1400), False),            # the management port
    (lambda f: netdev(f, "enp1s0f1np1").update(mtu=1400), False),       # the other QSFP port, not selected
])
def test_the_fingerprint_moves_with_the_fabric_only(change, moves):
    before = head()
    after = copy.deepcopy(before)
    change(after)
    assert (print_of(after) != print_of(before)) is moves


def test_when_the_bandwidth_is_due():
    now = print_of(head())
    passed = {"schema": bandwidth.RECORD_SCHEMA, "passed": True, "fingerprint": now, "checked_at": "t0"}
    assert bandwidth.why_due(passed, now) == ""
    assert bandwidth.why_due(passed, now, requested=True) == "requested"
    assert bandwidth.why_due({"unavailable": "not there"}, now) == "never measured on this node"
    assert "failed" in bandwidth.why_due({**passed, "passed": False}, now)
    assert bandwidth.why_due(passed, "0" * 16) == "the fabric changed since the last measurement (t0)"


def test_the_record_judges_the_all_reduce_and_each_port_against_its_own_mark():
    facts, env = head(), {**rules.settings_of(head())}
    ports = [{"device": "rocep1s0f0", "rc": 0, "gbps": 97.3, "min_gbps": 80.0},
             {"device": "roceP2p1s0f0", "rc": 0, "gbps": 92.6, "min_gbps": 80.0}]
    record = FILTERS.twinspark_bandwidth_record(bench_result(23.74), ports, json.dumps(facts), env, 9000, "t1")
    assert record["passed"] is True and record["fingerprint"] == print_of(facts)
    assert record["all_reduce"]["threshold_gbps"] == bench.GB10_THRESHOLD_GBPS
    assert FILTERS.twinspark_bandwidth_summary(record) == (
        "all_reduce nccl peak 23.74 GB/s of 21.875 GB/s, rocep1s0f0 97.3 of 80 Gb/s, roceP2p1s0f0 92.6 of 80 Gb/s "
        "(t1)")
    slow_port = [ports[0], {**ports[1], "gbps": 41.0}]
    record = FILTERS.twinspark_bandwidth_record(bench_result(23.74), slow_port, json.dumps(facts), env, 9000, "t2")
    assert record["passed"] is False and [p["passed"] for p in record["ports"]] == [True, False]
    slow = FILTERS.twinspark_bandwidth_record(bench_result(3.1, rc=1), ports, json.dumps(facts), env, 9000, "t3")
    assert slow["passed"] is False and slow["all_reduce"]["passed"] is False


def test_a_groups_record_names_the_rank_each_port_was_measured_against():
    facts = head()
    ports = [{"device": "rocep1s0f0", "peer": peer, "rc": 0, "gbps": gbps, "min_gbps": 80.0}
             for peer, gbps in (("node2", 97.3), ("node3", 95.0), ("node4", 12.5))]
    record = FILTERS.twinspark_bandwidth_record(bench_result(23.74), ports, json.dumps(facts), rules.settings_of(facts),
                                                9000, "t1")
    assert record["passed"] is False and [p["passed"] for p in record["ports"]] == [True, True, False]
    assert FILTERS.twinspark_bandwidth_summary(record) == (
        "all_reduce nccl peak 23.74 GB/s of 21.875 GB/s, rocep1s0f0 to node2 97.3 of 80 Gb/s, rocep1s0f0 to node3 "
        "95.0 of 80 Gb/s, rocep1s0f0 to node4 12.5 of 80 Gb/s (t1)")
    # a pair's record, each port measured against its one worker: the line it always had
    pair = FILTERS.twinspark_bandwidth_record(bench_result(23.74), [{**ports[0], "device": device} for device in
                                                                    ("rocep1s0f0", "roceP2p1s0f0")],
                                              json.dumps(facts), rules.settings_of(facts), 9000, "t2")
    assert FILTERS.twinspark_bandwidth_summary(pair) == (
        "all_reduce nccl peak 23.74 GB/s of 21.875 GB/s, rocep1s0f0 97.3 of 80 Gb/s, roceP2p1s0f0 97.3 of 80 Gb/s (t2)")


def test_a_benchmark_that_failed_keeps_why():
    failed = {"rc": 1, "stdout": "", "stderr": "[W socket.cpp] warning\ntwinspark fabric bench: all_reduce with "
                                                 "nccl to 192.168.100.10:29610 failed: timeout\n"}
    record = FILTERS.twinspark_bandwidth_record(failed, [], json.dumps(head()), rules.settings_of(head()), 9000, "t")
    assert record["passed"] is False
    assert record["all_reduce"]["error"].endswith("failed: timeout")
    assert bandwidth.summary(record).startswith("all_reduce failed (rc 1): twinspark fabric bench")


def test_the_preflight_verdict_names_why_each_node_is_due():
    facts = head()
    worker = json.loads((FIXTURES / "handshaped_doctor_gb10_worker.json").read_text(encoding="utf-8"))
    facts["bandwidth_record"] = {"schema": bandwidth.RECORD_SCHEMA, "passed": True, "checked_at": "t0",
                                 "fingerprint": print_of(facts)}
    envs = {"spark-a": facts["settings"], "spark-b": worker["settings"]}
    verdict = FILTERS.twinspark_doctor_verdict({"spark-a": json.dumps(facts), "spark-b": json.dumps(worker)}, envs)
    assert verdict["bandwidth"] == {"spark-a": "", "spark-b": "never measured on this node"}
    assert verdict["bandwidth_due"] is True and verdict["stops"] == [] and verdict["exit_code"] == 0


# ------------------------------------------------------------------------------------------- what health reports


def test_health_reports_the_last_measurement():
    from twinspark.health import checks

    line = "all_reduce gloo peak 0.41 GB/s (report only) (t)"
    assert checks.check_bandwidth("n", {"measured": False}).status == checks.UNKNOWN
    assert checks.check_bandwidth("n", {"measured": True, "passed": True, "summary": line, "due": ""}).status == \
        checks.OK
    failed = checks.check_bandwidth("n", {"measured": True, "passed": False, "summary": line, "due": "x"})
    assert failed.status == checks.DEGRADED and failed.message.startswith("the last fabric measurement failed")
    moved = checks.check_bandwidth("n", {"measured": True, "passed": True, "summary": line,
                                         "due": "the fabric changed since the last measurement (t)"})
    assert moved.status == checks.DEGRADED and "fabric-check.yml" in moved.fix


def test_health_reads_the_record_against_the_fabric_as_it_is(tmp_path):
    import fake_sysfs

    from twinspark.health import gather

    sys_root = str(fake_sysfs.build(tmp_path, fake_sysfs.gb10_devices()).parent.parent)
    env = {"TWINSPARK_PROFILE": "gb10", "NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_HCA": "=rocep1s0f1,roceP2p1s0f1"}
    record_path = tmp_path / "fabric-check.json"
    assert gather.read_bandwidth(env, str(record_path), sys_root)["measured"] is False
    record = bandwidth.make_record({"rc": 0, "backend": "nccl", "peak_busbw_gbps": 23.0, "threshold_gbps": 21.875,
                                    "passed": True}, [], bandwidth.fingerprint(gather.fabric_now(sys_root), env),
                                   "t0", "gb10")
    record_path.write_text(json.dumps(record))
    assert gather.read_bandwidth(env, str(record_path), sys_root) == {
        "measured": True, "passed": True, "summary": "all_reduce nccl peak 23.00 GB/s of 21.875 GB/s (t0)", "due": ""}
    (tmp_path / "sys" / "devices" / "pci0000:00" / "0000:01:00.1" / "net" / "enp1s0f1np1" / "mtu").write_text("1500\n")
    assert gather.read_bandwidth(env, str(record_path), sys_root)["due"] == \
        "the fabric changed since the last measurement (t0)"
