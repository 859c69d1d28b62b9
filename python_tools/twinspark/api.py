"""The head's OpenAI-compatible API as every TwinSpark client reaches it: one home for the rules.

Which base URL (scheme, the host to dial for a bind address, the port), which key to send, whether to speak TLS and
what to verify the server's certificate against, the one-token probe, and reading /metrics. The pair guard, `twinspark
health` (on a node and from the controller), `twinspark bench`, the front door's closing health table, the demo's chat
and the vllm_service role's readiness waits (through filter_plugins/twinspark_service.py) all come through here, so
they cannot drift apart.

Rules are plain functions over the env mapping (serve.env + secrets.env as `nodeenv`/`launcher.read_settings` read
them) or over inventory values; HTTP happens only in `request`, `read_metrics` and `gather`, and the TLS context is
built only in `session` / `ssl_context`.

TLS is on when the head's env names a certificate (TWINSPARK_VLLM_TLS_CERT, rendered from the inventory's
twinspark_vllm_tls_cert). Probes then verify the server against TWINSPARK_VLLM_TLS_CA, or against the certificate itself
when no CA is named (a self-signed pair certificate). Hostname checking stays on: the certificate must name the
address a client dials (127.0.0.1 for the head's own probes when vLLM binds a wildcard address). See docs/SECURITY.md.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import re
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from twinspark import layout, settings
from twinspark.fleet import router_launch

# Env names (serve.env) and inventory variables of the TLS settings (python_tools/twinspark/settings.yml).
TLS_CERT_ENV, TLS_KEY_ENV, TLS_CA_ENV = "TWINSPARK_VLLM_TLS_CERT", "TWINSPARK_VLLM_TLS_KEY", "TWINSPARK_VLLM_TLS_CA"
TLS_CERT_VAR, TLS_KEY_VAR, TLS_CA_VAR = "twinspark_vllm_tls_cert", "twinspark_vllm_tls_key", "twinspark_vllm_tls_ca"


# ---------------------------------------------------------------------------------------------------------------
# Rules (pure)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Api:
    """The head's API as a client sees it. The key is kept out of repr() and never logged."""

    url: str  # base URL, e.g. http://127.0.0.1:8888 or https://127.0.0.1:8888
    served_name: str
    max_model_len: int | None
    api_key: str | None = field(default=None, repr=False)
    ca: str | None = None  # the file the server's certificate is verified against; None: plain HTTP

    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)

    @property
    def tls(self) -> bool:
        return self.url.startswith("https://")


def auth_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def probe_host(bind: str) -> str:
    """Where a client on the head itself reaches an API bound to `bind`: a wildcard bind is probed on loopback;
    an IPv6 literal is bracketed for a URL. A host name passes unchanged."""
    bind = (bind or "").strip()
    if bind in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bind in ("::", "[::]"):
        return "[::1]"
    if ":" in bind and not bind.startswith("["):
        return f"[{bind}]"
    return bind


def base_url(host: str, port: int | str, tls: bool = False) -> str:
    """The API's base URL for a host (or bind address) and port; https when `tls`."""
    return f"{'https' if tls else 'http'}://{probe_host(host)}:{int(str(port), 10)}"


def keys(env: Mapping[str, str]) -> list[str]:
    """Every API key the head serves with, in order: VLLM_API_KEY's, else DSPARK_API_KEYS' (blank means unset;
    validation lets at most one of the two be set). The launcher hands these to vLLM; probes send the first."""
    for name in ("VLLM_API_KEY", "DSPARK_API_KEYS"):
        tokens = (env.get(name) or "").split()
        if tokens:
            return tokens
    return []


def first_key(env: Mapping[str, str]) -> str | None:
    """The key probes send: the first of `keys` (None when the API has none)."""
    return next(iter(keys(env)), None)


