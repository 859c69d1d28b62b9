"""What a node's serving runtime is, in the terms the two nodes must agree on.

`twinspark runtime facts [--json]` reports the installed vLLM (distribution and version), torch, the patch status
and a digest of the installed `twinspark` package (its files' content, not its version number, so a rebuilt package
with the same version still counts as different). The vllm_runtime role compares these between the two nodes.
It reads installed metadata only: it imports neither vLLM nor torch.

Exit codes: 0 the report was produced (whatever it says); 2 invalid input.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as metadata
import json
import os
import sys
import sysconfig
from collections.abc import Callable, Iterable
from pathlib import Path

from twinspark import patching

PACKAGE = "twinspark"


def package_digest(files: Iterable[tuple[str, bytes]]) -> str:
    """SHA-256 over (relative path, content) pairs in path order; the same files give the same digest anywhere."""
    outer = hashlib.sha256()
    for path, content in sorted(files):
        outer.update(f"{path}\0{hashlib.sha256(content).hexdigest()}\n".encode())
    return outer.hexdigest()


def installed_files(distribution: metadata.Distribution) -> list[tuple[str, bytes]]:
    """The files the installer recorded with a hash (code and data; not RECORD itself, not bytecode)."""
    result = []
    for entry in distribution.files or []:
        if entry.hash is None or entry.suffix == ".pyc":
            continue
        result.append((str(entry), Path(distribution.locate_file(entry)).read_bytes()))
    return result


def _version(name: str, find: Callable[[str], metadata.Distribution]) -> str | None:
    try:
        return find(name).version
    except metadata.PackageNotFoundError:
        return None


def facts(
    site_packages: Path,
    patches_dir: Path,
    find: Callable[[str], metadata.Distribution],
    only: list[str] | None = None,
) -> dict:
    vllm = {name: version for name in patching.DISTRIBUTIONS if (version := _version(name, find))}
    try:
        package = package_digest(installed_files(find(PACKAGE)))
    except metadata.PackageNotFoundError:
        package = None
    try:
        outcome = patching.run("status", site_packages, patches_dir, only)
        patches = {state.patch.name: state.state for state in outcome.states}
        patch_error = None
    except patching.PatchError as exc:
        patches, patch_error = {}, str(exc)
    return {
        "vllm": " ".join(f"{name}=={version}" for name, version in sorted(vllm.items())) or None,
        "torch": _version("torch", find),
        "patches": patches,
        "patch_error": patch_error,
        "twinspark_version": _version(PACKAGE, find),
        "twinspark_digest": package,
        "python": ".".join(map(str, sys.version_info[:3])),
    }


def _command(args: argparse.Namespace) -> int:
    site_packages = Path(args.site_packages)
    if not site_packages.is_dir():
        print(f"twinspark runtime facts: --site-packages {site_packages} is not a directory", file=sys.stderr)
        return 2
    found = facts(site_packages, Path(args.patches_dir), lambda name: _find(name, site_packages), args.only)
    if args.json:
        print(json.dumps(found, indent=2, sort_keys=True))
    else:
        width = max(len(key) for key in found)
        for key, value in found.items():
            shown = ", ".join(f"{k}: {v}" for k, v in value.items()) if isinstance(value, dict) else value
            print(f"{key.ljust(width)}  {shown if shown not in (None, '') else '-'}")
    return 0


def _find(name: str, site_packages: Path) -> metadata.Distribution:
    for distribution in metadata.distributions(path=[str(site_packages)]):
        if (distribution.metadata["Name"] or "").lower().replace("_", "-") == name:
            return distribution
    raise metadata.PackageNotFoundError(name)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("runtime", help="report the installed serving runtime (vLLM, torch, patches)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    report = verbs.add_parser("facts", help=__doc__.splitlines()[0], description=__doc__)
    report.add_argument(
        "--site-packages",
        default=sysconfig.get_paths()["purelib"],
        help="site-packages of the serving venv (default: this interpreter's, %(default)s)",
    )
    report.add_argument(
        "--patches-dir",
        default=os.environ.get(patching.PATCHES_DIR_ENV, patching.DEFAULT_PATCHES_DIR),
        help=f"as for `twinspark patch` (default: ${patching.PATCHES_DIR_ENV} or {patching.DEFAULT_PATCHES_DIR})",
    )
    report.add_argument(
        "--only", action="append", metavar="NAME", help="as for `twinspark patch`: report these patches only"
    )
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.set_defaults(func=_command)
