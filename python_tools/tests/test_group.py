"""Groups (twinspark.group, docs/GROUPS.md): ranks, layouts and topologies as pure rules over the inventory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from twinspark import group, inventory, monitoring, recipe
from twinspark.fabric import links
from twinspark.fleet import rules as fleet_rules

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((Path(__file__).parent / "fixtures" / "recorded_before_recipes.json").read_text())


def ranked(count: int, topology: str | None = None, links=None, tp=None, pp=None, **extra):
    """An inventory group of `count` nodes n0..n{count-1} with ranks, and rank 0's group settings."""
    hosts = [f"n{i}" for i in range(count)]
    host_vars = {host: {"twinspark_rank": i, "twinspark_fabric_address": f"10.9.0.{i + 1}"}
                 for i, host in enumerate(hosts)}
    first = host_vars["n0"]
    for var, value in ((group.TOPOLOGY_VAR, topology), (group.LINKS_VAR, links), (group.TP_VAR, tp),
                       (group.PP_VAR, pp)):
        if value is not None:
            first[var] = value
    first.update(extra)
    return group.read("g", hosts, host_vars, {}), host_vars


def ring_links(count: int, crossed: bool = False):
    """A closed ring, port 0 of each node to port 1 of the next; `crossed`: n1-n2 cabled port 0 to port 0 and n2-n3
    port 1 to port 1 (every port used once, the ring's direction broken: the miscabling that fails at the first
    all-reduce)."""
    links = [{"a": f"n{i}", "a_port": 0, "b": f"n{(i + 1) % count}", "b_port": 1} for i in range(count)]
    if crossed:
        links[1] = {"a": "n1", "a_port": 0, "b": "n2", "b_port": 0}
        links[2] = {"a": "n2", "a_port": 1, "b": "n3", "b_port": 1}
    return links


def test_todays_pair_is_the_group_of_two_with_the_same_launch_flags():
    host_vars, groups = inventory.read_hosts(ROOT / "inventory" / "sim")
    pair = group.read("twinspark_pair", groups["twinspark_pair"], host_vars, groups)
    assert (pair.ranks, pair.topology, pair.tp, pair.pp, pair.problems) == (("node1", "node2"), "direct", 2, 1, ())
    assert group.problems([pair], host_vars, {pair.name: recipe.get("tiny-llama")}) == []
    # The flags the launcher passed before groups existed (recorded), rank by rank: the group's are the same values.
    for rank in (0, 1):
        before = RECORDED[f"cpu/stock/rank{rank}"]["dry_run"]["argv"]
        master = before[before.index("--master-addr") + 1]
        port = int(before[before.index("--master-port") + 1])
        args = group.launch_args(pair, rank, master, port)
        flags = [a for a in args if a.startswith("--")]
        for flag in flags:
            assert flag in before
            if flag != "--headless":
                assert before[before.index(flag) + 1] == args[args.index(flag) + 1], flag
        assert ("--headless" in before) == (rank == 1) == ("--headless" in args)


def test_a_group_of_one_is_a_single_spark_with_no_fabric_and_no_multi_node_flags():
    single, host_vars = ranked(1)
    assert single.topology == "single" and group.problems([single], host_vars) == []
    assert group.launch_args(single, 0, "unused") == ["--tensor-parallel-size", "1", "--pipeline-parallel-size", "1"]
    assert group.pass_mark(single) is None and group.nccl_env(single) == {}


def test_four_nodes_through_a_switch_start_from_the_last_rank_and_only_rank_0_serves_the_api():
    four, host_vars = ranked(4, "switch")
    assert group.problems([four], host_vars, {"g": recipe.get("deepseek-v4-flash")}) == []
    assert group.start_order(four) == ["n3", "n2", "n1", "n0"] and group.stop_order(four) == ["n0", "n1", "n2", "n3"]
    assert group.launch_args(four, 2, "10.9.0.1") == [
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1", "--nnodes", "4", "--node-rank", "2",
        "--master-addr", "10.9.0.1", "--master-port", "29501", "--headless"]
    assert "--headless" not in group.launch_args(four, 0, "10.9.0.1")
    assert group.nccl_env(four) == {} and group.pass_mark(four) == 21.875
    plan = group.fabric_plan(four)
    # Twins on separate subnets: no node has two addresses on one /24.
    for host, ports in plan.items():
        subnets = [entry["address"].rsplit(".", 1)[0] for entry in ports]
        assert len(subnets) == len(set(subnets)) == 4, host
    assert plan["n2"][0] == {"port": 0, "twin": 0, "address": "10.200.0.3/24", "peer": "switch"}
    with pytest.raises(ValueError, match="rank 4 is not in group g"):
        group.launch_args(four, 4, "10.9.0.1")


