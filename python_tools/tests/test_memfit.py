"""`twinspark plan`, the memory planner, on a handshaped DeepSeek-V4-Flash directory (fixtures/
handshaped_deepseek_v4_flash_model: transformers' DeepseekV4Config defaults for the attention shape, the 155 GB the
pinned checkpoint downloads for the weights; not the checkpoint's own files) and the handshaped Spark's memory of the
doctor's facts (fixtures/handshaped_doctor_gb10_head.json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from twinspark import memfit as plan

FIXTURES = Path(__file__).parent / "fixtures"
MODEL = FIXTURES / "handshaped_deepseek_v4_flash_model"
FACTS = FIXTURES / "handshaped_doctor_gb10_head.json"
SPARK_MEMORY = json.loads(FACTS.read_text(encoding="utf-8"))["memory_total_bytes"]

# The DSpark runbook's published figures (docs/DOCTOR.md, "What the planner is compared with"): a KV pool of about 2.49M
# tokens (18.08 GiB) at GPU_MEMORY_UTILIZATION 0.835, and 3,421,786 tokens in the validated 1M-context run, whose
# utilisation the runbook does not give. Both ran the fork runtime (nvfp4_ds_mla).
PUBLISHED_POOL_TOKENS = 2_490_000
PUBLISHED_POOL_BYTES = 18.08 * 2**30
PUBLISHED_VALIDATED_TOKENS = 3_421_786


def run_plan(tmp_path: Path, env_text: str, *extra: str, model: Path = MODEL) -> subprocess.CompletedProcess:
    env = tmp_path / "plan.env"
    env.write_text(env_text)
    return subprocess.run([sys.executable, "-m", "twinspark.cli", "plan", "--env", str(env), "--model-dir",
                           str(model), *extra], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("flavour", ["stock", "fork"])
def test_the_gb10_defaults_fit(tmp_path, flavour):
    done = run_plan(tmp_path, f"TWINSPARK_PROFILE=gb10\nTWINSPARK_RUNTIME_FLAVOUR={flavour}\n", "--facts", str(FACTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("fits")
    shown = json.loads(run_plan(tmp_path, f"TWINSPARK_RUNTIME_FLAVOUR={flavour}\n", "--facts", str(FACTS),
                                "--json").stdout)
    assert shown["fits"] is True and shown["kv_cache_tokens"] >= shown["max_model_len"] == 1048576
    assert shown["kv_cache_dtype"] == {"stock": "fp8_ds_mla", "fork": "nvfp4_ds_mla"}[flavour]
    assert shown["weights_bytes"] == 155_000_000_000 // 2 and shown["memory_total_bytes"] == SPARK_MEMORY


def test_utilisation_055_does_not_fit_and_names_the_knob_and_a_value_that_fits(tmp_path):
    done = run_plan(tmp_path, "GPU_MEMORY_UTILIZATION=0.55\n", "--memory-bytes", str(SPARK_MEMORY))
    assert done.returncode == 2
    verdict = done.stdout.rstrip().splitlines()[-1]
    assert verdict.startswith("DOES NOT FIT: GPU_MEMORY_UTILIZATION=")
    suggested = verdict.split("GPU_MEMORY_UTILIZATION=")[1].split()[0]
    assert 0.55 < float(suggested) <= plan.UTILISATION_CEILING
    again = run_plan(tmp_path, f"GPU_MEMORY_UTILIZATION={suggested}\n", "--memory-bytes", str(SPARK_MEMORY))
    assert again.returncode == 0, again.stdout


def test_weights_too_large_for_a_rank_do_not_fit_at_any_utilisation(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((MODEL / "config.json").read_text())
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 300_000_000_000},
                                                                     "weight_map": {}}))
    done = run_plan(tmp_path, "GPU_MEMORY_UTILIZATION=0.9\n", "--memory-bytes", str(SPARK_MEMORY), model=model)
    assert done.returncode == 2
    assert "DOES NOT FIT: MODEL: its weights need 139.7 GiB per rank" in done.stdout


def test_a_max_model_len_the_kv_cache_cannot_hold_names_both_ways_out(tmp_path):
    done = run_plan(tmp_path, "GPU_MEMORY_UTILIZATION=0.7\nMAX_MODEL_LEN=5000000\n", "--memory-bytes",
                    str(SPARK_MEMORY))
    assert done.returncode == 2
    assert "or MAX_MODEL_LEN=" in done.stdout and "GPU_MEMORY_UTILIZATION=" in done.stdout


def test_the_kv_cache_dtype_is_the_flavours_fixed_flag():
    assert plan.kv_cache_dtype({"TWINSPARK_PROFILE": "gb10"}) == "fp8_ds_mla"
    assert plan.kv_cache_dtype({"TWINSPARK_PROFILE": "gb10", "TWINSPARK_RUNTIME_FLAVOUR": "fork"}) == "nvfp4_ds_mla"
    assert plan.kv_cache_dtype({"TWINSPARK_PROFILE": "cpu"}) == "auto"


def test_deepseek_v4_state_sizes():
    # vLLM 0.33.0 sizes a DeepSeek-V4 fp8_ds_mla state at 584 bytes (448 NoPE + 128 RoPE + 8 scale).
    assert plan.DS_STATE_BYTES["fp8_ds_mla"](448, 64) == 584
    assert plan.DS_STATE_BYTES["nvfp4_ds_mla"](448, 64) == 316
    config = json.loads((MODEL / "config.json").read_text())
    assert sorted(set(plan.ds4_ratios(config))) == [4, 128] and plan.ds4_ratios(config).count(4) == 20


def test_a_standard_attention_model_on_the_cpu_profile(tmp_path):
    """The simulated pair's tiny Llama shape: 2 layers, 4 KV heads of 16 (2 per rank), float32."""
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                                                   "num_attention_heads": 4, "num_key_value_heads": 4,
                                                   "torch_dtype": "float32"}))
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    fits = json.loads(run_plan(tmp_path, "TWINSPARK_PROFILE=cpu\n", "--memory-bytes", str(8 * 2**30), "--json",
                               model=model).stdout)
    assert fits["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4 and fits["fits"] is True
    assert fits["kv_cache_tokens"] == 2**30 // 512 and fits["weights_bytes"] == 2048
    done = run_plan(tmp_path, "TWINSPARK_PROFILE=cpu\nMAX_MODEL_LEN=4000000\n", "--memory-bytes", str(8 * 2**30),
                    model=model)
    assert done.returncode == 2 and "VLLM_CPU_KVCACHE_SPACE=2 (GiB)" in done.stdout


def test_bad_input_is_one_line_and_exit_3(tmp_path):
    done = run_plan(tmp_path, "GPU_MEMORY_UTILIZATION=1.5\n", "--memory-bytes", "1")
    assert done.returncode == 3 and done.stderr.count("\n") == 1 and "GPU_MEMORY_UTILIZATION" in done.stderr
    done = run_plan(tmp_path, "", "--memory-bytes", "1", model=tmp_path)
    assert done.returncode == 3 and "config.json" in done.stderr


def test_the_fork_estimate_against_the_runbooks_published_pool(capsys):
    """Labelled comparison, not a calibration. The planner counts KV tokens as vLLM 0.33.0 lays the cache out (blocks
    of DeepSeek-V4's five layer groups, the blocks a MAX_MODEL_LEN request takes, sliding windows included); the
    runbook's figures come from its fork build with nvfp4_ds_mla, which 0.33.0 does not take for deepseek_v4, so its
    page sizes are an estimate. Printed: the KV memory the planner leaves against the published 18.08 GiB, the tokens
    at that memory and at the published memory against the published pool (same run: 0.835, MAX_MODEL_LEN 1M, 8192
    batched tokens) and against the validated run's figure (its utilisation is not published). Held: the memory within
    a quarter and, at the published memory, the tokens within 15 % of that run's pool."""
    values = plan.plan_settings({"TWINSPARK_PROFILE": "gb10", "TWINSPARK_RUNTIME_FLAVOUR": "fork"})
    planned = plan.plan_for(values, MODEL, SPARK_MEMORY)
    config = json.loads((MODEL / "config.json").read_text())
    at_published = plan.kv_layout(config, planned.kv_cache_dtype, values).tokens(int(PUBLISHED_POOL_BYTES),
                                                                                 planned.max_model_len)
    memory_error = planned.kv_cache_bytes / PUBLISHED_POOL_BYTES - 1
    pool_error = planned.kv_cache_tokens / PUBLISHED_POOL_TOKENS - 1
    same_memory_error = at_published / PUBLISHED_POOL_TOKENS - 1
    validated_error = planned.kv_cache_tokens / PUBLISHED_VALIDATED_TOKENS - 1
    with capsys.disabled():
        print(f"\n[planner vs published, fork/nvfp4_ds_mla at 0.835] KV memory {planned.kv_cache_bytes / 2**30:.2f} "
              f"GiB vs 18.08 GiB ({memory_error:+.0%}); KV tokens {planned.kv_cache_tokens:,} vs ~2,490,000 "
              f"({pool_error:+.0%}), {at_published:,} at the published 18.08 GiB ({same_memory_error:+.1%}), and "
              f"vs 3,421,786 in the validated run ({validated_error:+.0%}); {planned.kv_layout}")
    assert abs(memory_error) < 0.25
    assert abs(same_memory_error) < 0.15


def spark_env(**extra: str) -> dict[str, str]:
    """A gb10 head's env file values serving the handshaped model from its directory."""
    return {"TWINSPARK_PROFILE": "gb10", "NODE_RANK": "0", "MASTER_ADDR": "10.99.0.1", "WORKER_HOST": "10.99.0.2",
            "VLLM_HOST_IP": "10.99.0.1", "MODEL": str(MODEL), "MODEL_REVISION": "", **extra}


def test_fit_here_refuses_warns_or_cannot_judge(monkeypatch):
    monkeypatch.setattr(plan, "node_memory", lambda: SPARK_MEMORY)
    assert plan.fit_here(spark_env()).plan.fits and not plan.fit_here(spark_env()).refusal
    refused = plan.fit_here(spark_env(GPU_MEMORY_UTILIZATION="0.55"))
    assert refused.refusal.startswith("twinspark plan says this configuration does not fit")
    assert "GPU_MEMORY_UTILIZATION=" in refused.refusal and "twinspark_plan_fit: warn" in refused.refusal
    warned = plan.fit_here(spark_env(GPU_MEMORY_UTILIZATION="0.55", TWINSPARK_PLAN_FIT="warn"))
    assert warned.warning and not warned.refusal
    absent = plan.fit_here(spark_env(MODEL="/nonexistent/model"))
    assert absent.plan is None and "not on this node yet" in absent.note and not absent.refusal


def test_the_ordered_restart_refuses_a_start_that_does_not_fit(monkeypatch, tmp_path):
    from test_pair_safety import StepPair, key_file

    from twinspark.pair import lifecycle

    monkeypatch.setattr(plan, "node_memory", lambda: SPARK_MEMORY)
    pair = StepPair(ssh_key=key_file(tmp_path, 0o600))
    pair.env = spark_env(GPU_MEMORY_UTILIZATION="0.55")
    problem = lifecycle.preflight(pair, lifecycle.RESTART_STEPS)
    assert "does not fit" in problem and problem.endswith("nothing was stopped") and pair.calls == []
    assert lifecycle.preflight(pair, (("head", "stop"), ("worker", "stop"))) == ""  # a stop is never refused
    pair.env = spark_env(GPU_MEMORY_UTILIZATION="0.55", TWINSPARK_PLAN_FIT="warn")
    assert lifecycle.preflight(pair, lifecycle.RESTART_STEPS) == ""


def test_twinspark_runtime_check_says_the_planners_refusal_first(tmp_path):
    """This machine's own memory at GPU_MEMORY_UTILIZATION 0.05 cannot hold half the handshaped checkpoint (72 GiB;
    it would take 1.4 TiB of memory): the check refuses before it even asks vLLM (not installed in this venv), and
    with twinspark_plan_fit: warn it only warns."""
    env = tmp_path / "serve.env"
    for fit, expected in (("refuse", "rank 0: twinspark plan says this configuration does not fit"),
                          ("warn", "rank 0: warning: twinspark plan says")):
        values = spark_env(TWINSPARK_PLAN_FIT=fit, GPU_MEMORY_UTILIZATION="0.05")
        env.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        done = subprocess.run([sys.executable, "-m", "twinspark.cli", "runtime", "check", "--env", str(env),
                               "--no-gpu"], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 1
        assert done.stderr.splitlines()[0].startswith(f"twinspark runtime check: {expected}"), done.stderr


RECORDED_KV = json.loads((FIXTURES / "recorded_vllm_cpu_kv_cache_size.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("run", RECORDED_KV["runs"], ids=lambda run: run["recipe"])
def test_the_planner_counts_the_kv_tokens_vllm_logged_on_the_simulated_pair(run, capsys):
    """The figure vLLM logged at start on the simulated pair for each tiny recipe (recorded from the journal), against
    the planner's for the same recipe, config and 1 GiB of KV space: within 10 % (both are exact today)."""
    logged = int(run["line"].split("KV cache size: ")[1].split(" tokens")[0].replace(",", ""))
    values = {**plan.recipe.defaults("cpu", name=run["recipe"]), "TWINSPARK_PROFILE": "cpu",
              "TWINSPARK_RECIPE": run["recipe"]}
    assert values["VLLM_CPU_KVCACHE_SPACE"] == "1" and values["MAX_MODEL_LEN"] == "512"
    planned = plan.make_plan(values, run["config"], 1_000_000, 24 * 2**30)
    error = planned.kv_cache_tokens / logged - 1
    with capsys.disabled():
        print(f"\n[planner vs vLLM, {run['recipe']}] {planned.kv_cache_tokens:,} vs {logged:,} logged ({error:+.1%}); "
              f"{planned.kv_layout}")
    assert abs(error) <= 0.10


def test_sliding_window_layers_are_grouped_and_charged_their_window_per_request():
    """A gpt-oss-like model: 18 sliding (window 128) and 18 full-attention layers, one page size: one group of each
    (equal counts), and a request takes cdiv(L, 16) full blocks plus cdiv(min(127 + 2 x 8192, L), 16) + 1 sliding."""
    config = {"num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
              "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 18}
    values = {"TWINSPARK_PROFILE": "gb10", "TWINSPARK_RECIPE": "gpt-oss-120b", "MAX_MODEL_LEN": "131072",
              "MAX_NUM_BATCHED_TOKENS": "8192"}
    layout = plan.kv_layout(config, "fp8", values, tp=2)
    page = 16 * 4 * 2 * 64 * 1  # block x KV heads per rank x (K, V) x head_dim x fp8
    assert layout.bytes_per_block == 18 * page
    assert layout.blocks_per_request == 131072 // 16 + (-(-(127 + 16384) // 16) + 1)
    blocks = (10 * 2**30) // (18 * page)
    assert layout.tokens(10 * 2**30, 131072) == int(blocks / layout.blocks_per_request * 131072)
    # Unequal counts beyond 1.5x: groups of the smaller count, the larger bucket split into several groups.
    config["layer_types"] = ["sliding_attention"] * 30 + ["full_attention"] * 6
    uneven = plan.kv_layout(config, "fp8", values, tp=2)
    assert uneven.bytes_per_block == 6 * page
    assert uneven.blocks_per_request == 131072 // 16 + 5 * (-(-(127 + 16384) // 16) + 1)
