"""The router's front (router_launch.py front): its rules as plain data, then the real server on 127.0.0.1 in front of
a small upstream that records what reached it (docs/FLEET.md, "API keys")."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from twinspark.fleet import router_client, router_launch

CLIENT, ADMIN = "client-test-only-key", "admin-test-only-key"

def test_every_state_changing_or_worker_revealing_path_is_an_admin_path():
    """router_client.ROUTER_ADMIN_PATHS is written by hand: the front must treat exactly those of the router's paths
    as admin paths (a path dropped from router_launch.ADMIN_PATHS, or one added by mistake, fails here)."""
    admin = [(method, path) for method, path in router_client.ROUTER_PATHS if router_launch.is_admin_path(path)]
    assert admin == router_client.ROUTER_ADMIN_PATHS


@pytest.mark.parametrize("target", [
    "/add_worker?url=http://198.51.100.7:80", "//add_worker", "/./add_worker", "/v1/../add_worker", "/%61dd_worker",
    "/%2561dd_worker", "/ADD_WORKER", "/add_worker/", "/workers/http%3A%2F%2Fx", "http://router/add_worker",
    "/add_worker;x", "/add_worker%00"])
def test_spellings_of_an_admin_path_are_admin_paths(target):
    assert router_launch.is_admin_path(target)
    assert router_launch.decide(f"Bearer {CLIENT}", target, [CLIENT], [ADMIN]).status == 403


@pytest.mark.parametrize("target", ["/v1/chat/completions", "/v1/models", "/health", "/v1/responses/x/cancel",
                                    "/finish_session?session_id=s", "/tokenize", "/worker", "/v1/workers"])
def test_client_paths_are_not_admin_paths(target):
    assert not router_launch.is_admin_path(target)


@pytest.mark.parametrize(("authorization", "target", "status"), [
    (None, "/v1/chat/completions", 401), ("Bearer nope", "/v1/models", 401), (f"Basic {CLIENT}", "/health", 401),
    (None, "/add_worker?url=x", 401), (f"Bearer {CLIENT}", "/v1/chat/completions", 0),
    (f"Bearer {CLIENT}", "/add_worker?url=x", 403), (f"Bearer {CLIENT}", "/list_workers", 403),
    (f"Bearer {ADMIN}", "/add_worker?url=x", 0), (f"Bearer {ADMIN}", "/v1/chat/completions", 0)])
def test_decide(authorization, target, status):
    verdict = router_launch.decide(authorization, target, [CLIENT], [ADMIN])
    assert verdict.status == status
    assert bool(verdict.error) is bool(status)


def test_a_refusal_is_one_line_of_json_naming_no_key():
    body = router_launch.error_body(router_launch.decide(f"Bearer {CLIENT}", "/add_worker", [CLIENT], [ADMIN]))
    assert body.count(b"\n") == 1 and body.endswith(b"\n")
    assert json.loads(body)["error"]["code"] == 403
    assert CLIENT.encode() not in body and ADMIN.encode() not in body


def test_forwarded_headers_keep_authorization_and_drop_the_connections_own():
    headers = [("Authorization", f"Bearer {CLIENT}"), ("Content-Type", "application/json"),
               ("Connection", "keep-alive, X-Hop"), ("X-Hop", "1"), ("Transfer-Encoding", "chunked"),
               ("Host", "router:30000"), ("Content-Length", "12"), ("X-Request-Id", "r1")]
    assert router_launch.forwarded_headers(headers) == [
        ("Authorization", f"Bearer {CLIENT}"), ("Content-Type", "application/json"), ("X-Request-Id", "r1")]


# ---------------------------------------------------------------------------------------------------------------
# The real front on loopback
# ---------------------------------------------------------------------------------------------------------------


class Upstream:
    """A small upstream on 127.0.0.1 recording every request; /stream sends one SSE event, waits until the test
    has read it through the front (`release`), then sends the last."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.release = threading.Event()
        self.finished = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                owner.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers.items()),
                                   "body": body})
                if self.path == "/stream":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for event, wait in ((b"data: one\n\n", True), (b"data: [DONE]\n\n", False)):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                        self.wfile.flush()
                        if wait:
                            owner.release.wait(timeout=20)
                    self.wfile.write(b"0\r\n\r\n")
                    owner.finished.set()
                    return
                answer = json.dumps({"path": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]


@pytest.fixture
def front():
    upstream = Upstream()
    server = router_launch.front_server("127.0.0.1:0", f"127.0.0.1:{upstream.port}", [CLIENT], [ADMIN],
                                        max_body_bytes=1024, client_timeout_s=10, upstream_timeout_s=10)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (upstream.server, server)]
    for thread in threads:
        thread.start()
    try:
        yield server.server_address[1], upstream
    finally:
        for s in (server, upstream.server):
            s.shutdown()
            s.server_close()