def test_a_closed_ring_gets_its_ring_nccl_settings_and_one_subnet_per_cable_twin():
    ring, host_vars = ranked(4, "ring", ring_links(4))
    assert group.problems([ring], host_vars, {"g": recipe.get("deepseek-v4-flash")}) == []
    assert group.ring_order(ring) == ["n0", "n1", "n2", "n3"]
    env = group.nccl_env(ring, "enP7s7")
    assert env == {"NCCL_NET_PLUGIN": "none", "NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_IB_MERGE_NICS": "0",
                   "NCCL_IB_HCA": group.ALL_ROCE_DEVICES, "NCCL_SOCKET_IFNAME": "enP7s7", "NCCL_ALGO": "Ring"}
    plan = group.fabric_plan(ring)
    assert [e["peer"] for e in plan["n0"]] == ["n1", "n1", "n3", "n3"]
    assert plan["n0"][0]["address"] == "10.200.0.1/24" and plan["n1"][0]["address"] == "10.200.0.2/24"
    every = [e["address"] for entries in plan.values() for e in entries]
    assert len(every) == len(set(every)) == 16  # four cables x two twins x two ends


def test_a_three_node_mesh_gets_the_subnet_routing_without_the_ring_algorithm():
    links = [{"a": "n0", "a_port": 0, "b": "n1", "b_port": 1}, {"a": "n1", "a_port": 0, "b": "n2", "b_port": 1},
             {"a": "n2", "a_port": 0, "b": "n0", "b_port": 1}]
    mesh, host_vars = ranked(3, "mesh", links, tp=1, pp=3)
    assert group.problems([mesh], host_vars, {"g": None}) == []
    assert "NCCL_ALGO" not in group.nccl_env(mesh) and group.nccl_env(mesh)["NCCL_NET_PLUGIN"] == "none"
    assert group.pass_mark(mesh) == 10.0


@pytest.mark.parametrize(("build", "wanted"), [
    (lambda: ranked(4, "ring", ring_links(4, crossed=True)), "does not close one ring"),
    (lambda: ranked(4, "ring", ring_links(4)[:3]), "does not close one ring"),
    (lambda: ranked(3, "ring", ring_links(3)), "three nodes cabled to each other are the mesh"),
    (lambda: ranked(3, "mesh", ring_links(3)[:2], tp=1, pp=3), "missing n0-n2"),
    (lambda: ranked(3), "a group of three or more must say how it is cabled"),
    (lambda: ranked(4, "switch", tp=2), "is 2 x 1 = 2, but the group has 4 node(s)"),
    (lambda: ranked(2, "direct", ring_links(2)), "only a mesh or a ring reads"),
])
def test_bad_groups_are_refused_naming_the_variable(build, wanted):
    bad, host_vars = build()
    found = group.problems([bad], host_vars)
    assert any(wanted in line for line in found), found


def test_tp_that_does_not_divide_the_heads_and_pp_without_pipeline_support_are_refused():
    three, host_vars = ranked(3, "switch")  # TP=3 by default: DeepSeek-V4's 64 heads refuse it
    found = group.problems([three], host_vars, {"g": recipe.get("deepseek-v4-flash")})
    assert any("does not divide recipe deepseek-v4-flash's 64 attention heads" in line for line in found), found
    piped, host_vars = ranked(4, "switch", tp=2, pp=2)
    found = group.problems([piped], host_vars, {"g": recipe.get("deepseek-v4-flash")})
    assert any("does not support pipeline parallelism" in line for line in found), found
    assert group.problems([piped], host_vars, {"g": recipe.get("minimax-m2")}) == []  # laid out for TP2xPP2


