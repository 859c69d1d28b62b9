"""Resolve the wheel set an install would take and print pip's installation report (JSON) on stdout.

    usage: resolve-wheels.py CACHE_DIR PIP_INSTALL_ARGUMENT...

Run by the vllm_runtime role with the resolver venv's Python (tasks/identity.yml). That venv is made without pip
(`python3 -m venv --without-pip`, seconds faster on a fresh node): when this interpreter cannot import pip, pip runs
from the wheel the distribution keeps for ensurepip (Debian and Ubuntu: /usr/share/python-wheels, python3-pip-whl;
elsewhere ensurepip/_bundled). pip's resolution of vLLM's wheel set
takes seconds on every run although the answer only changes with the wheelhouse, so when the source is a wheelhouse
(`--no-index --find-links DIR`) the report is kept in CACHE_DIR, keyed by pip's version, the arguments and every
wheelhouse entry's name, size and modification time: any change there resolves again. An index source is never
cached (its answer can change without anything here changing). Standard library only; reads and resolves, installs
nothing.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

PIP_INSTALL = ["install", "--disable-pip-version-check", "--no-input", "--quiet", "--dry-run", "--ignore-installed",
               "--report", "-"]
# Where distributions keep the pip wheel ensurepip installs from: Debian's and Ubuntu's python3-pip-whl first.
WHEEL_DIRS = ["/usr/share/python-wheels"]


def _version_key(wheel: str) -> tuple[int, ...]:
    """pip-23.0.1-py3-none-any.whl -> (23, 0, 1): newer sorts later (pip-9 before pip-23, unlike by name)."""
    parts = os.path.basename(wheel).split("-")[1].split(".")
    return tuple(int(part) if part.isdigit() else -1 for part in parts)


def bundled_pip_wheels() -> list[str]:
    """The pip wheels ensurepip would install, from the first place that has any (the distribution's own first),
    oldest to newest version; empty when there is none."""
    directories = list(WHEEL_DIRS)
    spec = importlib.util.find_spec("ensurepip")
    if spec is not None and spec.submodule_search_locations:
        directories += [os.path.join(location, "_bundled") for location in spec.submodule_search_locations]
    for directory in directories:
        found = glob.glob(os.path.join(directory, "pip-*-py3-none-any.whl"))
        if found:
            return sorted(found, key=_version_key)
    return []


def pip_runner() -> tuple[list[str], str, str | None]:
    """(the command that runs pip, pip's version, the wheel it runs from): this interpreter's own pip (no wheel),
    else pip straight from its wheel."""
    try:
        return [sys.executable, "-m", "pip"], importlib.metadata.version("pip"), None
    except importlib.metadata.PackageNotFoundError:
        pass
    wheels = bundled_pip_wheels()
    if not wheels:
        raise LookupError(f"{sys.executable} has no pip and no pip wheel was found in {', '.join(WHEEL_DIRS)} or "
                          "ensurepip/_bundled: install python3-venv (python3-pip-whl), or pip into this venv")
    wheel = wheels[-1]
    return [sys.executable, os.path.join(wheel, "pip")], os.path.basename(wheel).split("-")[1], wheel


def with_pip_wheel(report_text: str, wheel: str | None) -> str:
    """pip's report with the pip wheel this run used added as `twinspark_pip_wheel` (null: the venv's own pip): the
    role installs the runtime with the same pip, without a pip of the venv's own first (tasks/stage.yml)."""
    report = json.loads(report_text)
    report["twinspark_pip_wheel"] = wheel
    return json.dumps(report)


def wheelhouses(args: list[str]) -> list[str] | None:
    """The --find-links directories when pip may not reach an index, else None (nothing safe to cache)."""
    if "--no-index" not in args:
        return None
    found = [args[index + 1] for index, arg in enumerate(args[:-1]) if arg == "--find-links"]
    return found or None


def listing(directory: str) -> list[list[object]]:
    entries = []
    with os.scandir(directory) as scan:
        for entry in scan:
            info = entry.stat(follow_symlinks=True)
            entries.append([entry.name, info.st_size, info.st_mtime_ns])
    return sorted(entries)


def cache_key(args: list[str], directories: list[str], pip_version: str) -> str:
    material = {"python": sys.executable, "pip": pip_version, "args": args,
                "wheelhouses": {directory: listing(directory) for directory in directories}}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def write_atomically(path: str, text: str) -> None:
    directory = os.path.dirname(path)
    handle, scratch = tempfile.mkstemp(dir=directory, prefix=".resolve-")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(scratch, path)
    except BaseException:
        os.unlink(scratch)
        raise


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: resolve-wheels.py CACHE_DIR PIP_INSTALL_ARGUMENT...", file=sys.stderr)
        return 2
    cache_dir, args = argv[0], argv[1:]
    try:
        pip, pip_version, pip_wheel = pip_runner()
    except LookupError as error:
        print(f"resolve-wheels.py: {error}", file=sys.stderr)
        return 1
    directories = wheelhouses(args)
    cached = None
    if directories is not None:
        try:
            cached = os.path.join(cache_dir, f"resolve-{cache_key(args, directories, pip_version)}.json")
        except OSError as error:  # an unreadable wheelhouse: let pip say what is wrong with it
            print(f"resolve-wheels.py: not caching: {error}", file=sys.stderr)
        if cached and os.path.isfile(cached):
            with open(cached) as stream:
                sys.stdout.write(with_pip_wheel(stream.read(), pip_wheel))
            return 0
    completed = subprocess.run(pip + PIP_INSTALL + args, capture_output=True, text=True, check=False)
    sys.stderr.write(completed.stderr)
    if completed.returncode != 0:
        return completed.returncode
    try:
        json.loads(completed.stdout)
    except ValueError:
        print("resolve-wheels.py: pip's report is not JSON", file=sys.stderr)
        return 1
    if cached:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        for name in os.listdir(cache_dir):
            if name.startswith("resolve-") and name.endswith(".json"):
                os.unlink(os.path.join(cache_dir, name))
        write_atomically(cached, completed.stdout)
    sys.stdout.write(with_pip_wheel(completed.stdout, pip_wheel))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
