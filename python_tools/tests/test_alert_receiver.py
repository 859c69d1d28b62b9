"""The simulated pair's alert receiver (devtools/alert_receiver.py), on loopback only: what Alertmanager POSTs is
recorded as one JSON line each, before the answer; the harness's way of running it (a process, SIGTERM) works."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from devtools import alert_receiver

# The shape of Alertmanager 0.25's webhook payload (version 4), cut to what a reader of the record looks at.
HANDSHAPED_FIRING = {
    "version": "4", "status": "firing", "receiver": "twinspark", "groupKey": '{}:{alertname="TwinSparkPairDown"}',
    "alerts": [{"status": "firing", "labels": {"alertname": "TwinSparkPairDown", "pair": "pair1",
                                               "severity": "page"},
                "annotations": {"summary": "Pair pair1 does not serve"}, "startsAt": "2026-12-03T14:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z"}],
}


@pytest.fixture
def receiver(tmp_path):
    out = tmp_path / "alerts.jsonl"
    recorder = alert_receiver.Recorder(out)
    httpd = alert_receiver.server("127.0.0.1", 0, recorder, max_bytes=4096)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", out
    httpd.shutdown()
    httpd.server_close()


def lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_every_post_is_one_json_line_written_before_the_answer(receiver):
    url, out = receiver
    first = requests.post(f"{url}/alerts", json=HANDSHAPED_FIRING, timeout=10)
    resolved = {**HANDSHAPED_FIRING, "status": "resolved"}
    second = requests.post(f"{url}/alerts", json=resolved, timeout=10)
    assert (first.status_code, second.status_code) == (200, 200)
    recorded = lines(out)
    assert [r["body"]["status"] for r in recorded] == ["firing", "resolved"]
    assert recorded[0]["path"] == "/alerts"
    assert recorded[0]["body"]["alerts"][0]["labels"] == {"alertname": "TwinSparkPairDown", "pair": "pair1",
                                                         "severity": "page"}
    assert recorded[0]["received_at"] <= recorded[1]["received_at"] <= time.time()
    assert requests.get(url, timeout=10).json() == {"received": 2}


def test_a_body_that_is_not_json_is_kept_as_text_and_an_oversized_one_is_refused(receiver):
    url, out = receiver
    assert requests.post(url, data=b"not json", timeout=10).status_code == 200
    assert requests.post(url, data=b"x" * 5000, timeout=10).status_code == 413
    assert [r["body"] for r in lines(out)] == [{"text": "not json"}]


def test_a_bad_listen_address_is_one_line_naming_the_fix(tmp_path, capsys):
    assert alert_receiver.main(["--listen", "10.78.0.254", "--out", str(tmp_path / "a.jsonl")]) == 2
    assert "give HOST:PORT" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_run_as_the_harness_runs_it_it_records_and_stops_on_sigterm(tmp_path):
    out = tmp_path / "alerts.jsonl"
    port = _free_port()
    script = Path(alert_receiver.__file__)
    process = subprocess.Popen([sys.executable, str(script), "--listen", f"127.0.0.1:{port}", "--out", str(out)],
                               stderr=subprocess.PIPE, text=True)
    try:
        assert "listening on" in process.stderr.readline()
        answer = requests.post(f"http://127.0.0.1:{port}/", json=HANDSHAPED_FIRING, timeout=10)
        assert answer.status_code == 200
        assert lines(out)[0]["body"]["receiver"] == "twinspark"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=20)


def _harness(tmp_path: Path, script: str, port: int) -> subprocess.CompletedProcess:
    """scripts/sim's own functions (common.sh, build.sh, teardown.sh) in a bash whose state directory is `tmp_path`
    and whose bridge address is loopback: nothing of the simulated pair is touched."""
    root = Path(alert_receiver.__file__).resolve().parents[2]
    prelude = (f". {root}/scripts/sim/lib/common.sh; . {root}/scripts/sim/lib/build.sh; "
               f". {root}/scripts/sim/lib/teardown.sh; HOST_IP=127.0.0.1; ALERT_RECEIVER_PORT={port}; "
               "mkdir -p \"$SIM_DIR/run\"; ")
    return subprocess.run(["bash", "-c", prelude + script], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TWINSPARK_SIM_DIR": str(tmp_path),
                               "TWINSPARK_SIM_FLEET": ""}, check=False)


def test_the_harness_starts_the_receiver_on_its_bridge_address_and_down_stops_it(tmp_path):
    port = _free_port()
    started = _harness(tmp_path, "alert_receiver_up; ensure_alert_receiver", port)
    try:
        assert started.returncode == 0, started.stderr
        assert "alert receiver running" in started.stderr  # the second call finds it and starts no other
        answer = requests.post(f"http://127.0.0.1:{port}/alerts", json=HANDSHAPED_FIRING, timeout=10)
        assert answer.status_code == 200
        assert lines(tmp_path / "alerts.jsonl")[0]["body"]["status"] == "firing"
    finally:
        stopped = _harness(tmp_path, "stop_alert_receiver", port)
    assert stopped.returncode == 0 and "alert receiver stopped" in stopped.stderr, stopped.stderr
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/", timeout=5)
    assert (tmp_path / "alerts.jsonl").exists()  # the record outlives the receiver


def test_the_simulated_inventory_sends_alerts_where_the_harness_listens(tmp_path):
    import yaml

    root = Path(alert_receiver.__file__).resolve().parents[2]
    url = yaml.safe_load((root / "inventory/sim/group_vars/all/monitoring.yml").read_text())[
        "monitoring_alert_webhook_url"]
    settings = f'. {root}/scripts/sim/lib/common.sh; echo "$HOST_IP $ALERT_RECEIVER_PORT"'
    harness = subprocess.run(["bash", "-c", settings], capture_output=True, text=True, timeout=60, check=True,
                             env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TWINSPARK_SIM_DIR": str(tmp_path)})
    host, port = harness.stdout.split()
    assert url.startswith(f"http://{host}:{port}/")