def test_ranks_nodes_and_fabric_addresses_belong_to_one_place_each():
    hosts = ["a", "b", "c"]
    host_vars = {"a": {"twinspark_rank": 0, "twinspark_topology": "mesh"}, "b": {"twinspark_rank": 0},
                 "c": {"twinspark_rank": "x"}}
    bad = group.read("g", hosts, host_vars, {})
    assert any("twinspark_rank 0 is given to both a and b" in line for line in bad.problems)
    assert any("twinspark_rank on c must be a whole number" in line for line in bad.problems)
    one, host_vars = ranked(2, "direct")
    other = group.read("h", ["n1", "m"], {**host_vars, "m": {"twinspark_rank": 0,
                                                              "twinspark_fabric_address": "10.9.0.1"}}, {})
    found = group.problems([one, other], {**host_vars, "m": {"twinspark_fabric_address": "10.9.0.1"}})
    assert any("n1 is in groups g and h" in line for line in found), found
    assert any("twinspark_fabric_address 10.9.0.1 is given to both n0 and m" in line for line in found), found


def _filters():
    import importlib.util

    spec = importlib.util.spec_from_file_location("twinspark_filters", ROOT / "filter_plugins" / "twinspark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("changes", "wanted"), [
    ({}, None),
    ({"node1": {"twinspark_topology": "direct", "twinspark_rank": 0}, "node2": {"twinspark_rank": 1}}, None),
    ({"node1": {"twinspark_topology": "ring"}}, "ring takes 4-8 node(s), group twinspark_pair has 2"),
    ({"node1": {"twinspark_topology": "switch"}}, "the fabric role builds the direct cable only so far"),
    ({"node1": {"twinspark_tensor_parallel": 1, "twinspark_pipeline_parallel": 2}}, "the pair serves TP2xPP1 so far"),
    ({"node1": {"twinspark_tensor_parallel": 1}}, "is 1 x 1 = 1, but the group has 2 node(s)"),
    ({"node1": {"twinspark_rank": 1}, "node2": {"twinspark_rank": 0}}, "but node1 is the pair's head"),
])
def test_validation_reads_the_pair_as_the_group_of_two_before_any_host(changes, wanted):
    """playbooks/validate.yml's filter on the simulated inventory: unchanged it passes; a pair declared as a group it
    cannot be (a topology or layout the roles do not build for two nodes, ranks against the head) is refused."""
    host_vars, groups = inventory.read_hosts(ROOT / "inventory" / "sim")
    host_vars = {host: {**values, **changes.get(host, {})} for host, values in host_vars.items()}
    found = _filters().twinspark_pair_problems(host_vars, groups)
    if wanted is None:
        assert found == []
    else:
        assert any(wanted in line for line in found), found


def test_a_nodes_fabric_peers_are_its_groups_other_nodes_in_rank_order_or_its_pairs_other_node():
    host_vars = {f"n{i}": {"twinspark_rank": rank} for i, rank in enumerate((2, 0, 3, 1))}
    groups = {group.GROUP_GROUP: ["n0", "n1", "n2", "n3"]}
    assert group.fabric_peers("n1", groups, host_vars) == ["n3", "n0", "n2"]  # ranks 1, 2, 3
    assert group.fabric_peers("n0", groups, host_vars) == ["n1", "n3", "n2"]
    # a pair's node: the other one
    assert group.fabric_peers("head", {}, {}, ["head", "worker"]) == ["worker"]


def test_every_node_pings_the_same_interface_of_every_peer_in_the_run():
    plan = [{"name": "ic0", "address": "10.77.0.1"}, {"name": "ic1", "address": "10.77.1.1"}]
    plans = {"b": [{"name": "ic0", "address": "10.77.0.2"}, {"name": "ic1", "address": "10.77.1.2"}],
             "c": [{"name": "ic0", "address": "10.77.0.3"}],
             "d": None}  # not in this run
    assert links.ping_targets(["b", "c", "d"], plan, plans) == [
        {"peer": "b", "name": "ic0", "address": "10.77.0.2"}, {"peer": "b", "name": "ic1", "address": "10.77.1.2"},
        {"peer": "c", "name": "ic0", "address": "10.77.0.3"}]
    assert links.ping_targets([], plan, {}) == []


