"""A rendered nftables table loaded by the real nft in a network namespace of the test's own, and who may connect.

Each try runs the system's python3 as one account (setpriv) and connects to one port on 127.0.0.1, where a listener
of root's waits: the answer is "connected" or the error's name (ConnectionRefusedError for a reset).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

NFT = shutil.which("nft") or "/usr/sbin/nft"
PYTHON = "/usr/bin/python3"  # the system's: the accounts below may not read the venv or a home
CONNECT = ("import socket, sys\n"
           "try:\n"
           "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).close()\n"
           "    print('connected')\n"
           "except OSError as error:\n"
           "    print(type(error).__name__)\n")
LISTEN = ("import socket, sys, time\n"
          "servers = []\n"
          "for port in sys.argv[1:]:\n"
          "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "    s.bind(('127.0.0.1', int(port))); s.listen(8); servers.append(s)\n"
          "time.sleep(30)\n")

needs_nft_namespace = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv")
    or not os.access(NFT, os.X_OK) or not os.access(PYTHON, os.X_OK),
    reason="needs root, unshare, setpriv, nft, the system's python3 (a network namespace of its own)")


def connections(table: Path, listen: Sequence[int], tries: Iterable[tuple[str, str, str, int]]) -> dict[str, str]:
    """Load `table`, listen on `listen`, and for each (label, user, group, port) connect as that account:
    {label: "connected" or the error's name}."""
    as_user = "setpriv --reuid={0} --regid={1} --clear-groups " + PYTHON + " -I -c " + shlex.quote(CONNECT)
    probes = "\n".join(f'echo "{label} $({as_user.format(user, group)} {port})"'
                       for label, user, group, port in tries)
    script = f"""
        set -u
        ip link set lo up
        {NFT} -f {table} || exit 10
        {PYTHON} -I -c {shlex.quote(LISTEN)} {' '.join(str(port) for port in listen)} & listener=$!
        sleep 1
        {probes}
        kill $listener
    """
    done = subprocess.run(["unshare", "-n", "bash", "-c", script], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
