"""Per-pair roles on a fleet inventory: every node resolves ITS pair's head, worker, fabric peer and model source,
the node plays of site.yml reach every pair node and never the router, and upgrade/rollback stop when a run covers
two pairs. Ansible evaluates the repository's own expressions (role defaults, role vars, the task's set_fact) with
this repository's filter_plugins; nothing here contacts a host (`--list-hosts` and controller-only plays)."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml
from test_fleet_inventory import fleet_inventory, problems_of

from twinspark import generate
from twinspark.fleet import rules as fleet

ROOT = generate.repo_root()
FLEET = ROOT / "inventory" / "fleet-example"
SIM = ROOT / "inventory" / "sim"
ANSIBLE_ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}


def _task_expression(path, task_name, key):
    """One set_fact expression of a role's task file, exactly as the role has it."""
    tasks = yaml.safe_load((ROOT / path).read_text())
    task = next(t for t in tasks if t["name"] == task_name)
    return task["ansible.builtin.set_fact"][key]


def evaluator(source):
    """(names, evaluate(host, expression)): templates an expression for one host the way a play of the roles does,
    with twinspark_layout's defaults, model_cache's vars and this repository's filters."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import filter_loader
    from ansible.template import Templar, trust_as_template
    from ansible.vars.hostvars import HostVars
    from ansible.vars.manager import VariableManager

    filter_loader.add_directory(str(ROOT / "filter_plugins"))
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(source)])
    variables = VariableManager(loader=loader, inventory=inventory)
    hostvars = HostVars(inventory=inventory, variable_manager=variables, loader=loader)
    role_vars = {
        **loader.load_from_file(str(ROOT / "roles/twinspark_layout/defaults/main.yml"), trusted_as_template=True),
        **loader.load_from_file(str(ROOT / "roles/model_cache/vars/main.yml"), trusted_as_template=True),
        **loader.load_from_file(str(ROOT / "roles/model_cache/defaults/main.yml"), trusted_as_template=True),
    }
    fabric_check = loader.load_from_file(str(ROOT / "playbooks/fabric-check.yml"), trusted_as_template=True)
    play_vars = {**fabric_check[0]["vars"], "fabric_check_devices": fabric_check[1]["vars"]["fabric_check_devices"]}
    peers = _task_expression("roles/spark_fabric/tasks/plan.yml", "Record this node's fabric plan, so its peers can "
                             "read it", "spark_fabric_peers")
    peer = peers.replace("}}", "| first | default('') }}")  # a pair's node: its one peer

    def evaluate(host, expression):
        host_vars = variables.get_vars(host=inventory.get_host(host))
        templar = Templar(loader=loader, variables={**role_vars, **play_vars, **host_vars, "hostvars": hostvars,
                                                    "spark_fabric_peer_rule": trust_as_template(peer)})
        return templar.template(trust_as_template(expression))

    return [host.name for host in inventory.get_hosts()], evaluate


FLEET_EXPECTED = {
    # host: (pair, head, worker, fabric peer, master address of the fabric check)
    "spark-a1": ("pair_a", "spark-a1", "spark-a2", "spark-a2", "198.51.100.1"),
    "spark-a2": ("pair_a", "spark-a1", "spark-a2", "spark-a1", "198.51.100.1"),
    "spark-b1": ("pair_b", "spark-b1", "spark-b2", "spark-b2", "198.51.100.5"),
    "spark-b2": ("pair_b", "spark-b1", "spark-b2", "spark-b1", "198.51.100.5"),
}


@pytest.fixture(scope="module")
def fleet_eval():
    return evaluator(FLEET)[1]


@pytest.mark.parametrize("host", sorted(FLEET_EXPECTED))
def test_each_fleet_node_resolves_its_own_pair(fleet_eval, host):
    name, head, worker, peer, master = FLEET_EXPECTED[host]
    assert fleet_eval(host, "{{ twinspark_layout_pair_name }}") == name
    assert fleet_eval(host, "{{ twinspark_layout_head_host }}") == head
    assert fleet_eval(host, "{{ twinspark_layout_worker_host }}") == worker
    assert list(fleet_eval(host, "{{ twinspark_layout_pair_hosts }}")) == [head, worker]
    assert fleet_eval(host, "{{ twinspark_layout_is_head }}") == (host == head)
    assert fleet_eval(host, "{{ model_cache_head }}") == head
    assert fleet_eval(host, "{{ spark_fabric_peer_rule }}") == peer
    assert fleet_eval(host, "{{ fabric_check_master }}") == master
    # the head's ib_write_bw runs (gb10) go to its own pair's worker, one per HCA of the selector
    targets = fleet_eval(host, "{{ inventory_hostname | twinspark_rdma_targets(fabric_check_devices, groups, "
                               "hostvars) }}")
    assert [target["peer"] for target in targets] == [peer, peer]


def test_a_one_pair_inventory_with_two_heads_reports_its_problem(tmp_path):
    tree = {"all": {"children": {"twinspark_pair": {"children": {
        "twinspark_head": {"hosts": {"h1": None, "h2": None}}, "twinspark_worker": {"hosts": {"w": None}}}}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(tree))
    _, evaluate = evaluator(path)
    assert evaluate("w", "{{ twinspark_layout_head_host }}") == "h1"  # the first head, as always
    assert evaluate("w", "{{ twinspark_layout_pair.problems | length }}") == 1
    assert not _pair_check_passes(evaluate, "w")


def _pair_check_passes(evaluate, host):
    """The one check of the pair (twinspark_layout's tasks/pair_check.yml, which vllm_service and model_cache
    include), its conditions evaluated for host."""
    for role in ("vllm_service/tasks/assert.yml", "model_cache/tasks/preflight.yml"):
        tasks = yaml.safe_load((ROOT / "roles" / role).read_text())
        assert {"name": "twinspark_layout", "tasks_from": "pair_check"} in [
            t.get("ansible.builtin.include_role") for t in tasks], f"{role}: include the one pair check"
    tasks = yaml.safe_load((ROOT / "roles/twinspark_layout/tasks/pair_check.yml").read_text())
    that = next(t for t in tasks if t["name"].startswith("Check that this node's pair"))["ansible.builtin.assert"]
    return all(evaluate(host, "{{ " + condition + " }}") for condition in that["that"])


@pytest.mark.parametrize("host", sorted(FLEET_EXPECTED))
def test_vllm_services_pair_check_passes_on_every_fleet_node(fleet_eval, host):
    assert _pair_check_passes(fleet_eval, host)


def test_the_router_of_a_fleet_has_no_pair_and_says_so(fleet_eval):
    with pytest.raises(Exception, match=r"router-1: is in no well-formed pair of this fleet inventory"):
        fleet_eval("router-1", "{{ twinspark_layout_head_host }}")


def test_the_simulated_pair_resolves_as_before():
    names, evaluate = evaluator(SIM)
    assert sorted(names) == ["node1", "node2"]
    for host, peer in (("node1", "node2"), ("node2", "node1")):
        assert evaluate(host, "{{ twinspark_layout_head_host }}") == "node1"
        assert evaluate(host, "{{ twinspark_layout_worker_host }}") == "node2"
        assert evaluate(host, "{{ model_cache_head }}") == "node1"
        assert evaluate(host, "{{ twinspark_layout_pair_name }}") == "twinspark_pair"
        assert evaluate(host, "{{ spark_fabric_peer_rule }}") == peer
        assert evaluate(host, "{{ fabric_check_master }}") == "10.77.0.1"


def test_own_pair_rule_one_pair_and_fleet():
    one = {"all": ["h", "w"], "twinspark_head": ["h"], "twinspark_worker": ["w"]}
    assert fleet.own_pair("w", {}, one) == fleet.FleetPair("twinspark_pair", "h", "w")
    # groups the one-pair rule refuses are read as the roles always read them (first host of each), never raised
    # here: playbooks/validate.yml refuses them before any host is touched
    assert fleet.own_pair("h", {}, {**one, "twinspark_head": ["h", "h2"]}) == fleet.FleetPair("twinspark_pair", "h",
                                                                                                "w")
    partial = fleet.own_pair("h", {}, {"all": ["h"], "twinspark_head": ["h"]})
    assert partial == fleet.FleetPair("twinspark_pair", "h", "") and partial.hosts == ["h"]
    named = {h: {"twinspark_pair_name": p} for h, p in (("a1", "pa"), ("a2", "pa"), ("b1", "pb"), ("b2", "pb"))}
    groups = {"all": [*named, "r"], "pa": ["a1", "a2"], "pb": ["b1", "b2"], "twinspark_head": ["a1", "b1"],
              "twinspark_worker": ["a2", "b2"], "twinspark_router": ["r"]}
    assert fleet.own_pair("b2", named, groups) == fleet.FleetPair("pb", "b1", "b2")
    assert fleet.own_pair("a1", named, groups) == fleet.FleetPair("pa", "a1", "a2")
    assert fleet.own_pair("r", named, groups) is None


def list_hosts(inventory, playbook="site.yml", *extra):
    """[(pattern, [hosts])] per play, from ansible-playbook --list-hosts (which contacts no host)."""
    run = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), playbook,
                          "--list-hosts", *extra], cwd=ROOT, env=ANSIBLE_ENV, capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    plays, current = [], None
    for line in run.stdout.splitlines():
        text = line.strip()
        if text.startswith("pattern:"):
            current = ((yaml.safe_load(text.split(":", 1)[1]) or [""])[0], [])
            plays.append(current)
        elif current and line.startswith("      ") and not text.startswith("hosts ("):
            current[1].append(text)
    return plays


@pytest.mark.usefixtures("ansible_playbook")
def test_every_node_play_of_site_yml_reaches_every_fleet_node_and_the_router_only_its_own():
    plays = list_hosts(FLEET)
    nodes = {"spark-a1", "spark-a2", "spark-b1", "spark-b2"}
    pair_plays = [hosts for pattern, hosts in plays if pattern == "twinspark_pair"]
    head_plays = [hosts for pattern, hosts in plays if pattern == "twinspark_head"]
    assert len(pair_plays) >= 6 and head_plays
    assert all(set(hosts) == nodes for hosts in pair_plays), plays
    assert all(set(hosts) == {"spark-a1", "spark-b1"} for hosts in head_plays), plays
    # the router is reached by its own play (playbooks/router_service.yml) and, as the inventory's monitor host
    # (twinspark_monitor), by the monitoring play for a monitor outside the pairs (playbooks/monitoring.yml), by them
    # alone; the validation play ("all", so that a --limit run is validated too) lists every host but contacts none
    assert plays[0][0] == "all" and set(plays[0][1]) == nodes | {"router-1"}
    # (those plays' hosts are the members of their groups, so their patterns read as them)
    assert [hosts for pattern, hosts in plays if pattern != "all" and "router-1" in hosts] == [["router-1"]] * 2
    assert [pattern for pattern, hosts in plays if hosts == ["router-1"]] == ["router-1"] * 2
    assert {pattern for pattern, _ in plays} <= {"all", "twinspark_pair", "twinspark_head", "router-1"}


@pytest.mark.usefixtures("ansible_playbook")
def test_limit_selects_one_pair_of_the_fleet():
    plays = list_hosts(FLEET, "site.yml", "--limit", "pair_b")
    assert all(set(hosts) <= {"spark-b1", "spark-b2"} for _, hosts in plays)
    assert any(set(hosts) == {"spark-b1", "spark-b2"} for _, hosts in plays)
    # the validation play is among them: a limited run is validated too
    assert plays[0][0] == "all" and set(plays[0][1]) == {"spark-b1", "spark-b2"}


@pytest.mark.usefixtures("ansible_playbook")
def test_the_simulated_pairs_plays_list_its_two_nodes():
    plays = list_hosts(SIM)
    assert all(set(hosts) == {"node1", "node2"} for pattern, hosts in plays if pattern == "twinspark_pair")
    assert all(hosts == ["node1"] for pattern, hosts in plays if pattern == "twinspark_head")


def test_a_pair_outside_twinspark_pair_is_named(tmp_path):
    tree = fleet_inventory()
    children = tree["all"]["children"]
    children["pair_b"] = children["twinspark_pair"]["children"].pop("pair_b")
    problems, *_ = problems_of(tmp_path, tree)
    assert problems == [
        f"{host}: is a node of pair pair_b but not in group twinspark_pair, so no node play reaches it; put the pair "
        "groups under twinspark_pair (children of twinspark_pair in hosts.yml)" for host in ("b1", "b2")]


def test_a_router_inside_twinspark_pair_is_named(tmp_path):
    tree = fleet_inventory()
    tree["all"]["children"]["twinspark_pair"]["hosts"] = {"r1": None}
    problems, *_ = problems_of(tmp_path, tree)
    assert problems == ["r1: is in twinspark_router and in twinspark_pair, so the node plays would run on the "
                        "router; keep the router beside the pair groups, out of twinspark_pair"]


def test_twinspark_pair_cannot_name_a_pair_of_a_fleet():
    named = {h: {"twinspark_pair_name": "twinspark_pair"} for h in ("h", "w")}
    groups = {"all": ["h", "w"], "twinspark_pair": ["h", "w"], "twinspark_head": ["h"], "twinspark_worker": ["w"]}
    assert any(line.startswith("twinspark_pair_name: 'twinspark_pair' cannot name a pair")
               for line in fleet.problems(named, groups))


def _guard_playbook(tmp_path, playbook):
    """The playbook's own one-pair guard play, then a play that only says it was reached (debug: controller only)."""
    plays = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())
    guard = next(play for play in plays if "hosts" in play)
    include = guard["tasks"][0]["ansible.builtin.include_tasks"]
    guard["tasks"][0]["ansible.builtin.include_tasks"] = str(ROOT / "playbooks" / include)
    reached = {"name": "Reached", "hosts": "twinspark_pair", "gather_facts": False,
               "tasks": [{"name": "Say so", "ansible.builtin.debug": {"msg": "reached {{ inventory_hostname }}"}}]}
    path = tmp_path / f"guard-{playbook}"
    path.write_text(yaml.safe_dump([guard, reached]))
    return path