def _group_inventory(count: int, **first) -> tuple[dict, dict]:
    """The simulated group's inventory as scripts/sim/group-inventory.py writes it, with rank 0's changes."""
    names = [f"node{i}" for i in range(1, count + 1)]
    host_vars = {name: {"twinspark_profile": "cpu", "twinspark_rank": i, "twinspark_fabric_address": f"10.77.0.{i + 1}"}
                 for i, name in enumerate(names)}
    host_vars["node1"].update({"twinspark_topology": {1: "single", 2: "direct"}.get(count, "switch"),
                               "twinspark_tensor_parallel": count, **first})
    return host_vars, {"all": names, group.GROUP_GROUP: names}


@pytest.mark.parametrize(("count", "first", "wanted"), [
    (4, {}, None),
    (1, {}, None),
    (3, {"twinspark_topology": "ring"}, "ring takes 4-8 node(s)"),
    (4, {"twinspark_tensor_parallel": 3}, "is 3 x 1 = 3, but the group has 4 node(s)"),
    (4, {"twinspark_links": [{"a": "node1", "a_port": 0, "b": "node2", "b_port": 1}]}, "only a mesh or a ring reads"),
    # What the recipe decides is the serving plays' to judge: three nodes at TP3 do not divide tiny-llama's four
    # heads, but the fabric serves nothing.
    (3, {}, None),
])
def test_playbooks_fabric_judges_a_group_before_any_host(count, first, wanted):
    """playbooks/fabric.yml's first play (filter twinspark_group_problems, scope 'fabric') on the simulated group's
    inventory."""
    host_vars, groups = _group_inventory(count, **first)
    found = _filters().twinspark_group_problems(host_vars, groups, "fabric")
    if wanted is None:
        assert found == []
    else:
        assert any(wanted in line for line in found), found


def test_serving_judges_the_recipes_heads_where_the_fabric_does_not():
    host_vars, groups = _group_inventory(3)
    found = _filters().twinspark_group_problems(host_vars, groups)
    assert any("does not divide recipe tiny-llama's 4 attention heads" in line for line in found), found


def test_the_filter_gives_a_group_node_every_other_node_and_a_pair_node_its_peer():
    filters = _filters()
    host_vars, groups = _group_inventory(4)
    assert filters.twinspark_fabric_peers("node3", groups, host_vars) == ["node1", "node2", "node4"]
    pair_vars, pair_groups = inventory.read_hosts(ROOT / "inventory" / "sim")
    assert filters.twinspark_group_problems(pair_vars, pair_groups) == []  # a pair's inventory has no group
    assert filters.twinspark_fabric_peers("node1", pair_groups, pair_vars) == ["node2"]


