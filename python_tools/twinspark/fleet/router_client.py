"""A bounded client loop through the fleet's router, and the router's own view of its pairs.

Pure parts (`summarise`, `worker_health`, `first_time`) turn what was seen into figures; the I/O parts
(`chat_once`, `client_loop`, `admin`) speak HTTP to one URL and nothing else. Used by the loopback tests
(python_tools/tests/test_router_loopback.py) and scripts/bench/router-failover; aimed at a real router it is the
fleet's client-loop check (docs/FLEET.md).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from twinspark import api, layout

# The account the router's front runs as (roles/router/defaults/main.yml router_front_user; a test holds them equal).
FRONT_ACCOUNT = "twinspark-router-front"

# Every path vllm-router 0.1.17 serves (its src/server.rs build_app: protected, public, admin and worker routes), plus
# one it does not (handled by its transparent-proxy fallback): each must refuse a request without the fleet's key.
ROUTER_PATHS = [
    ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/generate"),
    ("POST", "/inference/v1/generate"), ("POST", "/rerank"), ("POST", "/v1/rerank"), ("POST", "/v1/responses"),
    ("POST", "/v1/embeddings"), ("GET", "/v1/responses/x"), ("POST", "/v1/responses/x/cancel"),
    ("DELETE", "/v1/responses/x"), ("GET", "/v1/responses/x/input"),
    ("GET", "/liveness"), ("GET", "/readiness"), ("GET", "/health"), ("GET", "/health_generate"),
    ("GET", "/v1/models"), ("GET", "/get_model_info"), ("GET", "/get_server_info"),
    ("POST", "/add_worker?url=http://127.0.0.1:9"), ("POST", "/remove_worker?url=http://127.0.0.1:9"),
    ("GET", "/list_workers"), ("POST", "/flush_cache"), ("GET", "/get_loads"), ("GET", "/scheduling/diagnostics"),
    ("POST", "/finish_session?session_id=s"), ("POST", "/workers"), ("GET", "/workers"), ("GET", "/workers/x"),
    ("DELETE", "/workers/x"), ("GET", "/metrics"), ("GET", "/no-such-path"),
]

# The admin paths among them, written out (not derived from router_launch.ADMIN_PATHS, so that a test can hold the
# front to them): every one that changes the router's workers or state, or tells which workers it has. The front
# lets only the admin key through to these.
ROUTER_ADMIN_PATHS = [
    ("POST", "/add_worker?url=http://127.0.0.1:9"), ("POST", "/remove_worker?url=http://127.0.0.1:9"),
    ("GET", "/list_workers"), ("POST", "/flush_cache"), ("GET", "/get_loads"), ("GET", "/scheduling/diagnostics"),
    ("POST", "/workers"), ("GET", "/workers"), ("GET", "/workers/x"), ("DELETE", "/workers/x"),
]

# Well-formed bodies, so that the refusal comes from the key check and not from the router's body parsing
# (a malformed body is answered 422 before the handler, and so before the key check, runs).
ROUTER_BODIES = {
    "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "tiny", "prompt": "hi"},
    "/generate": {"text": "hi"},
    "/inference/v1/generate": {"model": "tiny", "token_ids": [1, 2], "sampling_params": {}},
    "/rerank": {"query": "q", "documents": ["d"]},
    "/v1/rerank": {"query": "q", "documents": ["d"]},
    "/v1/responses": {"model": "tiny", "input": "hi"},
    "/v1/embeddings": {"model": "tiny", "input": "hi"},
    "/workers": {"url": "http://127.0.0.1:9"},
}

_HEALTH = re.compile(r'^vllm_router_worker_health\{worker="([^"]+)"\}\s+([0-9.eE+-]+)\s*$', re.M)


@dataclass(frozen=True)
class Outcome:
    index: int
    started: float
    ended: float
    status: int | None  # None: no HTTP answer at all (refused, reset, timed out)
    answer: str  # the reply's text, or the error


def summarise(outcomes: Iterable[Outcome]) -> dict:
    """total, ok, failed, the failed indices and the HTTP statuses seen, for a loop's outcomes."""
    rows = sorted(outcomes, key=lambda o: o.index)
    failed = [o for o in rows if o.status != 200]
    statuses: dict[str, int] = {}
    for o in rows:
        statuses[str(o.status)] = statuses.get(str(o.status), 0) + 1
    return {"total": len(rows), "ok": len(rows) - len(failed), "failed": len(failed),
            "failed_indices": [o.index for o in failed], "statuses": statuses}


