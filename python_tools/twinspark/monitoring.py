"""Who monitors the pairs and what Prometheus scrapes: pure rules over the inventory, and `twinspark monitor`.

Role monitoring (docs/MONITORING.md) installs the node exporter on every node of the pairs and Prometheus with
Alertmanager on one monitor host: the host of group `twinspark_monitor`, else the head of the first pair. Everything
it derives from the inventory is decided here, so the role (through filter_plugins/twinspark_monitoring.py), the
firewall tables of roles vllm_service and router, validation and `twinspark monitor scrape-config` agree:

  * `monitor_host`: which host runs Prometheus and Alertmanager.
  * `address`: where a host's monitoring listens, its management address (`monitoring_listen_address`, else
    `ansible_host`); Prometheus dials the same address.
  * `scrape_configs` / `prometheus_config`: the scrape jobs and their target labels (job `vllm`: every head's API
    /metrics, scheme and CA as the API serves; `node`: every node's exporter; `router`: a fleet router's metrics
    when the router host is the monitor; `prometheus` and `alertmanager`: the monitor itself). Every target on a
    pair node carries `pair`, `node` and `rank_role`; a target elsewhere carries `node`.
  * `firewall`: the monitoring ports a host's own nftables table filters, and who may reach them.
  * `alertmanager_config`: the receiver the inventory names (a webhook, e-mail, or both).
  * Alertmanager listens on the monitor's loopback only, behind basic auth (ALERTMANAGER_USER, the password the
    role generates on the monitor into ALERTMANAGER_PASSWORD_FILE, root-only): whoever silences an alert or reads
    its status (the receiver's URL included) is root there or Prometheus (issue 43, row 10).

`twinspark monitor scrape-config [-i INVENTORY]` prints the scrape jobs for an existing Prometheus, from an
inventory on the controller or, on a node without one, from the record role monitoring wrote there
(layout `monitoring_record`). Exit codes: 0 printed, 2 bad input (one line naming it).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from twinspark import api, inventory, layout
from twinspark.fleet import rules as fleet

MONITOR_GROUP = "twinspark_monitor"
LISTEN_VAR = "monitoring_listen_address"
ALLOWED_VAR = "monitoring_allowed_networks"
ENABLED_VAR = "monitoring_enabled"
PAIR_ID_VAR = layout.VAR_PREFIX + "pair_id"
ROUTER_ALLOWED_VAR = "router_allowed_networks"
RECORD_SCHEMA = 1
# Alertmanager's one user, and the root-only file on the monitor host with its password (role monitoring writes it;
# the planned restarts' silences, delegated to the monitor, read it there).
ALERTMANAGER_USER = "twinspark"
ALERTMANAGER_PASSWORD_FILE = "/etc/prometheus/twinspark/alertmanager-password"
LOOPBACK = "127.0.0.1"
HostVars = Mapping[str, Mapping[str, Any]]
Groups = Mapping[str, Sequence[str]]


def _members(groups: Groups, name: str) -> list[str]:
    return [str(host) for host in groups.get(name) or []]


def pairs(host_vars: HostVars, groups: Groups) -> list[fleet.FleetPair]:
    """The well-formed pairs of the inventory (one for a one-pair inventory, every named pair of a fleet)."""
    return fleet.pairs(host_vars, groups)[0]


def monitor_host(host_vars: HostVars, groups: Groups) -> str | None:
    """The host that runs Prometheus and Alertmanager: the first of group twinspark_monitor, else the head of the
    first pair; None when the inventory has neither."""
    chosen = _members(groups, MONITOR_GROUP)
    if chosen:
        return chosen[0]
    found = pairs(host_vars, groups)
    return found[0].head if found else None


def components(host: str, host_vars: HostVars, groups: Groups) -> list[str]:
    """What role monitoring installs on `host`: `node_exporter` on every node of a pair, `prometheus` and
    `alertmanager` on the monitor host."""
    here = ["node_exporter"] if any(host in pair.hosts for pair in pairs(host_vars, groups)) else []
    return here + (["prometheus", "alertmanager"] if host == monitor_host(host_vars, groups) else [])


def address(host: str, host_vars: HostVars) -> str:
    """Where `host`'s monitoring listens and is dialled: monitoring_listen_address, else ansible_host, else the
    host's name."""
    own = host_vars.get(host, {})
    return str(own.get(LISTEN_VAR) or own.get("ansible_host") or host)