def _sim_group_inventory(tmp_path, count: int, topology: str) -> tuple[dict, dict]:
    """scripts/sim/group-inventory.py's own output for `count` nodes and `topology`, read as Ansible would."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sim" / "group-inventory.py"), str(count),
                           "--topology", topology, "--write", str(tmp_path)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    return inventory.read_hosts(tmp_path)


@pytest.mark.parametrize(("count", "topology"), [(4, "ring"), (8, "ring"), (3, "mesh")])
def test_a_simulated_mesh_or_ring_gives_each_cable_end_its_own_subnet_and_pings_the_other_end(tmp_path, count,
                                                                                               topology):
    """The harness's mesh or ring (scripts/sim/group-inventory.py, cabled as scripts/sim/lib/build.sh lays the veths):
    judged valid, each node gets ic0 (port 0) and ic1 (port 1), the two ends of every cable share a /24 of their own
    inside the safety net's 10.77.0.0/16, each end pings the other's address over its own interface, and a node's
    fabric peers are the nodes cabled to it."""
    filters = _filters()
    host_vars, groups = _sim_group_inventory(tmp_path, count, topology)
    assert filters.twinspark_group_problems(host_vars, groups, "fabric") == []
    plans = {host: filters.twinspark_fabric_cables(host, groups, host_vars, "cpu") for host in groups["all"]}
    by_subnet: dict[str, list[tuple[str, str]]] = {}
    for host, plan in plans.items():
        assert [(i["name"], i["port"]) for i in plan] == [("ic0", 0), ("ic1", 1)], host
        for interface in plan:
            assert interface["address"].startswith("10.77.") and interface["prefix"] == 24
            by_subnet.setdefault(interface["address"].rsplit(".", 1)[0], []).append((host, interface["address"]))
    assert len(by_subnet) == count and all(len(ends) == 2 for ends in by_subnet.values())  # one subnet per cable
    # node i's port 0 meets node i+1's port 1: the other end's address is the one node i pings over ic0.
    for index in range(1, count + 1):
        here, there = f"node{index}", f"node{index % count + 1}"
        ic0 = plans[here][0]
        assert (ic0["peer"], ic0["peer_port"]) == (there, 1)
        assert ic0["peer_address"] == plans[there][1]["address"]
        targets = links.ping_targets(filters.twinspark_fabric_peers(here, groups, host_vars), plans[here], plans)
        assert [(t["name"], t["peer"]) for t in targets] == [("ic0", there), ("ic1", f"node{(index - 2) % count + 1}")]
    assert filters.twinspark_fabric_peers("node1", groups, host_vars) == (
        ["node2", "node3"] if topology == "mesh" else ["node2", f"node{count}"])


def test_a_real_mesh_or_ring_node_gets_all_four_netdevs_each_twin_on_its_own_subnet():
    ring, _ = ranked(4, "ring", ring_links(4))
    plan = group.cable_interfaces(ring, "n0", "gb10")
    assert [i["name"] for i in plan] == ["enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"]
    assert [(i["peer"], i["address"], i["peer_address"]) for i in plan] == [
        ("n1", "10.200.0.1", "10.200.0.2"), ("n1", "10.200.1.1", "10.200.1.2"),
        ("n3", "10.200.6.2", "10.200.6.1"), ("n3", "10.200.7.2", "10.200.7.1")]
    switch, _ = ranked(4, "switch")
    assert group.cable_interfaces(switch, "n0", "gb10") == []  # spark_fabric_interfaces then
    assert group.cable_interfaces(ring, "elsewhere", "gb10") == []


def test_a_failed_ping_across_a_cable_names_the_cable_and_both_ports():
    message = links.ping_problem("ic0", "node1", "node2", "10.77.0.2", 9000, 1, "1 packets transmitted, 0 received",
                                 {"cable": 0, "port": 0, "peer_port": 1})
    assert "twinspark_links[0] says port 0 of node1 goes to port 1 of node2" in message
    assert "cabl" not in links.ping_problem("ic0", "node1", "node2", "10.77.0.2", 9000, 1, "lost")


@pytest.mark.parametrize(("network", "wanted"), [
    ("10.77.0.0/16", None),
    ("10.77.0.0/21", None),  # four cables x two twins: eight /24s, exactly a /21
    ("10.77.0.0/22", "holding 8 /24 subnets (a /21 or larger)"),
    ("not-a-network", "give an IPv4 network"),
])
def test_the_fabric_network_must_hold_every_subnet_the_plan_hands_out(network, wanted):
    ring, host_vars = ranked(4, "ring", ring_links(4), twinspark_fabric_network=network)
    found = group.problems([ring], host_vars)
    if wanted is None:
        assert found == [] and ring.network == network
        assert group.cable_interfaces(ring, "n3", "cpu")[0]["address"].startswith("10.77.")
    else:
        assert any(wanted in line for line in found), found


@pytest.mark.parametrize(("count", "first", "wanted"), [
    (3, {}, "does not divide recipe tiny-llama's 4 attention heads"),
    (4, {"twinspark_tensor_parallel": 2}, "is 2 x 1 = 2, but the group has 4 node(s)"),
    (3, {"twinspark_topology": "ring"}, "ring takes 4-8 node(s)"),
    (4, {"twinspark_vllm_port": 8001}, "twinspark_vllm_port"),
    (4, {}, "group twinspark_head: must hold exactly rank 0 of group twinspark_group, node1; it holds none"),
])
def test_site_yml_judges_a_group_inventory_whole_before_any_host(count, first, wanted):
    """playbooks/validate.yml's filter on the simulated group's inventory: every problem of the group and of its ranks'
    env files (a setting given to rank 0 alone that must be equal on every rank), and where its ranks sit (rank 0 in
    twinspark_head, the others in twinspark_worker: absent here)."""
    host_vars, groups = _group_inventory(count, **first)
    found = _filters().twinspark_pair_problems(host_vars, groups)
    assert found and any(wanted in line for line in found), found


def _with_head_and_workers(host_vars: dict, groups: dict) -> tuple[dict, dict]:
    """A group inventory as site.yml serves it: rank 0 also in twinspark_head, the other ranks in twinspark_worker."""
    ranks = sorted(groups[group.GROUP_GROUP], key=lambda host: host_vars[host]["twinspark_rank"])
    return host_vars, {**groups, "twinspark_head": ranks[:1], "twinspark_worker": ranks[1:]}


def test_a_group_nodes_own_pair_is_its_group_with_rank_0_as_head():
    host_vars, groups = _with_head_and_workers(*_group_inventory(4))
    found = _filters().twinspark_own_pair("node3", groups, host_vars)
    assert found == {"name": group.GROUP_GROUP, "head": "node1", "worker": "node2", "more": ["node3", "node4"],
                     "hosts": ["node1", "node2", "node3", "node4"], "problems": []}
    assert _filters().twinspark_pair_problems(host_vars, groups) == []


@pytest.mark.parametrize(("head", "workers", "wanted"), [
    (["node2"], ["node1", "node3", "node4"], "group twinspark_head: must hold exactly rank 0 of group twinspark_group, "
                                             "node1; it holds node2"),
    (["node1"], ["node2", "node3"], "group twinspark_worker: must hold every other rank of group twinspark_group "
                                    "(node2, node3, node4); it holds node2, node3"),
])
def test_a_group_whose_head_or_workers_are_not_its_ranks_is_refused(head, workers, wanted):
    host_vars, groups = _group_inventory(4)
    groups = {**groups, "twinspark_head": head, "twinspark_worker": workers}
    assert any(line.startswith(wanted) for line in _filters().twinspark_pair_problems(host_vars, groups))
    assert any(line.startswith(wanted) for line in _filters().twinspark_own_pair("node1", groups,
                                                                                  host_vars)["problems"])


def test_each_rank_of_a_group_gets_its_own_env_with_rank_0_as_master():
    host_vars, groups = _with_head_and_workers(*_group_inventory(4))
    envs = {host: _filters().twinspark_node_env(host_vars[host], host, groups, host_vars) for host in groups["all"]}
    assert [envs[host]["NODE_RANK"] for host in groups["all"]] == ["0", "1", "2", "3"]
    assert {envs[host]["MASTER_ADDR"] for host in groups["all"]} == {"10.77.0.1"}
    assert envs["node3"]["VLLM_HOST_IP"] == "10.77.0.3" and envs["node3"]["NNODES"] == "4"


def test_the_guard_reaches_ranks_2_and_up_by_fabric_then_management_address():
    filters = _filters()
    host_vars = {"node3": {"twinspark_fabric_address": "10.77.0.4", "ansible_host": "10.78.0.3"},
                 "node4": {"twinspark_fabric_address": "10.77.0.5", "ansible_host": "10.78.0.4"}}
    assert filters.twinspark_guard_rank_args(["node3", "node4"], host_vars) == [
        "--rank=2:10.77.0.4", "--rank=2:10.78.0.3", "--rank=3:10.77.0.5", "--rank=3:10.78.0.4"]
    assert filters.twinspark_guard_rank_args([], host_vars) == []
    assert filters.twinspark_peer_addresses(["node3"], host_vars) == {"node3": ["10.77.0.4", "10.78.0.3"]}
    assert filters.twinspark_peer_addresses(["node4"], host_vars, True) == {"node4": ["10.77.0.5"]}


def test_monitoring_scrapes_every_rank_of_a_group_and_labels_its_rank():
    """The group is the inventory's one pair for the fleet rules monitoring reads (fleet.pairs): every rank runs node
    exporter, rank 0 also the API and Prometheus, and each target says its rank."""
    host_vars, groups = _with_head_and_workers(*_group_inventory(4))
    found, problems = fleet_rules.pairs(host_vars, groups)
    assert problems == [] and [pair.hosts for pair in found] == [["node1", "node2", "node3", "node4"]]
    assert monitoring.components("node3", host_vars, groups) == ["node_exporter"]
    assert monitoring.components("node1", host_vars, groups) == ["node_exporter", "prometheus", "alertmanager"]
    labels = {(target.job, target.labels["node"]): target.labels for target in monitoring.targets(host_vars, groups,
                                                                                                    "node1")
              if "node" in target.labels}
    assert labels[("node", "node4")]["rank"] == "3" and labels[("node", "node4")]["rank_role"] == "worker"
    assert labels[("vllm", "node1")]["rank"] == "0"
    # a group whose ranks are misplaced is no pair: validation names why
    host_vars, groups = _group_inventory(4)
    assert fleet_rules.pairs(host_vars, groups) == ([], [])


def test_site_yml_refuses_a_ring_group_naming_what_configures_it(tmp_path):
    host_vars, groups = _sim_group_inventory(tmp_path, 4, "ring")
    found = _filters().twinspark_pair_problems(host_vars, groups)
    assert len(found) == 1 and found[0].startswith("group twinspark_group is a ring: site.yml serves a group through "
                                                   "a switch so far")


HCAS = ["rocep1s0f0", "roceP2p1s0f0"]


def test_rank_0_measures_each_hca_against_every_rank_its_fabric_reaches():
    """playbooks/fabric-check.yml's ib_write_bw runs (gb10): through a switch each HCA against every other rank, each
    run on its own TCP port; a pair's worker on the address of the same twin; a peer without an address is named."""
    filters = _filters()
    host_vars, groups = _group_inventory(4)
    targets = filters.twinspark_rdma_targets("node1", HCAS, groups, host_vars)
    assert [(t["peer"], t["device"], t["address"]) for t in targets] == [
        (peer, hca, host_vars[peer]["twinspark_fabric_address"])
        for peer in ("node2", "node3", "node4") for hca in HCAS]
    assert [t["port"] for t in targets] == list(range(links.RDMA_FIRST_PORT, links.RDMA_FIRST_PORT + 6))
    pair_vars = {"head": {"spark_fabric_interfaces": [{"name": "a", "address": "10.9.0.1"},
                                                      {"name": "b", "address": "10.9.1.1"}]},
                 "worker": {"spark_fabric_interfaces": [{"name": "a", "address": "10.9.0.2"},
                                                        {"name": "b", "address": "10.9.1.2"}]}}
    pair_groups = {"all": ["head", "worker"], "twinspark_pair": ["head", "worker"], "twinspark_head": ["head"],
                   "twinspark_worker": ["worker"]}
    assert [(t["peer"], t["device"], t["address"]) for t in
            filters.twinspark_rdma_targets("head", HCAS, pair_groups, pair_vars)] == [
        ("worker", "rocep1s0f0", "10.9.0.2"), ("worker", "roceP2p1s0f0", "10.9.1.2")]
    del host_vars["node3"]["twinspark_fabric_address"]
    with pytest.raises(AnsibleFilterError, match="node3: no fabric address to measure ib_write_bw against"):
        filters.twinspark_rdma_targets("node1", HCAS, groups, host_vars)


def test_on_a_mesh_rank_0_measures_each_cabled_rank_on_that_cables_far_end(tmp_path):
    filters = _filters()
    host_vars, groups = _sim_group_inventory(tmp_path, 3, "mesh")
    mine = filters.twinspark_fabric_cables("node1", groups, host_vars, "gb10")
    far_ends = {(entry["peer"], entry["twin"]): entry["peer_address"] for entry in mine}
    targets = filters.twinspark_rdma_targets("node1", HCAS, groups, host_vars)
    assert [(t["peer"], t["device"]) for t in targets] == [(peer, hca) for peer in ("node2", "node3") for hca in HCAS]
    assert [t["address"] for t in targets] == [far_ends[(t["peer"], t["twin"])] for t in targets]
