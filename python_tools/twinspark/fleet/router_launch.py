"""Start vllm-router 0.1.17 with client keys required, the key check it asks, and the front that keeps clients
off its admin paths.

Why this file exists (docs/FLEET.md, "API keys"): the router's own check of client keys (`authorize_request` in
the router's src/server.rs) only runs when it has a list of validation URLs, and the wheel's `vllm-router`
command never passes one (the Python `RouterArgs` has no such field; the pyo3 `Router` defaults it to empty), so
out of the box every path, the admin ones (/add_worker, /remove_worker, /workers) included, answers anyone.
The pyo3 `Router` does take `api_key_validation_urls`; this launcher passes it and leaves the rest of the command
line to the router's own parser, so every flag keeps the router's meaning.

Why the front exists (docs/FLEET.md, "API keys"): vllm-router asks its validation URL about the bearer token only,
never the path, so any key it accepts may call /add_worker and send other clients' prompts to a server of its
choosing. The front listens where clients connect, refuses a client key on the admin paths (`ADMIN_PATHS`), and
forwards everything else, unchanged and streamed, to the router on loopback.

Three commands, all standard library plus the installed `vllm_router` (this file is copied next to the router's
venv; it imports nothing from twinspark):

    routerlaunch.py keycheck --listen 127.0.0.1:30099 --key-file /etc/twinspark/router.key [--key-file F]
        answers GET with 200 when `Authorization: Bearer <key>` matches a line of one of the key files, else 401.
    routerlaunch.py front --listen 0.0.0.0:30000 --upstream 127.0.0.1:30001 --client-key-file F --admin-key-file A
            [--admin-listen 0.0.0.0:30443 --tls-cert C --tls-key K]
        401 without a known key, 403 for a client key on an admin path, else forwards to the router (`decide`).
        With --admin-listen, the admin paths are served there over TLS to the admin key alone, and the client port
        refuses the admin key and the admin paths from other hosts (`decide_channel`).
    routerlaunch.py serve --key-check-url http://127.0.0.1:30099/ [--worker-key-file F] -- <vllm-router flags>
        runs the router with that URL as its only validation URL (refuses to start without one). With
        --worker-key-file, the file's first key is the router's `api_key`: the key the router itself sends to the
        pairs on the paths it proxies without the client's headers (/tokenize and the other catch-all paths); read
        from the file so that it never shows in the process list, as `--api-key` on the command line would.

The router caches each token's answer for its lifetime, good and bad alike, so a key change needs a router
restart (the role restarts it when the key file changes) and the keycheck service must be up before the router
takes traffic (the role orders the units). The front and the key check read their key files again when they change
(`KeyFiles`), and the front tries a refused connect to the router again for --upstream-retry-s (30 s), so
`twinspark rotate api-key` changes the clients' key with only vllm-router itself restarted, and no client request
refused meanwhile (docs/ROTATION.md).
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import http.client
import ipaddress
import json
import os
import posixpath
import pwd
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple

MAX_KEY_BYTES = 4096
# A request body the front forwards at most (a long prompt, images as base64); larger is answered 413.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# The front under load (front_server): the head of a request in all, connections at once, and from one address.
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_MAX_PER_SOURCE = 64
# The admin listener's own caps (issue 43, row 8): its callers are the heads' drains and an operator.
ADMIN_MAX_CONNECTIONS = 64
ADMIN_MAX_PER_SOURCE = 8
# Every path of vllm-router 0.1.17 that changes its worker set or state, or tells which workers it has and how
# loaded they are (its src/server.rs admin and worker routes): the admin key only. `ADMIN_PREFIXES`: their
# sub-paths (/workers/{url}).
ADMIN_PATHS = frozenset({"/add_worker", "/remove_worker", "/list_workers", "/workers", "/flush_cache", "/get_loads",
                         "/scheduling/diagnostics"})
ADMIN_PREFIXES = ("/workers/", "/scheduling/")
# Headers that describe one connection, never forwarded (RFC 9110 7.6.1); the front sets its own framing and has
# answered a client's Expect: 100-continue itself.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "transfer-encoding", "upgrade", "content-length", "host", "expect"})


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


class KeyFiles:
    """Keys from files, read again when one of them changes (looked at, by inode, size and modification time, at
    most once every `recheck_s`): the front and the key check take a rotated key with no restart (`twinspark rotate
    api-key`, docs/ROTATION.md). A file that cannot be read, or holds no key, keeps the last good set and says so once
    on stderr; at start it is refused (`read_keys`)."""

    def __init__(self, paths: list[Path], recheck_s: float = 1.0) -> None:
        self.paths = list(paths)
        self.recheck_s = recheck_s
        self._lock = threading.Lock()
        self._keys = [key for path in self.paths for key in read_keys(path)]
        try:
            self._stamp: tuple | None = self._stamps()
        except OSError:  # gone since it was read: the next look reads it again
            self._stamp = None
        self._checked = time.monotonic()
        self._complained = False

    def _stamps(self) -> tuple:
        stamps = []
        for path in self.paths:
            info = os.stat(path)
            stamps.append((info.st_ino, info.st_size, info.st_mtime_ns))
        return tuple(stamps)

    def keys(self) -> list[str]:
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= self.recheck_s:
                self._checked = now
                try:
                    stamp = self._stamps()
                    if stamp != self._stamp:
                        self._keys = [key for path in self.paths for key in read_keys(path)]
                        self._stamp = stamp
                        self._complained = False
                except (OSError, ValueError) as error:
                    if not self._complained:
                        print(f"routerlaunch: keeping the keys read before: {error}", file=sys.stderr, flush=True)
                        self._complained = True
            return self._keys


Keys = list | KeyFiles


def current_keys(keys: Keys) -> list[str]:
    """A fixed list as it is; key files as they read now."""
    return keys.keys() if isinstance(keys, KeyFiles) else keys


def key_allowed(authorization: str | None, keys: list[str]) -> bool:
    """Whether an Authorization header carries one of the keys (compared in constant time, every key tried)."""
    if not authorization or not authorization.startswith("Bearer "):
        return False
    token = authorization[len("Bearer "):].strip().encode()
    allowed = False
    for key in keys:
        allowed |= hmac.compare_digest(token, key.encode())
    return allowed


def normalised_path(target: str) -> str | None:
    """The path a request target names, as the most lenient reader could route it: percent-escapes decoded (until
    none is left), repeated slashes and dot segments collapsed, no trailing slash, lower case; None for a target that
    is not a plain path."""
    if not target.startswith("/"):
        return None  # absolute-form (http://host/path) or asterisk-form targets: not for a router
    path = target.split("?", 1)[0].split("#", 1)[0]  # not urlsplit: it reads //x as a host
    for _ in range(4):
        try:
            decoded = urllib.parse.unquote(path, errors="strict")
        except UnicodeDecodeError:
            return None
        if decoded == path:
            break
        path = decoded
    else:
        return None
    if "\\" in path or any(ord(c) < 0x20 or c in "%;" for c in path):
        return None
    return posixpath.normpath("/" + path.lstrip("/")).lower()


def is_admin_path(target: str) -> bool:
    """Whether a request target is one of vllm-router's admin paths; a target that is not a plain path is treated
    as one (refused to a client key)."""
    path = normalised_path(target)
    if path is None:
        return True
    return path in ADMIN_PATHS or path.startswith(ADMIN_PREFIXES)


class Verdict(NamedTuple):
    status: int  # 0: forward the request
    error: str


FORWARD = Verdict(0, "")


def decide(authorization: str | None, target: str, client_keys: list[str], admin_keys: list[str]) -> Verdict:
    """The front's rule for one request: 401 without a known key, 403 for a client key on an admin path, else
    forward. Both key lists are always compared in full (constant time, whichever matches)."""
    admin = key_allowed(authorization, admin_keys)
    client = key_allowed(authorization, client_keys)
    if admin:
        return FORWARD
    if not client:
        return Verdict(401, "a valid API key is required (Authorization: Bearer <key>)")
    if is_admin_path(target):
        return Verdict(403, "this path is the router's admin API; a client key may not call it")
    return FORWARD


def decide_channel(authorization: str | None, target: str, client_keys: list[str], admin_keys: list[str],
                   channel: str, admin_port: int | None = None) -> Verdict:
    """`decide`, by where the request came in (issue 43, row 8: the admin key never crosses the network in clear):

    * "local": the client port, from this host's loopback: `decide` as it is (the role's own proofs run here);
    * "plain": the client port, from another host, when the front also serves its admin listener over TLS
      (`admin_port`): the admin key and the admin paths are refused (403) whatever the key, naming the TLS port;
      a client key on a client path is forwarded;
    * "admin": the TLS admin listener: the admin paths with the admin key only; any other path is 404 (clients use
      the client port), any other key 401."""
    if channel == "local" or (channel == "plain" and admin_port is None):
        return decide(authorization, target, client_keys, admin_keys)
    admin = key_allowed(authorization, admin_keys)
    if channel == "admin":
        if not is_admin_path(target):
            return Verdict(404, "this port serves only the router's admin API; clients use the client port")
        return FORWARD if admin else Verdict(401, "the router's admin key is required (Authorization: Bearer <key>)")
    if channel != "plain":
        raise ValueError(f"channel {channel!r} is not local, plain or admin")
    over_tls = f"over TLS only, at https://<router>:{admin_port}"
    if admin:
        return Verdict(403, f"the router's admin key is taken {over_tls}; it crossed the network in clear text now: "
                            "rotate it (twinspark rotate admin-key)")
    verdict = decide(authorization, target, client_keys, admin_keys)
    if verdict.status == 403:
        return Verdict(403, f"this path is the router's admin API, served {over_tls} to the admin key alone")
    return verdict


def is_loopback(address: str) -> bool:
    """Whether a peer address is this host's loopback (an IPv4-mapped IPv6 address counts as its IPv4 address)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def tls_server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The admin listener's TLS: TLS 1.2 or later, the router's certificate and key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