def _endpoint(host: str, port: int | str) -> str:
    return f"[{host}]:{int(str(port))}" if ":" in host else f"{host}:{int(str(port))}"


def _layout(host: str, host_vars: HostVars) -> layout.Layout:
    return layout.from_vars(host_vars.get(host, {}))


def pair_label(pair: fleet.FleetPair, host_vars: HostVars, groups: Groups) -> str:
    """The `pair` label of a pair's targets: the head's twinspark_layout_pair_id when the inventory sets it, else
    on a fleet the pair's name (its group), else the layout's pair_id."""
    head = host_vars.get(pair.head, {})
    if head.get(PAIR_ID_VAR):
        return str(head[PAIR_ID_VAR])
    if fleet.is_fleet(host_vars, groups):
        return str(pair.name)
    return layout.default().pair_id


@dataclass(frozen=True)
class Target:
    job: str
    endpoint: str
    labels: dict[str, str]
    scheme: str = "http"
    ca: str | None = None  # the file the target's certificate is verified against (controller side)
    auth: bool = False  # behind Alertmanager's basic auth


def _node_labels(host: str, host_vars: HostVars, groups: Groups) -> dict[str, str]:
    for pair in pairs(host_vars, groups):
        if host in pair.hosts:
            labels = {"pair": pair_label(pair, host_vars, groups), "node": str(host),
                      "rank_role": "head" if host == pair.head else "worker"}
            if pair.more:  # a group of three or more: which rank, beyond head or worker
                labels["rank"] = str(pair.hosts.index(host))
            return labels
    return {"node": str(host)}


def targets(host_vars: HostVars, groups: Groups, monitor: str | None) -> list[Target]:
    """Every target, in job order: the heads' APIs and the nodes' exporters always; with a monitor host, the
    router's metrics (only when the monitor is the router host: its listener is loopback-only) and the monitor's
    Prometheus and Alertmanager."""
    found: list[Target] = []
    for pair in pairs(host_vars, groups):
        head = host_vars.get(pair.head, {})
        url = urlsplit(fleet.head_url(head, pair.head))
        found.append(Target("vllm", str(url.netloc), _node_labels(pair.head, host_vars, groups), url.scheme,
                            api.tls_ca_from_inventory(head)))
    for pair in pairs(host_vars, groups):
        for host in pair.hosts:
            port = _layout(host, host_vars).node_exporter_port
            found.append(Target("node", _endpoint(address(host, host_vars), port),
                                _node_labels(host, host_vars, groups)))
    if monitor is None:
        return found
    if monitor in _members(groups, fleet.ROUTER_GROUP):
        router = host_vars.get(monitor, {})
        port = router.get(fleet.ROUTER_METRICS_PORT_VAR) or _layout(monitor, host_vars).router_metrics_port
        found.append(Target("router", _endpoint("127.0.0.1", port), {"node": str(monitor)}))
    own = _layout(monitor, host_vars)
    labels = _node_labels(monitor, host_vars, groups)
    found.append(Target("prometheus", _endpoint(address(monitor, host_vars), own.prometheus_port), labels))
    # Alertmanager listens on the monitor's loopback only, where Prometheus runs too.
    found.append(Target("alertmanager", _endpoint(LOOPBACK, own.alertmanager_port), dict(labels), auth=True))
    return found


def ca_file_name(pair: str) -> str:
    """The name of a pair's API CA copy in the monitor's CA directory."""
    return f"{pair}-api-ca.pem"


