"""Ansible filters over twinspark.nodeenv: a node's env from the inventory, and the pair's problems.

The rules live in the Python package (python_tools/twinspark); these filters only adapt Ansible's variables to
it. The package is imported from this checkout's python_tools/ when it is not installed on the controller.
"""

from __future__ import annotations

import runpy
from collections import ChainMap
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))  # python_tools/ on sys.path

from ansible.errors import AnsibleFilterError
from twinspark import budget, envfile, group, nodeenv, recipe, settings, tls, wheelhouse
from twinspark.fabric import links
from twinspark.fleet import rules as fleet

# Parsed once, when the plugin loads: callback_plugins/twinspark_plugin_preload.py loads it in ansible-playbook's own
# process, so each task's forked worker inherits the parsed registry instead of parsing settings.yml again.
settings.load()

HEAD_GROUP = nodeenv.HEAD_GROUP
WORKER_GROUP = nodeenv.WORKER_GROUP


def _split_args(args):
    """Accept (hostvars, groups) or (host name, groups, hostvars) in any order: tell them apart by shape."""
    host_name = groups = all_hostvars = None
    for arg in args:
        if isinstance(arg, str):
            host_name = arg
        elif hasattr(arg, "get") and isinstance(arg.get("all"), (list, tuple)):
            groups = arg
        else:
            all_hostvars = arg
    if groups is None or all_hostvars is None:
        raise AnsibleFilterError("twinspark_node_env needs hostvars and groups, e.g. "
                                 "hostvars[inventory_hostname] | twinspark_node_env(hostvars, groups)")
    return host_name, groups, all_hostvars


def _pair(groups, all_hostvars):
    head, worker = nodeenv.pair_hosts(groups)
    return head, worker, nodeenv.pair_envs({head: all_hostvars[head], worker: all_hostvars[worker]}, head, worker)


def _group_envs(found, all_hostvars):
    """Every rank's (serve, secrets) env of the inventory's group (nodeenv.group_envs); NodeEnvError names what is
    wrong."""
    return nodeenv.group_envs({host: all_hostvars[host] for host in found.ranks}, found.ranks, found.tp, found.pp)


def _plain_hostvars(all_hostvars, groups):
    return {host: all_hostvars[host] for host in groups.get("all", []) if host in all_hostvars}


def _own_pair_groups(host_name, groups, all_hostvars):
    """In a fleet inventory, the two-host groups view of host_name's pair (docs/FLEET.md); else groups unchanged."""
    plain = _plain_hostvars(all_hostvars, groups)
    if not fleet.is_fleet(plain, groups):
        return groups
    pair = fleet.own_pair(host_name, plain, groups)
    return fleet.pair_groups(pair) if pair else groups


def _with_drain_defaults(host_name, groups, all_hostvars):
    """all_hostvars, with host_name's pair's two hosts reading the drain settings the inventory implies
    (fleet.drain_defaults) wherever they are not set by hand; set to "" they stay off."""
    plain = _plain_hostvars(all_hostvars, groups)
    defaults = fleet.drain_defaults(host_name, plain, groups)
    if not defaults:
        return all_hostvars
    pair = fleet.own_pair(host_name, plain, groups)
    return {host: ChainMap(all_hostvars[host], defaults) for host in pair.hosts}


def twinspark_own_pair(host_name, *args):
    """host_name's own pair as {name, head, worker, hosts: [head, worker], problems} (rule: twinspark.fleet.rules.own_pair),
    e.g. inventory_hostname | twinspark_own_pair(groups, hostvars); the roles read it through twinspark_layout.
    problems: what is wrong with a one-pair inventory's groups (nodeenv.group_problems), [] on a fleet, whose pairs
    are only ever returned well-formed."""
    _, groups, all_hostvars = _split_args(args)
    plain = _plain_hostvars(all_hostvars, groups)
    pair = fleet.own_pair(str(host_name), plain, groups)
    if pair is None:
        raise AnsibleFilterError(f"{host_name}: is in no well-formed pair of this fleet inventory; put it in its "
                                 f"pair's group under {fleet.SINGLE_PAIR} (playbooks/validate.yml names what is "
                                 "wrong) or leave it out of the play")
    found = fleet.group_of(plain, groups)
    if found is not None:
        problems = list(found.problems) + fleet.group_placement_problems(found, groups)
    else:
        problems = [] if fleet.is_fleet(plain, groups) else nodeenv.group_problems(groups)
    return {"name": pair.name, "head": pair.head, "worker": pair.worker, "more": list(pair.more), "hosts": pair.hosts,
            "problems": problems}


