"""A node's env mapping from inventory values: the head/worker derivation, per-node overrides, validation.

Pure functions over plain data. The Ansible filter `twinspark_node_env` (filter_plugins/twinspark.py) and
`twinspark env defaults` both come through here, so a rendered env file and a hand-made one obey the same rules.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twinspark import recipe, settings, validate
from twinspark.group import GROUP_VARS
from twinspark.settings import Knob, Registry

RANKS = (0, 1)
ROLE_OF_RANK = {0: "head", 1: "worker"}
HEAD_GROUP = "twinspark_head"
WORKER_GROUP = "twinspark_worker"
"""The inventory groups that make a pair: each holds exactly one host (`pair_hosts`)."""
FABRIC_ADDRESS_VAR = "twinspark_fabric_address"
"""The per-host inventory variable holding a node's own interconnect address (not a knob: it feeds derived ones)."""


class NodeEnvError(ValueError):
    """The inventory gives an invalid env for a node; carries every problem, named by inventory variable."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def env_text(value: Any) -> str | None:
    """An inventory value as env-file text; None (YAML null) means "not set"."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return " ".join(str(item) for item in value)
    return str(value)


def _knob_for(name: str, registry: Registry) -> Knob | None:
    return registry.get(name) or registry.by_var(name)


def describe(env: str, registry: Registry) -> str:
    """How a problem about `env` names the thing the operator edits."""
    names = [part.strip() for part in env.split(",")]
    out = []
    for name in names:
        knob = registry.get(name)
        if knob is None:
            out.append(name)
        elif knob.derived:
            out.append(f"{name} (derived from {FABRIC_ADDRESS_VAR} and the groups {HEAD_GROUP}/{WORKER_GROUP})")
        else:
            out.append(f"{knob.var} ({name})")
    return ", ".join(out)


