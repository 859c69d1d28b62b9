"""The bandwidth check before serving: when it is due, what it records, and what health makes of the record.

The measurement itself is the fabric check (playbooks/fabric-check.yml: `twinspark fabric bench`'s all_reduce, NCCL
against 175 Gb/s on gb10, gloo as a report on cpu, and on gb10 `ib_write_bw` per twin HCA against its own per-port
mark). The preflight decides whether it is due; site.yml then runs it as the last step before serving, and it
writes the record below on each node, which `twinspark health` reports.

Due: on request, when a node has no record, when its last measurement failed, or when the node's fabric is no longer
the one measured (its fingerprint: the fabric netdevs' MTU, speed and addresses, the ConnectX functions' trained
links, the RDMA devices, their firmware and port states, the kernel).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from twinspark.doctor import rules

RECORD_SCHEMA = 1


def fingerprint(facts: Mapping, env: Mapping[str, str]) -> str:
    """What about this node's fabric a bandwidth measurement vouches for, as a short digest."""
    netdevs = {n.get("name"): n for n in facts.get("netdevs") or []}
    fabric = rules.fabric_netdevs(facts, env)
    shape = {
        "kernel": facts.get("kernel"),
        "netdevs": [[name, netdevs.get(name, {}).get("mtu"), netdevs.get(name, {}).get("speed_mbps"),
                     sorted(netdevs.get(name, {}).get("ipv4") or [])] for name in fabric],
        "pcie": sorted([f.get("address"), (f.get("lnksta") or {}).get("width"), (f.get("lnksta") or {}).get("speed")]
                       for f in facts.get("pcie") or []),
        "rdma": sorted([d.get("device"), d.get("fw_ver"), [p.get("state") for p in d.get("ports") or []]]
                       for d in facts.get("rdma") or [] if isinstance(d, Mapping)),
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def why_due(record: object, current: str, requested: bool = False) -> str:
    """Why the bandwidth must be measured before serving, or "" when the last measurement still holds."""
    if requested:
        return "requested"
    if not isinstance(record, Mapping) or record.get("schema") != RECORD_SCHEMA:
        return "never measured on this node"
    if not record.get("passed"):
        return f"the last measurement ({record.get('checked_at')}) failed"
    if record.get("fingerprint") != current:
        return f"the fabric changed since the last measurement ({record.get('checked_at')})"
    return ""


def make_record(all_reduce: Mapping, ports: Sequence[Mapping], fingerprint_now: str, checked_at: str,
                profile: str) -> dict[str, object]:
    """The record a node keeps: `all_reduce` is `twinspark fabric bench --json`'s report (or {rc, error} when it
    failed), `ports` the head's ib_write_bw results ({device, peer, gbps, min_gbps, rc}: one per HCA and rank it
    reaches), each judged against its own mark."""
    ports_judged = [{**port, "passed": port.get("rc") == 0 and float(port.get("gbps") or 0) >= float(port["min_gbps"])}
                    for port in ports]
    reduce_passed = all_reduce.get("rc") == 0 and all_reduce.get("passed") is not False
    return {
        "schema": RECORD_SCHEMA,
        "checked_at": checked_at,
        "profile": profile,
        "fingerprint": fingerprint_now,
        "all_reduce": {key: all_reduce.get(key) for key in ("rc", "backend", "peak_busbw_gbps", "threshold_gbps",
                                                              "passed", "error")},
        "ports": ports_judged,
        "passed": bool(reduce_passed and all(port["passed"] for port in ports_judged)),
    }


def summary(record: Mapping) -> str:
    """One line: the all_reduce peak against its mark, and each port against its own."""
    reduce = record.get("all_reduce") or {}
    if reduce.get("peak_busbw_gbps") is None:
        parts = [f"all_reduce failed (rc {reduce.get('rc')}): {reduce.get('error') or 'no figures'}"]
    else:
        mark = f" of {reduce['threshold_gbps']:g} GB/s" if reduce.get("threshold_gbps") is not None else \
            " (report only)"
        parts = [f"all_reduce {reduce.get('backend')} peak {reduce['peak_busbw_gbps']:.2f} GB/s{mark}"]
    ports = record.get("ports") or []
    # A pair's line stays as it was; a group's names the rank each figure was measured against.
    named = len({p.get("peer") for p in ports if p.get("peer")}) > 1
    parts += [f"{p.get('device')}{' to ' + str(p['peer']) if named and p.get('peer') else ''} "
              f"{float(p.get('gbps') or 0):.1f} of {float(p['min_gbps']):g} Gb/s" for p in ports]
    return ", ".join(parts) + f" ({record.get('checked_at')})"