def _loopback_fleet(tmp_path):
    tree = fleet_inventory()
    hosts = [host for group in tree["all"]["children"]["twinspark_pair"]["children"].values()
             for host in group["hosts"].values()]
    for number, host in enumerate(hosts, start=1):
        host["ansible_host"] = f"127.0.0.{number}"
    tree["all"]["vars"]["ansible_connection"] = "local"
    tree["all"]["children"]["twinspark_router"]["hosts"]["r1"]["ansible_host"] = "127.0.0.9"
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.mark.usefixtures("ansible_playbook")
@pytest.mark.parametrize(("playbook", "what"), [("upgrade.yml", "upgrade"), ("rollback.yml", "roll back")])
def test_upgrade_and_rollback_stop_when_a_run_covers_two_pairs(tmp_path, playbook, what):
    guard, inventory = _guard_playbook(tmp_path, playbook), _loopback_fleet(tmp_path)

    def run(*extra):
        return subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(guard),
                               *extra], cwd=ROOT, env=ANSIBLE_ENV, capture_output=True, text=True, timeout=300,
                              check=False)

    whole = run()
    assert whole.returncode != 0
    assert f"{what} a fleet one pair at a time: --limit <pair> (this run covers pair_a, pair_b)" in whole.stdout
    assert "reached" not in whole.stdout
    one = run("--limit", "pair_a")
    assert one.returncode == 0, one.stdout + one.stderr
    assert "reached a1" in one.stdout and "reached a2" in one.stdout and "b1" not in one.stdout


