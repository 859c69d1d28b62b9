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
import hashlib
import ipaddress
import json
import os
import re
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
# Rotation (`twinspark tls running|replace|served`): role key_rotation, tasks/tls.yml
# ---------------------------------------------------------------------------------------------------------------

_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
SERVED_WAIT_S = 30.0


def leaf_fingerprint(pem: bytes) -> str:
    """SHA-256 of the first certificate in a PEM file (the leaf a server presents), as lowercase hex."""
    match = _PEM_CERT.search(pem)
    if match is None:
        raise ValueError("no PEM CERTIFICATE block")
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(match.group(0).decode("ascii"))).hexdigest()


def pair_problem(cert: str, key: str) -> str | None:
    """Why the certificate and key files do not serve together (None: they do), as a server would load them."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as error:
        return f"{key} does not load with {cert} ({getattr(error, 'reason', None) or error})"
    return None


REFRESH_FLAG = "--enable-ssl-refresh"


def running_problem(argv: Sequence[str], cert_dest: str, key_dest: str) -> str | None:
    """Why the running vLLM (its argv) cannot take a new certificate without a restart; None when it can: it must
    serve the installed certificate and key and have been started with --enable-ssl-refresh."""

    def value(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv[:-1] else None

    if value("--ssl-certfile") is None:
        return ("the running vLLM serves plain HTTP (TLS is off on the head): converge with site.yml, which "
                "installs the certificate and restarts the pair once")
    if (value("--ssl-certfile"), value("--ssl-keyfile")) != (cert_dest, key_dest):
        return (f"the running vLLM serves {value('--ssl-certfile')} and {value('--ssl-keyfile')}, not {cert_dest} "
                f"and {key_dest}: converge with site.yml first")
    if REFRESH_FLAG not in argv:
        return (f"the running vLLM was started without {REFRESH_FLAG} (before TwinSpark passed it), so it would "
                "never read new files: restart the pair once, in order (`twinspark restart -i INVENTORY`); later "
                "rotations need no restart")
    return None


def process_argv(pid: int, proc: Path = Path("/proc")) -> list[str]:
    """A process's argv from /proc/PID/cmdline (raises OSError when there is no such process)."""
    return (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]


def write_in_place(path: str, data: bytes) -> None:
    """Replace the content of the existing file `path`, keeping its inode, owner and mode.

    vLLM's certificate refresher (--enable-ssl-refresh) watches the certificate and key files themselves through
    inotify; a file renamed over one (what atomic.write_atomic and Ansible's copy do) ends that watch, so the first
    rotation would be seen and every later one missed (python_tools/tests/test_tls_refresh.py shows both). Writing
    into the same inode keeps the watch. The new bytes are written over the old ones from the start and the file is
    cut to their length only afterwards, never emptied first: a reader sees the old content or the new one, or, while
    a shorter file is cut, the new content with a stale tail, which PEM readers skip; for the trust files the plan
    shortens (the bridge back to the new anchor alone) that tail is the bridge's own end, so every moment's file is
    one of the plan's files (replacement_plan).
    """
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)  # never creates: site.yml made it, with its mode and owner
    try:
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], written)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Replacement:
    """One write into an installed file of the head."""

    dest: str
    data: bytes
    then_wait: bool = False
    """Wait until the server presents the new certificate before the next write."""


def replacement_problems(cert: str, key: str, dests: Mapping[str, str | None], ca: str | None = None) -> list[str]:
    """Everything that stops a rotation before a file is written: the new pair must load together, and each file
    the head must hold (cert, key, and ca exactly when one is given) must already be a regular file there, so that
    rotation writes what site.yml wrote and site.yml has nothing to change afterwards."""
    problems = []
    problem = pair_problem(cert, key)
    if problem:
        problems.append(f"{api.TLS_KEY_VAR}: {problem}; the key must be the new certificate's own")
    for role, source in (("cert", cert), ("key", key), ("ca", ca)):
        dest = dests.get(role)
        if not dest:
            continue
        try:
            info = os.lstat(dest)
        except FileNotFoundError:
            info = None
        if source and (info is None or not stat.S_ISREG(info.st_mode)):
            problems.append(f"{dest} is not installed on this head (TLS is off here, or the CA is new); converge "
                            "with site.yml first (an ordered restart), then rotate")
        elif not source and info is not None:
            problems.append(f"{dest} exists on this head but the inventory names no {role} file; converge with "
                            "site.yml first (it changes the env file and restarts the pair once)")
    return problems


