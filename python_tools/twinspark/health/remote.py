"""The controller's side of a health sweep: the inventory (read with Ansible's own API) and SSH (paramiko).

The controller runs `twinspark health --local --json --no-pair` on both nodes at once, reads the head's env files
for the served name and the API key (kept in memory, never printed), probes the pair's API from outside, and
merges everything into one report.
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from twinspark import layout

HEAD_GROUP = "twinspark_head"
WORKER_GROUP = "twinspark_worker"
REMOTE_TWINSPARK = layout.default().cli  # the default; a node's own is Node.twinspark
DEFAULT_API_PORT = 8888


class InventoryError(Exception):
    """The inventory does not describe a pair this tool can reach (the message says which variable and why)."""


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


@dataclass(frozen=True)
class Pair:
    head: Node
    worker: Node
    api_url: str
    api_ca: str | None = None
    """The controller-side file the API's certificate is verified against (twinspark.api.tls_ca_from_inventory);
    None: the API speaks plain HTTP."""


def _accepts_unknown_host_keys(hostvars: Mapping[str, object]) -> bool:
    """Only an explicit inventory setting lets an unknown host key through (the simulated pair sets one)."""
    checking = hostvars.get("ansible_host_key_checking", hostvars.get("ansible_ssh_host_key_checking"))
    if isinstance(checking, bool):
        return not checking
    if isinstance(checking, str) and checking.lower() in ("false", "no", "0", "off"):
        return True
    args = " ".join(str(hostvars.get(k) or "") for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args"))
    return "stricthostkeychecking=no" in args.replace(" ", "").lower()


def read_inventory(source: str | Path) -> Pair:
    """The head, the worker and the API URL from an Ansible inventory (any source Ansible reads)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(source)])
    variables = VariableManager(loader=loader, inventory=inventory)
    groups = inventory.get_groups_dict()

    def one(group: str) -> str:
        hosts = groups.get(group) or []
        if len(hosts) != 1:
            raise InventoryError(f"inventory {source}: group {group} must hold exactly one host (has "
                                 f"{len(hosts)}: {', '.join(hosts) or 'none'}); fix hosts.yml")
        return hosts[0]

    def node(name: str, role: str) -> tuple[Node, dict[str, object]]:
        hostvars = variables.get_vars(host=inventory.get_host(name))
        templar = Templar(loader=loader, variables=hostvars)

        def value(key: str, default: object = None) -> object:
            raw = hostvars.get(key, default)
            return templar.template(raw) if isinstance(raw, str) else raw

        key_file = value("ansible_ssh_private_key_file") or value("ansible_private_key_file")
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
            twinspark=layout.from_vars({e.var: value(e.var) for e in layout.entries() if e.var in hostvars}).cli,
        )
        from twinspark import api

        tls = {name: value(name) for name in (api.TLS_CERT_VAR, api.TLS_CA_VAR)}
        return found, {"api_port": value("twinspark_vllm_port", DEFAULT_API_PORT),
                       "api_ca": api.tls_ca_from_inventory(tls)}

    head, head_vars = node(one(HEAD_GROUP), "head")
    worker, _ = node(one(WORKER_GROUP), "worker")
    from twinspark import api

    try:
        port = int(str(head_vars["api_port"]))
    except ValueError:
        raise InventoryError(f"twinspark_vllm_port must be a port number (got {head_vars['api_port']!r})") from None
    ca = head_vars["api_ca"]
    return Pair(head=head, worker=worker, api_url=api.base_url(head.host, port, tls=ca is not None), api_ca=ca)


class Connection:
    """One SSH connection to a node (paramiko), closed on exit."""

    def __init__(self, node: Node, timeout: float) -> None:
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
    """The head's env files, read over SSH into memory (secrets stay in this process)."""
    from twinspark import envfile
    from twinspark.health.gather import SECRETS_ENV, SERVE_ENV

    env: dict[str, str] = {}
    for path in (SERVE_ENV, SECRETS_ENV):
        rc, out, _err = connection.run(f"cat {shlex.quote(str(path))}", timeout)
        if rc == 0:
            env.update(envfile.parse(out, str(path)).values)
    return env


def start_agent(connection: Connection, timeout: float) -> Callable[[], dict[str, object]]:
    """Start the node's own health check; the returned function waits for its JSON report (or raises
    RuntimeError naming the problem)."""
    command = (f"{shlex.quote(connection.node.twinspark)} health --local --json --no-pair --timeout {timeout:g} "
               f"--node {shlex.quote(connection.node.name)}")
    finish = connection.start(command, timeout * 3)
    return lambda: _agent_report(connection, *finish())


def _agent_report(connection: Connection, rc: int, out: str, err: str) -> dict[str, object]:
    if rc == 127 or "No such file" in err:
        raise RuntimeError(f"{connection.node.twinspark} is not installed on {connection.node.name}")
    try:
        report = json.loads(out)
    except ValueError:
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"`twinspark health --local` on {connection.node.name} failed (exit {rc}): "
                           f"{last[:200]}") from None
    return report


@dataclass
class SweepResult:
    reports: dict[str, dict[str, object]]
    errors: dict[str, str]
    head_env: dict[str, str] | None
    pair: dict[str, object] | None


def sweep(pair: Pair, timeout: float, nodes: bool = True, probe_pair: bool = True) -> SweepResult:
    """Both nodes' agents and the pair's API, all at once. Each part's failure is recorded, never raised."""
    from twinspark import api

    head_env: Future = Future()
    reports: dict[str, dict[str, object]] = {}
    errors: dict[str, str] = {}
    lock = threading.Lock()

    def node_job(node: Node) -> None:
        try:
            with Connection(node, timeout) as connection:
                agent = start_agent(connection, timeout) if nodes else None
                if node.role == "head":
                    try:
                        head_env.set_result(read_remote_env(connection, timeout))
                    except Exception:  # noqa: BLE001 - the pair probe falls back to what /v1/models lists
                        head_env.set_result(None)
                if agent is not None:
                    report = agent()
                    with lock:
                        reports[node.name] = report
        except Exception as error:  # noqa: BLE001 - any failure to reach a node is that node's finding
            message = str(error) if isinstance(error, RuntimeError) else describe_ssh_error(node, error)
            with lock:
                errors[node.name] = message
        finally:
            if node.role == "head" and not head_env.done():
                head_env.set_result(None)

    def pair_job() -> dict[str, object]:
        try:
            env = head_env.result(timeout=timeout * 2) or {}
        except TimeoutError:
            env = {}
        return api.gather(pair.api_url, env.get("SERVED_MODEL_NAME") or None, api.first_key(env), timeout,
                          ca=pair.api_ca)

    with ThreadPoolExecutor(max_workers=3) as pool:
        jobs = [pool.submit(node_job, pair.head)]
        if nodes:
            jobs.append(pool.submit(node_job, pair.worker))
        pair_future = pool.submit(pair_job) if probe_pair else None
        for job in jobs:
            job.result()
        pair_result = pair_future.result() if pair_future else None
    return SweepResult(reports=reports, errors=errors, head_env=head_env.result(), pair=pair_result)