def forwarded_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The request or response headers to pass on: all but the hop-by-hop ones and those the Connection header
    names (the front frames each message itself), Authorization included."""
    named = {token.strip().lower() for name, value in headers if name.lower() == "connection"
             for token in value.split(",")}
    return [(name, value) for name, value in headers if name.lower() not in HOP_BY_HOP | named]


def error_body(verdict: Verdict) -> bytes:
    """The one-line JSON answer for a refusal."""
    return (json.dumps({"error": {"message": verdict.error, "code": verdict.status}}) + "\n").encode()


SD_LISTEN_FDS_START = 3  # sd_listen_fds(3): the first socket systemd hands a socket-activated service


def inherited_socket(environ: dict[str, str] | None = None, pid: int | None = None) -> socket.socket | None:
    """The listening socket systemd passed (LISTEN_PID is this process, LISTEN_FDS=1), or None when none was.

    The key check runs behind twinspark-router-keycheck.socket (issue 43, row 1): systemd holds its port from boot,
    across every restart of the key check, so no other local account can ever listen there and read the keys the
    router forwards to it. Reads the variables once and removes them, as sd_listen_fds(1) does."""
    environ = os.environ if environ is None else environ
    if environ.get("LISTEN_PID") != str(os.getpid() if pid is None else pid) or environ.get("LISTEN_FDS") != "1":
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        environ.pop(name, None)
    return socket.socket(fileno=SD_LISTEN_FDS_START)


def keycheck_server(listen: str, keys: Keys, inherited: socket.socket | None = None) -> ThreadingHTTPServer:
    """A server answering 200 for a known key and 401 otherwise, on any GET path; not started. With `inherited` (a
    listening socket from systemd) it serves that socket and binds nothing; `listen` must name its address."""
    host, _, port = listen.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args) -> None:  # never log a header that may hold a key
            pass

        def do_GET(self) -> None:
            status = 200 if key_allowed(self.headers.get("Authorization"), current_keys(keys)) else 401
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    if inherited is None:
        server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    else:
        bound = inherited.getsockname()[:2]
        if (bound[0], bound[1]) != ((host.strip("[]") or "127.0.0.1"), int(port)):
            raise ValueError(f"--listen {listen}: systemd passed a socket on {bound[0]}:{bound[1]}; make the "
                             "socket unit's ListenStream= and --listen name the same address")
        server = ThreadingHTTPServer(bound, Handler, bind_and_activate=False)
        server.socket.close()
        server.socket = inherited
        server.server_address = bound
    server.daemon_threads = True
    return server


# ---------------------------------------------------------------------------------------------------------------
# Whose socket is at the other end (twinspark.api uses these too: this file is copied alone, stdlib only)
# ---------------------------------------------------------------------------------------------------------------

TCP_LISTEN = "0A"


def proc_address(text: str) -> tuple[str, int]:
    """/proc/net/tcp{,6}'s `HEXADDR:HEXPORT` (each 32-bit word of the address in host byte order)."""
    address, port = text.split(":")
    raw = bytes.fromhex(address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words)), int(port, 16)