def test_upgrade_and_rollback_work_on_the_pair_of_the_head_they_run_on():
    for playbook in ("upgrade.yml", "rollback.yml", "fabric-check.yml"):
        text = (ROOT / "playbooks" / playbook).read_text()
        assert "groups['twinspark_pair']" not in text and "groups['twinspark_head']" not in text, playbook
    upgrade = yaml.safe_load((ROOT / "playbooks" / "upgrade.yml").read_text())
    assert upgrade[-1]["vars"]["upgrade_nodes"] == "{{ twinspark_layout_pair_hosts }}"


def _validate_then_reached(tmp_path):
    """playbooks/validate.yml, then a play that only says it was reached (debug: controller only)."""
    reached = {"name": "Reached", "hosts": "twinspark_pair", "gather_facts": False,
               "tasks": [{"name": "Say so", "ansible.builtin.debug": {"msg": "reached {{ inventory_hostname }}"}}]}
    path = tmp_path / "validate-then-reached.yml"
    path.write_text(yaml.safe_dump([{"name": "Validate", "ansible.builtin.import_playbook":
                                     str(ROOT / "playbooks" / "validate.yml")}, reached]))
    return path


@pytest.mark.usefixtures("ansible_playbook")
@pytest.mark.parametrize("limit", [None, "pair_a", "a2"])
def test_validation_judges_the_whole_inventory_whatever_the_limit_and_stops_every_host(tmp_path, limit):
    """`--limit pair_a` (or one node) still runs the validation, on the whole inventory: a broken pair_b stops the
    run before any play reaches a host, pair_a's included."""
    playbook = _validate_then_reached(tmp_path)
    inventory = _loopback_fleet(tmp_path)
    tree = yaml.safe_load(inventory.read_text())
    extra = ["--limit", limit] if limit else []

    def run():
        return subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(playbook),
                               *extra], cwd=ROOT, env=ANSIBLE_ENV, capture_output=True, text=True, timeout=300,
                              check=False)

    good = run()
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Inventory valid:" in good.stdout and f"reached {limit if limit == 'a2' else 'a1'}" in good.stdout
    del tree["all"]["children"]["twinspark_worker"]["hosts"]["b2"]
    inventory.write_text(yaml.safe_dump(tree))
    bad = run()
    assert bad.returncode != 0
    assert "pair pair_b: has 0 workers" in bad.stdout
    assert "reached" not in bad.stdout


