"""twinspark.monitoring: who monitors, what Prometheus scrapes, who may reach the ports, the receiver, and
`twinspark monitor scrape-config`. Plain data, and the repository's inventories read with Ansible's own API (their
hosts are never contacted)."""

from __future__ import annotations

import json

import pytest
import yaml

from twinspark import cli, generate, inventory, layout, monitoring

ROOT = generate.repo_root()


def read(name: str):
    return inventory.read_hosts(ROOT / "inventory" / name)


def one_pair(**head_vars) -> tuple[dict, dict]:
    host_vars = {"h": {"ansible_host": "192.0.2.1", "vllm_service_api_allowed_networks": ["192.0.2.0/24"],
                       **head_vars},
                 "w": {"ansible_host": "192.0.2.2", "vllm_service_api_allowed_networks": ["192.0.2.0/24"]}}
    groups = {"all": ["h", "w"], "twinspark_head": ["h"], "twinspark_worker": ["w"], "twinspark_pair": ["h", "w"]}
    return host_vars, groups


def test_the_monitor_is_the_first_heads_unless_the_inventory_names_one():
    assert monitoring.monitor_host(*read("sim")) == "node1"
    assert monitoring.monitor_host(*read("sim-fleet")) == "node5"
    assert monitoring.monitor_host(*read("fleet-example")) == "router-1"
    host_vars, groups = one_pair()
    assert monitoring.components("h", host_vars, groups) == ["node_exporter", "prometheus", "alertmanager"]
    assert monitoring.components("w", host_vars, groups) == ["node_exporter"]


def test_the_pair_label_is_the_layouts_pair_id_or_a_fleets_pair_name():
    host_vars, groups = one_pair()
    jobs = monitoring.scrape_configs(host_vars, groups)
    labels = {job["job_name"]: job["static_configs"][0]["labels"] for job in jobs}
    assert labels["vllm"] == {"pair": layout.default().pair_id, "node": "h", "rank_role": "head"}
    host_vars["h"]["twinspark_layout_pair_id"] = "lab-7"
    assert monitoring.scrape_configs(host_vars, groups)[0]["static_configs"][0]["labels"]["pair"] == "lab-7"
    fleet_jobs = monitoring.scrape_configs(*read("sim-fleet"))
    assert [c["labels"]["pair"] for c in fleet_jobs[0]["static_configs"]] == ["pair_a", "pair_b"]


def test_a_tls_head_is_scraped_over_https_against_its_ca(tmp_path):
    host_vars, groups = one_pair(twinspark_vllm_tls_cert="/ctl/pair.crt", twinspark_vllm_tls_ca="/ctl/ca.pem")
    vllm = monitoring.scrape_configs(host_vars, groups, "h", "/etc/prometheus/twinspark")[0]
    assert vllm["scheme"] == "https"
    assert vllm["tls_config"] == {"ca_file": "/etc/prometheus/twinspark/pair1-api-ca.pem"}
    assert monitoring.ca_copies(host_vars, groups, "/d") == [{"src": "/ctl/ca.pem", "dest": "/d/pair1-api-ca.pem"}]
    # for an existing Prometheus the snippet names the controller's copy, which the operator has
    assert monitoring.scrape_configs(host_vars, groups)[0]["tls_config"] == {"ca_file": "/ctl/ca.pem"}


def test_pairs_that_differ_in_tls_get_a_job_each_all_labelled_job_vllm():
    host_vars, groups = read("sim-fleet")
    host_vars["node3"] = {**host_vars["node3"], "twinspark_vllm_tls_cert": "/ctl/b.crt"}
    jobs = [job for job in monitoring.scrape_configs(host_vars, groups) if job["job_name"].startswith("vllm")]
    assert [job["job_name"] for job in jobs] == ["vllm-pair_a", "vllm-pair_b"]
    assert all(static["labels"]["job"] == "vllm" for job in jobs for static in job["static_configs"])
    assert "scheme" not in jobs[0] and jobs[1]["scheme"] == "https"


def test_a_monitor_known_by_name_is_dialled_by_name_and_left_to_the_listed_networks():
    host_vars, groups = one_pair()
    host_vars["h"]["ansible_host"] = "spark-a.lan"
    assert monitoring.scrape_configs(host_vars, groups)[1]["static_configs"][0]["targets"] == ["spark-a.lan:9100"]
    assert monitoring.firewall("w", host_vars, groups)["clients_v4"] == ["127.0.0.0/8", "192.0.2.0/24"]
    host_vars["h"]["monitoring_listen_address"] = "192.0.2.1"
    assert monitoring.address("h", host_vars) == "192.0.2.1"


def test_the_exporters_admit_the_monitor_without_overlapping_the_listed_networks():
    host_vars, groups = one_pair()
    assert monitoring.firewall("w", host_vars, groups)["clients_v4"] == ["127.0.0.0/8", "192.0.2.0/24"]
    host_vars["w"]["monitoring_allowed_networks"] = ["198.51.100.0/24", "2001:db8::/64"]
    assert monitoring.firewall("w", host_vars, groups) == {
        "ports": ["9100"], "clients_v4": ["127.0.0.0/8", "198.51.100.0/24", "192.0.2.1/32"],
        "clients_v6": ["::1/128", "2001:db8::/64"]}
    assert monitoring.firewall("h", host_vars, groups)["ports"] == ["9100", "9090", "9093"]
    router = monitoring.firewall("node5", *read("sim-fleet"))
    assert router == {"ports": ["9090", "9093"], "clients_v4": ["127.0.0.0/8", "10.78.0.0/24"],
                      "clients_v6": ["::1/128"]}


