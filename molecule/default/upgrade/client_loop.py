#!/usr/bin/env python3
"""A client that keeps asking the head for a one-token completion while an upgrade runs, and the note it gives.

Runs on the head with the distribution's python3 (standard library only, never the runtime being switched).

    client_loop.py run LOG URL MODEL STOPFILE MAX_S      (API key from $UPGRADE_API_KEY; one JSON line per attempt;
                                                          MODEL "*": whichever model /v1/models serves, asked before
                                                          each attempt, as a client of a recipe switch would)
    client_loop.py summary LOG SWITCH_EPOCH JOURNAL      (JSON: attempts, the serving gap, vLLM's own start)

The serving gap is the longest time between two consecutive good answers (last good answer -> first good answer,
across the restart). vLLM's own start is read from the head's journal after the switch: from systemd starting
the unit to uvicorn's "Application startup complete".
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path


def _served(url: str, headers: dict[str, str]) -> str:
    """The first model /v1/models lists ("" when the head does not answer)."""
    request = urllib.request.Request(f"{url}/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return str(json.load(answer)["data"][0]["id"])
    except Exception:  # noqa: BLE001 - not answering is what the attempt records
        return ""


def run(log: Path, url: str, model: str, stop: Path, max_s: float) -> int:
    key = os.environ.get("UPGRADE_API_KEY", "")
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    started = time.time()
    with log.open("a") as out:
        while not stop.exists() and time.time() - started < max_s:
            at = time.time()
            asked = _served(url, headers) if model == "*" else model
            body = json.dumps({"model": asked, "prompt": "ping", "max_tokens": 1}).encode()
            request = urllib.request.Request(f"{url}/v1/completions", data=body, method="POST", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    ok = answer.status == 200
            except Exception:  # noqa: BLE001 - any failure is a missed answer
                ok = False
            out.write(json.dumps({"at": at, "ok": ok, "model": asked}) + "\n")
            out.flush()
            time.sleep(max(0.0, 0.5 - (time.time() - at)))
    return 0


def _journal_start(journal: str) -> float | None:
    """Seconds from systemd starting the unit to "Application startup complete" (short-unix journal lines)."""
    started = None
    for line in journal.splitlines():
        stamp, _, text = line.partition(" ")
        try:
            when = float(stamp)
        except ValueError:
            continue
        if started is None and "Started" in text and "twinspark" in text.lower():
            started = when
        elif started is not None and "Application startup complete" in text:
            return round(when - started, 1)
    return None


def summary(log: Path, switch_epoch: float, journal: Path) -> int:
    attempts = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    good = [a["at"] for a in attempts if a["ok"]]
    gap, gap_from, gap_to = 0.0, None, None
    for before, after in itertools.pairwise(good):
        if after - before > gap:
            gap, gap_from, gap_to = after - before, before, after
    failed_before_switch = sum(1 for a in attempts if not a["ok"] and a["at"] < switch_epoch)
    print(json.dumps({
        "attempts": len(attempts),
        "good": len(good),
        "failed_before_switch": failed_before_switch,
        "failed": len(attempts) - len(good),
        # Which model answered, in order of first answer (a recipe switch: the old recipe's, then the new one's).
        "models": list(dict.fromkeys(a.get("model") for a in attempts if a["ok"] and a.get("model"))),
        "serving_gap_s": round(gap, 1),
        "gap_from": datetime.fromtimestamp(gap_from).isoformat(timespec="seconds") if gap_from else None,
        "gap_to": datetime.fromtimestamp(gap_to).isoformat(timespec="seconds") if gap_to else None,
        "vllm_start_s": _journal_start(journal.read_text()),
    }))
    return 0


if __name__ == "__main__":
    verb, args = sys.argv[1], sys.argv[2:]
    if verb == "run":
        sys.exit(run(Path(args[0]), args[1], args[2], Path(args[3]), float(args[4])))
    sys.exit(summary(Path(args[0]), float(args[1]), Path(args[2])))
