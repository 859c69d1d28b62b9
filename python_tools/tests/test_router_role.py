"""roles/router without a host: its command line (twinspark.fleet.router_config), its units rendered, its playbook's
syntax."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess

import jinja2
import pytest
import yaml
from nft_namespace import connections, needs_nft_namespace

from twinspark import generate, layout
from twinspark.fleet import router_client, router_config, router_launch
from twinspark.fleet import rules as fleet

ROOT = generate.repo_root()
ROLE = ROOT / "roles" / "router"


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "filter_plugins" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILTERS = load("twinspark_router")


def fleet_vars():
    host_vars = {
        "a1": {"twinspark_pair_name": "pair_a", "ansible_host": "192.0.2.11"},
        "a2": {"twinspark_pair_name": "pair_a", "ansible_host": "192.0.2.12"},
        "b1": {"twinspark_pair_name": "pair_b", "ansible_host": "192.0.2.21", "twinspark_vllm_port": 9000},
        "b2": {"twinspark_pair_name": "pair_b", "ansible_host": "192.0.2.22"},
        "r1": {"ansible_host": "192.0.2.30"},
    }
    groups = {"all": list(host_vars), "pair_a": ["a1", "a2"], "pair_b": ["b1", "b2"], "twinspark_head": ["a1", "b1"],
              "twinspark_worker": ["a2", "b2"], "twinspark_router": ["r1"]}
    return host_vars, groups


def test_worker_urls_name_every_pairs_head_api():
    host_vars, groups = fleet_vars()
    assert router_config.worker_urls(host_vars, groups, "r1") == ["http://192.0.2.11:8888", "http://192.0.2.21:9000"]


def test_worker_urls_follow_twinspark_router_pairs():
    host_vars, groups = fleet_vars()
    host_vars["r1"]["twinspark_router_pairs"] = ["pair_b"]
    assert router_config.worker_urls(host_vars, groups, "r1") == ["http://192.0.2.21:9000"]


def test_worker_urls_refuse_a_broken_fleet():
    host_vars, groups = fleet_vars()
    groups["twinspark_worker"] = ["a2"]
    with pytest.raises(ValueError, match="pair pair_b: has 0 workers"):
        router_config.worker_urls(host_vars, groups, "r1")


def test_the_one_pair_inventory_gets_one_worker_url():
    host_vars = {"h": {"ansible_host": "192.0.2.1"}, "w": {"ansible_host": "192.0.2.2"}, "r": {}}
    groups = {"all": ["h", "w", "r"], "twinspark_head": ["h"], "twinspark_worker": ["w"], "twinspark_router": ["r"]}
    assert router_config.worker_urls(host_vars, groups, "r") == ["http://192.0.2.1:8888"]


def test_flags_are_accepted_by_the_routers_own_parser():
    pytest.importorskip("vllm_router", reason="vllm-router 0.1.17 is not installed here (make setup installs it)")
    kwargs = router_launch.router_kwargs(["--worker-urls", "http://192.0.2.1:8888", *router_config.flags()],
                                         ["http://127.0.0.1:30099/"])
    assert kwargs["health_check_interval_secs"] == 1
    assert kwargs["health_failure_threshold"] == 2
    assert kwargs["api_key_validation_urls"] == ["http://127.0.0.1:30099/"]


def test_the_worker_key_is_the_routers_api_key_and_never_also_a_flag():
    pytest.importorskip("vllm_router", reason="vllm-router 0.1.17 is not installed here (make setup installs it)")
    argv = ["--worker-urls", "http://192.0.2.1:8888", *router_config.flags()]
    assert router_launch.router_kwargs(argv, ["http://127.0.0.1:30099/"])["api_key"] is None
    assert router_launch.router_kwargs(argv, ["http://127.0.0.1:30099/"], "sk-pair")["api_key"] == "sk-pair"
    with pytest.raises(ValueError, match="--api-key: give the pairs' key with --worker-key-file"):
        router_launch.router_kwargs([*argv, "--api-key", "sk-in-argv"], ["http://127.0.0.1:30099/"], "sk-pair")


def test_a_router_in_front_of_one_pair_is_not_started_with_power_of_two():
    """vllm-router refuses power_of_two with one worker at start (it exited, systemd restarted it every two seconds:
    found putting a router in front of one pair); that router gets round_robin, two pairs or more keep the default."""
    one = shlex.split(router_config.exec_start("py", "l.py", "http://127.0.0.1:1/", "0.0.0.0", 30000, 29000,
                                               ["http://192.0.2.1:8888"]))
    two = shlex.split(router_config.exec_start("py", "l.py", "http://127.0.0.1:1/", "0.0.0.0", 30000, 29000,
                                               ["http://192.0.2.1:8888", "http://192.0.2.3:8888"]))
    assert one[one.index("--policy") + 1] == "round_robin" and one.count("--policy") == 1
    assert two[two.index("--policy") + 1] == "power_of_two"
    assert router_config.policy_for("cache_aware", 1) == "cache_aware"
    pytest.importorskip("vllm_router", reason="vllm-router 0.1.17 is not installed here (make setup installs it)")
    from vllm_router.router import Router
    from vllm_router_rs import Router as RustRouter

    def start(policy: str) -> None:
        argv = ["--worker-urls", "http://127.0.0.1:9", *router_config.flags(policy)]  # never dialled: refused first
        Router(router=RustRouter(**router_launch.router_kwargs(argv, ["http://127.0.0.1:30099/"]))).start()

    with pytest.raises(ValueError, match="Power-of-two policy requires at least 2 workers"):
        start("power_of_two")


@pytest.mark.parametrize(("days", "renewed"), [(2, True), (60, False)])
def test_the_certificate_is_made_anew_before_it_expires(tmp_path, days, renewed):
    """The role's own check (its task's argv, run here): a certificate with fewer days left than
    router_tls_renew_days (30 by default) fails it, so the next task makes a new one; one with more passes."""
    from twinspark import tls

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    tasks = {task["name"]: task for task in yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())}
    read = next(task for name, task in tasks.items() if name.startswith("Read the names the admin listener's"))
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    tls.make_cert(cert, key, ["127.0.0.1"], days=days)
    (tmp_path / "names").write_text("127.0.0.1\n")
    values = {"router_tls_dir": str(tmp_path), "router_tls_cert": str(cert), "router_tls_key": str(key),
              "router_tls_renew_days": defaults["router_tls_renew_days"]}
    argv = [jinja2.Template(str(word)).render(**values) for word in read["ansible.builtin.command"]["argv"]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.stdout.splitlines()[0] == "127.0.0.1"
    assert (done.returncode != 0) is renewed, done.stdout + done.stderr
    make = next(task for name, task in tasks.items() if name.startswith("Make the admin listener's certificate"))
    due = next(task for name, task in tasks.items() if name.startswith("Decide whether the admin listener's"))
    assert "router_tls_made.rc != 0" in due["ansible.builtin.set_fact"]["router_tls_due"]
    assert make["when"] == "router_tls_due | bool"
    guard = tasks["Refuse a renewal margin as long as the certificate's life (every run would make it anew)"]
    margin = [jinja2.Environment().compile_expression(rule) for rule in guard["ansible.builtin.assert"]["that"]]
    for renew, verdict in ((30, True), (825, False), (-1, False)):
        assert all(rule(router_tls_renew_days=renew, router_tls_days=825) for rule in margin) is verdict, renew
    report = next(task for name, task in tasks.items() if name.startswith("Report that a real run makes"))
    assert report["when"] == "ansible_check_mode and router_tls_due | bool" and report["changed_when"] is True


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="router_policy"):
        router_config.flags("fastest")


def test_the_roles_policy_choices_match_router_config():
    import yaml

    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert options["router_policy"]["choices"] == list(router_config.POLICIES)
    assert options["router_policy"]["default"] == router_config.DEFAULT_POLICY
    # The ports' defaults are the layout's (twinspark_layout_router_port), which validation's clash rule reads too.
    assert "default" not in options["router_port"] and "default" not in options["router_metrics_port"]
    role_defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert role_defaults["router_port"] == "{{ twinspark_router_port | default(twinspark_layout_router_port) }}"
    assert role_defaults["router_metrics_port"] == (
        "{{ twinspark_router_metrics_port | default(twinspark_layout_router_metrics_port) }}")
    from_layout = (int(layout.default().router_port), int(layout.default().router_metrics_port))
    assert from_layout == (fleet.DEFAULT_ROUTER_PORT, fleet.DEFAULT_ROUTER_METRICS_PORT)


def render(name, **values):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), undefined=jinja2.StrictUndefined)
    env.filters["comment"] = lambda text: "# " + text
    env.filters["bool"] = lambda value: str(value).lower() in ("1", "true", "yes", "on")
    env.filters.update(FILTERS.FilterModule().filters())
    defaults = {"ansible_managed": "managed", "router_user": "twinspark-router", "router_group": "twinspark-router",
                "router_venv": "/opt/twinspark-router/venv", "router_launcher": "/opt/twinspark-router/routerlaunch.py",
                "router_keycheck_port": 30099, "router_key_file": "/etc/twinspark-router/router.key",
                "router_listen_host": "0.0.0.0", "router_port": 30000, "router_metrics_port": 29000,
                "router_policy": "power_of_two", "router_version": "0.1.17", "router_firewall_enabled": True,
                "router_firewall_file": "/etc/twinspark-router/firewall.nft", "router_firewall_ssh_ports": [22],
                "router_clients_v4": ["127.0.0.0/8", "192.0.2.0/24"], "router_clients_v6": ["::1/128"],
                "router_worker_urls": ["http://192.0.2.11:8888", "http://192.0.2.21:8888"],
                "router_startup_wait_s": 3600, "router_monitoring_ports": [], "router_upstream_port": 30001,
                "router_admin_port": 30443, "router_tls_cert": "/etc/twinspark-router/tls/cert.pem",
                "router_tls_key": "/etc/twinspark-router/tls/key.pem",
                "router_front_user": "twinspark-router-front",
                "router_admin_key_file": "/etc/twinspark-router/admin.key"}
    role_defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for key in ("router_front_max_connections", "router_front_max_per_source", "router_firewall_watcher",
                "router_firewall_watch_interval_s", "router_system_python"):
        defaults[key] = role_defaults[key]
    return env.get_template(name + ".j2").render(**{**defaults, **values})


def exec_start(unit: str) -> list[str]:
    line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line[len("ExecStart="):])


def test_the_router_unit_needs_the_key_check_and_lists_every_pair():
    unit = render("twinspark-router.service")
    argv = exec_start(unit)
    assert argv[:4] == ["/opt/twinspark-router/venv/bin/python", "-I", "/opt/twinspark-router/routerlaunch.py", "serve"]
    assert argv[argv.index("--key-check-url") + 1] == "http://127.0.0.1:30099/"
    # the key the router sends to the pairs on its proxied paths (/tokenize): read from the key file, never argv
    assert argv[argv.index("--worker-key-file") + 1] == "/etc/twinspark-router/router.key"
    assert argv.index("--worker-key-file") < argv.index("--") and "--api-key" not in argv
    urls = argv.index("--worker-urls")
    assert argv[urls + 1:urls + 3] == ["http://192.0.2.11:8888", "http://192.0.2.21:8888"]
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    # behind its front: loopback only, on its own port
    assert (argv[argv.index("--host") + 1], argv[argv.index("--port") + 1]) == ("127.0.0.1", "30001")
    assert "BindsTo=twinspark-router-keycheck.service" in unit
    assert "Wants=twinspark-router-front.service" in unit and "Upholds=twinspark-router-front.service" in unit
    assert "NoNewPrivileges=yes" in unit and "ProtectSystem=strict" in unit and "CapabilityBoundingSet=\n" in unit


def test_the_key_check_unit_is_loopback_only_and_never_holds_the_key():
    unit = render("twinspark-router-keycheck.service")
    argv = exec_start(unit)
    assert argv[:4] == ["/usr/bin/python3", "-I", "/opt/twinspark-router/routerlaunch.py", "keycheck"]
    assert argv[argv.index("--listen") + 1] == "127.0.0.1:30099"
    # client keys and the admin key: defence in depth behind the front
    assert [argv[i + 1] for i, word in enumerate(argv) if word == "--key-file"] == [
        "/etc/twinspark-router/router.key", "/etc/twinspark-router/admin.key"]
    assert "IPAddressAllow=localhost" in unit and "IPAddressDeny=any" in unit
    # its port is systemd's, never bound by the key check (issue 43, row 1)
    assert "Requires=twinspark-router-keycheck.socket" in unit and "After=twinspark-router-keycheck.socket" in unit
    socket_unit = render("twinspark-router-keycheck.socket")
    assert "ListenStream=127.0.0.1:30099\n" in socket_unit
    assert "IPAddressAllow=localhost" in socket_unit and "IPAddressDeny=any" in socket_unit


def test_the_role_never_restarts_the_key_checks_socket_with_the_router():
    """Restarting the socket would free the port for a moment; it is restarted only when its own unit changed."""
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    handlers = yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    assert role_vars["router_sockets"] == ["twinspark-router-keycheck.socket"]
    assert not set(role_vars["router_sockets"]) & set(role_vars["router_units"])
    assert all(handler.get("loop") != "{{ router_sockets }}" for handler in handlers)
    names = [task["name"] for task in tasks]
    # the key check's unit is on disk before it is stopped (a fresh host has none to stop otherwise)
    assert (names.index("Install the router units")
            < names.index("Install the key check's socket unit (systemd holds its port)")
            < names.index("Hand the key check's port to its socket unit")
            < names.index("Listen on the key check's port (systemd)") < names.index("Run the router"))


def test_the_front_listens_where_clients_connect_and_forwards_to_the_router_on_loopback():
    unit = render("twinspark-router-front.service")
    argv = exec_start(unit)
    # the system's Python, not the router's venv: the front holds both keys and imports the standard library only
    assert argv[:4] == ["/usr/bin/python3", "-I", "/opt/twinspark-router/routerlaunch.py", "front"]
    assert argv[argv.index("--listen") + 1] == "0.0.0.0:30000"
    assert argv[argv.index("--upstream") + 1] == "127.0.0.1:30001"
    assert argv[argv.index("--client-key-file") + 1] == "/etc/twinspark-router/router.key"
    assert argv[argv.index("--admin-key-file") + 1] == "/etc/twinspark-router/admin.key"
    assert "User=twinspark-router-front" in unit and "Group=twinspark-router" in unit
    # started with the router but not bound to it (a restart of the router alone leaves it listening, holding
    # requests), and never running without the firewall
    assert "BindsTo=twinspark-router.service" not in unit and "PartOf=twinspark-router.service" not in unit
    assert "Upholds=twinspark-router-front.service" in render("twinspark-router.service")
    assert "BindsTo=twinspark-router-firewall.service" in unit
    assert "twinspark-router-firewall" not in render("twinspark-router-front.service", router_firewall_enabled=False)


def test_the_front_parses_its_own_unit_line(monkeypatch):
    """The front's ExecStart, as rendered, is accepted by router_launch.py's own parser (a flag renamed on one side
    fails here)."""
    argv = exec_start(render("twinspark-router-front.service"))
    seen, tls_files = [], []

    def server_not_started(listen, upstream, *_args, **kwargs):
        seen.append(dict(listen=listen, upstream=upstream, owner=kwargs.get("upstream_owner_uid"),
                         tls=kwargs.get("tls"), admin_port=kwargs.get("admin_port"),
                         caps=(kwargs.get("max_connections"), kwargs.get("max_per_source"))))
        if len(seen) == 2:
            raise ValueError("not started in a test")
        return None

    class Account:
        pw_uid = 4711

    monkeypatch.setattr(router_launch, "front_server", server_not_started)
    monkeypatch.setattr(router_launch, "tls_server_context", lambda cert, key: tls_files.append((cert, key)) or "ctx")
    monkeypatch.setattr(router_launch, "read_keys", lambda path: [str(path)])
    monkeypatch.setattr(router_launch.pwd, "getpwnam", lambda name: Account if name == "twinspark-router" else None)
    assert router_launch.main(argv[3:]) == 2
    # the router's port is trusted only when the router's account holds it (issue 43, row 1); the client port knows
    # the admin listener's port, and the admin listener speaks TLS with the credential's key (issue 43, row 8)
    assert seen == [
        {"listen": "0.0.0.0:30000", "upstream": "127.0.0.1:30001", "owner": 4711, "tls": None, "admin_port": 30443,
         "caps": (4096, 64)},
        {"listen": "0.0.0.0:30443", "upstream": "127.0.0.1:30001", "owner": 4711, "tls": "ctx", "admin_port": None,
         "caps": (64, 8)}]
    # both listeners together, two descriptors a connection, stay within the unit's LimitNOFILE
    unit = render("twinspark-router-front.service")
    assert int(unit.split("LimitNOFILE=")[1].split()[0]) > 2 * (4096 + 64)
    assert [(str(c), str(k)) for c, k in tls_files] == [("/etc/twinspark-router/tls/cert.pem", "%d/tls-key")]
    assert "LoadCredential=tls-key:/etc/twinspark-router/tls/key.pem" in render("twinspark-router-front.service")


def test_the_front_refuses_an_upstream_owner_that_does_not_exist(tmp_path, capsys):
    (tmp_path / "client").write_text("client-key\n")
    (tmp_path / "admin").write_text("admin-key\n")
    assert router_launch.main(["front", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9",
                               "--client-key-file", str(tmp_path / "client"),
                               "--admin-key-file", str(tmp_path / "admin"),
                               "--upstream-owner", "no-such-account-here"]) == 2
    assert "--upstream-owner no-such-account-here: no such account" in capsys.readouterr().err


def test_the_routers_table_is_watched_by_the_pairs_watcher_run_alone(tmp_path, monkeypatch):
    """Issue 43, row 9 on the router host: the watcher unit runs firewall.py (copied alone) with the system Python on
    the router's table, and its rendered command line is accepted by that file's own parser."""
    from twinspark import firewall

    unit = render("twinspark-router-firewall-watch.service")
    argv = exec_start(unit)
    assert argv[:3] == ["/usr/bin/python3", "-I", "/opt/twinspark-router/firewallwatch.py"]
    assert "BindsTo=twinspark-router-firewall.service" in unit
    seen = {}
    monkeypatch.setattr(firewall, "watch", lambda file, state, interval, **kw: seen.update(
        file=file, state=str(state), interval=interval, table=kw["table"]) or 0)
    assert firewall.main(argv[3:]) == 0
    assert seen == {"file": "/etc/twinspark-router/firewall.nft", "state": "/run/twinspark-router-firewall/state.json",
                    "interval": 2.0, "table": "inet twinspark_router"}
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    copy = next(t for t in tasks if t["name"].startswith("Copy the table's watcher"))
    assert copy["ansible.builtin.copy"]["src"].endswith("/python_tools/twinspark/firewall.py")


def test_the_router_clients_local_owner_is_the_fronts_account():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["router_front_user"] == router_client.FRONT_ACCOUNT


def test_the_role_refuses_an_empty_admin_key_or_the_client_key_as_admin_key():
    import yaml

    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    check = next(t for t in tasks if t.get("name") == "Refuse to run the router without an admin key of its own")
    assert check["no_log"] is True
    assert check["ansible.builtin.assert"]["that"] == ["router_admin_key | length > 0",
                                                      "router_admin_key != router_api_key"]
    written = next(t for t in tasks if t.get("name") == "Write the admin key file")
    assert written["no_log"] is True
    assert (written["ansible.builtin.copy"]["owner"], written["ansible.builtin.copy"]["mode"]) == ("root", "0640")
    assert written["notify"] == "Restart the router"


@pytest.mark.usefixtures("ansible_playbook")
def test_the_router_playbook_passes_syntax_check(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    twinspark_router:\n      hosts:\n        r1:\n"
                         "          ansible_host: 127.0.0.1\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory),
                             "playbooks/router.yml", "--syntax-check"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_router_unit_is_bound_to_its_firewall_only_when_it_is_on():
    assert "BindsTo=twinspark-router-firewall.service" in render("twinspark-router.service")
    assert "twinspark-router-firewall" not in render("twinspark-router.service", router_firewall_enabled=False)


def test_the_firewall_table_admits_only_the_listed_networks_to_the_router_port():
    table = render("twinspark-router.nft")
    assert "elements = { 127.0.0.0/8, 192.0.2.0/24 }" in table
    assert "tcp dport { 30000, 30443 } ip saddr @clients_v4 accept" in table
    assert 'tcp dport { 30000, 30443 } counter drop comment "router: only router_allowed_networks"' in table
    assert "tcp dport { 29000, 30099, 30001 } counter drop" in table
    # its own table only: never the pair's `inet twinspark`, never a flush of the ruleset
    assert "table inet twinspark\n" not in table and "flush ruleset" not in table
    rules = table.index("tcp dport { 30000, 30443 } ip saddr")
    assert table.index('tcp dport { 22 } accept comment "SSH is never filtered here"') < rules


def test_on_the_monitor_host_the_table_admits_only_the_routers_networks_to_prometheus_and_alertmanager():
    plain = render("twinspark-router.nft")
    assert "monitoring:" not in plain
    table = render("twinspark-router.nft", router_monitoring_ports=["9090", "9093"])
    assert "tcp dport { 9090, 9093 } ip saddr @clients_v4 accept" in table
    assert 'tcp dport { 9090, 9093 } counter drop comment "monitoring: only router_allowed_networks"' in table
    assert table.index("tcp dport { 9090, 9093 } ip saddr") < table.index("tcp dport { 9090, 9093 } counter drop")


def test_locally_only_the_front_reaches_the_router_and_only_the_router_its_key_check():
    table = render("twinspark-router.nft")
    output = table[table.index("chain output"):]
    lines = [line.strip() for line in output.splitlines()]
    front = lines.index("tcp dport 30001 meta skuid twinspark-router-front accept")
    router = lines.index("tcp dport 30099 meta skuid twinspark-router accept")
    reset = next(i for i, line in enumerate(lines)
                 if line.startswith("tcp dport { 30001, 30099 } counter reject with tcp reset"))
    assert lines.index('oifname != "lo" accept') < front < reset and router < reset


@pytest.mark.parametrize("name", ["twinspark-router.service", "twinspark-router-keycheck.service",
                                  "twinspark-router-firewall.service", "twinspark-router-front.service",
                                  "twinspark-router-firewall-watch.service"])
def test_the_router_units_are_hardened_like_the_others(tmp_path, name):
    """systemd-analyze's offline exposure score, held to the ceiling the pair's helper units have (2.5)."""
    import re

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    version = subprocess.run([analyze, "--version"], capture_output=True, text=True, timeout=60).stdout
    if int(re.search(r"systemd (\d+)", version).group(1)) < 252:
        pytest.skip("systemd-analyze security --offline needs systemd 252 or later")
    unit = tmp_path / name
    unit.write_text(render(name))
    result = subprocess.run([analyze, "security", "--offline=true", str(unit)], capture_output=True, text=True,
                            timeout=120, check=False)
    score = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout + result.stderr)
    assert score is not None, result.stdout + result.stderr
    assert float(score.group(1)) <= 2.5


@pytest.mark.slow(3)
@needs_nft_namespace
def test_real_nft_only_the_front_reaches_the_router_and_only_the_router_its_key_check(tmp_path):
    """The router host's table as rendered, loaded by the real nft in a network namespace of the test's own; the
    front's account is played by `daemon`, the router's by `bin`, a stranger (a client key thief on the host) by
    `nobody`. On loopback: only daemon connects to the router's own port, only bin to the key check, and nobody
    still reaches the front's port."""
    table = tmp_path / "firewall.nft"
    table.write_text(render("twinspark-router.nft").replace("skuid twinspark-router-front ", "skuid daemon ")
                     .replace("skuid twinspark-router ", "skuid bin "))
    tries = [("front", "daemon", "daemon"), ("router", "bin", "bin"), ("stranger", "nobody", "nogroup")]
    seen = connections(table, [30000, 30001, 30099], [(f"{who}-{port}", user, group, port)
                                                      for who, user, group in tries for port in (30001, 30099, 30000)])
    refused = "ConnectionRefusedError"
    assert seen == {"front-30001": "connected", "front-30099": refused, "front-30000": "connected",
                    "router-30001": refused, "router-30099": "connected", "router-30000": "connected",
                    "stranger-30001": refused, "stranger-30099": refused, "stranger-30000": "connected"}, seen