def tls_ca(env: Mapping[str, str]) -> str | None:
    """What a client on the head verifies the API's certificate against, from the node's env files: the CA when one
    is named, else the certificate itself (self-signed); None when the API speaks plain HTTP."""
    cert = (env.get(TLS_CERT_ENV) or "").strip()
    if not cert:
        return None
    return (env.get(TLS_CA_ENV) or "").strip() or cert


def tls_ca_from_inventory(head_vars: Mapping[str, object]) -> str | None:
    """The same choice from the controller: the head's inventory names the files on the controller, so a client
    there verifies against twinspark_vllm_tls_ca, else twinspark_vllm_tls_cert; None when TLS is off."""
    cert = str(head_vars.get(TLS_CERT_VAR) or "").strip()
    if not cert:
        return None
    return str(head_vars.get(TLS_CA_VAR) or "").strip() or cert


def default_port() -> int:
    """The API port when the env or inventory names none: VLLM_PORT's default in the knob registry (settings.yml)."""
    return int(settings.load()["VLLM_PORT"].default)


def url_from_env(env: Mapping[str, str]) -> str:
    """The base URL a client on the head uses, from VLLM_HOST (the bind), VLLM_PORT and the TLS settings."""
    return base_url(env.get("VLLM_HOST") or "", env.get("VLLM_PORT") or default_port(), tls=tls_ca(env) is not None)


def api_from_env(env: Mapping[str, str]) -> Api:
    """The head's API as its env files describe it (VLLM_HOST, VLLM_PORT, SERVED_MODEL_NAME, MAX_MODEL_LEN, keys,
    TLS). Probes send the first key (roles/vllm_service/README.md). Raises ValueError naming the fix."""
    port = int(str(env.get("VLLM_PORT") or default_port()), 10)
    max_len = str(env.get("MAX_MODEL_LEN") or "").strip()
    served = (env.get("SERVED_MODEL_NAME") or "").strip()
    if not served:
        raise ValueError("SERVED_MODEL_NAME is empty in the env files: the guard cannot tell which model the head "
                         "must list; render the env files with ansible-playbook site.yml")
    ca = tls_ca(env)
    return Api(url=base_url(env.get("VLLM_HOST") or "", port, tls=ca is not None), served_name=served,
               max_model_len=int(max_len) if max_len else None, api_key=first_key(env), ca=ca)


def one_token_body(served_name: str | None) -> dict[str, object]:
    """The liveness probe's request: one greedy token from /v1/completions."""
    return {"model": served_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}


def parse_metrics(text: str) -> dict[str, object]:
    """vLLM's Prometheus exposition -> running/waiting requests, KV cache usage, spec-decode acceptance, and the
    token counters the pair guard watches for progress (generated and prefilled tokens since vLLM started).

    Values are summed over label sets (one per engine/model); KV usage is the largest one (a fraction, 0..1).
    """
    # Measured: prometheus_client.parser adds ~180 ms at import (-X importtime); only /metrics readers pay it.
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    peaks: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
            peaks[sample.name] = max(peaks.get(sample.name, sample.value), sample.value)
    metrics: dict[str, object] = {
        "running": sums.get("vllm:num_requests_running"),
        "waiting": sums.get("vllm:num_requests_waiting"),
        "kv_cache_usage": peaks.get("vllm:kv_cache_usage_perc", peaks.get("vllm:gpu_cache_usage_perc")),
        "spec_acceptance": None,
        "generation_tokens": sums.get("vllm:generation_tokens_total"),
        "prompt_tokens": sums.get("vllm:prompt_tokens_total"),
    }
    drafted = sums.get("vllm:spec_decode_num_draft_tokens_total")
    accepted = sums.get("vllm:spec_decode_num_accepted_tokens_total")
    if drafted:
        metrics["spec_acceptance"] = (accepted or 0.0) / drafted
    if metrics["running"] is None and metrics["waiting"] is None:
        metrics["error"] = "no vllm:num_requests_* metrics in the answer (is this vLLM?)"
    return metrics


