"""devtools/alert_seen.py: what molecule's head-kill check reads from the simulated pair's alert receiver."""

from __future__ import annotations

import json

from devtools import alert_seen


def _line(at: float, status: str, alert: str = "TwinSparkPairDown") -> str:
    body = {"status": status, "alerts": [{"status": status, "labels": {"alertname": alert, "pair": "pair1"}}]}
    return json.dumps({"received_at": at, "path": "/", "body": body})


def test_the_first_notification_after_since_in_the_asked_state_counts():
    lines = [_line(90.0, "firing"), "{half a line", _line(120.0, "firing", "TwinSparkTargetDown"),
             _line(125.0, "firing"), _line(170.0, "resolved")]
    assert alert_seen.first_seen(lines, "TwinSparkPairDown", "firing", 100.0) == 125.0
    assert alert_seen.first_seen(lines, "TwinSparkPairDown", "resolved", 100.0) == 170.0
    assert alert_seen.first_seen(lines, "TwinSparkPairDown", "resolved", 171.0) is None
    assert alert_seen.first_seen(lines, "TwinSparkGuardGaveUp", "firing", 0.0) is None


def test_the_command_says_the_delay_or_names_what_it_waited_for(tmp_path, capsys):
    out = tmp_path / "alerts.jsonl"
    out.write_text(_line(125.0, "firing") + "\n")
    assert alert_seen.main(["--out", str(out), "--alert", "TwinSparkPairDown", "--status", "firing",
                            "--since", "100", "--timeout", "0"]) == 0
    assert capsys.readouterr().out.strip() == "TwinSparkPairDown firing received 25.0 s after --since"
    assert alert_seen.main(["--out", str(out), "--alert", "TwinSparkPairDown", "--status", "resolved",
                            "--since", "100", "--timeout", "0"]) == 1
    assert "TwinSparkPairDown resolved: no notification" in capsys.readouterr().err
    assert alert_seen.main(["--out", str(tmp_path / "none.jsonl"), "--alert", "X", "--status", "firing",
                            "--since", "0", "--timeout", "0"]) == 1


def test_the_wait_sees_a_notification_written_while_it_waits(tmp_path):
    import threading

    out = tmp_path / "alerts.jsonl"  # the receiver has written nothing yet
    writer = threading.Timer(0.3, lambda: out.write_text(_line(130.0, "resolved") + "\n"))
    writer.start()
    try:
        assert alert_seen.wait_seen(out, "TwinSparkPairDown", "resolved", 100.0, 10.0, poll_s=0.05) == 130.0
    finally:
        writer.join()
    assert alert_seen.wait_seen(out, "TwinSparkPairDown", "firing", 100.0, 0.2, poll_s=0.05) is None
