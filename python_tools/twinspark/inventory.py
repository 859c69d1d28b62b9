"""The pair as the controller sees it: the inventory (read with Ansible's own API) and SSH to its nodes (paramiko).

The one place the controller-side commands (`twinspark health`, `bench`, the playbook verbs) learn which host is
the head, which the worker, where the pair's API answers and how to reach a node. The head/worker rule itself is
nodeenv.pair_hosts, which the Ansible filters use too.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from twinspark import api, envfile, layout, nodeenv, settings
from twinspark.fleet import rules as fleet

HEAD_GROUP = nodeenv.HEAD_GROUP
WORKER_GROUP = nodeenv.WORKER_GROUP


class InventoryError(Exception):
    """The inventory does not describe a pair this tool can reach (the message says which variable and why)."""


REMOTE_TWINSPARK = layout.default().cli  # the default; a node's own is Node.twinspark


@dataclass(frozen=True)
class Node:
    name: str
    role: str
    host: str
    port: int
    user: str
    key_file: str | None
    accept_unknown_host_key: bool
    twinspark: str = REMOTE_TWINSPARK
    """The `twinspark` command on the node (the inventory's twinspark_layout_venv)."""
    env_files: tuple[str, str] = (layout.default().serve_env, layout.default().secrets_env)
    """The node's env files, serve then secrets (the inventory's twinspark_layout_serve_env and _secrets_env)."""


@dataclass(frozen=True)
class PairAccess:
    head: Node
    worker: Node | None
    """Rank 1; None for a group of one (a single Spark, docs/GROUPS.md)."""
    api_url: str
    api_ca: str | None = None
    """The controller-side file the API's certificate is verified against (twinspark.api.tls_ca_from_inventory);
    None: the API speaks plain HTTP."""
    more: tuple[Node, ...] = ()
    """A group of three or more (docs/GROUPS.md): ranks 2..N-1, in rank order."""

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every node, in rank order: the head, the worker, then a group's other ranks (the head alone for a group
        of one)."""
        return (self.head, *((self.worker,) if self.worker is not None else ()), *self.more)


def _accepts_unknown_host_keys(hostvars: Mapping[str, object]) -> bool:
    """Only an explicit inventory setting lets an unknown host key through (the simulated pair sets one)."""
    checking = hostvars.get("ansible_host_key_checking", hostvars.get("ansible_ssh_host_key_checking"))
    if isinstance(checking, bool):
        return not checking
    if isinstance(checking, str) and checking.lower() in ("false", "no", "0", "off"):
        return True
    args = " ".join(str(hostvars.get(k) or "") for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args"))
    return "stricthostkeychecking=no" in args.replace(" ", "").lower()


def _load(source: str | Path):
    # ansible: a controller extra (twinspark[controller]), absent from the nodes' venv.
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(source)])
    return loader, inventory, VariableManager(loader=loader, inventory=inventory), inventory.get_groups_dict()


def _host_vars(inventory, variables, groups: Mapping[str, object]) -> dict[str, dict[str, object]]:
    hosts = dict.fromkeys(h for members in groups.values() for h in members)  # type: ignore[union-attr]
    return {str(h): dict(variables.get_vars(host=inventory.get_host(h))) for h in hosts}


@dataclass(frozen=True)
class FleetView:
    """A fleet inventory as `twinspark health` needs it: each pair's name and the URL the router knows it by, the
    router's URL (None without a router), the inventory's fleet problems (validation's lines), and the router's
    admin key (twinspark_router_admin_key; None when unset or not readable here, a vault without its password), the
    only key its front lets through to /list_workers."""

    pairs: tuple[tuple[str, str], ...]
    router_url: str | None
    problems: tuple[str, ...]
    router_admin_key: str | None = field(default=None, repr=False)
    # The router front's admin listener (https, issue 43 row 8), where the admin key goes, and the router's
    # certificate on this controller (role router fetches it), its only trust anchor.
    router_admin_url: str | None = None
    router_ca: str | None = None


def _readable_secret(value: object) -> str | None:
    """An inventory secret as text (a vault value decrypts on str()); None when unset or when it cannot be read."""
    if value is None:
        return None
    try:
        text = str(value).strip()
    except Exception:  # noqa: BLE001 - ansible's vault errors: no password here, the caller goes on without it
        return None
    return text or None


def read_hosts(source: str | Path) -> tuple[dict[str, dict[str, object]], dict[str, list[str]]]:
    """Every host's variables and the groups of an inventory, as Ansible reads them (nothing contacted)."""
    _, inventory, variables, groups = _load(source)
    return _host_vars(inventory, variables, groups), groups


def read_fleet(source: str | Path) -> FleetView | None:
    """The fleet an inventory describes, or None for a one-pair inventory (which stays on the one-pair path)."""
    _, inventory, variables, groups = _load(source)
    host_vars = _host_vars(inventory, variables, groups)
    if not fleet.is_fleet(host_vars, groups):
        return None
    found, problems = fleet.pairs(host_vars, groups)
    routers = list(groups.get(fleet.ROUTER_GROUP) or [])
    router = fleet.router_url(host_vars.get(routers[0], {}), routers[0]) if routers else None
    admin = _readable_secret(host_vars.get(routers[0], {}).get(fleet.ADMIN_KEY_VAR)) if routers else None
    admin_url = fleet.router_admin_url(host_vars.get(routers[0], {}), routers[0]) if routers else None
    ca = fleet.controller_router_ca(host_vars.get(routers[0], {}), routers[0]) if routers else None
    return FleetView(tuple((p.name, fleet.head_url(host_vars.get(p.head, {}), p.head)) for p in found),
                     router, tuple(problems), admin, admin_url, ca)


def read_inventory(source: str | Path, pair: str | None = None) -> PairAccess:
    """The head, the worker and the API URL from an Ansible inventory (any source Ansible reads). In a fleet,
    `pair` names the pair (its group); a one-pair inventory needs none. A group inventory (docs/GROUPS.md) of three
    or more gives its rank 0 as head, rank 1 as worker and the other ranks as `more`."""
    # ansible: a controller extra (twinspark[controller]), absent from the nodes' venv.
    from ansible.template import Templar

    loader, inventory, variables, groups = _load(source)
    if pair is not None:
        found, _ = fleet.pairs(_host_vars(inventory, variables, groups), groups)
        chosen = [p for p in found if p.name == pair]
        if not chosen:
            raise InventoryError(f"inventory {source}: no well-formed pair {pair!r} (pairs: "
                                 f"{', '.join(p.name for p in found) or 'none'}); run playbooks/validate.yml")
        groups = fleet.pair_groups(chosen[0])

    found = fleet.group_of(_host_vars(inventory, variables, groups), groups) if pair is None else None
    worker_name: str | None
    if found is not None and len(found.ranks) > 2 and not found.problems:
        head_name, worker_name, more_names = found.ranks[0], found.ranks[1], found.ranks[2:]
    elif found is not None and len(found.ranks) == 1 and not found.problems:
        head_name, worker_name, more_names = found.ranks[0], None, ()  # a single Spark: rank 0 alone
    else:
        more_names = ()
        try:
            head_name, worker_name = nodeenv.pair_hosts(groups)
        except nodeenv.NodeEnvError as error:
            raise InventoryError(f"inventory {source}: " + "; ".join(error.problems)) from None

    def node(name: str, role: str) -> tuple[Node, dict[str, object]]:
        hostvars = variables.get_vars(host=inventory.get_host(name))
        templar = Templar(loader=loader, variables=hostvars)

        def value(key: str, default: object = None) -> object:
            raw = hostvars.get(key, default)
            return templar.template(raw) if isinstance(raw, str) else raw

        key_file = value("ansible_ssh_private_key_file") or value("ansible_private_key_file")
        node_layout = layout.from_vars({e.var: value(e.var) for e in layout.entries() if e.var in hostvars})
        settings = {k: value(k) for k in ("ansible_host_key_checking", "ansible_ssh_host_key_checking",
                                         "ansible_ssh_common_args", "ansible_ssh_extra_args")}
        found = Node(
            name=name,
            role=role,
            host=str(value("ansible_host") or name),
            port=int(value("ansible_port") or value("ansible_ssh_port") or 22),
            user=str(value("ansible_user") or value("ansible_ssh_user") or "root"),
            key_file=str(Path(str(key_file)).expanduser()) if key_file else None,
            accept_unknown_host_key=_accepts_unknown_host_keys(settings),
            twinspark=node_layout.cli,
            env_files=(node_layout.serve_env, node_layout.secrets_env),
        )
        tls = {name: value(name) for name in (api.TLS_CERT_VAR, api.TLS_CA_VAR)}
        return found, {"value": value, "api_ca": api.tls_ca_from_inventory(tls)}

    head, head_vars = node(head_name, "head")
    worker = None if worker_name is None else node(worker_name, "worker" if not more_names else "rank 1")[0]
    more = tuple(node(name, f"rank {rank}")[0] for rank, name in enumerate(more_names, start=2))
    port = api_port(head_vars["value"], source)
    ca = head_vars["api_ca"]
    return PairAccess(head=head, worker=worker, api_url=api.base_url(head.host, port, tls=ca is not None), api_ca=ca,
                      more=more)


def api_port(value: Callable[[str], object], source: str | Path = "the inventory") -> int:
    """The head's API port as its env file will carry it (twinspark_vllm_port through nodeenv: checked like every
    knob, the registry default when unset); `value` reads one templated inventory variable of the head."""
    registry = settings.load()
    knob = registry["VLLM_PORT"]
    profile_var = registry["TWINSPARK_PROFILE"].var
    try:
        port = nodeenv.head_setting({knob.var: value(knob.var), profile_var: value(profile_var)}, knob.env, registry)
    except nodeenv.NodeEnvError as error:
        raise InventoryError(f"inventory {source}: " + "; ".join(error.problems)) from None
    return int(port or api.default_port())


class Connection:
    """One SSH connection to a node (paramiko), closed on exit."""

    def __init__(self, node: Node, timeout: float) -> None:
        # paramiko: a controller extra (twinspark[controller]), absent from the nodes' venv.
        import paramiko

        # paramiko's transport thread logs connection failures with tracebacks; the failure reaches the report
        # through the exception instead, in one line naming the node.
        logging.getLogger("paramiko").addHandler(logging.NullHandler())
        logging.getLogger("paramiko").propagate = False

        self.node = node
        self.timeout = timeout
        self.client = paramiko.SSHClient()
        if node.accept_unknown_host_key:
            # The inventory asked for it explicitly (e.g. StrictHostKeyChecking=no on throwaway nodes).
            self.client.set_missing_host_key_policy(paramiko.MissingHostKeyPolicy())
        else:
            self.client.load_system_host_keys()
            self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        self.client.connect(node.host, port=node.port, username=node.user, key_filename=node.key_file,
                            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                            look_for_keys=node.key_file is None)

    def start(self, command: str, timeout: float) -> Callable[[], tuple[int, str, str]]:
        """Start a command on its own channel; the returned function waits for (exit status, stdout, stderr).

        Several commands can run at once over the one connection."""
        if self.node.user != "root":
            command = "sudo -n " + command
        _stdin, stdout, stderr = self.client.exec_command(command, timeout=timeout)

        def finish() -> tuple[int, str, str]:
            out = stdout.read().decode(errors="replace")
            err = stderr.read().decode(errors="replace")
            return stdout.channel.recv_exit_status(), out, err

        return finish

    def run(self, command: str, timeout: float) -> tuple[int, str, str]:
        return self.start(command, timeout)()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()


def describe_ssh_error(node: Node, error: Exception) -> str:
    kind = type(error).__name__
    where = f"{node.user}@{node.host}:{node.port}"
    if kind == "SSHException" and "not found in known_hosts" in str(error):
        return (f"cannot reach {where}: its host key is unknown (add it to known_hosts, or set "
                "ansible_host_key_checking: false in the inventory for throwaway nodes)")
    return f"cannot reach {where} over SSH: {kind}: {error}"


def read_remote_env(connection: Connection, timeout: float) -> dict[str, str]:
    """The node's env files (Node.env_files), read over SSH into memory (secrets stay in this process)."""
    env: dict[str, str] = {}
    for path in connection.node.env_files:
        rc, out, _err = connection.run(f"cat {shlex.quote(str(path))}", timeout)
        if rc == 0:
            env.update(envfile.parse(out, str(path)).values)
    return env


def default_inventory() -> str:
    """The inventory ansible.cfg names (its first source), for commands run without -i."""
    # ansible: a controller extra (twinspark[controller]), absent from the nodes' venv.
    from ansible import constants

    sources = constants.DEFAULT_HOST_LIST
    return sources[0] if isinstance(sources, list) and sources else str(sources)


def head_env(pair: PairAccess, timeout: float) -> dict[str, str]:
    """The head's env files over SSH (raises what SSH or reading raised); secrets stay in this process."""
    with Connection(pair.head, timeout) as connection:
        return read_remote_env(connection, timeout)