def _ask(port: int, method: str, path: str, key: str | None, body: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    conn.request(method, path, body=body, headers=headers)
    answer = conn.getresponse()
    data = answer.read()
    conn.close()
    return answer.status, data


@pytest.mark.parametrize(("method", "path"), router_client.ROUTER_ADMIN_PATHS)
def test_the_front_refuses_a_client_key_on_every_admin_path_and_passes_the_admin_key(front, method, path):
    port, upstream = front
    body = json.dumps(router_client.ROUTER_BODIES.get(path.split("?")[0], {})).encode() if method == "POST" else None
    status, data = _ask(port, method, path, CLIENT, body)
    assert status == 403 and json.loads(data)["error"]["code"] == 403
    assert upstream.seen == []
    status, data = _ask(port, method, path, ADMIN, body)
    assert status == 200, data
    assert [(s["method"], s["path"]) for s in upstream.seen] == [(method, path)]


@pytest.mark.parametrize("key", [None, "not-the-key"])
def test_the_front_refuses_no_key_and_a_wrong_key_before_the_router(front, key):
    port, upstream = front
    assert _ask(port, "POST", "/v1/chat/completions", key, b"{}")[0] == 401
    assert _ask(port, "POST", "/add_worker?url=http://198.51.100.7:80", key, b"{}")[0] == 401
    assert upstream.seen == []


def test_a_client_request_reaches_the_router_unchanged_with_its_key(front):
    port, upstream = front
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).encode()
    status, data = _ask(port, "POST", "/v1/chat/completions?x=1", CLIENT, body)
    assert status == 200 and json.loads(data) == {"path": "/v1/chat/completions?x=1"}
    [seen] = upstream.seen
    assert seen["method"] == "POST" and seen["path"] == "/v1/chat/completions?x=1"
    assert seen["headers"]["Authorization"] == f"Bearer {CLIENT}"
    assert seen["headers"]["Content-Type"] == "application/json"
    assert seen["body"] == body


def test_a_body_over_the_bound_is_refused_413(front):
    port, upstream = front
    assert _ask(port, "POST", "/v1/chat/completions", CLIENT, b"x" * 2048)[0] == 413
    assert upstream.seen == []


def test_a_streamed_answer_arrives_event_by_event_before_the_router_has_finished(front):
    port, upstream = front
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/stream", body=b"{}", headers={"Authorization": f"Bearer {CLIENT}"})
    answer = conn.getresponse()
    assert answer.status == 200 and answer.getheader("Content-Type") == "text/event-stream"
    first = answer.read1(65536)
    # the upstream holds its last event until released: the first one came through on its own
    assert first == b"data: one\n\n" and not upstream.finished.is_set()
    upstream.release.set()
    rest = answer.read()
    conn.close()
    assert rest == b"data: [DONE]\n\n"
    assert upstream.finished.wait(timeout=10)


def test_a_router_that_does_not_answer_is_a_502(front):
    port, upstream = front
    upstream.server.shutdown()
    upstream.server.server_close()
    status, data = _ask(port, "GET", "/v1/models", CLIENT)
    assert status == 502 and CLIENT.encode() not in data


# ------------------------------------------------------------- rotation: key files read again, the router restarting
NEW = "client-test-only-new-key"


def _serve(server) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


