"""Puts this checkout's python_tools/ on sys.path, so that the filter plugins' `from twinspark import ...` works on
a controller whose Python has only Ansible (the package not installed there).

The one place that does it. Each filter plugin that imports twinspark runs this file first, in one line, before that
import:

    runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))

It is run by path (runpy), not imported: Ansible loads a plugin file by its path under a generated module name, with
neither filter_plugins/ on sys.path nor a package to be relative to, so no `import` could find this file. Running it
again is a no-op (python_tools/ is added once). With twinspark installed, python_tools/ still goes first, as before:
the checkout the playbook runs from supplies the rules.

Why a sub-package: Ansible loads every *.py of filter_plugins/ (and of each folder one or two levels below it) as a
filter plugin and warns about one with no FilterModule. `__init__.py` is the one name it skips, so this folder must
hold nothing else. python_tools/tests/test_filter_plugin_imports.py holds the plugins and this folder to that.
"""

from __future__ import annotations

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "python_tools"
if TOOLS.is_dir() and str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))
