"""Multi-pair inventories: twinspark.fleet.rules, and the twinspark_pair_problems / twinspark_node_env filters
that playbooks/validate.yml and the roles use. Inventories are parsed by Ansible itself, no host is contacted."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from fileload import load_module
from test_layout import _code_lines

from twinspark import generate, settings, validate
from twinspark.fleet import drain
from twinspark.fleet import rules as fleet

ROOT = generate.repo_root()


FILTERS = load_module("twinspark_filters_fleet", ROOT / "filter_plugins" / "twinspark.py")


def load(source):
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(source)])
    variables = VariableManager(loader=loader, inventory=inventory)
    hostvars = {host.name: variables.get_vars(host=host) for host in inventory.get_hosts()}
    return hostvars, inventory.get_groups_dict()


def pair(name, head, worker, subnet):
    return {"vars": {"twinspark_pair_name": name}, "hosts": {
        head: {"ansible_host": f"192.0.2.{subnet}1", "twinspark_fabric_address": f"198.51.{subnet}.1"},
        worker: {"ansible_host": f"192.0.2.{subnet}2", "twinspark_fabric_address": f"198.51.{subnet}.2"}}}


def fleet_inventory():
    """Two pairs and a router, in the layout docs/FLEET.md describes (documentation addresses only)."""
    return {"all": {
        "vars": {"twinspark_vllm_api_key": "fleet-test-only-key",
                 "twinspark_router_admin_key": "fleet-test-only-admin-key",
                 "vllm_service_api_allowed_networks": ["192.0.2.0/24"]},
        "children": {
            "twinspark_pair": {"children": {"pair_a": pair("pair_a", "a1", "a2", 1),
                                             "pair_b": pair("pair_b", "b1", "b2", 2)}},
            "twinspark_head": {"hosts": {"a1": None, "b1": None}},
            "twinspark_worker": {"hosts": {"a2": None, "b2": None}},
            "twinspark_router": {"hosts": {"r1": {"ansible_host": "192.0.2.100"}}},
        }}}


def problems_of(tmp_path, tree):
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(tree))
    hostvars, groups = load(path)
    return FILTERS.twinspark_pair_problems(hostvars, groups), hostvars, groups


@pytest.mark.parametrize("inventory", ["sim", "example"])
def test_the_one_pair_inventories_validate_as_before(inventory):
    hostvars, groups = load(ROOT / "inventory" / inventory)
    assert not fleet.is_fleet(hostvars, groups)
    assert fleet.problems(hostvars, groups) == []
    assert FILTERS.twinspark_pair_problems(hostvars, groups) == []
    assert fleet.pairs(hostvars, groups)[0] == [fleet.FleetPair("twinspark_pair", groups["twinspark_head"][0],
                                                           groups["twinspark_worker"][0])]


def test_the_documented_fleet_example_validates():
    hostvars, groups = load(ROOT / "inventory" / "fleet-example")
    # the one secret validation insists on; the operator adds it with ansible-vault, as the example says
    missing = "router-1: twinspark_router_admin_key is empty"
    assert [line[:len(missing)] for line in FILTERS.twinspark_pair_problems(hostvars, groups)] == [missing]
    for host in hostvars.values():
        host["twinspark_router_admin_key"] = "fleet-example-test-only-admin-key"
    assert FILTERS.twinspark_pair_problems(hostvars, groups) == []
    found, _ = fleet.pairs(hostvars, groups)
    assert [p.name for p in found] == ["pair_a", "pair_b"]


def test_two_pairs_and_a_router_validate(tmp_path):
    problems, hostvars, groups = problems_of(tmp_path, fleet_inventory())
    assert problems == []
    assert fleet.pairs(hostvars, groups)[0] == [fleet.FleetPair("pair_a", "a1", "a2"),
                                                fleet.FleetPair("pair_b", "b1", "b2")]


def test_each_node_gets_its_own_pairs_env(tmp_path):
    _, hostvars, groups = problems_of(tmp_path, fleet_inventory())
    env_b2 = FILTERS.twinspark_node_env(hostvars["b2"], "b2", groups, hostvars)
    env_a1 = FILTERS.twinspark_node_env(hostvars["a1"], "a1", groups, hostvars)
    assert env_b2["MASTER_ADDR"] == "198.51.2.1"
    assert env_a1["MASTER_ADDR"] == "198.51.1.1"


def test_a_pair_without_a_worker_is_named(tmp_path):
    tree = fleet_inventory()
    del tree["all"]["children"]["twinspark_pair"]["children"]["pair_b"]["hosts"]["b2"]
    del tree["all"]["children"]["twinspark_worker"]["hosts"]["b2"]
    problems, *_ = problems_of(tmp_path, tree)
    assert problems == ["pair pair_b: has 0 workers (none); it needs exactly one host that is both in group pair_b "
                        "and in twinspark_worker"]


def test_a_pair_without_a_head_is_named(tmp_path):
    tree = fleet_inventory()
    tree["all"]["children"]["twinspark_head"]["hosts"] = {"a1": None}
    problems, *_ = problems_of(tmp_path, tree)
    assert any(line.startswith("pair pair_b: has 0 heads") for line in problems), problems


def test_a_node_in_two_pairs_is_named(tmp_path):
    tree = fleet_inventory()
    tree["all"]["children"]["twinspark_pair"]["children"]["pair_b"]["hosts"]["a2"] = None
    problems, *_ = problems_of(tmp_path, tree)
    assert any(line.startswith("a2: is in two pairs (pair_a, pair_b)") for line in problems), problems


def test_a_port_clash_is_named(tmp_path):
    tree = fleet_inventory()
    # the router on pair_a's head, on the head's API port
    tree["all"]["children"]["twinspark_router"]["hosts"]["r1"] = {"ansible_host": "192.0.2.11",
                                                                  "twinspark_router_port": 8888}
    problems, *_ = problems_of(tmp_path, tree)
    assert ("port clash on 192.0.2.11:8888: a1 pair pair_a API (twinspark_vllm_port); r1 router API "
            "(twinspark_router_port) would all listen there; give each its own port (or address)") in problems


def test_a_router_with_no_pair_is_named(tmp_path):
    tree = {"all": {"children": {"twinspark_router": {"hosts": {"r1": {"ansible_host": "192.0.2.100"}}}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(tree))
    hostvars, groups = load(path)
    assert fleet.problems(hostvars, groups) == [
        "r1: is in twinspark_router but fronts no pair; add pairs to the inventory (a head and a worker each) or "
        "take r1 out of twinspark_router"]


def test_a_router_naming_an_unknown_pair_is_named(tmp_path):
    tree = fleet_inventory()
    tree["all"]["children"]["twinspark_router"]["hosts"]["r1"]["twinspark_router_pairs"] = ["pair_c"]
    problems, *_ = problems_of(tmp_path, tree)
    assert problems[0].startswith("r1: twinspark_router_pairs: pair_c is not a pair of this inventory")
    assert "r1: fronts no pair; list at least one pair in twinspark_router_pairs or leave it unset" in problems


def test_a_pair_name_that_is_not_a_group_is_named():
    hostvars = {h: {"twinspark_pair_name": "p"} for h in ("h", "w")}
    groups = {"all": ["h", "w"], "twinspark_pair": ["h", "w"], "twinspark_head": ["h"], "twinspark_worker": ["w"]}
    lines = fleet.problems(hostvars, groups)
    assert lines == ["pair p: no inventory group is called p; make the pair a group of that name holding its head "
                     "and worker (so --limit p means the pair)"]


def test_once_one_pair_is_named_every_node_must_be():
    hostvars = {"a1": {"twinspark_pair_name": "pa"}, "a2": {"twinspark_pair_name": "pa"}, "b1": {}, "b2": {}}
    groups = {"all": list(hostvars), "twinspark_pair": list(hostvars), "pa": ["a1", "a2"],
              "twinspark_head": ["a1", "b1"], "twinspark_worker": ["a2", "b2"]}
    lines = fleet.problems(hostvars, groups)
    assert [line.split(":")[0] for line in lines] == ["b1", "b2"]


def test_a_fabric_address_shared_by_two_pairs_is_named(tmp_path):
    tree = fleet_inventory()
    tree["all"]["children"]["twinspark_pair"]["children"]["pair_b"]["hosts"]["b1"]["twinspark_fabric_address"] = \
        "198.51.1.1"
    problems, *_ = problems_of(tmp_path, tree)
    assert ("twinspark_fabric_address: 198.51.1.1 is set on a1 (pair pair_a), b1 (pair pair_b); every node needs "
            "its own fabric address") in problems


def test_a_pairs_own_settings_problem_carries_the_pairs_name(tmp_path):
    tree = copy.deepcopy(fleet_inventory())
    tree["all"]["children"]["twinspark_pair"]["children"]["pair_b"]["hosts"]["b2"]["twinspark_vllm_port"] = "x"
    problems, *_ = problems_of(tmp_path, tree)
    assert problems and all(line.startswith("pair pair_b: ") for line in problems), problems


def test_the_router_lists_a_head_at_its_inventory_port_else_the_registrys_default():
    default = settings.load()["VLLM_PORT"].default
    assert fleet.head_url({"ansible_host": "10.0.0.1"}, "a1") == f"http://10.0.0.1:{default}"
    tls = {"twinspark_vllm_port": "9000", "twinspark_vllm_tls_cert": "/etc/ssl/head.crt"}
    assert fleet.head_url(tls, "fd00::1") == "https://[fd00::1]:9000"
    with pytest.raises(ValueError, match="twinspark_vllm_port"):
        fleet.head_url({"twinspark_vllm_port": "not-a-port"}, "a1")


def test_the_api_ports_default_is_written_in_the_registry_only():
    """settings.yml's VLLM_PORT default is the one place: no module of the package spells it again in code."""
    default = str(settings.load()["VLLM_PORT"].default)
    package = Path(fleet.__file__).parent
    spelled = [f"{path.relative_to(package)}: {line.strip()}" for path in sorted(package.rglob("*.py"))
               for line in _code_lines(path, path.read_text(encoding="utf-8")) if re.search(rf"\b{default}\b", line)]
    assert not spelled, f"use twinspark.api.default_port() (settings.yml) instead of {default}: {spelled}"


