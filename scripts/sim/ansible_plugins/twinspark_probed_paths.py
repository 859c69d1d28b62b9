"""Record every path the roles' twinspark_probe tasks declare, per host, as the probe saw it (for `make sim-drift`).

Each role reads what it manages in one `twinspark_probe` call; the `paths` it passes (returned as `managed`) are the
files, directories and links it converges; what it only reads it passes as `reads`, which this callback leaves out.
Enabled only by scripts/sim/chaos.py's drift-every fault (ANSIBLE_CALLBACKS_ENABLED and ANSIBLE_CALLBACK_PLUGINS),
this callback keeps, for each host, each declared path with what the probe read (mode,
owner, group, kind, checksum or link target) and writes them as JSON to $TWINSPARK_PROBED_PATHS at the end of the run.
A path declared by several roles is kept once (the first reading).
"""

from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: twinspark_probed_paths
type: aggregate
short_description: write the paths every twinspark_probe task declared, per host, to $TWINSPARK_PROBED_PATHS
requirements: [enabled in ANSIBLE_CALLBACKS_ENABLED]
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "twinspark_probed_paths"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, dict[str, dict]] = {}

    def v2_runner_on_ok(self, result) -> None:
        if result._task.action.split(".")[-1] != "twinspark_probe":
            return
        declared = result._result.get("managed") or []  # `paths` as given: never `reads` nor the entries of `dirs`
        read = result._result.get("paths") or {}
        host = self.seen.setdefault(result._host.get_name(), {})
        for path in declared:
            if path in read:
                host.setdefault(path, {**read[path], "task": result._task.get_name()})

    def v2_playbook_on_stats(self, stats) -> None:
        target = os.environ.get("TWINSPARK_PROBED_PATHS")
        if target:
            with open(target, "w", encoding="utf-8") as handle:
                json.dump(self.seen, handle, indent=1, sort_keys=True)