def test_the_front_and_the_key_check_take_a_rotated_client_key_without_a_restart(tmp_path, capsys):
    upstream = Upstream()
    client_file, admin_file = tmp_path / "router.key", tmp_path / "admin.key"
    client_file.write_text(f"{CLIENT}\n")
    admin_file.write_text(f"{ADMIN}\n")
    clients = router_launch.KeyFiles([client_file], recheck_s=0)
    front = router_launch.front_server("127.0.0.1:0", f"127.0.0.1:{upstream.port}", clients,
                                       router_launch.KeyFiles([admin_file], recheck_s=0), upstream_timeout_s=10)
    check = router_launch.keycheck_server("127.0.0.1:0", router_launch.KeyFiles([client_file, admin_file], recheck_s=0))
    for server in (upstream.server, front, check):
        _serve(server)
    port, check_port = front.server_address[1], check.server_address[1]
    try:
        assert (_ask(port, "GET", "/v1/models", CLIENT)[0], _ask(port, "GET", "/v1/models", NEW)[0]) == (200, 401)
        staged = tmp_path / "staged"
        staged.write_text(f"{NEW}\n{CLIENT}\n")
        staged.replace(client_file)  # both, as the rotation's add writes them
        assert (_ask(port, "GET", "/v1/models", CLIENT)[0], _ask(port, "GET", "/v1/models", NEW)[0]) == (200, 200)
        assert _ask(check_port, "GET", "/", NEW)[0] == 200
        client_file.write_text(f"{NEW}\n")  # the drop, written in place this time
        assert (_ask(port, "GET", "/v1/models", CLIENT)[0], _ask(port, "GET", "/v1/models", NEW)[0]) == (401, 200)
        assert _ask(check_port, "GET", "/", CLIENT)[0] == 401
        assert _ask(port, "GET", "/add_worker?url=x", NEW)[0] == 403  # a rotated client key is still no admin key
        client_file.write_text("")  # emptied by mistake: the last good keys stay, said once
        assert _ask(port, "GET", "/v1/models", NEW)[0] == 200
        assert capsys.readouterr().err.count("keeping the keys read before") == 1
    finally:
        for server in (front, check, upstream.server):
            server.shutdown()
            server.server_close()


def test_the_front_takes_a_rotated_admin_key_without_a_restart_and_refuses_the_old_one_after_the_drop(tmp_path):
    """`twinspark rotate admin-key` writes the admin key file as roles/router/tasks/rotate_admin_key.yml does: the
    add lists the new key first and the old one after, the drop the new one alone. The running front must take the
    new key on the admin paths at once and, after the drop, refuse the old one (401: no known key at all)."""
    upstream = Upstream()
    client_file, admin_file = tmp_path / "router.key", tmp_path / "admin.key"
    client_file.write_text(f"{CLIENT}\n")
    admin_file.write_text(f"{ADMIN}\n")
    new_admin = "admin-test-only-new-key"
    front = router_launch.front_server("127.0.0.1:0", f"127.0.0.1:{upstream.port}",
                                       router_launch.KeyFiles([client_file], recheck_s=0),
                                       router_launch.KeyFiles([admin_file], recheck_s=0), upstream_timeout_s=10)
    _serve(upstream.server)
    _serve(front)
    port = front.server_address[1]
    try:
        assert (_ask(port, "GET", "/list_workers", ADMIN)[0], _ask(port, "GET", "/list_workers", new_admin)[0]) == (
            200, 401)
        admin_file.write_text(f"{new_admin}\n{ADMIN}\n")  # the add
        assert (_ask(port, "GET", "/list_workers", ADMIN)[0], _ask(port, "GET", "/list_workers", new_admin)[0]) == (
            200, 200)
        admin_file.write_text(f"{new_admin}\n")  # the drop
        assert (_ask(port, "GET", "/list_workers", ADMIN)[0], _ask(port, "GET", "/list_workers", new_admin)[0]) == (
            401, 200)
        assert _ask(port, "GET", "/list_workers", CLIENT)[0] == 403  # the clients' key never becomes an admin key
    finally:
        for server in (front, upstream.server):
            server.shutdown()
            server.server_close()


def _ask_while_the_upstream_comes_back(port: int, retry_s: float, status: int, before=lambda: None) -> None:
    """A front to 127.0.0.1:`port` retrying for `retry_s`; 1 s into a client's request `before` runs and an upstream
    starts listening on the port. The client must get `status`, and on 200 the upstream the request exactly once."""
    front = router_launch.front_server("127.0.0.1:0", f"127.0.0.1:{port}", [CLIENT], [ADMIN], upstream_timeout_s=10,
                                       upstream_retry_s=retry_s)
    _serve(front)
    upstream_box: list[Upstream] = []

    def start_upstream_late() -> None:
        time.sleep(1.0)
        before()
        upstream = Upstream()
        upstream.server.server_close()
        upstream.server = ThreadingHTTPServer(("127.0.0.1", port), upstream.server.RequestHandlerClass)
        upstream.server.daemon_threads = True
        upstream_box.append(upstream)
        _serve(upstream.server)

    late = threading.Thread(target=start_upstream_late, daemon=True)
    late.start()
    try:
        got, _ = _ask(front.server_address[1], "POST", "/v1/completions", CLIENT, body=b'{"prompt": "hi"}')
        assert got == status
        late.join(timeout=10)
        if status == 200:
            assert [seen["body"] for seen in upstream_box[0].seen] == [b'{"prompt": "hi"}']
    finally:
        front.shutdown()
        front.server_close()
        for upstream in upstream_box:
            upstream.server.shutdown()
            upstream.server.server_close()


