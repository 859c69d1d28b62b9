"""The three outputs of a health sweep: a compact table, JSON, and a node_exporter textfile."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from twinspark.health import fleetreport
from twinspark.health.checks import MARKS, OK, PROM_VALUE, RANK, STATUS_ORDER, UNKNOWN, CheckResult, exit_code, overall


def table(results: Sequence[CheckResult], quiet: bool = False) -> str:
    """One line per check; failing and degraded lines carry what to do on a second, indented line.

    `quiet` leaves out the passing checks (the summary line still counts them)."""
    node_width = max((len(r.node) for r in results), default=4)
    check_width = max((len(r.check) for r in results), default=5)
    lines = []
    for r in results:
        if quiet and r.status == OK:
            continue
        lines.append(f"{MARKS[r.status]:<8}  {r.node:<{node_width}}  {r.check:<{check_width}}  {r.message}")
        if r.status != OK and r.fix:
            lines.append(f"{'':<8}  {'':<{node_width}}  {'':<{check_width}}  -> {r.fix}")
    status = overall(results)
    counts = ", ".join(f"{sum(r.status == s for r in results)} {s}" for s in STATUS_ORDER)
    not_looked = sum(r.status == UNKNOWN for r in results)
    if not_looked:
        counts += f", {not_looked} unknown"
    lines.append(f"{status.upper()}: {counts} (exit {exit_code(status)})")
    return "\n".join(lines)


def as_json(results: Sequence[CheckResult], nodes: Mapping[str, Mapping[str, object]] | None = None,
            elapsed_s: float | None = None, metrics: Mapping[str, object] | None = None) -> dict[str, object]:
    """The machine-readable report. `nodes` carries what `--local` hands the controller for cross-node checks."""
    status = overall(results)
    report: dict[str, object] = {
        "status": status,
        "exit_code": exit_code(status),
        "checks": [r.to_dict() for r in results],
    }
    if nodes is not None:
        report["nodes"] = dict(nodes)
    if metrics is not None:
        report["metrics"] = dict(metrics)
    if elapsed_s is not None:
        report["elapsed_s"] = round(elapsed_s, 3)
    return report


def results_from_json(checks: Sequence[Mapping[str, str]]) -> list[CheckResult]:
    return [CheckResult(c["node"], c["check"], c["status"], c.get("message", ""), c.get("fix", "")) for c in checks]


def write_prom_file(path: Path, results: Sequence[CheckResult], elapsed_s: float,
                    metrics: Mapping[str, object] | None = None) -> None:
    """Write the node_exporter textfile (atomically, via prometheus_client).

    twinspark_health_check_status{node,check}: 0 ok, 1 degraded, 2 failed (same as the exit codes);
    twinspark_health_status: the overall status; the pair's vLLM figures when they were read, and when the
    certificate the API serves expires (TLS only).
    """
    # Measured: prometheus_client adds ~130 ms at import (-X importtime); only the textfile needs it.
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    check_status = Gauge("twinspark_health_check_status",
                         "Health check status: 0 ok, 1 degraded, 2 failed, -1 unknown (the check could not look)",
                         ["node", "check"], registry=registry)
    for r in results:
        check_status.labels(node=r.node, check=r.check).set(PROM_VALUE[r.status])
    Gauge("twinspark_health_status", "Overall pair health: 0 healthy, 1 degraded (or a check could not look), "
          "2 failed", registry=registry).set(RANK[overall(results)])
    _stamp(registry, elapsed_s)
    figures = {
        "running": ("twinspark_vllm_requests_running", "Requests running on the pair (vLLM /metrics)"),
        "waiting": ("twinspark_vllm_requests_waiting", "Requests waiting on the pair (vLLM /metrics)"),
        "kv_cache_usage": ("twinspark_vllm_kv_cache_usage_ratio", "KV cache usage, 0..1 (vLLM /metrics)"),
        "spec_acceptance": ("twinspark_vllm_spec_decode_acceptance_ratio",
                            "Accepted / drafted speculative tokens since start (vLLM /metrics)"),
        "liveness_seconds": ("twinspark_health_liveness_seconds", "Latency of the one-token liveness generation"),
        "tls_cert_expiry": ("twinspark_tls_cert_expiry_timestamp_seconds",
                            "When the certificate the API serves expires (Unix time; only with TLS)"),
    }
    for key, (name, documentation) in figures.items():
        value = (metrics or {}).get(key)
        if isinstance(value, int | float):
            Gauge(name, documentation, registry=registry).set(value)
    _write(path, registry)


def write_fleet_prom_file(path: Path, pairs: Sequence, router, elapsed_s: float) -> None:
    """The node_exporter textfile of a fleet sweep (atomically, via prometheus_client): every pair's checks under
    its pair's name, each pair's and the router's verdict, and the fleet's, all 0 ok, 1 degraded, 2 failed.

    twinspark_health_check_status{pair,node,check}, twinspark_health_pair_status{pair},
    twinspark_health_router_status (only with a router), twinspark_health_status (the worst of them, as the exit
    code), and when the sweep ran and how long it took. `pairs`: fleetreport.PairSeen; `router`: its RouterVerdict.
    """
    # Measured: prometheus_client adds ~130 ms at import (-X importtime); only the textfile needs it.
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    check_status = Gauge("twinspark_health_check_status", "Health check status: 0 ok, 1 degraded, 2 failed",
                         ["pair", "node", "check"], registry=registry)
    pair_status = Gauge("twinspark_health_pair_status", "A pair's health: 0 healthy, 1 degraded, 2 failed",
                        ["pair"], registry=registry)
    for pair in pairs:
        for r in pair.results:
            check_status.labels(pair=pair.name, node=r.node, check=r.check).set(PROM_VALUE[r.status])
        pair_status.labels(pair=pair.name).set(RANK[pair.status])
    if router is not None:
        Gauge("twinspark_health_router_status", "The fleet router's health: 0 ok, 1 degraded, 2 failed",
              registry=registry).set(RANK[router.status])
    Gauge("twinspark_health_status", "Overall fleet health (every pair and the router): 0 healthy, 1 degraded, "
          "2 failed", registry=registry).set(RANK[fleetreport.fleet_status(pairs, router)])
    _stamp(registry, elapsed_s)
    _write(path, registry)


def _stamp(registry, elapsed_s: float) -> None:
    """When the sweep ran and how long it took, in every textfile (the stale-file alert reads the first)."""
    # Measured: prometheus_client adds ~130 ms at import (-X importtime); only the textfile needs it.
    from prometheus_client import Gauge

    Gauge("twinspark_health_last_run_timestamp_seconds", "When the health sweep ran (Unix time)",
          registry=registry).set(time.time())
    Gauge("twinspark_health_duration_seconds", "How long the health sweep took",
          registry=registry).set(elapsed_s)


def _write(path: Path, registry) -> None:
    # Measured: prometheus_client adds ~130 ms at import (-X importtime); only the textfile needs it.
    from prometheus_client import write_to_textfile

    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)
