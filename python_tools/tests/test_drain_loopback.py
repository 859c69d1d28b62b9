"""Drain before touch on loopback: the real vllm-router 0.1.17, two handshaped pairs, a client loop through the
router, and `twinspark.fleet.drain.drained` around a restart of one pair (its backend process stopped and started
again).

Skipped, with the reason, where vllm_router is not importable. Assertions are about behaviour (failed requests,
the router's worker list, who takes traffic); the figures are printed.
"""

from __future__ import annotations

import threading

import pytest

from devtools import routerdrill
from twinspark import api
from twinspark.fleet import drain, router_client

PYTHON = routerdrill.router_python()
pytestmark = pytest.mark.skipif(
    PYTHON is None, reason="vllm-router 0.1.17 is not installed here (make setup installs it; or set "
                           "TWINSPARK_ROUTER_PYTHON to an interpreter that has it)")


@pytest.fixture()
def drill():
    # 0.25 s per request, so that requests are usually in flight on the pair when it is taken out
    with routerdrill.Drill(PYTHON, delay_s=0.25) as running:
        yield running


def _listed(drill) -> str:
    status, text = router_client.request(drill.base, "/list_workers", routerdrill.ADMIN_KEY)
    assert status == 200
    return text


def _drained_restart(drill, victim: str, gave_up: bool, total: int = 120, at: int = 30):
    """A client loop; after `at` answers, `drained` takes the victim out, restarts it, and decides on putting it
    back. Returns (loop figures, what drained said, the victim's probe after the restart)."""
    # a router on loopback: its client URL is where the admin key goes (it never leaves the host)
    ref = drain.router_from_env({drain.ROUTER_URL_ENV: drill.base, drain.PAIR_URL_ENV: drill.url(victim)},
                                routerdrill.ADMIN_KEY)
    lines: list[str] = []
    seen_running: list[float] = []
    done = {"n": 0, "finished": threading.Event()}
    lock = threading.Lock()

    def read_metrics():
        metrics = api.read_metrics(drill.url(victim), 2)
        seen_running.append(float(metrics.get("running") or 0))
        return metrics

    def work() -> drain.WorkResult:
        drill.kill_backend(victim)
        drill.start_backend(victim)
        status, _ = router_client.chat_once(drill.url(victim), routerdrill.KEY)  # the pair's own generation probe
        return drain.WorkResult(served=status == 200, gave_up=gave_up)

    def act() -> None:
        try:
            _, said = drain.drained(drain.Router(ref), work, lambda _p, _m: None, read_metrics,
                                    idle_timeout_s=30, sleep=lambda _s: threading.Event().wait(0.05))
            lines.extend(said)
        finally:
            done["finished"].set()

    def on_done(_outcome) -> None:
        with lock:
            done["n"] += 1
            n = done["n"]
        if n == at:
            threading.Thread(target=act).start()

    outcomes = router_client.client_loop(drill.base, routerdrill.KEY, total, 2, on_done)
    assert done["finished"].wait(60), "the drained restart did not finish"
    return router_client.summarise(outcomes), lines, seen_running


@pytest.mark.slow(28)
def test_a_drained_restart_loses_no_request_and_the_pair_takes_traffic_again(drill):
    figures, lines, seen_running = _drained_restart(drill, "a", gave_up=False)
    before = drill.served_by("a")
    after = router_client.client_loop(drill.base, routerdrill.KEY, 40, 2)
    served_after = drill.served_by("a") - before
    print("drained restart:", {k: figures[k] for k in ("total", "ok", "failed", "statuses")},
          "metrics readings:", seen_running, "lines:", lines, "victim served after:", served_after)
    assert figures["failed"] == 0
    assert lines[0].endswith("remove_worker done")
    assert lines[1].startswith("the pair is idle")
    assert lines[-1].endswith("add_worker done")
    assert drill.url("a") in _listed(drill)
    assert router_client.summarise(after)["failed"] == 0
    assert served_after > 0


@pytest.mark.slow(28)
def test_a_pair_the_guard_gave_up_on_stays_out(drill):
    figures, lines, _ = _drained_restart(drill, "a", gave_up=True)
    before = drill.served_by("a")
    after = router_client.client_loop(drill.base, routerdrill.KEY, 40, 2)
    print("given up:", {k: figures[k] for k in ("total", "ok", "failed")}, "lines:", lines)
    assert figures["failed"] == 0
    assert "gave up" in lines[-1]
    assert drill.url("a") not in _listed(drill)
    assert drill.url("b") in _listed(drill)
    assert {o.answer for o in after} == {"hello from b"}
    assert drill.served_by("a") == before


def test_a_router_that_cannot_be_reached_does_not_block_the_work(drill):
    gone = f"http://127.0.0.1:{routerdrill.free_port()}"
    dead = drain.RouterRef(gone, drill.url("a"), routerdrill.ADMIN_KEY, admin_url=gone)
    worked = []
    result, lines = drain.drained(drain.Router(dead), lambda: worked.append(1) or drain.WorkResult(True),
                                  lambda _p, _m: None, lambda: {"running": 0.0, "waiting": 0.0})
    print("router down:", lines)
    assert worked == [1] and result.served
    assert "cannot be reached" in lines[0] and "going on" in lines[0]
    assert "cannot be reached" in lines[-1]


@pytest.mark.slow(12)
def test_a_pair_the_guard_gave_up_on_is_taken_out_again_after_a_router_restart(drill):
    """The router's list lives in memory: restarted, it lists every pair of --worker-urls again. The guard's next
    run (drain.keep_out, on each run while it has given up) takes the given-up pair out again, and only then."""
    said: list[tuple[int, str]] = []
    router = drain.Router(drain.RouterRef(drill.base, drill.url("a"), routerdrill.ADMIN_KEY, admin_url=drill.base))
    assert drain.keep_out(router, lambda p, m: said.append((p, m))) is True
    assert drill.url("a") not in _listed(drill)
    assert drain.keep_out(router, lambda p, m: said.append((p, m))) is False, "the real router's answer for a pair " \
                                                                             "it does not list is nothing to do"
    stop_s, start_s = drill.restart_router()
    assert drill.url("a") in _listed(drill), "a restarted router lists the given-up pair again"
    assert drain.keep_out(router, lambda p, m: said.append((p, m))) is True
    after = router_client.client_loop(drill.base, routerdrill.KEY, 40, 2)
    print(f"router restart: stopped in {stop_s:.1f} s, answering {start_s:.1f} s later; lines: {said}")
    assert drill.url("a") not in _listed(drill) and drill.url("b") in _listed(drill)
    assert router_client.summarise(after)["failed"] == 0
    assert {o.answer for o in after} == {"hello from b"}
    assert [p for p, _ in said] == [4, 7, 4]


def test_a_drain_with_the_clients_key_is_refused_and_takes_nothing_out(drill):
    """Why each head holds the router's admin key: the front refuses the pair's API key (the clients' key) on
    /remove_worker, and the drain says so in one line and goes on, the pair still listed."""
    router = drain.Router(drain.RouterRef(drill.base, drill.url("a"), routerdrill.KEY, admin_url=drill.base))
    out, line = router.call("remove")
    assert out is False
    assert "refused the key for remove_worker (403)" in line and "twinspark_router_admin_key" in line
    assert routerdrill.KEY not in line
    assert drill.url("a") in _listed(drill)