def _router_tasks(tasks):
    """The role's tasks, blocks opened, in order."""
    for task in tasks:
        yield task
        yield from _router_tasks(task.get("block", []))


def test_the_routers_venv_gets_exactly_a_locked_wheel_set_by_sha256_and_nothing_resolved():
    """Issue 43, row 7: vllm-router and its dependencies come from the repository's lock for the host's Python and
    machine, every wheel checked against its sha256, wheels only, no dependency resolved on the host."""
    from twinspark.runtime import lock

    tasks = list(_router_tasks(yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())))
    install = next(t for t in tasks if t["name"].startswith("Install every locked wheel"))
    argv = install["ansible.builtin.command"]["argv"]
    for flag in ("'--require-hashes'", "'--only-binary', ':all:'", "'--no-deps'", "['-r', router_lock_file]"):
        assert flag in argv, flag
    assert "vllm-router==" not in argv, "a name to resolve, not the lock"
    # The lock's name the role computes from the host's `import sys, platform` line is lock.lock_name's.
    choose = next(t for t in tasks if t["name"].startswith("Choose the lock of vllm-router"))
    expression = choose["ansible.builtin.set_fact"]["router_lock"]
    for stdout, python, machine in (("311 x86_64", "3.11", "x86_64"), ("312 aarch64", "3.12", "aarch64")):
        name = jinja2.Template(expression).render(router_version="0.1.17",
                                                  router_host_python={"stdout": stdout})
        assert name == lock.lock_name("vllm-router", "0.1.17", python, machine)
    # The repository's locks: the simulated fleet's (Debian 12) and DGX OS's / Ubuntu 24.04's, each holding the
    # pinned router, every line with a sha256.
    version = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["router_version"]
    for python, machine in (("3.11", "x86_64"), ("3.12", "x86_64"), ("3.12", "aarch64")):
        wheels = lock.read(ROLE / "files" / "locks" / lock.lock_name("vllm-router", version, python, machine))
        assert ("vllm-router", version) in {(w.name, w.version) for w in wheels}
        assert all(len(w.sha256) == 64 for w in wheels) and len(wheels) > 10


