"""The Grafana dashboards of roles/monitoring/files/dashboards, declared once and written as JSON.

    python -m devtools.dashboards            (re)write every dashboard's JSON
    python -m devtools.dashboards --check    exit 1 naming each file that differs from what this module writes

Each panel is declared once below (title, kind, queries, unit); `dashboard()` lays them out on Grafana's 24-column
grid, numbers them and adds the variables. The committed JSON is this module's output, and
python_tools/tests/test_dashboards.py fails when they drift apart, so an edit goes here, never into the JSON.

The queries read the scrape jobs and target labels of the monitoring contract (docs/MONITORING.md): vLLM's
/metrics on every head, node exporter (with the head's health textfile and every node's guard textfile) on every
node, the fleet router's metrics; `pair`, `node` and `rank_role` are the labels the scrape config adds. vLLM and
node exporter names are those of the recorded fixtures (python_tools/tests/fixtures).

The dashboards use the classic JSON model (Grafana's schemaVersion 42, the last of the v1 API) and a datasource
variable `DS_PROMETHEUS`, so the files load unchanged through Grafana's file provisioning and through the import
dialog alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "roles" / "monitoring" / "files" / "dashboards"
SCHEMA_VERSION = 42
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
GRID_WIDTH = 24
# The netdevs a pair's fabric runs on: the simulated pair's veth and a Spark's ConnectX-7 ports (NCCL_SOCKET_IFNAME,
# twinspark.settings). A text box on the dashboard, so a site with other names types its own.
FABRIC_DEVICES = "ic0|enp1s0f[01]np[01]|enP2p1s0f[01]np[01]"

PAIR = 'pair=~"$pair"'
PAIR_NODE = 'pair=~"$pair", node=~"$node"'
# The health textfile exists on the head only; rank_role keeps a fleet sweep's textfile elsewhere out.
HEAD = 'pair=~"$pair", rank_role="head"'
FABRIC = f'{PAIR_NODE}, device=~"$fabric"'
RATE = "[$__rate_interval]"
QUANTILES = (0.5, 0.9, 0.99)
# Filesystems that hold no model, cache or state: left out of "disk free".
VIRTUAL_FS = 'fstype!~"tmpfs|ramfs|devtmpfs|squashfs|nsfs|fuse.lxcfs"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # timeseries | stat | state-timeline | table
    queries: tuple[Query, ...]
    description: str
    unit: str = "short"
    width: int = 12
    height: int = 8
    mappings: tuple[tuple[int, str, str], ...] = ()  # (value, text, colour)
    thresholds: tuple[tuple[float, str], ...] = ()  # (from, colour) above the base colour
    base_colour: str = "green"
    hidden_columns: tuple[str, ...] = ()  # table panels only


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    query: str  # label_values(EXPR, LABEL) for a query variable, the default text for a text box
    kind: str = "query"  # query | textbox
    multi: bool = False
    description: str = ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...] = field(default_factory=tuple)


VERDICT = ((-1, "unknown", "gray"), (0, "healthy", "green"), (1, "degraded", "orange"), (2, "failed", "red"))
YES_BAD = ((0, "no", "green"), (1, "yes", "red"))
YES_GOOD = ((0, "no", "red"), (1, "yes", "green"))
UP = ((0, "down", "red"), (1, "up", "green"))


def quantiles(histogram: str, selector: str, by: str = "le", legend: str = "") -> tuple[Query, ...]:
    """p50, p90 and p99 of a Prometheus histogram over the rate window, per `by` (which must include le)."""
    matchers = f"{{{selector}}}" if selector else ""
    return tuple(
        Query(f"histogram_quantile({q}, sum by ({by}) (rate({histogram}_bucket{matchers}{RATE})))",
              f"{legend}p{round(q * 100)}")
        for q in QUANTILES)


def rate(counter: str, selector: str, by: str = "") -> str:
    grouping = f" by ({by}) " if by else ""
    return f"sum{grouping}(rate({counter}{{{selector}}}{RATE}))"


def traffic(selector: str) -> tuple[Query, ...]:
    """Bytes per second received and sent, per node and netdev."""
    return tuple(Query(rate(f"node_network_{way}_bytes_total", selector, by="node, device"),
                       f"{{{{node}}}} {{{{device}}}} {short}")
                 for way, short in (("receive", "in"), ("transmit", "out")))


def both_ways(counter: str, selector: str) -> str:
    """A netdev counter received plus sent, per second, per node and netdev."""
    return (f"sum by (node, device) (rate(node_network_receive_{counter}{{{selector}}}{RATE})"
            f" + rate(node_network_transmit_{counter}{{{selector}}}{RATE}))")


def ratio(numerator: str, denominator: str, selector: str) -> str:
    return f"{rate(numerator, selector)} / {rate(denominator, selector)}"


# ---------------------------------------------------------------------------------------------------------------
# The pair overview
# ---------------------------------------------------------------------------------------------------------------

PAIR_VARIABLES = (
    Variable("pair", "Pair", 'label_values(up{job="node"}, pair)',
             description="The pair id (the scrape config's pair label)."),
    Variable("node", "Node", 'label_values(up{job="node", pair=~"$pair"}, node)', multi=True,
             description="The pair's nodes (inventory host names)."),
    Variable("fabric", "Fabric netdevs (regex)", FABRIC_DEVICES, kind="textbox",
             description="A regular expression for the fabric's network interfaces (NCCL_SOCKET_IFNAME)."),
)

SERVING_AT_A_GLANCE = Row("At a glance", (
    Panel("Pair verdict", "stat", (Query(f"max(twinspark_health_status{{{HEAD}}})"),),
          "The head's last health sweep (the same verdict as `twinspark health`).", width=4, height=4,
          mappings=VERDICT),
    Panel("Requests running", "stat", (Query(f"sum(vllm:num_requests_running{{{PAIR}}})"),),
          "Requests in the engine's running batch.", width=4, height=4),
    Panel("Requests waiting", "stat", (Query(f"sum(vllm:num_requests_waiting{{{PAIR}}})"),),
          "Requests queued for a place in the batch.", width=4, height=4, thresholds=((1, "orange"),)),
    Panel("Generated tokens/s", "stat", (Query(rate("vllm:generation_tokens_total", PAIR)),),
          "Output tokens per second over the rate window.", width=4, height=4),
    Panel("KV cache in use", "stat", (Query(f"max(vllm:kv_cache_usage_perc{{{PAIR}}})"),),
          "The KV cache's fill, 0 to 100 %.", unit="percentunit", width=4, height=4,
          thresholds=((0.8, "orange"), (0.9, "red"))),
    Panel("Guard restarts in the last hour", "stat",
          (Query(f"sum(increase(twinspark_guard_restarts_total{{{PAIR}}}[1h]))"),),
          "Ordered restarts the pair guard started, over the last hour, on every node.", width=4, height=4,
          thresholds=((1, "orange"), (3, "red"))),
))

SERVING = Row("Serving (vLLM on the head)", (
    Panel("Requests running and waiting", "timeseries", (
        Query(f"sum(vllm:num_requests_running{{{PAIR}}})", "running"),
        Query(f"sum(vllm:num_requests_waiting{{{PAIR}}})", "waiting"),
        Query(f"sum by (reason) (vllm:num_requests_waiting_by_reason{{{PAIR}}})", "waiting: {{reason}}"),
    ), "The engine's batch and its queue; a queue that keeps growing means more offered load than the pair serves."),
    Panel("Tokens per second", "timeseries", (
        Query(rate("vllm:prompt_tokens_total", PAIR), "prompt"),
        Query(rate("vllm:generation_tokens_total", PAIR), "generation"),
    ), "Prompt tokens prefilled and tokens generated per second.", unit="short"),
    Panel("Time to first token", "timeseries", quantiles("vllm:time_to_first_token_seconds", PAIR),
          "From a request's arrival to its first output token (queue and prefill).", unit="s", width=8),
    Panel("Inter-token latency", "timeseries", quantiles("vllm:inter_token_latency_seconds", PAIR),
          "Time between two output tokens of one request (the decode step as a client feels it).", unit="s",
          width=8),
    Panel("End-to-end request latency", "timeseries", quantiles("vllm:e2e_request_latency_seconds", PAIR),
          "From a request's arrival to its last token.", unit="s", width=8),
    Panel("Queue time", "timeseries", quantiles("vllm:request_queue_time_seconds", PAIR),
          "Time requests spent waiting before their first scheduling.", unit="s", width=8),
    Panel("KV cache usage", "timeseries", (Query(f"max(vllm:kv_cache_usage_perc{{{PAIR}}})", "KV cache"),),
          "The KV cache's fill; above 90 % for minutes, requests queue or get preempted.", unit="percentunit",
          width=8, thresholds=((0.9, "red"),)),
    Panel("Prefix cache hit ratio", "timeseries", (
        Query(ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", PAIR), "hit ratio"),),
          "Prompt tokens found in the prefix cache over tokens looked up, over the rate window (empty while no "
          "prompt arrives).", unit="percentunit", width=8),
    Panel("Speculative decoding acceptance", "timeseries", (
        Query(ratio("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total", PAIR),
              "accepted / drafted tokens"),
        Query(f"1 + {ratio('vllm:spec_decode_num_accepted_tokens_total', 'vllm:spec_decode_num_drafts_total', PAIR)}",
              "mean accepted length"),
    ), "Only a pair that serves with speculative decoding exports these (not the simulated CPU pair).", width=8),
    Panel("Finished requests per second", "timeseries", (
        Query(rate("vllm:request_success_total", PAIR, by="finished_reason"), "{{finished_reason}}"),),
          "Requests that ended, by reason (stop, length, abort, error, ...).", unit="reqps", width=8),
    Panel("Preemptions per second", "timeseries", (Query(rate("vllm:num_preemptions_total", PAIR), "preemptions"),),
          "Requests pushed out of the batch to free KV cache (they run again later).", width=8),
))

HEALTH = Row("Health verdict (the head's health textfile)", (
    Panel("Pair verdict over time", "state-timeline", (Query(f"max(twinspark_health_status{{{HEAD}}})", "pair"),),
          "0 healthy, 1 degraded, 2 failed: the health timer's sweep, once a minute.", mappings=VERDICT, height=5),
    Panel("Health sweep age", "timeseries", (
        Query(f"time() - max(twinspark_health_last_run_timestamp_seconds{{{HEAD}}})", "since the last sweep"),
        Query(f"max(twinspark_health_duration_seconds{{{HEAD}}})", "sweep duration"),
        Query(f"max(twinspark_health_liveness_seconds{{{HEAD}}})", "one-token liveness answer"),
    ), "A sweep older than two minutes means the health timer stopped; the duration and the liveness answer "
       "say how long a sweep and its one-token generation took.", unit="s", height=5),
    Panel("Verdict per check", "state-timeline",
          (Query(f"twinspark_health_check_status{{{HEAD}}}", "{{check}} ({{exported_node}})"),),
          "Every check of the sweep: -1 could not look, 0 ok, 1 degraded, 2 failed. The node a check looked at is "
          "the textfile's own node label, which Prometheus keeps as exported_node beside the target's.",
          mappings=VERDICT, width=24, height=10),
))

GUARD = Row("Pair guard (its textfile on every node)", (
    Panel("Attempts left", "stat", (Query(f"twinspark_guard_attempts_left{{{PAIR_NODE}}}", "{{node}}"),),
          "Failed ordered restarts left before the guard gives up (0 once it has).", width=4, height=4,
          base_colour="red", thresholds=((1, "orange"), (2, "green"))),
    Panel("Paused", "stat", (Query(f"twinspark_guard_paused{{{PAIR_NODE}}}", "{{node}}"),),
          "An operator paused the guard (`twinspark pair pause`).", width=4, height=4,
          mappings=((0, "no", "green"), (1, "paused", "orange"))),
    Panel("Given up", "stat", (Query(f"twinspark_guard_given_up{{{PAIR_NODE}}}", "{{node}}"),),
          "The guard spent its attempts and stopped restarting: the pair needs a person.", width=4, height=4,
          mappings=YES_BAD),
    Panel("Serving (guard's check)", "stat", (Query(f"twinspark_guard_serving{{{PAIR_NODE}}}", "{{node}}"),),
          "Whether the pair served on the guard's last check.", width=4, height=4, mappings=YES_GOOD),
    Panel("Fabric (guard's probe)", "stat", (Query(f"twinspark_guard_fabric_up{{{PAIR_NODE}}}", "{{node}}"),),
          "The guard's own probe of the fabric link to the other node.", width=4, height=4, mappings=UP),
    Panel("Last guard decision", "table",
          (Query(f"twinspark_guard_decision{{{PAIR_NODE}}} == 1"),),
          "The kind of the guard's last decision on each node (ok, starting, restart, hold, wait_fabric, ...).",
          width=4, height=4, hidden_columns=("Time", "Value", "__name__", "instance", "job", "pair", "rank_role")),
    Panel("Guard restarts", "timeseries", (
        Query(f"sum by (node) (increase(twinspark_guard_restarts_total{{{PAIR_NODE}}}[1h]))", "{{node}}"),),
          "Ordered restarts over the hour before each point.", width=8),
    Panel("Guard pause length", "timeseries",
          (Query(f"twinspark_guard_paused_seconds{{{PAIR_NODE}}}", "{{node}}"),),
          "How long the current pause has lasted (0 when not paused).", unit="s", width=8),
    Panel("Since the guard's last decision", "timeseries", (
        Query(f"time() - twinspark_guard_last_decision_timestamp_seconds{{{PAIR_NODE}}}", "{{node}}"),),
          "A figure that keeps growing means the guard stopped checking.", unit="s", width=8),
))

NODES = Row("Nodes (node exporter)", (
    Panel("CPU busy", "timeseries", (
        Query(f'1 - avg by (node) (rate(node_cpu_seconds_total{{{PAIR_NODE}, mode="idle"}}{RATE}))', "{{node}}"),),
          "Share of CPU time not idle, over every core.", unit="percentunit", width=8),
    Panel("Memory in use", "timeseries", (
        Query(f"1 - node_memory_MemAvailable_bytes{{{PAIR_NODE}}} / node_memory_MemTotal_bytes{{{PAIR_NODE}}}",
              "{{node}}"),),
          "Memory not available to new allocations (the Spark's GPU shares it).", unit="percentunit", width=8),
    Panel("Disk free", "timeseries", (
        Query(f"min by (node, mountpoint) (node_filesystem_avail_bytes{{{PAIR_NODE}, {VIRTUAL_FS}}} "
              f"/ node_filesystem_size_bytes{{{PAIR_NODE}, {VIRTUAL_FS}}})", "{{node}} {{mountpoint}}"),),
          "Free share of every real filesystem (the model and cache directories live on one of them).",
          unit="percentunit", width=8, base_colour="red", thresholds=((0.1, "orange"), (0.2, "green"))),
    Panel("Network throughput", "timeseries", traffic(f'{PAIR_NODE}, device!="lo"'),
          "Bytes per second on every interface but loopback.", unit="Bps"),
    Panel("Fabric throughput", "timeseries", traffic(FABRIC),
          "Bytes per second on the fabric netdevs (the variable `fabric`): the ranks' collectives.", unit="Bps"),
    Panel("Fabric link up", "stat",
          (Query(f"node_network_up{{{FABRIC}}}", "{{node}} {{device}}"),),
          "Operational state of each fabric netdev.", width=8, height=4, mappings=UP),
    Panel("Fabric MTU", "stat",
          (Query(f"node_network_mtu_bytes{{{FABRIC}}}", "{{node}} {{device}}"),),
          "The fabric's MTU on each node: both ends must agree (9000 on a converged pair).", width=8, height=4),
    Panel("Fabric speed", "stat",
          (Query(f"node_network_speed_bytes{{{FABRIC}}} * 8", "{{node}} {{device}}"),),
          "The link speed each fabric netdev reports.", unit="bps", width=8, height=4),
    Panel("Fabric errors and drops", "timeseries", (
        Query(both_ways("errs_total", FABRIC), "{{node}} {{device}} errors"),
        Query(both_ways("drop_total", FABRIC), "{{node}} {{device}} drops"),
    ), "Packets per second the fabric netdevs counted as errors or dropped.", width=24),
))

PAIR_DASHBOARD = Dashboard(
    "twinspark-pair", "TwinSpark pair",
    "One pair: vLLM's serving figures on the head, the health verdict, the pair guard, both nodes and the fabric.",
    PAIR_VARIABLES, (SERVING_AT_A_GLANCE, SERVING, HEALTH, GUARD, NODES))


# ---------------------------------------------------------------------------------------------------------------
# The fleet view
# ---------------------------------------------------------------------------------------------------------------

FLEET_VARIABLES = (
    Variable("pair", "Pairs", 'label_values(up{job="node"}, pair)', multi=True,
             description="The pairs shown (every pair by default)."),
    Variable("node", "Nodes", 'label_values(up{job="node", pair=~"$pair"}, node)', multi=True,
             description="The nodes of the chosen pairs."),
)

FLEET_PAIRS = Row("Pairs", (
    Panel("Verdict per pair", "stat", (
        Query(f"max by (pair) (twinspark_health_status{{{HEAD}}})", "{{pair}}"),),
          "Each head's last health sweep: healthy, degraded or failed.", mappings=VERDICT, height=5),
    Panel("Serving per pair (guard's check)", "stat", (
        Query(f"min by (pair) (twinspark_guard_serving{{{PAIR}}})", "{{pair}}"),),
          "Whether every node's guard saw its pair serve on its last check.", mappings=YES_GOOD, height=5),
    Panel("Generated tokens/s per pair", "timeseries", (
        Query(rate("vllm:generation_tokens_total", PAIR, by="pair"), "{{pair}}"),),
          "Output tokens per second of each pair."),
    Panel("Prompt tokens/s per pair", "timeseries", (
        Query(rate("vllm:prompt_tokens_total", PAIR, by="pair"), "{{pair}}"),),
          "Prompt tokens prefilled per second by each pair."),
    Panel("Requests per pair", "timeseries", (
        Query(f"sum by (pair) (vllm:num_requests_running{{{PAIR}}})", "{{pair}} running"),
        Query(f"sum by (pair) (vllm:num_requests_waiting{{{PAIR}}})", "{{pair}} waiting"),
    ), "Each pair's running batch and waiting queue."),
    Panel("Time to first token p90 per pair", "timeseries",
          quantiles("vllm:time_to_first_token_seconds", PAIR, by="pair, le", legend="{{pair}} ")[1:2],
          "The 90th percentile of the time to first token, per pair.", unit="s"),
    Panel("KV cache usage per pair", "timeseries", (
        Query(f"max by (pair) (vllm:kv_cache_usage_perc{{{PAIR}}})", "{{pair}}"),),
          "Each pair's KV cache fill.", unit="percentunit"),
    Panel("Guard restarts per pair (last hour)", "timeseries", (
        Query(f"sum by (pair) (increase(twinspark_guard_restarts_total{{{PAIR}}}[1h]))", "{{pair}}"),),
          "Ordered restarts over the hour before each point, every node of the pair."),
    Panel("CPU busy per node", "timeseries", (
        Query(f'1 - avg by (node) (rate(node_cpu_seconds_total{{{PAIR_NODE}, mode="idle"}}{RATE}))', "{{node}}"),),
          "Share of CPU time not idle on each node.", unit="percentunit"),
    Panel("Scrape targets down", "timeseries", (Query("sum by (job) (1 - up)", "{{job}}"),),
          "Targets Prometheus could not scrape, per job (vllm, node, router, prometheus, alertmanager).",
          thresholds=((1, "red"),)),
))

ROUTER = Row("Router (the fleet's vllm-router)", (
    Panel("Router requests per second by route", "timeseries", (
        Query(f"sum by (route) (rate(vllm_router_requests_total{RATE}))", "{{route}}"),),
          "Requests the router accepted, by API path.", unit="reqps"),
    Panel("Router requests per second per pair", "timeseries", (
        Query(f"sum by (worker) (rate(vllm_router_processed_requests_total{RATE}))", "{{worker}}"),),
          "Requests the router sent to each pair (its head's API URL).", unit="reqps"),
    Panel("Router request latency", "timeseries", quantiles("vllm_router_generate_duration_seconds", ""),
          "The router's time per proxied request, p50/p90/p99.", unit="s"),
    Panel("Requests in flight per pair (router)", "timeseries", (
        Query("sum by (worker) (vllm_router_running_requests)", "{{worker}}"),),
          "Requests the router has open at each pair."),
    Panel("Pairs the router finds healthy", "state-timeline", (
        Query("vllm_router_worker_health", "{{worker}}"),),
          "The router's own health check of each pair (1 healthy: it takes traffic).", mappings=UP),
    Panel("Active pairs in the router", "stat", (Query("vllm_router_active_workers", "active"),),
          "Pairs the router routes to now.", width=4),
    Panel("Circuit-breaker outcomes", "timeseries", (
        Query(f"sum by (worker, outcome) (rate(vllm_router_cb_outcomes_total{RATE}))", "{{worker}} {{outcome}}"),),
          "Outcomes the router's circuit breaker counted per pair (a failure streak opens it).", width=8),
))

FLEET_DASHBOARD = Dashboard(
    "twinspark-fleet", "TwinSpark fleet",
    "Every pair's verdict and throughput side by side, and the fleet router's view.",
    FLEET_VARIABLES, (FLEET_PAIRS, ROUTER))

DASHBOARDS = (PAIR_DASHBOARD, FLEET_DASHBOARD)


# ---------------------------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------------------------

def _mappings(mappings: Sequence[tuple[int, str, str]]) -> list[dict]:
    if not mappings:
        return []
    options = {str(value): {"text": text, "color": colour, "index": index}
               for index, (value, text, colour) in enumerate(mappings)}
    return [{"type": "value", "options": options}]


def _thresholds(panel: Panel) -> dict:
    steps: list[dict] = [{"color": panel.base_colour, "value": None}]
    steps += [{"color": colour, "value": start} for start, colour in panel.thresholds]
    return {"mode": "absolute", "steps": steps}


def _targets(panel: Panel) -> list[dict]:
    targets = []
    for index, query in enumerate(panel.queries):
        target: dict = {"datasource": DATASOURCE, "expr": query.expr, "refId": chr(ord("A") + index)}
        if panel.kind == "table":
            target.update({"format": "table", "instant": True, "range": False})
        else:
            target.update({"legendFormat": query.legend or "__auto", "range": True, "instant": False})
        targets.append(target)
    return targets


def _options(panel: Panel) -> dict:
    legend = {"displayMode": "list", "placement": "bottom", "showLegend": True}
    tooltip = {"mode": "multi", "sort": "none"}
    if panel.kind == "stat":
        return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "background" if panel.mappings or panel.thresholds else "value",
                "graphMode": "none", "justifyMode": "auto", "orientation": "auto", "textMode": "auto",
                "wideLayout": True, "showPercentChange": False}
    if panel.kind == "state-timeline":
        return {"mergeValues": True, "showValue": "auto", "alignValue": "left", "rowHeight": 0.9,
                "legend": legend, "tooltip": tooltip}
    if panel.kind == "table":
        return {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}
    return {"legend": legend, "tooltip": tooltip}


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    defaults: dict = {"unit": panel.unit, "mappings": _mappings(panel.mappings), "thresholds": _thresholds(panel)}
    if panel.kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                              "spanNulls": False}
    if panel.kind in ("stat", "state-timeline") and panel.mappings:
        defaults["color"] = {"mode": "thresholds"}
    out = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": _options(panel),
        "targets": _targets(panel),
    }
    if panel.hidden_columns:
        out["transformations"] = [{"id": "organize", "options": {
            "excludeByName": dict.fromkeys(panel.hidden_columns, True)}}]
    return out


def _variable(variable: Variable) -> dict:
    if variable.kind == "textbox":
        current = {"text": variable.query, "value": variable.query}
        return {"name": variable.name, "label": variable.label, "description": variable.description,
                "type": "textbox", "query": variable.query, "current": current, "options": [current], "hide": 0}
    return {
        "name": variable.name, "label": variable.label, "description": variable.description, "type": "query",
        "datasource": DATASOURCE, "definition": variable.query, "query": variable.query, "refresh": 2,
        "regex": "", "sort": 1, "multi": variable.multi, "includeAll": variable.multi,
        "current": {"text": "All", "value": "$__all"} if variable.multi else {}, "options": [], "hide": 0,
    }


def _datasource_variable() -> dict:
    return {"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource", "query": "prometheus",
            "current": {}, "options": [], "regex": "", "refresh": 1, "hide": 0}


def dashboard(spec: Dashboard) -> dict:
    """The Grafana JSON of one dashboard: rows and panels packed left to right on the grid, ids from 1."""
    panels: list[dict] = []
    next_id = 1
    y = 0
    for row in spec.rows:
        panels.append({"id": next_id, "type": "row", "title": row.title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}})
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for panel in row.panels:
            if x + panel.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel(panel, next_id, x, y))
            next_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return {
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}]},
        "description": spec.description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{"type": "dashboards", "title": "TwinSpark", "tags": ["twinspark"], "asDropdown": False,
                   "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False}],
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["twinspark", "vllm"],
        "templating": {"list": [_datasource_variable(), *(_variable(v) for v in spec.variables)]},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": spec.title,
        "uid": spec.uid,
        "version": 1,
    }


def rendered() -> dict[Path, str]:
    """Every dashboard's file and the exact text this module writes there."""
    return {DASHBOARD_DIR / f"{spec.uid}.json": json.dumps(dashboard(spec), indent=2) + "\n" for spec in DASHBOARDS}


def stale(files: dict[Path, str]) -> list[str]:
    """The files whose text on disk differs from `files` (or that are missing)."""
    return [str(path.relative_to(REPO)) for path, text in files.items()
            if not path.is_file() or path.read_text() != text]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.dashboards", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale file")
    args = parser.parse_args(argv)
    files = rendered()
    if args.check:
        differ = stale(files)
        for name in differ:
            print(f"{name} is stale: run `python -m devtools.dashboards` in python_tools/", file=sys.stderr)
        return 1 if differ else 0
    DASHBOARD_DIR.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
