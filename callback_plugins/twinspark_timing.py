"""Where a playbook run spends its time: per play and per phase at the end of the run, and as JSON lines on request.

Off unless enabled (`ANSIBLE_CALLBACKS_ENABLED=twinspark_timing`: scripts/sim/demo, the molecule scenarios,
scripts/bench/rerun-profile). Enabled, it prints at the end of the run the time per play (with the stage playbook
it comes from) and per phase, the phases a person waits through when bringing up a pair (STAGE_PHASES). Two files
on request, each appended to:

- $TWINSPARK_PHASE_TIMES: one line per phase, `{"phase": "runtime", "seconds": 250.1}`; scripts/sim/demo adds the
  harness and the first chat to it and keeps it for scripts/bench/yardstick.
- $TWINSPARK_TASK_TIMES: one line per task,
  `{"play": "...", "role": "spark_fabric", "task": "...", "seconds": 0.41, "hosts": {"node1": "ok", ...}}`,
  where `seconds` runs from the task's start to the next task's start (or the end of the run), so the lines add up
  to the run's wall time minus the playbook's own parsing, and `hosts` holds each host's last outcome (ok, changed,
  skipped, failed, ignored, unreachable). scripts/bench/rerun-profile reads it to rank the slow tasks of a re-run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: twinspark_timing
    type: aggregate
    short_description: time per play and per phase of a run; per phase and per task as JSON lines on request
    description:
      - Prints the wall time of every play and its sum per phase (packages, runtime, model, service ready) at the
        end of the run.
      - With TWINSPARK_PHASE_TIMES set, appends one JSON line per phase to that file.
      - With TWINSPARK_TASK_TIMES set, appends one JSON line per task (its wall time, every host's outcome) to that
        file, for profiling re-runs.
    requirements:
      - enabled with ANSIBLE_CALLBACKS_ENABLED=twinspark_timing (or callbacks_enabled)
"""

TASK_TIMES_ENV = "TWINSPARK_TASK_TIMES"
PHASE_TIMES_ENV = "TWINSPARK_PHASE_TIMES"

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


def task_line(play: str, role: str, task: str, seconds: float, hosts: dict[str, str]) -> str:
    """One task's record, as the file holds it."""
    return json.dumps({"play": play, "role": role, "task": task, "seconds": round(seconds, 3),
                       "hosts": dict(sorted(hosts.items()))})


def phase_seconds(plays: list[dict]) -> dict[str, float]:
    """Each phase's seconds, summed over its plays, in the order the phases first ran."""
    phases: dict[str, float] = {}
    for play in plays:
        phases[play["phase"]] = round(phases.get(play["phase"], 0.0) + play["seconds"], 1)
    return phases


def summary_lines(plays: list[dict], phases: dict[str, float]) -> list[str]:
    """The table printed at the end of the run."""
    lines = ["", "time per play:"]
    lines += [f"  {p['seconds']:8.1f} s  {p['stage']:<10} {p['play']}" for p in plays]
    lines += ["time per phase:"]
    lines += [f"  {seconds:8.1f} s  {phase}" for phase, seconds in phases.items()]
    return lines


def play_stage(play) -> str:
    """The stage playbook a play comes from (its file's stem), else the play's name."""
    try:
        # ansible-core's only record of the file a play came from; absent in other versions, then the name is used.
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
    CALLBACK_NAME = "twinspark_timing"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._play_name = ""
        self._plays: list[dict] = []
        self._play: dict | None = None
        self._task: tuple[str, str, float] | None = None
        self._hosts: dict[str, str] = {}
        path = os.environ.get(TASK_TIMES_ENV, "")
        self._tasks_out = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 - held for the run

    def _close_task(self) -> None:
        if self._task is None or self._tasks_out is None:
            return
        role, task, started = self._task
        self._tasks_out.write(task_line(self._play_name, role, task, time.monotonic() - started, self._hosts) + "\n")
        self._tasks_out.flush()
        self._task = None
        self._hosts = {}

    def _open_task(self, task) -> None:
        self._close_task()
        role = task._role.get_name(include_role_fqcn=False) if getattr(task, "_role", None) else ""
        name = (task.name or "").strip() or str(task.action)  # the task's own name, without the role's prefix
        self._task = (role, name, time.monotonic())

    def _close_play(self) -> None:
        if self._play is not None:
            self._play["seconds"] = round(time.monotonic() - self._play.pop("started"), 1)
            self._plays.append(self._play)
            self._play = None

    def v2_playbook_on_play_start(self, play) -> None:
        self._close_task()
        self._close_play()
        self._play_name = play.get_name().strip()
        stage = play_stage(play)
        self._play = {"play": play.get_name(), "stage": stage, "phase": STAGE_PHASES.get(stage, stage),
                      "started": time.monotonic()}

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self._open_task(task)

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self._open_task(task)

    def _outcome(self, result, outcome: str) -> None:
        self._hosts[result._host.get_name()] = outcome

    def v2_runner_on_ok(self, result) -> None:
        self._outcome(result, "changed" if result._result.get("changed") else "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False) -> None:
        self._outcome(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result) -> None:
        self._outcome(result, "skipped")

    def v2_runner_on_unreachable(self, result) -> None:
        self._outcome(result, "unreachable")

    def v2_playbook_on_stats(self, stats) -> None:
        self._close_task()
        if self._tasks_out is not None:
            self._tasks_out.close()
            self._tasks_out = None
        self._close_play()
        phases = phase_seconds(self._plays)
        self._display.display("\n".join(summary_lines(self._plays, phases)))
        target = os.environ.get(PHASE_TIMES_ENV)
        if target:
            with open(target, "a", encoding="utf-8") as out:
                out.writelines(json.dumps({"phase": phase, "seconds": seconds}) + "\n"
                               for phase, seconds in phases.items())
