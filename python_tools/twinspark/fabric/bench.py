"""All-reduce bandwidth between the two nodes: ``twinspark fabric bench``.

Run the same command on both nodes (``--rank 0`` on the head, ``--rank 1`` on the worker); they meet at
``--master ADDR --port P`` through torch.distributed (NCCL on the GPUs, gloo on CPUs) and time an all_reduce for each
message size. The figures follow nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n, in GB/s (10^9 bytes).
The peak busbw is judged against a threshold: NVIDIA's pass mark for a direct Spark pair (21.875 GB/s, 175 Gb/s) by
default on ``gb10``; on ``cpu`` the figures are a report unless ``--threshold-gbps`` is given.

Exit codes: 0 ok (or report only), 1 peak below threshold or the run failed (or gave no result within
``--deadline``), 2 invalid input.
The arithmetic is pure; torch is imported only when a benchmark really runs.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from twinspark import layout

BYTES_PER_GB = 1e9
ELEMENT_BYTES = 4  # float32
GB10_THRESHOLD_GBPS = 21.875
DEFAULT_THRESHOLDS: dict[str, float | None] = {"gb10": GB10_THRESHOLD_GBPS, "cpu": None}
DEFAULT_SIZES = {"gb10": "1M,16M,64M,256M,1G,2G", "cpu": "64K,1M,4M,16M,64M"}
DEFAULT_PORT = 29610

_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class SizeResult:
    bytes: int
    seconds: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class Verdict:
    peak_busbw_gbps: float
    peak_bytes: int
    threshold_gbps: float | None
    passed: bool | None  # None: report only


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864 (binary units, like nccl-tests); a whole number of float32 elements."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"--sizes entry {text!r} is not a size; write e.g. 64K, 16M or 1G")
    value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if value <= 0 or value % ELEMENT_BYTES:
        raise ValueError(f"--sizes entry {text!r} must be a positive multiple of {ELEMENT_BYTES} bytes")
    return value


def parse_sizes(text: str) -> list[int]:
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise ValueError("--sizes is empty; give at least one size, e.g. 16M")
    return sorted(set(sizes))


def format_size(value: int) -> str:
    for unit in ("G", "M", "K"):
        if value >= _UNITS[unit] and value % _UNITS[unit] == 0:
            return f"{value // _UNITS[unit]}{unit}"
    return str(value)


def bus_factor(world_size: int) -> float:
    """nccl-tests' all_reduce bus bandwidth factor 2(n-1)/n."""
    if world_size < 1:
        raise ValueError(f"world size must be at least 1 (got {world_size})")
    return 2 * (world_size - 1) / world_size


def size_result(message_bytes: int, seconds: float, world_size: int) -> SizeResult:
    """Bandwidth figures for one size from the time of one all_reduce."""
    if seconds <= 0:
        raise ValueError(f"time per all_reduce must be positive (got {seconds})")
    algbw = message_bytes / seconds / BYTES_PER_GB
    return SizeResult(message_bytes, seconds, algbw, algbw * bus_factor(world_size))


def default_threshold(profile: str) -> float | None:
    return DEFAULT_THRESHOLDS[profile]


def judge(results: Sequence[SizeResult], threshold_gbps: float | None) -> Verdict:
    """The peak busbw over all sizes against the threshold (None: report only)."""
    if not results:
        raise ValueError("no results to judge")
    peak = max(results, key=lambda r: r.busbw_gbps)
    passed = None if threshold_gbps is None else peak.busbw_gbps >= threshold_gbps
    return Verdict(peak.busbw_gbps, peak.bytes, threshold_gbps, passed)


