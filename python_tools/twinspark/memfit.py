"""`twinspark plan`: whether a configuration fits a node's memory, before vLLM finds out (docs/DOCTOR.md).

  twinspark plan --env FILE... [--model-dir DIR] [--memory-bytes N | --facts FILE] [--json]

Per rank: the weights (the checkpoint's `metadata.total_size`, or its shards' sizes, split over the two ranks), the
KV cache's bytes per token for the kv-cache dtype the runtime flavour passes (settings.yml) and the model's attention
shape (config.json), the budget (memory x GPU_MEMORY_UTILIZATION on gb10; VLLM_CPU_KVCACHE_SPACE for the KV cache on
cpu), the allowances for activations, CUDA graphs, the speculative drafter and the runtime itself, and what is left:
the KV-cache tokens, the largest MAX_MODEL_LEN every one of MAX_NUM_SEQS sequences can have at once, and whether it
fits (vLLM needs room for at least one MAX_MODEL_LEN sequence). The memory is --memory-bytes, the doctor's facts
(--facts, `twinspark doctor --collect`), or this node's own.

Exit codes: 0 fits, 2 does not fit (naming the knob to change and a value that would fit), 3 bad input.

Estimates, not vLLM's own accounting: vLLM lays the cache out in blocks shared by groups of layers and may set more
memory aside than the bytes a token needs; docs/DOCTOR.md compares the estimate with published pool sizes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from twinspark import envfile, recipe, safeio, settings, validate
from twinspark import weights as checkpoint
from twinspark.doctor import collect

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 2, 3
TENSOR_PARALLEL = 2  # the pair: two ranks (settings.yml's common fixed flags)
GIB = 2**30
MAX_JSON_BYTES = 64 << 20
# The share of a node's unified memory the planner will suggest at most: what is left keeps the OS, sshd and the
# page cache alive (a Spark that runs out of unified memory is hard-reset).
UTILISATION_CEILING = 0.92
UTILISATION_STEP = 0.005

# Allowances per rank beyond the weights and the KV cache, each a named assumption (docs/DOCTOR.md says why):
# activations of one scheduler step, per batched token per unit of hidden size (the residual stream, expanded by
# DeepSeek-V4's hyper-connections, the attention and MoE intermediates in bf16, and room for temporaries);
ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN = 64
# the step's token budget when MAX_NUM_BATCHED_TOKENS is unset (the cpu profile): vLLM's own default is of this order;
DEFAULT_BATCHED_TOKENS = 8192
# captured CUDA graphs (none with ENFORCE_EAGER=1);
CUDA_GRAPH_BYTES = 1 * GIB
# the MTP drafter's own buffers and graphs (its weights are in the checkpoint, its sliding-window cache is tiny);
DRAFTER_BYTES = 1 * GIB
# the CUDA context, NCCL's buffers and the allocator's slack on a GPU rank; the process itself on a CPU rank.
RUNTIME_BYTES = {"gb10": 2 * GIB, "cpu": 1 * GIB}

# Bytes a compressed DeepSeek-V4 attention state takes per kv-cache dtype, from the attention shape: `nope` and
# `rope` are the non-rotary and rotary parts of head_dim.
# fp8_ds_mla: the NoPE part in fp8, the RoPE part in bf16, one ue8m0 scale per 64 NoPE values padded to 8 bytes
#   (vLLM 0.33.0 deepseek_v4/attention.py: 448 + 128 + 8 = 584).
# nvfp4_ds_mla: the NoPE part as e2m1 (two per byte) with one e4m3 scale per 16 values, the RoPE part in fp8 (the
#   packing vLLM 0.33.0 documents for DeepSeek-V3.2's nvfp4_ds_mla, applied to V4's split: 224 + 28 + 64 = 316).
DS_STATE_BYTES = {
    "fp8_ds_mla": lambda nope, rope: nope + 2 * rope + 8 * math.ceil(nope / 64 / 8),
    "nvfp4_ds_mla": lambda nope, rope: nope // 2 + nope // 16 + rope,
}
# DeepSeek-V4's compression ratio per layer type, as transformers' DeepseekV4Config defaults them (0 = sliding only).
DS4_DEFAULT_RATES = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
KV_CACHE_LAYERS = "kv_cache_layers"  # a recipe's fact, not config.json's: the layers that cache every token's K and V
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1}


class PlanInputError(ValueError):
    """One line naming the file, option or variable and what to do."""


@dataclass(frozen=True)
class Attention:
    """What the KV cache needs per token and per sequence on one rank."""

    kind: str
    bytes_per_token: float
    bytes_per_sequence: int = 0
    detail: str = ""


@dataclass
class Plan:
    profile: str
    flavour: str
    kv_cache_dtype: str
    memory_total_bytes: int
    budget_bytes: int
    weights_bytes: int
    kv_bytes_per_token: float
    attention: str
    allowances: dict[str, int]
    kv_cache_bytes: int
    kv_cache_tokens: int
    max_model_len: int
    max_num_seqs: int
    largest_max_model_len_at_max_num_seqs: int
    max_concurrency: float
    fits: bool
    advice: list[str] = field(default_factory=list)
    kv_layout: str = ""  # vLLM's pool: groups, page and block sizes, blocks per request

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# ----------------------------------------------------------------------------------------------------- pure rules


def kv_cache_dtype(values: Mapping[str, str], registry: settings.Registry | None = None) -> str:
    """The --kv-cache-dtype the node's profile, recipe and runtime flavour pass (their fixed flags), or "auto"."""
    args = _fixed_args(values, registry)
    return args[args.index("--kv-cache-dtype") + 1] if "--kv-cache-dtype" in args else "auto"