def scrape_configs(host_vars: HostVars, groups: Groups, monitor: str | None = None,
                   ca_dir: str | None = None, password_file: str | None = None) -> list[dict[str, object]]:
    """Prometheus' scrape_configs for the inventory. `monitor`: the Prometheus host (None: an existing Prometheus
    elsewhere, which gets the vllm and node jobs only). `ca_dir`: where the monitor keeps each TLS pair's CA copy
    (ca_file_name); None names the controller's file, as the inventory does. `password_file`: where Prometheus reads
    Alertmanager's password (its job's basic auth)."""
    jobs: dict[str, dict[str, object]] = {}
    for target in targets(host_vars, groups, monitor):
        tls: dict[str, str] = {}
        if target.ca:
            tls = {"ca_file": f"{ca_dir}/{ca_file_name(target.labels['pair'])}" if ca_dir else target.ca}
        key = target.job if target.job != "vllm" else json.dumps([target.scheme, tls])
        job = jobs.get(key)
        if job is None:
            job = {"job_name": target.job, "static_configs": []}
            if target.scheme != "http":
                job["scheme"] = target.scheme
            if tls:
                job["tls_config"] = tls
            if target.auth and password_file:
                job["basic_auth"] = {"username": ALERTMANAGER_USER, "password_file": password_file}
            jobs[key] = job
        job["static_configs"].append({"targets": [target.endpoint], "labels": target.labels})  # type: ignore[union-attr]
    found = list(jobs.values())
    vllm = [job for job in found if job["job_name"] == "vllm"]
    if len(vllm) > 1:
        # Pairs that differ in scheme or CA need a job each; the `job` label stays vllm on every one of them.
        for job in vllm:
            first = job["static_configs"][0]  # type: ignore[index]
            job["job_name"] = f"vllm-{first['labels']['pair']}"
            for static in job["static_configs"]:  # type: ignore[union-attr]
                static["labels"] = {**static["labels"], "job": "vllm"}
    return found


def ca_copies(host_vars: HostVars, groups: Groups, ca_dir: str) -> list[dict[str, str]]:
    """The CA files the monitor needs for TLS pairs: [{src (controller), dest (monitor)}]."""
    copies = {}
    for target in targets(host_vars, groups, None):
        if target.job == "vllm" and target.ca:
            pair = target.labels["pair"]
            copies[pair] = {"src": target.ca, "dest": f"{ca_dir}/{ca_file_name(pair)}"}
    return list(copies.values())


def urls(host_vars: HostVars, groups: Groups) -> dict[str, str]:
    """The monitor's Prometheus and Alertmanager base URLs ({} without a monitor host). Alertmanager's is its
    loopback listener: it answers on the monitor host only, with basic auth."""
    monitor = monitor_host(host_vars, groups)
    if monitor is None:
        return {}
    own = _layout(monitor, host_vars)
    where = address(monitor, host_vars)
    return {"prometheus": f"http://{_endpoint(where, own.prometheus_port)}",
            "alertmanager": f"http://{_endpoint(LOOPBACK, own.alertmanager_port)}"}


def announced_urls(host_vars: HostVars, groups: Groups) -> dict[str, str]:
    """The monitor's URLs as the front door names them: {} when the inventory has no monitor host or turns
    monitoring off there (monitoring_enabled: false)."""
    monitor = monitor_host(host_vars, groups)
    if monitor is None or _is_false(host_vars.get(monitor, {}).get(ENABLED_VAR, True)):
        return {}
    return urls(host_vars, groups)


# A planned restart (site.yml's ordered restart, an upgrade, a rollback, a recipe switch) silences these alerts of its
# own pair for as long as it runs: the pair is down on purpose. A ticket that counts restarts over an hour
# (TwinSparkRankRestartingOften) is left alone: it judges the hour, not the restart.
PLANNED_RESTART_ALERTS = ("TwinSparkPairDown", "TwinSparkTargetDown")
SILENCE_AUTHOR = "twinspark"