def node_env(
    knobs: Mapping[str, Any],
    rank: int,
    head_fabric_address: str,
    worker_fabric_address: str,
    node_overrides: Mapping[str, Any] | None = None,
    registry: Registry | None = None,
    group: GroupShape | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """(serve env, secrets env) for the node of `rank`, every applicable default written out.

    `knobs` holds the pair's values, keyed by inventory variable (twinspark_max_num_seqs) or env name
    (MAX_NUM_SEQS); `node_overrides` this node's own values for per-node knobs. NODE_RANK, MASTER_ADDR,
    WORKER_HOST and VLLM_HOST_IP are derived from the rank and the two fabric addresses. Raises NodeEnvError
    listing every problem.

    `group`: a group other than the pair (docs/GROUPS.md): its fabric addresses in rank order, TP and PP. Then
    MASTER_ADDR is rank 0's address, VLLM_HOST_IP this rank's, WORKER_HOST rank 1's (rank 0's in a group of one),
    and NNODES, TENSOR_PARALLEL_SIZE and PIPELINE_PARALLEL_SIZE are written; `head_fabric_address` and
    `worker_fabric_address` are not read.
    """
    registry = registry or settings.load()
    problems: list[str] = []
    raw: dict[str, str] = {}
    size = len(group.addresses) if group else 2
    if not 0 <= rank < size or (group is None and rank not in RANKS):
        raise NodeEnvError([f"rank: must be 0 (head) or 1 (worker), got {rank!r}" if group is None else
                            f"rank: must be one of 0..{size - 1} in a group of {size}, got {rank!r}"])

    for source, values in (("inventory", knobs), ("node override", node_overrides or {})):
        for name, value in values.items():
            knob = _knob_for(name, registry)
            if knob is None:
                problem = _unknown_name(name, registry)
                if problem:
                    problems.append(problem)
                continue
            if knob.derived:
                problems.append(f"{knob.var}: is derived from {FABRIC_ADDRESS_VAR} and the inventory groups; "
                                "remove it from the inventory")
                continue
            if source == "node override" and not knob.per_node:
                problems.append(f"{knob.var}: must be the same on both nodes; set it for the whole pair "
                                "(group_vars), not per host")
                continue
            if knob.type == "choice" and isinstance(value, bool) and "off" in knob.choices:
                value = "on" if value else "off"  # YAML 1.1 reads an unquoted `off` as false
            text = env_text(value)
            if text is not None and knob.installed_as is not None:
                problem = installed_problem(knob, text)
                if problem:
                    problems.append(problem)
                if text.strip() and rank == 0:
                    raw[knob.env] = knob.installed_as.path  # the head's copy; the worker gets none
                continue
            if text is not None:
                raw[knob.env] = text

    if group is None:
        for label, address in (("head", head_fabric_address), ("worker", worker_fabric_address)):
            if not address:
                problems.append(f"{FABRIC_ADDRESS_VAR}: missing on the {label}; set the node's own fabric address "
                                "as a host variable")
        raw.update({
            "NODE_RANK": str(rank),
            "MASTER_ADDR": str(head_fabric_address or ""),
            "WORKER_HOST": str(worker_fabric_address or ""),
            "VLLM_HOST_IP": str((head_fabric_address if rank == 0 else worker_fabric_address) or ""),
        })
    else:
        for index, address in enumerate(group.addresses):
            if not address:
                problems.append(f"{FABRIC_ADDRESS_VAR}: missing on rank {index}; set the node's own fabric address "
                                "as a host variable")
        addresses = [str(address or "") for address in group.addresses]
        raw.update({
            "NODE_RANK": str(rank),
            "MASTER_ADDR": addresses[0],
            "WORKER_HOST": addresses[1] if size > 1 else addresses[0],
            "VLLM_HOST_IP": addresses[rank],
        })
        if (size, group.tp, group.pp) != validate.PAIR_LAYOUT:
            raw.update({"NNODES": str(size), "TENSOR_PARALLEL_SIZE": str(group.tp),
                        "PIPELINE_PARALLEL_SIZE": str(group.pp)})
    result = validate.validate(raw, registry)
    for problem in result.problems:
        if problem.var in ("MASTER_ADDR", "WORKER_HOST", "VLLM_HOST_IP") and not raw.get(problem.var):
            continue  # already reported as a missing fabric address
        problems.append(f"{describe(problem.var, registry)}: {problem.message}"
                        + (f" (allowed: {problem.allowed})" if problem.allowed else ""))
    if problems:
        raise NodeEnvError(problems)
    serve = {k: v for k, v in result.values.items() if registry[k].file == "serve"}
    secrets = {k: v for k, v in result.values.items() if registry[k].file == "secrets"}
    # The profile's default recipe, not named in the inventory, is left out of serve.env: the file stays the one the
    # previous release wrote, so a rollback to a runtime whose launcher predates recipes still reads it.
    if recipe.RECIPE_ENV not in raw and serve.get(recipe.RECIPE_ENV) == recipe.default_name(result.profile, registry):
        del serve[recipe.RECIPE_ENV]
    return serve, secrets


def installed_problem(knob: Knob, text: str) -> str | None:
    """What is wrong with the controller path an installed_as knob names, before the file is looked at."""
    text = text.strip()
    if text and not text.startswith("/"):
        return (f"{knob.var}: must be an absolute path to a file on the controller (got {text!r}); write it as "
                f"\"{{{{ inventory_dir }}}}/{text}\" to keep it beside the inventory")
    return None


def _unknown_name(name: str, registry: Registry) -> str | None:
    """A problem for an inventory name that looks like a misspelt knob; None for anything else."""
    if name == FABRIC_ADDRESS_VAR or name in GROUP_VARS or not name.startswith("twinspark_"):
        return None
    known = [k.var for k in registry.knobs]
    close = difflib.get_close_matches(name, known, n=1, cutoff=validate.TYPO_CUTOFF)
    if close:
        return f"{name}: unknown variable; did you mean {close[0]}?"
    return None


def example_env(profile: str, rank: int, registry: Registry | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Every default for `profile`/`rank`, with fabric addresses from the documentation range 192.0.2.0/24."""
    return node_env({"TWINSPARK_PROFILE": profile}, rank, EXAMPLE_HEAD_ADDRESS, EXAMPLE_WORKER_ADDRESS,
                    registry=registry)


EXAMPLE_HEAD_ADDRESS = "192.0.2.1"
EXAMPLE_WORKER_ADDRESS = "192.0.2.2"


def knobs_from_host_vars(host_vars: Mapping[str, Any]) -> dict[str, Any]:
    """The `twinspark_*` variables of one host (its merged inventory view), except its fabric address."""
    return {name: host_vars[name] for name in list(host_vars.keys())
            if str(name).startswith("twinspark_") and name != FABRIC_ADDRESS_VAR}


def pair_envs(
    host_vars: Mapping[str, Mapping[str, Any]],
    head: str,
    worker: str,
    registry: Registry | None = None,
) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """(serve, secrets) for both nodes from each host's merged inventory variables, checked as a pair.

    Knobs that are not per-node must come out equal on both nodes (a host variable overriding one of them on a
    single node is an error). Raises NodeEnvError with every problem, prefixed by the host(s) it concerns.
    """
    return group_envs(host_vars, (head, worker), registry=registry)


@dataclass(frozen=True)
class GroupShape:
    """What node_env needs of a group other than the pair: its fabric addresses in rank order, TP and PP."""

    addresses: tuple[str, ...]
    tp: int
    pp: int


def group_envs(
    host_vars: Mapping[str, Mapping[str, Any]],
    ranks: Sequence[str],
    tp: int | None = None,
    pp: int | None = None,
    registry: Registry | None = None,
) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """(serve, secrets) for every node of a group, `ranks` its hosts in rank order (twinspark.group.read), checked
    together: knobs that are not per-node must come out equal on every node. Two ranks with no TP or PP given are
    the pair, whose env files are exactly a pair's (TP defaults to the node count, PP to 1). Raises NodeEnvError
    with every problem, prefixed by the host(s) it concerns."""
    registry = registry or settings.load()
    addresses = {name: env_text(host_vars[name].get(FABRIC_ADDRESS_VAR)) or "" for name in ranks}
    shape = None
    if len(ranks) != 2 or tp is not None or pp is not None:
        shape = GroupShape(tuple(addresses[name] for name in ranks), tp or len(ranks), pp or 1)
    envs: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    problems: dict[str, list[str]] = {}
    for rank, name in enumerate(ranks):
        try:
            envs[name] = node_env(knobs_from_host_vars(host_vars[name]), rank, addresses[ranks[0]],
                                  addresses[ranks[-1]], registry=registry, group=shape)
        except NodeEnvError as error:
            for problem in error.problems:
                problems.setdefault(problem, []).append(name)
    if not problems and len(envs) == len(ranks) > 1:
        merged = {name: {**serve, **secrets} for name, (serve, secrets) in envs.items()}
        for knob in registry.knobs:
            if knob.per_node or knob.derived or knob.installed_as is not None:  # installed_as: the head's alone
                continue
            seen = {name: merged[name].get(knob.env) for name in ranks}
            if len(set(seen.values())) > 1:
                shown = "" if knob.secret else " (" + ", ".join(f"{name}: {value!r}" for name, value in
                                                                seen.items()) + ")"
                where = "both" if len(ranks) == 2 else "every node"
                problem = (f"{knob.var}: differs between the nodes{shown}; it must be the same on {where}, so set "
                           f"it for the whole {'pair' if len(ranks) == 2 else 'group'} (group_vars), not per host")
                problems.setdefault(problem, []).extend(ranks)
    if problems:
        raise NodeEnvError([f"{', '.join(hosts)}: {problem}" for problem, hosts in problems.items()])
    return envs


# ---------------------------------------------------------------------------------------------------------------
# The pair in the inventory: one head, one worker (the filters, health, bench and the front door all ask here)
# ---------------------------------------------------------------------------------------------------------------


def group_problems(groups: Mapping[str, Any]) -> list[str]:
    """What is wrong with the inventory groups of the pair (exactly one head, one worker, not the same host)."""
    problems = []
    heads = list(groups.get(HEAD_GROUP) or [])
    workers = list(groups.get(WORKER_GROUP) or [])
    for group, members, role in ((HEAD_GROUP, heads, "head (rank 0)"), (WORKER_GROUP, workers, "worker (rank 1)")):
        if len(members) != 1:
            problems.append(f"group {group}: must hold exactly one host, the {role}; it holds {len(members)} "
                            f"({', '.join(members) or 'none'}). Fix the inventory's hosts.yml")
    if heads and workers and set(heads) & set(workers):
        problems.append(f"groups {HEAD_GROUP} and {WORKER_GROUP}: {', '.join(sorted(set(heads) & set(workers)))} "
                        "is in both; the head and the worker must be two different hosts")
    return problems


def pair_hosts(groups: Mapping[str, Any]) -> tuple[str, str]:
    """(head, worker) host names from the inventory groups; NodeEnvError with every group problem otherwise."""
    problems = group_problems(groups)
    if problems:
        raise NodeEnvError(problems)
    return str(groups[HEAD_GROUP][0]), str(groups[WORKER_GROUP][0])


def head_setting(host_vars: Mapping[str, Any], env: str, registry: Registry | None = None) -> str | None:
    """One setting as the head's env file carries it, from the head's merged inventory variables: the inventory's
    value checked and normalised like every knob, else the registry default under the host's profile (None when
    the knob has none). Raises NodeEnvError naming the inventory variable."""
    registry = registry or settings.load()
    knob = registry[env]
    profile_knob = registry["TWINSPARK_PROFILE"]
    profile = (env_text(host_vars.get(profile_knob.var)) or "").strip() or profile_knob.default_for("gb10") or "gb10"
    text = env_text(host_vars.get(knob.var))
    if text is None or not text.strip():
        name = (env_text(host_vars.get(recipe.RECIPE_VAR)) or "").strip()
        try:
            chosen = recipe.chosen(profile, name or None, registry)
        except recipe.RecipeError as error:
            raise NodeEnvError([str(error)]) from None
        return recipe.default_value(knob, profile, 0, chosen if chosen.profile == profile else None, registry)
    try:
        return validate.normalise(knob, text)
    except ValueError as error:
        raise NodeEnvError([f"{knob.var}: {error}" + (f" (allowed: {knob.allowed()})" if knob.allowed() else "")]) \
            from None