def _fixed_args(values: Mapping[str, str], registry: settings.Registry | None = None) -> list[str]:
    return list(recipe.fixed_args(values.get("TWINSPARK_PROFILE", "gb10"),
                                  values.get("TWINSPARK_RUNTIME_FLAVOUR") or "stock",
                                  values.get(recipe.RECIPE_ENV) or None, registry))


def _element_bytes(dtype: str, config: Mapping, values: Mapping[str, str]) -> int:
    if dtype in ("auto", ""):
        dtype = values.get("DTYPE") or str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        if dtype == "auto":
            dtype = str(config.get("torch_dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise PlanInputError(f"kv-cache dtype {dtype!r}: the planner knows {', '.join(sorted(DTYPE_BYTES))} and "
                             f"{', '.join(DS_STATE_BYTES)}")
    return DTYPE_BYTES[dtype]


def ds4_ratios(config: Mapping) -> list[int]:
    """DeepSeek-V4's compression ratio of each main layer (0 or 1: sliding window only), from `compress_ratios` or
    `layer_types` with `compress_rates` (transformers' defaults when the config leaves them out)."""
    layers = int(config.get("num_hidden_layers") or 0)
    if config.get("compress_ratios") is not None:
        return [int(r) for r in config["compress_ratios"]][:layers]
    rates = {**DS4_DEFAULT_RATES, **dict(config.get("compress_rates") or {})}
    types = config.get("layer_types") or (["heavily_compressed_attention"] * min(layers, 2) + [
        "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(max(layers - 2, 0))])
    return [int(rates.get(t, 0)) for t in types][:layers]


def ds4_states(config: Mapping, dtype: str, values: Mapping[str, str]) -> tuple[int, int, int, int]:
    """DeepSeek-V4's head_dim, the bytes of one compressed state in `dtype`, the indexer's head_dim and the bytes of
    one indexer state (fp8 values and one fp32 scale per 128, vLLM 0.33.0)."""
    head_dim = int(config.get("head_dim") or 512)
    rope = int(config.get("qk_rope_head_dim") or head_dim * float(config.get("partial_rotary_factor") or 0.125))
    nope = head_dim - rope
    state = DS_STATE_BYTES[dtype](nope, rope) if dtype in DS_STATE_BYTES else \
        head_dim * _element_bytes(dtype, config, values)
    index_dim = int(config.get("index_head_dim") or 128)
    return head_dim, state, index_dim, index_dim + index_dim // 128 * 4


def attention(config: Mapping, dtype: str, values: Mapping[str, str], tp: int = TENSOR_PARALLEL) -> Attention:
    """The KV cache's bytes per token and per sequence on one rank for this model and kv-cache dtype."""
    layers = int(config.get("num_hidden_layers") or 0)
    if layers <= 0:
        raise PlanInputError("config.json has no num_hidden_layers: not a model the planner can size")
    if config.get("model_type") == "deepseek_v4" or config.get("compress_ratios") is not None:
        _head_dim, state, _index_dim, index_state = ds4_states(config, dtype, values)
        ratios = ds4_ratios(config)
        compressed = [r for r in ratios if r > 1]
        per_token = sum(state / r for r in compressed) + sum(index_state / r for r in compressed if r == 4)
        window = int(config.get("sliding_window") or 128)
        drafter_layers = int(config.get("num_nextn_predict_layers") or 0)
        per_sequence = (layers + drafter_layers) * window * state  # every layer's sliding window, the drafter's too
        counts = {r: compressed.count(r) for r in sorted(set(compressed))}
        detail = (f"DeepSeek-V4 compressed attention: {', '.join(f'{n} layers at 1/{r}' for r, n in counts.items())}"
                  f", {state} B per {dtype} state, indexer {index_state} B; a {window}-token window per layer")
        return Attention("deepseek_v4", per_token, per_sequence, detail)
    size = _element_bytes(dtype, config, values)
    if config.get("kv_lora_rank"):  # MLA (DeepSeek-V2/V3): one latent per token and layer, on every rank
        latent = int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim") or 0)
        return Attention("mla", layers * latent * size, 0, f"MLA latent of {latent} values x {layers} layers")
    heads = int(config.get("num_attention_heads") or 1)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config.get("hidden_size") or 0) // heads)
    per_rank = math.ceil(kv_heads / tp)  # fewer KV heads than ranks: vLLM replicates them
    per_layer = 2 * per_rank * head_dim * size
    # Which layers keep K and V for every token: config.json's layer_types (sliding-window layers keep only their
    # window, once per sequence), or a recipe's kv_cache_layers for hybrids whose other layers (linear attention,
    # Mamba) keep a fixed state instead (twinspark/recipes/, docs/RECIPES.md).
    types = [str(t) for t in config.get("layer_types") or ()]
    window = int(config.get("sliding_window") or 0)
    sliding = sum(1 for t in types if t == "sliding_attention") if window else 0
    full = int(config.get(KV_CACHE_LAYERS) or (layers - sliding))
    detail = f"K and V of {per_rank} head(s) x {head_dim} x {full} layers per rank, {size} B each"
    if sliding:
        detail += f"; {sliding} sliding layers keep {window} tokens"
    return Attention("attention", full * per_layer, sliding * window * per_layer, detail)


# ----------------------------------------------------------------------------- KV tokens as vLLM 0.33.0 counts them
# vLLM does not divide its KV memory by bytes per token. It lays the cache out in blocks (docs/RECIPES.md "How the
# planner counts KV tokens"): layers are grouped (kv_cache_planning.py), one block of the shared pool holds a page
# of every layer of the largest group, num_blocks = memory // bytes_per_block, and the figure it logs ("KV cache
# size: N tokens", kv_cache_utils.update_kv_cache_capacity) is num_blocks / blocks_per_request x max_model_len,
# where a request of max_model_len takes cdiv(L, block) blocks of a full-attention group and, of a sliding-window
# group, cdiv(min(W - 1 + T, L), block) + 1, T being the tokens in flight (max_num_batched_tokens, twice with async
# scheduling as on a GPU).
CPU_BLOCK_SIZE = 128  # vllm/platforms/cpu.py: CPU_ATTN's preferred block
GPU_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
DS4_BLOCK_SIZE = 256  # DeepSeek-V4's kernels take 256 only (the recipe passes --block-size 256)
DS4_SWA_BLOCK_SIZE = 64  # DeepseekV4SWACache: fixed, whatever --block-size says
DS4_PAGE_ALIGNMENT = 576  # the fp8_ds_mla layout's page alignment
DS4_STATE_BLOCK = {4: 4, 128: 8}  # the compressor state cache's block per compression ratio


@dataclass(frozen=True)
class KVLayout:
    """vLLM's KV-cache pool for one rank: bytes per block and the blocks one max_model_len request takes."""

    bytes_per_block: int
    blocks_per_request: int
    detail: str

    def tokens(self, kv_bytes: int, max_model_len: int) -> int:
        if kv_bytes <= 0 or self.bytes_per_block <= 0:
            return 0
        blocks = kv_bytes // self.bytes_per_block
        return int(blocks / self.blocks_per_request * max_model_len)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_to(value: int, step: int) -> int:
    return _cdiv(value, step) * step


def block_size(values: Mapping[str, str], config: Mapping) -> int:
    """The block size vLLM uses: the recipe's --block-size, else the platform's default (DeepSeek-V4: 256)."""
    if config.get("model_type") == "deepseek_v4":
        return DS4_BLOCK_SIZE
    args = _fixed_args(values)
    if "--block-size" in args:
        return int(args[args.index("--block-size") + 1])
    return CPU_BLOCK_SIZE if values.get("TWINSPARK_PROFILE") == "cpu" else GPU_BLOCK_SIZE


def in_flight_tokens(values: Mapping[str, str]) -> int:
    """T: the tokens a sliding window must also hold (max_num_batched_tokens; twice with GPU async scheduling)."""
    batched = int(values.get("MAX_NUM_BATCHED_TOKENS") or DEFAULT_BATCHED_TOKENS)
    return batched if values.get("TWINSPARK_PROFILE") == "cpu" else 2 * batched


def _sliding_blocks(window: int, in_flight: int, max_len: int, block: int) -> int:
    return _cdiv(min(window - 1 + in_flight, max_len), block) + 1


def kv_layout(config: Mapping, dtype: str, values: Mapping[str, str], tp: int = TENSOR_PARALLEL,
              pp: int = 1) -> KVLayout:
    """How vLLM 0.33.0 lays out this model's KV cache on one rank (see above)."""
    layers = int(config.get("num_hidden_layers") or 0)
    max_len = int(values["MAX_MODEL_LEN"])
    in_flight = in_flight_tokens(values)
    if config.get("model_type") == "deepseek_v4" or config.get("compress_ratios") is not None:
        return _ds4_layout(config, dtype, values, max_len, in_flight)
    block = block_size(values, config)
    size = _element_bytes(dtype, config, values)
    if config.get("kv_lora_rank"):  # MLA: one latent per token and layer, every rank
        latent = int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim") or 0)
        page = block * latent * size
        count = math.ceil(layers / pp)
        return KVLayout(count * page, _cdiv(max_len, block),
                        f"one MLA group of {count} layers, {page:,} B pages of {block} tokens")
    heads = int(config.get("num_attention_heads") or 1)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config.get("hidden_size") or 0) // heads)
    page = block * math.ceil(kv_heads / tp) * 2 * head_dim * size
    types = [str(t) for t in config.get("layer_types") or ()]
    window = int(config.get("sliding_window") or 0)
    sliding = sum(1 for t in types if t == "sliding_attention") if window else 0
    full = int(config.get(KV_CACHE_LAYERS) or (layers - sliding))
    full, sliding = math.ceil(full / pp), math.ceil(sliding / pp)
    if not sliding:
        return KVLayout(full * page, _cdiv(max_len, block),
                        f"one full-attention group of {full} layers, {page:,} B pages of {block} tokens")
    # Hybrid, one page size: groups of group_size layers (the smaller bucket, or the larger when the two are
    # within 1.5x), each bucket split into cdiv(count, group_size) groups; a block holds one group's pages.
    small, large = min(full, sliding), max(full, sliding)
    group = large if large < 1.5 * small else small
    full_groups, sliding_groups = _cdiv(full, group), _cdiv(sliding, group)
    per_request = (full_groups * _cdiv(max_len, block)
                   + sliding_groups * _sliding_blocks(window, in_flight, max_len, block))
    return KVLayout(group * page, per_request,
                    f"{full_groups} full-attention and {sliding_groups} sliding-window group(s) of {group} layers, "
                    f"{page:,} B pages of {block} tokens, window {window} + {in_flight} tokens in flight")


def _ds4_layout(config: Mapping, dtype: str, values: Mapping[str, str], max_len: int, in_flight: int) -> KVLayout:
    """DeepSeek-V4's five groups in vLLM 0.33.0 (models/deepseek_v4, packed block-outermost grouping): its sliding
    caches (every layer and the drafter's, 64-token blocks), one group of the compressed caches and the indexer's
    (256-token blocks), and the compressors' states; a block holds the largest group's pages. The KV is not split
    by TP. fp8_ds_mla is what 0.33.0 takes for deepseek_v4; nvfp4_ds_mla (the DSpark fork's) is sized with the
    same rules and its smaller state, an estimate of a build this planner has not read."""
    head_dim, state, index_dim, index_state = ds4_states(config, dtype, values)
    ratios = ds4_ratios(config)
    drafter = int(config.get("num_nextn_predict_layers") or 0)
    window = int(config.get("sliding_window") or 128)
    align = DS4_PAGE_ALIGNMENT

    def page(tokens_per_block: int, per_state: int, tokens_per_state: int = 1) -> int:
        return _round_to(tokens_per_block // tokens_per_state * per_state, align)

    swa_layers = len(ratios) + drafter
    swa_page = page(DS4_SWA_BLOCK_SIZE, state)
    c4 = sum(1 for r in ratios if r == 4)
    c128 = sum(1 for r in ratios if r == 128)
    mla_group = (c4 * page(DS4_BLOCK_SIZE, state, 4) + c128 * page(DS4_BLOCK_SIZE, state, 128)
                 + c4 * page(DS4_BLOCK_SIZE, index_state, 4))
    # The compressor states, in fp32: 2 x overlap x head_dim per state (overlap 2 at ratio 4, 1 at 128), one state
    # per token of a block of 4 (ratio 4) or 8 (ratio 128); the indexer's compressor likewise at index_head_dim.
    c4_state = c4 * (page(DS4_STATE_BLOCK[4], 2 * 2 * head_dim * 4) + page(DS4_STATE_BLOCK[4], 2 * 2 * index_dim * 4))
    c128_state = c128 * page(DS4_STATE_BLOCK[128], 2 * 1 * head_dim * 4)
    swa_a = math.ceil(swa_layers / 2) * swa_page  # the sliding caches split into two groups
    bytes_per_block = max(swa_a, mla_group, c4_state, c128_state)
    per_request = (_cdiv(max_len, DS4_BLOCK_SIZE)
                   + 2 * _sliding_blocks(window, in_flight, max_len, DS4_SWA_BLOCK_SIZE)
                   + _sliding_blocks(window, in_flight, max_len, DS4_STATE_BLOCK[128])
                   + _sliding_blocks(8, in_flight, max_len, DS4_STATE_BLOCK[4]))
    return KVLayout(bytes_per_block, per_request,
                    f"DeepSeek-V4 pool: {bytes_per_block:,} B per block (largest of 5 groups), {per_request:,} "
                    f"blocks per {max_len:,}-token request ({in_flight} tokens in flight)")


def allowances(values: Mapping[str, str], config: Mapping) -> dict[str, int]:
    profile = values.get("TWINSPARK_PROFILE", "gb10")
    hidden = int(config.get("hidden_size") or 0)
    batched = int(values.get("MAX_NUM_BATCHED_TOKENS") or min(int(values["MAX_MODEL_LEN"]), DEFAULT_BATCHED_TOKENS))
    found = {"activations": batched * hidden * ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN,
             "runtime": RUNTIME_BYTES[profile]}
    if values.get("ENFORCE_EAGER") != "1" and profile == "gb10":
        found["cuda_graphs"] = CUDA_GRAPH_BYTES
    if values.get("MTP_NUM_TOKENS"):
        found["drafter"] = DRAFTER_BYTES
    return found


def _round_up(value: float, step: float) -> float:
    return round(math.ceil(value / step - 1e-9) * step, 3)


def make_plan(values: Mapping[str, str], config: Mapping, weights_total: int, memory_total: int,
              tp: int = TENSOR_PARALLEL, pp: int = 1) -> Plan:
    """The plan for one rank (every rank holds the same share): what it needs, what it has, and whether it fits.
    `tp` x `pp` is the group's layout (the pair's TP2xPP1 by default): tensor parallelism splits the weights and
    the KV heads, pipeline parallelism the layers."""
    profile = values.get("TWINSPARK_PROFILE", "gb10")
    flavour = values.get("TWINSPARK_RUNTIME_FLAVOUR") or "stock"
    dtype = kv_cache_dtype(values)
    shape = attention(config, dtype, values, tp)
    if pp > 1:
        shape = Attention(shape.kind, shape.bytes_per_token / pp, math.ceil(shape.bytes_per_sequence / pp),
                          shape.detail + f", 1/{pp} of the layers per pipeline stage")
    weights = math.ceil(weights_total / (tp * pp))
    extra = allowances(values, config)
    seqs = int(values.get("MAX_NUM_SEQS") or 1)
    wanted_len = int(values["MAX_MODEL_LEN"])
    if profile == "cpu":  # vLLM-cpu takes a fixed KV space; the weights and the rest live beside it
        budget = memory_total
        kv_bytes = int(float(values.get("VLLM_CPU_KVCACHE_SPACE") or 0) * GIB)
        left_over = memory_total - weights - sum(extra.values()) - kv_bytes
        kv_left = kv_bytes if left_over >= 0 else -1
    else:
        budget = int(memory_total * float(values["GPU_MEMORY_UTILIZATION"]))
        kv_left = budget - weights - sum(extra.values())
    # The tokens as vLLM logs them: whole blocks, each max_model_len request taking its groups' blocks (sliding
    # windows included), so a window's cost is counted there rather than taken off the bytes.
    pool = kv_layout(config, dtype, values, tp, pp)
    tokens = pool.tokens(kv_left, wanted_len)
    plan = Plan(profile, flavour, dtype, memory_total, budget, weights, round(shape.bytes_per_token, 1),
                shape.detail, extra, max(0, kv_left), tokens, wanted_len, seqs, tokens // seqs,
                round(tokens / wanted_len, 2), kv_left > 0 and tokens >= wanted_len, kv_layout=pool.detail)
    plan.advice = [] if plan.fits else advice(plan, pool, memory_total)
    return plan


def advice(plan: Plan, pool: KVLayout, memory_total: int) -> list[str]:
    """What to change, with a value that would fit."""
    one_request = (pool.blocks_per_request + 1) * pool.bytes_per_block  # its blocks, and a spare one
    need_for_one = plan.weights_bytes + sum(plan.allowances.values()) + one_request
    gib = f"{plan.weights_bytes / GIB:.1f} GiB"
    if plan.profile == "cpu":
        if plan.budget_bytes < plan.weights_bytes + sum(plan.allowances.values()):
            return [f"MODEL: its weights need {gib} per rank, more than this node's memory beside the KV space; "
                    "serve a smaller checkpoint or give the node more memory"]
        space = math.ceil(one_request / GIB)
        return [f"VLLM_CPU_KVCACHE_SPACE={space} (GiB) holds one {plan.max_model_len}-token sequence",
                f"or MAX_MODEL_LEN={plan.kv_cache_tokens} fits the KV space as it is"]
    utilisation = _round_up(need_for_one / memory_total, UTILISATION_STEP)
    if utilisation > UTILISATION_CEILING:
        if plan.weights_bytes + sum(plan.allowances.values()) >= memory_total * UTILISATION_CEILING:
            return [f"MODEL: its weights need {gib} per rank; with the allowances no GPU_MEMORY_UTILIZATION up to "
                    f"{UTILISATION_CEILING} leaves room for a KV cache: serve a smaller or more quantized checkpoint"]
        share = plan.budget_bytes / memory_total
        return [f"MAX_MODEL_LEN={plan.kv_cache_tokens} fits at GPU_MEMORY_UTILIZATION {share:.3f}; "
                f"{plan.max_model_len} tokens would need GPU_MEMORY_UTILIZATION={utilisation}, above the "
                f"{UTILISATION_CEILING} this node can spare"]
    lines = [f"GPU_MEMORY_UTILIZATION={utilisation} fits one {plan.max_model_len}-token sequence"]
    if plan.kv_cache_tokens > 0:
        lines.append(f"or MAX_MODEL_LEN={plan.kv_cache_tokens} fits as it is")
    return lines


# ----------------------------------------------------------------------------------------------------- reading


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(safeio.read_bounded(path, MAX_JSON_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise PlanInputError(f"{path}: no {what} there; pass --model-dir the model's directory") from None
    except (safeio.RefusedFile, UnicodeDecodeError, ValueError) as error:
        raise PlanInputError(f"{path}: not a readable {what} ({error})") from None
    if not isinstance(data, dict):
        raise PlanInputError(f"{path}: {what} must hold one JSON object")
    return data


def weights_bytes(model_dir: Path) -> int:
    """The checkpoint's size: its index's metadata.total_size, else the sizes of the shards it lists."""
    index = model_dir / checkpoint.INDEX_NAME
    if index.exists():
        total = (_read_json(index, "safetensors index").get("metadata") or {}).get("total_size")
        if isinstance(total, int) and total > 0:
            return total
    try:
        names = checkpoint.shard_names(model_dir)
        return sum((model_dir / name).stat().st_size for name in names)
    except (checkpoint.ModelRuntimeError, OSError) as error:
        raise PlanInputError(f"--model-dir {model_dir}: cannot size the weights ({error})") from None


PLANNED = ("TWINSPARK_PROFILE", "TWINSPARK_RUNTIME_FLAVOUR", "GPU_MEMORY_UTILIZATION", "MAX_MODEL_LEN",
           "MAX_NUM_SEQS", "MAX_NUM_BATCHED_TOKENS", "MTP_NUM_TOKENS", "ENFORCE_EAGER", "VLLM_CPU_KVCACHE_SPACE",
           "DTYPE", "MODEL", "MODEL_REVISION", "HF_HOME", "TWINSPARK_PLAN_FIT")


def plan_settings(raw: Mapping[str, str]) -> dict[str, str]:
    """The knobs the planner reads, each normalised by its own rule, the registry's defaults for the rest."""
    registry = settings.load()
    profile = (raw.get("TWINSPARK_PROFILE") or "gb10").strip()
    flavour = (raw.get("TWINSPARK_RUNTIME_FLAVOUR") or "stock").strip()
    if profile not in settings.PROFILES or flavour not in settings.FLAVOURS:
        raise PlanInputError(f"TWINSPARK_PROFILE must be one of {', '.join(settings.PROFILES)} and "
                             f"TWINSPARK_RUNTIME_FLAVOUR one of {', '.join(settings.FLAVOURS)}")
    chosen = (raw.get(recipe.RECIPE_ENV) or "").strip() or None
    if chosen is not None and (chosen not in recipe.catalogue() or recipe.get(chosen).profile != profile):
        raise PlanInputError(f"{recipe.RECIPE_ENV}: {chosen!r} is not a {profile} recipe; known: "
                             f"{', '.join(recipe.names(profile))}")
    values = recipe.defaults(profile, None, flavour, chosen, registry)
    if chosen is not None:
        values[recipe.RECIPE_ENV] = chosen
    for name in PLANNED:
        knob = registry.get(name)
        if name in raw and knob is not None and knob.applies_to(profile) and raw[name].strip():
            try:
                values[name] = validate.normalise(knob, raw[name])
            except ValueError as error:
                raise PlanInputError(f"{name}: {error} (allowed: {knob.allowed()})") from None
    return values


def read_env(paths: list[str]) -> dict[str, str]:
    read = envfile.read_files(paths)
    if read.refused:
        raise PlanInputError(read.refused[0])
    return plan_settings(read.values)


def node_memory() -> int:
    """This node's memory (on a Spark the GPU's too), as the doctor's collector reads it."""
    total = collect.meminfo("/proc").get("MemTotal")
    if not total:
        raise PlanInputError("this node's memory cannot be read from /proc/meminfo; pass --memory-bytes or --facts")
    return total


def memory_from(args: argparse.Namespace) -> int:
    if args.memory_bytes is not None:
        if args.memory_bytes <= 0:
            raise PlanInputError(f"--memory-bytes must be a positive number of bytes (got {args.memory_bytes})")
        return args.memory_bytes
    if args.facts:
        facts = _read_json(Path(args.facts), "doctor facts file")
        total = facts.get("memory_total_bytes")
        if not isinstance(total, int) or total <= 0:
            raise PlanInputError(f"--facts {args.facts}: no memory_total_bytes (write it with `twinspark doctor "
                                 "--collect`)")
        return total
    return node_memory()


def model_dir(values: Mapping[str, str]) -> Path | None:
    """Where MODEL's files are on this node: the local directory, or the pinned Hub snapshot under HF_HOME; None for
    a hub id without a pinned revision."""
    model = values.get("MODEL", "")
    if model.startswith("/"):
        return Path(model)
    revision = values.get("MODEL_REVISION")
    if not model or not revision:
        return None
    return checkpoint.snapshot_dir(values.get("HF_HOME") or settings.load()["HF_HOME"].default_for("gb10"), model,
                                   revision)


def model_dir_of(values: Mapping[str, str], given: str | None) -> Path:
    found = Path(given) if given else model_dir(values)
    if found is None:
        raise PlanInputError("MODEL is a hub id without MODEL_REVISION: pass --model-dir the model's directory")
    return found


def plan_for(values: Mapping[str, str], model_dir: Path, memory_total: int) -> Plan:
    config = _read_json(model_dir / "config.json", "config.json")
    return make_plan(values, config, weights_bytes(model_dir), memory_total)


@dataclass(frozen=True)
class FitVerdict:
    """Whether a start under these settings fits this node: `refusal` or `warning` (TWINSPARK_PLAN_FIT says which)
    when it does not, `note` when it could not be judged here (the model not on this node yet)."""

    plan: Plan | None
    note: str = ""
    refusal: str = ""
    warning: str = ""


def fit_here(values: Mapping[str, str]) -> FitVerdict:
    """The planner's verdict for this node's own settings, model and memory: what `twinspark runtime check` and the
    ordered restart ask before they start anything."""
    try:
        planned_values = plan_settings(values)
        directory = model_dir_of(planned_values, None)
        if not (directory / "config.json").is_file():
            return FitVerdict(None, note=f"the model is not on this node yet ({directory}): not planned")
        planned = plan_for(planned_values, directory, node_memory())
    except PlanInputError as error:
        return FitVerdict(None, note=f"not planned: {error}")
    except (ValueError, TypeError, KeyError) as error:  # a config.json of a shape the planner does not know
        return FitVerdict(None, note=f"not planned: the planner cannot size the model's config.json ({error!r})")
    if planned.fits:
        return FitVerdict(planned)
    line = (f"twinspark plan says this configuration does not fit this node's memory "
            f"({planned.kv_cache_tokens:,} KV-cache tokens left for MAX_MODEL_LEN {planned.max_model_len:,}): "
            + "; ".join(planned.advice))
    if planned_values.get("TWINSPARK_PLAN_FIT") == "warn":
        return FitVerdict(planned, warning=line + " (twinspark_plan_fit: warn, so it starts anyway)")
    return FitVerdict(planned, refusal=line + "; or set twinspark_plan_fit: warn to start it anyway")


# ----------------------------------------------------------------------------------------------------- output


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def table(plan: Plan) -> str:
    lines = [
        f"per rank ({plan.profile}, {plan.flavour} runtime, kv-cache dtype {plan.kv_cache_dtype})",
        f"  memory                 {_gib(plan.memory_total_bytes)}",
        f"  budget                 {_gib(plan.budget_bytes)}"
        + ("" if plan.profile == "cpu" else f" (x {plan.budget_bytes / plan.memory_total_bytes:.3f})"),
        f"  weights                {_gib(plan.weights_bytes)} (half the checkpoint)",
        *[f"  {name:<22} {_gib(size)}" for name, size in plan.allowances.items()],
        f"  KV cache               {_gib(plan.kv_cache_bytes)}, {plan.kv_bytes_per_token:g} B per token",
        f"                         {plan.attention}",
        f"                         {plan.kv_layout}",
        f"  KV-cache tokens        {plan.kv_cache_tokens:,} ({plan.max_concurrency:g}x MAX_MODEL_LEN "
        f"{plan.max_model_len:,})",
        f"  MAX_MODEL_LEN for all {plan.max_num_seqs} sequences at once: "
        f"{plan.largest_max_model_len_at_max_num_seqs:,}",
        "fits" if plan.fits else "DOES NOT FIT: " + "; ".join(plan.advice),
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        if not args.env_files:
            raise PlanInputError("give --env FILE (repeatable): the env files whose configuration to plan")
        values = read_env(args.env_files)
        plan = plan_for(values, model_dir_of(values, args.model_dir), memory_from(args))
    except PlanInputError as error:
        print(f"twinspark plan: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(plan.to_dict(), indent=2) if args.json else table(plan))
    return EXIT_FITS if plan.fits else EXIT_DOES_NOT_FIT


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="whether a configuration fits a node's memory (weights, KV cache); "
                                                "exit 0 fits, 2 not", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", action="append", default=[], metavar="FILE", dest="env_files",
                        help="env file(s) to plan; later files override earlier ones; unset knobs take the "
                             "registry's defaults")
    parser.add_argument("--model-dir", metavar="DIR",
                        help="the model's directory (config.json, model.safetensors.index.json); default: MODEL's "
                             "directory or its pinned snapshot under HF_HOME")
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument("--memory-bytes", type=int, metavar="N", help="a node's memory (default: this node's)")
    memory.add_argument("--facts", metavar="FILE", help="take the memory from `twinspark doctor --collect`'s file")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=run)
