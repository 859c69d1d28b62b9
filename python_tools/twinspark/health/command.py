"""`twinspark health`: one answer to "is the pair healthy?", from a terminal, a playbook or a timer."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from twinspark import api, layout, netguard
from twinspark.fleet import router_client
from twinspark.health import checks, fleetreport, gather, remote, report
from twinspark.health.checks import CheckResult
from twinspark.inventory import InventoryError, default_inventory, read_fleet, read_inventory

EPILOG = """\
modes:
  (default)     from the controller: reads the inventory, runs `twinspark health --local` on both nodes over SSH
                in parallel, compares the nodes, and probes the pair's API from outside
  --local       this node only (plus the pair's API through the local env file when this node is the head)
  --pair        only the pair's API: /health, /v1/models, a one-token generation (liveness), /metrics;
                with --local it reads the URL, served name and key from this node's env files

exit codes:
  0  healthy
  1  degraded (serving, but something needs attention)
  2  failed (not serving, or a node is unreachable or misconfigured); with --pair: the pair does not answer a
     one-token generation, /v1/models, or /health, so both ranks need an ordered restart
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "health", help="check the pair's health (table, --json, --prom-file)",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", help="Ansible inventory of the pair (default: ansible.cfg's)")
    parser.add_argument("--local", action="store_true", help="check this node only (run on a node)")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--pair", action="store_true", help="only the pair's API checks (liveness)")
    scope.add_argument("--no-pair", action="store_true", help="skip the pair's API checks")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quiet", action="store_true",
                        help="print only what is not ok, and the summary line (the timer's journal)")
    parser.add_argument("--prom-file", type=Path, metavar="PATH",
                        help="also write a node_exporter textfile (e.g. "
                        f"{layout.default().metrics_dir}/twinspark.prom)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="S",
                        help="seconds allowed for each HTTP request and SSH step (default 10)")
    parser.add_argument("--limit", metavar="PAIRS",
                        help="on a fleet inventory: only these pairs (comma-separated pair names) and the router's "
                        "view of them")
    parser.add_argument("--node", help="the name this node reports under with --local (default: its hostname)")
    parser.add_argument("--env", action="append", type=Path, metavar="FILE",
                        help="with --local: env file(s) to read, later ones override earlier ones "
                        f"(default: {' '.join(map(str, gather.default_env_files()))})")
    parser.set_defaults(func=run)


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _pair_metrics(pair: Mapping[str, object] | None) -> dict[str, object]:
    if not pair:
        return {}
    metrics = {k: v for k, v in dict(pair.get("metrics") or {}).items() if k != "error"}
    generate = pair.get("generate") or {}
    if generate.get("tokens"):
        metrics["liveness_seconds"] = generate.get("elapsed")
    certificate = pair.get("certificate") or {}
    if "not_after" in certificate:
        metrics["tls_cert_expiry"] = certificate["not_after"]
    return metrics


def _down(results: list[CheckResult]) -> list[str]:
    return sorted({r.node for r in results if r.check in ("unit", "reach") and r.status == checks.FAILED})


def node_summary(facts: Mapping[str, object]) -> dict[str, object]:
    """What a node hands the controller for the cross-node checks (secrets only as digests)."""
    model = facts.get("model") or {}
    return {
        "rank": facts.get("rank"),
        "profile": facts.get("profile"),
        "settings": (facts.get("env") or {}).get("settings") or {},
        "runtime": facts.get("runtime") or {},
        "model": {k: model.get(k) for k in ("model", "revision", "snapshot")},
    }


def local_sweep(args: argparse.Namespace) -> tuple[list[CheckResult], dict, dict]:
    env_facts, env = gather.read_env(args.env or None)
    name = args.node or gather.node_name()
    results: list[CheckResult] = []
    nodes: dict[str, object] = {}
    if not args.pair:
        facts = gather.gather_node(env_facts, env)
        results += checks.node_checks(name, facts)
        nodes[name] = node_summary(facts)
    metrics: dict[str, object] = {}
    if args.pair or (gather.is_head(env) and not args.no_pair):
        url = api.url_from_env(env)
        served = env.get("SERVED_MODEL_NAME") or None
        pair = api.gather(url, served, api.first_key(env), args.timeout, ca=api.tls_ca(env))
        results += checks.pair_checks(url, pair, served, _int(env.get("MAX_MODEL_LEN")), args.timeout,
                                      _down(results))
        metrics = _pair_metrics(pair)
    return results, nodes, metrics


def cross_checks(summaries: Mapping[str, Mapping[str, object]]) -> list[CheckResult]:
    try:
        per_node, secret = gather.registry_flags()
    except (ImportError, OSError, AttributeError):
        per_node, secret = set(), set()
    return [
        checks.check_settings_agree({n: s.get("settings") or {} for n, s in summaries.items()}, per_node, secret),
        checks.check_runtime_agree({n: s.get("runtime") or {} for n, s in summaries.items()}),
        checks.check_model_agree({n: s.get("model") or {} for n, s in summaries.items()}),
    ]


def controller_sweep(args: argparse.Namespace) -> tuple[list[CheckResult], dict, dict]:
    return sweep_inventory(args.inventory, args.timeout, nodes=not args.pair, probe_pair=not args.no_pair)


def sweep_inventory(inventory: str | None, timeout: float, nodes: bool = True, probe_pair: bool = True,
                    ) -> tuple[list[CheckResult], dict, dict]:
    """The controller's sweep of the inventory's pair (ansible.cfg's inventory when None): both nodes' agents over
    SSH (unless `nodes` is false) and the pair's API from outside (unless `probe_pair` is false)."""
    results, summaries, metrics, _ = sweep_pair(inventory, timeout, nodes, probe_pair)
    return results, summaries, metrics


def sweep_pair(inventory: str | None, timeout: float, nodes: bool = True, probe_pair: bool = True,
               pair_name: str | None = None) -> tuple[list[CheckResult], dict, dict, dict[str, str]]:
    """`sweep_inventory` for one pair (in a fleet: the pair called `pair_name`), plus the head's env values (the
    key among them: kept in memory, never printed)."""
    source = inventory or default_inventory()
    pair = read_inventory(source) if pair_name is None else read_inventory(source, pair_name)
    every = pair.nodes
    netguard.check([*(node.host for node in every), pair.api_url])
    outcome = remote.sweep(pair, timeout, nodes=nodes, probe_pair=probe_pair)
    results: list[CheckResult] = []
    summaries: dict[str, Mapping[str, object]] = {}
    if nodes:
        for node in every:
            if node.name in outcome.errors:
                results.append(checks.check_agent(node.name, outcome.errors[node.name]))
                continue
            node_report = outcome.reports[node.name]
            results += report.results_from_json(node_report.get("checks") or [])
            summaries.update(node_report.get("nodes") or {})
        # with a node unreachable there is nothing to compare (its failure says so); a single Spark has no other node
        if len(summaries) == len(every) > 1:
            results += cross_checks(summaries)
    metrics: dict[str, object] = {}
    if outcome.pair is not None:
        env = outcome.head_env or {}
        results += checks.pair_checks(pair.api_url, outcome.pair, env.get("SERVED_MODEL_NAME") or None,
                                      _int(env.get("MAX_MODEL_LEN")), timeout, _down(results))
        metrics = _pair_metrics(outcome.pair)
    return results, summaries, metrics, dict(outcome.head_env or {})


def limited(view, limit: str | None):
    """The fleet view narrowed to the pairs named in `limit` (comma-separated), and the URLs of the others, which the
    router may list without being judged for it; ValueError naming an unknown pair."""
    if not limit:
        return view, ()
    names = [name.strip() for name in limit.split(",") if name.strip()]
    known = [name for name, _ in view.pairs]
    unknown = [name for name in names if name not in known]
    if not names:
        raise ValueError(f"--limit {limit}: name at least one pair (pairs: {', '.join(known) or 'none'})")
    if unknown:
        raise ValueError(f"--limit {limit}: {', '.join(unknown)} is not a pair of this inventory "
                         f"(pairs: {', '.join(known) or 'none'})")
    chosen = tuple(pair for pair in view.pairs if pair[0] in names)
    return replace(view, pairs=chosen), tuple(url for name, url in view.pairs if name not in names)


def fleet_sweep(view, inventory: str | None, timeout: float, nodes: bool = True, probe_pair: bool = True,
                list_workers: Callable[[str, str | None, float], tuple[int | None, str]] | None = None,
                others: tuple[str, ...] = ()) -> tuple[list[fleetreport.PairSeen], fleetreport.RouterVerdict | None]:
    """Every pair of a fleet (`inventory.FleetView`) swept as a one-pair inventory is, one after another, then the
    router's worker list (asked with the router's admin key from the inventory, the only key its front lets through
    to /list_workers; without one readable here, with the first pair's key, which the front refuses: 403).
    `others`: URLs of the fleet's pairs left out by --limit, which the router lists without being judged for it."""
    seen: list[fleetreport.PairSeen] = []
    key: str | None = None
    if view.problems:
        seen.append(fleetreport.PairSeen("inventory", "", tuple(
            checks.failed(checks.PAIR, "fleet inventory", problem, "fix the inventory; playbooks/validate.yml says "
                                                                    "the same") for problem in view.problems)))
    for name, url in view.pairs:
        try:
            results, _, _, env = sweep_pair(inventory, timeout, nodes, probe_pair, name)
        except (InventoryError, netguard.UnsafeRoute) as error:
            results, env = [checks.failed(checks.PAIR, "inventory", str(error), "fix the inventory")], {}
        key = key or api.first_key(env)
        seen.append(fleetreport.PairSeen(name, url, tuple(results)))
    if view.router_url is None:
        return seen, None
    # Issue 43, row 8: the admin key goes to the front's admin listener over TLS, verified against the router's
    # certificate that role router fetched to this controller; without that file nothing is sent.
    url = view.router_admin_url or view.router_url
    netguard.check([url])
    if list_workers is not None:
        status, body = list_workers(url, view.router_admin_key or key, timeout)
    else:
        status, body = _list_workers(url, view.router_admin_key or key, timeout, view.router_ca)
    listed = router_client.listed_from_answer(status, body)
    router = fleetreport.RouterSeen(url, listed, "" if listed is not None else f"{status}: {body[:160]}")
    return seen, fleetreport.router_verdict(router, [p for p in seen if p.url], others)


def _list_workers(url: str, key: str | None, timeout: float, ca: str | None = None) -> tuple[int | None, str]:
    """The router's worker list, asked with `key`; to an https URL only when `ca` (the router's certificate on
    this controller) is there to verify it against: the key goes nowhere unverified."""
    if url.startswith("https://") and not (ca and Path(ca).is_file()):
        return None, (f"not asked: the router's certificate is not at {ca} on this controller (site.yml's router "
                      "play fetches it there; or set twinspark_router_ca_file)")
    return router_client.request(url, "/list_workers", key, timeout_s=timeout, ca=ca)


def answer_fleet(sweep: Callable[[], tuple[list[fleetreport.PairSeen], fleetreport.RouterVerdict | None]],
                 as_json: bool = False, prom_file: Path | None = None) -> int:
    """Print the fleet's table (or JSON), write the fleet's textfile when asked; the worst exit code of all its
    pairs and the router."""
    started = time.monotonic()
    try:
        pairs, router = sweep()
    except netguard.UnsafeRoute as error:
        print(f"twinspark health: {error}", file=sys.stderr)
        return 2
    elapsed = time.monotonic() - started
    if as_json:
        print(json.dumps(fleetreport.as_json(pairs, router), indent=2))
    else:
        print(fleetreport.table(pairs, router))
    if prom_file:
        report.write_fleet_prom_file(prom_file, pairs, router, elapsed)
    return fleetreport.fleet_exit(pairs, router)


def _fleet_answer(inventory: str | None, timeout: float, limit: str | None = None, nodes: bool = True,
                  probe_pair: bool = True, as_json: bool = False, prom_file: Path | None = None) -> int | None:
    """The fleet's report and exit code when the inventory is a fleet (every pair, or those in `limit`, and the
    router); None for a one-pair inventory, which goes on as it always did. An unreadable inventory, a bad `limit`,
    or a `limit` on a one-pair inventory: one line, exit 2."""
    try:
        view = read_fleet(inventory or default_inventory())
        if view is None:
            if limit:
                raise ValueError(f"--limit {limit}: the inventory is one pair, not a fleet; leave --limit out")
            return None
        view, others = limited(view, limit)
    except (InventoryError, ValueError) as error:
        print(f"twinspark health: {error}", file=sys.stderr)
        return 2
    return answer_fleet(lambda: fleet_sweep(view, inventory, timeout, nodes=nodes, probe_pair=probe_pair,
                                            others=others), as_json=as_json, prom_file=prom_file)


def run(args: argparse.Namespace) -> int:
    if not args.local:
        code = _fleet_answer(args.inventory, args.timeout, getattr(args, "limit", None), nodes=not args.pair,
                             probe_pair=not args.no_pair, as_json=args.json, prom_file=args.prom_file)
        if code is not None:
            return code
    sweep = (lambda: local_sweep(args)) if args.local else (lambda: controller_sweep(args))
    return answer(sweep, as_json=args.json, quiet=getattr(args, "quiet", False), prom_file=args.prom_file)


def check_inventory(inventory: str | None, timeout: float = 10.0) -> int:
    """`twinspark health -i INVENTORY` for another command (the playbook verbs end with it, a fleet upgrade gates on
    it): the whole controller sweep, printed as the table; the health exit code (0 healthy, 1 degraded, 2 failed).
    A fleet inventory gets the fleet's sweep and table (every pair and the router), as `twinspark health` does."""
    code = _fleet_answer(inventory, timeout)
    return code if code is not None else answer(lambda: sweep_inventory(inventory, timeout))


def answer(sweep: Callable[[], tuple[list[CheckResult], dict, dict]], as_json: bool = False, quiet: bool = False,
           prom_file: Path | None = None) -> int:
    """Run a sweep and print its report (table or JSON), write the textfile when asked; the health exit code.
    An unusable inventory or an unsafe route is exit 2 with one line naming it."""
    started = time.monotonic()
    try:
        results, nodes, metrics = sweep()
    except Exception as error:
        if isinstance(error, (InventoryError, netguard.UnsafeRoute)):
            print(f"twinspark health: {error}", file=sys.stderr)
            return 2
        raise
    elapsed = time.monotonic() - started
    if as_json:
        print(json.dumps(report.as_json(results, nodes, elapsed, metrics), indent=2, sort_keys=False))
    else:
        print(report.table(results, quiet=quiet))
    if prom_file:
        report.write_prom_file(prom_file, results, elapsed, metrics)
    return checks.exit_code(checks.overall(results))
