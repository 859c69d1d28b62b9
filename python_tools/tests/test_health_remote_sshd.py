"""The controller's SSH code path (twinspark.health.remote) against a real OpenSSH server.

The test starts its own sshd in a network namespace it creates (`unshare --net`), so nothing listens on this
machine's network and no packet leaves loopback: the namespace has only `lo`, sshd binds 127.0.0.1 there, and the
client runs inside the same namespace (`nsenter --net`). A private mount namespace gives sshd an empty /run (its
privilege-separation directory /run/sshd) without touching the machine's own /run. Host key and client key are made
for the test; the client checks the host key against a known_hosts file, as it does for a real node. Everything
ends with the test: sshd is stopped by its PID and the namespaces vanish with it.

Needs root (to create the namespaces) and /usr/sbin/sshd (Debian package openssh-server, which `.ci/run` installs);
without them the test is skipped, saying which is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sshd_namespace

PORT = sshd_namespace.PORT


@pytest.fixture
def sshd_in_netns(tmp_path):
    """(pid of sshd, its directory): sshd on 127.0.0.1:PORT inside a namespace of its own."""
    reason = sshd_namespace.missing()
    if reason:
        pytest.skip(reason)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "client_key", "-f",
                    str(tmp_path / "client_key")], check=True, timeout=30)
    (tmp_path / "authorized_keys").write_text((tmp_path / "client_key.pub").read_text())
    with sshd_namespace.running(tmp_path, tmp_path / "authorized_keys", "LogLevel INFO\n") as pid:
        (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{PORT} {sshd_namespace.host_key_line(tmp_path)}\n")
        yield pid, tmp_path


def client(pid: int, directory: Path, body: str) -> subprocess.CompletedProcess:
    """Run Python `body` inside sshd's network namespace with HOME holding the test's known_hosts."""
    prologue = textwrap.dedent(f"""
        import json
        from twinspark import inventory
        from twinspark.health import remote
        node = inventory.Node("node1", "head", "127.0.0.1", {PORT}, "root", {str(directory / "client_key")!r}, False)
    """)
    env = {**os.environ, "HOME": str(directory / "home")}
    return subprocess.run(["nsenter", f"--target={pid}", "--net", "--", sys.executable, "-c",
                           prologue + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=60, check=False, env=env)


def test_a_command_runs_over_ssh_and_its_output_and_status_come_back(sshd_in_netns):
    pid, directory = sshd_in_netns
    done = client(pid, directory, """
        with inventory.Connection(node, timeout=10) as connection:
            first = connection.start("sleep 0.5; echo first; echo oops >&2; exit 3", 20)
            second = connection.start("echo second; ip -o link show | wc -l", 20)
            print(json.dumps({"second": second(), "first": first()}))
    """)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["first"] == [3, "first\n", "oops\n"]
    status, out, _ = outcome["second"]
    assert status == 0 and out.startswith("second\n")
    assert out.split()[1] == "1", "the command ran inside the test's namespace, which has only lo"


def test_the_agent_report_comes_back_as_json_over_ssh(sshd_in_netns):
    """start_agent runs `twinspark health --local --json --no-pair` on the node and parses what it prints; a
    stand-in agent prints its own arguments, so the test sees the exact command line that crossed SSH."""
    pid, directory = sshd_in_netns
    agent = directory / "agent"
    agent.write_text('#!/bin/sh\nprintf \'{"argv": "%s", "node": {"status": "ok"}}\' "$*"\n')
    agent.chmod(0o755)
    done = client(pid, directory, f"""
        import dataclasses
        node = dataclasses.replace(node, twinspark={str(agent)!r})  # the inventory's twinspark_layout_venv
        with inventory.Connection(node, timeout=10) as connection:
            print(json.dumps(remote.start_agent(connection, 5)()))
    """)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"argv": "health --local --json --no-pair --timeout 5 --node node1",
                                      "node": {"status": "ok"}}


def test_a_host_key_that_is_not_the_known_one_is_refused(sshd_in_netns):
    pid, directory = sshd_in_netns
    known = directory / "home" / ".ssh" / "known_hosts"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / "other")], check=True,
                   timeout=30)
    other_type, other_blob = (directory / "other.pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{PORT} {other_type} {other_blob}\n")
    started = time.monotonic()
    done = client(pid, directory, """
        try:
            inventory.Connection(node, timeout=10)
        except Exception as error:
            print(inventory.describe_ssh_error(node, error))
        else:
            print("connected")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"cannot reach root@127.0.0.1:{PORT} over SSH: BadHostKeyException"), done.stdout
    assert time.monotonic() - started < 30
