"""The simulated pair's network rule (twinspark.netguard): pure rules, then the real kernel in a throwaway namespace.

The namespace tests build what the host looks like with the pair down: a default route out of a dummy link (which
sends nothing anywhere) and, or not, the harness's safety-net blackhole routes. Every tool that dials a simulated
address must refuse there in one line, and not one packet may leave through the dummy link.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from twinspark import netguard

REPO = Path(__file__).resolve().parents[2]
SIM_NODE_ADDRESSES = ["10.78.0.1", "10.78.0.2", "10.77.0.1", "10.77.0.2"]


def routes(table):
    return lambda host: table[host]


def test_host_of_reads_addresses_host_ports_and_urls():
    assert netguard.host_of("http://10.78.0.1:8888/v1") == "10.78.0.1"
    assert netguard.host_of("10.78.0.2:22") == "10.78.0.2"
    assert netguard.host_of("10.77.0.1") == "10.77.0.1"
    assert netguard.host_of("[fd00::1]:22") == "fd00::1"


def test_only_literal_addresses_inside_the_ranges_are_simulated():
    networks = netguard.simulated_networks({})
    assert netguard.simulated("10.78.0.1", networks)
    assert netguard.simulated("10.77.0.200", networks)
    assert not netguard.simulated("10.78.1.1", networks)
    assert not netguard.simulated("198.51.100.1", networks)
    assert not netguard.simulated("node1", networks)


def test_the_ranges_follow_the_environment():
    assert netguard.simulated_networks({netguard.NETWORKS_ENV: "none"}) == []
    custom = netguard.simulated_networks({netguard.NETWORKS_ENV: "10.9.0.0/24, 10.10.0.0/16"})
    assert [str(n) for n in custom] == ["10.9.0.0/24", "10.10.0.0/16"]
    with pytest.raises(netguard.UnsafeRoute, match="TWINSPARK_SIM_NETWORKS must be .* \\(got \"10.9'x\"\\)"):
        netguard.simulated_networks({netguard.NETWORKS_ENV: "10.9'x"})


@pytest.mark.parametrize("device", ["tsbr0", "mgmt0", "ic0", "lo"])
def test_a_route_through_the_harness_is_safe(device):
    assert netguard.route_problem("10.78.0.1", {"dst": "10.78.0.1", "dev": device}, "") is None


def test_a_route_out_of_the_machine_is_named():
    problem = netguard.route_problem("10.78.0.1", {"dst": "10.78.0.1", "gateway": "192.0.2.1", "dev": "eth0"}, "")
    assert problem == "its route goes out through eth0 via 192.0.2.1"


def test_a_blackhole_or_a_missing_route_is_refused():
    assert "blackhole" in netguard.route_problem("10.78.0.1", None, "RTNETLINK answers: Invalid argument\n")
    assert "Network is unreachable" in netguard.route_problem("10.78.0.1", None,
                                                              "RTNETLINK answers: Network is unreachable")
    assert netguard.route_problem("10.78.0.1", None, "") == "its route is no route"


def test_check_refuses_the_first_unsafe_simulated_address_and_leaves_others_alone():
    table = {"10.78.0.1": ({"dev": "tsbr0"}, ""), "10.78.0.2": ({"dev": "eth0", "gateway": "192.0.2.1"}, "")}
    assert netguard.check(["10.78.0.1", "198.51.100.7"], environ={}, lookup=routes(table)) == [
        "10.78.0.1: via tsbr0", "198.51.100.7: not a simulated address, not checked"]
    with pytest.raises(netguard.UnsafeRoute) as refused:
        netguard.check(["http://10.78.0.1:8888", "10.78.0.2:22"], environ={}, lookup=routes(table))
    assert str(refused.value).startswith("refusing to dial 10.78.0.2, an address of the simulated pair: its route "
                                         "goes out through eth0 via 192.0.2.1")
    assert "scripts/sim/up" in str(refused.value)


def test_a_real_pair_outside_the_ranges_is_never_looked_up():
    def no_lookup(host):
        raise AssertionError(f"looked up {host}")

    assert netguard.check(["198.51.100.1", "http://198.51.100.1:8888"], environ={}, lookup=no_lookup)


def test_the_harness_and_the_python_rule_name_the_same_ranges():
    common = (REPO / "scripts/sim/lib/common.sh").read_text()
    prefixes = {line.split("=")[1].split()[0] for line in common.splitlines()
                if line.startswith(("IC_PREFIX=", "MGMT_PREFIX="))}
    assert {p + ".0/24" for p in prefixes} == set(netguard.DEFAULT_NETWORKS)
    assert 'BRIDGE=tsbr0' in common and "tsbr0" in netguard.HARNESS_DEVICES


# --- the real kernel: a network namespace of the test's own, shaped like the host with the pair down ---------------

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"),
    reason="needs root, unshare and ip (a network namespace of the test's own)")

# A veth link with a default route through it: the host's way off the machine, except that its far end (also in
# the namespace) leads nowhere, and its counters show whether anything tried.
NAMESPACE_SETUP = """
set -e
ip link set lo up
ip link add out0 type veth peer name out1
# No IPv6 link-local address, so the kernel's own neighbour and router discovery sends nothing on its own.
ip link set out0 addrgenmode none
ip link set out1 addrgenmode none
ip link set out1 up
ip link set out0 up
ip addr add 198.18.0.2/24 dev out0
ip route add default via 198.18.0.1
set +e
"""
SAFETY_NET = """
ip route replace blackhole 10.77.0.0/24 metric 4000
ip route replace blackhole 10.78.0.0/24 metric 4000
"""
TX_PACKETS = "ip -s link show out0 | awk '/TX:/ { getline; print $2 }'"


def in_namespace(script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    env.pop(netguard.NETWORKS_ENV, None)
    return subprocess.run(["unshare", "--net", "bash", "-c", NAMESPACE_SETUP + script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def tool_runs(python: str) -> str:
    """Shell lines running every tool that dials the pair; each prints `<name> rc=<exit>` then its stderr."""
    runs = {
        "route-check": f"{python} -m twinspark.cli route-check 10.78.0.1",
        "health": f"{python} -m twinspark.cli health -i inventory/sim --timeout 3",
        "bench": f"{python} -m twinspark.cli bench --url http://10.78.0.1:8888 --concurrency 1",
        "frontdoor": f"{python} -m twinspark.cli status -i inventory/sim --artifacts \"$(mktemp -d)\"",
        "chat-once": f"{python} scripts/sim/chat-once.py http://10.78.0.1:8888",
        "monitor-check": f"{python} scripts/sim/monitor-check --timeout 3",
        "ssh": "ssh -F /dev/null -o BatchMode=yes -o ConnectTimeout=3 "
               "-o ProxyCommand='python3 scripts/sim/route-connect %h %p' root@10.78.0.2 true",
    }
    return "\n".join(f'echo "== {name}"; {command} 2>&1 >/dev/null; echo "{name} rc=$?"'
                     for name, command in runs.items())


def results(output: str) -> dict[str, tuple[int, list[str]]]:
    found: dict[str, tuple[int, list[str]]] = {}
    name, lines = None, []
    for line in output.splitlines():
        if line.startswith("== "):
            name, lines = line[3:], []
        elif name and line.startswith(f"{name} rc="):
            found[name] = (int(line.split("=", 1)[1]), lines)
            name = None
        elif name:
            lines.append(line)
    return found


@pytest.mark.slow(3)
@needs_netns
@pytest.mark.parametrize("safety_net", [True, False], ids=["safety-net", "no-safety-net"])
def test_with_the_pair_down_every_tool_refuses_and_nothing_leaves(safety_net):
    script = (SAFETY_NET if safety_net else "") + f"""
