"""The Grafana dashboards (roles/monitoring/files/dashboards): importable JSON, written by devtools.dashboards, and
every metric name a panel or a variable queries is one that something in the pair exports:

- vllm:* in vLLM's recorded /metrics (fixtures/health/recorded_vllm_cpu_0_32_metrics.txt); the speculative-decoding
  counters, which the CPU engine exports only while it drafts, in the same engine's /metrics recorded with ngram
  drafting on (fixtures/health/recorded_vllm_cpu_0_32_ngram_metrics.txt: those and only those);
- twinspark_health_* and twinspark_vllm_* in what the health writers (twinspark.health.report) really write;
- twinspark_guard_* in what the guard's textfile writer (twinspark.pair.textfile) really writes, which must hold
  every name of issue 30's monitoring contract (GUARD_TEXTFILE_NAMES);
- node_* in node exporter 1.5's names as Debian 12's package served them (fixtures/monitoring/...node_exporter...);
- vllm_router_* in the real vllm-router 0.1.17's /metrics (fixtures/monitoring/recorded_vllm_router_...);
- up and the scrape_* series Prometheus makes itself for every target.

promtool parses no bare PromQL, so the names come from devtools.promql's tokenizer, tested here as well.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools import dashboards, promql
from twinspark.health import fleetreport, report
from twinspark.health.checks import CheckResult
from twinspark.pair import textfile

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"

# The guard textfile (guard.prom) as issue 30's monitoring contract names it.
GUARD_TEXTFILE_NAMES = frozenset({
    "twinspark_guard_restarts_total", "twinspark_guard_attempts_left", "twinspark_guard_paused",
    "twinspark_guard_paused_seconds", "twinspark_guard_given_up", "twinspark_guard_last_decision_timestamp_seconds",
    "twinspark_guard_decision", "twinspark_guard_fabric_up", "twinspark_guard_serving",
})
# Prometheus's own series for every scrape target (its docs: "Jobs and instances").
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped",
                               "scrape_samples_post_metric_relabeling", "scrape_series_added"})
SPEC_DECODE = re.compile(r"^vllm:spec_decode_")


def sample_names(path: Path) -> set[str]:
    """Every sample name in a Prometheus text file (histograms as _bucket, _sum, _count)."""
    return names_in(path.read_text())


def names_in(text: str) -> set[str]:
    families = text_string_to_metric_families(text)
    return {sample.name for family in families for sample in family.samples}


class EveryFigure(dict):
    """Answers every figure the health writer asks for, so that it writes every gauge it can (not empty: the writer
    reads `metrics or {}`)."""

    def get(self, key, default=None):
        return 0.5


def health_textfile_names(folder: Path) -> set[str]:
    """The names the head's and the fleet's health textfiles hold, as the real writers write them."""
    results = [CheckResult("node1", "service", "ok", "active"), CheckResult("node2", "fabric", "failed", "down")]
    report.write_prom_file(folder / "pair.prom", results, 0.8, EveryFigure(running=0.5))
    pairs = [fleetreport.PairSeen("pair_a", "http://127.0.0.1:9/", tuple(results))]
    report.write_fleet_prom_file(folder / "fleet.prom", pairs, fleetreport.RouterVerdict("ok", "serving"), 0.9)
    return sample_names(folder / "pair.prom") | sample_names(folder / "fleet.prom")


def guard_textfile_names() -> set[str]:
    """The names the guard's textfile holds after a run that looked at the pair while paused (every figure set)."""
    run = textfile.Reading(decision="paused", restarts=2, attempts_left=1, given_up=False, decided_at=1.0,
                           paused_for_s=30.0, serving=True, fabric_up=True)
    return names_in(textfile.exposition(run).decode())


@pytest.fixture(scope="module")
def known(tmp_path_factory) -> dict[str, set[str]]:
    """Where each family of names may come from: {family: names}."""
    node_list = FIXTURES / "monitoring" / "recorded_node_exporter_1_5_metric_names.txt"
    return {
        "vllm": sample_names(FIXTURES / "health" / "recorded_vllm_cpu_0_32_metrics.txt"),
        "vllm spec decode (recorded, ngram)": {n for n in sample_names(
            FIXTURES / "health" / "recorded_vllm_cpu_0_32_ngram_metrics.txt") if SPEC_DECODE.match(n)},
        "health textfile": health_textfile_names(tmp_path_factory.mktemp("textfiles")),
        "guard textfile": guard_textfile_names(),
        "node exporter": {line for line in node_list.read_text().splitlines() if line and not line.startswith("#")},
        "router": sample_names(FIXTURES / "monitoring" / "recorded_vllm_router_0_1_17_metrics.txt"),
        "prometheus": set(PROMETHEUS_SERIES),
    }


