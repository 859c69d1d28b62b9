"""Wait until the simulated pair's alert receiver has recorded an alert in a given state, and say how long it took.

    python3 python_tools/devtools/alert_seen.py --out /var/tmp/twinspark-sim/alerts.jsonl --alert TwinSparkPairDown \
        --status firing --since 1733230000.5 --timeout 120

Reads the JSON lines devtools/alert_receiver.py writes (one per notification Alertmanager sent) and looks for a
notification received after --since that carries an alert named --alert in --status (firing or resolved). Prints
one line, `<alert> <status> received <seconds> s after --since`, and exits 0; exits 1 naming what was waited for
when --timeout passes first. Standard library only (molecule runs it with the controller's python).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def first_seen(lines: list[str], alert: str, status: str, since: float) -> float | None:
    """The received_at of the first notification after `since` holding `alert` in `status`; None when none does."""
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written
        received = float(record.get("received_at") or 0)
        alerts = (record.get("body") or {}).get("alerts") or []
        if received >= since and any((a.get("labels") or {}).get("alertname") == alert and a.get("status") == status
                                     for a in alerts if isinstance(a, dict)):
            return received
    return None


def wait_seen(out: Path, alert: str, status: str, since: float, timeout_s: float, poll_s: float = 1.0) -> float | None:
    """Wait at most `timeout_s` for `first_seen` in the receiver's file `out`; its received_at, or None."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            lines = out.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        seen = first_seen(lines, alert, status, since)
        if seen is not None or time.monotonic() >= deadline:
            return seen
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="alert_seen.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="the receiver's JSON lines file")
    parser.add_argument("--alert", required=True, help="alert name, e.g. TwinSparkPairDown")
    parser.add_argument("--status", choices=["firing", "resolved"], required=True)
    parser.add_argument("--since", type=float, required=True, help="Unix time; earlier notifications do not count")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (default %(default)s)")
    args = parser.parse_args(argv)
    seen = wait_seen(args.out, args.alert, args.status, args.since, args.timeout)
    if seen is not None:
        print(f"{args.alert} {args.status} received {seen - args.since:.1f} s after --since")
        return 0
    print(f"{args.alert} {args.status}: no notification in {args.out} within {args.timeout:.0f} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
