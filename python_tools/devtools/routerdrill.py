"""Loopback drills with the real vllm-router 0.1.17 and two handshaped pairs (devtools.handshaped_openai).

Everything listens on 127.0.0.1. `Drill` starts the key check (client and admin key), two backends (separate
processes, so a SIGKILL is a real one), the router through router_launch.py with the flags roles/router uses
(`ROUTER_FLAGS`) on a port of its own, and the front in front of it (router_launch.front_server, as roles/router
runs it): `base` is the front, where clients connect; `router_base` the router itself. Then:

  kill   a bounded client loop; at `kill_at` one backend gets SIGKILL, at `back_at` it is started again on the
         same port. Figures: failed/total, seconds from the kill until the router marks it unhealthy (eject), and
         from the restart until it is healthy again (rejoin), and whether it took traffic afterwards.
  drain  the same loop, but the backend is first taken out with the router's /remove_worker, then killed,
         restarted, and put back with /add_worker (which returns once the backend's /health answers): the path
         the fleet's restarts take. Expected: no failed request.

scripts/bench/router-failover (or `python -m devtools.routerdrill` in python_tools/) prints both drills' figures as
JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from twinspark.fleet import router_client, router_config, router_launch

HERE = Path(__file__).resolve().parent
# Started as a script, as roles/router runs it on the router node.
LAUNCHER = Path(router_launch.__file__).resolve()
KEY = "drill-test-only-key"
# The router's admin key (the front lets only it through to the admin paths), as the fleet's drain sends it.
ADMIN_KEY = "drill-test-only-admin-key"

# The flags roles/router renders (router_config.flags: policy, health checks, retries, circuit breaker).
ROUTER_FLAGS = router_config.flags()


def router_python() -> str | None:
    """An interpreter that can import vllm_router: $TWINSPARK_ROUTER_PYTHON, else this one, else the checkout's
    .venv (make setup installs it there); None when none can."""
    chosen = os.environ.get("TWINSPARK_ROUTER_PYTHON")
    if chosen:
        return chosen if shutil.which(chosen) or Path(chosen).is_file() else None
    if importlib.util.find_spec("vllm_router") is not None:
        return sys.executable
    venv = HERE.parents[1] / ".venv" / "bin" / "python"
    if venv.is_file():
        probe = subprocess.run([str(venv), "-c", "import vllm_router"], capture_output=True, timeout=60)
        if probe.returncode == 0:
            return str(venv)
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")


class Drill:
    def __init__(self, python: str, delay_s: float = 0.05, extra_flags: list[str] | None = None,
                 log_dir: Path | None = None, worker_key_file: Path | None = None) -> None:
        self.python = python
        self.worker_key_file = worker_key_file
        self.delay_s = delay_s
        self.ports = {"a": free_port(), "b": free_port()}
        self.router_port, self.metrics_port, self.keycheck_port = free_port(), free_port(), free_port()
        self.upstream_port = free_port()
        self.front = None
        self.extra_flags = extra_flags or []
        self.log_dir = log_dir
        self.backends: dict[str, subprocess.Popen] = {}
        self.router: subprocess.Popen | None = None
        self.keycheck = None

    @property
    def base(self) -> str:
        """The front: where clients connect."""
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def router_base(self) -> str:
        """vllm-router itself, behind the front."""
        return f"http://127.0.0.1:{self.upstream_port}"

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def _log(self, name: str):
        if self.log_dir is None:
            return subprocess.DEVNULL
        return open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child

    def start_backend(self, name: str) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "devtools.handshaped_openai", "--name", name, "--port", str(self.ports[name]),
             "--key", KEY, "--delay-s", str(self.delay_s)],
            stdout=subprocess.PIPE, stderr=self._log(f"backend-{name}"), text=True,
            env={**os.environ, "PYTHONPATH": str(HERE.parent)})
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            proc.kill()
            raise RuntimeError(f"backend {name}: did not start ({line!r})")
        self.backends[name] = proc

    def kill_backend(self, name: str) -> None:
        proc = self.backends.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def __enter__(self) -> Drill:
        self.keycheck = router_launch.keycheck_server(f"127.0.0.1:{self.keycheck_port}", [KEY, ADMIN_KEY])
        threading.Thread(target=self.keycheck.serve_forever, daemon=True).start()
        self.front = router_launch.front_server(f"127.0.0.1:{self.router_port}", f"127.0.0.1:{self.upstream_port}",
                                                [KEY], [ADMIN_KEY], upstream_timeout_s=150, upstream_retry_s=30)
        threading.Thread(target=self.front.serve_forever, daemon=True).start()
        for name in self.ports:
            self.start_backend(name)
        self.start_router()
        return self

    def start_router(self, wait: bool = True) -> None:
        """Start the router; with `wait`, until its /liveness answers (60 s at most)."""
        self.router = subprocess.Popen(
            [self.python, str(LAUNCHER), "serve", "--key-check-url", f"http://127.0.0.1:{self.keycheck_port}/",
             *(["--worker-key-file", str(self.worker_key_file)] if self.worker_key_file else []),
             "--", "--host", "127.0.0.1", "--port", str(self.upstream_port),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
             "--worker-urls", self.url("a"), self.url("b"), *ROUTER_FLAGS, *self.extra_flags],
            stdout=self._log("router"), stderr=subprocess.STDOUT)
        if wait:
            _wait(lambda: router_client.request(self.base, "/liveness", KEY, timeout_s=1)[0] == 200, 60, "router ready")

    def restart_router(self) -> tuple[float, float]:
        """SIGTERM the router (its graceful stop), start it again: (seconds to stop, seconds to answer again)."""
        assert self.router is not None
        started = time.monotonic()
        self.router.terminate()
        self.router.wait(timeout=30)
        stopped = time.monotonic()
        self.start_router()
        return stopped - started, time.monotonic() - stopped

    def __exit__(self, *_exc) -> None:
        if self.router is not None and self.router.poll() is None:
            self.router.terminate()
            try:
                self.router.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.router.kill()
                self.router.wait(timeout=10)
        for name in list(self.backends):
            self.kill_backend(name)
        for server in (self.front, self.keycheck):
            if server is not None:
                server.shutdown()
                server.server_close()

    def health(self) -> dict[str, bool]:
        status, text = router_client.request(f"http://127.0.0.1:{self.metrics_port}", "/metrics", None, timeout_s=2)
        return router_client.worker_health(text) if status == 200 else {}

    def served_by(self, name: str) -> float:
        """The router's processed-request count for one backend (its Prometheus counter)."""
        _, text = router_client.request(f"http://127.0.0.1:{self.metrics_port}", "/metrics", None, timeout_s=2)
        return router_client.processed(text, self.url(name))

    def run_restart(self, total: int = 300, concurrency: int = 2, restart_at: int = 60,
                    client_timeout_s: float = 10) -> dict:
        """The router itself restarted (what a key or pair-list change costs) under a client loop; its figures."""
        done = {"n": 0}
        lock = threading.Lock()
        took: dict[str, float] = {}

        def restart() -> None:
            took["stop_s"], took["start_s"] = self.restart_router()
            took["restart_s"] = took["stop_s"] + took["start_s"]

        def on_done(_outcome: router_client.Outcome) -> None:
            with lock:
                done["n"] += 1
                n = done["n"]
            if n == restart_at:
                threading.Thread(target=restart).start()

        outcomes = router_client.client_loop(self.base, KEY, total, concurrency, on_done, timeout_s=client_timeout_s)
        _wait(lambda: "restart_s" in took, 60, "router restarted")
        figures = router_client.summarise(outcomes)
        # a refused connection fails at once, so a fast loop's failed count says little: the window is the figure
        figures.pop("failed_indices")
        figures.update({"mode": "restart", "concurrency": concurrency, "stop_s": round(took["stop_s"], 2),
                        "start_s": round(took["start_s"], 2), "no_router_s": round(took["restart_s"], 2)})
        return figures

    def run(self, mode: str, total: int = 300, concurrency: int = 2, kill_at: int = 60, back_at: int = 180,
            victim: str = "a") -> dict:
        """One drill (`kill` or `drain`) under a client loop; its figures."""
        samples: list[tuple[float, bool]] = []
        marks: dict[str, float] = {}
        stop = threading.Event()
        done = {"n": 0}
        lock = threading.Lock()
        actions: list[str] = []

        def sampler() -> None:
            while not stop.is_set():
                verdict = self.health().get(self.url(victim))
                if verdict is not None:
                    samples.append((time.monotonic(), verdict))
                time.sleep(0.1)

        def act(step: str) -> None:
            try:
                if step == "out":
                    if mode == "drain":
                        status, _ = router_client.request(self.base, f"/remove_worker?url={self.url(victim)}",
                                                          ADMIN_KEY, "POST")
                        actions.append(f"remove_worker {status}")
                        # the requests already sent to the victim finish before it is touched
                        time.sleep(2 * self.delay_s + 0.2)
                    marks["kill"] = time.monotonic()
                    self.kill_backend(victim)
                else:
                    if mode == "kill":
                        # bring it back only once the router has ejected it (bounded): on a loaded machine the
                        # loop can reach back_at before the health checker's second failed check
                        deadline = time.monotonic() + 30
                        while (time.monotonic() < deadline
                               and router_client.first_time(samples, False, marks.get("kill", float("inf"))) is None):
                            time.sleep(0.1)
                    self.start_backend(victim)
                    marks["back"] = time.monotonic()
                    marks["served_at_back"] = self.served_by(victim)
                    if mode == "drain":
                        status, _ = router_client.request(self.base, f"/add_worker?url={self.url(victim)}",
                                                          ADMIN_KEY, "POST", timeout_s=130)
                        actions.append(f"add_worker {status}")
            except Exception as error:  # noqa: BLE001 - reported in the figures, never hidden
                actions.append(f"{step} failed: {error}")

        def on_done(_outcome: router_client.Outcome) -> None:
            with lock:
                done["n"] += 1
                n = done["n"]
            if n == kill_at:
                threading.Thread(target=act, args=("out",)).start()
            elif n == back_at:
                threading.Thread(target=act, args=("back",)).start()

        watcher = threading.Thread(target=sampler, daemon=True)
        watcher.start()
        started = time.monotonic()
        outcomes = router_client.client_loop(self.base, KEY, total, concurrency, on_done)
        elapsed = time.monotonic() - started
        _wait(lambda: "back" in marks, 30, "victim restarted")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and router_client.first_time(samples, True, marks["back"]) is None:
            time.sleep(0.1)
        # after the rejoin, some traffic must reach the victim again
        after = router_client.client_loop(self.base, KEY, 20, concurrency)
        stop.set()
        watcher.join(timeout=5)
        eject = router_client.first_time(samples, False, marks.get("kill", float("inf")))
        rejoin = router_client.first_time(samples, True, marks["back"])
        figures = router_client.summarise(outcomes)
        figures.update({
            "mode": mode, "concurrency": concurrency, "loop_s": round(elapsed, 2), "actions": actions,
            "eject_s": None if eject is None else round(eject - marks["kill"], 2),
            "rejoin_s": None if rejoin is None else round(rejoin - marks["back"], 2),
            "after_rejoin_failed": router_client.summarise(after)["failed"],
            "victim_served_after_back": self.served_by(victim) - marks["served_at_back"],
        })
        return figures


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--delay-s", type=float, default=0.05, help="each backend's time per request")
    parser.add_argument("--mode", choices=("kill", "drain", "restart", "both"), default="both",
                        help="both: kill then drain; restart: the router itself restarted mid-loop")
    parser.add_argument("--log-dir", type=Path)
    parser.add_argument("--disable-retries", action="store_true",
                        help="run the router without retries, to see what they save")
    opts = parser.parse_args(argv)
    python = router_python()
    if python is None:
        print("router-failover: vllm_router is not importable; pip install vllm-router==0.1.17 "
              "(make setup does) or set TWINSPARK_ROUTER_PYTHON", file=sys.stderr)
        return 2
    modes = ["kill", "drain"] if opts.mode == "both" else [opts.mode]
    worst = 0
    for mode in modes:
        extra = ["--disable-retries"] if opts.disable_retries else []
        with Drill(python, opts.delay_s, extra_flags=extra, log_dir=opts.log_dir) as drill:
            if mode == "restart":
                figures = drill.run_restart(opts.total, opts.concurrency, restart_at=opts.total // 5)
            else:
                figures = drill.run(mode, opts.total, opts.concurrency,
                                    kill_at=opts.total // 5, back_at=(opts.total * 3) // 5)
        print(json.dumps({**figures, "retries": not opts.disable_retries}), flush=True)
        worst = max(worst, 1 if figures["failed"] and mode == "drain" else 0)
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
