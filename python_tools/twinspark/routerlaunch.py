"""Start vllm-router 0.1.17 with client keys required, and the key check it asks.

Why this file exists (docs/FLEET.md, "API keys"): the router's own check of client keys (`authorize_request` in
the router's src/server.rs) only runs when it has a list of validation URLs, and the wheel's `vllm-router`
command never passes one (the Python `RouterArgs` has no such field; the pyo3 `Router` defaults it to empty), so
out of the box every path, the admin ones (/add_worker, /remove_worker, /workers) included, answers anyone.
The pyo3 `Router` does take `api_key_validation_urls`; this launcher passes it and leaves the rest of the command
line to the router's own parser, so every flag keeps the router's meaning.

Two commands, both standard library plus the installed `vllm_router` (this file is copied next to the router's
venv; it imports nothing from twinspark):

    routerlaunch.py keycheck --listen 127.0.0.1:30099 --key-file /etc/twinspark/router.key
        answers GET with 200 when `Authorization: Bearer <key>` matches a line of the key file, else 401.
    routerlaunch.py serve --key-check-url http://127.0.0.1:30099/ [--worker-key-file F] -- <vllm-router flags>
        runs the router with that URL as its only validation URL (refuses to start without one). With
        --worker-key-file, the file's first key is the router's `api_key`: the key the router itself sends to the
        pairs on the paths it proxies without the client's headers (/tokenize and the other catch-all paths); read
        from the file so that it never shows in the process list, as `--api-key` on the command line would.

The router caches each token's answer for its lifetime, good and bad alike, so a key change needs a router
restart (the role restarts it when the key file changes) and the keycheck service must be up before the router
takes traffic (the role orders the units).
"""

from __future__ import annotations

import argparse
import hmac
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MAX_KEY_BYTES = 4096


def read_keys(path: Path) -> list[str]:
    """The key file's keys, one a line, blank lines and # comments skipped; refuse an empty or oversized file."""
    raw = path.read_bytes()
    if len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"{path}: over {MAX_KEY_BYTES} bytes; it must hold only the router's API keys, one a line")
    keys = [line.strip() for line in raw.decode("utf-8").splitlines()
            if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise ValueError(f"{path}: holds no key; write the router's API key on a line of its own")
    return keys


def key_allowed(authorization: str | None, keys: list[str]) -> bool:
    """Whether an Authorization header carries one of the keys (compared in constant time, every key tried)."""
    if not authorization or not authorization.startswith("Bearer "):
        return False
    token = authorization[len("Bearer "):].strip().encode()
    allowed = False
    for key in keys:
        allowed |= hmac.compare_digest(token, key.encode())
    return allowed


def keycheck_server(listen: str, keys: list[str]) -> ThreadingHTTPServer:
    """A server answering 200 for a known key and 401 otherwise, on any GET path; not started."""
    host, _, port = listen.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args) -> None:  # never log a header that may hold a key
            pass

        def do_GET(self) -> None:
            status = 200 if key_allowed(self.headers.get("Authorization"), keys) else 401
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    server.daemon_threads = True
    return server


def router_kwargs(router_argv: list[str], key_check_urls: list[str], worker_key: str | None = None) -> dict:
    """The pyo3 Router's keyword arguments: the router's own CLI parse, plus the validation URLs and (when given)
    the key the router sends to the pairs itself."""
    if not key_check_urls:
        raise ValueError("--key-check-url: at least one is required; without it vllm-router checks no client key")
    # vllm_router: only in the router's own venv; the key check server here runs without it.
    from vllm_router.launch_router import parse_router_args
    from vllm_router.router import policy_from_str

    args = parse_router_args(router_argv)
    args._validate_router_args()
    kwargs = dict(vars(args))
    if kwargs.pop("mini_lb"):
        raise ValueError("--mini-lb: the Python MiniLB is for debugging and checks no key; leave it out")
    if kwargs["service_discovery"] or kwargs["vllm_pd_disaggregation"]:
        raise ValueError("--service-discovery / --vllm-pd-disaggregation: not used by TwinSpark; "
                         "list each pair's head in --worker-urls")
    kwargs["prefill_urls"] = None
    kwargs["decode_urls"] = None
    for name in ("policy", "prefill_policy", "decode_policy"):
        kwargs[name] = policy_from_str(kwargs[name])
    kwargs["api_key_validation_urls"] = list(key_check_urls)
    if worker_key is not None:
        if kwargs.get("api_key"):
            raise ValueError("--api-key: give the pairs' key with --worker-key-file, never on the command line")
        kwargs["api_key"] = worker_key
    return kwargs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="routerlaunch.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("keycheck", help="answer the router's key checks on loopback")
    check.add_argument("--listen", default="127.0.0.1:30099")
    check.add_argument("--key-file", type=Path, required=True)
    serve = sub.add_parser("serve", help="run vllm-router with client keys required; router flags after --")
    serve.add_argument("--key-check-url", action="append", default=[])
    serve.add_argument("--worker-key-file", type=Path,
                       help="the key the router sends to the pairs itself: this file's first key")
    serve.add_argument("router_args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    try:
        if opts.command == "keycheck":
            server = keycheck_server(opts.listen, read_keys(opts.key_file))
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            thread.join()
            return 0
        router_argv = opts.router_args[1:] if opts.router_args[:1] == ["--"] else opts.router_args
        worker_key = read_keys(opts.worker_key_file)[0] if opts.worker_key_file else None
        kwargs = router_kwargs(router_argv, opts.key_check_url, worker_key)
    except (OSError, ValueError) as error:
        print(f"routerlaunch: {error}", file=sys.stderr)
        return 2
    # vllm_router: only in the router's own venv; the key check server here runs without it.
    from vllm_router.router import Router
    from vllm_router_rs import Router as _Router

    Router(router=_Router(**kwargs)).start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
