"""`twinspark health` for a fleet: every pair's sweep shaped into one table, the router's line and a summary.

Each pair is swept exactly as a one-pair inventory is (twinspark.health.command.sweep_inventory); this module only
shapes the results. Pure: no I/O here (the router's answer is read by the caller and handed in as `RouterSeen`).

The exit code is the worst of all: every pair's own verdict and the router's (0 healthy, 1 degraded, 2 failed).
The router's verdict:
  * failed   it does not answer with its worker list (with the key): the fleet's endpoint is down;
  * degraded a pair that serves is not in its list (drained and never put back: `twinspark pair rejoin`), or it
             lists a URL that is no pair of the inventory;
  * ok       it lists every pair that serves. A pair that does not serve may be in the list or not (the router's
             own health checks keep it from traffic); its own line already fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from twinspark.health.checks import (
    DEGRADED,
    FAILED,
    MARKS,
    OK,
    RANK,
    STATUS_ORDER,
    CheckResult,
    exit_code,
    overall,
    worst,
)


@dataclass(frozen=True)
class PairSeen:
    """One pair's sweep: its name, the URL the router knows it by, and its checks (as the one-pair table has)."""

    name: str
    url: str
    results: tuple[CheckResult, ...]

    @property
    def status(self) -> str:
        return overall(self.results) if self.results else FAILED


@dataclass(frozen=True)
class RouterSeen:
    """What the router answered: its URL, the worker URLs it lists (None: no answer), and the error if any."""

    url: str
    listed: tuple[str, ...] | None
    error: str = ""


@dataclass(frozen=True)
class RouterVerdict:
    status: str
    message: str
    fix: str = ""


def _norm(url: str) -> str:
    return url.rstrip("/")


def router_verdict(router: RouterSeen, pairs: Sequence[PairSeen], others: Sequence[str] = ()) -> RouterVerdict:
    """The router's status from its worker list and the pairs' own verdicts (rules in the module's docstring).
    `others`: URLs of the fleet's pairs not swept (health --limit), which the router may list."""
    if router.listed is None:
        return RouterVerdict(FAILED, f"{router.url} does not answer ({router.error or 'no answer'}): the fleet's "
                                     "endpoint is down",
                             "systemctl status twinspark-router on the router host; journalctl -u twinspark-router")
    listed = {_norm(u) for u in router.listed}
    known = {_norm(p.url) for p in pairs} | {_norm(u) for u in others}
    out = [p.name for p in pairs if p.status != FAILED and _norm(p.url) not in listed]
    strangers = sorted(listed - known)
    taking = sum(1 for p in pairs if _norm(p.url) in listed)
    message = f"{router.url} lists {taking} of {len(pairs)} pairs"
    if out or strangers:
        parts = []
        if out:
            parts.append(f"serving but out of the router: {', '.join(out)}")
        if strangers:
            parts.append(f"lists what is no pair here: {', '.join(strangers)}")
        return RouterVerdict(DEGRADED, f"{message}; {'; '.join(parts)}",
                             "a serving pair's guard puts it back on its next run (its timer, every 20 s); "
                             "`twinspark pair rejoin` on its head does it now, and says why not; a URL that is no "
                             "pair: check twinspark_router_pairs and rerun playbooks/router.yml")
    return RouterVerdict(OK, message)


def _first_problem(results: Sequence[CheckResult]) -> CheckResult | None:
    bad = [r for r in results if r.status != OK]
    return max(bad, key=lambda r: RANK[r.status]) if bad else None


def fleet_status(pairs: Sequence[PairSeen], router: RouterVerdict | None) -> str:
    statuses = [p.status for p in pairs] + ([router.status] if router is not None else [])
    return worst(statuses) if statuses else FAILED


def table(pairs: Sequence[PairSeen], router: RouterVerdict | None) -> str:
    """One line per pair (its verdict, its check counts, its worst problem and the fix), the router's line, and the
    fleet's summary line with the exit code."""
    width = max([len(p.name) for p in pairs] + [len("router")])
    lines = []
    for pair in pairs:
        counts = ", ".join(f"{sum(r.status == s for r in pair.results)} {s}" for s in STATUS_ORDER)
        problem = _first_problem(pair.results)
        detail = f"; {problem.node} {problem.check}: {problem.message}" if problem else ""
        if not pair.results:
            detail, counts = "; no checks came back", "0 checks"
        lines.append(f"{MARKS[pair.status]:<8}  {pair.name:<{width}}  {counts}{detail}")
        if problem is not None and problem.fix:
            lines.append(f"{'':<8}  {'':<{width}}  -> {problem.fix}")
    if router is not None:
        lines.append(f"{MARKS[router.status]:<8}  {'router':<{width}}  {router.message}")
        if router.fix:
            lines.append(f"{'':<8}  {'':<{width}}  -> {router.fix}")
    status = fleet_status(pairs, router)
    counts = ", ".join(f"{sum(p.status == s for p in pairs)} {s}" for s in STATUS_ORDER)
    router_word = "no router" if router is None else f"router {router.status}"
    lines.append(f"FLEET {status.upper()}: {len(pairs)} pairs ({counts}), {router_word} (exit {exit_code(status)})")
    return "\n".join(lines)


def as_json(pairs: Sequence[PairSeen], router: RouterVerdict | None) -> dict[str, object]:
    status = fleet_status(pairs, router)
    return {
        "status": status,
        "exit_code": exit_code(status),
        "pairs": {p.name: {"status": p.status, "url": p.url, "checks": [r.to_dict() for r in p.results]}
                  for p in pairs},
        "router": None if router is None else {"status": router.status, "message": router.message,
                                               "fix": router.fix},
    }


def fleet_exit(pairs: Sequence[PairSeen], router: RouterVerdict | None) -> int:
    return exit_code(fleet_status(pairs, router))