def format_report(results: Sequence[SizeResult], verdict: Verdict, backend: str, world_size: int) -> str:
    header = ("size", "bytes", "time us", "algbw GB/s", "busbw GB/s")
    rows = [header] + [
        (
            format_size(r.bytes),
            str(r.bytes),
            f"{r.seconds * 1e6:.1f}",
            f"{r.algbw_gbps:.3f}",
            f"{r.busbw_gbps:.3f}",
        )
        for r in results
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [f"all_reduce, {backend}, {world_size} ranks, float32"]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    peak = f"peak busbw {verdict.peak_busbw_gbps:.3f} GB/s at {format_size(verdict.peak_bytes)}"
    if verdict.threshold_gbps is None:
        lines.append(f"{peak} (no threshold: report only)")
    else:
        word = "PASS" if verdict.passed else "FAIL"
        lines.append(f"{peak}: {word} (threshold {verdict.threshold_gbps:g} GB/s)")
    return "\n".join(lines)


def report_dict(
    results: Sequence[SizeResult], verdict: Verdict, backend: str, world_size: int, rank: int
) -> dict[str, object]:
    return {
        "benchmark": "all_reduce",
        "backend": backend,
        "world_size": world_size,
        "rank": rank,
        "dtype": "float32",
        "results": [asdict(r) for r in results],
        **asdict(verdict),
    }


def run_all_reduce(
    *,
    rank: int,
    world_size: int,
    master: str,
    port: int,
    backend: str,
    sizes: Sequence[int],
    iters: int,
    warmup: int,
    timeout_s: float,
) -> list[SizeResult]:
    """Time all_reduce on this rank (torch.distributed); both ranks must call it with the same arguments.

    Each size's time is the slowest rank's mean per iteration, so both ranks report the same figures.
    """
    # torch: only in the serving venv, and seconds to import; only the all-reduce itself needs it.
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        results = []
        for message_bytes in sizes:
            tensor = torch.ones(message_bytes // ELEMENT_BYTES, dtype=torch.float32, device=device)
            for _ in range(warmup):
                dist.all_reduce(tensor)
            synchronize()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(tensor)
            synchronize()
            elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            results.append(size_result(message_bytes, float(elapsed.item()), world_size))
            del tensor
        return results
    finally:
        dist.destroy_process_group()


def add_arguments(parser) -> None:
    parser.add_argument("--rank", type=int, required=True, choices=range(8), metavar="RANK",
                        help="0 on the head, 1 on the worker (a group's ranks 0..N-1, N up to 8)")
    parser.add_argument("--world-size", type=int, default=2, help="number of ranks (default 2: the pair)")
    parser.add_argument("--master", required=True, help="the head's fabric address (rank 0 listens there)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"rendezvous port (default {DEFAULT_PORT})")
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl on gb10, gloo on cpu")
    parser.add_argument("--profile", choices=tuple(DEFAULT_THRESHOLDS), help="default: gb10 with nccl, else cpu")
    parser.add_argument("--ifname", help="interface for the socket transport (sets GLOO/NCCL_SOCKET_IFNAME)")
    parser.add_argument("--sizes", help="comma-separated message sizes, e.g. 1M,16M,1G (default depends on profile)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed iterations per size (default 5)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the peer (default 120)")
    parser.add_argument(
        "--deadline",
        type=float,
        help="seconds the whole run may take, then it gives up with exit 1 (default: 3 x --timeout); torch's own "
             "timeouts do not cover a rendezvous port that accepts and never answers",
    )
    parser.add_argument(
        "--threshold-gbps",
        type=float,
        help=f"pass mark for the peak busbw in GB/s (default {GB10_THRESHOLD_GBPS} on gb10, none on cpu)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON report instead of the table")


def watchdog(deadline_s: float, message: str, give_up=os._exit) -> threading.Timer:
    """A daemon timer that prints `message` and ends the process with exit 1 after `deadline_s` (cancel it when the
    run returns). torch.distributed can wait without end: a client whose rendezvous port accepts and never answers
    waits for its reply past every timeout it was given (seen on the simulated pair: over 10 minutes)."""

    def expire() -> None:
        print(message, file=sys.stderr, flush=True)
        give_up(1)

    timer = threading.Timer(deadline_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def main(args) -> int:
    backend = args.backend or ("nccl" if args.profile == "gb10" else "gloo")
    profile = args.profile or ("gb10" if backend == "nccl" else "cpu")
    threshold = args.threshold_gbps if args.threshold_gbps is not None else default_threshold(profile)
    try:
        sizes = parse_sizes(args.sizes or DEFAULT_SIZES[profile])
        if args.iters < 1 or args.warmup < 0:
            raise ValueError("--iters must be at least 1 and --warmup at least 0")
        if not 0 <= args.rank < args.world_size:
            raise ValueError(f"--rank must be below --world-size {args.world_size} (got {args.rank})")
        deadline = args.deadline if args.deadline is not None else 3 * args.timeout
        if deadline <= 0 or args.timeout <= 0:
            raise ValueError("--timeout and --deadline must be above 0 seconds")
    except ValueError as error:
        print(f"twinspark fabric bench: {error}", file=sys.stderr)
        return 2
    if args.ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", args.ifname)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", args.ifname)
    timer = watchdog(deadline, f"twinspark fabric bench: all_reduce with {backend} to {args.master}:{args.port} gave "
                              f"no result within {deadline:g} s (--deadline); giving up")
    try:
        results = run_all_reduce(
            rank=args.rank,
            world_size=args.world_size,
            master=args.master,
            port=args.port,
            backend=backend,
            sizes=sizes,
            iters=args.iters,
            warmup=args.warmup,
            timeout_s=args.timeout,
        )
    except ImportError as error:
        print(f"twinspark fabric bench: torch is not importable here ({error}); run it from "
              f"{layout.current().venv}",
              file=sys.stderr)
        return 1
    except (RuntimeError, OSError) as error:
        print(f"twinspark fabric bench: all_reduce with {backend} to {args.master}:{args.port} failed: {error}",
              file=sys.stderr)
        return 1
    finally:
        timer.cancel()
    verdict = judge(results, threshold)
    if args.json:
        print(json.dumps(report_dict(results, verdict, backend, args.world_size, args.rank), indent=2))
    else:
        print(format_report(results, verdict, backend, args.world_size))
    return 1 if verdict.passed is False else 0