def test_a_host_with_no_lock_is_refused_before_anything_is_installed():
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    names = [t["name"] for t in tasks]
    refuse = names.index("Refuse a host for which there is no lock")
    assert refuse < next(i for i, n in enumerate(names) if n.startswith("Install what the router needs"))
    assert tasks[refuse]["ansible.builtin.assert"]["that"] == "(router_lock_dir ~ '/' ~ router_lock) is file"
    assert "scripts/lock-runtime vllm-router==" in tasks[refuse]["ansible.builtin.assert"]["fail_msg"]


def test_a_failed_install_never_touches_the_venv_in_use():
    """The new venv is built beside the one in use and swapped in last, only after every wheel installed."""
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    block = next(t for t in tasks if t["name"].startswith("Install vllm-router from its lock"))["block"]
    steps = [t["name"] for t in block]
    assert steps[-1] == "Swap the new venv in" and block[-1]["notify"] == "Restart the router"
    for task in block[:-1]:
        assert "{{ router_venv }}.new" in yaml.safe_dump(task) or "router_venv ~ '.new" in yaml.safe_dump(task), task


def test_a_lock_kept_outside_the_runtimes_folder_says_how_it_is_installed(tmp_path):
    from twinspark.runtime import lock

    report = {"pip_version": "x", "environment": {"python_version": "3.11"}, "install": [{
        "requested": True, "metadata": {"name": "vllm-router", "version": "0.1.17"},
        "download_info": {"url": "https://files.example/vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl",
                          "archive_info": {"hashes": {"sha256": "a" * 64}}}}]}
    (tmp_path / "report.json").write_text(__import__("json").dumps(report))
    assert lock.main(["vllm-router==0.1.17", "--python", "3.11", "--machine", "x86_64",
                      "--report", str(tmp_path / "report.json"), "--lock-dir", str(tmp_path / "locks")]) == 0
    text = (tmp_path / "locks" / "vllm-router-0.1.17-cp311-x86_64.txt").read_text()
    assert f"--lock-dir {tmp_path / 'locks'}" in text
    assert "pip install --require-hashes --only-binary :all: --no-deps -r THIS_FILE" in text
    assert "vllm_runtime role" not in text
