"""The simulated fleet of any size: the harness's node layout (scripts/sim/lib/common.sh, read by bash itself) and
the inventory scripts/sim/fleet-inventory.py writes for it, parsed and validated by Ansible and the fleet rules.
Nothing here starts a node or contacts a host."""

from __future__ import annotations

import importlib.util
import os
import subprocess

import pytest
from test_fleet_inventory import FILTERS, ROOT, load

from twinspark.fleet import rules as fleet

spec = importlib.util.spec_from_file_location("fleet_inventory", ROOT / "scripts" / "sim" / "fleet-inventory.py")
GENERATOR = importlib.util.module_from_spec(spec)
spec.loader.exec_module(GENERATOR)


def layout(tmp_path, **env):
    """NODES, PAIRS, ROUTER_NODE and ALL_NODES as common.sh sets them, or (exit code, stderr) when it refuses."""
    script = ('. scripts/sim/lib/common.sh; printf "%s\\n" "${NODES[*]}" "${PAIRS[*]}" "$ROUTER_NODE" '
              '"${ALL_NODES[*]}"')
    run = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ, "TWINSPARK_SIM_DIR": str(tmp_path), "TWINSPARK_SIM_FLEET": "",
                              "TWINSPARK_SIM_PAIRS": "", **env})
    if run.returncode:
        return run.returncode, run.stderr.strip()
    return run.stdout.split("\n")[:4]


def test_the_pair_and_the_two_pair_fleet_keep_their_nodes(tmp_path):
    assert layout(tmp_path) == ["node1 node2", "node1 node2", "", "node1 node2"]
    assert layout(tmp_path, TWINSPARK_SIM_FLEET="1") == [
        "node1 node2 node3 node4 node5", "node1 node2 node3 node4", "node5", "node1 node2 node3 node4 node5"]


def test_any_number_of_pairs_each_two_nodes_then_the_router(tmp_path):
    nodes, pairs, router, _ = layout(tmp_path, TWINSPARK_SIM_FLEET="1", TWINSPARK_SIM_PAIRS="3")
    assert nodes == "node1 node2 node3 node4 node5 node6 node7" and router == "node7"
    assert pairs == "node1 node2 node3 node4 node5 node6"


def test_down_reaches_the_nodes_another_layout_left_behind(tmp_path):
    """`down` for the pair still stops and removes a three-pair fleet's nodes (their disks or PID files)."""
    (tmp_path / "nodes" / "node7").mkdir(parents=True)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "node12.pid").write_text("1\n")
    (tmp_path / "run" / "acng.pid").write_text("1\n")
    assert layout(tmp_path)[3] == "node1 node2 node7 node12"


@pytest.mark.parametrize(("env", "message"), [
    ({"TWINSPARK_SIM_FLEET": "1", "TWINSPARK_SIM_PAIRS": "0"}, "TWINSPARK_SIM_PAIRS=0: use a whole number of pairs"),
    ({"TWINSPARK_SIM_FLEET": "1", "TWINSPARK_SIM_PAIRS": "61"}, "TWINSPARK_SIM_PAIRS=61: use a whole number"),
    ({"TWINSPARK_SIM_FLEET": "1", "TWINSPARK_SIM_PAIRS": "two"}, "TWINSPARK_SIM_PAIRS=two: use a whole number"),
    ({"TWINSPARK_SIM_PAIRS": "3"}, "TWINSPARK_SIM_PAIRS=3 needs TWINSPARK_SIM_FLEET=1"),
    ({"TWINSPARK_SIM_FLEET": "2"}, "TWINSPARK_SIM_FLEET=2: use 1"),
])
def test_a_bad_layout_is_one_line_naming_the_variable(tmp_path, env, message):
    code, stderr = layout(tmp_path, **env)
    assert code == 2 and stderr.startswith(message) and "\n" not in stderr


@pytest.mark.parametrize(("directory", "pairs"), [("sim-fleet", 2), ("sim-fleet-one", 1)])
def test_the_committed_fleet_inventories_are_the_generators_output(directory, pairs):
    """inventory/sim-fleet (make sim-test-fleet, make demo FLEET=1) and inventory/sim-fleet-one (CI's fleet smoke)."""
    assert GENERATOR.hosts_yml(pairs) == (ROOT / "inventory" / directory / "hosts.yml").read_text(), \
        f"regenerate: python3 scripts/sim/fleet-inventory.py {pairs} > inventory/{directory}/hosts.yml"
    assert os.readlink(ROOT / "inventory" / directory / "group_vars" / "all") == "../../sim/group_vars/all"


