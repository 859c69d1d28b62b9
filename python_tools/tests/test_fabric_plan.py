"""`twinspark fabric plan INVENTORY` (twinspark.fabric.plan): the fabric an inventory lays out, read as Ansible reads
it, nothing contacted: the simulated ring as scripts/sim/group-inventory.py writes it, the simulated pair, a ring
the rules refuse, and an inventory with neither a group nor one pair."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from twinspark import cli

ROOT = Path(__file__).resolve().parents[2]


def _ring(tmp_path: Path, count: int = 4) -> Path:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "sim" / "group-inventory.py"), str(count), "--topology",
                    "ring", "--write", str(tmp_path)], check=True, capture_output=True)
    return tmp_path


def test_a_ring_plan_lists_each_cable_end_and_the_ring_nccl_settings(tmp_path, capsys):
    assert cli.main(["fabric", "plan", str(_ring(tmp_path)), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["topology"], result["nodes"], result["tp"], result["pass_mark_gbps"]) == ("ring", 4, 4, 10.0)
    node1 = result["ranks"][0]
    assert [(i["name"], i["address"], i["peer"], i["peer_port"]) for i in node1["interfaces"]] == [
        ("ic0", "10.77.0.1", "node2", 1), ("ic1", "10.77.6.2", "node4", 0)]
    assert result["nccl_env"]["NCCL_ALGO"] == "Ring" and result["problems"] == []
    assert cli.main(["fabric", "plan", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "node1  ic0     10.77.0.1/24  twinspark_links[0]  node2 port 1 (10.77.0.2)" in shown
    assert "NCCL settings this topology adds: NCCL_ALGO=Ring" in shown


def test_the_pair_is_the_direct_group_of_two_with_its_own_addresses(capsys):
    assert cli.main(["fabric", "plan", str(ROOT / "inventory" / "sim"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["group"], result["topology"], result["nccl_env"]) == ("pair", "direct", {})
    assert [(n["host"], n["fabric_address"], n["interfaces"]) for n in result["ranks"]] == [
        ("node1", "10.77.0.1", []), ("node2", "10.77.0.2", [])]


def test_a_ring_that_does_not_close_is_refused_naming_the_variable(tmp_path, capsys):
    hosts = _ring(tmp_path) / "hosts.yml"
    data = yaml.safe_load(hosts.read_text())
    first = data["all"]["children"]["twinspark_pair"]["children"]["twinspark_group"]["hosts"]["node1"]
    first["twinspark_links"][3] = {"a": "node4", "a_port": 0, "b": "node2", "b_port": 0}  # node1's port 1 left free
    hosts.write_text(yaml.safe_dump(data))
    assert cli.main(["fabric", "plan", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "twinspark fabric plan: twinspark_links of group twinspark_group" in captured.err
    assert "node1" in captured.out  # the plan is still shown, with no cable ends


def test_an_inventory_with_neither_a_group_nor_one_pair_is_bad_input(tmp_path, capsys):
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    lonely:\n      ansible_host: 127.0.0.1\n")
    assert cli.main(["fabric", "plan", str(tmp_path)]) == 3
    assert "no inventory group twinspark_group and not one pair" in capsys.readouterr().err