def test_the_fleet_summary_names_every_pair_and_the_router(tmp_path):
    _, hostvars, groups = problems_of(tmp_path, fleet_inventory())
    assert FILTERS.twinspark_fleet_summary(hostvars, groups) == [
        "pair pair_a: head a1 (rank 0), worker a2 (rank 1)", "pair pair_b: head b1 (rank 0), worker b2 (rank 1)",
        "router r1: fronts pair_a, pair_b"]


@pytest.mark.usefixtures("ansible_playbook")
def test_validate_playbook_accepts_a_fleet_and_names_a_broken_one(tmp_path):
    """playbooks/validate.yml runs on localhost only; the inventory's addresses are loopback ones regardless."""
    import os
    import subprocess

    tree = fleet_inventory()
    hosts = [host for group in tree["all"]["children"]["twinspark_pair"]["children"].values()
             for host in group["hosts"].values()]
    for number, host in enumerate(hosts, start=1):
        host["ansible_host"] = f"127.0.0.{number}"
    tree["all"]["children"]["twinspark_router"]["hosts"]["r1"]["ansible_host"] = "127.0.0.9"
    tree["all"]["vars"]["vllm_service_api_allowed_networks"] = ["127.0.0.0/8"]
    path = tmp_path / "hosts.yml"

    def run(inventory):
        path.write_text(yaml.safe_dump(inventory))
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
        return subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(path),
                               "playbooks/validate.yml"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300, check=False)

    good = run(tree)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "router r1: fronts pair_a, pair_b" in good.stdout
    del tree["all"]["children"]["twinspark_worker"]["hosts"]["b2"]
    bad = run(tree)
    assert bad.returncode != 0
    assert "pair pair_b: has 0 workers" in bad.stdout


