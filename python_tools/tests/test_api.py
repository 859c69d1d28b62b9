"""twinspark.api: the one home of the head's API URL, key, TLS choice and probes; and a real TLS round trip.

The TLS tests start a small https server on 127.0.0.1 (loopback only) with a certificate made here by
`twinspark tls make-cert` (openssl), serving test_health_gather's FakeVllmApi stand-in, and prove that every client
path verifies it: the right CA passes, another CA fails with one line naming the file and the fix.
"""

from __future__ import annotations

import shutil
import ssl
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from test_health_gather import FakeVllmApi

from twinspark import api, cli, tls
from twinspark.health import checks
from twinspark.pair import io as pair_io
from twinspark.pair import rules

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")


# ---- rules ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("host", "port", "tls_on", "url"), [
    ("0.0.0.0", "8888", False, "http://127.0.0.1:8888"),
    ("", 8888, True, "https://127.0.0.1:8888"),
    ("::", "08080", True, "https://[::1]:8080"),
    ("fd00::5", 1, False, "http://[fd00::5]:1"),
    ("head.example", 8888, True, "https://head.example:8888"),
])
def test_base_url_scheme_host_and_port(host, port, tls_on, url):
    assert api.base_url(host, port, tls=tls_on) == url


def test_tls_is_off_until_a_certificate_is_named_and_the_ca_defaults_to_the_certificate():
    plain = {"VLLM_HOST": "0.0.0.0", "VLLM_PORT": "8888", "SERVED_MODEL_NAME": "m"}
    assert api.tls_ca(plain) is None
    assert api.url_from_env(plain) == "http://127.0.0.1:8888"
    self_signed = {**plain, "TWINSPARK_VLLM_TLS_CERT": "/etc/twinspark/tls/server.crt",
                   "TWINSPARK_VLLM_TLS_KEY": "/etc/twinspark/tls/server.key"}
    assert api.tls_ca(self_signed) == "/etc/twinspark/tls/server.crt"
    assert api.url_from_env(self_signed) == "https://127.0.0.1:8888"
    with_ca = {**self_signed, "TWINSPARK_VLLM_TLS_CA": "/etc/twinspark/tls/ca.crt"}
    head = api.api_from_env(with_ca)
    assert (head.url, head.ca, head.tls) == ("https://127.0.0.1:8888", "/etc/twinspark/tls/ca.crt", True)
    assert api.tls_ca({**plain, "TWINSPARK_VLLM_TLS_CA": "/ca"}) is None, "a CA alone does not turn TLS on"


def test_the_controller_verifies_against_its_own_copies_named_in_the_inventory():
    assert api.tls_ca_from_inventory({}) is None
    assert api.tls_ca_from_inventory({"twinspark_vllm_tls_cert": "/inv/server.crt"}) == "/inv/server.crt"
    assert api.tls_ca_from_inventory({"twinspark_vllm_tls_cert": "/inv/server.crt",
                                      "twinspark_vllm_tls_ca": "/inv/ca.crt"}) == "/inv/ca.crt"


def test_key_choice_is_the_first_key_and_stays_out_of_repr():
    assert api.first_key({"DSPARK_API_KEYS": "  k1\tk2"}) == "k1"
    assert api.first_key({"VLLM_API_KEY": "solo", "DSPARK_API_KEYS": "other"}) == "solo"
    assert api.first_key({"VLLM_API_KEY": " "}) is None
    head = api.api_from_env({"SERVED_MODEL_NAME": "m", "VLLM_API_KEY": "sekrit"})
    assert head.headers() == {"Authorization": "Bearer sekrit"}
    assert "sekrit" not in repr(head)


def test_the_url_reaches_a_wildcard_bind_on_loopback_and_says_https_with_tls():
    assert api.base_url("::", 1) == "http://[::1]:1"
    assert api.base_url("0.0.0.0", 1, tls=True) == "https://127.0.0.1:1"


def test_the_one_token_probe_body():
    assert api.one_token_body("tiny") == {"model": "tiny", "prompt": "Hello", "max_tokens": 1, "temperature": 0}


def test_a_verification_failure_is_one_line_naming_the_file_and_the_fix():
    error = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                                            "self-signed certificate (_ssl.c:1006)")
    line = api.describe_error(error, "/inv/ca.crt")
    assert line.startswith("TLS: the server's certificate does not verify against /inv/ca.crt (self-signed "
                           "certificate)")
    assert "twinspark_vllm_tls_ca" in line and "\n" not in line


# ---- a real TLS round trip on loopback -------------------------------------------------------------------------