# What to do when a pair's https API does not verify (describe_error's default fix).
PAIR_TLS_FIX = "set twinspark_vllm_tls_ca to the CA that signed it (or the certificate itself when self-signed)"


def describe_error(error: Exception, ca: str | None = None, tls_fix: str = PAIR_TLS_FIX) -> str:
    """One line for a failed request: a TLS failure says what was verified against what and `tls_fix`, the fix for
    the listener asked (a pair's API by default; the router's admin listener names its own)."""
    kind = type(error).__name__
    text = str(error)
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        match = re.search(r"certificate verify failed: ([^(')\"]+)", text)
        reason = match.group(1).strip() if match else "certificate verify failed"
        against = f"against {ca}" if isinstance(ca, str) else "against the system's CAs"
        return f"TLS: the server's certificate does not verify {against} ({reason}); {tls_fix}"
    if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text:
        return (f"{kind}: the server does not speak TLS; twinspark_vllm_tls_cert is set here but the pair serves "
                "plain HTTP (converge with site.yml)")
    match = re.search(r"\[Errno -?\d+\] ([^')\"]+)", text)
    return f"{kind}: {match.group(1) if match else text[:160]}"


# ---------------------------------------------------------------------------------------------------------------
# I/O: TLS context, requests
# ---------------------------------------------------------------------------------------------------------------


