"""Ansible filters over twinspark.runtime_store: the content id of a runtime and the upgrade gate's decision.

The rules live in the Python package (python_tools/twinspark/runtime_store.py); these filters adapt Ansible's variables
to them. The patch set is read on the controller, where the filter runs (patches/<target>/).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

_TOOLS = Path(__file__).resolve().parents[1] / "python_tools"
if _TOOLS.is_dir() and str(_TOOLS) not in sys.path:
    sys.path.insert(0, str(_TOOLS))

from twinspark import runtime_store


def twinspark_runtime_wheels(source, flavour="stock"):
    """The wheel set: from pip's dry-run report (stock; JSON text or mapping), or the fork's pinned wheel list."""
    if flavour == "fork":
        from twinspark import wheelhouse

        found = {}
        for entry in source or []:
            name, version = wheelhouse.wheel_name_version(entry["file"])
            found[name] = f"{version} {entry['sha256']}"
        return found
    return runtime_store.wheel_set(json.loads(source) if isinstance(source, str) else source)


def twinspark_runtime_requirements(wheels, leave_out=()):
    """The requirements that install exactly the resolved wheel set (less leave_out) with pip --no-deps."""
    return runtime_store.install_requirements(wheels, leave_out)


def twinspark_runtime_id(wheels, distribution, version, patches_dir, twinspark_sha256):
    """'<distribution>-<version>-<12 hex>' from the wheel set, the patch set in patches_dir and the twinspark wheel."""
    return runtime_store.content_id(distribution, version, wheels, runtime_store.patch_set_digest(Path(patches_dir)),
                               twinspark_sha256)


def twinspark_upgrade_gate(answers, node_runtimes, expected, bench=None, recorded=None, min_fraction=None):
    """{ok, gate, reason}: the first failing gate (generation, agreement, bench) or ok."""
    def number(value):
        return None if value in (None, "") else float(value)

    result = runtime_store.gate_decision(dict(answers), dict(node_runtimes), expected, number(bench), number(recorded),
                                    number(min_fraction))
    return {"ok": result.ok, "gate": result.gate, "reason": result.reason}


class FilterModule:
    def filters(self):
        return {
            "twinspark_runtime_wheels": twinspark_runtime_wheels,
            "twinspark_runtime_id": twinspark_runtime_id,
            "twinspark_runtime_requirements": twinspark_runtime_requirements,
            "twinspark_upgrade_gate": twinspark_upgrade_gate,
        }