@pytest.mark.parametrize("name", [fleet.PAIR_VAR, fleet.ROUTER_PAIRS_VAR, fleet.ROUTER_PORT_VAR,
                                  fleet.ROUTER_METRICS_PORT_VAR])
def test_the_fleet_variables_are_not_taken_for_misspelt_settings(name):
    from twinspark import nodeenv

    registry = settings.load()
    assert nodeenv._unknown_name(name, registry) is None


def test_a_pair_whose_firewall_would_refuse_the_router_is_named(tmp_path):
    tree = fleet_inventory()
    tree["all"]["children"]["twinspark_pair"]["children"]["pair_b"]["vars"]["vllm_service_api_allowed_networks"] = [
        "198.51.100.0/24"]
    problems, *_ = problems_of(tmp_path, tree)
    assert problems == [
        "r1: its address 192.0.2.100 is not in vllm_service_api_allowed_networks of pair pair_b (head b1), so that "
        "pair's firewall would refuse the router; add 192.0.2.100/32 or its network there"]


def test_a_router_known_by_name_only_is_not_judged_by_address():
    pair = fleet.FleetPair("p", "h", "w")
    assert fleet.router_admission_problem("r1", {"ansible_host": "router.example"}, pair, {}) is None
    assert fleet.router_admission_problem("r1", {"ansible_host": "192.0.2.5"}, pair,
                                          {"vllm_service_api_allowed_networks": "192.0.2.0/28"}) is None
    assert fleet.router_admission_problem("r1", {"ansible_host": "192.0.2.5"}, pair, {}) is not None


