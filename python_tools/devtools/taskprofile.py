"""Where a playbook run spent its time, from the records of the `twinspark_timing` callback.

`scripts/bench/rerun-profile` runs `site.yml` on a converged pair with that callback on and prints what this module
makes of its JSON lines: the run's total, the time per play and per role, and the slowest tasks, with how each host
came out of them. Issue #16's bar is a converged re-run of at most 30 s with nothing changed; the ranking says which
tasks to cut or fold first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

OUTCOMES = ("changed", "failed", "unreachable", "ignored", "ok", "skipped")
RECAP_COUNT = re.compile(r"\b(ok|changed|unreachable|failed|skipped|rescued|ignored)=(\d+)")


@dataclass(frozen=True)
class TaskTime:
    play: str
    role: str
    task: str
    seconds: float
    hosts: dict[str, str]

    def outcome(self) -> str:
        """The task's outcome in one word: the worst any host had (changed before failed before ok before skipped)."""
        seen = set(self.hosts.values())
        for word in OUTCOMES:
            if word in seen:
                return word
        return "none"  # no host ran it (every host was already done, or the play's hosts were empty)


def read_records(lines: Iterable[str], source: str = "record") -> list[TaskTime]:
    """The callback's JSON lines as TaskTimes; a line that is not one names its number and `source`."""
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            rows.append(TaskTime(str(data["play"]), str(data.get("role") or ""), str(data["task"]),
                                 float(data["seconds"]), {str(k): str(v) for k, v in dict(data["hosts"]).items()}))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{source}: line {number} is not a twinspark_timing record ({exc})") from None
    return rows


def recap_counts(output: str) -> dict[str, int]:
    """The PLAY RECAP's counts summed over every host (ok, changed, failed, ...); empty when there is no recap."""
    totals: dict[str, int] = {}
    _, found, recap = output.rpartition("PLAY RECAP")
    if not found:
        return totals
    for key, value in RECAP_COUNT.findall(recap):
        totals[key] = totals.get(key, 0) + int(value)
    return totals


def _sums(rows: list[TaskTime], key) -> list[tuple[str, float, int]]:
    """(name, seconds, tasks) per key, slowest first, in first-seen order among equals."""
    order: dict[str, list[float]] = {}
    for row in rows:
        order.setdefault(key(row), []).append(row.seconds)
    return sorted(((name, sum(v), len(v)) for name, v in order.items()), key=lambda t: -t[1])


def summary(rows: list[TaskTime], top: int = 25) -> list[str]:
    """The report: total, per play, per role, the `top` slowest tasks, and what the skipped-only tasks cost."""
    total = sum(r.seconds for r in rows)
    lines = [f"{len(rows)} tasks, {total:.1f} s in tasks"]
    lines.append("== per play")
    lines += [f"{s:7.1f} s  {n:3d} tasks  {name}" for name, s, n in _sums(rows, lambda r: r.play)]
    lines.append("== per role (tasks outside a role: -)")
    lines += [f"{s:7.1f} s  {n:3d} tasks  {name}" for name, s, n in _sums(rows, lambda r: r.role or "-")]
    skipped = [r for r in rows if r.outcome() in ("skipped", "none")]
    lines.append(f"== skipped on every host: {len(skipped)} tasks, {sum(r.seconds for r in skipped):.1f} s")
    lines.append(f"== slowest {min(top, len(rows))} tasks")
    for row in sorted(rows, key=lambda r: -r.seconds)[:top]:
        where = f"{row.role} : " if row.role else ""
        lines.append(f"{row.seconds:7.2f} s  {row.outcome():9s} {where}{row.task}")
    return lines
