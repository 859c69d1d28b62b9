"""The API's optional TLS, on the controller: checking the files the inventory names, and making a test pair cert.

`file_problem` is a pure rule over what `os.stat` and a short read saw; `controller_problems` is the I/O edge the
inventory validation play runs (through filter_plugins/twinspark.py) before any host is touched, so a missing,
oversized or mismatched certificate stops site.yml with one line naming the variable and the fix. `installed_files`
tells role serve_env which files go where on the head.

`twinspark tls make-cert` writes a self-signed certificate and key for tests and the simulated pair with the
`openssl` command (this project's venv has no `cryptography`); a real pair should use a certificate from its own CA.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import ssl
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from twinspark import api, settings
from twinspark.settings import Knob, Registry


def installed_knobs(registry: Registry | None = None) -> list[Knob]:
    registry = registry or settings.load()
    return [knob for knob in registry.knobs if knob.installed_as is not None]


def file_problem(knob: Knob, path: str, mode: int | None, size: int | None, head: bytes) -> str | None:
    """What is wrong with the controller file `path` for `knob`, from its stat (None: does not exist) and its first
    bytes; None when it is usable."""
    assert knob.installed_as is not None
    spec = knob.installed_as
    if mode is None:
        return f"{knob.var}: {path} does not exist on the controller; fix the path, or unset it"
    if not stat.S_ISREG(mode):
        return f"{knob.var}: {path} is not a regular file; point it at the PEM file itself"
    if size is not None and size > spec.max_bytes:
        return (f"{knob.var}: {path} is {size} bytes, more than the {spec.max_bytes} a PEM {spec.pem.lower()} "
                "needs; point it at the right file")
    if f"-----BEGIN {spec.pem}".encode() not in head and not (
            spec.pem == "PRIVATE KEY" and b"PRIVATE KEY-----" in head):
        return f"{knob.var}: {path} holds no PEM {spec.pem} block (-----BEGIN {spec.pem}-----); point it at one"
    if spec.pem == "PRIVATE KEY" and b"ENCRYPTED" in head:
        return (f"{knob.var}: {path} is an encrypted key; vLLM cannot ask for its passphrase, so write it "
                "unencrypted (openssl pkey -in KEY -out PLAIN) and keep the controller copy private")
    return None


def _look(path: str, limit: int) -> tuple[int | None, int | None, bytes]:
    try:
        info = os.stat(path)
    except OSError:
        return None, None, b""
    head = b""
    if stat.S_ISREG(info.st_mode) and info.st_size <= limit:
        try:
            with open(path, "rb") as handle:
                head = handle.read(limit)
        except OSError:
            head = b""
    return info.st_mode, info.st_size, head


def controller_problems(head_vars: Mapping[str, object], registry: Registry | None = None) -> list[str]:
    """Every problem of the TLS files the head's inventory names, looked at on the controller (empty: usable, or
    TLS off). The certificate and key are also loaded together, so a key that does not match says so here."""
    problems = []
    paths: dict[str, str] = {}
    for knob in installed_knobs(registry):
        text = str(head_vars.get(knob.var) or "").strip()
        if not text or not text.startswith("/"):
            continue  # unset, or a relative path the env rules already name
        assert knob.installed_as is not None
        problem = file_problem(knob, text, *_look(text, knob.installed_as.max_bytes))
        if problem:
            problems.append(problem)
        else:
            paths[knob.var] = text
    cert, key = paths.get(api.TLS_CERT_VAR), paths.get(api.TLS_KEY_VAR)
    if cert and key:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as error:
            problems.append(f"{api.TLS_KEY_VAR}: {key} does not load with {cert} ({error.__class__.__name__}: "
                            f"{getattr(error, 'reason', None) or error}); the key must be the certificate's own")
    ca = paths.get(api.TLS_CA_VAR)
    if ca:
        try:
            ssl.create_default_context(cafile=ca)
        except (ssl.SSLError, OSError) as error:
            problems.append(f"{api.TLS_CA_VAR}: {ca} does not load as CA certificates ({error}); point it at the "
                            "PEM CA file")
    return problems


def installed_files(host_vars: Mapping[str, object], node_env: Mapping[str, str],
                    registry: Registry | None = None) -> list[dict[str, object]]:
    """For role serve_env: each installed_as file as {var, src, dest, mode}; src is None where this node must not
    hold it (the worker, or TLS off), so the role removes a stale copy."""
    out = []
    for knob in installed_knobs(registry):
        assert knob.installed_as is not None
        held = bool(node_env.get(knob.env))
        src = str(host_vars.get(knob.var) or "").strip() if held else ""
        out.append({"var": knob.var, "src": src or None, "dest": knob.installed_as.path,
                    "mode": knob.installed_as.mode})
    return out


# ---------------------------------------------------------------------------------------------------------------
# `twinspark tls make-cert`
# ---------------------------------------------------------------------------------------------------------------


def subject_alt_names(names: Sequence[str]) -> str:
    """openssl's subjectAltName for host names and addresses (loopback always included: the head probes itself)."""
    entries: list[str] = []
    for name in [*names, "127.0.0.1", "::1", "localhost"]:
        try:
            entry = f"IP:{ipaddress.ip_address(name)}"
        except ValueError:
            entry = f"DNS:{name}"
        if entry not in entries:
            entries.append(entry)
    return ",".join(entries)


def make_cert_argv(cert: Path, key: Path, names: Sequence[str], days: int, openssl: str = "openssl") -> list[str]:
    return [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", str(days), "-subj", "/CN=twinspark-pair",
            "-addext", f"subjectAltName={subject_alt_names(names)}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=digitalSignature,keyCertSign"]


def make_cert(cert: Path, key: Path, names: Sequence[str], days: int = 30) -> None:
    """Write a self-signed certificate (its own CA) and its key, the key 0600. Raises RuntimeError naming the fix."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the openssl command is not installed on this machine; apt-get install openssl")
    cert.parent.mkdir(parents=True, exist_ok=True)
    key.parent.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)
    try:
        done = subprocess.run(make_cert_argv(cert, key, names, days, openssl), capture_output=True, text=True,
                              timeout=60, check=False)
    finally:
        os.umask(old)
    if done.returncode != 0:
        raise RuntimeError(f"openssl req failed (exit {done.returncode}): "
                           f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    key.chmod(0o600)
    cert.chmod(0o644)


def cmd_make_cert(args: argparse.Namespace) -> int:
    try:
        make_cert(Path(args.cert), Path(args.key), args.name or [], args.days)
    except (RuntimeError, OSError) as error:
        print(f"twinspark tls make-cert: {error}", file=sys.stderr)
        return 1
    print(f"certificate {args.cert} (also its own CA), key {args.key}: names "
          f"{subject_alt_names(args.name or [])}, valid {args.days} days")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tls", help="the API's optional TLS (make a self-signed test certificate)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    make = verbs.add_parser("make-cert", help="write a self-signed certificate and key for the pair's API (tests, "
                                              "the simulated pair; a real pair should use its own CA)")
    make.add_argument("--cert", required=True, metavar="FILE", help="where to write the certificate (PEM)")
    make.add_argument("--key", required=True, metavar="FILE", help="where to write the key (PEM, mode 0600)")
    make.add_argument("--name", action="append", metavar="HOST",
                      help="a host name or address clients dial (repeat; 127.0.0.1, ::1 and localhost are added)")
    make.add_argument("--days", type=int, default=30, help="validity in days (default 30)")
    make.set_defaults(func=cmd_make_cert)