# --- drain settings from the inventory (fleet.drain_defaults) ----------------------------------------------------


def _drain_env(tmp_path, tree, host):
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(tree))
    hostvars, groups = load(path)
    env = FILTERS.twinspark_node_env(hostvars[host], host, groups, hostvars)
    return env.get("TWINSPARK_ROUTER_URL"), env.get("TWINSPARK_ROUTER_PAIR_URL")


def test_each_pair_drains_through_the_router_in_front_of_it_without_setting_a_url(tmp_path):
    tree = fleet_inventory()
    assert _drain_env(tmp_path, tree, "a2") == ("http://192.0.2.100:30000", "http://192.0.2.11:8888")
    assert _drain_env(tmp_path, tree, "b1") == ("http://192.0.2.100:30000", "http://192.0.2.21:8888")


def test_urls_set_by_hand_win_and_an_empty_router_url_turns_the_drain_off(tmp_path):
    tree = fleet_inventory()
    pair_a = tree["all"]["children"]["twinspark_pair"]["children"]["pair_a"]["vars"]
    pair_a["twinspark_router_url"] = "http://192.0.2.200:31000"
    pair_a["twinspark_router_pair_url"] = "http://192.0.2.111:8888"
    assert _drain_env(tmp_path, tree, "a1") == ("http://192.0.2.200:31000", "http://192.0.2.111:8888")
    pair_a["twinspark_router_url"] = ""
    del pair_a["twinspark_router_pair_url"]
    assert _drain_env(tmp_path, tree, "a1")[0] is None


def test_a_pair_no_router_fronts_and_a_one_pair_inventory_without_a_router_do_not_drain(tmp_path):
    tree = fleet_inventory()
    tree["all"]["children"]["twinspark_router"]["hosts"]["r1"]["twinspark_router_pairs"] = ["pair_a"]
    assert _drain_env(tmp_path, tree, "a1")[0] == "http://192.0.2.100:30000"
    assert _drain_env(tmp_path, tree, "b1") == (None, None)
    hostvars, groups = load(ROOT / "inventory" / "sim")
    env = FILTERS.twinspark_node_env(hostvars["node1"], "node1", groups, hostvars)
    assert "TWINSPARK_ROUTER_URL" not in env and "TWINSPARK_ROUTER_PAIR_URL" not in env


def test_the_simulated_fleet_drains_through_its_router_node(tmp_path):
    """inventory/sim-fleet sets no URL: the derived ones are what it used to spell by hand."""
    hostvars, groups = load(ROOT / "inventory" / "sim-fleet")
    for host, head in (("node1", "10.78.0.1"), ("node2", "10.78.0.1"), ("node3", "10.78.0.3"), ("node4", "10.78.0.3")):
        env = FILTERS.twinspark_node_env(hostvars[host], host, groups, hostvars)
        assert (env["TWINSPARK_ROUTER_URL"], env["TWINSPARK_ROUTER_PAIR_URL"]) == (
            "http://10.78.0.5:30000", f"http://{head}:8888")
        # the drain's key: the router's admin key (role serve_env writes it to the head's root-only file)
        assert env["TWINSPARK_ROUTER_ADMIN_KEY"] == hostvars["node5"]["twinspark_router_admin_key"]
    assert FILTERS.twinspark_pair_problems(hostvars, groups) == []