def silence_target(head: str, host_vars: HostVars, groups: Groups) -> dict[str, str]:
    """Where a planned restart of `head`'s pair asks for its silence: {monitor, url, pair, user, password_file} (the
    monitor host, its Alertmanager's base URL there (loopback), the pair's `pair` label, and Alertmanager's basic-auth
    user and the root-only file on the monitor with its password), or {} when the inventory monitors nothing there
    (no monitor host, monitoring_enabled false, or `head` heads no pair)."""
    monitor = monitor_host(host_vars, groups)
    if monitor is None or _is_false(host_vars.get(monitor, {}).get(ENABLED_VAR, True)):
        return {}
    for pair in pairs(host_vars, groups):
        if pair.head == head:
            return {"monitor": monitor, "url": urls(host_vars, groups)["alertmanager"],
                    "pair": pair_label(pair, host_vars, groups), "user": ALERTMANAGER_USER,
                    "password_file": ALERTMANAGER_PASSWORD_FILE}
    return {}


def silence_request(pair: str, why: str, starts: float, ends: float, silence_id: str = "") -> dict[str, object]:
    """The body of Alertmanager's POST /api/v2/silences for a planned restart of `pair` from `starts` to `ends`
    (seconds since the epoch); with `silence_id`, the same silence with a new end (how a run ends its silence early,
    or lets it run out a little after the pair serves again)."""
    if ends <= starts:
        raise ValueError(f"a silence must end after it starts ({starts} >= {ends})")
    stamp = "%Y-%m-%dT%H:%M:%S.000Z"
    body: dict[str, object] = {
        "matchers": [{"name": "alertname", "value": "|".join(PLANNED_RESTART_ALERTS), "isRegex": True,
                      "isEqual": True},
                     {"name": "pair", "value": pair, "isRegex": False, "isEqual": True}],
        "startsAt": time.strftime(stamp, time.gmtime(starts)),
        "endsAt": time.strftime(stamp, time.gmtime(ends)),
        "createdBy": SILENCE_AUTHOR,
        "comment": f"planned restart: {why}"[:200],
    }
    if silence_id:
        body["id"] = silence_id
    return body


def prometheus_config(host_vars: HostVars, groups: Groups, interval_s: int, rule_files: Sequence[str],
                      ca_dir: str, password_file: str | None = None) -> dict[str, object]:
    """The monitor's whole prometheus.yml: the global intervals (a scrape may take the whole interval, up to 10 s),
    the rule files, the local Alertmanager (over loopback; with `password_file`, where Prometheus reads its
    password, basic auth), every scrape job."""
    monitor = monitor_host(host_vars, groups)
    if monitor is None:
        raise ValueError("the inventory has no pair and no twinspark_monitor host: nothing to monitor")
    interval = int(interval_s)
    own = _layout(monitor, host_vars)
    alertmanager: dict[str, object] = {"static_configs": [{"targets": [_endpoint(LOOPBACK, own.alertmanager_port)]}]}
    if password_file:
        alertmanager["basic_auth"] = {"username": ALERTMANAGER_USER, "password_file": password_file}
    return {
        "global": {"scrape_interval": f"{interval}s", "scrape_timeout": f"{min(interval, 10)}s",
                   "evaluation_interval": f"{interval}s"},
        "rule_files": list(rule_files),
        "alerting": {"alertmanagers": [alertmanager]},
        "scrape_configs": scrape_configs(host_vars, groups, monitor, ca_dir, password_file),
    }


def _networks(value: object) -> list[str]:
    if value in (None, ""):
        return []
    return [str(value)] if isinstance(value, str) else [str(item) for item in value]  # type: ignore[union-attr]


def _host_network(address_text: str) -> str | None:
    try:
        ip = ipaddress.ip_address(address_text)
    except ValueError:
        return None
    return f"{ip}/{ip.max_prefixlen}"