def make_pair(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    assert cli.main(["tls", "make-cert", "--cert", str(cert), "--key", str(key), "--days", "1"]) == 0
    return cert, key


class QuietTLSServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client refusing our certificate aborts the handshake: expected in these tests


@pytest.fixture
def https_api(tmp_path):
    """(base URL, the server's self-signed certificate, another certificate that did not sign it)."""
    cert, key = make_pair(tmp_path, "server")
    other, _ = make_pair(tmp_path, "other")
    FakeVllmApi.seen_auth = []
    FakeVllmApi.generate_status = 200
    server = QuietTLSServer(("127.0.0.1", 0), FakeVllmApi)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", cert, other
    server.shutdown()
    server.server_close()


@needs_openssl
def test_make_cert_writes_a_private_key_and_a_certificate_naming_loopback(tmp_path):
    cert, key = make_pair(tmp_path, "pair")
    assert key.stat().st_mode & 0o777 == 0o600
    assert b"BEGIN CERTIFICATE" in cert.read_bytes()
    assert "IP:127.0.0.1" in tls.subject_alt_names([]) and "IP:10.0.0.1" in tls.subject_alt_names(["10.0.0.1"])
    assert tls.controller_problems({"twinspark_vllm_tls_cert": str(cert), "twinspark_vllm_tls_key": str(key)}) == []


@needs_openssl
def test_the_probe_passes_over_https_with_the_right_ca(https_api, monkeypatch):
    url, cert, _ = https_api
    # requests would let this variable replace the session's CA; api.session keeps the named CA the only anchor.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", ssl.get_default_verify_paths().openssl_cafile)
    pair = api.gather(url, "tiny", "sekrit", timeout=5, ca=str(cert))
    results = checks.pair_checks(url, pair, "tiny", 512, 5)
    assert [r.status for r in results] == [checks.OK] * 4, results
    assert pair["generate"]["tokens"] == 1
    assert api.read_metrics(url, 5, ca=str(cert)).get("running") is not None


@needs_openssl
def test_the_probe_fails_with_a_clear_line_against_the_wrong_ca(https_api):
    url, _, other = https_api
    pair = api.gather(url, "tiny", "sekrit", timeout=5, ca=str(other))
    error = str(pair["generate"]["error"])
    assert error.startswith(f"TLS: the server's certificate does not verify against {other} ("), error
    assert "set twinspark_vllm_tls_ca" in error
    assert checks.pair_checks(url, pair, "tiny", 512, 5)[2].status == checks.FAILED
    assert api.read_metrics(url, 5, ca=str(other))["unreachable"] is True
    assert FakeVllmApi.seen_auth == [], "no key may leave before the server is verified"


@needs_openssl
def test_plain_http_to_the_tls_port_gets_no_answer(https_api):
    url, _, _ = https_api
    pair = api.gather(url.replace("https://", "http://"), "tiny", "sekrit", timeout=5)
    assert "tokens" not in pair["generate"] and pair["generate"].get("status_code") is None


@needs_openssl
def test_the_pair_guard_probes_over_https_from_the_env_files(https_api, tmp_path):
    url, cert, other = https_api
    port = url.rsplit(":", 1)[1]
    env = {"VLLM_HOST": "127.0.0.1", "VLLM_PORT": port, "SERVED_MODEL_NAME": "tiny", "MAX_MODEL_LEN": "512",
           "VLLM_API_KEY": "sekrit", "TWINSPARK_VLLM_TLS_CERT": str(cert), "TWINSPARK_VLLM_TLS_KEY": "/unused"}
    good = pair_io.LivePair(api=api.api_from_env(env), worker_addresses=[])
    assert good.probe(5)[0] is rules.Generation.OK
    assert good.sample(5).counted
    bad = pair_io.LivePair(api=api.api_from_env({**env, "TWINSPARK_VLLM_TLS_CA": str(other)}), worker_addresses=[])
    probe, detail = bad.probe(5)
    assert probe is not rules.Generation.OK and "does not verify" in detail


@needs_openssl
def test_twinspark_health_local_pair_passes_over_https(https_api, tmp_path, capsys):
    url, cert, other = https_api
    port = url.rsplit(":", 1)[1]
    env_file = tmp_path / "serve.env"
    lines = {"TWINSPARK_PROFILE": "cpu", "NODE_RANK": "0", "VLLM_HOST": "127.0.0.1", "VLLM_PORT": port,
             "SERVED_MODEL_NAME": "tiny", "MAX_MODEL_LEN": "512", "VLLM_API_KEY": "sekrit",
             "TWINSPARK_VLLM_TLS_CERT": str(cert), "TWINSPARK_VLLM_TLS_KEY": "/unused"}
    env_file.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    assert cli.main(["health", "--local", "--pair", "--env", str(env_file)]) == 0, capsys.readouterr().out
    env_file.write_text(env_file.read_text() + f"TWINSPARK_VLLM_TLS_CA={other}\n")
    assert cli.main(["health", "--local", "--pair", "--env", str(env_file)]) == 2
    assert "does not verify against" in capsys.readouterr().out


@needs_openssl
def test_the_head_textfile_says_when_the_served_certificate_expires(https_api, tmp_path, capsys):
    """The figure TwinSparkCertExpiring reads: the certificate the API serves (make-cert --days 1), verified against
    the CA; against the wrong CA the sweep has no figure to give (and fails the pair's checks, saying why)."""
    from prometheus_client.parser import text_string_to_metric_families

    url, cert, other = https_api
    env = {"VLLM_HOST": "127.0.0.1", "VLLM_PORT": url.rsplit(":", 1)[1], "SERVED_MODEL_NAME": "tiny",
           "TWINSPARK_VLLM_TLS_CERT": str(cert), "TWINSPARK_VLLM_TLS_KEY": "/unused"}
    env_file, prom = tmp_path / "serve.env", tmp_path / "twinspark.prom"

    def expiry(ca_line: str) -> list[float]:
        env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()) + ca_line)
        cli.main(["health", "--local", "--pair", "--env", str(env_file), "--prom-file", str(prom)])
        return [s.value for family in text_string_to_metric_families(prom.read_text()) for s in family.samples
                if s.name == "twinspark_tls_cert_expiry_timestamp_seconds"]

    [not_after] = expiry("")
    assert 23 * 3600 < not_after - time.time() <= 24 * 3600 + 60
    assert expiry(f"TWINSPARK_VLLM_TLS_CA={other}\n") == []
    assert "certificate" not in api.gather(url.replace("https://", "http://"), "tiny", None, timeout=5)
    capsys.readouterr()


