"""Ansible's default output, except that a task polling with `until`/`retries` prints one progress line per poll.

The default callback prints every poll of a waiting task as `FAILED - RETRYING: ... (N retries left)`, which reads
as an error to anyone new to Ansible although nothing failed: the task is waiting, as designed. This callback says
what it waits for, how long it has waited and how long it may wait, and the command's own last line (for
`twinspark pair check`: why the pair is not serving yet), e.g.

    waiting [node1]: Wait until both ranks serve ... - 40 s of 600 s (poll 4 of 60): starting: head active 31 s

Everything else is the default callback's. Selected in ansible.cfg (`stdout_callback = twinspark_progress`).
"""

from __future__ import annotations

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

DOCUMENTATION = """
    name: twinspark_progress
    type: stdout
    short_description: default output with one readable progress line per poll of a waiting task
    description:
      - >-
        The default stdout callback, except that each retry of a task with until/retries prints one line
        (waiting, host, task, elapsed and limit in seconds, poll number, the command's last output line)
        instead of FAILED - RETRYING.
    extends_documentation_fragment:
      - default_callback
      - result_format_callback
    requirements:
      - set as stdout callback in configuration
"""

LAST_LINE_LIMIT = 160


def progress_line(host: str, task: str, attempts: int, retries: int, delay: float, last_output: str) -> str:
    """One poll of a waiting task, in words: what, how long so far, how long at most, and why not yet."""
    elapsed = round(attempts * delay)
    limit = round(retries * delay)
    line = f"waiting [{host}]: {task} - {elapsed} s of {limit} s (poll {attempts} of {retries})"
    last = last_output.strip().splitlines()[-1].strip() if last_output.strip() else ""
    if last:
        line += ": " + (last if len(last) <= LAST_LINE_LIMIT else last[:LAST_LINE_LIMIT - 3] + "...")
    return line


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "twinspark_progress"

    def v2_runner_retry(self, result) -> None:
        outcome = result.result
        task = result.task_name or str(result.task)
        delay = float(getattr(result.task, "delay", 0) or 0)
        last = str(outcome.get("stdout") or outcome.get("msg") or "")
        line = progress_line(self.host_label(result), task, int(outcome.get("attempts") or 0),
                             int(outcome.get("retries") or 0), delay, last)
        self._display.display(line, color=C.COLOR_SKIP)