def unknown_metrics(board: dict, known: dict[str, set[str]]) -> list[str]:
    """'panel: name' for every metric a panel or variable queries that no source in `known` exports."""
    everything = set().union(*known.values())
    found = []
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found += [f"variable {variable['name']}: {name}"
                      for name in promql.variable_query_metric_names(variable["definition"]) if name not in everything]
    for panel in panels(board):
        for target in panel.get("targets", []):
            found += [f"{panel['title']}: {name}"
                      for name in promql.metric_names(target["expr"]) if name not in everything]
    return found


def panels(board: dict) -> list[dict]:
    """Every panel that is not a row, rows' nested panels included."""
    out = []
    for panel in board["panels"]:
        out += panel.get("panels", []) if panel["type"] == "row" else [panel]
    return out


def boards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(dashboards.DASHBOARD_DIR.glob("*.json"))}


def used_names(board: dict) -> set[str]:
    return {name for panel in panels(board) for t in panel["targets"] for name in promql.metric_names(t["expr"])}


# ---------------------------------------------------------------------------------------------------------------
# The files
# ---------------------------------------------------------------------------------------------------------------

def test_the_committed_json_is_what_the_generator_writes():
    files = dashboards.rendered()
    assert {p.name for p in files} == set(boards()) == {"twinspark-pair.json", "twinspark-fleet.json"}
    assert dashboards.stale(files) == [], "run `python -m devtools.dashboards` in python_tools/ and commit the JSON"


def test_a_hand_edit_of_the_json_is_caught():
    pair_file = dashboards.DASHBOARD_DIR / "twinspark-pair.json"
    assert dashboards.stale({pair_file: pair_file.read_text().replace("Pair verdict", "Verdict")}) == [
        "roles/monitoring/files/dashboards/twinspark-pair.json"]
    assert dashboards.main(["--check"]) == 0


@pytest.mark.parametrize("name", ["twinspark-pair.json", "twinspark-fleet.json"])
def test_each_dashboard_is_importable_grafana_json(name):
    board = boards()[name]
    assert board["schemaVersion"] == dashboards.SCHEMA_VERSION == 42
    assert board["uid"] == name.removesuffix(".json") and board["title"] and board["id"] is None
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for label in ("pair", "node"):
        assert variables[label]["type"] == "query"
        assert promql.label_values_parts(variables[label]["definition"])[1] == label
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
            assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), panel["title"]


@pytest.mark.parametrize("name", ["twinspark-pair.json", "twinspark-fleet.json"])
def test_panel_ids_are_unique_and_panels_tile_the_grid(name):
    board = boards()[name]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), ids
    cells: dict[tuple[int, int], str] = {}
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("name", ["twinspark-pair.json", "twinspark-fleet.json"])
def test_every_panel_has_targets_each_with_an_expression(name):
    for panel in panels(boards()[name]):
        targets = panel.get("targets", [])
        assert targets, f"{panel['title']} has no target"
        assert all(isinstance(t.get("expr"), str) and t["expr"].strip() for t in targets), panel["title"]
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]


# ---------------------------------------------------------------------------------------------------------------
# The metric names
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["twinspark-pair.json", "twinspark-fleet.json"])
def test_every_metric_a_dashboard_queries_is_exported_by_the_pair(name, known):
    assert unknown_metrics(boards()[name], known) == []


def test_the_name_check_catches_a_misspelt_metric(known):
    board = boards()["twinspark-pair.json"]
    ttft = next(p for p in panels(board) if p["title"] == "Time to first token")
    ttft["targets"][0]["expr"] = ttft["targets"][0]["expr"].replace("time_to_first_token", "time_to_first_tokens")
    assert unknown_metrics(board, known) == ["Time to first token: vllm:time_to_first_tokens_seconds_bucket"]


