"""Role monitoring's files as the role renders them, and checked by the tools the packages ship.

The simulated pair's and fleet's inventories are copied and moved onto loopback (10.78.0.N becomes 127.0.78.N,
10.77.0.N 127.0.77.N), every host with connection local; tests/playbooks/monitoring_render.yml renders the role's
templates, its record and each host's firewall openings with stand-ins of the roles (their defaults, vars and
templates; a task list that only renders). Nothing is sent anywhere. Then Prometheus' configuration goes through
`promtool check config` (with the rendered rules) and Alertmanager's through `amtool check-config`: promtool comes
with Debian's `prometheus` package (`make setup`), so its check is skipped only where it is missing and CI is not
set; amtool likewise (prometheus-alertmanager, also installed by `make setup`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from twinspark import generate, layout, monitoring

ROOT = generate.repo_root()
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
STAND_IN_TASKS = """\
- name: Render every template of the role
  ansible.builtin.set_fact:
    render_files: >-
      {{ render_files | default({}) | combine({item | basename | regex_replace('[.]j2$', ''):
         lookup('ansible.builtin.template', item)}) }}
  loop: "{{ query('ansible.builtin.fileglob', role_path ~ '/templates/*.j2') }}"

- name: Add the record and the firewall openings
  ansible.builtin.set_fact:
    render_files: >-
      {{ render_files | combine({'record.json': monitoring_record | to_json,
         'firewall.json': inventory_hostname | twinspark_monitoring_firewall(groups, hostvars) | to_json}) }}
