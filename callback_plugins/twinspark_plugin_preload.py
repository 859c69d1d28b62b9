"""Load the filter and test plugins once, in ansible-playbook's own process, before any task runs.

Ansible runs every task of every host in a forked worker, and a worker loads the Jinja plugins afresh the first time a
template uses a filter or test: with this project's filters (filter_plugins/, which import the twinspark package)
that was most of each task's time on the controller, skipped tasks included (a tenth to a quarter of a second a task
on 2 cores). Loaded here first, the forks inherit them. Always on (no need to enable it), prints nothing, changes no
result; a failure to load is left for the task that uses the plugin to report, as without this callback.
"""

from __future__ import annotations

import contextlib

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

DOCUMENTATION = """
    name: twinspark_plugin_preload
    type: aggregate
    short_description: load the filter and test plugins once before the forks that run tasks
    description:
      - >-
        Loads every filter and test plugin in ansible-playbook's own process at each play and task start (a no-op
        once loaded), so the worker processes Ansible forks per task inherit them instead of loading them again.
"""


def preload() -> int:
    """Load the Jinja filter and test plugins (a no-op once loaded); how many were loaded."""
    count = 0
    for loader in (filter_loader, test_loader):
        # A broken plugin fails the task that uses it, with Ansible's own message: nothing to say here.
        with contextlib.suppress(Exception):
            count += sum(1 for _ in loader.all())
    return count


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "twinspark_plugin_preload"
    CALLBACK_NEEDS_ENABLED = False

    def v2_playbook_on_play_start(self, play) -> None:
        preload()

    # A role or playbook that brings its own plugin directory clears the loaders' caches: load again before the task.
    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        preload()

    def v2_playbook_on_handler_task_start(self, task) -> None:
        preload()
