"""The head's probes send the API key only to a listener the serving account owns (issue "Least privilege, second
pass", row 2): any local account can bind the API port while vLLM is stopped or importing, and would otherwise read
the key from the next guard run or health sweep."""

from __future__ import annotations

import http.server
import os
import pwd
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from twinspark import api
from twinspark.pair import guard

ME = os.getuid()
STRANGER = ME + 4242


def test_proc_net_addresses_decode_as_the_kernel_writes_them():
    assert api._proc_address("0100007F:22B8") == ("127.0.0.1", 8888)
    assert api._proc_address("00000000:1F90") == ("0.0.0.0", 8080)
    assert api._proc_address("00000000000000000000000001000000:22B8") == ("::1", 8888)
    mapped, port = api._proc_address("0000000000000000FFFF00000100007F:22B8")
    assert (api.ipaddress.ip_address(mapped).ipv4_mapped, port) == (api.ipaddress.ip_address("127.0.0.1"), 8888)
    assert api._reaches(mapped, api.ipaddress.ip_address("127.0.0.1"))
    assert api._reaches("::", api.ipaddress.ip_address("127.0.0.1")) and api._reaches("0.0.0.0",
                                                                                     api.ipaddress.ip_address("::1"))
    assert not api._reaches("127.0.0.2", api.ipaddress.ip_address("127.0.0.1"))


def test_only_listening_sockets_on_the_port_are_listed(tmp_path):
    net = tmp_path / "net"
    net.mkdir()
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    rest = "00000000:00000000 00:00000000 00000000"
    (net / "tcp").write_text(header
                             + f"   0: 0100007F:22B8 00000000:0000 0A {rest}  1001 0 11\n"
                             + f"   1: 0100007F:22B8 0100007F:D431 01 {rest}     0 0 12\n"
                             + f"   2: 00000000:0016 00000000:0000 0A {rest}     0 0 13\n")
    (net / "tcp6").write_text(header
                              + "   0: 00000000000000000000000000000000:22B8 00000000000000000000000000000000:0000 0A "
                                "00000000:00000000 00:00000000 00000000   999 0 14\n")
    assert sorted(api.tcp_listeners(8888, str(tmp_path))) == [("127.0.0.1", 1001), ("::", 999)]
    assert api.tcp_listeners(9, str(tmp_path)) == []
    assert api.tcp_listeners(8888, str(tmp_path / "absent")) is None
    # Unable to see who holds a local port: the key stays home.
    why = api.key_withheld("http://127.0.0.1:8888", ME, str(tmp_path / "absent"))
    assert why is not None and "cannot read" in why and "not sent" in why


def _listening() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def test_a_local_listener_of_another_account_gets_no_key_and_is_named():
    with _listening() as server:
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        assert api.key_withheld(url, ME) is None  # ours (this process is the "serving account" here)
        why = api.key_withheld(url, STRANGER)
        assert why is not None and f"port {server.getsockname()[1]}" in why and "not the serving account" in why
        assert f"uid {ME}" in why
        assert api.key_withheld(url, None) is None  # no serving account on this machine: nothing here to protect


def test_a_v4_mapped_url_is_judged_against_the_ipv4_listener():
    """Issue 43, row 4: VLLM_HOST written as ::ffff:127.0.0.1 dials the IPv4 listener on 127.0.0.1."""
    with _listening() as server:
        port = server.getsockname()[1]
        why = api.key_withheld(f"http://[::ffff:127.0.0.1]:{port}", STRANGER)
        assert why is not None and "not the serving account" in why
        assert api.key_withheld(f"http://[::ffff:127.0.0.1]:{port}", ME) is None


def test_a_remote_url_and_a_free_port_are_not_judged():
    # 10.78.0.250 is not an address of this machine: a bind there fails, so no traffic is sent and it is not local.
    assert api.key_withheld("http://10.78.0.250:8888", STRANGER) is None
    assert api.key_withheld("http://head.example:8888", STRANGER) is None
    with _listening() as server:
        port = server.getsockname()[1]
    assert api.key_withheld(f"http://127.0.0.1:{port}", STRANGER) is None  # nothing listens: refused before headers


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def _answer(self) -> None:
        type(self).seen.append(self.headers.get("Authorization"))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = b'{"data": [{"id": "m", "max_model_len": 64}], "usage": {"completion_tokens": 1}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