@needs_openssl
def test_bench_lists_models_over_https_only_with_the_right_ca(https_api, capsys):
    url, _, other = https_api
    assert cli.main(["bench", "--url", url, "--ca", str(other), "--concurrency", "1"]) == 1
    err = capsys.readouterr().err
    assert "cannot list models" in err and f"does not verify against {other}" in err


class ChatApi(FakeVllmApi):
    """FakeVllmApi plus the one chat route the demo's chat-once.py asks."""

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            return super().do_POST()
        if not self._authorised():
            return self._send(401, '{"error": "Unauthorized"}')
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(200, '{"choices": [{"message": {"content": "hello"}}], "usage": {"prompt_tokens": 3, '
                        '"completion_tokens": 1}}')


@needs_openssl
def test_the_demo_chat_speaks_https_with_the_ca_it_is_given(tmp_path):
    import subprocess
    import sys

    cert, key = make_pair(tmp_path, "server")
    other, _ = make_pair(tmp_path, "other")
    server = QuietTLSServer(("127.0.0.1", 0), ChatApi)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = Path(__file__).resolve().parents[2] / "scripts" / "sim" / "chat-once.py"
    url = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        def chat(ca: Path) -> subprocess.CompletedProcess:
            env = {"PATH": "/usr/bin:/bin", "TWINSPARK_API_KEY": "sekrit", "TWINSPARK_API_CA": str(ca)}
            return subprocess.run([sys.executable, str(script), url, "hi"], capture_output=True, text=True,
                                  timeout=60, env=env, check=False)

        good = chat(cert)
        assert good.returncode == 0, good.stderr
        assert "answer:   'hello'" in good.stdout and "sekrit" not in good.stdout + good.stderr
        bad = chat(other)
        assert bad.returncode == 1
        assert f"does not verify against {other}" in bad.stderr
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("env", "expected"), [
    ({"DSPARK_API_KEYS": "k1  k2"}, ["k1", "k2"]),
    ({"VLLM_API_KEY": " only "}, ["only"]),
    ({"VLLM_API_KEY": "  ", "DSPARK_API_KEYS": "k1 k2"}, ["k1", "k2"]),  # blank means unset
    ({}, []),
])
def test_the_launcher_serves_the_keys_the_probes_choose_from(env, expected):
    from twinspark import launcher

    assert launcher.api_keys(env) == api.keys(env) == expected
    assert api.first_key(env) == (expected[0] if expected else None)
