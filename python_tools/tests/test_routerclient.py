"""The pure parts of twinspark.fleet.router_client and twinspark.fleet.router_launch (no router needed)."""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from twinspark.fleet import router_client, router_launch

RECORDED_METRICS = """\
# TYPE vllm_router_worker_health gauge
vllm_router_worker_health{worker="http://127.0.0.1:41933"} 1
vllm_router_worker_health{worker="http://127.0.0.1:39155"} 0

# TYPE vllm_router_cb_state gauge
vllm_router_cb_state{worker="http://127.0.0.1:39155"} 0
"""


def test_worker_health_reads_the_routers_gauge():
    assert router_client.worker_health(RECORDED_METRICS) == {
        "http://127.0.0.1:41933": True, "http://127.0.0.1:39155": False}
    assert router_client.worker_health("") == {}


def test_summarise_counts_every_non_200_as_failed():
    rows = [router_client.Outcome(2, 0, 1, None, "ConnectionRefusedError"),
            router_client.Outcome(0, 0, 1, 200, "hi"), router_client.Outcome(1, 0, 1, 500, "x")]
    figures = router_client.summarise(rows)
    assert figures["total"] == 3 and figures["ok"] == 1 and figures["failed"] == 2
    assert figures["failed_indices"] == [1, 2]
    assert figures["statuses"] == {"200": 1, "500": 1, "None": 1}


def test_first_time_finds_the_first_matching_verdict_after_a_mark():
    samples = [(1.0, True), (2.0, False), (3.0, True), (4.0, False)]
    assert router_client.first_time(samples, False, 2.5) == 4.0
    assert router_client.first_time(samples, True, 0) == 1.0
    assert router_client.first_time(samples, True, 5) is None


@pytest.mark.parametrize(("header", "allowed"), [
    ("Bearer k1", True), ("Bearer k2", True), ("Bearer  k1 ", True), ("Bearer k3", False), ("k1", False),
    ("Basic k1", False), ("", False), (None, False), ("Bearer ", False)])
def test_key_allowed(header, allowed):
    assert router_launch.key_allowed(header, ["k1", "k2"]) is allowed


def test_read_keys_skips_comments_and_refuses_an_empty_file(tmp_path: Path):
    path = tmp_path / "router.key"
    path.write_text("# the fleet's key\nsecret-1\n\n")
    assert router_launch.read_keys(path) == ["secret-1"]
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        router_launch.read_keys(path)
    path.write_bytes(b"x" * (router_launch.MAX_KEY_BYTES + 1))
    with pytest.raises(ValueError, match="over"):
        router_launch.read_keys(path)


def test_serve_refuses_to_start_without_a_key_check_url(capsys):
    assert router_launch.main(["serve", "--", "--worker-urls", "http://127.0.0.1:9"]) == 2
    assert "--key-check-url" in capsys.readouterr().err


def test_processed_reads_one_workers_counter_and_zero_for_an_unknown_one():
    text = ('vllm_router_processed_requests_total{worker="http://10.0.0.1:8888"} 12\n'
            'vllm_router_processed_requests_total{worker="http://10.0.0.3:8888"} 7\n')
    assert router_client.processed(text, "http://10.0.0.3:8888") == 7.0
    assert router_client.processed(text, "http://10.0.0.1:8888") == 12.0
    assert router_client.processed(text, "http://10.0.0.9:8888") == 0.0


def test_the_key_goes_to_a_local_router_only_when_the_fronts_account_holds_it(monkeypatch):
    """The drain's admin key and the fleet client's key (issue 43, row 4): a router URL on this machine is asked only
    over a connection whose server end is the front's account's (where there is none: this process's own)."""
    heard: list[str] = []

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            heard.append(self.headers.get("Authorization") or "")
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert router_client.request(base, "/list_workers", "admin-key")[0] == 200  # ours: no front account here
        assert heard == ["Bearer admin-key"]
        monkeypatch.setattr(router_client.api, "account_uid", lambda name, missing: os.geteuid() + 4242)
        status, why = router_client.request(base, "/list_workers", "admin-key")
        assert status is None and "not the serving account" not in why and "nothing was sent" in why
        assert heard == ["Bearer admin-key"]  # the second request never reached the listener
    finally:
        server.shutdown()
        server.server_close()
