"""The host firewall's table, watched: `twinspark firewall watch|status`.

The rank's unit is bound to the firewall unit (BindsTo=), which loads the nftables table `inet twinspark` once and
then only remembers that it did. Deleting the table by hand (`nft delete table inet twinspark`, or a ruleset flush
by another tool) leaves vLLM serving with no filter, and systemd never notices. The watcher unit looks at the table
every few seconds and, when it is gone, loads the same file again (one nft transaction: the file declares, deletes
and recreates the table), without stopping or restarting anything. It also compares what the table holds with
what the file loaded (a digest of `nft list table`, counter values left out): a chain flushed or a rule changed by
hand is loaded again the same way (issue 43, row 9: `nft flush chain inet twinspark input` left an empty chain under
an accept policy). The reference is taken from the watcher's own load: on its first look it loads the file once
(atomically, so there is no moment without the table). It logs one line per disappearance or change and keeps its
verdict in a small JSON state file that the health sweep and the pair guard read, so both say so while it lasts.

    twinspark firewall watch --file FILE [--state PATH] [--interval S] [--once]
    twinspark firewall status [--state PATH] [--json]

`status` exits 0 when the table is loaded and the watcher's verdict is fresh, 1 when the verdict is stale or the
watcher could not look, 2 when the table is missing.

The router host watches its own table (`inet twinspark_router`, issue 43 row 9) with this same file, copied alone by
roles/router and run by the system Python (`python3 -I firewallwatch.py firewall watch --table ...`): nothing here
imports the rest of the package until a default (the layout's state path) is asked for.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

TABLE = ("inet", "twinspark")
NFT = "/usr/sbin/nft"
DEFAULT_INTERVAL_S = 2.0
# A verdict older than this many intervals (plus a margin) means the watcher is not looking any more.
STALE_INTERVALS = 5
STALE_MARGIN_S = 10.0

Run = Callable[[Sequence[str]], subprocess.CompletedProcess]


def run_nft(argv: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)


@dataclass
class State:
    """The watcher's verdict, as written to the state file."""

    table: str
    present: bool | None  # None: nft could not say (not installed, refused)
    checked_at: float
    interval_s: float
    missing_since: float | None = None
    reapplied: int = 0
    last_reapplied_at: float | None = None
    error: str = ""
    digest: str = ""  # what the table held right after the watcher last loaded the file ('' before its first load)
    changed: int = 0  # times the table was found holding something else than what was loaded, and loaded again

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"


def table_name() -> str:
    return " ".join(TABLE)


_COUNTER = re.compile(r"counter packets \d+ bytes \d+")


def fingerprint(listing: str) -> str:
    """A digest of `nft list table` output that changes with the rules, sets and policies, not with traffic."""
    return hashlib.sha256(_COUNTER.sub("counter", listing).encode()).hexdigest()


def look(run: Run, nft: str = NFT, table: Sequence[str] = TABLE) -> tuple[bool | None, str, str]:
    """(present, why not, the table's fingerprint): True when the table is loaded, False when nft says it does not
    exist, None when nft could not answer at all."""
    try:
        done = run([nft, "list", "table", *table])
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"{nft}: {error}", ""
    if done.returncode == 0:
        return True, "", fingerprint(done.stdout or "")
    said = " ".join((done.stderr or done.stdout or "").split())
    if "No such file or directory" in said:
        return False, said, ""
    return None, said or f"{nft} exited {done.returncode}", ""


def load(run: Run, file: str, nft: str = NFT) -> str:
    """Load the table from `file`; '' on success, else nft's complaint."""
    try:
        done = run([nft, "-f", file])
    except (OSError, subprocess.SubprocessError) as error:
        return f"{nft} -f {file}: {error}"
    if done.returncode == 0:
        return ""
    return " ".join((done.stderr or done.stdout or "").split()) or f"{nft} -f {file} exited {done.returncode}"