def test_gather_never_sends_the_key_to_a_strangers_listener():
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        held = api.gather(url, "m", "sk-secret", 5.0, owner_uid=STRANGER)
        assert held["models"]["withheld"] and "not the serving account" in held["models"]["error"]
        assert held["generate"]["withheld"]
        assert "Bearer sk-secret" not in _Recorder.seen and _Recorder.seen  # /health and /metrics were still asked
        _Recorder.seen = []
        ours = api.gather(url, "m", "sk-secret", 5.0, owner_uid=ME)
        assert ours["generate"].get("tokens") == 1
        assert "Bearer sk-secret" in _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _HeldPair:
    """A stand-in head: a key ssh accepts, a unit whose executable exists, and an API URL."""

    def __init__(self, key: str, url: str):
        self.ssh_key = key
        self.api = api.Api(url=url, served_name="m", max_model_len=None)

    def exec_start(self) -> str:
        return f"{{ path={sys.executable} ; argv[]={sys.executable} -I -m twinspark.cli serve ; ignore_errors=no }}"


def test_the_guard_holds_rather_than_restarts_while_another_account_holds_the_api_port(tmp_path, monkeypatch):
    key = Path(tmp_path / "id_ed25519")
    key.write_text("key\n")
    key.chmod(0o600)
    with _listening() as server:
        pair = _HeldPair(str(key), f"http://127.0.0.1:{server.getsockname()[1]}")
        monkeypatch.setattr(api, "serving_uid", lambda: STRANGER)
        blocker = guard.restart_blocker(pair)
        assert blocker is not None and "not the serving account" in blocker
        monkeypatch.setattr(api, "serving_uid", lambda: ME)
        assert guard.restart_blocker(pair) is None or "not the serving account" not in guard.restart_blocker(pair)


# ---------------------------------------------------------------------------------------------------------------
# Decided on the very connection (issue 43, rows 1 and 4): no window between a check and the request
# ---------------------------------------------------------------------------------------------------------------


def test_the_server_end_of_a_connection_is_found_even_before_it_is_accepted():
    """A connection the listener never accepted (queued in the kernel, as during a restart) is in /proc/net/tcp with
    the listener's account, and so is an accepted one."""
    with _listening() as server, socket.create_connection(server.getsockname(), timeout=5) as queued:
        assert api.connection_holder(queued) == ME
        assert api.listener_problem(queued, ME) is None
        why = api.listener_problem(queued, STRANGER)
        assert why is not None and f"port {server.getsockname()[1]}" in why and f"uid {ME}" in why
        assert "nothing was sent" in why


def test_a_connection_whose_server_end_cannot_be_seen_carries_nothing(tmp_path):
    """Handshaped: a /proc whose tables lack the connection (an empty network namespace view) counts as unseen."""
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text("  sl  local_address rem_address   st\n")
    with _listening() as server, socket.create_connection(server.getsockname(), timeout=5) as conn:
        assert api.connection_holder(conn, str(tmp_path), wait_s=0.05) is None
        why = api.listener_problem(conn, ME, str(tmp_path))
        assert why is not None and "cannot see who holds" in why
        assert api.listener_problem(conn, None, str(tmp_path)) is None  # no serving account here: not judged


def test_a_keyed_request_goes_only_over_a_connection_the_owner_holds():
    """The session checks each connection it opens for a keyed request after connect() and before any byte, so a
    listener that took the port after key_withheld looked (row 4's window) never reads a header. Keyless requests
    (/health) are not held to it."""
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        stranger = api.session(owner_uid=STRANGER)
        result, response = api.request(stranger, "GET", f"{url}/v1/models", 5.0, headers=api.auth_headers("sk-x"))
        assert response is None and result["withheld"] and "nothing was sent" in result["error"]
        assert _Recorder.seen == []  # not even a request line reached the listener
        assert api.request(stranger, "GET", f"{url}/health", 5.0)[0]["status_code"] == 200
        ours = api.session(owner_uid=ME)
        assert api.request(ours, "GET", f"{url}/v1/models", 5.0, headers=api.auth_headers("sk-x"))[0].get(
            "status_code") == 200
        assert "Bearer sk-x" in _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


SQUATTER = """
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""


def test_a_squatter_of_another_account_is_named_and_gets_no_key(tmp_path):
    """Live, as the attack runs on the nodes: the listener belongs to `nobody` (needs root to start it so)."""
    if os.geteuid() != 0:
        pytest.skip("starting a listener as nobody needs root")
    nobody = pwd.getpwnam("nobody").pw_uid
    python = shutil.which("python3", path="/usr/bin") or sys.executable  # one `nobody` can run
    squatter = subprocess.Popen(["setpriv", f"--reuid={nobody}", f"--regid={pwd.getpwnam('nobody').pw_gid}",
                                 "--clear-groups", python, "-I", "-c", SQUATTER],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        port = int(squatter.stdout.readline())
        result, response = api.request(api.session(owner_uid=ME), "GET", f"http://127.0.0.1:{port}/v1/models", 5.0,
                                       headers=api.auth_headers("sk-x"))
        assert response is None and result["withheld"]
        assert f"nobody (uid {nobody})" in result["error"]
    finally:
        squatter.kill()
        squatter.wait(timeout=10)