def ssl_context(ca: str) -> ssl.SSLContext:
    """A client context that verifies the server's chain against `ca` alone, and its host name."""
    context = ssl.create_default_context(cafile=ca)
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def certificate_expiry(url: str, ca: str, timeout: float) -> dict[str, object]:
    """When the certificate the https API at `url` serves stops being valid: {"not_after": unix time}, or {"error":
    ...}. Verified against `ca` as every probe is: the figure is the certificate clients get, and one that no longer
    verifies (expired) gives none, while the probes fail and say why."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout) as raw, \
                ssl_context(ca).wrap_socket(raw, server_hostname=parts.hostname) as tls:
            not_after = (tls.getpeercert() or {}).get("notAfter")
    except (OSError, ValueError) as error:
        return {"error": describe_error(error, ca)}
    if not isinstance(not_after, str):
        return {"error": "the server's certificate has no notAfter date"}
    return {"not_after": float(ssl.cert_time_to_seconds(not_after))}


SERVING = object()  # session(owner_uid=SERVING): this machine's serving account, looked up when the session is made


def session(ca: str | None = None, pool: int | None = None, owner_uid: object = SERVING, proc: str = "/proc"):
    """A requests session that verifies an https server against `ca` and nothing else (None: requests' default CA
    list, which only matters for an https URL given by hand). `pool` sizes the connection pool (the bench's
    concurrency).

    A request that carries a key (an Authorization header) goes out only on a connection whose server end, when it
    is on this machine, belongs to `owner_uid` (default: the serving account; None: no check): each new connection
    is checked after connect() and before TLS or a header (listener_problem), so a listener that appears between a
    check and the request never gets the key. Keyless requests (/health, /metrics) use their own connections."""
    # Measured: requests adds ~170 ms at import (-X importtime); `pair kick` and `serve` send no HTTP. urllib3 comes
    # with it.
    import requests
    from urllib3 import connection, connectionpool

    uid = serving_uid() if owner_uid is SERVING else owner_uid
    sending = threading.local()  # whether the request this thread is sending carries a key

    class PinnedSession(requests.Session):
        """requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE replace a session's `verify` on every request
        (merge_environment_settings): with a CA named here, that CA and nothing else is the trust anchor."""

        def merge_environment_settings(self, url, proxies, stream, verify, cert):
            merged = super().merge_environment_settings(url, proxies, stream, verify, cert)
            if isinstance(self.verify, str) and verify in (None, True):
                merged["verify"] = self.verify
            return merged

        def send(self, request, **kwargs):
            sending.keyed = "Authorization" in request.headers
            try:
                return super().send(request, **kwargs)
            finally:
                sending.keyed = False

        def get_adapter(self, url):
            if uid is not None and getattr(sending, "keyed", False):
                return keyed
            return super().get_adapter(url)

    sized = {"pool_maxsize": pool} if pool else {}
    out = PinnedSession()
    if ca:
        out.verify = ca
    if pool:
        adapter = requests.adapters.HTTPAdapter(**sized)
        out.mount("http://", adapter)
        out.mount("https://", adapter)
    keyed = requests.adapters.HTTPAdapter(**sized)
    if uid is not None:
        plain = type("CheckedPool", (connectionpool.HTTPConnectionPool,),
                     {"ConnectionCls": _checked_connection(connection.HTTPConnection, uid, proc)})
        secure = type("CheckedSecurePool", (connectionpool.HTTPSConnectionPool,),
                      {"ConnectionCls": _checked_connection(connection.HTTPSConnection, uid, proc)})
        keyed.poolmanager.pool_classes_by_scheme = {"http": plain, "https": secure}
    return out


def request(http, method: str, url: str, timeout: float, tls_fix: str = PAIR_TLS_FIX,
            **kwargs) -> tuple[dict[str, object], object]:
    """One request; ({status_code, elapsed} or {error, elapsed}, the response or None). Never raises. `tls_fix`: what
    a certificate that does not verify asks for (describe_error)."""
    started = time.monotonic()
    try:
        response = http.request(method, url, timeout=timeout, **kwargs)
    except Exception as error:  # noqa: BLE001 - requests' whole family of connection errors is the finding
        kind = type(error).__name__
        refused = refused_by_owner(error)
        if refused:
            return {"error": refused, "withheld": True, "elapsed": time.monotonic() - started}, None
        if "Timeout" in kind:
            text = "no answer within the timeout"
        else:
            verify = getattr(http, "verify", None)
            text = describe_error(error, verify if isinstance(verify, str) else None, tls_fix)
        return {"error": text, "elapsed": time.monotonic() - started}, None
    return {"status_code": response.status_code, "elapsed": time.monotonic() - started}, response


def read_metrics(url: str, timeout: float, http=None, ca: str | None = None) -> dict[str, object]:
    """The head's /metrics, summarised by parse_metrics (no key: vLLM serves it outside /v1). A failure is an
    {"error": ...} mapping; when the endpoint did not answer at all (refused, timed out, HTTP error, TLS refused) it
    also carries "unreachable": True, which tells an API process that hangs apart from one that answers without
    vLLM's counters."""
    http = http if http is not None else session(ca)
    result, response = request(http, "GET", f"{url}/metrics", timeout)
    if response is None or not response.ok:
        return {"error": result.get("error") or f"HTTP {result.get('status_code')}", "unreachable": True}
    try:
        return parse_metrics(response.text)
    except ValueError as error:
        return {"error": f"unparseable exposition: {error}"}


# ---------------------------------------------------------------------------------------------------------------
# Whose listener gets the key
# ---------------------------------------------------------------------------------------------------------------

# The /proc/net/tcp reading is shared with the router front, which is copied alone to the router host (stdlib only).
TCP_LISTEN = router_launch.TCP_LISTEN
_proc_address = router_launch.proc_address
connection_holder = router_launch.connection_holder


def tcp_listeners(port: int, proc: str = "/proc") -> list[tuple[str, int]] | None:
    """(local address, uid) of every TCP socket listening on `port` in this network namespace, IPv4 and IPv6, from
    /proc/net/tcp and tcp6 (the uid column is the socket's owner); None when neither table can be read."""
    found = []
    read_any = False
    for table in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", table), encoding="ascii") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for row in rows:
            fields = row.split()
            if len(fields) < 8 or fields[3] != TCP_LISTEN:
                continue
            address, listening = _proc_address(fields[1])
            if listening == port:
                found.append((address, int(fields[7])))
    return found if read_any else None


