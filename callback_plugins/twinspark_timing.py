"""Where a playbook run spends its time: one JSON line per task, written to the file $TWINSPARK_TASK_TIMES names.

Off unless enabled (`ANSIBLE_CALLBACKS_ENABLED=twinspark_timing`) and the variable is set; it prints nothing and
changes no other output. Each line is

    {"play": "...", "role": "spark_fabric", "task": "...", "seconds": 0.41, "hosts": {"node1": "ok", ...}}

where `seconds` runs from the task's start to the next task's start (or the end of the run), so the lines add up to
the run's wall time minus the playbook's own parsing, and `hosts` holds each host's last outcome (ok, changed,
skipped, failed, unreachable). `scripts/bench/rerun-profile` reads it to rank the slow tasks of a converged re-run.
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: twinspark_timing
    type: aggregate
    short_description: one JSON line per task with its wall time, to the file TWINSPARK_TASK_TIMES names
    description:
      - >-
        Records each task's wall time (start to the next task's start) and every host's outcome as JSON lines,
        for profiling re-runs. Does nothing unless TWINSPARK_TASK_TIMES is set.
    requirements:
      - enable in configuration (callbacks_enabled) and set TWINSPARK_TASK_TIMES to a file path
"""

ENV = "TWINSPARK_TASK_TIMES"


def task_line(play: str, role: str, task: str, seconds: float, hosts: dict[str, str]) -> str:
    """One task's record, as the file holds it."""
    return json.dumps({"play": play, "role": role, "task": task, "seconds": round(seconds, 3),
                       "hosts": dict(sorted(hosts.items()))})


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "twinspark_timing"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._path = os.environ.get(ENV, "")
        self._play = ""
        self._current: tuple[str, str, float] | None = None
        self._hosts: dict[str, str] = {}
        self._out = None
        if self._path:
            self._out = open(self._path, "a", encoding="utf-8")  # noqa: SIM115 - held for the whole run

    def _close_task(self) -> None:
        if self._current is None or self._out is None:
            return
        role, task, started = self._current
        self._out.write(task_line(self._play, role, task, time.monotonic() - started, self._hosts) + "\n")
        self._out.flush()
        self._current = None
        self._hosts = {}

    def _open_task(self, task) -> None:
        self._close_task()
        role = task._role.get_name(include_role_fqcn=False) if getattr(task, "_role", None) else ""
        name = (task.name or "").strip() or str(task.action)  # the task's own name, without the role's prefix
        self._current = (role, name, time.monotonic())

    def v2_playbook_on_play_start(self, play) -> None:
        self._close_task()
        self._play = play.get_name().strip()

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
        if self._out is not None:
            self._out.close()
            self._out = None
