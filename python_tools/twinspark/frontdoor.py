"""`twinspark deploy|start|stop|restart|status|upgrade|rollback|rotate -i INVENTORY`: the playbooks with a live view.

Each verb runs one playbook through ansible-runner, exactly as `ansible-playbook` would (same inventory, same
ansible.cfg, no extra behaviour): deploy = site.yml, start/stop/restart/status/upgrade/rollback/rotate =
playbooks/<verb>.yml. `rotate KIND [--phase P] [--grace S]` passes the kind (api-key, guard-key, copy-key, tls,
admin-key) and the phase and grace to playbooks/rotate.yml (docs/ROTATION.md). Instead of scrolling logs it shows
the current play and task and per-host ok/changed/failed counters on one redrawn line, prints each failure as it
happens, keeps the run's events under ./artifacts/<timestamp>/ for post-mortems, names where the pair's Prometheus
and Alertmanager answer (role monitoring) and ends with the `twinspark health` table (except after stop). A run's
folder keeps no environment and no --extra-vars value (ansible-runner writes both to its `command` file: they are
scrubbed after the run), and only the newest --keep-runs folders (20) are kept.

On a fleet (several pairs, docs/FLEET.md) `upgrade` and `rollback` without --limit walk the pairs: one run of the
playbook per pair (`--limit <pair>`, in inventory order), and after each a health gate: the whole fleet's health
must come back healthy (retried every GATE_INTERVAL s up to --gate-timeout) before the next pair is touched, so at
most one pair is ever out. The first failed pair or gate stops the walk, naming the pairs left untouched.

Exit codes: the playbook's own exit code when it fails (2 a host failed, 4 unreachable, ...); otherwise the health
exit code (0 healthy, 1 degraded, 2 failed); 0 after a successful stop.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from twinspark import atomic, monitoring, netguard
from twinspark import inventory as pair_inventory
from twinspark.health import command as health
from twinspark.inventory import default_inventory

PLAYBOOKS = {
    "deploy": "site.yml",
    "start": "playbooks/start.yml",
    "stop": "playbooks/stop.yml",
    "restart": "playbooks/restart.yml",
    "status": "playbooks/status.yml",
    "upgrade": "playbooks/upgrade.yml",
    "rollback": "playbooks/rollback.yml",
    "rotate": "playbooks/rotate.yml",
    # `twinspark recipe switch NAME` (twinspark.recipecheck): a verb of `twinspark recipe`, run like the others.
    "recipe-switch": "playbooks/recipe.yml",
}
HELP = {
    "deploy": "make both nodes match the inventory and serve (site.yml)",
    "start": "start the pair: worker first, then head (playbooks/start.yml)",
    "stop": "stop the pair: head, then worker (playbooks/stop.yml)",
    "restart": "ordered restart of both ranks (playbooks/restart.yml)",
    "status": "show both units and the API (playbooks/status.yml)",
    "upgrade": "stage the inventory's runtime, switch, restart, gate, roll back on failure (playbooks/upgrade.yml)",
    "rollback": "return both nodes to the previous runtime, once (playbooks/rollback.yml)",
    "rotate": "replace a secret while the pair serves, the new one valid before the old is dropped "
              "(playbooks/rotate.yml)",
}
# What `twinspark rotate KIND` replaces (docs/ROTATION.md).
ROTATE_KINDS = ("api-key", "guard-key", "copy-key", "tls", "admin-key")
ROTATE_PHASES = ("all", "add", "drop")
COUNTERS = ("ok", "changed", "failed", "unreachable", "skipped")
# Verbs whose playbook refuses a run covering several pairs (playbooks/tasks/one_pair_at_a_time.yml): on a fleet the
# front door runs them once per pair, with a health gate in between.
WALKED = ("upgrade", "rollback", "recipe-switch")
GATE_INTERVAL = 5.0
DEFAULT_GATE_TIMEOUT = 180.0


@dataclass
class HostCount:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0

    def text(self) -> str:
        parts = [f"ok={self.ok}", f"changed={self.changed}"]
        parts += [f"{name}={getattr(self, name)}" for name in ("failed", "unreachable") if getattr(self, name)]
        return " ".join(parts)


@dataclass
class LiveView:
    """Folds ansible-runner events into the current play/task and per-host counters, and draws them."""

    stream: TextIO
    redraw: bool
    play: str = ""
    task: str = ""
    hosts: dict[str, HostCount] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    _width: int = 0

    def status_line(self) -> str:
        counts = "  ".join(f"{host}: {count.text()}" for host, count in sorted(self.hosts.items()))
        return f"[{self.play}] {self.task}" + (f"  |  {counts}" if counts else "")

    def _draw(self) -> None:
        if self.redraw:
            line = self.status_line()
            columns = max(os.get_terminal_size(self.stream.fileno()).columns - 1, 40) if self.stream.isatty() else 200
            self.stream.write("\r\033[K" + line[:columns])
            self.stream.flush()

    def _print(self, text: str) -> None:
        if self.redraw:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()
        self._draw()

    def _count(self, host: str, name: str) -> None:
        count = self.hosts.setdefault(host, HostCount())
        setattr(count, name, getattr(count, name) + 1)

    def on_event(self, event: Mapping) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host") or ""
        if kind == "playbook_on_play_start":
            self.play = data.get("play", "")
            self.task = ""
            if not self.redraw:
                self._print(f"play: {self.play}")
        elif kind == "playbook_on_task_start":
            self.task = data.get("task", "")
        elif kind == "runner_on_ok":
            self._count(host, "ok")
            if (data.get("res") or {}).get("changed"):
                self._count(host, "changed")
        elif kind == "runner_on_skipped":
            self._count(host, "skipped")
        elif kind in ("runner_on_failed", "runner_on_unreachable"):
            ignored = kind == "runner_on_failed" and data.get("ignore_errors")
            if ignored:
                self._count(host, "ok")
            else:
                self._count(host, "failed" if kind == "runner_on_failed" else "unreachable")
                message = failure_message(data.get("res") or {}).strip().splitlines()
                line = f"{'FAILED' if kind == 'runner_on_failed' else 'UNREACHABLE'}: {host}: [{self.play}] " \
                       f"{data.get('task', self.task)}: {message[0] if message else ''}"
                self.failures.append(line)
                self._print(line)
                return True
        self._draw()
        return True

    def finish(self) -> None:
        if self.redraw:
            self.stream.write("\r\033[K")
        counts = ", ".join(f"{host}: {count.text()}" for host, count in sorted(self.hosts.items()))
        self.stream.write(f"done: {counts or 'no host ran a task'}\n")
        self.stream.flush()


def failure_message(res: Mapping) -> str:
    """What went wrong, from a task result; for a loop, the first failing item's message (the task's own message is
    only "All items completed")."""
    for item in res.get("results") or []:
        if isinstance(item, Mapping) and (item.get("failed") or item.get("unreachable")):
            return f"item {item.get('item')}: {item.get('msg') or ''}"
    return str(res.get("msg") or "")


def project_root() -> Path:
    """The checkout holding site.yml: the current directory when it has one, else the package's own checkout."""
    here = Path.cwd()
    if (here / "site.yml").is_file():
        return here
    return Path(__file__).resolve().parents[2]


