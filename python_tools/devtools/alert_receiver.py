"""The simulated pair's alert receiver: a small webhook endpoint on the controller that records every POST.

Alertmanager on the monitor host sends every notification (firing and resolved) to monitoring_alert_webhook_url;
inventory/sim points it here, at the harness's bridge address, which the nodes reach without a default route.
scripts/sim/up starts it (scripts/sim/lib/build.sh, alert_receiver_up) and scripts/sim/down stops it.

    python3 python_tools/devtools/alert_receiver.py --listen 10.78.0.254:9099 --out /var/tmp/twinspark-sim/alerts.jsonl

Each POST, whatever its path, becomes one JSON line in --out: {"received_at" (Unix time), "path", "body"} where body
is the request's JSON (Alertmanager's webhook payload: status, alerts[] with labels, startsAt, endsAt, ...), or
{"text": ...} when it is not JSON. A line is written whole and flushed before the 200 answer, so whoever reads the
file after the answer finds it. GET on any path answers {"received": N}. Bodies over --max-bytes get 413 and are
not recorded. Standard library only: the harness runs it with the machine's python3.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DEFAULT_MAX_BYTES = 1 << 20


class Recorder:
    """Appends one JSON line per notification to a file; counts them."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.received = 0
        self._lock = threading.Lock()
        out.parent.mkdir(parents=True, exist_ok=True)

    def record(self, path: str, raw: bytes) -> None:
        try:
            body: object = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = {"text": raw.decode("utf-8", errors="replace")}
        line = json.dumps({"received_at": time.time(), "path": path, "body": body}, sort_keys=True) + "\n"
        with self._lock, self.out.open("a", encoding="utf-8") as stream:
            stream.write(line)
            stream.flush()
            self.received += 1


def server(listen_host: str, port: int, recorder: Recorder, max_bytes: int = DEFAULT_MAX_BYTES) -> ThreadingHTTPServer:
    """A bound (not yet serving) receiver; port 0 picks a free one (server.server_address says which)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args) -> None:  # the file is the record; no access log on stderr
            pass

        def _answer(self, status: int, payload: dict[str, object]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > max_bytes:
                self.close_connection = True
                self._answer(413, {"error": f"body must be 0 to {max_bytes} bytes with a Content-Length"})
                return
            recorder.record(self.path, self.rfile.read(length))
            self._answer(200, {"recorded": True})

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._answer(200, {"received": recorder.received})

    return ThreadingHTTPServer((listen_host, port), Handler)


def parse_listen(text: str) -> tuple[str, int]:
    """'HOST:PORT' (an IPv6 host in brackets) -> (host, port); ValueError naming the fix."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen {text!r}: give HOST:PORT, e.g. 10.78.0.254:9099")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True, metavar="HOST:PORT", help="address and port to listen on")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE", help="JSON lines file to append to")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="largest body recorded")
    args = parser.parse_args(argv)
    try:
        host, port = parse_listen(args.listen)
        httpd = server(host, port, Recorder(args.out), args.max_bytes)
    except (ValueError, OSError) as error:
        print(f"alert_receiver: {error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown, daemon=True).start())
    print(f"alert_receiver: listening on {args.listen}, recording to {args.out}", file=sys.stderr, flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