def _is_local(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether an address is this machine's own: loopback, or one a socket here can bind."""
    if address.is_loopback:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(address), 0))
        return True
    except OSError:
        return False


def _url_host_port(url: str) -> tuple[str, int] | None:
    found = re.match(r"^https?://(\[[^\]]+\]|[^/:]+):(\d+)", url)
    if found is None:
        return None
    return found.group(1).strip("[]"), int(found.group(2))


def account_uid(name: str, missing: int) -> int:
    """`name`'s uid on this machine; `missing` when there is no such account."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return missing


def serving_uid() -> int | None:
    """The serving account's uid on this node (the shared layout's service_user); None when it does not exist."""
    try:
        return pwd.getpwnam(layout.current().service_user).pw_uid
    except KeyError:
        return None


def key_withheld(url: str, owner_uid: int | None, proc: str = "/proc") -> str | None:
    """Why the API key must not go to `url`, or None when it may.

    A URL on this machine (loopback, or one of its addresses) reaches whatever listens on that port, and any local
    account can bind the API port while vLLM is stopped or still importing. So the key goes to a local URL only when
    every socket listening there (that address or a wildcard, from /proc/net/tcp{,6}) belongs to the serving
    account; a URL of another machine is not judged here. No listener: the connection is refused before any
    header is sent. `owner_uid` None (no serving account on this machine, so nothing here serves the pair: a
    controller, a test): not judged."""
    parts = _url_host_port(url)
    if owner_uid is None:
        return None
    if parts is None:
        return None
    host, port = parts
    try:
        address = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
    except ValueError:
        return None  # a host name: another machine's, as the controller's sweep dials it
    # An IPv6 socket dialling ::ffff:a.b.c.d reaches IPv4 listeners on a.b.c.d: judge it as that IPv4 address (issue
    # 43, row 4: written as ::ffff:127.0.0.1, the host was not matched against IPv4 listeners and the key went out).
    address = getattr(address, "ipv4_mapped", None) or address
    if not _is_local(address):
        return None
    listeners = tcp_listeners(port, proc)
    if listeners is None:
        return (f"cannot read {proc}/net/tcp to see who holds port {port} on {host}: the API key was not sent "
                "(run the probe where /proc/net is visible)")
    holders = sorted({uid for listening, uid in listeners if _reaches(listening, address)})
    strangers = [uid for uid in holders if uid != owner_uid]
    if not strangers:
        return None
    names = ", ".join(_account(uid) for uid in strangers)
    return (f"port {port} on {host} is held by {names}, not the serving account: the API key was not sent "
            "(another local account bound the API port while vLLM did not hold it; find it with `ss -ltnp`)")


def _reaches(listening: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a socket listening on `listening` answers a client dialling `address` (a wildcard does; an IPv6
    socket bound to a v4-mapped address answers that IPv4 address)."""
    bound = ipaddress.ip_address(listening)
    if bound.is_unspecified:
        return True
    mapped = getattr(bound, "ipv4_mapped", None)
    return bound == address or (mapped is not None and mapped == address)