def run_playbook(playbook: Path, inventory: str, artifacts: Path, view: LiveView, project: Path,
                 extra_cmdline: list[str] | None = None) -> tuple[int, Path]:
    """Run one playbook through ansible-runner; returns (exit code, the run's artifact directory)."""
    # ansible-runner: a controller extra (twinspark[controller]), absent from the nodes' venv.
    import ansible_runner

    ident = stamp = time.strftime("%Y%m%dT%H%M%S")
    serial = 1
    while (artifacts / ident).exists():
        serial += 1
        ident = f"{stamp}-{serial}"
    private = artifacts / ident
    private.mkdir(parents=True, exist_ok=True)
    bin_dir = str(Path(sys.executable).parent)
    envvars = {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "ANSIBLE_NOCOLOR": "1"}
    if (project / "ansible.cfg").is_file():
        envvars["ANSIBLE_CONFIG"] = str(project / "ansible.cfg")
    # A hang-up or a TERM (a closed terminal, systemd stopping the caller) ends the run as an exit, so the scrub
    # below still runs: ansible-runner has written the whole environment into `command` by then.
    with _signals_exit():
        try:
            runner = ansible_runner.run(
                private_data_dir=str(private),
                artifact_dir=str(artifacts),
                ident=ident,
                project_dir=str(project),
                playbook=str(playbook.resolve()),
                inventory=str(Path(inventory).resolve()) if Path(inventory).exists() else inventory,
                envvars=envvars,
                cmdline=shlex.join(extra_cmdline) if extra_cmdline else None,
                quiet=True,
                event_handler=view.on_event,
                suppress_env_files=True,
            )
        finally:
            scrub_command(artifacts / ident / "command")
    view.finish()
    return int(runner.rc or 0), artifacts / ident