before=$({TX_PACKETS})
{tool_runs(sys.executable)}
echo "tx_delta=$(( $({TX_PACKETS}) - before ))"
"""
    done = in_namespace(script)
    assert "tx_delta=" in done.stdout, done.stdout + done.stderr
    found = results(done.stdout)
    expected_rc = {"route-check": 1, "health": 2, "bench": 2, "frontdoor": 2, "chat-once": 2, "monitor-check": 2,
                   "ssh": 255}
    assert {name: rc for name, (rc, _) in found.items()} == expected_rc, done.stdout
    why = "its route is blackhole" if safety_net else "its route goes out through out0 via 198.18.0.1"
    for name, (_, lines) in found.items():
        refusal = [line for line in lines if "refusing to dial 10.78.0." in line]
        assert len(refusal) == 1 and why in refusal[0], (name, lines)
        assert not any("Traceback" in line for line in lines), (name, lines)
    assert done.stdout.strip().endswith("tx_delta=0"), "a packet left through the default route"


@needs_netns
def test_with_the_safety_net_ip_route_get_says_blackhole_for_every_node_address():
    checks = "\n".join(f'echo "{a}: $(ip route get {a} 2>&1 | tr -d "\\n") | '
                       f'$(ip -o route show match {a} type blackhole | head -1)"' for a in SIM_NODE_ADDRESSES)
    done = in_namespace(SAFETY_NET + checks)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == len(SIM_NODE_ADDRESSES), done.stdout + done.stderr
    for address, line in zip(SIM_NODE_ADDRESSES, lines, strict=True):
        prefix = address.rsplit(".", 1)[0]
        # The kernel refuses the lookup (a blackhole answers EINVAL), and the route that matches is the safety net.
        assert line.rstrip() == f"{address}: RTNETLINK answers: Invalid argument | blackhole {prefix}.0/24 metric 4000"
