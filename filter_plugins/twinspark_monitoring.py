"""Ansible filters for roles/monitoring and the firewall tables over twinspark.monitoring (the rules live there)."""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))  # python_tools/ on sys.path

from ansible.errors import AnsibleFilterError
from twinspark import monitoring


def _plain(all_hostvars, groups):
    return {host: all_hostvars[host] for host in groups.get("all", []) if host in all_hostvars}


def _guarded(call):
    try:
        return call()
    except ValueError as error:
        raise AnsibleFilterError(f"{error}; run playbooks/validate.yml") from None


def twinspark_monitoring_components(host, groups, all_hostvars):
    """What role monitoring installs on `host`: node_exporter, prometheus, alertmanager."""
    return monitoring.components(str(host), _plain(all_hostvars, groups), groups)


def twinspark_monitoring_address(host, all_hostvars):
    """Where `host`'s monitoring listens: monitoring_listen_address, else ansible_host."""
    return monitoring.address(str(host), all_hostvars)


def twinspark_monitoring_firewall(host, groups, all_hostvars):
    """{ports, clients_v4, clients_v6}: what `host`'s own nftables table filters for monitoring."""
    return _guarded(lambda: monitoring.firewall(str(host), _plain(all_hostvars, groups), groups))


def twinspark_prometheus_config(all_hostvars, groups, interval_s, rule_files, ca_dir, password_file=None):
    """The monitor's whole prometheus.yml as data (`password_file`: where it reads Alertmanager's password)."""
    return _guarded(lambda: monitoring.prometheus_config(_plain(all_hostvars, groups), groups, int(interval_s),
                                                         [str(f) for f in rule_files], str(ca_dir),
                                                         str(password_file) if password_file else None))


def twinspark_monitoring_ca_copies(all_hostvars, groups, ca_dir):
    """[{src, dest}]: each TLS pair's API CA, from the controller to the monitor."""
    return _guarded(lambda: monitoring.ca_copies(_plain(all_hostvars, groups), groups, str(ca_dir)))


def twinspark_monitoring_urls(all_hostvars, groups):
    """{prometheus, alertmanager}: the monitor's base URLs."""
    return monitoring.urls(_plain(all_hostvars, groups), groups)


def twinspark_silence_target(head, groups, all_hostvars):
    """{monitor, url, pair, user, password_file}: where a planned restart of `head`'s pair asks for its silence ({} without monitoring)."""
    return monitoring.silence_target(str(head), _plain(all_hostvars, groups), groups)


def twinspark_silence_request(pair, why, starts, ends, silence_id=""):
    """Alertmanager's POST /api/v2/silences body: the pair's down alerts, from `starts` to `ends` (epoch seconds)."""
    return _guarded(lambda: monitoring.silence_request(str(pair), str(why), float(starts), float(ends),
                                                        str(silence_id or "")))


def twinspark_monitoring_problems(all_hostvars, groups):
    """What stops monitoring from working on this inventory, one line each."""
    return monitoring.problems(_plain(all_hostvars, groups), groups)


def _receiver(values):
    fields = {key: str(value or "") for key, value in dict(values).items() if key != "require_tls"}
    tls = dict(values).get("require_tls", True)
    return monitoring.Receiver(**fields, require_tls=tls if isinstance(tls, bool) else
                               str(tls).strip().lower() in ("true", "yes", "1", "on"))


def twinspark_alert_receiver_problems(values):
    """One line per unusable receiver knob (monitoring_alert_webhook_url, monitoring_alert_email_*)."""
    return monitoring.receiver_problems(_receiver(values))


def twinspark_alertmanager_config(values, group_wait, group_interval, repeat_interval):
    """The whole alertmanager.yml as data, for the receiver `values` (Receiver's fields)."""
    try:
        return monitoring.alertmanager_config(_receiver(values), str(group_wait), str(group_interval),
                                              str(repeat_interval))
    except ValueError as error:
        raise AnsibleFilterError(str(error)) from None


def twinspark_monitoring_record(host, groups, all_hostvars, packages, versions):
    """The record of what monitoring runs on `host` (twinspark_layout_monitoring_record)."""
    return _guarded(lambda: monitoring.record(str(host), _plain(all_hostvars, groups), groups, packages,
                                              dict(versions)))


class FilterModule:
    def filters(self):
        return {
            "twinspark_monitoring_components": twinspark_monitoring_components,
            "twinspark_monitoring_address": twinspark_monitoring_address,
            "twinspark_monitoring_firewall": twinspark_monitoring_firewall,
            "twinspark_prometheus_config": twinspark_prometheus_config,
            "twinspark_monitoring_ca_copies": twinspark_monitoring_ca_copies,
            "twinspark_monitoring_urls": twinspark_monitoring_urls,
            "twinspark_monitoring_problems": twinspark_monitoring_problems,
            "twinspark_silence_target": twinspark_silence_target,
            "twinspark_silence_request": twinspark_silence_request,
            "twinspark_alert_receiver_problems": twinspark_alert_receiver_problems,
            "twinspark_alertmanager_config": twinspark_alertmanager_config,
            "twinspark_monitoring_record": twinspark_monitoring_record,
        }
