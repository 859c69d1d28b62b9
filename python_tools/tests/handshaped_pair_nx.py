#!/usr/bin/env python3
"""A handshaped stand-in for scripts/sim/nx in the yardstick's tests: `handshaped_pair_nx.py NODE CMD...`, no node,
no network. Written by hand (not recorded from a pair): it answers only the commands scripts/bench/yardstick
sends, from a state directory ($FAKE_PAIR_DIR): every call is appended to calls.jsonl, a transient unit started with
systemd-run is a file units/<node>/<unit> until `systemctl stop`, and these files change the answers:
  rank-<node>        the state `systemctl is-active twinspark-vllm.service` prints there (default inactive)
  guard              the state of twinspark-pair-guard.timer on the head (default inactive)
  shown-<node>.json  what `twinspark serve --dry-run --json` prints there
  fail-pip-<node>    the pip unit exits 1 there
  die-rank<N>        that rank's unit is "failed" right after it starts
  leftover-<node>    the scratch directory exists there before the run
  down-<node>        every command there fails, as nx does for a node that is not running
  reject-chat        the head's API answers the one-token chat with HTTP 400
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

state = Path(os.environ["FAKE_PAIR_DIR"])
node, argv = sys.argv[1], sys.argv[2:]
with open(state / "calls.jsonl", "a") as calls:
    calls.write(json.dumps({"node": node, "argv": argv}) + "\n")
units = state / "units" / node
units.mkdir(parents=True, exist_ok=True)


def answer(text: str = "", rc: int = 0) -> None:
    print(text, end="" if not text or text.endswith("\n") else "\n")
    sys.exit(rc)


def option(prefix: str) -> str:
    return next(a.removeprefix(prefix) for a in argv if a.startswith(prefix))


if (state / f"down-{node}").exists():
    answer(f"{node} is not running; start the pair with scripts/sim/up", 1)
if argv == ["true"] or argv[0] == "mkdir":
    answer()
if argv[0] == "test":
    answer(rc=0 if (state / f"leftover-{node}").exists() else 1)
if argv[0] == "rm":
    (state / f"leftover-{node}").unlink(missing_ok=True)
    answer()
if argv[:2] == ["systemctl", "is-active"]:
    unit = argv[2]
    if unit == "twinspark-vllm.service":
        text = (state / f"rank-{node}").read_text().strip() if (state / f"rank-{node}").exists() else "inactive"
    elif unit == "twinspark-pair-guard.timer":
        text = (state / "guard").read_text().strip() if (state / "guard").exists() else "inactive"
    elif (units / unit).exists():
        text = (units / unit).read_text()
    else:
        text = "inactive"
    answer(text, 0 if text == "active" else 3)
if argv[:2] == ["systemctl", "stop"]:
    unit = argv[2]
    if unit == "twinspark-vllm.service":
        (state / f"rank-{node}").write_text("inactive")
    elif unit == "twinspark-pair-guard.timer":
        (state / "guard").write_text("inactive")
    loaded = (units / unit).exists()
    (units / unit).unlink(missing_ok=True)
    answer(rc=0 if loaded or unit.startswith("twinspark-vllm") or unit.startswith("twinspark-pair") else 5)
if argv[:2] == ["systemctl", "reset-failed"]:
    answer()
if argv[0] == "systemd-run":
    unit = option("--unit=")
    command = argv[argv.index("--") + 1:]
    if unit == "twinspark-yardstick-pip":
        answer("pip: installed\n", 1 if (state / f"fail-pip-{node}").exists() else 0)
    rank = unit[-1]
    (units / unit).write_text("failed" if (state / f"die-rank{rank}").exists() else "active")
    (state / f"started-{unit}.json").write_text(json.dumps({"argv": command, "options": argv[:argv.index("--")]}))
    answer()
if argv[0] == "journalctl":
    answer("RuntimeError: handshaped rank failure for the test\n")
if argv[0].endswith("/bin/twinspark") and argv[1:4] == ["serve", "--dry-run", "--json"]:
    answer((state / f"shown-{node}.json").read_text())
if argv[0] == "tar":
    if "-cf" in argv:
        answer("model bytes\n")
    sys.stdin.read()
    answer()
if argv[0] == "/usr/bin/python3" and argv[1] == "-c":
    if (state / "reject-chat").exists():
        answer("HTTP 400: b'The model `tiny` does not exist.'", 4)
    answer('"Hello"')
answer(f"fake nx: unexpected command {argv}", 99)