def _joined(first: bytes, second: bytes) -> bytes:
    return first + (b"" if first.endswith(b"\n") else b"\n") + second


def replacement_plan(cert: bytes, key: bytes, ca: bytes | None, current: Mapping[str, bytes],
                     dests: Mapping[str, str]) -> list[Replacement]:
    """The writes that take the head from its current files to the new ones with no failed request, in order.

    vLLM's refresher loads the certificate and key files together on every change. The key goes first: the old
    certificate with the new key fails to load and the old pair keeps serving; after the certificate, both are new.
    (The other order leaves vLLM with the new certificate and no usable key until the key arrives: OpenSSL drops a
    key that does not match a newly set certificate.)

    The head's probes verify the server against a trust file: the CA file, or the certificate file itself when no
    CA is set (api.tls_ca). A changed trust file first holds the new anchor and the old one together (a bridge),
    until the server presents the new certificate; only then does it get its final content. Without a CA the
    certificate file is the bridge: vLLM serves the new certificate with the old one as an extra chain member, which
    clients ignore. Files already holding their new content are left alone; nothing to do is an empty plan.
    """
    new = {"ca": ca, "key": key, "cert": cert}
    if all(current.get(role) == data for role, data in new.items() if data is not None):
        return []
    trust = "ca" if ca is not None else "cert"
    bridged = current.get(trust) != new[trust]
    steps = []
    if trust == "ca" and bridged:
        steps.append(Replacement(dests["ca"], _joined(ca, current["ca"])))  # type: ignore[arg-type]
    if current.get("key") != key:
        steps.append(Replacement(dests["key"], key))
    if current.get("cert") != cert:
        data = _joined(cert, current["cert"]) if trust == "cert" and bridged else cert
        steps.append(Replacement(dests["cert"], data, then_wait=bridged))
    elif bridged:
        steps[-1] = Replacement(steps[-1].dest, steps[-1].data, then_wait=True)
    if bridged:
        steps.append(Replacement(dests[trust], new[trust]))  # type: ignore[arg-type]
    return steps


def replace(cert: str, key: str, dests: Mapping[str, str], ca: str | None = None, dry_run: bool = False,
            served: tuple[str, int] | None = None, wait_s: float = 30.0) -> dict[str, object]:
    """Rotate the head's installed files to the new ones (controller copies staged on the head), in place, waiting
    (at most wait_s) at a bridge until `served` (host, port) presents the new certificate.

    Raises ValueError with every problem before any write, RuntimeError when the server did not take the new
    certificate in time (the trust file then still holds the bridge)."""
    problems = replacement_problems(cert, key, dests, ca)
    if problems:
        raise ValueError("\n".join(problems))
    sources = {"cert": Path(cert).read_bytes(), "key": Path(key).read_bytes(),
               "ca": Path(ca).read_bytes() if ca else None}
    current = {role: Path(dest).read_bytes() for role, dest in dests.items() if dest and sources.get(role)}
    plan = replacement_plan(sources["cert"], sources["key"], sources["ca"], current, dests)  # type: ignore[arg-type]
    fingerprint = leaf_fingerprint(sources["cert"])  # type: ignore[arg-type]
    if any(step.then_wait for step in plan) and served is None and not dry_run:
        raise ValueError("the new certificate changes the probes' trust file: give the API's address (--port) so "
                         "that the old anchor is kept until the new certificate is served")
    if not dry_run:
        for step in plan:
            write_in_place(step.dest, step.data)
            if step.then_wait and served is not None:
                report = wait_served(*served, fingerprint, wait_s)
                if not report["ok"]:
                    why = f"; {report['error']}" if report["error"] else ""
                    raise RuntimeError(
                        f"{served[0]}:{served[1]} still serves {report['served'] or 'nothing'} after {wait_s:g} s, "
                        f"not the new certificate ({fingerprint}){why}. {step.dest} holds the old and the new "
                        "anchor; rerun the rotation once the server takes the new files (site.yml would write "
                        "the final file and restart the pair)")
    return {"changed": bool(plan), "written": [step.dest for step in plan], "dry_run": dry_run,
            "fingerprint": fingerprint, "previous": leaf_fingerprint(current["cert"])}