def twinspark_guard_rank_args(more, all_hostvars):
    """The `twinspark pair` words for ranks 2..N-1 of a group (`more`: their hosts in rank order, as
    twinspark_own_pair gives them): --rank=R:ADDRESS for each rank's fabric address, then its management address, the
    order the guard tries them in (as --worker for rank 1). [] for a pair."""
    addresses = twinspark_peer_addresses(more, all_hostvars)
    return [f"--rank={rank}:{address}" for rank, host in enumerate(more, start=2) for address in addresses[host]]


def twinspark_peer_addresses(hosts, all_hostvars, fabric_only=False):
    """{host: its addresses, fabric first, then management} for each of `hosts` (the ranks a head's key reaches), as
    role peer_key records them in the holder's known_hosts; fabric_only: the fabric address alone."""
    found = {}
    for host in hosts:
        own = all_hostvars[host]
        addresses = [own.get("twinspark_fabric_address")]
        if not fabric_only:
            addresses.append(own.get("ansible_host") or host)
        found[host] = [address for address in dict.fromkeys(addresses) if address]
    return found


def twinspark_fabric_peers(host_name, *args):
    """The nodes host_name's fabric links reach, in rank order (rule: twinspark.group.fabric_peers): its group's other
    members (inventory group twinspark_group), else its pair's other node, e.g.
    inventory_hostname | twinspark_fabric_peers(groups, hostvars)."""
    _, groups, all_hostvars = _split_args(args)
    plain = _plain_hostvars(all_hostvars, groups)
    host = str(host_name)
    if host in (groups.get(group.GROUP_GROUP) or []):
        return group.fabric_peers(host, groups, plain)
    return group.fabric_peers(host, groups, plain, twinspark_own_pair(host, groups, all_hostvars)["hosts"])


def twinspark_fabric_cables(host_name, *args):
    """A mesh or ring node's fabric interfaces from its group's link list (rule: twinspark.group.cable_interfaces),
    [] anywhere else, e.g. inventory_hostname | twinspark_fabric_cables(groups, hostvars, 'cpu')."""
    profile = next((str(arg) for arg in args if isinstance(arg, str)), "gb10")
    _, groups, all_hostvars = _split_args([arg for arg in args if not isinstance(arg, str)])
    host = str(host_name)
    members = [str(member) for member in groups.get(group.GROUP_GROUP) or []]
    if host not in members:
        return []
    found = group.read(group.GROUP_GROUP, members, _plain_hostvars(all_hostvars, groups), groups)
    return [] if found.problems else group.cable_interfaces(found, host, profile)


def twinspark_rdma_targets(host_name, devices, *args):
    """The ib_write_bw runs host_name (rank 0) makes on gb10, one per HCA of `devices` and peer its fabric reaches
    (rule: twinspark.fabric.links.rdma_targets): {peer, device, twin, address, port}. A peer's addresses: on a mesh or
    ring its cable ends towards host_name, else its spark_fabric_interfaces, else its twinspark_fabric_address, e.g.
    inventory_hostname | twinspark_rdma_targets(devices, groups, hostvars)."""
    _, groups, all_hostvars = _split_args(args)
    host = str(host_name)
    peer_addresses = {}
    for peer in twinspark_fabric_peers(host, groups, all_hostvars):
        own = all_hostvars[peer]
        cabled = [entry["address"] for entry in twinspark_fabric_cables(peer, groups, all_hostvars, "gb10")
                  if entry["peer"] == host]
        interfaces = [entry.get("address") for entry in own.get("spark_fabric_interfaces") or []]
        peer_addresses[peer] = cabled or interfaces or [own.get("twinspark_fabric_address")]
    try:
        return links.rdma_targets(peer_addresses, [str(device) for device in devices])
    except ValueError as error:
        raise AnsibleFilterError(f"twinspark_rdma_targets: {error}") from error