def _endpoint(address: str, port: int) -> tuple[object, int]:
    parsed = ipaddress.ip_address(address.split("%")[0])
    return getattr(parsed, "ipv4_mapped", None) or parsed, port


def _proc_net_rows(proc: str, table: str) -> list[str] | None:
    """The rows of this network namespace's /proc/net/<table>, read through /proc/self/net first: a unit with
    ProcSubset=pid (the router front) sees no top-level /proc/net, only its own process's directory."""
    for path in (os.path.join(proc, "self", "net", table), os.path.join(proc, "net", table)):
        try:
            with open(path, encoding="ascii") as handle:
                return handle.read().splitlines()[1:]
        except OSError:
            continue
    return None


def connection_holder(sock: socket.socket, proc: str = "/proc", wait_s: float = 1.0) -> int | None:
    """The uid of the socket at the other end of this connected TCP socket when that end is on this machine (the
    row of /proc/net/tcp{,6} whose local address is our peer and whose remote address is us; a connection still
    queued, never accepted, is there too, owned by its listener's account); None when no such row shows up within
    `wait_s` (the row appears as the server handles our final ACK, which on loopback can trail connect())."""
    wanted = (_endpoint(*sock.getpeername()[:2]), _endpoint(*sock.getsockname()[:2]))
    # the ports as the table writes them: a cheap first sieve over a table a busy front makes long
    local_port, remote_port = f":{wanted[0][1]:04X}", f":{wanted[1][1]:04X}"
    deadline = time.monotonic() + wait_s
    while True:
        for table in ("tcp", "tcp6"):
            rows = _proc_net_rows(proc, table)
            if rows is None:
                continue
            for row in rows:
                if local_port not in row or remote_port not in row:
                    continue
                fields = row.split()
                if (len(fields) < 8 or fields[3] == TCP_LISTEN or not fields[1].endswith(local_port)
                        or not fields[2].endswith(remote_port)):
                    continue
                if (_endpoint(*proc_address(fields[1])), _endpoint(*proc_address(fields[2]))) == wanted:
                    return int(fields[7])
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def front_server(listen: str, upstream: str, client_keys: Keys, admin_keys: Keys,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, client_timeout_s: float = 120.0,
                 upstream_timeout_s: float = 900.0, upstream_retry_s: float = 0.0,
                 header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_per_source: int = DEFAULT_MAX_PER_SOURCE, upstream_owner_uid: int | None = None,
                 proc: str = "/proc", tls: ssl.SSLContext | None = None,
                 admin_port: int | None = None) -> ThreadingHTTPServer:
    """The front, not started: refuses or forwards each request (`decide`) to the router at `upstream`
    (host:port), one connection per request, and streams the answer back as it comes (SSE included).

    `client_timeout_s` bounds each read from and write to a client; `upstream_timeout_s` the connect to the router
    and each wait for its next bytes (a long generation that sends nothing until it ends, without streaming).
    `upstream_retry_s`: for this long a refused connect to the router, or a connection it resets before a byte of
    answer, is tried again (every 0.2 s) before the client gets 502, so a restart of the router (SIGTERM lets its
    requests in flight finish; the new one answers seconds later) costs clients a wait, not a failure. Nothing has
    reached a router that refused the connect; a reset without an answer is the stopping router closing its listening
    socket on connections still queued in the kernel, which it never read (those it read, it finishes).

    It holds under load (issue 43, row 6): a connection must deliver its request line and headers within
    `header_timeout_s` in all (a deadline, not a per-read timeout, so a byte every few seconds does not keep it), or it
    is closed before any key is looked at; at most `max_connections` connections are served at once and at most
    `max_per_source` from one address, and a connection beyond either is closed as soon as it is accepted, without
    a thread. Idle or slow sockets from one place therefore cannot take the front from keyed clients elsewhere.

    `upstream_owner_uid` (issue 43, row 1): each connection to the router is used only when its server end belongs
    to that account, checked on the connection itself (connection_holder) before a byte is sent; another local
    account that took the router's port while it restarted gets nothing, and the client a 502 saying so.

    Issue 43, row 8: with `tls` this is the admin listener (`decide_channel` "admin": the admin paths with the admin
    key only, over TLS; the handshake runs in the connection's own thread, within the header deadline). Without it,
    the client listener; `admin_port` (the admin listener's port, when there is one) makes it refuse the admin key
    and the admin paths from any address but loopback (`decide_channel` "plain")."""
    up_host, up_port = _split_listen(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = client_timeout_s

        def log_message(self, *_args) -> None:  # never log a header that may hold a key
            pass

        def setup(self) -> None:
            # The header deadline: unless parse_request has the whole head by then (the TLS handshake included), the
            # socket is shut down (the blocked read returns and the thread ends). Cancelled once the headers are in.
            self._deadline_sock = self.request
            self._deadline = threading.Timer(header_timeout_s, lambda: _shut(self._deadline_sock))
            self._deadline.daemon = True
            self._deadline.start()
            if tls is not None:
                # Wrapped first, shaken after: the wrap takes over the socket's descriptor, so the deadline must
                # hold the TLS socket before the handshake can block.
                self.request.settimeout(client_timeout_s)
                self.request = self._deadline_sock = tls.wrap_socket(self.request, server_side=True,
                                                                     do_handshake_on_connect=False)
                try:
                    self.request.do_handshake()
                except BaseException:
                    self._deadline.cancel()
                    self.request.close()
                    raise
            super().setup()

        def parse_request(self) -> bool:
            done = super().parse_request()
            self._deadline.cancel()
            return done

        def finish(self) -> None:
            self._deadline.cancel()
            super().finish()

        def _refuse(self, verdict: Verdict) -> None:
            body = error_body(verdict)
            self.send_response(verdict.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if verdict.status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def _body(self) -> bytes | Verdict:
            if self.headers.get("Transfer-Encoding"):
                return Verdict(411, "send the request body with Content-Length, not chunked")
            length = self.headers.get("Content-Length") or "0"
            if not length.isdigit():
                return Verdict(400, "Content-Length must be a number of bytes")
            if int(length) > max_body_bytes:
                return Verdict(413, f"the request body is over {max_body_bytes} bytes")
            return self.rfile.read(int(length)) if int(length) else b""

        def _relay(self) -> None:
            self.close_connection = True
            channel = "admin" if tls is not None else (
                "local" if is_loopback(str(self.client_address[0])) else "plain")
            verdict = decide_channel(self.headers.get("Authorization"), self.path, current_keys(client_keys),
                                     current_keys(admin_keys), channel, admin_port)
            if verdict.status:
                self._refuse(verdict)
                return
            body = self._body()
            if isinstance(body, Verdict):
                self._refuse(body)
                return
            deadline = time.monotonic() + upstream_retry_s
            while True:
                upstream_conn = http.client.HTTPConnection(up_host, up_port, timeout=upstream_timeout_s)
                try:
                    upstream_conn.connect()
                    if upstream_owner_uid is not None:
                        holder = connection_holder(upstream_conn.sock, proc)
                        if holder != upstream_owner_uid:
                            upstream_conn.close()
                            print(f"router_launch front: {upstream} is held by uid {holder}, not the router's account "
                                  f"(uid {upstream_owner_uid}); nothing was sent to it", file=sys.stderr, flush=True)
                            self._refuse(Verdict(502, "the router's port is held by another account"))
                            return
                    upstream_conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    upstream_conn.putheader("Host", f"{up_host}:{up_port}")
                    for name, value in forwarded_headers(list(self.headers.items())):
                        upstream_conn.putheader(name, value)
                    if body or self.command in ("POST", "PUT", "PATCH"):
                        upstream_conn.putheader("Content-Length", str(len(body)))
                    upstream_conn.putheader("Connection", "close")
                    upstream_conn.endheaders(body or None)
                    answer = upstream_conn.getresponse()
                    break
                except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError):
                    # Refused: nothing listens (the router is restarting). Reset or closed before a byte of answer
                    # (RemoteDisconnected is a ConnectionResetError): the stopping router closed its listening socket
                    # with this connection still queued and never read, since a graceful stop finishes what it read.
                    upstream_conn.close()
                    if time.monotonic() >= deadline:
                        self._refuse(Verdict(502, "the router behind the front did not answer"))
                        return
                    time.sleep(0.2)
                except (OSError, http.client.HTTPException):
                    upstream_conn.close()
                    self._refuse(Verdict(502, "the router behind the front did not answer"))
                    return
            try:
                self.send_response(answer.status, answer.reason)
                for name, value in forwarded_headers(answer.getheaders()):
                    self.send_header(name, value)
                bodyless = self.command == "HEAD" or answer.status in (204, 304) or 100 <= answer.status < 200
                if not bodyless:
                    self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                if bodyless:
                    return
                while True:
                    try:
                        chunk = answer.read1(65536)
                    except (OSError, http.client.HTTPException):
                        return  # no last chunk: the client sees the answer cut short, never a complete one
                    if not chunk:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError:  # TimeoutError included
                return  # the client went away or stalled; nothing to tell it
            finally:
                upstream_conn.close()

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _relay

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in _split_listen(listen)[0] else socket.AF_INET
        daemon_threads = True
        request_queue_size = 128
        slots = ConnectionSlots(max_connections, max_per_source)

        def process_request(self, request, client_address) -> None:
            if not self.slots.take(client_address[0]):
                self.shutdown_request(request)  # over a cap: closed at once, no thread, nothing read
                return
            super().process_request(request, client_address)

        def process_request_thread(self, request, client_address) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.give(client_address[0])

        def handle_error(self, request, client_address) -> None:
            if isinstance(sys.exc_info()[1], OSError):
                return  # a client that went away, or one closed at its header deadline: nothing to report
            super().handle_error(request, client_address)

    return Server(_split_listen(listen), Handler)


def _shut(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


class ConnectionSlots:
    """How many connections the front serves at once, in all and per source address."""

    def __init__(self, total: int, per_source: int) -> None:
        self.total, self.per_source = total, per_source
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._count = 0

    def take(self, source: str) -> bool:
        with self._lock:
            if self._count >= self.total or self._held.get(source, 0) >= self.per_source:
                return False
            self._count += 1
            self._held[source] = self._held.get(source, 0) + 1
            return True

    def give(self, source: str) -> None:
        with self._lock:
            self._count -= 1
            left = self._held.get(source, 1) - 1
            if left:
                self._held[source] = left
            else:
                self._held.pop(source, None)


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
    check.add_argument("--key-file", type=Path, action="append", required=True,
                       help="a file of keys to accept, one a line; repeat for several files")
    front = sub.add_parser("front", help="refuse client keys on the router's admin paths, forward the rest")
    front.add_argument("--listen", required=True, help="host:port clients connect to")
    front.add_argument("--upstream", required=True, help="host:port of the router, on loopback")
    front.add_argument("--client-key-file", type=Path, required=True)
    front.add_argument("--admin-key-file", type=Path, required=True)
    front.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    front.add_argument("--upstream-timeout-s", type=float, default=900.0)
    front.add_argument("--upstream-retry-s", type=float, default=30.0,
                       help="how long a refused connect to the router (restarting) is tried again before a 502")
    front.add_argument("--header-timeout-s", type=float, default=DEFAULT_HEADER_TIMEOUT_S,
                       help="a connection's request line and headers must arrive within this, in all")
    front.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                       help="connections served at once; more are closed at once")
    front.add_argument("--max-per-source", type=int, default=DEFAULT_MAX_PER_SOURCE,
                       help="connections served at once from one address; more are closed at once")
    front.add_argument("--upstream-owner", metavar="ACCOUNT",
                       help="the account that runs the router: a connection to --upstream whose server end another "
                            "account holds gets nothing (issue 43, row 1)")
    front.add_argument("--admin-listen", metavar="HOST:PORT",
                       help="also serve the router's admin paths here, over TLS, to the admin key alone; the client "
                            "port then refuses the admin key and the admin paths from every address but loopback "
                            "(issue 43, row 8). Needs --tls-cert and --tls-key")
    front.add_argument("--tls-cert", type=Path, help="the admin listener's certificate (PEM)")
    front.add_argument("--tls-key", type=Path, help="the admin listener's private key (PEM)")
    serve = sub.add_parser("serve", help="run vllm-router with client keys required; router flags after --")
    serve.add_argument("--key-check-url", action="append", default=[])
    serve.add_argument("--worker-key-file", type=Path,
                       help="the key the router sends to the pairs itself: this file's first key")
    serve.add_argument("router_args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    try:
        if opts.command in ("keycheck", "front"):
            if opts.command == "keycheck":
                server = keycheck_server(opts.listen, KeyFiles(opts.key_file), inherited_socket())
            else:
                client_keys, admin_keys = read_keys(opts.client_key_file), read_keys(opts.admin_key_file)
                if set(client_keys) & set(admin_keys):
                    raise ValueError(f"{opts.admin_key_file}: holds a client key too; the admin key must be a "
                                     "secret of its own")
                owner = None
                if opts.upstream_owner:
                    try:
                        owner = pwd.getpwnam(opts.upstream_owner).pw_uid
                    except KeyError:
                        raise ValueError(f"--upstream-owner {opts.upstream_owner}: no such account on this machine; "
                                         "name the account the router runs as") from None
                if opts.admin_listen and not (opts.tls_cert and opts.tls_key):
                    raise ValueError("--admin-listen needs --tls-cert and --tls-key: the admin key goes only over TLS")
                tls = tls_server_context(opts.tls_cert, opts.tls_key) if opts.admin_listen else None
                admin_port = _split_listen(opts.admin_listen)[1] if opts.admin_listen else None
                common = dict(upstream_timeout_s=opts.upstream_timeout_s, upstream_retry_s=opts.upstream_retry_s,
                              header_timeout_s=opts.header_timeout_s, max_connections=opts.max_connections,
                              max_per_source=opts.max_per_source, upstream_owner_uid=owner)
                server = front_server(opts.listen, opts.upstream, KeyFiles([opts.client_key_file]),
                                      KeyFiles([opts.admin_key_file]), opts.max_body_bytes, admin_port=admin_port,
                                      **common)
                if tls is not None:
                    # Its callers are the heads' drains and an operator, never the clients: a few connections, so
                    # that both listeners together stay within the unit's LimitNOFILE and TasksMax.
                    admin_caps = dict(max_connections=min(ADMIN_MAX_CONNECTIONS, opts.max_connections),
                                      max_per_source=min(ADMIN_MAX_PER_SOURCE, opts.max_per_source))
                    admin = front_server(opts.admin_listen, opts.upstream, [], KeyFiles([opts.admin_key_file]),
                                         opts.max_body_bytes, tls=tls, **{**common, **admin_caps})
                    threading.Thread(target=admin.serve_forever, daemon=True).start()
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
