"""Ansible callback: how long each stage of site.yml took, as the phases a person waits through.

Enabled by scripts/sim/demo (ANSIBLE_CALLBACK_PLUGINS / ANSIBLE_CALLBACKS_ENABLED); prints a table at the end of
the run and, when TWINSPARK_PHASE_TIMES is set, writes the same figures there as JSON lines so the demo can add
the harness and the health check to one summary.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: twinspark_phase_timer
    type: aggregate
    short_description: time per site.yml stage, grouped into the phases of bringing up a pair
    description:
      - Records the wall time of every play and sums it per phase (packages, runtime, model, service ready).
    requirements:
      - enabled with ANSIBLE_CALLBACKS_ENABLED=twinspark_phase_timer
"""

# Stage playbook (playbooks/<stage>.yml) -> the phase it belongs to; a stage not listed is its own phase.
STAGE_PHASES = {
    "validate": "packages",
    "drivers": "packages",
    "fabric": "packages",
    "runtime": "runtime",
    "model": "model",
    "serve_env": "service ready",
    "serve": "service ready",
    "health": "service ready",
}


def play_stage(play) -> str:
    """The stage playbook a play comes from (its file's stem), else the play's name."""
    try:
        from ansible._internal._datatag._tags import Origin

        origin = Origin.get_tag(play._ds)
        if origin is not None and origin.path:
            return Path(origin.path).stem
    except (ImportError, AttributeError):
        pass
    return play.get_name()


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "twinspark_phase_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._plays: list[dict] = []
        self._current: dict | None = None

    def _close_current(self) -> None:
        if self._current is not None:
            self._current["seconds"] = round(time.monotonic() - self._current.pop("started"), 1)
            self._plays.append(self._current)
            self._current = None

    def v2_playbook_on_play_start(self, play):
        self._close_current()
        stage = play_stage(play)
        self._current = {
            "play": play.get_name(),
            "stage": stage,
            "phase": STAGE_PHASES.get(stage, stage),
            "started": time.monotonic(),
        }

    def v2_playbook_on_stats(self, stats):
        self._close_current()
        phases: dict[str, float] = {}
        for play in self._plays:
            phases[play["phase"]] = round(phases.get(play["phase"], 0.0) + play["seconds"], 1)
        lines = ["", "time per play:"]
        lines += [f"  {p['seconds']:8.1f} s  {p['stage']:<10} {p['play']}" for p in self._plays]
        lines += ["time per phase:"]
        lines += [f"  {seconds:8.1f} s  {phase}" for phase, seconds in phases.items()]
        self._display.display("\n".join(lines))
        target = os.environ.get("TWINSPARK_PHASE_TIMES")
        if target:
            with open(target, "a", encoding="utf-8") as out:
                out.writelines(
                    json.dumps({"phase": phase, "seconds": seconds}) + "\n" for phase, seconds in phases.items()
                )