def twinspark_group_problems(all_hostvars, groups, scope="serving"):
    """Every problem of the inventory's group (inventory group twinspark_group, docs/GROUPS.md), one line each, judged
    on the controller before any host is touched: ranks, layout against the recipe its rank 0 names (the profile's
    default recipe when it names none), topology and node count, addresses. [] when the inventory has no group.
    scope 'fabric' (role spark_fabric, which cables and addresses the nodes and serves nothing): everything but what
    the recipe decides (its heads, its pipeline support, its listed layouts); TP x PP must still equal the node
    count."""
    members = [str(host) for host in groups.get(group.GROUP_GROUP) or []]
    if not members:
        return []
    plain = _plain_hostvars(all_hostvars, groups)
    found = group.read(group.GROUP_GROUP, members, plain, groups)
    if scope == "fabric":
        return group.problems([found], plain)
    first = plain.get(found.ranks[0], {}) if found.ranks else {}
    profile = str(first.get("twinspark_profile") or "gb10")
    try:
        chosen = recipe.chosen(profile, str(first.get(recipe.RECIPE_VAR) or "") or None)
    except recipe.RecipeError as error:
        return [str(error)]
    return group.problems([found], plain, {found.name: chosen})


def twinspark_node_env(host_vars, *args):
    """This node's env as {ENV_NAME: value} (serve and secrets together; use no_log where secrets may show)."""
    host_name, groups, all_hostvars = _split_args(args)
    host_name = host_name or str(host_vars["inventory_hostname"])
    found = fleet.group_of(_plain_hostvars(all_hostvars, groups), groups)
    if found is not None and host_name in found.ranks:
        try:
            serve, secrets = _group_envs(found, all_hostvars)[host_name]
        except nodeenv.NodeEnvError as error:
            raise AnsibleFilterError("invalid TwinSpark inventory:\n" + str(error)) from None
        return {**serve, **secrets}
    pair_groups = _own_pair_groups(host_name, groups, all_hostvars)
    all_hostvars, groups = _with_drain_defaults(host_name, groups, all_hostvars), pair_groups
    try:
        _, _, envs = _pair(groups, all_hostvars)
    except nodeenv.NodeEnvError as error:
        raise AnsibleFilterError("invalid TwinSpark inventory:\n" + str(error)) from None
    if host_name not in envs:
        raise AnsibleFilterError(f"{host_name}: is neither in {HEAD_GROUP} nor in {WORKER_GROUP}; add it to one "
                                 "of them or leave it out of the play")
    serve, secrets = envs[host_name]
    return {**serve, **secrets}


def twinspark_pair_problems(all_hostvars, groups):
    """Every problem of the inventory, one line each: the fleet's rules (python_tools/twinspark/fleet/rules.py: pairs,
    router, port clashes), then each pair's own, prefixed by the pair's name when the inventory names its pairs."""
    plain = _plain_hostvars(all_hostvars, groups)
    members = [str(host) for host in groups.get(group.GROUP_GROUP) or []]
    if members:
        return _group_inventory_problems(plain, groups, members)
    lines = fleet.problems(plain, groups)
    if not fleet.is_fleet(plain, groups):
        heads = groups.get(HEAD_GROUP) or []
        with_drain = _with_drain_defaults(heads[0], groups, all_hostvars) if len(heads) == 1 else all_hostvars
        return _one_pair_problems(with_drain, groups) + lines
    for pair in fleet.pairs(plain, groups)[0]:
        with_drain = _with_drain_defaults(pair.head, groups, all_hostvars)
        lines += [f"pair {pair.name}: {line}" for line in _one_pair_problems(with_drain, fleet.pair_groups(pair))]
    return lines