def firewall(host: str, host_vars: HostVars, groups: Groups) -> dict[str, list[str]]:
    """What `host`'s own nftables table filters for monitoring: `ports` (the node exporter's on a pair node, and
    Prometheus' and Alertmanager's on the monitor host) and who may reach them (`clients_v4`, `clients_v6`,
    loopback always): on a pair node monitoring_allowed_networks (unset: vllm_service_api_allowed_networks) and
    the monitor host's address, so its Prometheus always reaches the exporters; on a router node its
    router_allowed_networks."""
    own = host_vars.get(host, {})
    here = _layout(host, host_vars)
    monitor = monitor_host(host_vars, groups)
    pair_nodes = {node for pair in pairs(host_vars, groups) for node in pair.hosts}
    ports = [here.node_exporter_port] if host in pair_nodes else []
    if host == monitor:
        ports += [here.prometheus_port, here.alertmanager_port]
    loopback = ["127.0.0.0/8", "::1/128"]
    if host in pair_nodes:
        allowed = _networks(own[ALLOWED_VAR] if ALLOWED_VAR in own else own.get(fleet.API_ALLOWED_VAR))
        monitor_network = _host_network(address(monitor, host_vars)) if monitor else None
        # nftables refuses overlapping elements in an interval set: the monitor only when no listed network has it
        if monitor_network and not any(_contains(net, ipaddress.ip_network(monitor_network).network_address)
                                       for net in loopback + allowed):
            allowed.append(monitor_network)
    else:
        allowed = _networks(own.get(ROUTER_ALLOWED_VAR))
    allowed = list(dict.fromkeys(allowed))
    return {"ports": [str(int(port)) for port in ports],
            "clients_v4": [loopback[0]] + [net for net in allowed if ":" not in net],
            "clients_v6": [loopback[1]] + [net for net in allowed if ":" in net]}


def _is_false(value: object) -> bool:
    return value is False or str(value).strip().lower() in ("false", "no", "0", "off")


def problems(host_vars: HostVars, groups: Groups) -> list[str]:
    """What stops role monitoring from working on this inventory, one line each naming the variable and the fix;
    none when the monitor host's monitoring_enabled is false. The role checks them before it touches a host (the
    inventory's validation does not: a pair serves whatever its monitoring can see)."""
    monitor = monitor_host(host_vars, groups)
    if monitor is None or _is_false(host_vars.get(monitor, {}).get(ENABLED_VAR, True)):
        return []
    lines = []
    chosen = _members(groups, MONITOR_GROUP)
    if len(chosen) > 1:
        lines.append(f"group {MONITOR_GROUP} has {len(chosen)} hosts ({', '.join(chosen)}); one Prometheus and one "
                     f"Alertmanager serve the whole inventory: keep one host in {MONITOR_GROUP}")
    monitor_ip = _host_network(address(monitor, host_vars))
    for pair in pairs(host_vars, groups):
        if monitor in pair.hosts or monitor_ip is None:
            continue
        head = host_vars.get(pair.head, {})
        allowed = _networks(head.get(fleet.API_ALLOWED_VAR))
        ip = ipaddress.ip_address(monitor_ip.split("/")[0])
        if not any(_contains(network, ip) for network in allowed):
            lines.append(f"{monitor}: its address {ip} is not in {fleet.API_ALLOWED_VAR} of pair {pair.name} "
                         f"(head {pair.head}), so Prometheus could not scrape that pair's /metrics; add {monitor_ip} "
                         "or its network there")
    return lines


