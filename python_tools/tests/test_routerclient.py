"""The pure parts of twinspark.routerclient and twinspark.routerlaunch (no router needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinspark import routerclient, routerlaunch

RECORDED_METRICS = """\
# TYPE vllm_router_worker_health gauge
vllm_router_worker_health{worker="http://127.0.0.1:41933"} 1
vllm_router_worker_health{worker="http://127.0.0.1:39155"} 0

# TYPE vllm_router_cb_state gauge
vllm_router_cb_state{worker="http://127.0.0.1:39155"} 0
"""


def test_worker_health_reads_the_routers_gauge():
    assert routerclient.worker_health(RECORDED_METRICS) == {
        "http://127.0.0.1:41933": True, "http://127.0.0.1:39155": False}
    assert routerclient.worker_health("") == {}


def test_summarise_counts_every_non_200_as_failed():
    rows = [routerclient.Outcome(2, 0, 1, None, "ConnectionRefusedError"),
            routerclient.Outcome(0, 0, 1, 200, "hi"), routerclient.Outcome(1, 0, 1, 500, "x")]
    figures = routerclient.summarise(rows)
    assert figures["total"] == 3 and figures["ok"] == 1 and figures["failed"] == 2
    assert figures["failed_indices"] == [1, 2]
    assert figures["statuses"] == {"200": 1, "500": 1, "None": 1}


def test_first_time_finds_the_first_matching_verdict_after_a_mark():
    samples = [(1.0, True), (2.0, False), (3.0, True), (4.0, False)]
    assert routerclient.first_time(samples, False, 2.5) == 4.0
    assert routerclient.first_time(samples, True, 0) == 1.0
    assert routerclient.first_time(samples, True, 5) is None


@pytest.mark.parametrize(("header", "allowed"), [
    ("Bearer k1", True), ("Bearer k2", True), ("Bearer  k1 ", True), ("Bearer k3", False), ("k1", False),
    ("Basic k1", False), ("", False), (None, False), ("Bearer ", False)])
def test_key_allowed(header, allowed):
    assert routerlaunch.key_allowed(header, ["k1", "k2"]) is allowed


def test_read_keys_skips_comments_and_refuses_an_empty_file(tmp_path: Path):
    path = tmp_path / "router.key"
    path.write_text("# the fleet's key\nsecret-1\n\n")
    assert routerlaunch.read_keys(path) == ["secret-1"]
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        routerlaunch.read_keys(path)
    path.write_bytes(b"x" * (routerlaunch.MAX_KEY_BYTES + 1))
    with pytest.raises(ValueError, match="over"):
        routerlaunch.read_keys(path)


def test_serve_refuses_to_start_without_a_key_check_url(capsys):
    assert routerlaunch.main(["serve", "--", "--worker-urls", "http://127.0.0.1:9"]) == 2
    assert "--key-check-url" in capsys.readouterr().err


def test_processed_reads_one_workers_counter_and_zero_for_an_unknown_one():
    text = ('vllm_router_processed_requests_total{worker="http://10.0.0.1:8888"} 12\n'
            'vllm_router_processed_requests_total{worker="http://10.0.0.3:8888"} 7\n')
    assert routerclient.processed(text, "http://10.0.0.3:8888") == 7.0
    assert routerclient.processed(text, "http://10.0.0.1:8888") == 12.0
    assert routerclient.processed(text, "http://10.0.0.9:8888") == 0.0