def test_the_inventorys_problems_name_the_variable_and_the_fix():
    host_vars, groups = one_pair()
    assert monitoring.problems(host_vars, groups) == []
    groups["twinspark_monitor"] = ["m", "n"]
    host_vars["m"] = {"ansible_host": "203.0.113.9"}
    lines = monitoring.problems(host_vars, groups)
    assert len(lines) == 2
    assert any("group twinspark_monitor has 2 hosts (m, n)" in line for line in lines)
    assert any("203.0.113.9 is not in vllm_service_api_allowed_networks of pair twinspark_pair" in line
               for line in lines)
    host_vars["m"]["monitoring_enabled"] = False
    assert monitoring.problems(host_vars, groups) == []


def test_alertmanager_routes_to_the_webhook_and_the_mail_and_refuses_half_a_receiver():
    receiver = monitoring.Receiver(webhook_url="http://10.78.0.254:9099/alerts", email_to="ops@example.org",
                                   email_from="pair@example.org", smarthost="smtp.example.org:587",
                                   auth_username="pair", password_file="/run/credentials/x/smtp-password")
    config = monitoring.alertmanager_config(receiver, "10s", "1m", "4h")
    assert config["global"]["smtp_auth_password_file"] == "/run/credentials/x/smtp-password"
    assert config["receivers"][0]["webhook_configs"] == [{"url": "http://10.78.0.254:9099/alerts",
                                                          "send_resolved": True}]
    assert monitoring.alertmanager_config(monitoring.Receiver(), "10s", "1m", "4h")["receivers"] == [
        {"name": "twinspark"}]
    half = monitoring.receiver_problems(monitoring.Receiver(email_to="ops@example.org", webhook_url="ftp://x"))
    assert any(line.startswith("monitoring_alert_webhook_url must be an http:// or https:// URL") for line in half)
    assert any("monitoring_alert_email_from, monitoring_alert_email_smarthost is empty" in line for line in half)
    with pytest.raises(ValueError, match="monitoring_alertmanager_group_wait must be a duration"):
        monitoring.alertmanager_config(monitoring.Receiver(), "soon", "1m", "4h")


def test_upstream_versions():
    assert [monitoring.upstream_version(v) for v in ("2.42.0+ds-5+deb12u1", "0.25.0-1+b4", "1:1.7.0-1", "")] == [
        "2.42.0", "0.25.0", "1.7.0", ""]


def test_scrape_config_prints_the_jobs_from_an_inventory(capsys):
    assert cli.main(["monitor", "scrape-config", "-i", str(ROOT / "inventory" / "sim")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# TwinSpark's scrape jobs")
    jobs = yaml.safe_load(printed)["scrape_configs"]
    assert [job["job_name"] for job in jobs] == ["vllm", "node"]
    assert jobs[1]["static_configs"][1] == {"targets": ["10.78.0.2:9100"],
                                            "labels": {"pair": "pair1", "node": "node2", "rank_role": "worker"}}


def test_scrape_config_on_a_node_prints_its_record_and_names_a_bad_one(tmp_path, capsys):
    jobs = monitoring.scrape_configs(*read("sim"))
    record = tmp_path / "monitoring.json"
    record.write_text(json.dumps({"schema": monitoring.RECORD_SCHEMA, "scrape_configs": jobs}))
    assert cli.main(["monitor", "scrape-config", "--record", str(record), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == jobs
    record.write_text("{")
    assert cli.main(["monitor", "scrape-config", "--record", str(record)]) == 2
    assert f"{record}: not JSON" in capsys.readouterr().err


def test_a_planned_restart_silences_its_own_pairs_down_alerts_at_the_monitor():
    host_vars, groups = one_pair(twinspark_layout_pair_id="lab-7")
    # Alertmanager answers on the monitor's loopback only, with basic auth (issue 43, row 10): the request runs
    # there, with the password from the root-only file.
    assert monitoring.silence_target("h", host_vars, groups) == {
        "monitor": "h", "url": "http://127.0.0.1:" + str(layout.default().alertmanager_port), "pair": "lab-7",
        "user": "twinspark", "password_file": "/etc/prometheus/twinspark/alertmanager-password"}
    assert monitoring.silence_target("w", host_vars, groups) == {}  # a worker heads no pair
    host_vars["h"]["monitoring_enabled"] = False
    assert monitoring.silence_target("h", host_vars, groups) == {}
    fleet_vars, fleet_groups = read("sim-fleet")
    second = [h for h in fleet_groups["twinspark_head"] if h != fleet_groups["twinspark_head"][0]][0]
    target = monitoring.silence_target(second, fleet_vars, fleet_groups)
    assert (target["monitor"], target["pair"]) == ("node5", "pair_b")

    body = monitoring.silence_request("lab-7", "recipe switch", 1_800_000_000, 1_800_000_600)
    assert body["startsAt"] == "2027-01-15T08:00:00.000Z" and body["endsAt"] == "2027-01-15T08:10:00.000Z"
    matchers = {m["name"]: m for m in body["matchers"]}
    assert matchers["pair"] == {"name": "pair", "value": "lab-7", "isRegex": False, "isEqual": True}
    assert matchers["alertname"]["isRegex"] and set(matchers["alertname"]["value"].split("|")) == {
        "TwinSparkPairDown", "TwinSparkTargetDown"}
    assert "id" not in body and body["comment"] == "planned restart: recipe switch"
    assert monitoring.silence_request("lab-7", "x", 1, 2, "abc")["id"] == "abc"
    with pytest.raises(ValueError, match="must end after it starts"):
        monitoring.silence_request("lab-7", "x", 5, 5)