@pytest.mark.parametrize(("retry_s", "status"), [(10.0, 200), (0.0, 502)])
def test_a_router_that_is_restarting_costs_a_wait_not_a_failure(retry_s, status):
    """A refused connect (nothing listens while the router restarts) is tried again for upstream_retry_s; without a
    retry it is a 502 at once. Nothing reached the router before it answered: the request is sent once."""
    with socket.socket() as placeholder:  # a port nobody listens on yet
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    _ask_while_the_upstream_comes_back(port, retry_s, status)


@pytest.mark.parametrize(("owner", "status"), [(os.getuid(), 200), (os.getuid() + 4242, 502)])
def test_the_front_sends_nothing_to_a_router_port_another_account_holds(owner, status, capsys):
    """Issue 43, row 1: while vllm-router restarts, another local account can take its port. The front checks the
    server end of each connection to the router (connection_holder) before a byte: held by anyone but the router's
    account, the client gets a 502 and the listener never sees the request, its key or its prompt."""
    upstream = Upstream()
    front = router_launch.front_server("127.0.0.1:0", f"127.0.0.1:{upstream.port}", [CLIENT], [ADMIN],
                                       upstream_timeout_s=10, upstream_owner_uid=owner)
    threads = [_serve(upstream.server), _serve(front)]
    try:
        got, text = _ask(front.server_address[1], "POST", "/v1/completions", CLIENT, body=b'{"prompt": "hi"}')
        assert got == status
        if status == 502:
            assert upstream.seen == [] and b"held by another account" in text
            assert f"uid {os.getuid()}, not the router's account" in capsys.readouterr().err
        else:
            assert [seen["body"] for seen in upstream.seen] == [b'{"prompt": "hi"}']
    finally:
        for server in (front, upstream.server):
            server.shutdown()
            server.server_close()
        for thread in threads:
            thread.join(timeout=10)


@pytest.mark.parametrize(("retry_s", "status"), [(10.0, 200), (0.0, 502)])
def test_a_request_queued_on_a_stopping_router_is_sent_again(retry_s, status):
    """The race a restart drill found (1 request in 150 under load): the front's connect lands in the stopping
    router's listen queue, never accepted; the router closes its listening socket and the kernel resets the queued
    connection. Nothing read it, so the front sends it again (within upstream_retry_s) to the new router."""
    stopping = socket.socket()
    stopping.bind(("127.0.0.1", 0))
    stopping.listen(8)  # listens, never accepts: the handshake completes in the kernel, the request waits unread
    port = stopping.getsockname()[1]

    def stop_the_router() -> None:
        stopping.close()  # the queued connection is reset
        time.sleep(0.5)

    _ask_while_the_upstream_comes_back(port, retry_s, status, stop_the_router)


# ---------------------------------------------------------------------------------------------------------------
# The front under load (issue 43, row 6): a header deadline and connection caps, in all and per address
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def tight_front():
    """The front with small bounds: the head of a request within 3 s, 6 connections at once, 3 from one address."""
    upstream = Upstream()
    server = router_launch.front_server("127.0.0.1:0", f"127.0.0.1:{upstream.port}", [CLIENT], [ADMIN],
                                        client_timeout_s=10, upstream_timeout_s=10, header_timeout_s=3.0,
                                        max_connections=6, max_per_source=3)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (upstream.server, server)]
    for thread in threads:
        thread.start()
    try:
        yield server.server_address[1]
    finally:
        for s in (server, upstream.server):
            s.shutdown()
            s.server_close()