def served_fingerprint(host: str, port: int, timeout: float) -> str:
    """SHA-256 of the leaf certificate the TLS server at host:port presents. Not verified: the caller compares it
    with a file; what a client trusts is proven by a verified request afterwards."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=timeout) as raw, \
            context.wrap_socket(raw, server_hostname=host) as conn:
        der = conn.getpeercert(binary_form=True)
    if not der:
        raise ssl.SSLError("the server presented no certificate")
    return hashlib.sha256(der).hexdigest()


def wait_served(host: str, port: int, wanted: str, wait_s: float, clock=time.monotonic, sleep=time.sleep,
                look=served_fingerprint) -> dict[str, object]:
    """Wait (at most wait_s) until host:port presents the certificate whose SHA-256 is `wanted`: {"served",
    "wanted", "ok", "waited_s", "error"}."""
    start = clock()
    served, error = None, None
    while True:
        try:
            served, error = look(host, port, 5.0), None
        except (OSError, ValueError) as failure:
            error = f"{failure.__class__.__name__}: {failure}"
        if served == wanted or clock() - start >= wait_s:
            break
        sleep(0.2)
    return {"served": served, "wanted": wanted, "ok": served == wanted, "waited_s": round(clock() - start, 2),
            "error": error}


def cmd_replace(args: argparse.Namespace) -> int:
    dests = {"cert": args.into_cert, "key": args.into_key, "ca": args.into_ca}
    try:
        report = replace(args.cert, args.key, dests, args.ca, dry_run=args.dry_run,
                         served=(args.host, args.port) if args.port else None, wait_s=args.wait)
    except ValueError as error:
        for line in str(error).splitlines():
            print(f"twinspark tls replace: {line}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as error:
        print(f"twinspark tls replace: {error}", file=sys.stderr)
        return 1
    print(json.dumps(report))
    return 0


def cmd_running(args: argparse.Namespace) -> int:
    try:
        argv = process_argv(args.pid) if args.pid > 0 else []
    except OSError:
        argv = []
    if not argv:
        print(f"twinspark tls running: no process {args.pid}: the head rank is not running, so nothing serves a "
              "certificate to rotate; converge with site.yml (it installs the files and starts the pair)",
              file=sys.stderr)
        return 2
    problem = running_problem(argv, args.cert, args.key)
    if problem:
        print(f"twinspark tls running: {problem}. Nothing was changed.", file=sys.stderr)
        return 2
    print(json.dumps({"pid": args.pid, "refresh": True, "cert": args.cert, "key": args.key}))
    return 0


def cmd_served(args: argparse.Namespace) -> int:
    try:
        report = wait_served(args.host, args.port, leaf_fingerprint(Path(args.cert).read_bytes()), args.wait)
    except (OSError, ValueError) as error:
        print(f"twinspark tls served: {args.cert}: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    if not report["ok"]:
        why = f"; {report['error']}" if report["error"] else ""
        print(f"twinspark tls served: {args.host}:{args.port} still serves {report['served'] or 'nothing'} after "
              f"{args.wait:g} s, not {args.cert} ({report['wanted']}){why}. Was vLLM started with "
              "--enable-ssl-refresh, and do the files hold what vLLM can load?", file=sys.stderr)
        return 1
    return 0


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


def name_constraints(names: Sequence[str]) -> str:
    """openssl's nameConstraints permitting exactly the certificate's own names (each address as a single host):
    its key, which the serving account can read, can then sign for nothing else (issue 43)."""
    permitted = []
    for entry in subject_alt_names(names).split(","):
        kind, value = entry.split(":", 1)
        if kind == "IP":
            address = ipaddress.ip_address(value)
            mask = ipaddress.ip_address((1 << address.max_prefixlen) - 1)
            permitted.append(f"permitted;IP:{address}/{mask}")
        else:
            permitted.append(f"permitted;DNS:{value}")
    return "critical," + ",".join(permitted)


def make_cert_argv(cert: Path | str, key: Path | str, names: Sequence[str], days: int, openssl: str = "openssl",
                   subject: str = "twinspark-pair") -> list[str]:
    """Self-signed, its own CA (clients trust it as the CA file), but a CA for its own names only (name constraints)
    and for no CA below it (pathlen 0). Also the router's admin certificate (role router, made on the router host)."""
    return [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", str(days), "-subj", f"/CN={subject}",
            "-addext", f"subjectAltName={subject_alt_names(names)}",
            "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext", f"nameConstraints={name_constraints(names)}",
            "-addext", "keyUsage=digitalSignature,keyCertSign"]


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
    parser = subparsers.add_parser("tls", help="the API's optional TLS (a self-signed test certificate; rotation's "
                                               "head steps)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    make = verbs.add_parser("make-cert", help="write a self-signed certificate and key for the pair's API (tests, "
                                              "the simulated pair; a real pair should use its own CA)")
    make.add_argument("--cert", required=True, metavar="FILE", help="where to write the certificate (PEM)")
    make.add_argument("--key", required=True, metavar="FILE", help="where to write the key (PEM, mode 0600)")
    make.add_argument("--name", action="append", metavar="HOST",
                      help="a host name or address clients dial (repeat; 127.0.0.1, ::1 and localhost are added)")
    make.add_argument("--days", type=int, default=30, help="validity in days (default 30)")
    make.set_defaults(func=cmd_make_cert)

    rep = verbs.add_parser("replace", help="rotation, on the head: write a new certificate and key (and CA) into the "
                                           "installed files in place, key before certificate (role key_rotation)")
    rep.add_argument("--cert", required=True, metavar="FILE", help="the new certificate (PEM)")
    rep.add_argument("--key", required=True, metavar="FILE", help="its key (PEM)")
    rep.add_argument("--ca", metavar="FILE", help="the new CA file, when the inventory names one")
    rep.add_argument("--into-cert", required=True, metavar="FILE", help="the installed certificate vLLM serves")
    rep.add_argument("--into-key", required=True, metavar="FILE", help="the installed key")
    rep.add_argument("--into-ca", metavar="FILE", help="the installed CA file (checked absent when --ca is not given)")
    rep.add_argument("--host", default="127.0.0.1", help="the API's address, to wait at the bridge (default 127.0.0.1)")
    rep.add_argument("--port", type=int, help="the API's port: the old anchor is kept until the new certificate is "
                                              "served there")
    rep.add_argument("--wait", type=float, default=SERVED_WAIT_S, metavar="S",
                     help=f"give up waiting after S seconds (default {SERVED_WAIT_S:g})")
    rep.add_argument("--dry-run", action="store_true", help="check and say what would change; write nothing")
    rep.set_defaults(func=cmd_replace)

    running = verbs.add_parser("running", help="rotation, on the head: refuse unless the running vLLM (PID) serves "
                                               "these files and reloads them (--enable-ssl-refresh)")
    running.add_argument("--pid", type=int, required=True, help="the rank's main process (systemd's MainPID)")
    running.add_argument("--cert", required=True, metavar="FILE", help="the installed certificate")
    running.add_argument("--key", required=True, metavar="FILE", help="the installed key")
    running.set_defaults(func=cmd_running)

    served = verbs.add_parser("served", help="wait until a TLS server presents the certificate in a file")
    served.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    served.add_argument("--port", type=int, required=True, help="the API port")
    served.add_argument("--cert", required=True, metavar="FILE", help="the certificate expected (its first block)")
    served.add_argument("--wait", type=float, default=SERVED_WAIT_S, metavar="S",
                        help=f"give up after S seconds (default {SERVED_WAIT_S:g})")
    served.set_defaults(func=cmd_served)