def _account(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


class ListenerRefused(ConnectionError):
    """The server side of a connection on this machine belongs to another account: nothing was sent on it."""


def listener_problem(sock: socket.socket, owner_uid: int | None, proc: str = "/proc") -> str | None:
    """Why nothing may be sent on this connected socket, or None when it may: decided on the very connection, after
    connect() and before any byte (issue 43, rows 1 and 4; a check of the listeners ahead of time leaves a window in
    which another local account can take the port). A peer on another machine is not judged here, nor is anything
    when `owner_uid` is None (no serving account on this machine)."""
    if owner_uid is None:
        return None
    host, port = sock.getpeername()[:2]
    address = ipaddress.ip_address(host.split("%")[0])
    address = getattr(address, "ipv4_mapped", None) or address
    if not _is_local(address):
        return None
    holder = connection_holder(sock, proc)
    if holder == owner_uid:
        return None
    if holder is None:
        return (f"cannot see who holds port {port} on {host} in {proc}/net/tcp: nothing was sent on the connection "
                "(run where /proc/net is visible)")
    return (f"port {port} on {host} is held by {_account(holder)}, not {_account(owner_uid)}: nothing was sent on "
            "the connection (another local account took the port; find it with `ss -ltnp`)")


def _checked_connection(base: type, owner_uid: int, proc: str) -> type:
    """urllib3's connection class `base`, refusing (ListenerRefused) to use a socket whose server end another local
    account holds; checked on the bare TCP socket, before TLS or any header."""

    class Checked(base):
        def _new_conn(self):
            sock = super()._new_conn()
            problem = listener_problem(sock, owner_uid, proc)
            if problem:
                sock.close()
                raise ListenerRefused(problem)
            return sock

    return Checked


def refused_by_owner(error: BaseException) -> str | None:
    """The ListenerRefused text inside a requests/urllib3 error (they wrap it two or three deep), or None."""
    seen = 0
    stack = [error]
    while stack and seen < 20:
        current = stack.pop()
        seen += 1
        if isinstance(current, ListenerRefused):
            return str(current)
        stack += [arg for arg in getattr(current, "args", ()) if isinstance(arg, BaseException)]
        stack += [inner for inner in (getattr(current, "reason", None), current.__cause__, current.__context__)
                  if isinstance(inner, BaseException)]
    return None


def gather(url: str, served_name: str | None, api_key: str | None, timeout: float, http=None,
           ca: str | None = None, owner_uid: int | None = None, proc: str = "/proc") -> dict[str, object]:
    """The pair seen through its API: /health, /v1/models, a one-token generation and /metrics, concurrently.

    With a key, a URL on this machine is asked only when its listener belongs to the serving account (`owner_uid`,
    default the layout's service_user; key_withheld): otherwise the keyed probes answer with the reason and no
    request carries the key."""
    owner = serving_uid() if owner_uid is None else owner_uid
    http = http if http is not None else session(ca, owner_uid=owner, proc=proc)
    headers = auth_headers(api_key)
    withheld = key_withheld(url, owner, proc) if api_key else None

    def health() -> dict[str, object]:
        return request(http, "GET", f"{url}/health", timeout)[0]

    def models() -> dict[str, object]:
        if withheld:
            return {"error": withheld, "withheld": True}
        result, response = request(http, "GET", f"{url}/v1/models", timeout, headers=headers)
        if response is not None and response.ok:
            try:
                result["json"] = response.json()
            except ValueError:
                result["error"] = "the answer is not JSON"
        return result

    def generate() -> dict[str, object]:
        if withheld:
            return {"error": withheld, "withheld": True}
        result, response = request(http, "POST", f"{url}/v1/completions", timeout, headers=headers,
                                   json=one_token_body(served_name))
        if response is not None and response.ok:
            try:
                answer = response.json()
                result["tokens"] = int((answer.get("usage") or {}).get("completion_tokens") or 0)
            except (ValueError, AttributeError, TypeError):
                result["error"] = "the answer is not a completion"
        elif response is not None:
            result["body"] = response.text[:200]
        return result

    def metrics() -> dict[str, object]:
        return read_metrics(url, timeout, http)

    probes = {"health": health, "models": models, "generate": generate, "metrics": metrics}
    if ca and url.startswith("https://"):
        probes["certificate"] = lambda: certificate_expiry(url, ca, timeout)
    results: dict[str, object] = {}
    if served_name is None:
        # The configuration could not be read: ask the server what it serves, then generate with that.
        results["models"] = models()
        listed = (results["models"].get("json") or {}).get("data") or [{}]
        served_name = str(listed[0].get("id") or "")
        del probes["models"]
    with ThreadPoolExecutor(max_workers=len(probes)) as pool:
        futures = {name: pool.submit(probe) for name, probe in probes.items()}
        results.update({name: future.result() for name, future in futures.items()})
    return results
