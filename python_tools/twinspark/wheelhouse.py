"""The `fork` runtime flavour's wheelhouse: the inventory's wheel list, checked, and pip's hash-pinned requirements.

The inventory lists every wheel of the operator-built runtime with its sha256 (`vllm_runtime_fork_wheels`, a list
of `{file: NAME.whl, sha256: HEX}`). From that list the vllm_runtime role renders a requirements file with one
`name==version --hash=sha256:...` entry per distribution, and installs it with
`pip install --no-index --find-links WHEELHOUSE --require-hashes -r requirements.txt`: pip then installs nothing
unless every wheel it would install is listed and matches its hash. Before pip runs, the role hashes the wheels on
the node and compares them with these pins itself (`hash_mismatches`), so the failure names the wheel and both
hashes in one line.

Pure functions; the filters in filter_plugins/twinspark_wheelhouse.py adapt them to Ansible.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

VARIABLE = "vllm_runtime_fork_wheels"
VLLM = "vllm"
_SHA256 = re.compile(r"[0-9a-f]{64}")
# PEP 427: {distribution}-{version}(-{build tag})?-{python tag}-{abi tag}-{platform tag}.whl
_WHEEL = re.compile(
    r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?)-(?P<version>[A-Za-z0-9_.!+]+)"
    r"(?:-(?P<build>\d[A-Za-z0-9_.]*))?-(?P<py>[A-Za-z0-9_.]+)-(?P<abi>[A-Za-z0-9_.]+)-(?P<plat>[A-Za-z0-9_.]+)\.whl"
)


def normalise_name(name: str) -> str:
    """PEP 503 name: lower case, runs of '-', '_' and '.' become one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(filename: str) -> tuple[str, str]:
    """('vllm', '0.33.0+fork.1') from 'vllm-0.33.0+fork.1-cp312-cp312-linux_aarch64.whl'; ValueError otherwise."""
    match = _WHEEL.fullmatch(filename)
    if not match:
        raise ValueError(f"{filename!r} is not a wheel file name (NAME-VERSION-PYTHON-ABI-PLATFORM.whl)")
    return normalise_name(match["name"]), match["version"].replace("_", "-")


def problems(wheels: object, variable: str = VARIABLE) -> list[str]:
    """What is wrong with the inventory's wheel list, one line each, naming the variable and the fix."""
    if not isinstance(wheels, list) or not wheels:
        return [f"{variable} must be a non-empty list of {{file: NAME.whl, sha256: HEX}}, one per wheel of the "
                "fork's wheelhouse (sha256sum *.whl prints both)"]
    found: list[str] = []
    seen: set[str] = set()
    vllm_wheels = 0
    for index, entry in enumerate(wheels):
        where = f"{variable}[{index}]"
        if not isinstance(entry, Mapping) or set(entry) != {"file", "sha256"}:
            found.append(f"{where} must be a mapping with exactly the keys file and sha256")
            continue
        file, sha256 = entry["file"], entry["sha256"]
        if not isinstance(file, str) or "/" in file or not file.endswith(".whl"):
            found.append(f"{where}.file must be a wheel's file name inside the wheelhouse (NAME.whl, no directory)")
            continue
        try:
            name, _ = wheel_name_version(file)
        except ValueError as exc:
            found.append(f"{where}.file: {exc}")
            continue
        if file in seen:
            found.append(f"{where}.file: {file} is listed twice; list each wheel once")
        seen.add(file)
        vllm_wheels += name == VLLM
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            found.append(f"{where}.sha256 must be the wheel's sha256 as 64 lower-case hex digits "
                         f"(`sha256sum {file}`), not a placeholder")
    if not found and vllm_wheels != 1:
        found.append(f"{variable} must list exactly one vllm wheel (the fork's own build), found {vllm_wheels}")
    return found


def runtime(wheels: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The fork's vLLM as the role and `twinspark patch` name it: {distribution, version, target}."""
    for entry in wheels:
        try:
            name, version = wheel_name_version(str(entry.get("file", "")))
        except (ValueError, AttributeError):
            continue
        if name == VLLM:
            return {"distribution": name, "version": version, "target": f"{name}-{version}"}
    return {"distribution": VLLM, "version": "", "target": ""}


def requirements(wheels: Iterable[Mapping[str, str]]) -> str:
    """pip's hash-checking requirements: one pinned entry per distribution, every listed wheel's hash on it."""
    pinned: dict[tuple[str, str], list[str]] = {}
    for entry in wheels:
        key = wheel_name_version(entry["file"])
        pinned.setdefault(key, [])
        if entry["sha256"] not in pinned[key]:
            pinned[key].append(entry["sha256"])
    lines = ["# Rendered by the vllm_runtime role from vllm_runtime_fork_wheels; install with",
             "# pip install --no-index --find-links WHEELHOUSE --require-hashes -r THIS_FILE"]
    for (name, version), hashes in sorted(pinned.items()):
        entry = [f"{name}=={version}"] + [f"    --hash=sha256:{digest}" for digest in sorted(hashes)]
        lines.append(" \\\n".join(entry))
    return "\n".join(lines) + "\n"


def differing(pins: Iterable[tuple[str, str]], found: Mapping[str, str | None]) -> list[tuple[str, str, str | None]]:
    """(file, pinned sha256, found sha256 or None when missing) for each pinned wheel the wheelhouse does not hold as
    pinned; `found` maps file -> sha256. The one rule the fork's pins and the stock runtime's locks are checked by."""
    result = []
    for file, pinned in pins:
        actual = found.get(file)
        if actual is None or actual.lower() != pinned.lower():
            result.append((file, pinned, actual.lower() if actual else None))
    return result


def hash_mismatches(wheels: Iterable[Mapping[str, str]], found: Mapping[str, str | None], wheelhouse: str) -> list[str]:
    """One line per wheel whose file is missing or whose sha256 is not the pinned one; `found` maps file -> sha256."""
    result = []
    for file, pinned, actual in differing(((entry["file"], entry["sha256"]) for entry in wheels), found):
        if actual is None:
            result.append(f"{wheelhouse}/{file}: missing; copy the fork's wheel there, or take it out of {VARIABLE}")
        else:
            result.append(f"{wheelhouse}/{file}: sha256 is {actual}, {VARIABLE} pins {pinned}; the wheel "
                          "changed since it was pinned: rebuild or recopy it, or pin the new hash on purpose")
    return result
