"""Model weights: one pinned hub download, a size/sha manifest, and verification of every copy.

`twinspark model plan|fetch|verify|manifest`. The rules (download arguments, disk-space arithmetic, offline refs,
what a complete checkpoint looks like) are pure functions over plain data; the hub and the disk sit at the edges.
huggingface_hub is imported only by the commands that talk to the hub, after the download environment is set,
because it reads its timeouts from the environment when it is first imported.

Exit codes: 0 ok, 1 runtime failure (missing or damaged shards, not enough disk, hub error), 2 invalid input.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import struct
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from twinspark import atomic, envfile, recipe

# The checkpoint and commit of the default profile's default recipe (twinspark/recipes/). Leaving the revision unset
# pins to it; the empty string follows the default branch.
PINNED_REPO_ID = str(recipe.knob_default("MODEL"))
PINNED_REVISION = str(recipe.knob_default("MODEL_REVISION"))

# huggingface_hub's defaults (10 s) time out against a busy hub on a 150 GB snapshot; these are the values the
# published configuration used.
DOWNLOAD_TIMEOUT_S = 120
ETAG_TIMEOUT_S = 30
DEFAULT_HF_HOME = str(recipe.knob_default("HF_HOME"))  # the knob HF_HOME's default
DEFAULT_TOKEN_ENV = "HF_TOKEN"
DEFAULT_REF_BRANCH = "main"
# Room left on the disk after the download: vLLM, TileLang and inductor caches share it.
DEFAULT_RESERVE_BYTES = 5 * 1024**3

MANIFEST_NAME = "twinspark-manifest.json"
MANIFEST_FORMAT = 1
INDEX_NAME = "model.safetensors.index.json"
SINGLE_SHARD_NAME = "model.safetensors"
MAX_LISTED_PROBLEMS = 20
# Directories that hold transfer state rather than model files (huggingface_hub's local_dir metadata).
IGNORED_DIRS = frozenset({".cache"})
# A safetensors header larger than this is corruption, not a checkpoint (the format caps it at 100 MB).
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelInputError(ValueError):
    """Invalid input from the operator (exit 2)."""


class ModelRuntimeError(RuntimeError):
    """The machine or the hub does not allow what was asked (exit 1)."""


# ---------------------------------------------------------------------------------------------------------------
# Revisions and the Hugging Face cache layout


def resolve_revision(value: str | None) -> str | None:
    """Unset means the tested pin; the empty string means "the hub's default branch" (None for huggingface_hub)."""
    if value is None:
        return PINNED_REVISION
    value = value.strip()
    return value or None


def is_commit(revision: str | None) -> bool:
    return bool(revision) and bool(_COMMIT_RE.match(revision or ""))


def check_repo_id(repo_id: str) -> str:
    if not _REPO_ID_RE.match(repo_id or ""):
        raise ModelInputError(
            f"MODEL repo id must look like 'organisation/name' (got {repo_id!r}); "
            "for a model directory use the local source instead"
        )
    return repo_id


def hub_cache_dir(hf_home: str | Path) -> Path:
    """huggingface_hub keeps its cache in $HF_HOME/hub unless HF_HUB_CACHE says otherwise; we never set that."""
    return Path(hf_home) / "hub"


def repo_storage_dir(hf_home: str | Path, repo_id: str) -> Path:
    return hub_cache_dir(hf_home) / "--".join(["models", *repo_id.split("/")])


def snapshot_dir(hf_home: str | Path, repo_id: str, commit: str) -> Path:
    return repo_storage_dir(hf_home, repo_id) / "snapshots" / commit


def ref_path(hf_home: str | Path, repo_id: str, branch: str = DEFAULT_REF_BRANCH) -> Path:
    return repo_storage_dir(hf_home, repo_id) / "refs" / branch


def write_ref(hf_home: str | Path, repo_id: str, commit: str, branch: str = DEFAULT_REF_BRANCH) -> bool:
    """Record `commit` as refs/<branch>, so the model resolves with HF_HUB_OFFLINE=1 and no revision given.

    huggingface_hub writes refs only when it was asked for a branch or tag; a download pinned to a commit leaves
    refs/main absent and an offline load without --revision then fails. Returns whether the file changed.
    """
    if not is_commit(commit):
        raise ModelInputError(f"an offline ref must name a 40-hex commit (got {commit!r})")
    path = ref_path(hf_home, repo_id, branch)
    try:
        if path.read_text() == commit:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, commit)
    return True


def resolve_offline(hf_home: str | Path, repo_id: str, revision: str | None) -> str | None:
    """The commit a revision resolves to from the cache alone, as huggingface_hub does offline (None: it doesn't)."""
    if is_commit(revision):
        return revision
    try:
        commit = ref_path(hf_home, repo_id, revision or DEFAULT_REF_BRANCH).read_text().strip()
    except FileNotFoundError:
        return None
    return commit if is_commit(commit) else None


# ---------------------------------------------------------------------------------------------------------------
# Download plan


@dataclasses.dataclass(frozen=True)
class DownloadPlan:
    repo_id: str
    revision: str | None
    hf_home: Path
    token_env: str
    token_set: bool
    max_workers: int = 8
    ref_branch: str = DEFAULT_REF_BRANCH

    @property
    def cache_dir(self) -> Path:
        return hub_cache_dir(self.hf_home)

    def environment(self) -> dict[str, str]:
        """Environment for the download process: online forced (the serving env says HF_HUB_OFFLINE=1)."""
        return {
            "HF_HOME": str(self.hf_home),
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DOWNLOAD_TIMEOUT": str(DOWNLOAD_TIMEOUT_S),
            "HF_HUB_ETAG_TIMEOUT": str(ETAG_TIMEOUT_S),
        }

    def download_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for huggingface_hub.snapshot_download, without the token.

        Resumable: huggingface_hub keeps partial blobs as *.incomplete and continues them unless force_download.
        """
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "cache_dir": str(self.cache_dir),
            "etag_timeout": ETAG_TIMEOUT_S,
            "force_download": False,
            "local_files_only": False,
            "max_workers": self.max_workers,
        }

    def describe(self) -> dict[str, Any]:
        """What `twinspark model plan` prints: everything but the token's value."""
        return {
            "repo_id": self.repo_id,
            "revision": self.revision or "(hub default branch, unpinned)",
            "pinned": is_commit(self.revision),
            "cache_dir": str(self.cache_dir),
            "offline_ref": str(ref_path(self.hf_home, self.repo_id, self.ref_branch)),
            "resumable": True,
            "environment": self.environment(),
            "token": f"from ${self.token_env} ({'set' if self.token_set else 'not set'})",
            "download_kwargs": self.download_kwargs(),
        }


def build_download_plan(
    repo_id: str,
    revision: str | None,
    hf_home: str | Path,
    environ: Mapping[str, str],
    token_env: str = DEFAULT_TOKEN_ENV,
    max_workers: int = 8,
    ref_branch: str = DEFAULT_REF_BRANCH,
) -> DownloadPlan:
    if max_workers < 1:
        raise ModelInputError(f"--max-workers must be at least 1 (got {max_workers})")
    if not str(hf_home).startswith("/"):
        raise ModelInputError(f"HF_HOME must be an absolute path (got {str(hf_home)!r})")
    return DownloadPlan(
        repo_id=check_repo_id(repo_id),
        revision=resolve_revision(revision),
        hf_home=Path(hf_home),
        token_env=token_env,
        token_set=bool(environ.get(token_env, "").strip()),
        max_workers=max_workers,
        ref_branch=ref_branch,
    )


# ---------------------------------------------------------------------------------------------------------------
# Disk space


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    """One file of a hub snapshot, from the hub's file metadata."""

    path: str
    size: int
    blob: str  # name of its blob in the cache: the LFS sha256, else the git blob id


def remote_files_from_info(info: Any) -> list[RemoteFile]:
    """Files of a huggingface_hub ModelInfo fetched with files_metadata=True."""
    files = []
    for sibling in info.siblings or []:
        lfs = sibling.lfs
        if lfs is not None:
            blob, size = lfs["sha256"], lfs["size"]
        else:
            blob, size = sibling.blob_id, sibling.size
        if size is None or blob is None:
            raise ModelRuntimeError(
                f"the hub returned no size for {sibling.rfilename}; the metadata call must ask for files_metadata"
            )
        files.append(RemoteFile(path=sibling.rfilename, size=int(size), blob=str(blob)))
    return files


def bytes_still_needed(files: Iterable[RemoteFile], blob_sizes: Mapping[str, int]) -> int:
    """Bytes the download must still write, given the sizes of blobs already in the cache.

    A complete blob costs nothing; an interrupted one (<blob>.incomplete) only its remainder. Identical files share
    one blob, so each blob is counted once.
    """
    needed = 0
    seen: set[str] = set()
    for remote in files:
        if remote.blob in seen:
            continue
        seen.add(remote.blob)
        if blob_sizes.get(remote.blob) == remote.size:
            continue
        partial = min(blob_sizes.get(remote.blob + ".incomplete", 0), remote.size)
        needed += remote.size - partial
    return needed


def cached_blob_sizes(hf_home: str | Path, repo_id: str) -> dict[str, int]:
    blobs = repo_storage_dir(hf_home, repo_id) / "blobs"
    try:
        return {entry.name: entry.stat().st_size for entry in os.scandir(blobs) if entry.is_file()}
    except FileNotFoundError:
        return {}


def free_bytes(path: str | Path) -> int:
    """Free bytes on the file system that will hold `path` (its nearest existing ancestor)."""
    probe = Path(path)
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def disk_space_problem(needed: int, free: int, reserve: int = DEFAULT_RESERVE_BYTES, where: str = "") -> str | None:
    """None when `needed` bytes fit in `free` leaving `reserve`; else the message to fail with (both numbers)."""
    if needed + reserve <= free:
        return None
    place = f" on {where}" if where else ""
    return (
        f"not enough disk{place}: the snapshot still needs {needed} bytes ({_human(needed)}) plus a reserve of "
        f"{reserve} bytes ({_human(reserve)}), but only {free} bytes ({_human(free)}) are free; free space or point "
        "HF_HOME (model_cache_hf_home) at a larger disk"
    )


def snapshot_metadata(api: Any, repo_id: str, revision: str | None, token: str | None) -> tuple[str, list[RemoteFile]]:
    """The commit a revision points at and its files, from the hub's metadata (one call, no download)."""
    info = api.model_info(repo_id, revision=revision, files_metadata=True, timeout=ETAG_TIMEOUT_S, token=token)
    return info.sha, remote_files_from_info(info)


# ---------------------------------------------------------------------------------------------------------------
# Manifest and verification


@dataclasses.dataclass(frozen=True)
class Problem:
    name: str
    kind: str  # missing | short | too long | unreadable header | checksum mismatch | offline ref
    detail: str = ""
    # The file that holds the bytes (a hub snapshot's entries are links into blobs/): what a repair must copy.
    path: str = ""

    def line(self) -> str:
        return f"{self.name}: {self.kind}" + (f" ({self.detail})" if self.detail else "")


@dataclasses.dataclass
class VerifyReport:
    directory: str
    shards: int
    files: int
    bytes: int
    checksums: bool
    problems: list[Problem]
    # The manifest the sizes and digests came from (None: none, shards checked against their own headers).
    manifest: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["ok"] = self.ok
        data["problem_names"] = [p.name for p in self.problems]
        data["summary"] = self.text().splitlines()
        return data

    def text(self) -> str:
        what = f"{self.shards} shard(s), {self.files} file(s), {_human(self.bytes)}"
        against = f" against {self.manifest}" if self.manifest else ""
        if self.ok:
            return f"{self.directory}: ok: {what}" + (", sha256 checked" if self.checksums else "") + against
        where = f" in {what}" if self.files else ""
        lines = [f"{self.directory}: {len(self.problems)} problem(s){where}{against}:"]
        lines += [f"  {p.line()}" for p in self.problems[:MAX_LISTED_PROBLEMS]]
        if len(self.problems) > MAX_LISTED_PROBLEMS:
            lines.append(f"  ... and {len(self.problems) - MAX_LISTED_PROBLEMS} more (--json lists all)")
        return "\n".join(lines)


def model_files(model_dir: str | Path) -> list[str]:
    """Relative paths of the files that make up a model directory (symlinks followed, as in a hub snapshot)."""
    root = Path(model_dir)
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel != MANIFEST_NAME:
                found.append(rel)
    return sorted(found)


def file_sha256(path: str | Path, chunk: int = 8 * 1024 * 1024) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def build_manifest(model_dir: str | Path, hasher: Callable[[Path], str] = file_sha256) -> dict[str, Any]:
    """Size and SHA-256 of every file, and the directory they were read from (on the node that fetched the model):
    a manifest kept outside the copy, at one path per node, must say which snapshot it describes."""
    root = Path(model_dir)
    files = {}
    for rel in model_files(root):
        path = root / rel
        files[rel] = {"size": path.stat().st_size, "sha256": hasher(path)}
    return {"format": MANIFEST_FORMAT, "directory": str(root), "files": files,
            "total_bytes": sum(f["size"] for f in files.values())}


def load_manifest(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise ModelInputError(f"manifest {path} does not exist; write it with `twinspark model manifest DIR`") from exc
    except json.JSONDecodeError as exc:
        raise ModelInputError(f"manifest {path} is not JSON ({exc}); write it again") from exc
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("files"), dict):
        raise ModelInputError(f"manifest {path} is not a format-{MANIFEST_FORMAT} twinspark manifest; write it again")
    return data


def describes(manifest: Mapping[str, Any], model_dir: str | Path) -> bool:
    """Whether a manifest was written for this directory. One written before manifests named their directory
    (format 1 without `directory`) lived inside the directory it describes, so it counts as this one's."""
    return manifest.get("directory", str(Path(model_dir))) == str(Path(model_dir))


def manifest_is_current(manifest: Mapping[str, Any], model_dir: str | Path, manifest_mtime: float) -> bool:
    """A manifest still describes a directory when it was written for it, the same files have the same sizes and
    none changed after it. (Two snapshots of one repository can hold the same names and sizes, and switching back to
    an older one finds blobs older than the manifest: the directory tells them apart.)"""
    if not describes(manifest, model_dir):
        return False
    root = Path(model_dir)
    names = model_files(root)
    if sorted(manifest["files"]) != names:
        return False
    for rel in names:
        stat = (root / rel).stat()
        if stat.st_size != manifest["files"][rel]["size"] or stat.st_mtime > manifest_mtime:
            return False
    return True


def shard_names(model_dir: str | Path) -> list[str]:
    """Shards a checkpoint needs: every file in the index's weight_map, or the single model.safetensors."""
    root = Path(model_dir)
    index = root / INDEX_NAME
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelRuntimeError(f"{index} has no readable weight_map ({exc}); copy the file again") from exc
        return sorted(set(weight_map.values()))
    if (root / SINGLE_SHARD_NAME).exists() or (root / SINGLE_SHARD_NAME).is_symlink():
        return [SINGLE_SHARD_NAME]
    raise ModelRuntimeError(
        f"{root} has neither {INDEX_NAME} nor {SINGLE_SHARD_NAME}: not a safetensors checkpoint (or not copied yet)"
    )


def safetensors_size(path: str | Path) -> int:
    """The size a safetensors file must have, from its own header: 8 + header length + end of the last tensor."""
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise ValueError("shorter than the 8-byte header length")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > MAX_SAFETENSORS_HEADER:
            raise ValueError(f"header length {header_len} is implausible")
        raw = handle.read(header_len)
    if len(raw) < header_len:
        raise ValueError(f"header cut off at {len(raw)} of {header_len} bytes")
    header = json.loads(raw)
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    return 8 + header_len + end


def verify_model_dir(
    model_dir: str | Path,
    manifest: Mapping[str, Any] | None = None,
    check_sha256: bool = False,
    hasher: Callable[[Path], str] = file_sha256,
) -> VerifyReport:
    """Every shard exists with its full size (from the manifest, else from its own header); with a manifest every
    other listed file too, and with check_sha256 every file's SHA-256 against the manifest."""
    root = Path(model_dir)
    if not root.is_dir():
        missing = Problem(str(root), "missing", "no such directory", str(root))
        return VerifyReport(str(root), 0, 0, 0, check_sha256, [missing])
    expected = dict(manifest["files"]) if manifest else {}
    try:
        shards = shard_names(root)
    except ModelRuntimeError as exc:
        if not expected:
            problem = Problem(str(root), "not a checkpoint", str(exc), str(root))
            return VerifyReport(str(root), 0, 0, 0, check_sha256, [problem])
        shards = []  # the index itself is reported below as a missing manifest entry
        index_problem = str(exc)
    else:
        index_problem = ""
    names = sorted(set(shards) | set(expected))
    problems: list[Problem] = []
    total = 0
    for name in names:
        path = root / name
        if not path.is_file():
            problems.append(Problem(name, "missing", path=os.path.realpath(path)))
            continue
        size = path.stat().st_size
        want = expected.get(name, {}).get("size")
        if want is None:
            try:
                want = safetensors_size(path)
            except (ValueError, OSError) as exc:
                problems.append(Problem(name, "unreadable header", str(exc), os.path.realpath(path)))
                continue
        if size != want:
            kind = "short" if size < want else "too long"
            problems.append(Problem(name, kind, f"{size} of {want} bytes", os.path.realpath(path)))
            continue
        total += size
        if check_sha256:
            want_sha = expected.get(name, {}).get("sha256")
            if want_sha and hasher(path) != want_sha:
                detail = "sha256 differs from the manifest"
                problems.append(Problem(name, "checksum mismatch", detail, os.path.realpath(path)))
    # The manifest already named what is missing (an empty copy lists every file, the single shard included): the
    # index is its own problem only when the manifest has one, or when nothing else explains the shards.
    if index_problem and not any(p.name == INDEX_NAME for p in problems) and (
            INDEX_NAME in expected or not problems):
        problems.append(Problem(INDEX_NAME, "unreadable", index_problem, str(root / INDEX_NAME)))
    return VerifyReport(str(root), len(shards), len(names), total, check_sha256, problems)


def check_offline_ref(hf_home: str | Path, repo_id: str, commit: str, branch: str) -> Problem | None:
    path = ref_path(hf_home, repo_id, branch)
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        detail = f"{path} is missing; `twinspark model fetch` writes it"
        return Problem(f"refs/{branch}", "offline ref", detail, str(path))
    if found != commit:
        detail = f"points at {found[:12]}, not the pinned {commit[:12]}"
        return Problem(f"refs/{branch}", "offline ref", detail, str(path))
    return None


# ---------------------------------------------------------------------------------------------------------------
# Edges: files and the hub


def _write_atomically(path: Path, text: str) -> None:
    atomic.write_atomic(path, text.encode("utf-8"), mode=0o644)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def write_manifest(model_dir: Path, output: Path | None) -> tuple[dict[str, Any], bool]:
    """Write (or reuse, when still current) the manifest; returns it and whether it was (re)written."""
    if output is not None and output.exists():
        try:
            current = load_manifest(output)
        except ModelInputError:
            current = None
        if current is not None and manifest_is_current(current, model_dir, output.stat().st_mtime):
            return current, False
    manifest = build_manifest(model_dir)
    if output is not None:
        _write_atomically(output, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest, True


def _token(plan: DownloadPlan) -> str | None:
    return os.environ.get(plan.token_env, "").strip() or None


def _import_hub(plan: DownloadPlan) -> Any:
    os.environ.update(plan.environment())
    try:
        # huggingface_hub: only in the serving runtime; its absence is named below.
        import huggingface_hub
    except ImportError as exc:
        raise ModelRuntimeError("huggingface_hub is not installed in this venv; install the runtime first") from exc
    return huggingface_hub


def fetch(plan: DownloadPlan, reserve: int, check_space: bool = True,
          manifest: Path | None = None) -> dict[str, Any]:
    """Download the snapshot (resuming), after checking the disk; write the offline ref. No hub call when a pinned
    snapshot is already complete (checked against `manifest`, the node's own, when it describes the snapshot)."""
    if is_commit(plan.revision):
        existing = snapshot_dir(plan.hf_home, plan.repo_id, plan.revision)
        if existing.is_dir() and _complete(existing, manifest):
            changed = write_ref(plan.hf_home, plan.repo_id, plan.revision, plan.ref_branch)
            return {"snapshot": str(existing), "commit": plan.revision, "downloaded": False, "changed": changed}
    hub = _import_hub(plan)
    token = _token(plan)
    commit = plan.revision
    needed = None
    if check_space:
        commit, files = snapshot_metadata(hub.HfApi(), plan.repo_id, plan.revision, token)
        needed = bytes_still_needed(files, cached_blob_sizes(plan.hf_home, plan.repo_id))
        problem = disk_space_problem(needed, free_bytes(plan.cache_dir), reserve, str(plan.cache_dir))
        if problem:
            raise ModelRuntimeError(problem)
    path = Path(hub.snapshot_download(**plan.download_kwargs(), token=token))
    commit = path.name
    write_ref(plan.hf_home, plan.repo_id, commit, plan.ref_branch)
    return {"snapshot": str(path), "commit": commit, "downloaded": needed != 0, "changed": True}


def _complete(directory: Path, manifest_path: Path | None = None) -> bool:
    """A snapshot is complete when it verifies against the node's manifest (when that one describes this snapshot),
    else against a manifest a previous release left inside it, else by its shards' own headers."""
    try:
        manifest = None
        if manifest_path is not None and manifest_path.exists():
            manifest = load_manifest(manifest_path)
            manifest = manifest if describes(manifest, directory) else None
        inside = directory / MANIFEST_NAME
        if manifest is None and inside.exists():
            manifest = load_manifest(inside)
        return verify_model_dir(directory, manifest).ok
    except (ModelRuntimeError, ModelInputError):
        return False


# ---------------------------------------------------------------------------------------------------------------
# CLI


def _plan_from_args(args: argparse.Namespace) -> DownloadPlan:
    return build_download_plan(
        repo_id=args.repo_id,
        revision=args.revision,
        hf_home=args.hf_home,
        environ=os.environ,
        token_env=args.token_env,
        max_workers=getattr(args, "max_workers", 8),
        ref_branch=args.ref_branch,
    )


def _print(data: Any, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=1, sort_keys=True) if as_json else text)


def cmd_plan(args: argparse.Namespace) -> int:
    plan = _plan_from_args(args)
    data = plan.describe()
    if args.check_space:
        hub = _import_hub(plan)
        commit, files = snapshot_metadata(hub.HfApi(), plan.repo_id, plan.revision, _token(plan))
        needed = bytes_still_needed(files, cached_blob_sizes(plan.hf_home, plan.repo_id))
        free = free_bytes(plan.cache_dir)
        data.update(commit=commit, snapshot_bytes=sum(f.size for f in files), needed_bytes=needed, free_bytes=free)
        data["space_problem"] = disk_space_problem(needed, free, args.reserve_bytes, str(plan.cache_dir))
    lines = [f"{key}: {value}" for key, value in data.items() if key != "download_kwargs"]
    _print(data, args.json, "\n".join(lines))
    return 1 if data.get("space_problem") else 0


def cmd_fetch(args: argparse.Namespace) -> int:
    plan = _plan_from_args(args)
    manifest = Path(args.manifest) if args.manifest else None
    result = fetch(plan, reserve=args.reserve_bytes, check_space=not args.skip_space_check, manifest=manifest)
    _print(result, args.json, f"{result['snapshot']} ({'changed' if result['changed'] else 'unchanged'})")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    ref_problem = None
    if args.directory:
        directory = Path(args.directory)
    else:
        check_repo_id(args.repo_id)
        revision = resolve_revision(args.revision)
        commit = resolve_offline(args.hf_home, args.repo_id, revision)
        if commit is None:
            ref = ref_path(args.hf_home, args.repo_id, revision or DEFAULT_REF_BRANCH)
            detail = f"{ref} is missing: {args.repo_id} does not resolve offline; run `twinspark model fetch`"
            problem = Problem(f"refs/{revision or DEFAULT_REF_BRANCH}", "offline ref", detail, str(ref))
            report = VerifyReport(str(repo_storage_dir(args.hf_home, args.repo_id)), 0, 0, 0, args.sha256, [problem])
            _print(report.as_dict(), args.json, report.text())
            return 1
        directory = snapshot_dir(args.hf_home, args.repo_id, commit)
        if is_commit(revision):
            ref_problem = check_offline_ref(args.hf_home, args.repo_id, commit, args.ref_branch)
    manifest_path = Path(args.manifest) if args.manifest else directory / MANIFEST_NAME
    manifest_problem = None
    if args.manifest and not manifest_path.exists():
        # The manifest named is the one to trust: without it the copy is not verified, whatever it holds itself.
        detail = "the manifest given with --manifest; role model_cache writes it, `twinspark model manifest` makes one"
        manifest_problem = Problem(f"manifest {manifest_path}", "missing", detail, str(manifest_path))
        manifest = None
    elif manifest_path.exists():
        manifest = load_manifest(manifest_path)
    elif args.sha256:
        raise ModelInputError(f"--sha256 needs a manifest: none given and {manifest_path} does not exist")
    else:
        manifest = None
    report = verify_model_dir(directory, manifest, check_sha256=args.sha256 and manifest is not None)
    report.manifest = str(manifest_path) if manifest is not None else None
    if manifest_problem:
        report.problems.insert(0, manifest_problem)
    if ref_problem:
        report.problems.append(ref_problem)
    _print(report.as_dict(), args.json, report.text())
    return 0 if report.ok else 1


def cmd_manifest(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    if not directory.is_dir():
        raise ModelInputError(f"{directory} is not a directory")
    output = Path(args.output) if args.output else None
    manifest, written = write_manifest(directory, output)
    if output is None:
        print(json.dumps(manifest, indent=1, sort_keys=True))
    else:
        state = "written" if written else "unchanged"
        print(json.dumps({"manifest": str(output), "state": state, "files": len(manifest["files"])}))
    return 0


def model_copies(models_dir: str | Path, hf_home: str | Path) -> dict[str, Path]:
    """Every model copy a node keeps: the local copies under `models_dir` (by their path) and the hub snapshots under
    HF_HOME (by their repository id)."""
    found: dict[str, Path] = {}
    local = Path(models_dir)
    if local.is_dir():
        for entry in sorted(local.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                found[str(entry)] = entry
    hub = hub_cache_dir(hf_home)
    if hub.is_dir():
        for entry in sorted(hub.iterdir()):
            parts = entry.name.split("--")
            if entry.is_dir() and not entry.is_symlink() and parts[0] == "models" and len(parts) == 3:
                found[f"{parts[1]}/{parts[2]}"] = entry
    return found


def kept_models(env_file: str | None, record_file: str | None, keep: Sequence[str]) -> list[str]:
    """The models `prune` keeps: the one serve.env names, the current and previous recipes' (the record role
    serve_env writes at each recipe switch), and every --keep."""
    kept = [str(name) for name in keep]
    if env_file:
        read = envfile.read_files([env_file])
        if read.refused:
            raise ModelInputError(f"--env: {read.refused[0]}")
        kept.append(read.values.get("MODEL", ""))
    if record_file and Path(record_file).exists():
        record = json.loads(Path(record_file).read_text())
        kept += [str((record.get(side) or {}).get("model") or "") for side in ("current", "previous")]
    return [name.rstrip("/") for name in dict.fromkeys(kept) if name]


def prune(models_dir: str | Path, hf_home: str | Path, kept: Sequence[str], apply: bool) -> dict[str, Any]:
    """Remove (with `apply`; else only list) every model copy that is not kept."""
    if not kept:
        raise ModelInputError("nothing to keep: give --env (the serve.env naming the model that serves) or --keep; "
                              "prune never removes every copy")
    copies = model_copies(models_dir, hf_home)
    removed = [name for name in copies if name not in kept]
    freed = 0
    for name in removed:
        path = copies[name]
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
        freed += size
        if apply:
            shutil.rmtree(path)
    return {"kept": [name for name in copies if name in kept], "removed": removed, "freed_bytes": freed,
            "applied": apply, "changed": bool(apply and removed)}


def cmd_prune(args: argparse.Namespace) -> int:
    result = prune(args.models_dir, args.hf_home, kept_models(args.env, args.record, args.keep or ()), args.apply)
    verb = "removed" if args.apply else "would remove (run again with --apply)"
    text = "\n".join([f"kept: {name}" for name in result["kept"]]
                     + [f"{verb}: {name}" for name in result["removed"]]
                     + [f"{_human(result['freed_bytes'])} {'freed' if args.apply else 'to free'}"])
    _print(result, args.json, text)
    return 0


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ModelInputError as exc:
            print(f"twinspark model: {exc}", file=sys.stderr)
            return 2
        except ModelRuntimeError as exc:
            print(f"twinspark model: {exc}", file=sys.stderr)
            return 1

    return run


def _add_hub_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo-id", default=PINNED_REPO_ID, help="hub repository (default: %(default)s)")
    parser.add_argument(
        "--revision",
        default=None,
        help=f"commit, branch or tag; unset pins to {PINNED_REVISION}, '' follows the default branch",
    )
    parser.add_argument("--hf-home", default=os.environ.get("HF_HOME", DEFAULT_HF_HOME), help="HF_HOME (%(default)s)")
    parser.add_argument("--ref-branch", default=DEFAULT_REF_BRANCH, help="refs/<branch> written for offline use")
    parser.add_argument("--token-env", default=DEFAULT_TOKEN_ENV, help="variable holding the hub token (never printed)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="fetch, verify and describe model weights")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    plan = verbs.add_parser("plan", help="print the download plan; --check-space asks the hub for the snapshot size")
    _add_hub_args(plan)
    plan.add_argument("--check-space", action="store_true", help="compare the snapshot size with free disk")
    plan.add_argument("--reserve-bytes", type=int, default=DEFAULT_RESERVE_BYTES)
    plan.set_defaults(func=_guarded(cmd_plan))

    fetch_parser = verbs.add_parser("fetch", help="download the snapshot into HF_HOME (resumable) and write refs")
    _add_hub_args(fetch_parser)
    fetch_parser.add_argument("--max-workers", type=int, default=8)
    fetch_parser.add_argument("--reserve-bytes", type=int, default=DEFAULT_RESERVE_BYTES)
    fetch_parser.add_argument("--skip-space-check", action="store_true", help="do not ask the hub for file sizes")
    fetch_parser.add_argument("--manifest", help="this node's manifest: a pinned snapshot it describes and matches "
                              "needs no hub call")
    fetch_parser.set_defaults(func=_guarded(cmd_fetch))

    verify = verbs.add_parser("verify", help="check every shard of a model directory or cached snapshot")
    verify.add_argument("directory", nargs="?", help="model directory (default: resolve the hub cache offline)")
    _add_hub_args(verify)
    verify.add_argument("--manifest", help="manifest to check against, never the copy's own; missing, it is a problem "
                        f"(default: DIR/{MANIFEST_NAME} if present, which whoever writes the copy also writes)")
    verify.add_argument("--sha256", action="store_true", help="also compare SHA-256 with the manifest (reads all)")
    verify.set_defaults(func=_guarded(cmd_verify))

    pruner = verbs.add_parser("prune", help="remove model copies no recipe here serves or goes back to (lists "
                              "them unless --apply)")
    pruner.add_argument("--models-dir", default="/var/lib/twinspark/models", help="local copies (%(default)s)")
    pruner.add_argument("--hf-home", default=os.environ.get("HF_HOME", DEFAULT_HF_HOME), help="HF_HOME (%(default)s)")
    pruner.add_argument("--env", help="serve.env: its MODEL is kept")
    pruner.add_argument("--record", help="the recipe switch record (/var/lib/twinspark/recipes.json): the current "
                        "and previous recipes' models are kept")
    pruner.add_argument("--keep", action="append", help="also keep this model (path or repository id; repeatable)")
    pruner.add_argument("--apply", action="store_true", help="remove (default: only list what would go)")
    pruner.add_argument("--json", action="store_true")
    pruner.set_defaults(func=_guarded(cmd_prune))

    manifest = verbs.add_parser("manifest", help="size and SHA-256 of every file in a model directory")
    manifest.add_argument("directory")
    manifest.add_argument("--output", help="write here (kept when it still matches the directory) instead of stdout")
    manifest.set_defaults(func=_guarded(cmd_manifest))