def worker_health(metrics_text: str) -> dict[str, bool]:
    """The router's health verdict per worker URL, from its Prometheus text (vllm_router_worker_health)."""
    return {url: float(value) >= 1 for url, value in _HEALTH.findall(metrics_text)}


def processed(metrics_text: str, worker: str) -> float:
    """The router's processed-request count for one worker URL, from its Prometheus text (0 when it has none yet)."""
    prefix = f'vllm_router_processed_requests_total{{worker="{worker}"}}'
    return sum(float(line.split()[-1]) for line in metrics_text.splitlines() if line.startswith(prefix))


def listed_from_answer(status: int | None, body: str) -> tuple[str, ...] | None:
    """The router's /list_workers answer ({"urls": [...]}) -> the URLs; None when it is not a list of URLs."""
    if status != 200:
        return None
    try:
        urls = json.loads(body).get("urls")
    except (ValueError, AttributeError):
        return None
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        return None
    return tuple(urls)


def first_time(samples: Iterable[tuple[float, bool]], want: bool, after: float) -> float | None:
    """The first sample time at or after `after` whose verdict is `want`; None when none is."""
    for at, verdict in samples:
        if at >= after and verdict is want:
            return at
    return None


# What to do when the router's admin listener does not verify against the certificate kept here (roles/router made
# it on the router host; site.yml's router play fetches it to the controller and copies it to every head).
def router_tls_fix() -> str:
    return ("run site.yml's router play again: it copies the router's current certificate to the controller "
            f"(twinspark_router_ca_file) and to every head ({layout.defaults()['router_drain_ca']})")


def _request(url: str, key: str | None, body: bytes | None, method: str, timeout_s: float,
             ca: str | None = None) -> tuple[int | None, str]:
    """One request through the project's one API client (twinspark.api): (status, body), or (None, why). An https
    URL is verified against `ca` alone (the router's certificate: its admin listener)."""
    headers = {"Content-Type": "application/json", **api.auth_headers(key)}
    # A router on this machine is its front's (roles/router: router_front_user): a key goes to a local listener only
    # when that account holds it, checked on the very connection (api.listener_problem). Where there is no such
    # account (a drill or a bench that runs the front itself), only to a listener of this process's own account.
    with api.session(ca=ca, owner_uid=api.account_uid(FRONT_ACCOUNT, missing=os.geteuid())) as http:
        result, response = api.request(http, method, url, timeout_s, tls_fix=router_tls_fix(), data=body,
                                       headers=headers)
        if response is None:
            return None, str(result["error"])
        text = response.text
    return response.status_code, text if response.status_code < 400 else text[:200]


def chat_once(base: str, key: str | None, model: str = "tiny", timeout_s: float = 30.0) -> tuple[int | None, str]:
    """One short chat through `base`; (status, the answer's text or the error body)."""
    body = json.dumps({"model": model, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "Say hi."}]}).encode()
    status, text = _request(f"{base}/v1/chat/completions", key, body, "POST", timeout_s)
    if status == 200:
        try:
            text = json.loads(text)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return None, "200 without a chat answer"
    return status, text


def request(base: str, path: str, key: str | None, method: str = "GET", timeout_s: float = 10.0,
            body: dict | None = None, ca: str | None = None) -> tuple[int | None, str]:
    """Any path on the router (admin paths included), with or without the key; POST sends `body` ({} if none).
    `ca`: the router's certificate, for its admin listener (https)."""
    raw = json.dumps(body or {}).encode() if method == "POST" else None
    return _request(f"{base}{path}", key, raw, method, timeout_s, ca)


def client_loop(base: str, key: str, total: int, concurrency: int,
                on_done: Callable[[Outcome], None] | None = None, model: str = "tiny",
                timeout_s: float = 30.0) -> list[Outcome]:
    """`total` short chats at `concurrency` in flight; every outcome, in index order."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def one(index: int) -> None:
        started = time.monotonic()
        status, answer = chat_once(base, key, model, timeout_s)
        outcome = Outcome(index, started, time.monotonic(), status, answer)
        with lock:
            outcomes.append(outcome)
        if on_done is not None:
            on_done(outcome)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(total)))
    return sorted(outcomes, key=lambda o: o.index)


def refusals(base: str, key: str | None) -> list[tuple[str, str, int | None]]:
    """(method, path, status) for every router path asked with `key` (None: no key at all, the point of it)."""
    return [(method, path, request(base, path, key, method, body=ROUTER_BODIES.get(path.split("?")[0]))[0])
            for method, path in ROUTER_PATHS]
