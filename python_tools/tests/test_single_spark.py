"""A single Spark: the group of one (docs/GROUPS.md, "A single Spark"). One rank, no fabric, no peer: the doctor, the
launcher and health leave the fabric out, the lifecycle and the guard act on rank 0 alone (`--alone`), and the
inventory rules read it as a pair whose worker is missing. The real one runs in the simulation (`make demo NODES=1`,
docs/MEASUREMENTS.md); this holds each rule that makes it so, and that a pair reads exactly as before."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from twinspark import group, launcher, nodeenv, settings, validate
from twinspark.doctor import rules as doctor
from twinspark.fleet import rules as fleet_rules
from twinspark.health import checks
from twinspark.pair import cli as pair_cli
from twinspark.pair import io as pair_io
from twinspark.pair import lifecycle as pl
from twinspark.pair.rules import (
    NO_OTHER_RANK,
    Generation,
    Observation,
    Policy,
    Verdict,
    assess,
    fabric_ifnames,
    fabric_peer,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"


def _filters():
    spec = importlib.util.spec_from_file_location("twinspark_filters", ROOT / "filter_plugins" / "twinspark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def single_inventory() -> tuple[dict, dict]:
    """The simulated single Spark as scripts/sim/group-inventory.py 1 writes it: its management address given as its
    fabric address (it has no fabric)."""
    host_vars = {"node1": {"twinspark_profile": "cpu", "twinspark_rank": 0, "twinspark_topology": "single",
                           "twinspark_tensor_parallel": 1, "twinspark_fabric_address": "10.78.0.1",
                           "ansible_host": "10.78.0.1"}}
    return host_vars, {"all": ["node1"], group.GROUP_GROUP: ["node1"], "twinspark_head": ["node1"],
                       "twinspark_worker": []}


def single_env() -> tuple[dict[str, str], dict[str, str]]:
    host_vars, groups = single_inventory()
    shape = group.read(group.GROUP_GROUP, groups[group.GROUP_GROUP], host_vars, groups)
    assert not shape.problems
    return nodeenv.group_envs(host_vars, shape.ranks, shape.tp, shape.pp)["node1"]


# --- its settings and command line -------------------------------------------------------------------------------


def test_a_single_sparks_env_says_one_node_and_its_own_address():
    serve, _ = single_env()
    assert (serve["NNODES"], serve["TENSOR_PARALLEL_SIZE"], serve["NODE_RANK"]) == ("1", "1", "0")
    assert serve["MASTER_ADDR"] == serve["VLLM_HOST_IP"] == serve["WORKER_HOST"] == "10.78.0.1"


def test_vllm_on_a_single_spark_gets_no_fabric_interface_and_no_rendezvous():
    serve, secrets = single_env()
    registry = settings.load()
    result = validate.validate({**serve, **secrets}, registry)
    assert result.problems == []
    assert result.values["NCCL_SOCKET_IFNAME"] == "ic0"  # the profile's default is still in the file...
    command = launcher.build_command(dict(result.values), registry=registry)
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        assert name not in command.env and name in command.unset  # ...but vLLM neither gets nor inherits it
    dropped = {k.env for k in registry.knobs if k.concern == "fabric"} - {launcher.NCCL_LIBRARY_KNOB}
    assert dropped <= set(command.unset) and "NCCL_IB_HCA" in dropped
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--headless"):
        assert flag not in command.argv
    assert command.argv[command.argv.index("--tensor-parallel-size") + 1] == "1"


def test_a_pairs_vllm_still_gets_its_fabric_interfaces():
    registry = settings.load()
    serve, secrets = nodeenv.example_env("cpu", 0, registry)
    command = launcher.build_command(dict(validate.validate({**serve, **secrets}, registry).values),
                                     registry=registry)
    assert command.env["NCCL_SOCKET_IFNAME"] == command.env["GLOO_SOCKET_IFNAME"] == "ic0"


def test_no_gid_is_resolved_on_a_single_gb10():
    values = {"TWINSPARK_PROFILE": "gb10", "NCCL_IB_GID_AUTO": "1", "NCCL_IB_HCA": "=rocep1s0f0", "NNODES": "1",
              "TENSOR_PARALLEL_SIZE": "1", "VLLM_HOST_IP": "10.1.0.1"}

    def resolver(*_args):
        raise AssertionError("a single Spark has no GID to resolve")

    assert launcher.resolve_gid(values, Path("/nonexistent"), lambda _name: [], resolver) == []
    assert "NCCL_IB_GID_INDEX" not in values


# --- the doctor, the guard's fabric look and health --------------------------------------------------------------


def test_the_doctor_judges_no_fabric_on_a_single_spark():
    facts = json.loads((FIXTURES / "handshaped_doctor_gb10_head.json").read_text(encoding="utf-8"))
    facts["netdevs"] = [n for n in facts["netdevs"] if n["name"] in ("lo", "enP7s7")]  # no fabric netdev at all
    as_pair = {f.id for f in doctor.judge_node("n", facts, doctor.settings_of(facts)).findings}
    assert "fabric.interface-missing" in as_pair
    alone = {f.id for f in doctor.judge_node("n", facts, doctor.settings_of(facts, {"NNODES": "1"})).findings}
    assert not {name for name in alone if name.split(".")[0] in ("fabric", "rdma", "gid")}
    assert "NNODES" in doctor.SETTINGS_READ  # the preflight passes it to the rules


def test_a_single_sparks_address_must_be_one_of_its_own():
    facts = json.loads((FIXTURES / "handshaped_doctor_gb10_head.json").read_text(encoding="utf-8"))
    held = [a for n in facts["netdevs"] for a in n.get("ipv4") or []]
    assert held
    found = doctor.judge_node("n", facts, doctor.settings_of(facts, {"NNODES": "1", "VLLM_HOST_IP": held[0]}))
    assert "single.address" not in {f.id for f in found.findings}
    wrong = doctor.judge_node("n", facts, doctor.settings_of(facts, {"NNODES": "1", "VLLM_HOST_IP": "10.9.9.9"}))
    finding = next(f for f in wrong.findings if f.id == "single.address")
    assert finding.severity == "stop" and "10.9.9.9 (VLLM_HOST_IP) is none of its own" in finding.message
    assert "twinspark_fabric_address" in finding.fix
    # a pair node is judged by fabric.address instead
    pair = doctor.judge_node("n", facts, doctor.settings_of(facts, {"VLLM_HOST_IP": "10.9.9.9"}))
    assert "single.address" not in {f.id for f in pair.findings}


def test_the_guard_looks_at_no_fabric_on_a_single_spark():
    env = {"NNODES": "1", "NODE_RANK": "0", "NCCL_SOCKET_IFNAME": "ic0", "WORKER_HOST": "10.78.0.1"}
    assert fabric_ifnames(env) == [] and fabric_peer(env) is None
    pair_env = {**env, "NNODES": ""}
    assert fabric_ifnames(pair_env) == ["ic0"] and fabric_peer(pair_env) == "10.78.0.1"


def test_health_says_a_single_spark_has_no_fabric():
    result = checks.check_fabric("node1", {"alone": True})
    assert result.status == "ok" and "single Spark" in result.message
    assert checks.check_fabric("node1", {}).status == "failed"  # a pair node without its interfaces fails as before


# --- the lifecycle and the guard ----------------------------------------------------------------------------------


def alone_pair() -> pair_io.LivePair:
    return pair_io.LivePair(api=None, worker_addresses=[], alone=True)


def test_a_single_spark_is_a_group_of_one_rank_with_no_peer():
    pair = alone_pair()
    assert pair.size == 1 and pair.peers() == []
    assert pair.peer_status() == (NO_OTHER_RANK, "active", None)
    assert pair.worker("state") == "active" and pair.worker_status() == ("active", None)
    with pytest.raises(ValueError, match="no other rank to start"):
        pair.worker("start")
    with pytest.raises(ValueError, match="not one of this group's ranks"):
        pair.rank(1, "stop")


def test_a_single_sparks_steps_touch_rank_0_only():
    assert pl.steps("restart", size=1) == (("rank 0", "stop"), ("rank 0", "start"))
    assert pl.steps("stop", size=1) == (("rank 0", "stop"),)
    assert pl.steps("start", "active", "active", size=1) == ()
    assert pl.steps("start", "failed", "active", size=1) == (("rank 0", "stop"), ("rank 0", "start"))


class Single:
    """Stands in for systemctl on the one rank (the real one runs in the simulation)."""

    def __init__(self, state="active", fail=()):
        self.alone, self.size, self.state, self.fail = True, 1, state, set(fail)
        self.calls: list[str] = []
        self.ssh_key = "/nonexistent/key"  # a single Spark has none: nothing may ask for it

    def head_props(self):
        return {"ActiveState": self.state, "LoadState": "loaded"}

    def head(self, verb):
        self.calls.append(verb)

    def worker(self, verb):
        return pair_io.LivePair.worker(alone_pair(), verb)


def test_a_single_sparks_restart_needs_no_key_and_reaches_no_one():
    stand = Single(state="failed")
    plan = pl.steps("restart", size=1)
    assert pl.preflight(stand, plan) == ""
    ok, done = pl.run_steps(stand, plan)
    assert ok and stand.calls == ["stop", "start"]


def test_the_guard_restarts_a_single_sparks_failed_rank_and_says_so():
    verdict, reason = assess(Observation("failed", "active", Generation.SKIPPED, worker_name=NO_OTHER_RANK),
                             Policy())
    assert verdict is Verdict.BROKEN
    assert reason == "head's twinspark-vllm.service is failed: a single Spark's rank never heals by itself"


def test_alone_refuses_other_ranks_in_one_line(tmp_path):
    env = tmp_path / "serve.env"
    env.write_text("TWINSPARK_PROFILE=cpu\n")
    env.chmod(0o600)
    args = argparse.Namespace(env=[str(env)], worker=["10.77.0.2"], alone=True, rank=None, ssh_user="root",
                              ssh_key="k", known_hosts="h", state_file=str(tmp_path / "state.json"))
    with pytest.raises(ValueError, match="--alone .* takes no --worker and no --rank"):
        pair_cli._pair_from_args(args)


def test_site_yml_records_alone_for_the_verbs_of_a_single_spark():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd")
    pair_cli.register(sub)
    args = parser.parse_args(["pair", "check", "--alone"])
    assert args.alone is True and args.worker is None


# --- the inventory --------------------------------------------------------------------------------------------------


def test_the_inventory_reads_a_single_spark_as_a_pair_without_worker():
    host_vars, groups = single_inventory()
    found, problems = fleet_rules.pairs(host_vars, groups)
    assert problems == [] and [(p.head, p.worker, p.hosts) for p in found] == [("node1", "", ["node1"])]
    own = _filters().twinspark_own_pair("node1", groups, host_vars)
    assert (own["head"], own["worker"], own["hosts"], own["problems"]) == ("node1", "", ["node1"], [])


def test_a_playbook_names_a_rank_by_its_place():
    filters = _filters()
    assert filters.twinspark_rank_label("node2", ["node1", "node2"]) == "the worker node2 (rank 1)"
    assert filters.twinspark_rank_label("node1", ["node1", "node2"]) == "the head node1 (rank 0)"
    assert filters.twinspark_rank_label("node3", ["node1", "node2", "node3"]) == "node3 (rank 2)"
    with pytest.raises(Exception, match="node9 is not one of node1, node2"):
        filters.twinspark_rank_label("node9", ["node1", "node2"])


def test_a_single_spark_is_valid_and_a_router_in_front_of_a_group_is_refused():
    filters = _filters()
    host_vars, groups = single_inventory()
    assert filters.twinspark_pair_problems(host_vars, groups) == []
    routed = {**groups, "twinspark_router": ["router1"], "all": ["node1", "router1"]}
    lines = filters.twinspark_pair_problems({**host_vars, "router1": {}}, routed)
    assert len(lines) == 1 and lines[0].startswith("group twinspark_router (router1): a router in front of a group")
