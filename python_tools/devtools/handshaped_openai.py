"""A handshaped stand-in for one pair's vLLM API on 127.0.0.1: just enough of the OpenAI surface for the router.

It answers GET /health, /v1/models, /metrics and POST /v1/chat/completions (and /v1/completions) like vLLM's
OpenAI server does in shape only, records the Authorization header it was sent, and can demand a key of its own
(as a pair's head does with twinspark_vllm_api_key). `stop()` closes the listening socket, so a request to it
afterwards is refused at once, as after a SIGKILL of the head.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Backend:
    def __init__(self, name: str, port: int = 0, key: str | None = None, delay_s: float = 0.0) -> None:
        self.name = name
        self.key = key
        self.delay_s = delay_s
        self.served = 0
        self.running = 0  # requests being answered now (its /metrics reports them, as vLLM does)
        self.auth_seen: list[str] = []
        self._lock = threading.Lock()
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> Backend:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args) -> None:  # keep test output clean
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorised(self) -> bool:
                seen = self.headers.get("Authorization", "")
                with backend._lock:
                    backend.auth_seen.append(seen)
                if backend.key is None or seen == f"Bearer {backend.key}":
                    return True
                self._send(401, b'{"error":"Unauthorized"}')
                return False

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(200, b"")
                elif self.path == "/metrics":
                    with backend._lock:
                        running = backend.running
                    self._send(200, (f"vllm:num_requests_running{{pair=\"{backend.name}\"}} {running}\n"
                                     f"vllm:num_requests_waiting{{pair=\"{backend.name}\"}} 0\n").encode(),
                               "text/plain; version=0.0.4")
                elif self.path == "/v1/models":
                    if self._authorised():
                        self._send(200, json.dumps({"object": "list", "data": [
                            {"id": "tiny", "object": "model", "owned_by": backend.name}]}).encode())
                else:
                    self._send(404, b'{"error":"not found"}')

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.path not in ("/v1/chat/completions", "/v1/completions", "/tokenize"):
                    self._send(404, b'{"error":"not found"}')
                    return
                if not self._authorised():
                    return
                if self.path == "/tokenize":  # vLLM's shape: one token per word of the prompt here
                    words = str((json.loads(raw or b"{}") or {}).get("prompt", "")).split()
                    self._send(200, json.dumps({"count": len(words), "max_model_len": 2048,
                                                "tokens": list(range(len(words)))}).encode())
                    return
                try:
                    request = json.loads(raw or b"{}")
                except ValueError:
                    self._send(400, b'{"error":"bad json"}')
                    return
                with backend._lock:
                    backend.running += 1
                try:
                    if backend.delay_s:
                        time.sleep(backend.delay_s)
                finally:
                    with backend._lock:
                        backend.running -= 1
                        backend.served += 1
                text = f"hello from {backend.name}"
                if self.path == "/v1/chat/completions":
                    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                else:
                    choice = {"index": 0, "text": text, "finish_reason": "stop"}
                self._send(200, json.dumps({
                    "id": f"cmpl-{backend.name}", "object": "chat.completion", "created": int(time.time()),
                    "model": request.get("model", "tiny"), "choices": [choice],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}}).encode())

        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._server.daemon_threads = True
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"backend-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def main(argv: list[str] | None = None) -> int:
    """Serve one handshaped backend until killed: --name, --port, --key, --delay-s."""
    import argparse

    parser = argparse.ArgumentParser(description="a handshaped vLLM OpenAI API on 127.0.0.1 (tests and bench only)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key")
    parser.add_argument("--delay-s", type=float, default=0.0)
    opts = parser.parse_args(argv)
    backend = Backend(opts.name, opts.port, opts.key, opts.delay_s).start()
    print(f"ready {backend.url}", flush=True)
    assert backend._thread is not None
    backend._thread.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
