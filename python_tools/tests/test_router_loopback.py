"""The real vllm-router 0.1.17 on 127.0.0.1 in front of two handshaped pairs (devtools.handshaped_openai), behind
its front (router_launch.py front), as roles/router runs them.

Skipped, with the reason, where vllm_router is not importable (make setup installs it from requirements-dev.txt).
Assertions are about behaviour (answers, refusals, who takes traffic), never about wall-clock thresholds.
"""

from __future__ import annotations

import pytest

from devtools import routerdrill
from twinspark.fleet import router_client

PYTHON = routerdrill.router_python()
pytestmark = pytest.mark.skipif(
    PYTHON is None, reason="vllm-router 0.1.17 is not installed here (make setup installs it; or set "
                           "TWINSPARK_ROUTER_PYTHON to an interpreter that has it)")

PATHS = router_client.ROUTER_PATHS
BODIES = router_client.ROUTER_BODIES


@pytest.fixture(scope="module")
def drill():
    with routerdrill.Drill(PYTHON, delay_s=0.02) as running:
        yield running


def test_a_chat_through_the_router_answers(drill):
    status, text = router_client.chat_once(drill.base, routerdrill.KEY)
    assert status == 200
    assert text.startswith("hello from ")


def test_both_pairs_take_traffic(drill):
    outcomes = router_client.client_loop(drill.base, routerdrill.KEY, 40, 2)
    answers = {o.answer for o in outcomes}
    assert router_client.summarise(outcomes)["failed"] == 0
    assert answers == {"hello from a", "hello from b"}


@pytest.mark.parametrize(("method", "path"), PATHS)
@pytest.mark.parametrize("key", [None, "wrong-key"], ids=["no-key", "wrong-key"])
def test_a_request_without_the_key_is_refused_on_every_path(drill, method, path, key):
    status, _ = router_client.request(drill.base, path, key, method, body=BODIES.get(path.split("?")[0]))
    assert status == 401


@pytest.mark.parametrize(("method", "path"), router_client.ROUTER_ADMIN_PATHS)
def test_the_clients_key_is_refused_on_every_admin_path(drill, method, path):
    """The reproduced attack: with the clients' key, POST /add_worker?url=<attacker> was answered "Successfully
    added worker" and other clients' prompts went there. Through the front it is a 403 on every admin path."""
    status, body = router_client.request(drill.base, path, routerdrill.KEY, method,
                                         body=BODIES.get(path.split("?")[0]))
    assert status == 403, body


def test_the_removed_worker_is_still_listed_after_refused_admin_calls(drill):
    # the refused /remove_worker and /add_worker above must not have changed anything
    status, text = router_client.request(drill.base, "/list_workers", routerdrill.ADMIN_KEY)
    assert status == 200
    assert set(router_client.listed_from_answer(status, text)) == {drill.url("a"), drill.url("b")}


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/list_workers"), ("GET", "/workers"), ("GET", "/get_loads"), ("POST", "/flush_cache"),
    ("POST", "/remove_worker?url=http://127.0.0.1:9")])
def test_the_admin_key_reaches_the_admin_paths(drill, method, path):
    status, body = router_client.request(drill.base, path, routerdrill.ADMIN_KEY, method)
    # the router's own answer (/flush_cache: a 500 when the handshaped pairs have no such path), never a refusal
    assert status not in (None, 401, 403, 502), body


@pytest.mark.parametrize(("method", "path"), PATHS)
def test_the_router_behind_the_front_still_checks_every_key_itself(drill, method, path):
    """Defence in depth: vllm-router's own key check (router_launch keycheck) refuses a request without a key on
    every path, should anything reach its loopback port around the front."""
    status, _ = router_client.request(drill.router_base, path, None, method, body=BODIES.get(path.split("?")[0]))
    assert status == 401