def _idle(port: int, source: str) -> socket.socket:
    """A connection from `source` (another loopback address) that sends nothing."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.settimeout(10)
    return sock


def _closed_by_the_front(sock: socket.socket) -> bool:
    """True when the front closes the connection (EOF or reset) within the socket's timeout; False if it stays."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_connection_that_never_finishes_its_headers_is_closed_at_the_deadline_even_if_it_trickles(tight_front):
    silent = _idle(tight_front, "127.0.0.2")
    trickle = _idle(tight_front, "127.0.0.2")
    trickle.sendall(b"GET /v1/models HTTP/1.1\r\n")
    stop = threading.Event()

    def drip() -> None:  # one header byte every 0.2 s: no single read waits long, the whole head never arrives
        while not stop.is_set():
            try:
                trickle.sendall(b"X")
            except OSError:
                return
            time.sleep(0.2)

    threading.Thread(target=drip, daemon=True).start()
    try:
        assert _closed_by_the_front(silent)
        assert _closed_by_the_front(trickle)
    finally:
        stop.set()
        silent.close()
        trickle.close()
    assert _ask(tight_front, "GET", "/v1/models", CLIENT)[0] == 200  # the slots came back


def test_idle_connections_from_one_address_cannot_take_the_front_from_a_keyed_client_elsewhere(tight_front):
    held = [_idle(tight_front, "127.0.0.2") for _ in range(3)]
    extra = _idle(tight_front, "127.0.0.2")
    extra.settimeout(0.5)
    try:
        assert _closed_by_the_front(extra)  # the fourth from one address: closed at once
        held[0].settimeout(0.2)
        assert not _closed_by_the_front(held[0])  # the first three are still open (until their deadline)
        assert _ask(tight_front, "GET", "/v1/models", CLIENT)[0] == 200  # another address is served
        # Three more addresses fill the front's six slots: the next connection, from anywhere, is closed at once.
        held += [_idle(tight_front, f"127.0.0.{n}") for n in (3, 4, 5)]
        late = _idle(tight_front, "127.0.0.6")
        late.settimeout(0.5)
        assert _closed_by_the_front(late)
        late.close()
    finally:
        extra.close()
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the closed sockets' slots come back as their threads end
        try:
            if _ask(tight_front, "GET", "/v1/models", CLIENT)[0] == 200:
                break
        except OSError:
            time.sleep(0.1)
    else:
        pytest.fail("the front did not serve again after the idle connections went")


# ---------------------------------------------------------------------------------------------------------------
# The key check behind a socket systemd holds (issue 43, row 1)
# ---------------------------------------------------------------------------------------------------------------


def test_a_socket_is_taken_from_systemd_only_when_it_was_passed_to_this_process():
    assert router_launch.inherited_socket({}, 100) is None
    assert router_launch.inherited_socket({"LISTEN_PID": "99", "LISTEN_FDS": "1"}, 100) is None  # another process's
    assert router_launch.inherited_socket({"LISTEN_PID": "100", "LISTEN_FDS": "2"}, 100) is None  # not one socket


