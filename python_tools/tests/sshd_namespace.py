"""A real OpenSSH server for a test, in network and mount namespaces of the test's own.

`unshare --net --mount`: the namespace has only `lo`, sshd binds 127.0.0.1:PORT there, so nothing listens on this
machine's network and no packet leaves loopback; clients reach it with `nsenter --target=PID --net`. The private
mount namespace gives sshd an empty /run (its privilege-separation directory /run/sshd) and, where the machine has
no `sshd` account, one in a bind-mounted copy of /etc/passwd, without touching the machine's own files. sshd is
stopped by its PID when the test ends (after its per-connection processes are gone), and the namespaces vanish with
it. Used by test_health_remote_sshd.py and test_key_rotation.py.

Needs root and /usr/sbin/sshd (Debian's openssh-server, which `.ci/run` installs; TWINSPARK_TEST_SSHD points at
another binary); `missing()` says which is absent, for the tests to skip with.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fileload import stop

SSHD = Path(os.environ.get("TWINSPARK_TEST_SSHD", "/usr/sbin/sshd"))
PORT = 2222  # a fresh namespace: every port is free
READY_S = 20


def missing(tools: tuple[str, ...] = ("unshare", "nsenter", "ssh-keygen", "ip")) -> str | None:
    """Why a real sshd cannot run here, or None."""
    if os.geteuid() != 0:
        return "creating a network namespace needs root"
    if not SSHD.is_file():
        return (f"{SSHD} is missing: install openssh-server (.ci/run does), or point TWINSPARK_TEST_SSHD at an "
                "sshd binary")
    for tool in tools:
        if shutil.which(tool) is None:
            return f"{tool} is missing (util-linux / openssh-client / iproute2)"
    return None


def host_key_line(directory: Path) -> str:
    """`type blob` of the host key `running` made in `directory`, for a known_hosts line."""
    return " ".join((directory / "host_key.pub").read_text().split()[:2])


@contextlib.contextmanager
def running(directory: Path, authorized_keys: Path, extra_config: str = "") -> Iterator[int]:
    """sshd on 127.0.0.1:PORT with a host key of its own (`directory`/host_key), yielding its pid."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "host", "-f", str(directory / "host_key")],
                   check=True, timeout=30)
    config = directory / "sshd_config"
    config.write_text(textwrap.dedent(f"""\
        ListenAddress 127.0.0.1:{PORT}
        HostKey {directory / "host_key"}
        AuthorizedKeysFile {authorized_keys}
        PidFile none
        StrictModes no
        UsePAM no
        PermitRootLogin prohibit-password
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        PubkeyAuthentication yes
        """) + textwrap.dedent(extra_config))
    passwd = directory / "passwd"
    passwd.write_text(Path("/etc/passwd").read_text() + "sshd:x:65534:65534::/run/sshd:/usr/sbin/nologin\n")
    script = ("mount -t tmpfs -o mode=755 tmpfs /run && mkdir -m 755 /run/sshd && ip link set lo up && "
              f"{{ getent passwd sshd >/dev/null || mount --bind {passwd} /etc/passwd; }} && "
              f"exec {SSHD} -D -e -f {config}")
    process = subprocess.Popen(["unshare", "--net", "--mount", "--", "sh", "-c", script],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    ready = threading.Event()

    def follow() -> None:
        for line in process.stderr:
            log.append(line.rstrip())
            if "Server listening on 127.0.0.1" in line:
                ready.set()

    threading.Thread(target=follow, daemon=True).start()
    try:
        if not ready.wait(READY_S):
            pytest.fail(f"sshd did not listen within {READY_S} s (exit {process.poll()}): {log[-5:]}")
        yield process.pid
    finally:
        _wait_for_sessions_to_end(process.pid)
        stop(process)


def _wait_for_sessions_to_end(pid: int, limit_s: float = 10) -> None:
    """Let sshd reap its per-connection processes first: stopped earlier, it would leave them to PID 1."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if not children.read_text().split():
                return
        except OSError:
            return
        time.sleep(0.1)
