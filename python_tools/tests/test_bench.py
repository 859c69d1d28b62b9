"""`twinspark bench`: the figures' arithmetic on plain data, and a full sweep against a streaming stand-in API."""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from twinspark import bench, cli


def test_decode_rate_counts_tokens_after_the_first_over_the_time_after_the_first():
    result = bench.RequestResult(True, ttft_s=0.5, total_s=2.5, completion_tokens=41)
    assert result.decode_tok_s == pytest.approx(20.0)
    assert bench.RequestResult(True, ttft_s=0.5, total_s=0.5, completion_tokens=1).decode_tok_s is None
    assert bench.RequestResult(False, error="HTTP 500").decode_tok_s is None


def test_a_level_summary():
    results = [bench.RequestResult(True, 1.0, 3.0, 256, 41), bench.RequestResult(True, 2.0, 4.0, 258, 81),
               bench.RequestResult(False, error="HTTP 500: boom")]
    level = bench.summarise(3, results, wall_s=4.0)
    assert (level.requests, level.failed, level.completion_tokens) == (3, 1, 122)
    assert level.ttft_s_mean == 1.5 and level.ttft_s_max == 2.0
    assert level.decode_tok_s_per_stream_mean == pytest.approx(30.0)
    assert level.decode_tok_s_per_stream_min == pytest.approx(20.0)
    assert level.aggregate_tok_s == pytest.approx(30.5)
    assert level.prompt_tokens == 257
    assert level.errors == ["HTTP 500: boom"]


def test_sse_lines():
    assert bench.parse_sse_line('data: {"choices": []}') == {"choices": []}
    assert bench.parse_sse_line("data: [DONE]") is None
    assert bench.parse_sse_line(": keep-alive") is None
    assert bench.chunk_has_text({"choices": [{"delta": {"reasoning_content": "hm"}}]})
    assert not bench.chunk_has_text({"choices": [{"delta": {"role": "assistant"}}]})


def test_prompts_differ_per_request_and_scale_with_the_size():
    assert bench.make_prompt(256, 1) != bench.make_prompt(256, 2)
    assert len(bench.make_prompt(1024, 1).split()) > 3 * len(bench.make_prompt(256, 1).split())


def test_prompt_size_is_fitted_to_the_servers_tokenizer():
    def count(prompt: str) -> int:  # a tokenizer that splits every word in three, plus a 20-token template
        return 20 + 3 * len(prompt.split())

    fit = bench.fit_tokens(count)
    words = fit.words_for(300)
    assert abs(count(bench.make_prompt(words, 7)) - 300) <= 3


def test_published_figures_are_shown_for_gb10_only():
    levels = [bench.summarise(c, [bench.RequestResult(True, 0.1, 1.1, 10, 11)], 1.1) for c in (1, 6)]
    gb10 = bench.table(levels, "gb10")
    assert "decode per stream 62-83 tok/s" in gb10 and "aggregate 162-191 tok/s" in gb10
    assert "78.8 s" in gb10
    assert "published" not in bench.table(levels, "cpu")


@pytest.mark.parametrize("text", ["", "0,1", "a,b", "1,65"])
def test_bad_concurrency_lists_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--concurrency"):
        bench.parse_levels(text)


