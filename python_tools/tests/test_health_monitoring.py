"""`twinspark health` reports what role monitoring runs on each node: its record (components, package versions,
the monitor's URLs) and each component's unit as systemd has it now. A node without a record gets no row."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from twinspark import monitoring
from twinspark.health import checks, gather, report

# The record role monitoring writes on the simulated pair's head (roles/monitoring/tasks/record.yml), with Debian
# 12's package versions.
HEAD_RECORD = {
    "schema": monitoring.RECORD_SCHEMA, "node": "node1",
    "components": [
        {"component": "node_exporter", "name": "node exporter", "package": "prometheus-node-exporter",
         "version": "1.5.0-1+b6", "unit": "prometheus-node-exporter.service", "url": "http://10.78.0.1:9100/metrics",
         "summary": "node exporter 1.5.0"},
        {"component": "prometheus", "name": "Prometheus", "package": "prometheus", "version": "2.42.0+ds-5+deb12u1",
         "unit": "prometheus.service", "url": "http://10.78.0.1:9090", "summary": "Prometheus 2.42.0"},
        {"component": "alertmanager", "name": "Alertmanager", "package": "prometheus-alertmanager",
         "version": "0.25.0-1+b4", "unit": "prometheus-alertmanager.service", "url": "http://10.78.0.1:9093",
         "summary": "Alertmanager 0.25.0"},
    ],
    "monitor": {"prometheus": "http://10.78.0.1:9090", "alertmanager": "http://10.78.0.1:9093"},
    "scrape_configs": [],
}


def systemctl(states: dict[str, str]):
    """A stand-in for `systemctl show UNIT --property=...`: the ActiveState of each unit from `states`."""
    def run(argv):
        unit = argv[2]
        return subprocess.CompletedProcess(argv, 0, f"LoadState=loaded\nActiveState={states.get(unit, 'inactive')}\n"
                                           "SubState=running\n", "")
    return run


def write(tmp_path: Path, record: object) -> Path:
    path = tmp_path / "monitoring.json"
    path.write_text(json.dumps(record))
    return path


def test_the_head_names_versions_and_the_monitors_urls(tmp_path):
    units = {c["unit"]: "active" for c in HEAD_RECORD["components"]}
    facts = gather.read_monitoring(systemctl(units), write(tmp_path, HEAD_RECORD))
    result = checks.check_monitoring("node1", facts)
    assert result.status == checks.OK
    assert result.message == ("node exporter 1.5.0, Prometheus 2.42.0, Alertmanager 0.25.0 running; "
                              "Prometheus http://10.78.0.1:9090, Alertmanager http://10.78.0.1:9093")
    assert "monitoring" in report.table([result])


def test_a_component_that_does_not_run_is_degraded_naming_its_unit_and_the_journal(tmp_path):
    units = {"prometheus-node-exporter.service": "active", "prometheus.service": "failed",
             "prometheus-alertmanager.service": "active"}
    result = checks.check_monitoring("node1", gather.read_monitoring(systemctl(units), write(tmp_path, HEAD_RECORD)))
    assert result.status == checks.DEGRADED
    assert result.message.startswith("not running: Prometheus (prometheus.service) failed;")
    assert result.fix.startswith("see why with journalctl -u prometheus -n 40")


def test_no_record_no_row_and_a_broken_record_is_named(tmp_path):
    assert gather.read_monitoring(systemctl({}), tmp_path / "absent.json") is None
    facts = {"unit": {}, "processes": {}, "monitoring": None}
    assert "monitoring" not in [r.check for r in checks.node_checks("node2", facts)]
    broken = gather.read_monitoring(systemctl({}), write(tmp_path, {"schema": 99}))
    result = checks.check_monitoring("node2", broken)
    assert result.status == checks.DEGRADED and "not a monitoring record" in result.message
    assert [r.check for r in checks.node_checks("node2", {**facts, "monitoring": broken})][-1] == "monitoring"
