"""playbooks/preflight.yml for real, on this machine: a two-node cpu-profile inventory whose nodes are both this
machine (local connection). The collector is shipped and run by the script module as on a node, the verdict is made
by the filters on the controller; nothing on the machine changes (changed=0, in --check too). One node names a
fabric interface this machine does not have: the preflight stops naming it, until the inventory acknowledges it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import localplay
import pytest
import yaml

ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
_RECAP = re.compile(r"^(node[12])\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


def inventory(tmp_path: Path, worker_vars: dict) -> Path:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {"all": {"children": {"twinspark_pair": {
        "vars": {"twinspark_profile": "cpu", "twinspark_nccl_socket_ifname": "lo",
                 "twinspark_layout_state_dir": str(tmp_path / "state")},
        "children": {
            "twinspark_head": {"hosts": {"node1": {**local, "twinspark_fabric_address": "10.99.0.1"}}},
            "twinspark_worker": {"hosts": {"node2": {**local, "twinspark_fabric_address": "10.99.0.2",
                                                     **worker_vars}}},
        }}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(hosts))
    return path


def preflight(hosts: Path, *options: str) -> tuple[int, str, dict[str, tuple[int, ...]]]:
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK} not installed (pip install the controller extras)")
    done = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(hosts), str(localplay.ROOT / "playbooks" / "preflight.yml"),
                           *options], cwd=localplay.ROOT, env=localplay.environment(), capture_output=True, text=True,
                          timeout=600, check=False)
    output = done.stdout + done.stderr
    recap = {m.group(1): tuple(int(v) for v in m.groups()[1:]) for m in _RECAP.finditer(output)}
    return done.returncode, " ".join(output.split()), recap  # the callback wraps long lines


@pytest.mark.usefixtures("ansible_playbook")
def test_the_preflight_stops_on_a_finding_then_passes_once_it_is_acknowledged(tmp_path):
    rc, output, recap = preflight(inventory(tmp_path, {"twinspark_nccl_socket_ifname": "nosuch0"}))
    assert rc != 0, output
    assert "nothing was installed or restarted" in output
    assert "node2: fabric.interface-missing: fabric interface nosuch0 (NCCL_SOCKET_IFNAME) does not exist" in output
    assert recap["node1"][1] == 0 and recap["node2"][1] == 0  # changed

    acknowledged = inventory(tmp_path, {"twinspark_nccl_socket_ifname": "nosuch0",
                                        "twinspark_doctor_ack": ["fabric.interface-missing"]})
    rc, output, recap = preflight(acknowledged)
    assert rc == 0, output
    assert "ack node2 fabric.interface-missing" in output
    # 10.99.0.x is on no interface here: the fabric play would put it there, so it is shown and does not stop.
    assert "later node1 fabric.address" in output
    assert "node2: never measured on this node: site.yml measures the fabric before serving" in output
    assert all(counts[1] == 0 and counts[3] == 0 for counts in recap.values()), recap

    rc, output, recap = preflight(acknowledged, "--check", "--diff")
    assert rc == 0, output
    assert "site.yml would measure the fabric before serving (never in --check)" in output
    assert all(counts[1] == 0 for counts in recap.values()), recap
    assert not (tmp_path / "state").exists()


@pytest.mark.usefixtures("ansible_playbook")
def test_a_limit_to_one_node_judges_that_node_alone(tmp_path):
    rc, output, recap = preflight(inventory(tmp_path, {"twinspark_nccl_socket_ifname": "nosuch0"}), "--limit", "node2")
    assert rc != 0 and "node2: fabric.interface-missing" in output, output
    assert set(recap) == {"node2"}
    rc, output, recap = preflight(inventory(tmp_path, {"twinspark_nccl_socket_ifname": "nosuch0"}), "--limit", "node1")
    assert rc == 0 and "fabric.interface-missing" not in output and set(recap) == {"node1"}, output
