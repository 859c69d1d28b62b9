"""scripts/sim/monitor-check (devtools.monitorcheck) against a handshaped Prometheus on loopback.

The handshaped server speaks the two API paths monitor-check uses: /api/v1/query answers one series when every metric
the expression names is in its `present` set (none otherwise), /api/v1/series answers the targets' label sets of two
pairs. It records every expression it was asked, so the tests see what Grafana's variables became.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from devtools import dashboards, monitorcheck, promql

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "sim" / "monitor-check"
# node exporter's `up` series as the scrape config labels them: two pairs, one with a dot in its id.
TARGETS = [{"__name__": "up", "job": "node", "pair": pair, "node": node, "rank_role": role}
           for pair, node, role in (("pair_a", "node1", "head"), ("pair_a", "node2", "worker"),
                                    ("pair.b", "node3", "head"))]
ROUTER_ROW = "Router (the fleet's vllm-router)"
SPEC_PANEL = "Speculative decoding acceptance"


def every_name() -> set[str]:
    names = set()
    for path in dashboards.DASHBOARD_DIR.glob("*.json"):
        for target in monitorcheck.targets(json.loads(path.read_text())):
            names.update(promql.metric_names(target.expr))
    return names


class HandshapedPrometheus(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, present: set[str], refused: str | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.present = present
        self.refused = refused  # a metric name whose queries are answered 400 bad_data
        self.queries: list[str] = []
        self.series: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: HandshapedPrometheus

    def log_message(self, *_args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlsplit(self.path)
        params = parse_qs(url.query)
        if url.path == "/api/v1/query":
            expr = params["query"][0]
            self.server.queries.append(expr)
            names = promql.metric_names(expr)
            if self.server.refused in names:
                return self._answer(400, {"status": "error", "errorType": "bad_data", "error": "parse error"})
            result = [{"metric": {}, "value": [0, "1"]}] if set(names) <= self.server.present else []
            return self._answer(200, {"status": "success", "data": {"resultType": "vector", "result": result}})
        if url.path == "/api/v1/series":
            selector = params["match[]"][0]
            self.server.series.append(selector)
            found = TARGETS if set(promql.metric_names(selector)) <= self.server.present else []
            return self._answer(200, {"status": "success", "data": found})
        return self._answer(404, {"status": "error", "errorType": "not_found", "error": self.path})

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def prometheus():
    servers = []

    def start(present: set[str], refused: str | None = None) -> HandshapedPrometheus:
        server = HandshapedPrometheus(present, refused)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def run(server: HandshapedPrometheus, *args: str) -> int:
    return monitorcheck.main(["--prometheus", server.url, "--timeout", "5", *args])


def panel_count() -> int:
    boards = [json.loads(p.read_text()) for p in dashboards.DASHBOARD_DIR.glob("*.json")]
    return len({(b["title"], t.row, t.panel) for b in boards for t in monitorcheck.targets(b)})


# ---------------------------------------------------------------------------------------------------------------
# Against the handshaped Prometheus
# ---------------------------------------------------------------------------------------------------------------

def test_every_panel_with_data_exits_0_with_the_summary(prometheus, capsys):
    server = prometheus(every_name())
    assert run(server) == 0
    out = capsys.readouterr().out.strip().splitlines()
    total = panel_count()
    assert out == [f"monitor-check: {total} panels checked, {total} with data, 0 without"]
    assert total > 40


def test_the_variables_become_what_grafana_would_send(prometheus, capsys):
    server = prometheus(every_name())
    assert run(server) == 0
    # every value Prometheus knows, as one escaped regular expression; the node variable reads the pair's value
    assert 'up{job="node", pair=~"pair\\\\.b|pair_a"}' in server.series
    ttft = [q for q in server.queries if "time_to_first_token" in q and q.startswith("histogram_quantile(0.99")]
    assert ttft[0] == ('histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket'
                       '{pair=~"pair\\\\.b|pair_a"}[1m])))')
    assert any('node=~"node1|node2|node3"' in q for q in server.queries)
    assert any(f'device=~"{dashboards.FABRIC_DEVICES}"' in q for q in server.queries)
    assert not [q for q in server.queries if "$" in q or "[[" in q]


def test_var_and_rate_interval_choose_the_values(prometheus, capsys):
    server = prometheus(every_name())
    assert run(server, "--var", "pair=pair_a", "--var", "node=node1", "--rate-interval", "2m") == 0
    assert all('pair=~"pair_a"' in q for q in server.queries if "vllm:" in q)
    assert any('node=~"node1"' in q and "[2m]" in q for q in server.queries)


def test_a_panel_without_series_is_named_and_exits_1(prometheus, capsys):
    server = prometheus(every_name() - {"twinspark_guard_fabric_up", "node_network_speed_bytes"})
    assert run(server) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    total = panel_count()
    assert lines[-1] == f"monitor-check: {total} panels checked, {total - 2} with data, 2 without"
    assert lines[0].startswith("NO DATA       TwinSpark pair / Fabric (guard's probe): target A ({{node}}) returned "
                               "no series: twinspark_guard_fabric_up{")
    assert lines[1].startswith("NO DATA       TwinSpark pair / Fabric speed: target A")
    assert len(lines) == 3


def test_one_empty_target_is_enough_to_fail_its_panel(prometheus, capsys):
    server = prometheus(every_name() - {"vllm:num_requests_waiting_by_reason"})
    assert run(server, "--dashboard", str(dashboards.DASHBOARD_DIR / "twinspark-pair.json")) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == [
        "NO DATA       TwinSpark pair / Requests running and waiting"]
    assert "target C (waiting: {{reason}})" in lines[0]


def test_skip_leaves_out_a_row_or_a_panel_and_says_how_many(prometheus, capsys):
    router = {n for n in every_name() if n.startswith("vllm_router_")}
    spec = {n for n in every_name() if n.startswith("vllm:spec_decode_")}
    server = prometheus(every_name() - router - spec)
    assert run(server, "--skip", ROUTER_ROW, "--skip", SPEC_PANEL) == 0
    total = panel_count()
    assert capsys.readouterr().out.strip() == (f"monitor-check: {total - 8} panels checked, {total - 8} with data, "
                                               "0 without; 8 skipped")
    assert not [q for q in server.queries if "vllm_router_" in q or "spec_decode" in q]


def test_a_query_prometheus_refuses_is_reported_as_failed(prometheus, capsys):
    server = prometheus(every_name(), refused="vllm:kv_cache_usage_perc")
    assert run(server, "--json") == 1
    report = json.loads(capsys.readouterr().out)
    failed = [p for p in report["panels"] if p["status"] == "failed"]
    assert {p["panel"] for p in failed} == {"KV cache in use", "KV cache usage", "KV cache usage per pair"}
    assert "HTTP 400: bad_data: parse error" in failed[0]["detail"]
    assert report["without"] == 3 and report["with_data"] == report["checked"] - 3 and report["skipped"] == 0


def test_a_variable_without_values_fails_every_panel_of_its_dashboard(prometheus, capsys):
    server = prometheus(every_name() - {"up"})
    assert run(server, "--dashboard", str(dashboards.DASHBOARD_DIR / "twinspark-fleet.json")) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith('QUERY FAILED  TwinSpark fleet / Verdict per pair: variable pair: '
                               'label_values(up{job="node"}, pair) found no pair label')
    fleet_panels = len({t.panel for t in monitorcheck.targets(json.loads(
        (dashboards.DASHBOARD_DIR / "twinspark-fleet.json").read_text()))})
    assert lines[-1] == f"monitor-check: {fleet_panels} panels checked, 0 with data, {fleet_panels} without"
    assert server.queries == []


def test_the_script_runs_the_same_check(prometheus):
    server = prometheus(every_name() - {"vllm_router_active_workers"})
    done = subprocess.run([sys.executable, str(SCRIPT), "--prometheus", server.url, "--timeout", "5"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    assert "NO DATA       TwinSpark fleet / Active pairs in the router: target A (active)" in done.stdout


# ---------------------------------------------------------------------------------------------------------------
# Refusals: one line, exit 2, bounded
# ---------------------------------------------------------------------------------------------------------------

def test_a_closed_port_exits_2_in_one_line(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert monitorcheck.main(["--prometheus", f"http://127.0.0.1:{port}", "--timeout", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"monitor-check: Prometheus at http://127.0.0.1:{port} did not answer")


def test_a_silent_prometheus_is_bounded_by_the_timeout(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)  # accepts the connection in the kernel, never answers
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        assert monitorcheck.main(["--prometheus", url, "--timeout", "0.5"]) == 2
    assert "did not answer: no answer within the timeout" in capsys.readouterr().err


def test_a_simulated_address_whose_route_leaves_the_machine_is_refused_before_dialling(capsys):
    def blackhole(_host):
        return None, "RTNETLINK answers: Invalid argument"

    assert monitorcheck.main(["--prometheus", monitorcheck.DEFAULT_PROMETHEUS], lookup=blackhole) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refusing to dial 10.78.0.1" in err[0]


@pytest.mark.parametrize(("args", "says"), [
    (["--skip", "No such panel"], "--skip 'No such panel' names no panel and no row"),
    (["--var", "pair"], "--var must be NAME=VALUE (got 'pair')"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds (got 0)"),
    (["--dashboard", "/nonexistent/board.json"], "--dashboard /nonexistent/board.json: not a readable dashboard"),
])
def test_bad_arguments_exit_2_in_one_line_before_dialling(args, says, capsys):
    def never(_host):
        raise AssertionError("dialled despite bad arguments")

    assert monitorcheck.main(["--prometheus", monitorcheck.DEFAULT_PROMETHEUS, *args], lookup=never) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


# ---------------------------------------------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------------------------------------------

def test_substitute_knows_grafanas_three_forms_and_names_a_missing_value():
    values = {"pair": "pair_a", "node": "node1|node2", "__rate_interval": "1m"}
    assert monitorcheck.substitute('x{pair=~"$pair", node=~"${node}", p="[[pair]]"}[$__rate_interval]',
                                   values) == 'x{pair=~"pair_a", node=~"node1|node2", p="pair_a"}[1m]'
    assert monitorcheck.substitute('x{node=~"${node:regex}"}', values) == 'x{node=~"node1|node2"}'
    with pytest.raises(ValueError, match=r"no value for the variable \$fabric"):
        monitorcheck.substitute('x{device=~"$fabric"}', values)


def test_regex_of_escapes_for_a_promql_string():
    assert monitorcheck.regex_of(["spark-01.lab", "a|b", "plain"]) == "spark-01\\\\.lab|a\\\\|b|plain"


def test_series_count_reads_every_result_type():
    assert monitorcheck.series_count({"resultType": "vector", "result": [{}, {}]}) == 2
    assert monitorcheck.series_count({"resultType": "matrix", "result": []}) == 0
    assert monitorcheck.series_count({"resultType": "scalar", "result": [0, "1"]}) == 1


def test_report_lists_the_panels_without_data_then_the_summary():
    outcomes = [monitorcheck.PanelOutcome("B", "p1", monitorcheck.DATA),
                monitorcheck.PanelOutcome("B", "p2", monitorcheck.EMPTY, "target A returned no series: x"),
                monitorcheck.PanelOutcome("B", "p3", monitorcheck.FAILED, "target A: HTTP 400"),
                monitorcheck.PanelOutcome("B", "p4", monitorcheck.SKIPPED)]
    assert monitorcheck.report(outcomes).splitlines() == [
        "NO DATA       B / p2: target A returned no series: x",
        "QUERY FAILED  B / p3: target A: HTTP 400",
        "monitor-check: 3 panels checked, 1 with data, 2 without; 1 skipped",
    ]
