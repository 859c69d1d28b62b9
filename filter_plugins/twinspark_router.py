"""Ansible filters for roles/router over twinspark.fleet.router_config (the rules live in the Python package)."""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))  # python_tools/ on sys.path

from ansible.errors import AnsibleFilterError
from twinspark.fleet import router_config, rules


def twinspark_router_worker_urls(all_hostvars, groups, router):
    """Every fronted pair's head API URL, for the router on host `router`."""
    plain = {host: all_hostvars[host] for host in groups.get("all", []) if host in all_hostvars}
    try:
        return router_config.worker_urls(plain, groups, str(router))
    except ValueError as error:
        raise AnsibleFilterError(f"router {router}: {error}; run playbooks/validate.yml") from None


def twinspark_router_startup_wait(all_hostvars, groups, router):
    """How long the router on host `router` waits at start for a pair's /health: the longest of its pairs'
    first-boot budgets (router_config.startup_wait)."""
    plain = {host: all_hostvars[host] for host in groups.get("all", []) if host in all_hostvars}
    try:
        return router_config.startup_wait(plain, groups, str(router))
    except ValueError as error:
        raise AnsibleFilterError(f"router {router}: {error}; run playbooks/validate.yml") from None


def twinspark_router_drain_heads(all_hostvars, groups, router):
    """The heads whose drain goes to the router on host `router`: each gets its certificate (issue 43, row 8)."""
    plain = {host: all_hostvars[host] for host in groups.get("all", []) if host in all_hostvars}
    return rules.drain_heads(plain, groups, str(router))


def twinspark_router_controller_ca(all_hostvars, router):
    """Where the controller keeps the certificate of the router on host `router` (twinspark_router_ca_file)."""
    return rules.controller_router_ca(all_hostvars[router], str(router))


def twinspark_router_admin_record(all_hostvars, router, ca):
    """The record of the router's admin listener each head whose drain goes to `router` gets (issue 43, row 8)."""
    return rules.admin_record(all_hostvars[router], str(router), str(ca))


def twinspark_router_cert_argv(names, cert, key, days):
    """openssl's command line for the router's self-signed certificate (twinspark.tls.make_cert_argv: its own CA
    for its own names only), run on the router host so that its key never leaves it."""
    from twinspark import tls

    return tls.make_cert_argv(str(cert), str(key), [str(n) for n in names], int(days), subject="twinspark-router")


def twinspark_router_exec_start(urls, python, launcher, keycheck_url, listen_host, port, metrics_port, policy,
                                worker_key_file=None, startup_wait_s=None):
    try:
        return router_config.exec_start(str(python), str(launcher), str(keycheck_url), str(listen_host), int(port),
                                        int(metrics_port), [str(u) for u in urls], str(policy),
                                        str(worker_key_file) if worker_key_file else None,
                                        int(startup_wait_s) if startup_wait_s is not None else None)
    except ValueError as error:
        raise AnsibleFilterError(str(error)) from None


class FilterModule:
    def filters(self):
        return {
            "twinspark_router_worker_urls": twinspark_router_worker_urls,
            "twinspark_router_exec_start": twinspark_router_exec_start,
            "twinspark_router_startup_wait": twinspark_router_startup_wait,
            "twinspark_router_drain_heads": twinspark_router_drain_heads,
            "twinspark_router_controller_ca": twinspark_router_controller_ca,
            "twinspark_router_cert_argv": twinspark_router_cert_argv,
            "twinspark_router_admin_record": twinspark_router_admin_record,
        }
