"""The router's command line from the inventory: pure functions, used by roles/router's filter and the drills.

`worker_urls` lists the head API of every pair a router fronts; `flags` is the tuned health/retry/breaker set
(docs/FLEET.md says why each number); `exec_start` is the unit's whole ExecStart= line.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from twinspark import budget, nodeenv
from twinspark.fleet import rules

POLICIES = ("power_of_two", "cache_aware", "round_robin", "random", "consistent_hash", "sticky_least_loaded")
DEFAULT_POLICY = "power_of_two"

# A dead pair is out after at most interval x failure-threshold + timeout (about 3 s); a pair answering 5xx is
# skipped after 3 of them, tried again after 2 s. Attempts (5, the first included) must exceed the breaker's 3:
# power_of_two prefers the pair with the fewest requests in flight, which a dead pair is, so until its breaker
# opens every retry goes back to it (measured: with 3 attempts the request in flight at a kill failed; with 5 none).
TUNED = {
    "--health-check-interval-secs": "1",
    "--health-check-timeout-secs": "1",
    "--health-failure-threshold": "2",
    "--health-success-threshold": "1",
    "--retry-max-retries": "5",
    "--retry-initial-backoff-ms": "50",
    "--retry-max-backoff-ms": "500",
    "--cb-failure-threshold": "3",
    "--cb-success-threshold": "1",
    "--cb-timeout-duration-secs": "2",
    "--worker-startup-check-interval": "1",
}
# How long the router, at its own start, waits for a pair's /health before it exits (and systemd starts it again):
# derived from the fronted pairs' first-boot budgets (twinspark.budget), never set on its own.
STARTUP_WAIT_FLAG = "--worker-startup-timeout-secs"


# vllm-router refuses to start power_of_two in front of one worker ("Power-of-two policy requires at least 2
# workers", exit 1, so systemd restarted it every two seconds): a router fronting a single pair is given round_robin,
# which with one worker always picks it and is what power_of_two amounts to there.
SINGLE_WORKER_POLICY = "round_robin"


def policy_for(policy: str, workers: int) -> str:
    """The policy the router is started with for `workers` pairs (SINGLE_WORKER_POLICY for power_of_two alone)."""
    return SINGLE_WORKER_POLICY if policy == "power_of_two" and workers < 2 else policy


def flags(policy: str = DEFAULT_POLICY, startup_wait_s: int | None = None) -> list[str]:
    """--policy and the tuned flags, in a stable order; `startup_wait_s` (`startup_wait`) when given, else the
    router's own default (the loopback drills)."""
    if policy not in POLICIES:
        raise ValueError(f"router_policy: {policy!r} is not one of {', '.join(POLICIES)}")
    out = ["--policy", policy]
    for name, value in TUNED.items():
        out += [name, value]
    if startup_wait_s is not None:
        out += [STARTUP_WAIT_FLAG, str(int(startup_wait_s))]
    return out


def startup_wait(host_vars: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]],
                 router: str) -> int:
    """The longest startup wait of the pairs `router` fronts: each pair's first-boot budget under its own profile,
    as its head's env file carries them (twinspark.budget.first_boot_timers, router_startup_wait_s)."""
    found, problems = rules.pairs(host_vars, groups)
    fronted, more = rules.router_pairs(host_vars.get(router, {}), found)
    if problems or more or not fronted:
        raise ValueError("; ".join(problems + more) or f"{router}: fronts no pair")
    waits = []
    for pair in fronted:
        head = host_vars.get(pair.head, {})
        try:
            profile = nodeenv.head_setting(head, "TWINSPARK_PROFILE") or ""
            first_boot = nodeenv.head_setting(head, budget.BUDGET_ENV) or ""
        except nodeenv.NodeEnvError as error:
            raise ValueError(f"pair {pair.name}: {error}") from None
        waits.append(budget.first_boot_timers(profile, first_boot)["router_startup_wait_s"])
    return max(waits)


def worker_urls(host_vars: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]],
                router: str) -> list[str]:
    """http://<head address>:<API port> for every pair `router` fronts, in pair-name order."""
    found, problems = rules.pairs(host_vars, groups)
    fronted, more = rules.router_pairs(host_vars.get(router, {}), found)
    if problems or more or not fronted:
        raise ValueError("; ".join(problems + more) or f"{router}: fronts no pair")
    return [rules.head_url(host_vars.get(pair.head, {}), pair.head) for pair in fronted]


def exec_start(python: str, launcher: str, keycheck_url: str, listen_host: str, port: int, metrics_port: int,
               urls: Sequence[str], policy: str = DEFAULT_POLICY, worker_key_file: str | None = None,
               startup_wait_s: int | None = None) -> str:
    """The router unit's ExecStart=: router_launch.py serve (as the role copies it), the key check URL, the file of
    the key the router sends to the pairs itself (its proxied paths, /tokenize among them), then the router's own
    flags (`startup_wait_s`: see `startup_wait`; the policy as `policy_for` gives it for this many pairs)."""
    key = ["--worker-key-file", worker_key_file] if worker_key_file else []
    argv = [python, "-I", launcher, "serve", "--key-check-url", keycheck_url, *key, "--",
            "--host", listen_host, "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--worker-urls", *urls, *flags(policy_for(policy, len(urls)), startup_wait_s)]
    return shlex.join(argv)

