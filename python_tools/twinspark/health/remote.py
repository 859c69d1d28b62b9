"""The controller's side of a health sweep: both nodes' agents over SSH and the pair's API, at once.

The controller runs `twinspark health --local --json --no-pair` on both nodes at once, reads the head's env files
for the served name and the API key (kept in memory, never printed), probes the pair's API from outside, and
merges everything into one report.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from twinspark import api
from twinspark.inventory import Connection, Node, PairAccess, describe_ssh_error, read_remote_env


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


def sweep(pair: PairAccess, timeout: float, nodes: bool = True, probe_pair: bool = True) -> SweepResult:
    """Both nodes' agents (every rank's, in a group) and the pair's API, all at once. Each part's failure is recorded,
    never raised."""
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

    every = pair.nodes
    with ThreadPoolExecutor(max_workers=len(every) + 1) as pool:
        jobs = [pool.submit(node_job, pair.head)]
        if nodes:
            jobs += [pool.submit(node_job, node) for node in every[1:]]
        pair_future = pool.submit(pair_job) if probe_pair else None
        for job in jobs:
            job.result()
        pair_result = pair_future.result() if pair_future else None
    return SweepResult(reports=reports, errors=errors, head_env=head_env.result(), pair=pair_result)
