"""monitor-check: does every dashboard panel's query return data from a live Prometheus? (scripts/sim/monitor-check)

    scripts/sim/monitor-check [--prometheus URL] [--dashboard FILE ...] [--skip TITLE ...] [--var NAME=VALUE ...]
                              [--rate-interval 1m] [--timeout S] [--json]

For every panel of the Grafana dashboards (roles/monitoring/files/dashboards, or the --dashboard files) each target's
expression is sent to Prometheus's /api/v1/query as an instant query, after Grafana's variables are replaced the way
Grafana would: a query variable (`label_values(EXPR, LABEL)`) by every value Prometheus's /api/v1/series knows for
LABEL (as "All", a regular expression; --var NAME=VALUE chooses one instead), a text box by its default,
$__rate_interval by --rate-interval (1m: four 15 s scrapes), $__interval by --interval, $__range by --range.
A panel has data when every one of its targets returns at least one series.

The default --prometheus is the one-pair simulated pair's head; on the simulated fleet Prometheus runs on the
router node (--prometheus http://10.78.0.5:9090 for two pairs).

--skip TITLE leaves out a panel, or every panel of a row, by its title; it must name one (on the one-pair simulated
pair there is no router, so `--skip "Router (the fleet's vllm-router)"`, and the CPU engine drafts no speculative
tokens, so `--skip "Speculative decoding acceptance"`; the summary counts what was skipped).

Prints a line for each panel without data (NO DATA, or QUERY FAILED with Prometheus's reason), then one summary line:
`monitor-check: N panels checked, N with data, N without[; N skipped]`. --json prints the same as one JSON object.
Exit 0 every checked panel has data; 1 a panel without; 2 bad arguments, a refused route (twinspark.netguard) or a
Prometheus that does not answer. Every request is bounded by --timeout.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from devtools import dashboards, promql
from twinspark import api, layout, netguard

# The simulated pair's head, where the monitoring role puts Prometheus when the inventory names no monitor host.
DEFAULT_PROMETHEUS = f"http://10.78.0.1:{layout.default().prometheus_port}"
TIMEOUT_S = 10.0
DATA, EMPTY, FAILED, SKIPPED = "data", "empty", "failed", "skipped"
# Grafana's variable forms: $name, ${name} (also ${name:format}) and the old [[name]].
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
# What a PromQL regular expression inside a string literal must escape (the backslash itself doubled for the string).
_REGEX_SPECIAL = frozenset("\\^$.|?*+()[]{}")


class Unreachable(Exception):
    """Prometheus did not answer at all (refused, reset, timed out): nothing more can be checked."""


class QueryRefused(Exception):
    """Prometheus answered, but not with data (a bad expression, a server error)."""


@dataclass(frozen=True)
class Target:
    dashboard: str
    row: str
    panel: str
    ref: str
    legend: str
    expr: str


@dataclass(frozen=True)
class PanelOutcome:
    dashboard: str
    panel: str
    status: str  # data | empty | failed | skipped
    detail: str = ""


# ---------------------------------------------------------------------------------------------------------------
# Pure rules: panels, substitution, counting, the report
# ---------------------------------------------------------------------------------------------------------------

def targets(board: Mapping) -> list[Target]:
    """Every panel target of a dashboard's JSON, with its row's title (rows' nested panels included)."""
    found = []
    row = ""
    for panel in board.get("panels", []):
        if panel.get("type") == "row":
            row = panel.get("title", "")
            nested = panel.get("panels", [])
        else:
            nested = [panel]
        for inner in nested:
            for target in inner.get("targets", []):
                found.append(Target(board.get("title", ""), row, inner.get("title", ""), target.get("refId", ""),
                                    target.get("legendFormat", ""), target.get("expr", "")))
    return found


def regex_of(values: Iterable[str]) -> str:
    """Label values as one PromQL regular expression (Grafana's "All"), escaped for a double-quoted string."""
    return "|".join("".join(f"\\\\{c}" if c in _REGEX_SPECIAL else c for c in value) for value in values)


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace every Grafana variable in expr by its value; ValueError naming a variable that has none."""
    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name not in values:
            raise ValueError(f"no value for the variable ${name}")
        return values[name]

    return _VARIABLE.sub(replace, expr)


def builtins(rate_interval: str, interval: str, range_: str) -> dict[str, str]:
    """Grafana's own variables as a dashboard's queries use them."""
    return {"__rate_interval": rate_interval, "__interval": interval, "__range": range_}


def series_count(data: Mapping) -> int:
    """How many series an /api/v1/query answer's `data` holds (a scalar or a string counts as one)."""
    result = data.get("result")
    if data.get("resultType") in ("vector", "matrix"):
        return len(result or [])
    return 1 if result else 0


def unknown_skips(skips: Iterable[str], boards: Sequence[Mapping]) -> list[str]:
    """The --skip titles that name no panel and no row of the dashboards."""
    titles = {t.panel for board in boards for t in targets(board)} | {t.row for board in boards for t in targets(board)}
    return [skip for skip in skips if skip not in titles]


def summary(outcomes: Sequence[PanelOutcome]) -> dict[str, int]:
    counted = [o for o in outcomes if o.status != SKIPPED]
    with_data = sum(o.status == DATA for o in counted)
    return {"checked": len(counted), "with_data": with_data, "without": len(counted) - with_data,
            "skipped": len(outcomes) - len(counted)}


def report(outcomes: Sequence[PanelOutcome]) -> str:
    """A line for each panel without data, then the one-line summary."""
    marks = {EMPTY: "NO DATA", FAILED: "QUERY FAILED"}
    lines = [f"{marks[o.status]:<12}  {o.dashboard} / {o.panel}: {o.detail}"
             for o in outcomes if o.status in marks]
    counts = summary(outcomes)
    line = (f"monitor-check: {counts['checked']} panels checked, {counts['with_data']} with data, "
            f"{counts['without']} without")
    if counts["skipped"]:
        line += f"; {counts['skipped']} skipped"
    return "\n".join([*lines, line])


# ---------------------------------------------------------------------------------------------------------------
# I/O: Prometheus's HTTP API
# ---------------------------------------------------------------------------------------------------------------

class Prometheus:
    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.http = api.session()

    def get(self, path: str, params: Mapping[str, str]) -> object:
        """GET an API path: its `data`; Unreachable when no HTTP answer came, QueryRefused for an error answer."""
        result, response = api.request(self.http, "GET", f"{self.url}{path}", self.timeout_s, params=params)
        if response is None:
            raise Unreachable(f"Prometheus at {self.url} did not answer: {result['error']}")
        try:
            body = response.json()
        except ValueError:
            raise QueryRefused(f"HTTP {response.status_code}, not Prometheus's JSON") from None
        if response.status_code != 200 or body.get("status") != "success":
            raise QueryRefused(f"HTTP {response.status_code}: {body.get('errorType', '?')}: "
                               f"{str(body.get('error', ''))[:200]}")
        return body.get("data")

    def query(self, expr: str) -> int:
        data = self.get("/api/v1/query", {"query": expr})
        return series_count(data if isinstance(data, Mapping) else {})

    def label_values(self, selector: str, label: str) -> list[str]:
        data = self.get("/api/v1/series", {"match[]": selector})
        return sorted({str(s[label]) for s in (data or []) if isinstance(s, Mapping) and label in s})


def variable_values(board: Mapping, prometheus: Prometheus, overrides: Mapping[str, str],
                    grafana: Mapping[str, str]) -> dict[str, str]:
    """Every variable of a dashboard, in order (a later one may use an earlier one): ValueError when a query
    variable finds no value."""
    values = dict(grafana)
    for variable in board.get("templating", {}).get("list", []):
        name, kind = variable.get("name", ""), variable.get("type")
        if kind == "datasource":
            continue
        if name in overrides:
            values[name] = overrides[name]
        elif kind in ("textbox", "constant", "custom"):
            values[name] = str(variable.get("query", ""))
        elif kind == "query":
            definition = variable.get("definition") or variable.get("query")
            selector, label = promql.label_values_parts(str(definition))
            try:
                found = prometheus.label_values(substitute(selector, values), label)
            except QueryRefused as error:
                raise ValueError(f"variable {name}: {definition}: {error}") from None
            if not found:
                raise ValueError(f"variable {name}: {definition} found no {label} label: is Prometheus scraping "
                                 "the pair with the monitoring role's scrape config?")
            values[name] = regex_of(found)
        else:
            raise ValueError(f"variable {name}: type {kind} is not read by monitor-check")
    return values


def check(boards: Sequence[Mapping], prometheus: Prometheus, skips: Iterable[str], overrides: Mapping[str, str],
          grafana: Mapping[str, str]) -> list[PanelOutcome]:
    """Every panel of every dashboard: data, empty (naming its targets without series), failed or skipped."""
    skipped = set(skips)
    outcomes: list[PanelOutcome] = []
    for board in boards:
        title = board.get("title", "")
        by_panel: dict[tuple[str, str], list[Target]] = {}
        for target in targets(board):
            by_panel.setdefault((target.row, target.panel), []).append(target)
        try:
            values = variable_values(board, prometheus, overrides, grafana)
        except ValueError as error:
            outcomes += [PanelOutcome(title, panel, FAILED, str(error)) for (_, panel) in by_panel]
            continue
        for (row, panel), panel_targets in by_panel.items():
            if panel in skipped or row in skipped:
                outcomes.append(PanelOutcome(title, panel, SKIPPED))
                continue
            outcomes.append(_check_panel(title, panel, panel_targets, prometheus, values))
    return outcomes


def _check_panel(title: str, panel: str, panel_targets: Sequence[Target], prometheus: Prometheus,
                 values: Mapping[str, str]) -> PanelOutcome:
    empty = []
    for target in panel_targets:
        named = f"target {target.ref}" + (f" ({target.legend})" if target.legend not in ("", "__auto") else "")
        try:
            expr = substitute(target.expr, values)
            if prometheus.query(expr) == 0:
                empty.append(f"{named} returned no series: {expr}")
        except (ValueError, QueryRefused) as error:
            return PanelOutcome(title, panel, FAILED, f"{named}: {error}")
    return PanelOutcome(title, panel, EMPTY, "; ".join(empty)) if empty else PanelOutcome(title, panel, DATA)


# ---------------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------------

def _overrides(pairs: Sequence[str]) -> dict[str, str]:
    found = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--var must be NAME=VALUE (got {pair!r})")
        found[name] = value
    return found


def _load(files: Sequence[str]) -> list[dict]:
    paths = [Path(f) for f in files] if files else sorted(dashboards.DASHBOARD_DIR.glob("*.json"))
    if not paths:
        raise ValueError(f"no dashboard JSON in {dashboards.DASHBOARD_DIR}; name one with --dashboard FILE")
    boards = []
    for path in paths:
        try:
            boards.append(json.loads(path.read_text()))
        except (OSError, ValueError) as error:
            raise ValueError(f"--dashboard {path}: not a readable dashboard JSON ({error})") from None
    return boards


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(prog="monitor-check", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    out.add_argument("--prometheus", default=DEFAULT_PROMETHEUS, metavar="URL",
                     help=f"Prometheus's URL (default {DEFAULT_PROMETHEUS})")
    out.add_argument("--dashboard", action="append", default=[], metavar="FILE",
                     help="a dashboard JSON file (repeatable; default: every one the monitoring role ships)")
    out.add_argument("--skip", action="append", default=[], metavar="TITLE",
                     help="leave out the panel, or every panel of the row, with this title (repeatable)")
    out.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                     help="a dashboard variable's value instead of every value Prometheus knows (repeatable)")
    out.add_argument("--rate-interval", default="1m", help="what $__rate_interval stands for (default 1m)")
    out.add_argument("--interval", default="15s", help="what $__interval stands for (default 15s)")
    out.add_argument("--range", default="1h", help="what $__range stands for (default 1h)")
    out.add_argument("--timeout", type=float, default=TIMEOUT_S, help=f"seconds per request (default {TIMEOUT_S:g})")
    out.add_argument("--json", action="store_true", help="one JSON object instead of the lines")
    return out


def main(argv: Sequence[str] | None = None, lookup: Callable = netguard.lookup_route) -> int:
    args = parser().parse_args(argv)
    try:
        if args.timeout <= 0:
            raise ValueError(f"--timeout must be a positive number of seconds (got {args.timeout:g})")
        overrides = _overrides(args.var)
        boards = _load(args.dashboard)
        unknown = unknown_skips(args.skip, boards)
        if unknown:
            raise ValueError(f"--skip {unknown[0]!r} names no panel and no row of the dashboards")
        netguard.check([args.prometheus], lookup=lookup)
    except (ValueError, netguard.UnsafeRoute) as error:
        print(f"monitor-check: {error}", file=sys.stderr)
        return 2
    prometheus = Prometheus(args.prometheus, args.timeout)
    try:
        outcomes = check(boards, prometheus, args.skip, overrides,
                         builtins(args.rate_interval, args.interval, args.range))
    except Unreachable as error:
        print(f"monitor-check: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**summary(outcomes), "prometheus": args.prometheus,
                          "panels": [asdict(o) for o in outcomes]}, indent=2))
    else:
        print(report(outcomes))
    return 0 if summary(outcomes)["without"] == 0 else 1