@pytest.mark.parametrize("pairs", [1, 3, 5])
def test_a_generated_fleet_validates_with_its_router_in_front_of_every_pair(tmp_path, pairs):
    assert GENERATOR.main([str(pairs), "--write", str(tmp_path / "fleet")]) == 0
    assert (tmp_path / "fleet" / "group_vars" / "all").resolve() == (ROOT / "inventory" / "sim" / "group_vars" /
                                                                     "all").resolve()
    hostvars, groups = load(tmp_path / "fleet")
    assert FILTERS.twinspark_pair_problems(hostvars, groups) == []
    found, problems = fleet.pairs(hostvars, groups)
    assert problems == []
    assert [(p.name, p.head, p.worker) for p in found] == [
        (GENERATOR.pair_name(k), f"node{2 * k - 1}", f"node{2 * k}") for k in range(1, pairs + 1)]
    router = f"node{2 * pairs + 1}"
    assert groups["twinspark_router"] == [router]
    assert hostvars[router]["ansible_host"] == f"10.78.0.{2 * pairs + 1}"
    summary = FILTERS.twinspark_fleet_summary(hostvars, groups)
    assert summary[-1] == f"router {router}: fronts {', '.join(p.name for p in found)}"
    # written again, it is the same and the link is kept
    before = (tmp_path / "fleet" / "hosts.yml").read_text()
    assert GENERATOR.main([str(pairs), "--write", str(tmp_path / "fleet")]) == 0
    assert (tmp_path / "fleet" / "hosts.yml").read_text() == before


def test_pair_names_go_on_past_z():
    assert [GENERATOR.pair_name(k) for k in (1, 2, 26, 27, 28, 52, 53)] == [
        "pair_a", "pair_b", "pair_z", "pair_aa", "pair_ab", "pair_az", "pair_ba"]


@pytest.mark.parametrize("bad", ["0", "61", "x"])
def test_the_generator_refuses_a_bad_count_in_one_line(capsys, bad):
    assert GENERATOR.main([bad]) == 2
    assert capsys.readouterr().err.strip().startswith(f"fleet-inventory: '{bad}': use a whole number of pairs")


def test_the_generator_uses_the_harness_addresses_and_limit(tmp_path):
    """fleet-inventory.py spells the harness's prefixes and pair limit again (it runs without bash): they must agree
    with scripts/sim/lib/common.sh."""
    run = subprocess.run(["bash", "-c", '. scripts/sim/lib/common.sh; echo "$IC_PREFIX $MGMT_PREFIX $MAX_SIM_PAIRS"'],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ, "TWINSPARK_SIM_DIR": str(tmp_path), "TWINSPARK_SIM_FLEET": ""})
    assert run.stdout.split() == [GENERATOR.FABRIC, GENERATOR.MGMT, str(GENERATOR.MAX_PAIRS)]


def topology(tmp_path, **env):
    """SIM_TOPOLOGY and whether common.sh's switched/cabled hold, or (exit code, stderr) when it refuses."""
    script = ('. scripts/sim/lib/common.sh; printf "%s %s %s\\n" "${SIM_TOPOLOGY:-none}" '
              '"$(switched && echo switched || echo -)" "$(cabled && echo cabled || echo -)"')
    run = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ, "TWINSPARK_SIM_DIR": str(tmp_path), "TWINSPARK_SIM_FLEET": "",
                              "TWINSPARK_SIM_PAIRS": "", "TWINSPARK_SIM_GROUP": "", "TWINSPARK_SIM_TOPOLOGY": "",
                              **env})
    return (run.returncode, run.stderr.strip()) if run.returncode else run.stdout.strip()


@pytest.mark.parametrize(("env", "wanted"), [
    ({}, "none - -"),  # the pair: ic0 straight between its two nodes
    ({"TWINSPARK_SIM_GROUP": "2"}, "none - -"),
    ({"TWINSPARK_SIM_GROUP": "3"}, "switch switched -"),  # three or more: the simulated switch by default
    ({"TWINSPARK_SIM_GROUP": "3", "TWINSPARK_SIM_TOPOLOGY": "mesh"}, "mesh - cabled"),
    ({"TWINSPARK_SIM_GROUP": "8", "TWINSPARK_SIM_TOPOLOGY": "ring"}, "ring - cabled"),
    ({"TWINSPARK_SIM_GROUP": "3", "TWINSPARK_SIM_TOPOLOGY": "ring"}, "use switch (3-8 nodes), mesh (3) or ring (4-8)"),
    ({"TWINSPARK_SIM_GROUP": "4", "TWINSPARK_SIM_TOPOLOGY": "mesh"}, "use switch (3-8 nodes), mesh (3) or ring (4-8)"),
    ({"TWINSPARK_SIM_TOPOLOGY": "ring"}, "needs a group of three nodes or more"),
])
def test_the_harness_cables_a_mesh_or_ring_node_to_node_and_refuses_a_shape_the_count_cannot_take(tmp_path, env,
                                                                                                   wanted):
    found = topology(tmp_path, **env)
    if isinstance(found, tuple):
        assert found[0] == 2 and wanted in found[1], found
    else:
        assert found == wanted