def _contains(network: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    try:
        return ip in ipaddress.ip_network(network, strict=False)
    except ValueError:
        return False  # the vllm_service role's own checks name a malformed network


# ---------------------------------------------------------------------------------------------------------------
# Alertmanager
# ---------------------------------------------------------------------------------------------------------------

_DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")


@dataclass(frozen=True)
class Receiver:
    """Where Alertmanager sends (the role's monitoring_alert_webhook_url and monitoring_alert_email_* knobs)."""

    webhook_url: str = ""
    email_to: str = ""
    email_from: str = ""
    smarthost: str = ""
    auth_username: str = ""
    password_file: str = ""  # where the unit's credential puts the SMTP password; "" without one
    require_tls: bool = True


def receiver_problems(receiver: Receiver) -> list[str]:
    """One line per unusable receiver knob, naming it and the fix."""
    lines = []
    if receiver.webhook_url:
        parts = urlsplit(receiver.webhook_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            lines.append(f"monitoring_alert_webhook_url must be an http:// or https:// URL (got "
                         f"{receiver.webhook_url!r}); set it to the receiver's URL, or to '' for none")
    email = {"monitoring_alert_email_to": receiver.email_to, "monitoring_alert_email_from": receiver.email_from,
             "monitoring_alert_email_smarthost": receiver.smarthost}
    if any(email.values()) and not all(email.values()):
        missing = ", ".join(name for name, value in email.items() if not value)
        lines.append(f"e-mail alerts need monitoring_alert_email_to, _from and _smarthost together; {missing} "
                     "is empty: set it, or leave all three empty for no e-mail")
    if receiver.smarthost and not re.match(r"^\[?[^\s\]]+\]?:[0-9]+$", receiver.smarthost):
        lines.append(f"monitoring_alert_email_smarthost must be host:port (got {receiver.smarthost!r}), e.g. "
                     "smtp.example.org:587")
    return lines


def alertmanager_config(receiver: Receiver, group_wait: str, group_interval: str,
                        repeat_interval: str) -> dict[str, object]:
    """The whole alertmanager.yml: every alert to the one receiver, grouped by alert and pair, resolutions sent.
    Without a webhook or an e-mail address the receiver sends nothing (the alerts show in Alertmanager's UI)."""
    for name, value in (("group_wait", group_wait), ("group_interval", group_interval),
                        ("repeat_interval", repeat_interval)):
        if not _DURATION.match(str(value)):
            raise ValueError(f"monitoring_alertmanager_{name} must be a duration such as 30s or 4h (got {value!r})")
    problems_found = receiver_problems(receiver)
    if problems_found:
        raise ValueError("; ".join(problems_found))
    config: dict[str, object] = {}
    target: dict[str, object] = {"name": "twinspark"}
    if receiver.webhook_url:
        target["webhook_configs"] = [{"url": receiver.webhook_url, "send_resolved": True}]
    if receiver.email_to:
        smtp: dict[str, object] = {"smtp_smarthost": receiver.smarthost, "smtp_from": receiver.email_from,
                                   "smtp_require_tls": receiver.require_tls}
        if receiver.auth_username:
            smtp["smtp_auth_username"] = receiver.auth_username
        if receiver.password_file:
            smtp["smtp_auth_password_file"] = receiver.password_file
        config["global"] = smtp
        target["email_configs"] = [{"to": receiver.email_to, "send_resolved": True}]
    config["route"] = {"receiver": "twinspark", "group_by": ["alertname", "pair"], "group_wait": group_wait,
                       "group_interval": group_interval, "repeat_interval": repeat_interval}
    config["receivers"] = [target]
    return config


# ---------------------------------------------------------------------------------------------------------------
# The record on each node, and `twinspark monitor`
# ---------------------------------------------------------------------------------------------------------------


def upstream_version(package_version: str) -> str:
    """A Debian package version's upstream part: '2.42.0+ds-5+deb12u1' -> '2.42.0' ('' stays '')."""
    match = re.match(r"^(?:[0-9]+:)?([0-9]+(?:\.[0-9]+)*)", package_version or "")
    return match.group(1) if match else package_version


def record(host: str, host_vars: HostVars, groups: Groups, packages: Mapping[str, Mapping[str, str]],
           versions: Mapping[str, str]) -> dict[str, object]:
    """What role monitoring writes on `host` (layout monitoring_record): each component it runs there with its
    package version, unit and URL, the monitor's URLs, and the scrape jobs for an existing Prometheus.
    `packages`: the role's monitoring_packages (component -> package, unit, name); `versions`: package -> the
    installed version ('' when not installed, as in --check before the install)."""
    where = address(host, host_vars)
    own = _layout(host, host_vars)
    monitor_urls = urls(host_vars, groups)
    component_url = {"node_exporter": f"http://{_endpoint(where, own.node_exporter_port)}/metrics",
                     "prometheus": monitor_urls.get("prometheus", ""),
                     "alertmanager": monitor_urls.get("alertmanager", "")}
    found = []
    for component in components(host, host_vars, groups):
        meta = packages[component]
        version = str(versions.get(meta["package"]) or "")
        found.append({"component": component, "name": meta["name"], "package": meta["package"],
                      "version": version, "unit": meta["unit"], "url": component_url[component],
                      "summary": f"{meta['name']} {upstream_version(version) or '(not installed)'}"})
    return {"schema": RECORD_SCHEMA, "node": str(host), "components": found, "monitor": monitor_urls,
            "scrape_configs": scrape_configs(host_vars, groups)}


def read_record(path: Path) -> dict[str, object] | None:
    """The record role monitoring wrote on this node; None when there is none. Raises ValueError naming the path
    when it is not the role's JSON."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error.msg}); rerun ansible-playbook playbooks/monitoring.yml") from None
    if not isinstance(record, dict) or record.get("schema") != RECORD_SCHEMA:
        raise ValueError(f"{path}: not a monitoring record of schema {RECORD_SCHEMA}; rerun ansible-playbook "
                         "playbooks/monitoring.yml")
    return record


def snippet(jobs: Sequence[Mapping[str, object]]) -> str:
    """The scrape jobs as a YAML snippet to paste under an existing Prometheus' scrape_configs."""
    header = ("# TwinSpark's scrape jobs (twinspark monitor scrape-config): paste under scrape_configs: of your\n"
              "# prometheus.yml. Your Prometheus' address must be in monitoring_allowed_networks (node exporter)\n"
              "# and vllm_service_api_allowed_networks (the API's /metrics) of the inventory; a ca_file is the\n"
              "# controller's copy of the API's CA: copy it next to your Prometheus and fix the path.\n")
    return header + yaml.safe_dump({"scrape_configs": list(jobs)}, sort_keys=False, default_flow_style=False)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("monitor", help="the pair's monitoring: scrape config for an existing Prometheus",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    scrape = verbs.add_parser("scrape-config", help="print the scrape jobs (vllm, node) for an existing Prometheus")
    scrape.add_argument("-i", "--inventory", help="Ansible inventory (default: on a node, its monitoring record; "
                        "elsewhere ansible.cfg's inventory)")
    scrape.add_argument("--record", type=Path, metavar="PATH",
                        help=f"read this node's monitoring record (default {layout.current().monitoring_record})")
    scrape.add_argument("--json", action="store_true", help="print the jobs as JSON instead of YAML")
    scrape.set_defaults(func=cmd_scrape_config)


def _jobs_from_inventory(source: str) -> list[dict[str, object]]:
    host_vars, groups = inventory.read_hosts(source)
    if not pairs(host_vars, groups):
        raise ValueError(f"inventory {source}: no well-formed pair; run playbooks/validate.yml")
    return scrape_configs(host_vars, groups)


def cmd_scrape_config(args: argparse.Namespace) -> int:
    record_path = args.record or Path(layout.current().monitoring_record)
    try:
        if args.inventory is None and (args.record is not None or record_path.exists()):
            record = read_record(record_path)
            if record is None:
                raise ValueError(f"{record_path}: no monitoring record here; give -i INVENTORY, or run "
                                 "ansible-playbook playbooks/monitoring.yml first")
            jobs = list(record.get("scrape_configs") or [])
        else:
            jobs = _jobs_from_inventory(args.inventory or inventory.default_inventory())
    except (ValueError, OSError, ImportError) as error:
        print(f"twinspark monitor scrape-config: {error}", file=sys.stderr)
        return 2
    print(json.dumps(jobs, indent=2) if args.json else snippet(jobs), end="" if not args.json else "\n")
    return 0