"""
ON_LOOPBACK = {"10.78.0.": "127.0.78.", "10.77.0.": "127.0.77."}
PASSWORD = "stand-in-smtp-password-never-shown"

# Every test here reads what a playbook run rendered (module fixtures): the fixture marks them slow, skips without it.
pytestmark = pytest.mark.usefixtures("ansible_playbook")


def _on_loopback(inventory: str, where: Path) -> Path:
    """A copy of inventory/<inventory> (its group_vars followed), every address moved onto loopback."""
    copy = where / "inventory"
    shutil.copytree(ROOT / "inventory" / inventory, copy, symlinks=False)
    for path in copy.rglob("*.yml"):
        text = path.read_text()
        for real, stand_in in ON_LOOPBACK.items():
            text = text.replace(real, stand_in)
        path.write_text(text)
    (copy / "group_vars" / "all" / "zz_render_locally.yml").write_text(yaml.safe_dump(
        {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}))
    return copy


def render(tmp_path: Path, inventory: str, **extra: object) -> dict[str, dict[str, str]]:
    """host -> {file name: text}: every template of role monitoring, record.json and firewall.json."""
    roles = tmp_path / "roles"
    for role, parts in (("twinspark_layout", ("defaults", "vars")), ("monitoring", ("defaults", "vars", "templates",
                                                                                   "files"))):
        (roles / role / "tasks").mkdir(parents=True)
        for part in parts:
            (roles / role / part).symlink_to(ROOT / "roles" / role / part)
        (roles / role / "tasks" / "main.yml").write_text(STAND_IN_TASKS if role == "monitoring" else "[]\n")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_ROLES_PATH": str(roles)}
    done = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(_on_loopback(inventory, tmp_path)),
         str(ROOT / "python_tools" / "tests" / "playbooks" / "monitoring_render.yml"),
         "-e", json.dumps({"render_out": str(out), **extra})],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return json.loads((out / "rendered.json").read_text())


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> dict[str, dict[str, str]]:
    return render(tmp_path_factory.mktemp("sim"), "sim")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> dict[str, dict[str, str]]:
    return render(tmp_path_factory.mktemp("fleet"), "sim-fleet")


def _jobs(config_text: str) -> dict[str, list[dict]]:
    config = yaml.safe_load(config_text)
    return {job["job_name"]: job["static_configs"] for job in config["scrape_configs"]}


def _exec_start(dropin: str) -> str:
    return [line for line in dropin.splitlines() if line.startswith("ExecStart=")][-1]


def test_the_head_scrapes_every_target_of_the_contract_with_its_labels(sim):
    config = yaml.safe_load(sim["node1"]["prometheus.yml"])
    assert config["global"] == {"scrape_interval": "5s", "scrape_timeout": "5s", "evaluation_interval": "5s"}
    jobs = _jobs(sim["node1"]["prometheus.yml"])
    assert list(jobs) == ["vllm", "node", "prometheus", "alertmanager"]
    head = {"pair": "pair1", "node": "node1", "rank_role": "head"}
    assert jobs["vllm"] == [{"targets": ["127.0.78.1:8888"], "labels": head}]
    assert jobs["node"] == [{"targets": ["127.0.78.1:9100"], "labels": head},
                            {"targets": ["127.0.78.2:9100"],
                             "labels": {"pair": "pair1", "node": "node2", "rank_role": "worker"}}]
    assert jobs["prometheus"][0]["targets"] == ["127.0.78.1:9090"]
    # Alertmanager: on the monitor's loopback only, with basic auth (issue 43, row 10), for alerts and its scrape.
    credential = "/run/credentials/prometheus.service/alertmanager-password"
    auth = {"username": "twinspark", "password_file": credential}
    assert config["alerting"]["alertmanagers"] == [{"static_configs": [{"targets": ["127.0.0.1:9093"]}],
                                                    "basic_auth": auth}]
    assert jobs["alertmanager"][0]["targets"] == ["127.0.0.1:9093"]
    assert [job for job in config["scrape_configs"] if job["job_name"] == "alertmanager"][0]["basic_auth"] == auth
    assert "basic_auth" not in [job for job in config["scrape_configs"] if job["job_name"] == "prometheus"][0]
    assert config["rule_files"] == ["/etc/prometheus/twinspark/twinspark.rules.yml"]


def test_each_component_binds_the_management_address_and_the_exporter_reads_the_textfiles(sim):
    assert "--web.listen-address=127.0.78.1:9090 " in _exec_start(sim["node1"]["prometheus.service.conf"])
    alertmanager = _exec_start(sim["node1"]["prometheus-alertmanager.service.conf"])
    assert "--web.listen-address=127.0.0.1:9093 " in alertmanager  # loopback only
    assert " --web.config.file=/etc/prometheus/twinspark/alertmanager-web.yml " in alertmanager  # basic auth
    assert " --web.external-url=http://127.0.0.1:9093/ " in alertmanager
    # Prometheus reads Alertmanager's password as a credential: the file itself stays root-only.
    assert ("\nLoadCredential=alertmanager-password:/etc/prometheus/twinspark/alertmanager-password\n"
            in sim["node1"]["prometheus.service.conf"])
    assert monitoring.ALERTMANAGER_PASSWORD_FILE == "/etc/prometheus/twinspark/alertmanager-password"
    assert alertmanager.endswith(" --cluster.listen-address=")  # no gossip port: one Alertmanager
    exporter = _exec_start(sim["node2"]["prometheus-node-exporter.service.conf"])
    assert "--web.listen-address=127.0.78.2:9100 " in exporter
    assert exporter.endswith(f"--collector.textfile.directory={layout.default().metrics_dir}")
    # each drop-in replaces the package's command (an empty ExecStart= first) and reads no /etc/default file
    for name in ("prometheus.service.conf", "prometheus-alertmanager.service.conf",
                 "prometheus-node-exporter.service.conf"):
        assert "\nExecStart=\nExecStart=/usr/bin/" in sim["node1"][name]
        assert "\nEnvironmentFile=\n" in sim["node1"][name]


def test_every_drop_in_line_is_a_section_a_comment_or_one_directive(sim):
    """systemd has no comment after a value: a comment joined onto a line (the shared sandbox's last line, as
    Ansible's trim_blocks once did after the include) turns that directive into an invalid one, which systemd drops
    (its SystemCallErrorNumber=EPERM gone, the filter killed all three with SIGSYS on the simulated pair)."""
    import re

    directive = re.compile(r"^[A-Z][A-Za-z]+=[^#]*$")
    for name in ("prometheus.service.conf", "prometheus-alertmanager.service.conf",
                 "prometheus-node-exporter.service.conf"):
        lines = sim["node1"][name].splitlines()
        odd = [line for line in lines if line and not line.startswith("#") and line != "[Service]"
               and not directive.match(line)]
        assert not odd, f"{name}: {odd}"
        assert "SystemCallErrorNumber=EPERM" in lines, name


def test_the_worker_lets_the_monitor_reach_only_its_exporter_and_the_head_its_three_ports(sim):
    worker = json.loads(sim["node2"]["firewall.json"])
    head = json.loads(sim["node1"]["firewall.json"])
    assert worker == {"ports": ["9100"], "clients_v4": ["127.0.0.0/8", "127.0.78.0/24"], "clients_v6": ["::1/128"]}
    assert head["ports"] == ["9100", "9090", "9093"]


def test_alertmanager_sends_to_the_harness_receiver_with_resolutions(sim):
    config = yaml.safe_load(sim["node1"]["alertmanager.yml"])
    assert config["receivers"] == [{"name": "twinspark", "webhook_configs": [
        {"url": "http://127.0.78.254:9099/alerts", "send_resolved": True}]}]
    assert config["route"]["group_by"] == ["alertname", "pair"]
    assert (config["route"]["group_wait"], config["route"]["group_interval"]) == ("5s", "15s")


def test_the_record_names_versions_units_and_urls(sim):
    head = json.loads(sim["node1"]["record.json"])
    worker = json.loads(sim["node2"]["record.json"])
    assert [c["summary"] for c in head["components"]] == ["node exporter 1.5.0", "Prometheus 2.42.0",
                                                          "Alertmanager 0.25.0"]
    assert [c["unit"] for c in worker["components"]] == ["prometheus-node-exporter.service"]
    assert worker["components"][0]["url"] == "http://127.0.78.2:9100/metrics"
    assert worker["monitor"] == {"prometheus": "http://127.0.78.1:9090", "alertmanager": "http://127.0.0.1:9093"}
    assert [job["job_name"] for job in worker["scrape_configs"]] == ["vllm", "node"]


def _promtool_or_skip() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing under CI=true; install Debian's prometheus package (make setup)")
        pytest.skip("promtool is not installed here (make setup installs it)")
    return found


def test_promtool_accepts_the_rendered_configuration_and_rules(sim, tmp_path):
    promtool = _promtool_or_skip()
    rules = tmp_path / "twinspark.rules.yml"
    rules.write_text(sim["node1"]["twinspark.rules.yml"])
    config = yaml.safe_load(sim["node1"]["prometheus.yml"])
    config["rule_files"] = [str(rules)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout + done.stderr


def test_amtool_accepts_the_rendered_alertmanager_configuration(sim, tmp_path):
    amtool = shutil.which("amtool")
    if amtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("amtool is not installed and CI=true: make setup installs it (prometheus-alertmanager)")
        pytest.skip("amtool is not installed here (Debian's prometheus-alertmanager package ships it; make setup)")
    path = tmp_path / "alertmanager.yml"
    path.write_text(sim["node1"]["alertmanager.yml"])
    done = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_on_the_fleet_the_router_node_monitors_both_pairs_and_the_router(fleet):
    jobs = _jobs(fleet["node5"]["prometheus.yml"])
    assert list(jobs) == ["vllm", "node", "router", "prometheus", "alertmanager"]
    assert [(c["targets"][0], c["labels"]["pair"]) for c in jobs["vllm"]] == [("127.0.78.1:8888", "pair_a"),
                                                                              ("127.0.78.3:8888", "pair_b")]
    assert len(jobs["node"]) == 4
    assert jobs["router"] == [{"targets": ["127.0.0.1:29000"], "labels": {"node": "node5"}}]
    assert jobs["prometheus"] == [{"targets": ["127.0.78.5:9090"], "labels": {"node": "node5"}}]
    router = json.loads(fleet["node5"]["record.json"])
    assert [c["component"] for c in router["components"]] == ["prometheus", "alertmanager"]
    assert json.loads(fleet["node5"]["firewall.json"])["ports"] == ["9090", "9093"]
    assert [c["component"] for c in json.loads(fleet["node1"]["record.json"])["components"]] == ["node_exporter"]


@pytest.mark.usefixtures("ansible_playbook")
def test_an_smtp_password_reaches_alertmanager_as_a_credential_and_no_rendered_file(tmp_path):
    rendered = render(tmp_path, "sim", monitoring_alert_email_to="ops@example.org",
                      monitoring_alert_email_from="pair@example.org",
                      monitoring_alert_email_smarthost="smtp.example.org:587",
                      monitoring_alert_email_auth_username="pair", monitoring_alert_email_auth_password=PASSWORD)
    head = rendered["node1"]
    config = yaml.safe_load(head["alertmanager.yml"])
    credential = "/run/credentials/prometheus-alertmanager.service/smtp-password"
    assert config["global"]["smtp_auth_password_file"] == credential
    assert config["receivers"][0]["email_configs"] == [{"to": "ops@example.org", "send_resolved": True}]
    assert "LoadCredential=smtp-password:/etc/prometheus/twinspark/smtp-password\n" in head[
        "prometheus-alertmanager.service.conf"]
    assert not [name for name, text in head.items() if PASSWORD in text]