class StreamingApi(BaseHTTPRequestHandler):
    """A stand-in for vLLM's streaming chat API: one chunk per token, usage last, like vLLM sends."""

    protocol_version = "HTTP/1.1"
    fail_every = 0
    calls = 0
    bodies: list[dict] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        data = json.dumps({"data": [{"id": "tiny"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            data = json.dumps({"count": 10 + 2 * len(body["messages"][0]["content"].split())}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        type(self).calls += 1
        type(self).bodies.append(body)
        if self.fail_every and self.calls % self.fail_every == 0:
            self.send_response(500)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"error")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        chunks = [{"choices": [{"delta": {"role": "assistant"}}]}]
        chunks += [{"choices": [{"delta": {"content": f"t{i} "}}]} for i in range(body["max_tokens"])]
        chunks.append({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": body["max_tokens"]}})
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.001)
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


@pytest.fixture
def api():
    StreamingApi.calls = 0
    StreamingApi.fail_every = 0
    StreamingApi.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), StreamingApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_sweep_reports_every_level_as_json_with_progress_on_stderr(api, capsys):
    code = cli.main(["bench", "--url", api, "--concurrency", "1,3", "--max-tokens", "8", "--prompt-tokens", "32",
                     "--requests-per-stream", "2", "--json", "--profile", "cpu"])
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert code == 0
    assert data["model"] == "tiny" and data["published_gb10"] is None
    assert [(lvl["concurrency"], lvl["requests"], lvl["failed"]) for lvl in data["levels"]] == [(1, 2, 0), (3, 6, 0)]
    assert all(lvl["completion_tokens"] == 8 * lvl["requests"] for lvl in data["levels"])
    assert all(lvl["ttft_s_mean"] > 0 and lvl["aggregate_tok_s"] > 0 for lvl in data["levels"])
    assert "c=3: 6/6 requests done" in captured.err
    assert StreamingApi.calls == 8
    assert all(b["stream"] and b["ignore_eos"] and b["max_tokens"] == 8 for b in StreamingApi.bodies)
    assert len({b["messages"][0]["content"] for b in StreamingApi.bodies}) == 8, "no two prompts share a prefix"
    sizes = {10 + 2 * len(b["messages"][0]["content"].split()) for b in StreamingApi.bodies}
    assert all(abs(size - 32) <= 2 for size in sizes), "prompts sized with the server's /tokenize"


def test_failed_requests_are_counted_named_and_make_exit_1(api, capsys):
    StreamingApi.fail_every = 2
    code = cli.main(["bench", "--url", api, "--concurrency", "2", "--max-tokens", "4", "--profile", "gb10"])
    out = capsys.readouterr().out
    assert code == 1
    assert "c=2: HTTP 500" in out
    assert "published" in out


def test_nothing_serving_is_reported_without_a_traceback(capsys):
    code = cli.main(["bench", "--url", "http://127.0.0.1:9", "--concurrency", "1"])
    assert code == 1
    assert "cannot list models" in capsys.readouterr().err


# --- where it aims on an inventory (nothing is reached: the head's env files are stood in for) -----------------

REPO_ROOT = Path(__file__).resolve().parents[2]
FLEET_EXAMPLE = REPO_ROOT / "inventory" / "fleet-example" / "hosts.yml"
ONE_PAIR_EXAMPLE = REPO_ROOT / "inventory" / "example" / "hosts.yml"


@pytest.fixture
def head_envs(monkeypatch):
    """inventory.head_env stood in for: records the head asked for, answers a key and a served name."""
    from twinspark import inventory as inv

    asked = []

    def head_env(pair, timeout):
        asked.append(pair.head.name)
        return {"VLLM_API_KEY": "key-of-" + pair.head.name, "SERVED_MODEL_NAME": "served"}

    monkeypatch.setattr(inv, "head_env", head_env)
    return asked


def test_on_a_fleet_pair_benches_that_pairs_head_and_router_the_router(head_envs):
    url, key, served, _ = bench.from_inventory(str(FLEET_EXAMPLE), pair="pair_b")
    assert (url, key, served) == ("http://192.0.2.21:8888", "key-of-spark-b1", "served")
    url, key, served, ca = bench.from_inventory(str(FLEET_EXAMPLE), router=True)
    assert (url, key, served, ca) == ("http://192.0.2.30:30000", "key-of-spark-a1", "served", None)
    assert head_envs == ["spark-b1", "spark-a1"]


def test_a_fleet_without_pair_or_router_is_one_line_naming_both(head_envs, capsys):
    assert cli.main(["bench", "-i", str(FLEET_EXAMPLE)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"twinspark bench: inventory {FLEET_EXAMPLE}: is a fleet (pairs: pair_a, pair_b): pass --pair NAME to bench "
        "one pair's head, or --router to bench the fleet's router")
    assert cli.main(["bench", "-i", str(FLEET_EXAMPLE), "--pair", "pair_c"]) == 2
    assert "no well-formed pair 'pair_c' (pairs: pair_a, pair_b)" in capsys.readouterr().err
    assert head_envs == []


def test_a_one_pair_inventory_takes_its_own_name_and_refuses_others(head_envs, capsys):
    url, _, _, _ = bench.from_inventory(str(ONE_PAIR_EXAMPLE), pair="twinspark_pair")
    assert url == bench.from_inventory(str(ONE_PAIR_EXAMPLE))[0]
    assert cli.main(["bench", "-i", str(ONE_PAIR_EXAMPLE), "--pair", "pair_a"]) == 2
    assert "has one pair (twinspark_pair); --pair pair_a names none" in capsys.readouterr().err
    assert cli.main(["bench", "-i", str(ONE_PAIR_EXAMPLE), "--router"]) == 2
    assert "has one pair and no router" in capsys.readouterr().err


def test_url_and_pair_together_are_refused(capsys):
    assert cli.main(["bench", "--url", "http://127.0.0.1:9", "--pair", "pair_a"]) == 2
    assert capsys.readouterr().err.strip() == (
        "twinspark bench: --url and --pair both say where to aim; pass one")