def step(state: State, file: str, run: Run, now: Callable[[], float] = time.time,
         say: Callable[[str], None] = print) -> State:
    """One look, and a reload when the table is gone or holds something else than what was loaded. Returns the new
    verdict (the same object, updated)."""
    table = state.table.split()
    present, why, digest = look(run, table=table)
    state.checked_at = now()
    if present is None:
        if state.error != why:
            say(f"firewall watch: cannot look at table {state.table}: {why}")
        state.present, state.error = None, why
        return state
    if present and state.digest and digest != state.digest:
        return _reload_changed(state, file, run, now, say)
    if present and not state.digest:  # the first look: load the file once, so the reference is our own load
        problem = load(run, file)
        if problem:
            state.present, state.error = True, f"cannot take the reference: {file} did not load: {problem}"
            say(f"firewall watch: {state.error}; the table's content is not watched until it does")
            return state
        state.digest = look(run, table=table)[2]
    if present:
        if state.present is False and state.missing_since is not None:
            say(f"firewall watch: table {state.table} is back after {state.checked_at - state.missing_since:.1f} s")
        state.present, state.missing_since, state.error = True, None, ""
        return state
    if state.missing_since is None:
        state.missing_since = state.checked_at
    problem = load(run, file)
    if problem:
        if state.error != problem:  # once per new complaint, not every interval while it lasts
            say(f"firewall watch: table {state.table} is missing and {file} did not load: {problem}; the ports it "
                f"filters (the API and the rendezvous; the router's) are unfiltered until it does")
        state.present, state.error = False, problem
        return state
    present_now, _, state.digest = look(run, table=table)
    state.reapplied += 1
    state.last_reapplied_at = now()
    state.present, state.error = bool(present_now), ""
    gone_for = state.last_reapplied_at - state.missing_since
    say(f"firewall watch: table {state.table} was missing (deleted outside its unit); loaded {file} again "
        f"{gone_for:.1f} s after it was first seen missing, without touching vLLM")
    if state.present:
        state.missing_since = None
    return state


def _reload_changed(state: State, file: str, run: Run, now: Callable[[], float], say: Callable[[str], None]) -> State:
    """The table is there but holds something else than what the watcher loaded: load the file again."""
    problem = load(run, file)
    if problem:
        if state.error != problem:
            say(f"firewall watch: table {state.table} holds other rules than {file}, which did not load: {problem}")
        state.present, state.error = True, problem
        return state
    state.digest = look(run, table=state.table.split())[2]
    state.changed += 1
    state.reapplied += 1
    state.last_reapplied_at = now()
    state.present, state.missing_since, state.error = True, None, ""
    say(f"firewall watch: table {state.table} held other rules than {file} loaded (changed outside its unit); "
        "loaded it again, without touching vLLM")
    return state


def write_state(path: Path, state: State) -> None:
    """The verdict, replaced in one rename (readers never see half of it); stdlib only, for the lone copy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(state.to_json(), encoding="utf-8")
    temporary.chmod(0o644)
    os.replace(temporary, path)


def read_state(path: Path) -> dict[str, object]:
    """The watcher's last verdict, or {'error': ...} when there is none to read."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"error": f"{path} does not exist (the watcher has not run)"}
    except (OSError, ValueError) as error:
        return {"error": f"{path}: {error}"}
    return data if isinstance(data, dict) else {"error": f"{path}: not a JSON object"}


