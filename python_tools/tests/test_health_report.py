"""The health report's three outputs (table, JSON, node_exporter textfile) and the CLI's exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from twinspark import cli
from twinspark.health import report
from twinspark.health.checks import CheckResult

RESULTS = [
    CheckResult("node1", "unit", "ok", "twinspark-vllm.service active (running), enabled"),
    CheckResult("node2", "unit", "failed", "twinspark-vllm.service inactive (dead)",
                "start both ranks in order, worker first: ansible-playbook playbooks/start.yml"),
    CheckResult("pair", "metrics", "degraded", "running 6, waiting 3, KV cache 97.0%", "lower the load"),
]


def test_table_has_one_line_per_check_and_failing_lines_say_what_to_do():
    lines = report.table(RESULTS).splitlines()
    assert lines[0].startswith("ok") and "node1" in lines[0]
    failing = next(i for i, line in enumerate(lines) if line.startswith("FAILED"))
    assert "node2" in lines[failing] and "unit" in lines[failing]
    assert "worker first" in lines[failing + 1]
    assert lines[-1] == "FAILED: 1 ok, 1 degraded, 1 failed (exit 2)"


def test_quiet_table_leaves_out_what_is_ok_but_still_counts_it():
    lines = report.table(RESULTS, quiet=True).splitlines()
    assert not any(line.startswith("ok ") for line in lines)
    assert lines[0].startswith("FAILED") and lines[2].startswith("DEGRADED")
    assert lines[-1] == "FAILED: 1 ok, 1 degraded, 1 failed (exit 2)"


def test_json_shape():
    data = json.loads(json.dumps(report.as_json(RESULTS, {"node1": {"rank": "0"}}, 1.23456, {"running": 6.0})))
    assert data["status"] == "failed" and data["exit_code"] == 2
    assert data["checks"][1] == {"node": "node2", "check": "unit", "status": "failed",
                                 "message": "twinspark-vllm.service inactive (dead)",
                                 "fix": "start both ranks in order, worker first: ansible-playbook playbooks/start.yml"}
    assert set(data["checks"][0]) == {"node", "check", "status", "message", "fix"}
    assert data["nodes"] == {"node1": {"rank": "0"}}
    assert data["elapsed_s"] == 1.235
    assert report.results_from_json(data["checks"]) == RESULTS


def read_prom(path: Path) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_prom_file_parses_back_with_the_status_of_every_check(tmp_path):
    path = tmp_path / "metrics" / "twinspark.prom"
    report.write_prom_file(path, RESULTS, 0.8, {"running": 6.0, "kv_cache_usage": 0.97, "spec_acceptance": None})
    samples = read_prom(path)
    assert samples[("twinspark_health_check_status", (("check", "unit"), ("node", "node1")))] == 0
    assert samples[("twinspark_health_check_status", (("check", "unit"), ("node", "node2")))] == 2
    assert samples[("twinspark_health_check_status", (("check", "metrics"), ("node", "pair")))] == 1
    assert samples[("twinspark_health_status", ())] == 2
    assert samples[("twinspark_health_duration_seconds", ())] == 0.8
    assert samples[("twinspark_vllm_requests_running", ())] == 6
    assert samples[("twinspark_vllm_kv_cache_usage_ratio", ())] == 0.97
    assert ("twinspark_vllm_spec_decode_acceptance_ratio", ()) not in samples
    assert samples[("twinspark_health_last_run_timestamp_seconds", ())] > 0
    assert not list(path.parent.glob("*.tmp*")), "written atomically, no temporary file left behind"


def test_local_health_on_a_machine_without_the_service_exits_2_with_json(tmp_path, capsys):
    serve = tmp_path / "serve.env"
    serve.write_text("TWINSPARK_PROFILE=cpu\nNODE_RANK=1\nNCCL_SOCKET_IFNAME=nonexistent0\nMODEL=/nonexistent\n")
    prom = tmp_path / "out.prom"
    code = cli.main(["health", "--local", "--json", "--node", "node2", "--env", str(serve),
                     "--prom-file", str(prom)])
    data = json.loads(capsys.readouterr().out)
    assert code == 2 and data["exit_code"] == 2
    by_check = {c["check"]: c for c in data["checks"]}
    assert by_check["unit"]["status"] == "failed" and by_check["unit"]["node"] == "node2"
    assert "gpu" not in by_check, "the cpu profile has no GPU check"
    assert "liveness" not in by_check, "a worker (NODE_RANK=1) does not probe the API"
    assert data["nodes"]["node2"]["profile"] == "cpu"
    assert read_prom(prom)[("twinspark_health_status", ())] == 2


def test_pair_only_against_nothing_listening_exits_2(tmp_path, capsys):
    serve = tmp_path / "serve.env"
    serve.write_text("TWINSPARK_PROFILE=cpu\nNODE_RANK=0\nVLLM_HOST=127.0.0.1\nVLLM_PORT=9\n"
                     "SERVED_MODEL_NAME=tiny\n")
    code = cli.main(["health", "--local", "--pair", "--env", str(serve), "--timeout", "2"])
    out = capsys.readouterr().out
    assert code == 2
    check_lines = [line for line in out.splitlines()[:-1] if line.startswith(("ok ", "FAILED ", "DEGRADED "))]
    assert {line.split()[2] for line in check_lines} == {"api-health", "models", "liveness", "metrics"}
    assert out.splitlines()[-1].startswith("FAILED:")
