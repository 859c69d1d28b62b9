"""Ansible filters over twinspark.wheelhouse: the fork flavour's pinned wheels, checked and rendered for pip.

The rules live in the Python package (python_tools/twinspark/wheelhouse.py); these filters only adapt Ansible's
variables to it. The package is imported from this checkout's python_tools/ when it is not installed on the
controller.
"""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))  # python_tools/ on sys.path

from twinspark import wheelhouse


def twinspark_fork_wheel_problems(wheels):
    """Lines naming what is wrong with vllm_runtime_fork_wheels; empty when it is usable."""
    return wheelhouse.problems(wheels)


def twinspark_fork_runtime(wheels):
    """{distribution, version, target} of the fork's vLLM wheel (empty version when there is none)."""
    return wheelhouse.runtime(wheels if isinstance(wheels, list) else [])


def twinspark_fork_requirements(wheels):
    """The hash-pinned requirements file pip installs the fork from."""
    return wheelhouse.requirements(wheels)


def twinspark_fork_hash_mismatches(wheels, stat_results, wheel_dir):
    """Lines naming each wheel that is missing or differs from its pin, from ansible.builtin.stat results
    (registered over a loop of the wheels, checksum_algorithm sha256)."""
    found = {}
    for result in stat_results:
        stat = result.get("stat", {})
        if stat.get("exists") and stat.get("isreg"):
            found[result["item"]["file"]] = stat.get("checksum")
    return wheelhouse.hash_mismatches(wheels, found, wheel_dir)


class FilterModule:
    def filters(self):
        return {
            "twinspark_fork_wheel_problems": twinspark_fork_wheel_problems,
            "twinspark_fork_runtime": twinspark_fork_runtime,
            "twinspark_fork_requirements": twinspark_fork_requirements,
            "twinspark_fork_hash_mismatches": twinspark_fork_hash_mismatches,
        }