def test_the_key_check_serves_the_socket_systemd_holds_and_nobody_else_can_listen_there(tmp_path):
    """Real socket activation (systemd-socket-activate, as twinspark-router-keycheck.socket does it): the key check
    answers on the socket it was handed, and while it runs (or restarts) the port cannot be bound by anyone."""
    activate = shutil.which("systemd-socket-activate")
    if activate is None:
        pytest.skip("systemd-socket-activate is not installed (package systemd)")
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    keys = tmp_path / "keys"
    keys.write_text(f"{CLIENT}\n")
    launcher = Path(router_launch.__file__)
    check = subprocess.Popen([activate, "-l", f"127.0.0.1:{port}", sys.executable, "-I", str(launcher), "keycheck",
                              "--listen", f"127.0.0.1:{port}", "--key-file", str(keys)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:  # the activator listens first, then starts the key check on the first connection
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the activator did not listen within 20 s"
                time.sleep(0.1)
        assert _ask(port, "GET", "/", CLIENT)[0] == 200
        assert _ask(port, "GET", "/", "not-a-key")[0] == 401
        with socket.socket() as squatter, pytest.raises(OSError):
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", port))
            squatter.listen()
    finally:
        check.terminate()
        check.wait(timeout=10)


# ---------------------------------------------------------------------------------------------------------------
# Issue 43, row 8: the admin key over TLS only
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("channel", "authorization", "target", "status"), [
    # loopback on the client port: as before (the role's own proofs on the router host)
    ("local", f"Bearer {ADMIN}", "/list_workers", 0), ("local", f"Bearer {CLIENT}", "/list_workers", 403),
    # another host on the client port: the admin key is refused everywhere, the admin paths to every key
    ("plain", f"Bearer {ADMIN}", "/list_workers", 403), ("plain", f"Bearer {ADMIN}", "/v1/chat/completions", 403),
    ("plain", f"Bearer {CLIENT}", "/add_worker?url=x", 403), ("plain", None, "/add_worker?url=x", 401),
    ("plain", f"Bearer {CLIENT}", "/v1/chat/completions", 0), ("plain", "Bearer nope", "/v1/models", 401),
    # the TLS admin listener: admin paths with the admin key only; nothing else is served there
    ("admin", f"Bearer {ADMIN}", "/remove_worker?url=x", 0), ("admin", f"Bearer {ADMIN}", "/%6cist_workers", 0),
    ("admin", f"Bearer {CLIENT}", "/list_workers", 401), ("admin", None, "/list_workers", 401),
    ("admin", f"Bearer {ADMIN}", "/v1/chat/completions", 404), ("admin", f"Bearer {CLIENT}", "/v1/models", 404)])
def test_decide_by_channel(channel, authorization, target, status):
    verdict = router_launch.decide_channel(authorization, target, [CLIENT], [ADMIN], channel, admin_port=30443)
    assert verdict.status == status, verdict
    if status == 403 and channel == "plain":
        assert "30443" in verdict.error and "TLS" in verdict.error


def test_without_an_admin_listener_the_client_port_keeps_todays_rule():
    for authorization, target in ((f"Bearer {ADMIN}", "/list_workers"), (f"Bearer {CLIENT}", "/list_workers"),
                                  (None, "/v1/models")):
        assert (router_launch.decide_channel(authorization, target, [CLIENT], [ADMIN], "plain", None)
                == router_launch.decide(authorization, target, [CLIENT], [ADMIN]))
    with pytest.raises(ValueError, match="channel"):
        router_launch.decide_channel(None, "/", [], [], "lan", 1)


@pytest.mark.parametrize(("address", "loopback"), [
    ("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("::ffff:127.0.0.1", True), ("10.78.0.1", False),
    ("::ffff:10.78.0.1", False), ("fe80::1%eth0", False), ("not-an-address", False)])
def test_is_loopback(address, loopback):
    assert router_launch.is_loopback(address) is loopback


@pytest.fixture(scope="module")
def router_cert(tmp_path_factory):
    from twinspark import tls
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    where = tmp_path_factory.mktemp("router-tls")
    cert, key = where / "cert.pem", where / "key.pem"
    tls.make_cert(cert, key, ["127.0.0.1"], days=2)
    return cert, key


@pytest.fixture
def admin_front(router_cert):
    """The client listener and the TLS admin listener, both on loopback, in front of one upstream."""
    cert, key = router_cert
    upstream = Upstream()
    context = router_launch.tls_server_context(cert, key)
    admin = router_launch.front_server("127.0.0.1:0", f"127.0.0.1:{upstream.port}", [], [ADMIN], tls=context,
                                       client_timeout_s=10, upstream_timeout_s=10, header_timeout_s=2)
    client = router_launch.front_server("127.0.0.1:0", f"127.0.0.1:{upstream.port}", [CLIENT], [ADMIN],
                                        client_timeout_s=10, upstream_timeout_s=10,
                                        admin_port=admin.server_address[1])
    servers = (upstream.server, admin, client)
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        yield client.server_address[1], admin.server_address[1], upstream, cert
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def _ask_tls(port: int, cert: Path, method: str, path: str, key: str | None):
    import ssl
    context = ssl.create_default_context(cafile=str(cert))
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    conn.request(method, path, headers={"Authorization": f"Bearer {key}"} if key else {})
    answer = conn.getresponse()
    data = answer.read()
    conn.close()
    return answer.status, data


def test_the_admin_listener_speaks_tls_and_passes_only_the_admin_key_on_admin_paths(admin_front):
    _, admin_port, upstream, cert = admin_front
    assert _ask_tls(admin_port, cert, "GET", "/list_workers", ADMIN)[0] == 200
    assert _ask_tls(admin_port, cert, "GET", "/list_workers", CLIENT)[0] == 401
    assert _ask_tls(admin_port, cert, "POST", "/v1/chat/completions", ADMIN)[0] == 404
    assert [(s["method"], s["path"]) for s in upstream.seen] == [("GET", "/list_workers")]
    assert upstream.seen[0]["headers"]["Authorization"] == f"Bearer {ADMIN}"


def test_plain_http_to_the_admin_listener_gets_no_answer_and_reaches_nothing(admin_front):
    _, admin_port, upstream, _ = admin_front
    with pytest.raises((http.client.HTTPException, OSError)):
        _ask(admin_port, "GET", "/list_workers", ADMIN)
    assert upstream.seen == []


def test_a_stalled_tls_handshake_is_closed_at_the_header_deadline(admin_front):
    _, admin_port, _, _ = admin_front
    sock = socket.create_connection(("127.0.0.1", admin_port), timeout=10)
    try:
        started = time.monotonic()
        assert sock.recv(1) == b""  # closed by the front without a byte: no ClientHello ever came
        assert time.monotonic() - started < 8
    finally:
        sock.close()


def test_the_client_port_refuses_the_admin_key_from_another_host(admin_front, monkeypatch):
    port, admin_port, upstream, _ = admin_front
    # Loopback as it is: the router host's own proofs keep working on the client port.
    assert _ask(port, "GET", "/list_workers", ADMIN)[0] == 200
    # Any other address (the tests may only use loopback, so the front is told this one is not).
    monkeypatch.setattr(router_launch, "is_loopback", lambda _address: False)
    upstream.seen.clear()
    status, data = _ask(port, "GET", "/list_workers", ADMIN)
    assert status == 403 and str(admin_port) in json.loads(data)["error"]["message"]
    assert _ask(port, "POST", "/v1/chat/completions", ADMIN, b"{}")[0] == 403
    assert _ask(port, "GET", "/list_workers", CLIENT)[0] == 403
    assert upstream.seen == []
    assert _ask(port, "POST", "/v1/chat/completions", CLIENT, b"{}")[0] == 200
    assert [s["path"] for s in upstream.seen] == ["/v1/chat/completions"]


def test_the_front_refuses_an_admin_listener_without_tls_files(tmp_path, capsys):
    keys = tmp_path / "keys"
    keys.write_text(f"{CLIENT}\n")
    admin = tmp_path / "admin"
    admin.write_text(f"{ADMIN}\n")
    rc = router_launch.main(["front", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9",
                             "--client-key-file", str(keys), "--admin-key-file", str(admin),
                             "--admin-listen", "127.0.0.1:0"])
    assert rc == 2
    assert "--tls-cert" in capsys.readouterr().err


def test_the_drain_lists_and_removes_over_tls_trusting_the_routers_certificate_alone(admin_front, tmp_path):
    """The drain (twinspark.fleet.drain, as the heads run it) against the real admin listener: with the router's
    certificate it is served; with another certificate as its trust anchor the key never leaves (no answer)."""
    from twinspark import tls
    from twinspark.fleet import drain

    _, admin_port, upstream, cert = admin_front
    ref = drain.RouterRef("http://127.0.0.1:9", "http://10.0.0.1:8000", ADMIN, f"https://127.0.0.1:{admin_port}",
                          str(cert))
    router = drain.Router(ref)
    router.listed()  # the stub answers {"path": ...}, not a list of URLs: what counts is that it was asked
    assert upstream.seen[-1]["path"] == "/list_workers"
    assert upstream.seen[-1]["headers"]["Authorization"] == f"Bearer {ADMIN}"
    assert router.call("remove")[0] is True
    assert upstream.seen[-1]["path"].startswith("/remove_worker?url=http://10.0.0.1:8000")
    # no certificate on the head (deleted, or the router play has not run yet): nothing is sent, and it says why
    seen = len(upstream.seen)
    ok, line = drain.Router(drain.RouterRef(ref.url, ref.pair_url, ADMIN, ref.admin_url,
                                            str(tmp_path / "gone.pem"))).call("remove")
    assert ok is False and "certificate is not at" in line and len(upstream.seen) == seen
    other, other_key = tmp_path / "other.pem", tmp_path / "other.key"
    tls.make_cert(other, other_key, ["127.0.0.1"], days=2)
    seen = len(upstream.seen)
    ok, line = drain.Router(drain.RouterRef(ref.url, ref.pair_url, ADMIN, ref.admin_url, str(other))).call("remove")
    assert ok is False and "cannot be reached" in line
    # the fix it names is the router's certificate, not a pair's (issue 43: it named twinspark_vllm_tls_ca)
    assert "does not verify against" in line and "router play again" in line, line
    assert "twinspark_vllm_tls_ca" not in line and line.startswith(f"router https://127.0.0.1:{admin_port} ")
    assert len(upstream.seen) == seen
