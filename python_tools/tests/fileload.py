"""Small helpers the tests share: a module loaded from a file outside the package (a filter plugin, an Ansible
module), and a child process stopped within a bound."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType


def load_module(name: str, path: Path) -> ModuleType:
    """The Python file at `path`, imported as module `name` (not put in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stop(process: subprocess.Popen, grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL after `grace_s` seconds; returns once the process is reaped."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=grace_s)