def test_each_head_learns_its_routers_admin_listener_for_the_router_its_env_files_name():
    """Issue 43, row 8: role router tells the heads whose drain goes to it where its admin listener is; the record
    names the router exactly as those heads' env files do (else the drain would not use it), and a head whose drain
    goes elsewhere gets none."""
    hostvars, groups = load(ROOT / "inventory" / "sim-fleet")
    plain = {host: hostvars[host] for host in groups["all"]}
    assert fleet.drain_heads(plain, groups, "node5") == ["node1", "node3"]
    record = fleet.admin_record(plain["node5"], "node5", "/var/lib/twinspark-control/router-ca.pem")
    assert record == {"router": "http://10.78.0.5:30000", "url": "https://10.78.0.5:30443",
                      "ca": "/var/lib/twinspark-control/router-ca.pem"}
    for head in ("node1", "node3"):
        env = FILTERS.twinspark_node_env(hostvars[head], head, groups, hostvars)
        assert drain.admin_listener(validate.base_url(env["TWINSPARK_ROUTER_URL"]), record) == (
            "https://10.78.0.5:30443", "/var/lib/twinspark-control/router-ca.pem")


def test_a_head_whose_drain_goes_elsewhere_gets_no_record_of_this_router(tmp_path):
    tree = fleet_inventory()
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(tree))
    hostvars, groups = load(path)
    assert fleet.drain_heads(hostvars, groups, "r1") == ["a1", "b1"]
    tree["all"]["children"]["twinspark_pair"]["children"]["pair_a"]["vars"]["twinspark_router_url"] = ""
    path.write_text(yaml.safe_dump(tree))
    hostvars, groups = load(path)
    assert fleet.drain_heads(hostvars, groups, "r1") == ["b1"]


@pytest.mark.parametrize(("admin", "expected"), [
    ("", "r1: twinspark_router_admin_key is empty; the router's admin paths (/add_worker, /remove_worker, ...) need a "
         "key of their own; set twinspark_router_admin_key in group_vars/all with ansible-vault"),
    ("fleet-test-only-key", "r1: twinspark_router_admin_key equals the clients' key (twinspark_vllm_api_key), which "
                            "would let every client add and remove the router's workers; set "
                            "twinspark_router_admin_key in group_vars/all")])
def test_a_router_without_an_admin_key_of_its_own_is_refused_before_any_host(tmp_path, admin, expected):
    tree = fleet_inventory()
    tree["all"]["vars"]["twinspark_router_admin_key"] = admin
    problems, _, _ = problems_of(tmp_path, tree)
    assert [line for line in problems if "twinspark_router_admin_key" in line] == [
        line for line in problems if line.startswith(expected)]
    assert len([line for line in problems if line.startswith(expected)]) == 1
    assert not any("fleet-test-only-key" in line for line in problems)


def test_a_head_whose_drain_key_differs_from_its_routers_is_named(tmp_path):
    tree = fleet_inventory()
    tree["all"]["children"]["twinspark_pair"]["children"]["pair_b"]["vars"][
        "twinspark_router_admin_key"] = "another-admin-key"
    problems, _, _ = problems_of(tmp_path, tree)
    assert problems == ["pair pair_b: twinspark_router_admin_key on its head b1 differs from router r1's, so the "
                        "drain would be refused (403); set it once, in group_vars/all"]


def test_a_one_pair_inventory_without_a_router_needs_no_admin_key(tmp_path):
    tree = fleet_inventory()
    del tree["all"]["children"]["twinspark_router"]
    del tree["all"]["vars"]["twinspark_router_admin_key"]
    problems, _, _ = problems_of(tmp_path, tree)
    assert not any("admin_key" in line for line in problems)