def judge(state: Mapping[str, object], now: float) -> tuple[int, str]:
    """(0 ok / 1 cannot vouch / 2 table missing, one line) for a verdict read by read_state."""
    if state.get("error") and "checked_at" not in state:
        return 1, str(state["error"])
    table = state.get("table") or table_name()
    try:
        checked_at = float(state.get("checked_at") or 0)
        interval = float(state.get("interval_s") or DEFAULT_INTERVAL_S)
    except (TypeError, ValueError):
        return 1, "the watcher's state file is malformed"
    age = now - checked_at
    if age > STALE_INTERVALS * interval + STALE_MARGIN_S:
        return 1, f"the watcher's last look at table {table} is {age:.0f} s old (is its unit running?)"
    if state.get("present") is False:
        since = state.get("missing_since")
        gone = f" for {now - float(since):.0f} s" if isinstance(since, (int, float)) else ""
        return 2, (f"nftables table {table} is missing{gone}: the API and the rendezvous ports are unfiltered"
                   + (f"; reloading failed: {state['error']}" if state.get("error") else ""))
    if state.get("present") is None:
        return 1, f"the watcher cannot look at table {table}: {state.get('error') or 'no answer'}"
    if state.get("error"):
        return 1, f"table {table} loaded, but the watcher cannot vouch for its rules: {state['error']}"
    again = int(state.get("reapplied") or 0)
    return 0, f"table {table} loaded" + (f" (re-applied {again} time(s) since the watcher started)" if again else "")


def watch(file: str, state_path: Path, interval_s: float, run: Run = run_nft, once: bool = False,
          sleep: Callable[[float], None] = time.sleep, now: Callable[[], float] = time.time,
          rounds: int | None = None, table: str = "") -> int:
    if not Path(file).is_file():
        print(f"firewall watch: {file} does not exist; install it with ansible-playbook site.yml "
              f"(role host_firewall)", file=sys.stderr)
        return 2
    state = State(table or table_name(), None, now(), interval_s)
    done = 0
    while True:
        step(state, file, run, now, lambda line: print(line, flush=True))
        write_state(state_path, state)
        done += 1
        if once or (rounds is not None and done >= rounds):
            return 0 if state.present else 1
        sleep(interval_s)


def default_state_path() -> Path:
    # Only here: the router host's lone copy (stdlib only) always passes --state.
    from twinspark import layout

    return Path(layout.current().firewall_state)


def cmd_watch(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print("twinspark firewall watch: --interval must be above 0 seconds", file=sys.stderr)
        return 2
    if len(args.table.split()) != 2:
        print(f"twinspark firewall watch: --table {args.table!r}: give the family and the name, as in "
              f"'{table_name()}'", file=sys.stderr)
        return 2
    return watch(args.file, args.state or default_state_path(), args.interval, once=args.once, table=args.table)


def cmd_status(args: argparse.Namespace) -> int:
    state = read_state(args.state or default_state_path())
    code, line = judge(state, time.time())
    if args.json:
        print(json.dumps({"status": ("ok", "unknown", "missing")[code], "message": line, "state": state},
                         sort_keys=True))
    else:
        print(line)
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("firewall",
                                   help="watch the host firewall's nftables table; re-apply it when deleted")
    verbs = parser.add_subparsers(dest="verb", required=True)
    watch_parser = verbs.add_parser("watch", help="look at the table every --interval s; load --file when it is gone")
    watch_parser.add_argument("--file", required=True, help="the table's nft file (host_firewall_file)")
    watch_parser.add_argument("--state", type=Path, help="where the verdict is kept (default: layout firewall_state)")
    watch_parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between looks")
    watch_parser.add_argument("--once", action="store_true", help="one look (and reload), then exit")
    watch_parser.add_argument("--table", default=table_name(),
                              help="the table the file declares, family and name (default: %(default)s)")
    watch_parser.set_defaults(func=cmd_watch)
    status_parser = verbs.add_parser("status", help="the watcher's last verdict (exit 0 loaded, 1 stale, 2 missing)")
    status_parser.add_argument("--state", type=Path, help="the watcher's state file (default: layout firewall_state)")
    status_parser.add_argument("--json", action="store_true", help="print JSON")
    status_parser.set_defaults(func=cmd_status)


def main(argv: Sequence[str] | None = None) -> int:
    """The lone copy's entry point (`python3 -I firewallwatch.py firewall watch|status ...`)."""
    parser = argparse.ArgumentParser(prog="firewallwatch.py")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
