"""Issue 43, row 2 (docs/SECURITY.md): on the head, only the rank's unit may listen on the API port.

vLLM listens on its API port only once the model is loaded, minutes after the rank starts; until then another local
account could listen there and be sent every LAN client's key and prompt. Role vllm_service writes a sysctl file on
the head that makes every port up to the API port privileged, and gives the head's rank unit CAP_NET_BIND_SERVICE.

Here the file the role writes (rendered from its task) is loaded with `sysctl -p` in a network namespace of the test's
own, as systemd-sysctl loads it at boot; then an account with no capability is refused the API port (EACCES, whether
or not anything listens there), the port above stays free to all, and an account holding the rank's one capability
binds it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
UNIT_TASKS = REPO / "roles/vllm_service/tasks/unit.yml"
SYSTEM_PYTHON = "/usr/bin/python3"
BIND = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    server.bind(("0.0.0.0", int(sys.argv[1])))
    server.listen(4)
    print("bound")
except OSError as exc:
    print(exc.strerror)
"""


def _task(name: str) -> dict:
    tasks = yaml.safe_load(UNIT_TASKS.read_text())
    found = [task for task in tasks if task.get("name") == name]
    assert len(found) == 1, f"{UNIT_TASKS}: no single task named {name!r}"
    return found[0]


def _render(text: str, **values) -> str:
    return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(text).render(**values)


def sysctl_file(api_port: int) -> str:
    """The file the role writes on a head whose API port is `api_port`."""
    task = _task("Make the API port and the ports below it privileged (head)")
    assert task["when"] == "twinspark_layout_is_head | bool"
    return _render(task["ansible.builtin.copy"]["content"], twinspark_layout_unit_vllm="twinspark-vllm.service",
                   vllm_service_api_port=str(api_port),
                   vllm_service_port_sysctl="net.ipv4.ip_unprivileged_port_start")


def test_the_file_makes_the_api_port_the_highest_privileged_port():
    text = sysctl_file(8888)
    settings = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert settings == ["net.ipv4.ip_unprivileged_port_start = 8889"]
    assert "twinspark-vllm.service" in text


def test_the_running_node_is_set_by_the_same_value():
    task = _task("Apply it to the running node (head)")
    argv = [_render(arg, vllm_service_port_sysctl="net.ipv4.ip_unprivileged_port_start",
                    vllm_service_api_port="8000") for arg in task["ansible.builtin.command"]["argv"]]
    assert argv == ["sysctl", "-q", "-w", "net.ipv4.ip_unprivileged_port_start=8001"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv")
                    or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="needs root, unshare, setpriv and /usr/bin/python3 (a network namespace of the test's own)")
def test_in_a_namespace_only_the_capability_binds_the_api_port(tmp_path):
    conf = tmp_path / "60-twinspark-api-port.conf"
    conf.write_text(sysctl_file(8888))
    bind = tmp_path / "bind.py"  # read by root's shell, handed to each account's python on stdin
    bind.write_text(BIND)
    nobody = "setpriv --reuid=nobody --regid=nogroup --clear-groups"
    capable = f"{nobody} --inh-caps +net_bind_service --ambient-caps +net_bind_service"
    script = f"""
    set -e
    ip link set lo up
    HOLD='import socket, time; s = socket.socket(); s.bind(("0.0.0.0", 8888)); s.listen(); time.sleep(30)'
    echo "before: $({nobody} {SYSTEM_PYTHON} -I - 8888 < {bind})"
    sysctl -q -p {conf}
    echo "nobody 8888: $({nobody} {SYSTEM_PYTHON} -I - 8888 < {bind})"
    echo "nobody 8889: $({nobody} {SYSTEM_PYTHON} -I - 8889 < {bind})"
    echo "capable 8888: $({capable} {SYSTEM_PYTHON} -I - 8888 < {bind})"
    {capable} {SYSTEM_PYTHON} -I -c "$HOLD" &
    holder=$!
    for _ in $(seq 50); do ss -Hltn 'sport = :8888' | grep -q . && break; sleep 0.1; done
    echo "nobody 8888 while held: $({nobody} {SYSTEM_PYTHON} -I - 8888 < {bind})"
    kill $holder
    """
    done = subprocess.run(["unshare", "--net", "bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    # Before the file, the port is anyone's: what row 2 found.
    assert lines["before"] == "bound"
    assert lines["nobody 8888"] == "Permission denied"
    assert lines["nobody 8889"] == "bound"
    assert lines["capable 8888"] == "bound"
    # Refused for want of the capability, not because the port is taken: the same answer while vLLM listens.
    assert lines["nobody 8888 while held"] == "Permission denied"