@contextlib.contextmanager
def _signals_exit():
    """SIGHUP and SIGTERM raise SystemExit(128 + signal) while the block runs (main thread only), so `finally`
    clauses run; the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum, _frame):
        raise SystemExit(128 + signum)

    previous = {number: signal.signal(number, leave) for number in (signal.SIGHUP, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


REDACTED = "<redacted>"
# The run folders this module names (`<timestamp>` or `<timestamp>-<n>`): the only ones prune_runs ever removes.
RUN_DIR = re.compile(r"^\d{8}T\d{6}(-\d+)?$")
DEFAULT_KEEP_RUNS = 20


def scrub_command(path: Path) -> None:
    """ansible-runner records the run's whole environment and argv in `command` (suppress_env_files does not stop
    it): keep what ran, drop the environment and every --extra-vars value, which may carry a token."""
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    words = [str(word) for word in recorded.get("command") or []] if isinstance(recorded, dict) else []
    kept: list[str] = []
    for word in words:
        if kept and kept[-1] in ("-e", "--extra-vars"):
            word = REDACTED
        elif word.startswith("--extra-vars="):
            word = "--extra-vars=" + REDACTED
        kept.append(word)
    cwd = recorded.get("cwd") if isinstance(recorded, dict) else None
    atomic.write_atomic(path, (json.dumps({"command": kept, "cwd": cwd}, indent=1) + "\n").encode(), mode=0o600)


def prune_runs(artifacts: Path, keep: int) -> list[Path]:
    """Remove all but the newest `keep` run folders under `artifacts` (only folders named like a run); the removed."""
    try:
        runs = sorted(p for p in artifacts.iterdir() if p.is_dir() and not p.is_symlink() and RUN_DIR.match(p.name))
    except OSError:
        return []
    gone = runs[:-keep] if keep > 0 else runs
    for run in gone:
        shutil.rmtree(run, ignore_errors=True)
    return gone


def _route_refusal(inventory: str) -> str | None:
    """Why the pair's addresses must not be dialled from here (a simulated pair whose network is down), or None.

    An inventory this cannot read is left to the playbook's own validation, which names the problem."""
    try:
        pair = pair_inventory.read_inventory(inventory)
        netguard.check([*(node.host for node in pair.nodes), pair.api_url])
    except pair_inventory.InventoryError:
        return None
    except netguard.UnsafeRoute as error:
        return str(error)
    return None


def monitor_line(inventory: str) -> str | None:
    """Where the inventory's Prometheus and Alertmanager answer (role monitoring, docs/MONITORING.md), in one line;
    None when it has no monitor host, turns monitoring off, or cannot be read (the playbook names that)."""
    try:
        found = monitoring.announced_urls(*pair_inventory.read_hosts(inventory))
    except (pair_inventory.InventoryError, ValueError):
        return None
    if not found:
        return None
    return f"monitoring: Prometheus {found['prometheus']}, Alertmanager {found['alertmanager']}"