@pytest.mark.slow(5)
def test_a_killed_pair_is_ejected_and_rejoins(drill):
    figures = drill.run("kill", total=120, concurrency=2, kill_at=30, back_at=80)
    print("kill drill:", figures)
    # only requests in flight on the killed pair may fail (concurrency 2: at most 2)
    assert figures["failed"] <= 2
    assert figures["eject_s"] is not None
    assert figures["rejoin_s"] is not None
    assert figures["after_rejoin_failed"] == 0
    assert figures["victim_served_after_back"] > 0


@pytest.mark.slow(5)
def test_a_drained_pair_loses_no_request_and_comes_back(drill):
    figures = drill.run("drain", total=120, concurrency=2, kill_at=30, back_at=80)
    print("drain drill:", figures)
    assert figures["actions"] == ["remove_worker 200", "add_worker 200"]
    assert figures["failed"] == 0
    assert figures["victim_served_after_back"] > 0


@pytest.mark.slow(8)
def test_a_router_restart_behind_the_front_loses_no_request():
    """What `twinspark rotate api-key` costs a fleet's clients: vllm-router restarted (SIGTERM lets requests in flight
    finish) under a client loop through the front, which tries a refused connect again for --upstream-retry-s. Before
    the front retried, every request sent while no router listened (2.4-2.8 s) failed (docs/FLEET.md)."""
    with routerdrill.Drill(PYTHON, delay_s=0.02) as running:
        # A client waits as long as a real one would (60 s), not the bench's 10 s: on a loaded machine the new router
        # can take longer than 10 s to answer, and the front holds the request meanwhile.
        figures = running.run_restart(total=150, concurrency=2, restart_at=30, client_timeout_s=60)
    print("restart drill:", figures)
    assert figures["failed"] == 0
    assert figures["no_router_s"] > 0  # the router really was gone for a while


@pytest.mark.parametrize("worker_key", [False, True])
def test_tokenize_through_the_router_reaches_the_pair_with_the_key_only_with_a_worker_key_file(tmp_path, worker_key):
    """/tokenize is proxied by the router without the client's headers: the pair gets the router's own api_key.
    Without --worker-key-file the pair sees no key and refuses (what `twinspark bench` met through the router); with
    it, the pair answers."""
    key_file = tmp_path / "router.key"
    key_file.write_text(routerdrill.KEY + "\n")
    with routerdrill.Drill(PYTHON, delay_s=0.0, worker_key_file=key_file if worker_key else None) as running:
        status, body = router_client.request(running.base, "/tokenize", routerdrill.KEY, method="POST", timeout_s=10,
                                             body={"model": "tiny", "prompt": "one two three"})
    if worker_key:
        assert status == 200, body
        assert '"count": 3' in body
    else:
        assert status == 401, body


@pytest.mark.slow(6)
def test_a_router_started_with_every_pair_down_exits_and_one_pair_up_is_enough():
    """vllm-router 0.1.17 waits at start for its --worker-urls to become healthy (--worker-startup-timeout-secs,
    the pairs' first-boot budget in roles/router; 3 s here) without listening, then exits 1, so systemd
    (Restart=on-failure) starts it again. One healthy pair is enough for it to start and serve: a fleet with a pair
    down keeps its endpoint."""
    import time

    with routerdrill.Drill(PYTHON, delay_s=0.02, extra_flags=["--worker-startup-timeout-secs", "3"]) as drill:
        for name in ("a", "b"):
            drill.kill_backend(name)
        drill.router.terminate()
        drill.router.wait(timeout=30)
        started = time.monotonic()
        drill.start_router(wait=False)
        assert drill.router.wait(timeout=60) == 1
        waited = time.monotonic() - started
        assert router_client.request(drill.router_base, "/liveness", routerdrill.KEY, timeout_s=1)[0] is None
        drill.start_backend("b")
        drill.start_router()
        status, text = router_client.chat_once(drill.base, routerdrill.KEY)
        print(f"every pair down: the router exited 1 after {waited:.1f} s; with pair b up it serves")
        assert status == 200 and "hello from b" in text
