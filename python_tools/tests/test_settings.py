"""The registry and the files generated from it."""

from __future__ import annotations

import pytest

from twinspark import cli, generate, recipe, settings

RUNBOOK_KNOBS = [
    # Cluster and fabric
    "WORKER_HOST", "MASTER_ADDR", "MASTER_PORT", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "VLLM_HOST_IP",
    "TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_MERGE_NICS", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ",
    "NCCL_DMABUF_ENABLE", "NCCL_IB_GID_AUTO", "NCCL_IB_GID_INDEX",
    # Serve shape
    "VLLM_HOST", "VLLM_PORT", "SERVED_MODEL_NAME", "MAX_MODEL_LEN", "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "MAX_NUM_SEQS",
    "MAX_NUM_BATCHED_TOKENS", "LONG_PREFILL_TOKEN_THRESHOLD", "MTP_NUM_TOKENS", "GPU_MEMORY_UTILIZATION",
    "VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "DSPARK_MAX_INFLIGHT_PREFILLS", "VLLM_USE_BREAKABLE_CUDAGRAPH",
    # Model, thinking, speculation, auth
    "MODEL", "DEFAULT_THINKING", "DRAFT_SAMPLE_METHOD", "VLLM_API_KEY", "DSPARK_API_KEYS",
    # This project's own
    "TWINSPARK_PROFILE", "VLLM_NCCL_SO_PATH", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
]


def test_registry_covers_the_runbook_knobs():
    registry = settings.load()
    missing = [name for name in RUNBOOK_KNOBS if registry.get(name) is None]
    assert missing == []


def test_inventory_variables_follow_the_naming_rule():
    for knob in settings.load().knobs:
        # twinspark_<lowercase env>; an env name that already starts with TWINSPARK_ keeps one prefix.
        lower = knob.env.lower()
        expected = lower if lower.startswith("twinspark_") else "twinspark_" + lower
        assert knob.var == expected


def test_profile_defaults_from_the_brief():
    gb10, cpu = recipe.defaults("gb10", 0), recipe.defaults("cpu", 1)
    assert gb10["MODEL"] == "deepseek-ai/DeepSeek-V4-Flash-0731"
    assert gb10["MODEL_REVISION"] == "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"
    assert gb10["VLLM_NCCL_SO_PATH"] == "/usr/lib/aarch64-linux-gnu/libnccl.so.2"
    assert cpu["MODEL"] == "/var/lib/twinspark/models/tiny-llama"
    assert "MODEL_REVISION" not in cpu and "VLLM_NCCL_SO_PATH" not in cpu
    assert (cpu["SERVED_MODEL_NAME"], cpu["MAX_MODEL_LEN"], cpu["VLLM_CPU_OMP_THREADS_BIND"]) == ("tiny", "512", "1")


def test_a_malformed_registry_is_refused():
    with pytest.raises(settings.RegistryError, match="FOO: unknown registry field"):
        settings.parse_registry({"knobs": [{"env": "FOO", "colour": "red"}], "profiles": {}})


def test_generated_files_are_not_stale(capsys):
    stale = generate.stale(generate.repo_root())
    assert stale == [], "run `twinspark settings generate` and commit the result"
    assert cli.main(["settings", "generate", "--check"]) == 0


def test_generate_check_reports_stale_files(tmp_path, capsys):
    assert cli.main(["settings", "generate", "--check", "--root", str(tmp_path)]) == 1
    assert "docs/CONFIG.md: stale" in capsys.readouterr().err
    assert cli.main(["settings", "generate", "--root", str(tmp_path)]) == 0
    assert cli.main(["settings", "generate", "--check", "--root", str(tmp_path)]) == 0
