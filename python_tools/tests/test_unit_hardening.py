"""The systemd units and the firewall table as the roles render them (scripts/render-units, on this machine only).

Rendered with the simulated pair's values (cpu profile) and the example inventory's (gb10), then measured with
`systemd-analyze security --offline=true` where this machine's systemd has it (252 or later).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from nft_namespace import connections, needs_nft_namespace
from test_serve_env_role import inventory_vars, load_filters

from twinspark import generate, layout, settings
from twinspark.runtime import sandbox

ROOT = generate.repo_root()
# Every test here reads the units scripts/render-units renders (an ansible-playbook run, about 15 s on 2 cores, once
# per module): slow, so that the quick round (-m "not slow") does not pay for it unseen.
pytestmark = pytest.mark.slow(3)
# Exposure ceilings from issue 15 (systemd-analyze's 0-10 scale, lower is better).
CEILINGS = {"twinspark-vllm.service": 3.0, "twinspark-pair-guard.service": 2.5, "twinspark-health.service": 2.5,
            "twinspark-firewall.service": 2.5, "twinspark-firewall-watch.service": 2.5,
            # role monitoring's drop-ins for the distribution's units, each scored over an empty stand-in of its unit
            "prometheus.service.conf": 2.5, "prometheus-alertmanager.service.conf": 2.5,
            "prometheus-node-exporter.service.conf": 2.5}


def _render(inventory: str, out: Path) -> dict[tuple[str, str], str]:
    result = subprocess.run([str(ROOT / "scripts" / "render-units"), str(ROOT / "inventory" / inventory), str(out)],
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    scores = {}
    for line in result.stdout.splitlines():
        if not line.startswith("#"):
            host, unit, *score = line.split()
            scores[(host, unit)] = " ".join(score)
    return scores


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    out = {}
    for profile, inventory in (("cpu", "sim"), ("gb10", "example")):
        where = tmp_path_factory.mktemp(profile)
        out[profile] = (where, _render(inventory, where))
    return out


def _unit(rendered, profile: str, rank: int, name: str) -> str:
    where, _ = rendered[profile]
    hosts = sorted(p.name for p in where.iterdir() if p.is_dir())
    return (where / hosts[rank] / name).read_text()


@pytest.mark.slow(7)
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_every_unit_is_within_its_exposure_ceiling(rendered, profile):
    _, scores = rendered[profile]
    if all(score in ("", "n/a") for score in scores.values()):
        pytest.skip("this systemd-analyze has no --offline")
    assert len(scores) == 16  # five units and three drop-ins, on both nodes
    for (host, unit), score in scores.items():
        assert float(score.split()[0]) <= CEILINGS[unit], f"{host} {unit}: {score}"


@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_vllm_unit_keys_sys_path_and_firewall(rendered, profile):
    head, worker = (_unit(rendered, profile, rank, "twinspark-vllm.service") for rank in (0, 1))
    for unit in (head, worker):
        exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
        assert " -I -m twinspark.cli serve " in exec_start
        assert "--api-key" not in exec_start
        assert re.search(r"^BindsTo=twinspark-firewall\.service$", unit, re.M)
        assert re.search(r"^Requires=twinspark-firewall\.service$", unit, re.M)
        assert re.search(r"^WorkingDirectory=/opt/twinspark$", unit, re.M)
        assert re.findall(r"^ReadWritePaths=(.*)$", unit, re.M) == ["/var/lib/twinspark/cache"]
        assert "StateDirectory=" not in unit
    # The head's rank holds one capability, to listen on the API port the head makes privileged (issue 43 row 2);
    # the worker's rank, which serves no API, holds none.
    capabilities = r"^(?:CapabilityBoundingSet|AmbientCapabilities)=(.*)$"
    assert re.findall(capabilities, head, re.M) == ["CAP_NET_BIND_SERVICE"] * 2
    assert re.findall(capabilities, worker, re.M) == ["", ""]
    assert "LoadCredential=secrets.env:" in head and "%d/secrets.env" in head
    assert "LoadCredential" not in worker and "secrets.env" not in re.search(r"^ExecStart=.*$", worker, re.M).group(0)


def test_gb10_unit_allows_the_gpu_and_rdma_device_groups_and_says_why_exposures_stay(rendered):
    unit = _unit(rendered, "gb10", 0, "twinspark-vllm.service")
    allowed = re.findall(r"^DeviceAllow=(\S+) rw$", unit, re.M)
    assert {"char-nvidia-frontend", "char-nvidiactl", "char-nvidia-uvm", "char-infiniband_verbs"} <= set(allowed)
    assert all(name.startswith("char-") for name in allowed), "paths do not glob: device groups only"
    assert re.search(r"^DevicePolicy=closed$", unit, re.M)
    assert "PrivateDevices=yes" not in unit
    # device nodes made outside the sandbox, before the rank (the setuid helper cannot run inside it)
    assert re.search(r"^ExecStartPre=-\+/usr/bin/nvidia-modprobe -u -c=0$", unit, re.M)
    assert "ExecStartPre" not in _unit(rendered, "cpu", 0, "twinspark-vllm.service")
    for kept in ("MemoryDenyWriteExecute=no", "PrivateNetwork=no", "PrivateUsers=no", "@resources"):
        assert re.search(rf"^# Kept: .*{re.escape(kept)}", unit, re.M), kept


def test_guard_and_health_hold_no_capability_and_health_is_unprivileged(rendered):
    guard = _unit(rendered, "cpu", 0, "twinspark-pair-guard.service")
    health = _unit(rendered, "cpu", 0, "twinspark-health.service")
    firewall = _unit(rendered, "cpu", 0, "twinspark-firewall.service")
    assert re.search(r"^CapabilityBoundingSet=$", guard, re.M)
    assert re.search(r"^CapabilityBoundingSet=$", health, re.M)
    assert re.search(r"^User=twinspark$", health, re.M)
    assert re.search(r"^CapabilityBoundingSet=CAP_NET_ADMIN$", firewall, re.M)


@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_firewall_takes_the_peer_only_over_the_fabric_interface(rendered, profile):
    table = _unit(rendered, profile, 0, "twinspark.nft")
    peer = re.search(r"^\s*iifname \{ (.+) \} ip saddr (\S+) accept", table, re.M)
    assert peer, table
    assert peer.group(1) == ('"ic0"' if profile == "cpu" else '"enp1s0f0np0"')
    if profile == "cpu":  # the inventory's own value, not the role default (rendered with the inventory's precedence)
        assert re.search(r"elements = \{ 127\.0\.0\.0/8, 10\.78\.0\.0/24 \}", table), table
    internal = re.search(r"^\s*tcp dport \{ (.+) \} counter drop comment \"rendezvous", table, re.M).group(1)
    assert internal.split(", ") == ["25000", "32768-60999"]


def test_the_model_copy_key_runs_rrsync_rooted_at_the_model_copy(rendered):
    forced = _unit(rendered, "cpu", 1, "twinspark-model-receive")
    assert "/usr/bin/rrsync -wo -no-del -munge /var/lib/twinspark/models/tiny-llama\n" in forced
    assert "find /var/lib/twinspark/models/tiny-llama -xdev ! -type l -perm /6000 -exec chmod ug-s {} +" in forced
    hub = _unit(rendered, "gb10", 1, "twinspark-model-receive")
    assert re.search(r"^/usr/bin/rrsync -wo -no-del /var/lib/twinspark/hf/hub/models--\S+$", hub, re.M), hub


@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_a_stopped_rank_kicks_the_head_guard_over_loopback_or_the_fabric(rendered, profile):
    head_fabric = {"cpu": "10.77.0.1", "gb10": None}[profile]
    socket_unit = _unit(rendered, profile, 0, "twinspark-pair-guard-kick.socket")
    listens = re.findall(r"^ListenDatagram=(\S+)$", socket_unit, re.M)
    assert len(listens) == 2 and listens[0] == "127.0.0.1:25001", listens  # MASTER_PORT 25000 + 1
    if head_fabric:
        assert listens[1] == f"{head_fabric}:25001"
    assert re.search(r"^Service=twinspark-pair-guard\.service$", socket_unit, re.M)
    assert re.search(r"^FreeBind=yes$", socket_unit, re.M)
    guard = _unit(rendered, profile, 0, "twinspark-pair-guard.service")
    assert re.search(r"^Sockets=twinspark-pair-guard-kick\.socket$", guard, re.M)
    # in [Unit]: a guard kicked often (paused, short runs) must not hit the start limit and take the socket down
    assert re.search(r"^\[Unit\]\n(?:.*\n)*?StartLimitIntervalSec=0\n(?:.*\n)*?\[Service\]", guard, re.M)
    for rank, target in ((0, listens[0]), (1, listens[1])):
        unit = _unit(rendered, profile, rank, "twinspark-vllm.service")
        # ExecStop=: a clean exit kicks before the leftovers get the stop grace; ExecStopPost=: a kill or crash kicks
        kick = f"-/opt/twinspark/venv/bin/python -I -m twinspark.cli pair kick --to {target}"
        assert re.findall(r"^ExecStop=(.*)$", unit, re.M) == [kick]
        assert re.findall(r"^ExecStopPost=(.*)$", unit, re.M) == [kick]
        # ExecStartPost=: a watcher left in the unit kicks the moment the main process ends, however it ends
        watch = f"{kick} --watch-pid ${{MAINPID}} --detach --unit %n"
        assert re.findall(r"^ExecStartPost=(.*)$", unit, re.M) == [watch]


@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_firewall_takes_the_kick_only_from_loopback_and_the_peer(rendered, profile):
    table = _unit(rendered, profile, 0, "twinspark.nft")
    lines = [line.strip() for line in table.splitlines()]
    kick_drop = lines.index('udp dport 25001 counter drop comment "pair guard kick: peer and loopback only"')
    loopback = lines.index('iifname "lo" accept')
    peer = next(i for i, line in enumerate(lines) if line.startswith("iifname {") and "saddr" in line)
    assert loopback < peer < kick_drop


@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_the_worker_gets_the_short_stop_grace_and_the_head_the_longer_one(rendered, profile):
    # A headless worker ignores SIGTERM: its grace is spent in full on every stop (vllm_service defaults).
    head = _unit(rendered, profile, 0, "twinspark-vllm.service")
    worker = _unit(rendered, profile, 1, "twinspark-vllm.service")
    assert re.findall(r"^TimeoutStopSec=(\d+)$", head, re.M) == ["5"]
    assert re.findall(r"^TimeoutStopSec=(\d+)$", worker, re.M) == ["1"]


@pytest.mark.usefixtures("ansible_playbook")
@pytest.mark.parametrize(("head", "worker", "passes"), [(5, 1, True), (5, 0, False), (0, 1, False)])
def test_a_stop_grace_of_zero_is_refused_naming_both_variables(tmp_path, head, worker, passes):
    # vllm_service's own check (tasks/assert.yml), run by ansible-playbook: systemd reads 0 as "wait forever".
    import json

    import yaml

    tasks = yaml.safe_load((ROOT / "roles" / "vllm_service" / "tasks" / "assert.yml").read_text())
    check = next(t for t in tasks if t.get("name") == "Check the ranks' stop graces")
    playbook = tmp_path / "grace.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [check]}]))
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local", str(playbook),
         "-e", json.dumps({"vllm_service_stop_timeout_s": head, "vllm_service_worker_stop_timeout_s": worker})],
        capture_output=True, text=True, timeout=300, check=False)
    assert (done.returncode == 0) is passes, done.stdout + done.stderr
    if not passes:
        assert f"vllm_service_stop_timeout_s ({head}) and vllm_service_worker_stop_timeout_s ({worker}) must be " \
            "at least 1 second" in done.stdout


@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_locally_only_the_serving_account_may_open_the_internal_ports(rendered, profile):
    table = _unit(rendered, profile, 0, "twinspark.nft")
    output = table[table.index("chain output"):]
    lines = [line.strip() for line in output.splitlines()]
    skuid, leave = lines.index("meta skuid twinspark accept"), lines.index('oifname != "lo" accept')
    internal = re.search(r"^\s*tcp dport \{ (.+) \} counter drop comment \"rendezvous", table, re.M).group(1)
    # Before anything leaves this node, the peer's internal ports over the fabric are the serving account's only
    # (issue 43, row 5); then loopback's, as before.
    hostvars, groups = inventory_vars(ROOT / "inventory" / ("sim" if profile == "cpu" else "example"))
    worker_fabric = str(hostvars[groups["twinspark_worker"][0]]["twinspark_fabric_address"]).split("/")[0]
    peer = re.search(r"^\s*tcp dport \{ (.+) \} ip6? daddr (\S+) counter reject with tcp reset", output, re.M)
    assert peer and (peer.group(1), peer.group(2)) == (internal, worker_fabric), output
    def where(found: re.Match) -> int:
        return next(i for i, line in enumerate(lines) if line.startswith(found.group(0).strip()))

    assert skuid < where(peer) < leave
    local = re.search(r"^\s*tcp dport \{ (.+) \} counter reject with tcp reset", output, re.M)
    assert local.group(1) == internal and where(local) > leave


@pytest.mark.parametrize("profile", ["cpu", "gb10"])
def test_root_runs_the_runtime_check_as_the_serving_account_in_a_sandbox(rendered, profile):
    """The argv the vllm_service role renders for the check before every ordered start (both nodes run the same):
    systemd-run with the layout's serving account, the rank's interpreter after `--`, and no secret anywhere in it
    (the sim inventory's API key is a plain value, so its absence is checked for real)."""
    where, _ = rendered[profile]
    hostvars, groups = inventory_vars(ROOT / "inventory" / ("sim" if profile == "cpu" else "example"))
    secret_names = {knob.env for knob in settings.load().knobs if knob.secret}
    for host in sorted(p.name for p in where.iterdir() if p.is_dir()):
        node = layout.from_vars(hostvars[host])
        head = host in groups["twinspark_head"]  # the worker's check, like its rank, gets no secrets.env at all
        command = sandbox.check_command(node.python, [node.serve_env] + ([node.secrets_env] if head else []))
        expected = sandbox.wrap(command, profile, node.service_user, node.secrets_env if head else "")
        argv = json.loads((where / host / "runtime-check.argv.json").read_text())
        assert argv == expected, host
        env = load_filters().twinspark_node_env(hostvars[host], hostvars, groups)
        secrets = [str(env[name]) for name in secret_names if env.get(name)]
        assert not any(secret in word for secret in secrets for word in argv), host
        if profile == "cpu":
            assert secrets, "the sim inventory sets an API key: this test would not see one leak"


@pytest.mark.slow(3)
@needs_nft_namespace
def test_real_nft_a_stranger_is_reset_on_the_rendezvous_port_and_the_serving_account_is_not(rendered, tmp_path):
    """The cpu table as rendered, loaded by the real nft in a network namespace of the test's own, with the serving
    account played by `daemon` and a stranger by `nobody`: on loopback, nobody's connection to the rendezvous port
    is reset, daemon's connects, and nobody still reaches a port outside the internal ones."""
    table = tmp_path / "firewall.nft"
    table.write_text(_unit(rendered, "cpu", 0, "twinspark.nft").replace("meta skuid twinspark", "meta skuid daemon"))
    rendezvous = int(re.search(r"tcp dport \{ (\d+),.* reject with tcp reset", table.read_text()).group(1))
    seen = connections(table, [rendezvous, 8888], [("nobody-rendezvous", "nobody", "nogroup", rendezvous),
                                                   ("daemon-rendezvous", "daemon", "daemon", rendezvous),
                                                   ("nobody-api", "nobody", "nogroup", 8888)])
    assert seen == {"nobody-rendezvous": "ConnectionRefusedError", "daemon-rendezvous": "connected",
                    "nobody-api": "connected"}, seen