@pytest.mark.usefixtures("ansible_playbook")
def test_a_one_pair_inventory_runs_site_yml_without_a_pattern_warning():
    """The router play on an inventory with no twinspark_router group matches no host, quietly."""
    run = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(SIM), "site.yml",
                          "--list-hosts"], cwd=ROOT, env=ANSIBLE_ENV, capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Could not match supplied host pattern" not in run.stdout + run.stderr


def test_the_rejoin_step_runs_behind_a_router_and_is_skipped_on_a_pair_without_one(fleet_eval):
    """roles/vllm_service/tasks/_pair_rejoin.yml: a remote command on every serve run of a fleet's heads; none on a
    one-pair inventory with no router, unless twinspark_router_url is set by hand."""
    tasks = yaml.safe_load((ROOT / "roles/vllm_service/tasks/_pair_rejoin.yml").read_text())
    conditions = [c for c in tasks[0]["when"] if c != "not ansible_check_mode"]

    def runs(evaluate, host):
        return all(evaluate(host, "{{ " + c + " }}") for c in conditions)

    assert runs(fleet_eval, "spark-a1") and runs(fleet_eval, "spark-b1")
    _, sim_eval = evaluator(SIM)
    assert not runs(sim_eval, "node1")
    assert runs(lambda host, expression: sim_eval(host, expression.replace(
        "twinspark_router_url", "'http://192.0.2.9:30000'")), "node1")
