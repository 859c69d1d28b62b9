#!/usr/bin/env python3
"""A bounded client loop through the simulated fleet's router while one action runs against the fleet.

    fleet-drill.py --router URL --victim URL --action CMD [--act-at N] [--total N] [--concurrency N]

Short chats go through the router (--router, key from $TWINSPARK_API_KEY, never printed) at --concurrency in flight.
When --act-at answers have come back, --action runs (a shell command: SIGKILL a pair's head, a rolling restart).
The loop sends at least --total requests and goes on until the action has ended and the victim pair (--victim, its
head API as the router lists it) has come back into the router and served traffic again, bounded by --limit-s.
Meanwhile the router's own view is sampled once a second: /list_workers (through the router's front, with the router's
admin key from $TWINSPARK_ROUTER_ADMIN_KEY, never printed: the front refuses the clients' key there) and its
Prometheus text on the router node's loopback (vllm_router_worker_health, vllm_router_processed_requests_total; read
with --metrics-cmd, a command printing that text).

Prints one JSON line: total, ok, failed, statuses, the failed requests' times relative to the action, when the victim
left and came back (seconds after the action started), requests the victim served after it came back, and the
action's exit code and duration. Exit 0 when the action succeeded and the victim came back and served; 1 otherwise
(the JSON says which); 2 on bad arguments. Whether the failed count is acceptable is for the caller to judge
(scripts/sim/fleet-check).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python_tools"))

from twinspark.fleet import router_client  # noqa: E402


def listed(list_workers_body: str, worker: str) -> bool | None:
    """Whether /list_workers names the worker; None when the body is not the router's list."""
    try:
        urls = json.loads(list_workers_body).get("urls")
    except (ValueError, AttributeError):
        return None
    return worker in urls if isinstance(urls, list) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--router", required=True)
    parser.add_argument("--victim", required=True, help="the victim pair's head API as the router lists it")
    parser.add_argument("--action", required=True, help="shell command run once --act-at answers are in")
    parser.add_argument("--metrics-cmd", required=True, help="shell command printing the router's Prometheus text")
    parser.add_argument("--admin-url", required=True,
                        help="the router front's admin listener (https), where /list_workers takes the admin key")
    parser.add_argument("--ca", required=True, help="the router's certificate, the admin listener's trust anchor")
    parser.add_argument("--act-at", type=int, default=40)
    parser.add_argument("--total", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--limit-s", type=float, default=900.0, help="bound on the whole drill")
    parser.add_argument("--request-timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.total < args.act_at or args.concurrency < 1:
        parser.error("--total must be at least --act-at, --concurrency at least 1")
    key = os.environ.get("TWINSPARK_API_KEY", "")
    if not key:
        parser.error("TWINSPARK_API_KEY is empty: export the fleet's API key (it is never printed)")
    admin_key = os.environ.get("TWINSPARK_ROUTER_ADMIN_KEY", "")
    if not admin_key:
        parser.error("TWINSPARK_ROUTER_ADMIN_KEY is empty: export the router's admin key, which /list_workers needs "
                     "(it is never printed)")

    lock = threading.Lock()
    stop = threading.Event()
    outcomes: list[router_client.Outcome] = []
    marks: dict[str, float] = {}
    action: dict[str, object] = {}
    # (time, victim in the list and healthy, victim's processed count)
    samples: list[tuple[float, bool, float]] = []
    counter = {"next": 0, "done": 0}
    started = time.monotonic()

    def run_action() -> None:
        marks["action"] = time.monotonic()
        try:
            done = subprocess.run(args.action, shell=True, timeout=args.limit_s, capture_output=True, text=True)
            action["rc"] = done.returncode
            action["tail"] = (done.stdout + done.stderr)[-600:]
        except subprocess.TimeoutExpired:
            action["rc"] = "timeout"
        action["seconds"] = round(time.monotonic() - marks["action"], 1)
        marks["action_end"] = time.monotonic()

    def sample() -> None:
        while not stop.is_set():
            status, body = router_client.request(args.admin_url, "/list_workers", admin_key, timeout_s=5, ca=args.ca)
            in_list = listed(body, args.victim) if status == 200 else None
            try:
                text = subprocess.run(args.metrics_cmd, shell=True, timeout=10, capture_output=True,
                                      text=True).stdout
            except subprocess.TimeoutExpired:
                text = ""
            healthy = router_client.worker_health(text).get(args.victim)
            served = router_client.processed(text, args.victim)
            samples.append((time.monotonic(), bool(in_list) and healthy is True, served))
            stop.wait(1.0)

    def back_and_serving() -> bool:
        """The victim left after the action started, came back, and its processed count rose since."""
        if "action" not in marks:
            return False
        after = [s for s in samples if s[0] >= marks["action"]]
        out = next((i for i, s in enumerate(after) if not s[1]), None)
        if out is None:
            return False
        back = next((s for s in after[out:] if s[1]), None)
        return back is not None and after[-1][2] > back[2]

    def finished() -> bool:
        if time.monotonic() - started > args.limit_s:
            return True
        with lock:
            sent = counter["next"]
        return sent >= args.total and "action_end" in marks and back_and_serving()

    def client() -> None:
        while not finished():
            with lock:
                index = counter["next"]
                counter["next"] += 1
            t = time.monotonic()
            status, answer = router_client.chat_once(args.router, key, timeout_s=args.request_timeout_s)
            with lock:
                outcomes.append(router_client.Outcome(index, t, time.monotonic(), status, answer))
                counter["done"] += 1
                if counter["done"] == args.act_at:
                    threading.Thread(target=run_action, daemon=True).start()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    clients = [threading.Thread(target=client) for _ in range(args.concurrency)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    stop.set()
    sampler.join(timeout=15)

    t0 = marks.get("action", float("nan"))
    after = [s for s in samples if s[0] >= t0]
    out_at = next((s[0] for s in after if not s[1]), None)
    back = next((s for s in after if out_at is not None and s[0] > out_at and s[1]), None)
    figures = router_client.summarise(outcomes)
    failed = [o for o in outcomes if o.status != 200]
    figures.pop("failed_indices")
    figures.update({
        "failed_at_s": [round(o.started - t0, 1) for o in failed],
        "failed_answers": sorted({o.answer[:120] for o in failed}),
        "out_after_s": None if out_at is None else round(out_at - t0, 1),
        "back_after_s": None if back is None else round(back[0] - t0, 1),
        "victim_served_after_back": None if back is None or not samples else samples[-1][2] - back[2],
        "action_rc": action.get("rc"),
        "action_s": action.get("seconds"),
        "loop_s": round(time.monotonic() - started, 1),
        "concurrency": args.concurrency,
    })
    if action.get("rc") != 0:
        figures["action_tail"] = action.get("tail", "")
    print(json.dumps(figures), flush=True)
    ok = action.get("rc") == 0 and back_and_serving()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