def _group_inventory_problems(plain, groups, members):
    """site.yml on an inventory whose nodes sit in group twinspark_group (docs/GROUPS.md): every problem of the group
    as serving judges it (ranks, layout against the recipe, topology, addresses), where its ranks sit (rank 0 in
    twinspark_head, the others in twinspark_worker), then each rank's env files and retired settings. A router in
    the same inventory is refused: a fleet of groups is not built."""
    routers = [str(host) for host in groups.get(fleet.ROUTER_GROUP) or []]
    if routers:
        line = (f"group {fleet.ROUTER_GROUP} ({', '.join(routers)}): a router in front of a group (a fleet of "
                "groups) is not built yet; remove it from this group's inventory, or route to pairs (docs/FLEET.md; "
                "docs/GROUPS.md, \"Not built yet\")")
        return [line]
    lines = twinspark_group_problems(plain, groups)
    if lines:
        return lines
    found = group.read(group.GROUP_GROUP, members, plain, groups)
    if found.topology in ("mesh", "ring"):
        return [(f"group {group.GROUP_GROUP} is a {found.topology}: site.yml serves a group through a switch so far "
                 "(a mesh or ring has no one fabric address per node for the rendezvous); playbooks/fabric.yml "
                 "configures and checks its cables (docs/GROUPS.md, \"Not built yet\")")]
    lines = fleet.group_placement_problems(found, groups)
    lines += [f"{host}: {line}" for host in found.ranks for line in budget.retired_problems(plain.get(host, {}))]
    try:
        _group_envs(found, plain)
    except nodeenv.NodeEnvError as error:
        lines += list(error.problems)
    return lines


def _one_pair_problems(all_hostvars, groups):
    """Every problem of one pair, one line each; empty when both nodes' envs are valid (and, under the fork
    flavour, their vllm_runtime_fork_wheels are usable)."""
    hosts = () if nodeenv.group_problems(groups) else nodeenv.pair_hosts(groups)
    retired = [f"{host}: {line}" for host in hosts for line in budget.retired_problems(all_hostvars.get(host, {}))]
    try:
        head, worker, envs = _pair(groups, all_hostvars)
    except nodeenv.NodeEnvError as error:
        return list(error.problems) + retired
    found = {host: wheelhouse.problems(all_hostvars[host].get("vllm_runtime_fork_wheels", []))
             for host in (head, worker) if envs[host][0].get("TWINSPARK_RUNTIME_FLAVOUR") == "fork"}
    if len(found) == 2 and found[head] == found[worker]:
        lines = [f"{head}, {worker}: {line}" for line in found[head]]
    else:
        lines = [f"{host}: {line}" for host, lines in found.items() for line in lines]
    # The API's TLS files (twinspark_vllm_tls_*) are read on the controller: missing, oversized or mismatched
    # files stop the run here, before any host is touched.
    return (lines + retired + [f"{head}: {line}" for line in tls.controller_problems(all_hostvars[head])]
            + _group_problems(head, worker, all_hostvars, groups, envs[head][0]))


def _group_problems(head, worker, all_hostvars, groups, head_env):
    """The pair read as the group of two (python_tools/twinspark/group.py): its ranks, topology, cables and layout
    against the recipe its head's env names (the profile's default recipe when it names none)."""
    plain = {host: all_hostvars[host] for host in (head, worker)}
    pair = group.read(fleet.SINGLE_PAIR, [head, worker], plain, groups)
    try:
        chosen = recipe.for_values(head_env)
    except recipe.RecipeError:
        chosen = None  # an unknown recipe is already named by the env's own check
    found = group.problems([pair], plain, {pair.name: chosen})
    if not found and pair.ranks[0] != head:
        found.append(f"{group.RANK_VAR} 0 is {pair.ranks[0]}, but {head} is the pair's head (twinspark_head): the "
                     "head is rank 0; remove twinspark_rank from both nodes or swap the groups")
    return found or group.pair_support_problems(pair)


