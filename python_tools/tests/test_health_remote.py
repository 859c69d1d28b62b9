"""The controller's view of the pair: the inventory read with Ansible's own API, and the merged sweep."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from twinspark import inventory
from twinspark.health import command, remote

ROOT = Path(__file__).resolve().parents[2]

INVENTORY = """\
all:
  children:
    twinspark_pair:
      children:
        twinspark_head:
          hosts:
            node1:
              ansible_host: 10.78.0.1
              twinspark_fabric_address: 10.77.0.1
        twinspark_worker:
          hosts:
            node2:
              ansible_host: "{{ sim_prefix }}.2"
              twinspark_fabric_address: 10.77.0.2
      vars:
        sim_prefix: 10.78.0
        ansible_user: root
        ansible_ssh_private_key_file: /var/tmp/twinspark-sim/ssh/id_ed25519
        ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
        twinspark_vllm_port: 8899
"""


def write(tmp_path, text: str):
    path = tmp_path / "hosts.yml"
    path.write_text(text)
    return path


def test_head_worker_ssh_settings_and_api_url_come_from_the_inventory(tmp_path):
    pair = inventory.read_inventory(write(tmp_path, INVENTORY))
    assert (pair.head.name, pair.head.role, pair.head.host) == ("node1", "head", "10.78.0.1")
    assert (pair.worker.name, pair.worker.host) == ("node2", "10.78.0.2"), "templated values are rendered"
    assert pair.worker.user == "root" and pair.worker.port == 22
    assert pair.worker.key_file == "/var/tmp/twinspark-sim/ssh/id_ed25519"
    assert pair.head.accept_unknown_host_key
    assert pair.api_url == "http://10.78.0.1:8899"


def test_tls_in_the_inventory_makes_the_controller_dial_https_and_verify_against_its_own_copy(tmp_path):
    tls = INVENTORY.replace("twinspark_vllm_port: 8899\n", "twinspark_vllm_port: 8899\n"
                            "        twinspark_vllm_tls_cert: \"{{ inventory_dir }}/tls/server.crt\"\n"
                            "        twinspark_vllm_tls_key: /inv/server.key\n")
    pair = inventory.read_inventory(write(tmp_path, tls))
    assert (pair.api_url, pair.api_ca) == ("https://10.78.0.1:8899", f"{tmp_path}/tls/server.crt")
    with_ca = tls.replace("twinspark_vllm_tls_key: /inv/server.key", "twinspark_vllm_tls_key: /inv/server.key\n"
                          "        twinspark_vllm_tls_ca: /inv/ca.crt")
    assert inventory.read_inventory(write(tmp_path, with_ca)).api_ca == "/inv/ca.crt"
    assert inventory.read_inventory(write(tmp_path, INVENTORY)).api_ca is None


def test_unknown_host_keys_are_refused_unless_the_inventory_says_otherwise(tmp_path):
    text = INVENTORY.replace("ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                             "ansible_ssh_common_args: -o ServerAliveInterval=15")
    pair = inventory.read_inventory(write(tmp_path, text.replace("twinspark_vllm_port: 8899\n", "")))
    assert not pair.head.accept_unknown_host_key
    assert pair.api_url == "http://10.78.0.1:8888", "the default API port"
    explicit = text.replace("ansible_user: root", "ansible_user: root\n        ansible_host_key_checking: false")
    assert inventory.read_inventory(write(tmp_path, explicit)).worker.accept_unknown_host_key


def test_an_inventory_without_a_worker_is_refused_naming_the_group(tmp_path):
    text = INVENTORY.replace("twinspark_worker:", "other_group:")
    with pytest.raises(inventory.InventoryError, match="twinspark_worker: must hold exactly one host"):
        inventory.read_inventory(write(tmp_path, text))


def test_the_cli_reports_a_bad_inventory_with_exit_2(tmp_path, capsys):
    path = write(tmp_path, INVENTORY.replace("twinspark_head:", "heads:"))
    assert command.run(argparse.Namespace(local=False, pair=False, no_pair=False, inventory=str(path),
                                          timeout=1.0, json=False, prom_file=None)) == 2
    assert "twinspark_head" in capsys.readouterr().err


def report_of(node: str, unit_status: str, settings: dict) -> dict:
    return {
        "checks": [{"node": node, "check": "unit", "status": unit_status, "message": "m", "fix": "f"}],
        "nodes": {node: {"settings": settings, "runtime": {"vllm": "1"},
                         "model": {"model": "m", "revision": "r", "snapshot": "r"}}},
    }


def test_the_merged_report_names_an_unreachable_worker_and_a_differing_setting(tmp_path, monkeypatch):
    pair = inventory.read_inventory(write(tmp_path, INVENTORY))
    shared = {"MAX_MODEL_LEN": "512", "SERVED_MODEL_NAME": "tiny"}
    outcome = remote.SweepResult(
        reports={"node1": report_of("node1", "ok", shared)},
        errors={"node2": "cannot reach root@10.78.0.2:22 over SSH: timed out"},
        head_env=dict(shared), pair={"generate": {"status_code": 500}})
    monkeypatch.setattr(command, "read_inventory", lambda source: pair)
    monkeypatch.setattr(remote, "sweep", lambda *a, **k: outcome)
    # The sweep is a stand-in that dials nothing: the route rule (tested in test_netguard.py) is not under test.
    monkeypatch.setattr(command.netguard, "check", lambda targets: [])
    args = argparse.Namespace(inventory="x", pair=False, no_pair=False, timeout=5.0)
    results, _, _ = command.controller_sweep(args)
    by_key = {(r.node, r.check): r for r in results}
    assert by_key[("node2", "reach")].status == "failed"
    assert "node2 not serving" in by_key[("pair", "liveness")].message
    assert ("pair", "settings-agree") not in by_key, "nothing to compare with one node"

    outcome.reports["node2"] = report_of("node2", "ok", dict(shared, MAX_MODEL_LEN="256"))
    outcome.errors.clear()
    results, _, _ = command.controller_sweep(args)
    agree = next(r for r in results if r.check == "settings-agree")
    assert agree.status == "failed" and "MAX_MODEL_LEN: node1=512, node2=256" in agree.message


@pytest.fixture
def closing_port():
    """A loopback port that accepts and hangs up at once: a stand-in for a node whose sshd does not answer."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            connection.close()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_a_node_whose_ssh_does_not_answer_is_one_line_naming_it_with_no_traceback(closing_port):
    # A process of its own: pytest's log capture would hide what paramiko prints to a user's terminal.
    script = textwrap.dedent(f"""
        from twinspark import inventory
        from twinspark.health import remote
        node = lambda name, role: inventory.Node(name, role, "127.0.0.1", {closing_port}, "root", None, True)
        pair = inventory.PairAccess(head=node("node1", "head"), worker=node("node2", "worker"), api_url="http://127.0.0.1:9")
        outcome = remote.sweep(pair, timeout=2)
        print(sorted(outcome.errors))
        print(outcome.errors["node2"])
        print(bool(outcome.pair["health"]["error"]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "['node1', 'node2']"
    assert lines[1].startswith(f"cannot reach root@127.0.0.1:{closing_port} over SSH: SSHException")
    assert lines[2] == "True", "the API was still probed"
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr


def test_a_group_inventory_gives_every_rank_in_rank_order(tmp_path):
    """scripts/sim/group-inventory.py's group of four: rank 0 is the head, the others are named by rank."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sim" / "group-inventory.py"), "4", "--write",
                           str(tmp_path)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    pair = inventory.read_inventory(tmp_path / "hosts.yml")
    assert [(node.name, node.role, node.host) for node in pair.nodes] == [
        ("node1", "head", "10.78.0.1"), ("node2", "rank 1", "10.78.0.2"), ("node3", "rank 2", "10.78.0.3"),
        ("node4", "rank 3", "10.78.0.4")]
    assert pair.api_url.startswith("http://10.78.0.1:")
    # a pair keeps its head and worker, and no other rank
    pair_view = inventory.read_inventory(write(tmp_path, INVENTORY))
    assert [node.role for node in pair_view.nodes] == ["head", "worker"]


def test_the_sweep_asks_every_rank_of_a_group_and_names_each_one_it_cannot_reach(closing_port):
    script = textwrap.dedent(f"""
        from twinspark import inventory
        from twinspark.health import remote
        node = lambda name, role: inventory.Node(name, role, "127.0.0.1", {closing_port}, "root", None, True)
        group = inventory.PairAccess(head=node("node1", "head"), worker=node("node2", "rank 1"),
                                     api_url="http://127.0.0.1:9",
                                     more=(node("node3", "rank 2"), node("node4", "rank 3")))
        outcome = remote.sweep(group, timeout=2)
        print(sorted(outcome.errors))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.splitlines()[0] == "['node1', 'node2', 'node3', 'node4']"