def fleet_pairs(inventory: str) -> list[str]:
    """The pair names of a well-formed fleet inventory of two pairs or more, in inventory order; [] otherwise (a
    one-pair inventory, or one the playbook's own validation must name the problem of)."""
    try:
        view = pair_inventory.read_fleet(inventory)
    except pair_inventory.InventoryError:
        return []
    if view is None or view.problems or len(view.pairs) < 2:
        return []
    return [name for name, _ in view.pairs]


def health_gate(inventory: str, after: str, timeout: float, stream: TextIO,
                interval: float = GATE_INTERVAL) -> int:
    """Wait until the whole fleet's health is healthy (exit 0), retrying every `interval` s up to `timeout` s, with
    one progress line per try; prints the last health table; returns the last health exit code."""
    started = time.monotonic()
    while True:
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            code = health.check_inventory(inventory, timeout=10.0)
        waited = time.monotonic() - started
        if code == 0 or waited + interval > timeout:
            print(captured.getvalue(), end="")
            return code
        print(f"health gate after {after}: not healthy yet (health exit {code}), again in {interval:.0f} s "
              f"({waited:.0f}/{timeout:.0f} s)", file=stream)
        time.sleep(interval)


def walk_pairs(args: argparse.Namespace, inventory: str, pairs: list[str], run_one) -> int:
    """`upgrade`/`rollback` on a fleet: the playbook once per pair, each followed by the fleet's health gate; the
    first failure stops the walk. `run_one(extra)` runs the playbook with these extra arguments, returns its exit."""
    verb = args.verb
    said = verb.replace("-", " ")  # recipe-switch: `twinspark recipe switch`
    for number, pair in enumerate(pairs, start=1):
        left = ", ".join(pairs[number:]) or "none"
        print(f"twinspark {said}: pair {pair} ({number} of {len(pairs)}): {PLAYBOOKS[verb]} --limit {pair}",
              file=sys.stderr)
        rc = run_one(["--limit", pair])
        if rc != 0:
            print(f"twinspark {said}: pair {pair} failed (exit {rc}); stopped before the pairs left: {left}",
                  file=sys.stderr)
            return rc
        if args.check:
            continue
        code = health_gate(inventory, pair, args.gate_timeout, sys.stderr)
        if code != 0:
            print(f"twinspark {said}: the fleet is not healthy after pair {pair} (health exit {code}, waited up to "
                  f"{args.gate_timeout:.0f} s); stopped before the pairs left: {left}", file=sys.stderr)
            return code
        print(f"twinspark {said}: pair {pair} done, fleet healthy", file=sys.stderr)
    return 0