def twinspark_fleet_summary(all_hostvars, groups):
    """One line per pair (name: head + worker) and per router, for playbooks/validate.yml's closing message."""
    plain = _plain_hostvars(all_hostvars, groups)
    found, _ = fleet.pairs(plain, groups)
    lines = [f"pair {p.name}: head {p.head} (rank 0), worker {p.worker} (rank 1)" for p in found]
    for router in groups.get(fleet.ROUTER_GROUP) or []:
        fronted, _ = fleet.router_pairs(plain.get(router, {}), found)
        lines.append(f"router {router}: fronts {', '.join(p.name for p in fronted)}")
    return lines


def twinspark_tls_files(host_vars, node_env):
    """This node's TLS files for role serve_env: [{var, src, dest, mode}], src none where the node holds none."""
    return tls.installed_files(host_vars, {str(k): str(v) for k, v in dict(node_env).items() if v is not None})


def twinspark_env_file(env, file):
    """The part of a node env that belongs in `file` (serve | secrets), values quoted for an env file."""
    registry = settings.load()
    if file not in settings.FILES:
        raise AnsibleFilterError(f"twinspark_env_file: file must be one of {', '.join(settings.FILES)}, got {file!r}")
    return {key: envfile.quote(str(value)) for key, value in dict(env).items()
            if (registry.get(key) is not None and registry[key].file == file)}


def twinspark_knob_default(env, profile=None, recipe_name=None):
    """The default of knob `env` under `profile` (the default profile when none) and recipe `recipe_name` (that
    profile's default recipe when none), '' when it has none there: for a role default that follows a knob, e.g.
    `twinspark_model | default('MODEL' | twinspark_knob_default(twinspark_profile | default(''),
    twinspark_recipe | default('')))`, so the value itself is written only in settings.yml or the recipe."""
    if settings.load().get(str(env)) is None:
        raise AnsibleFilterError(f"twinspark_knob_default: {env!r} is not a knob of settings.yml")
    try:
        value = recipe.knob_default(str(env), str(profile) if profile else None,
                                    str(recipe_name) if recipe_name else None)
    except recipe.RecipeError as error:
        raise AnsibleFilterError(str(error)) from None
    return "" if value is None else value


def twinspark_rank_label(host, pair_hosts):
    """How a playbook's line names `host` among its pair's or group's hosts (rank order, twinspark_layout_pair_hosts):
    a pair's "the worker HOST (rank 1)" as its lines always have, a group's "HOST (rank R)"."""
    hosts = [str(name) for name in pair_hosts]
    if str(host) not in hosts:
        raise AnsibleFilterError(f"twinspark_rank_label: {host} is not one of {', '.join(hosts) or 'no hosts'}")
    rank = hosts.index(str(host))
    if len(hosts) == 2:
        return f"the {('head', 'worker')[rank]} {host} (rank {rank})"
    return f"{host} (rank {rank})"


class FilterModule:
    def filters(self):
        return {
            "twinspark_knob_default": twinspark_knob_default,
            "twinspark_node_env": twinspark_node_env,
            "twinspark_own_pair": twinspark_own_pair,
            "twinspark_guard_rank_args": twinspark_guard_rank_args,
            "twinspark_peer_addresses": twinspark_peer_addresses,
            "twinspark_fabric_peers": twinspark_fabric_peers,
            "twinspark_fabric_cables": twinspark_fabric_cables,
            "twinspark_rdma_targets": twinspark_rdma_targets,
            "twinspark_group_problems": twinspark_group_problems,
            "twinspark_pair_problems": twinspark_pair_problems,
            "twinspark_env_file": twinspark_env_file,
            "twinspark_tls_files": twinspark_tls_files,
            "twinspark_fleet_summary": twinspark_fleet_summary,
            "twinspark_rank_label": twinspark_rank_label,
        }