def test_only_the_spec_decode_counters_come_from_the_drafting_engines_recording(known):
    drafting = known["vllm spec decode (recorded, ngram)"]
    used = set().union(*(used_names(b) for b in boards().values()))
    assert used & drafting == {"vllm:spec_decode_num_accepted_tokens_total",
                               "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_drafts_total"}
    assert not drafting & known["vllm"], "a name the plain engine's recording has needs no second source"


def test_the_pair_overview_shows_what_issue_30_asks_for():
    used = used_names(boards()["twinspark-pair.json"])
    wanted = {
        "requests": {"vllm:num_requests_running", "vllm:num_requests_waiting"},
        "tokens/s": {"vllm:prompt_tokens_total", "vllm:generation_tokens_total"},
        "latency histograms": {"vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                               "vllm:e2e_request_latency_seconds_bucket"},
        "caches": {"vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"},
        "spec decode": {"vllm:spec_decode_num_accepted_tokens_total"},
        "guard": {"twinspark_guard_restarts_total", "twinspark_guard_decision", "twinspark_guard_paused",
                  "twinspark_guard_fabric_up"},
        "health": {"twinspark_health_status", "twinspark_health_check_status"},
        "nodes": {"node_cpu_seconds_total", "node_memory_MemAvailable_bytes", "node_filesystem_avail_bytes",
                  "node_network_receive_bytes_total", "node_network_up"},
    }
    assert {what: names - used for what, names in wanted.items() if names - used} == {}
    fabric = [t["expr"] for p in panels(boards()["twinspark-pair.json"]) for t in p["targets"]
              if 'device=~"$fabric"' in t["expr"]]
    assert len(fabric) >= 4, "the fabric netdevs' own panels read the fabric variable"


def test_the_fleet_view_shows_every_pair_and_the_router():
    used = used_names(boards()["twinspark-fleet.json"])
    assert {"twinspark_health_status", "vllm:generation_tokens_total", "vllm_router_requests_total",
            "vllm_router_generate_duration_seconds_bucket", "vllm_router_processed_requests_total"} <= used


def test_the_guard_writes_every_contract_name():
    assert GUARD_TEXTFILE_NAMES - guard_textfile_names() == set()


# ---------------------------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("expr", "names"), [
    ('histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{pair=~"$pair"}'
     "[$__rate_interval])))", ["vllm:e2e_request_latency_seconds_bucket"]),
    ('1 - avg by (node) (rate(node_cpu_seconds_total{mode="idle"}[5m] offset 1h30m))', ["node_cpu_seconds_total"]),
    ("a / on (node) group_left (device) b == bool 1", ["a", "b"]),
    ("sum(rate(x_total[1m])) without (instance) > 0 and up unless absent(y)", ["x_total", "up", "y"]),
    ('{__name__="named_by_matcher", job="node"} or vector(0)', ["named_by_matcher"]),
    ('count_values("rate", m) + time() - inf * NaN', ["m"]),
    ("topk(3, max_over_time(m[10m:1m]))", ["m"]),
    ('label_replace(q, "dst", "$1", "src", "(.*)")', ["q"]),
    ("twinspark_guard_decision == 1", ["twinspark_guard_decision"]),
])
def test_metric_names_tells_metrics_from_functions_labels_and_durations(expr, names):
    assert promql.metric_names(expr) == names


@pytest.mark.parametrize(("expr", "says"), [
    ("rates(x[1m])", "unknown function rates()"),
    ("sum(rate(x[1m])", "unclosed '('"),
    ("x{job=\"a\"]", "unbalanced ']'"),
    ("$metric > 0", "Grafana variable $metric"),
    ("x # y", "cannot read"),
])
def test_metric_names_refuses_what_it_cannot_classify(expr, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        promql.metric_names(expr)


def test_a_variable_query_is_read_as_label_values_only():
    assert promql.variable_query_metric_names('label_values(up{job="node", pair=~"$pair"}, node)') == ["up"]
    assert promql.label_values_parts("label_values(node_uname_info, nodename)") == ("node_uname_info", "nodename")
    with pytest.raises(ValueError, match="only label_values"):
        promql.variable_query_metric_names("query_result(up)")