def _command(args: argparse.Namespace) -> int:
    project = project_root()
    said = args.verb.replace("-", " ")  # recipe-switch: `twinspark recipe switch`
    inventory = args.inventory or default_inventory()
    playbook = project / PLAYBOOKS[args.verb]
    if not playbook.is_file():
        print(f"twinspark {said}: {playbook} does not exist (run from the TwinSpark checkout)", file=sys.stderr)
        return 2
    extra = []
    if args.check:
        extra.append("--check")
    if args.diff:
        extra.append("--diff")
    if args.verb == "rotate":
        extra += ["--extra-vars", json.dumps({"twinspark_rotate": args.kind, "key_rotation_phase": args.phase,
                                              "key_rotation_grace_s": args.grace})]
    if args.verb == "recipe-switch":
        extra += ["--extra-vars", json.dumps({"twinspark_recipe_switch_to": args.name})]
    for value in args.extra_vars or []:
        extra += ["--extra-vars", value]
    refusal = _route_refusal(inventory)
    if refusal:
        print(f"twinspark {said}: {refusal}", file=sys.stderr)
        return 2

    def run_one(more: list[str]) -> int:
        view = LiveView(stream=sys.stderr, redraw=sys.stderr.isatty())
        print(f"twinspark {said}: {PLAYBOOKS[args.verb]} on {inventory}", file=sys.stderr)
        rc, run_dir = run_playbook(playbook, inventory, Path(args.artifacts), view, project, extra + more)
        print(f"events and output kept in {run_dir}", file=sys.stderr)
        pruned = prune_runs(Path(args.artifacts), args.keep_runs)
        if pruned:
            print(f"removed {len(pruned)} older run folder(s) from {args.artifacts} (--keep-runs {args.keep_runs})",
                  file=sys.stderr)
        if rc != 0:
            print(f"twinspark {said}: {PLAYBOOKS[args.verb]} failed (exit {rc}); "
                  + ("; ".join(view.failures[:3]) or f"see {run_dir}/stdout"), file=sys.stderr)
        return rc

    pairs = fleet_pairs(inventory) if args.verb in WALKED and not args.limit else []
    if pairs:
        return walk_pairs(args, inventory, pairs, run_one)
    rc = run_one(["--limit", args.limit] if args.limit else [])
    if rc != 0:
        return rc
    if args.verb == "stop" or args.check:
        return 0
    where = monitor_line(inventory)
    if where:
        print(where, file=sys.stderr)
    if args.no_health:
        return 0
    return health.check_inventory(inventory, timeout=10.0)


def add_run_arguments(parser: argparse.ArgumentParser, walked: bool) -> None:
    """The options every playbook verb takes (and `twinspark recipe switch`)."""
    parser.add_argument("-i", "--inventory", help="Ansible inventory (default: ansible.cfg's)")
    parser.add_argument("--artifacts", default="artifacts", metavar="DIR",
                        help="where each run's events are kept, one <timestamp> folder per run (default "
                        "./artifacts)")
    parser.add_argument("--keep-runs", type=int, default=DEFAULT_KEEP_RUNS, metavar="N",
                        help=f"keep the newest N run folders in --artifacts, remove older ones (default "
                        f"{DEFAULT_KEEP_RUNS}); a folder keeps no environment and no --extra-vars value")
    parser.add_argument("--check", action="store_true", help="ansible-playbook --check (changes nothing)")
    parser.add_argument("--diff", action="store_true", help="ansible-playbook --diff")
    parser.add_argument("--limit", help="ansible-playbook --limit")
    parser.add_argument("-e", "--extra-vars", action="append", metavar="VARS",
                        help="ansible-playbook --extra-vars (repeatable)")
    if walked:
        parser.add_argument("--gate-timeout", type=float, default=DEFAULT_GATE_TIMEOUT, metavar="S",
                            help="on a fleet: how long the health gate after each pair may wait for a healthy "
                            f"fleet (default {DEFAULT_GATE_TIMEOUT:.0f} s)")
    parser.add_argument("--no-health", action="store_true", help="skip the closing health table")


def run_verb(args: argparse.Namespace) -> int:
    """Run args.verb's playbook (a key of PLAYBOOKS) as the front door does."""
    return _command(args)


def register(subparsers: argparse._SubParsersAction) -> None:
    for verb in HELP:
        playbook = PLAYBOOKS[verb]
        parser = subparsers.add_parser(verb, help=HELP[verb], description=__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        if verb == "rotate":
            parser.add_argument("kind", choices=ROTATE_KINDS, help="what to replace: the clients' API key, the pair "
                                "guard's SSH key, the model-copy SSH key, the API's TLS certificate and key, or a "
                                "fleet router's admin key")
            parser.add_argument("--phase", choices=ROTATE_PHASES, default="all",
                                help="api-key, admin-key: add (old and new both valid), drop (old refused), or all "
                                "(default)")
            parser.add_argument("--grace", type=int, default=0, metavar="S",
                                help="api-key, phase all: seconds between the switch and the drop, for clients "
                                "outside TwinSpark to move to the new key (default 0)")
        add_run_arguments(parser, verb in WALKED)
        parser.set_defaults(func=_command, verb=verb, playbook=playbook)
