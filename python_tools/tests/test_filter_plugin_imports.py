"""filter_plugins/: how the filters find the twinspark package on a controller that has not installed it.

One place puts this checkout's python_tools/ on sys.path: filter_plugins/_pythonpath/__init__.py. Every plugin that
imports twinspark runs it, in one line (LINE), before that import; none carries its own copy of the sys.path preamble
(which nine plugins once repeated), and none leans on another plugin having been loaded first (two once did: they
worked only because filter_plugins/twinspark.py sorts first). Every *.py that Ansible's loader picks up there is a
filter plugin, so the helper's folder holds only the `__init__.py` Ansible skips (anything else: a [WARNING] on
every run). And each plugin loads on its own, and a playbook runs, in a Python that has Ansible but not twinspark.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "filter_plugins"
HELPER = PLUGINS / "_pythonpath" / "__init__.py"
LINE = 'runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))'
# A Python with Ansible and the venv's other packages but without twinspark: -S leaves site-packages' .pth files
# unread, and the package is installed editable as one of them (Makefile: editable_mode=compat); -I drops
# PYTHONPATH and the working directory.
BARE = [sys.executable, "-I", "-S", "-c"]
BARE_PATH = f"import sys; sys.path.append({sysconfig.get_paths()['purelib']!r})\n"


def _docstrings(tree: ast.Module) -> set[int]:
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef))]
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _imports_twinspark(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "twinspark" for alias in node.names)
    return isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "twinspark"


def problems(source: str) -> list[str]:
    """What in a filter plugin's source breaks the rule above; empty when nothing does."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
            found.append((node.lineno, "changes sys.path itself; run filter_plugins/_pythonpath instead"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "python_tools" in node.value \
                and id(node) not in docstrings:
            found.append((node.lineno, "finds python_tools/ itself; run filter_plugins/_pythonpath instead"))
    first = min((node.lineno for node in ast.walk(tree) if _imports_twinspark(node)), default=None)
    if first is not None:
        wanted = ast.dump(ast.parse(LINE).body[0])
        if not any(ast.dump(statement) == wanted and statement.lineno < first for statement in tree.body):
            found.append((first, f"imports twinspark without running filter_plugins/_pythonpath first: {LINE}"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def ansible_loads(plugin_dir: Path) -> list[Path]:
    """The files Ansible's plugin loader imports from a configured plugin folder: *.py in the folder and in each
    folder one or two levels below it (ansible/plugins/loader.py, _get_paths_with_context and all()), __init__.py
    skipped."""
    folders = [plugin_dir, *(p for p in [*plugin_dir.glob("*"), *plugin_dir.glob("*/*")] if p.is_dir())]
    return sorted(path for folder in folders for path in folder.glob("*.py") if path.name != "__init__.py")


def test_no_plugin_carries_the_preamble_and_each_runs_the_helper_before_importing_twinspark():
    plugins = sorted(PLUGINS.glob("*.py"))
    assert len(plugins) >= 12, plugins
    broken = [f"{path.relative_to(REPO)} {problem}" for path in plugins
              for problem in problems(path.read_text(encoding="utf-8"))]
    assert not broken, "\n".join(broken)
    users = [path.name for path in plugins if LINE in path.read_text(encoding="utf-8")]
    assert len(users) >= 11, users  # every plugin but twinspark_keys.py imports the package


OLD_PREAMBLE = '''"""Filters."""
import sys
from pathlib import Path

_TOOLS = Path(__file__).resolve().parents[1] / "python_tools"
if _TOOLS.is_dir() and str(_TOOLS) not in sys.path:
    sys.path.insert(0, str(_TOOLS))

from twinspark import wheelhouse
'''
WITH_LINE = f'"""Filters over python_tools/twinspark."""\nimport runpy\nfrom pathlib import Path\n\n{LINE}\n\n' \
            "from ansible.errors import AnsibleFilterError\nfrom twinspark.fleet import rules\n"


@pytest.mark.parametrize(("source", "expected"), [
    (OLD_PREAMBLE, ["line 5: finds python_tools/", "line 6: changes sys.path", "line 7: changes sys.path",
                    "line 9: imports twinspark without"]),
    ("import os\nimport twinspark.api\n", ["line 2: imports twinspark without"]),
    (f"from twinspark import api\n{LINE}\n", ["line 1: imports twinspark without"]),
    (f"def f():\n    {LINE}\nfrom twinspark import api\n", ["line 3: imports twinspark without"]),
    ("import sys\nsys.path.append('/opt/x')\n", ["line 2: changes sys.path"]),
    (WITH_LINE, []),
    ('"""Filters without the package."""\nimport re\n', []),
])
def test_the_rule_catches_a_copied_preamble_and_a_missing_or_late_line(source, expected):
    found = problems(source)
    assert len(found) == len(expected), found
    assert all(problem.startswith(prefix) for problem, prefix in zip(found, expected, strict=True)), found


def test_every_file_ansible_loads_from_filter_plugins_is_a_filter_plugin():
    loaded = ansible_loads(PLUGINS)
    assert HELPER not in loaded and PLUGINS / "twinspark.py" in loaded
    not_plugins = [str(path.relative_to(REPO)) for path in loaded
                   if not any(isinstance(node, ast.ClassDef) and node.name == "FilterModule"
                              for node in ast.parse(path.read_text(encoding="utf-8")).body)]
    assert not not_plugins, f"Ansible warns 'Skipping plugin ... invalid' for each: {not_plugins}"
    assert sorted(p.name for p in HELPER.parent.iterdir() if p.name != "__pycache__") == ["__init__.py"]


def test_the_loader_walk_sees_subfolders_as_ansible_does(tmp_path):
    for name in ("a.py", "_helper/__init__.py", "_helper/stray.py", "sub/deeper/b.py", "sub/deeper/deepest/c.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert [str(p.relative_to(tmp_path)) for p in ansible_loads(tmp_path)] == [
        "_helper/stray.py", "a.py", "sub/deeper/b.py"]


LOAD_EACH_ALONE = BARE_PATH + """
import importlib.util, json, sys
from pathlib import Path

tools = str(Path(sys.argv[1]).parent.parent / "python_tools")
assert importlib.util.find_spec("twinspark") is None, "twinspark is importable without the helper"
results = {}
for number, path in enumerate(sys.argv[1:]):
    # Each plugin as the first to load: neither python_tools/ on sys.path nor any twinspark module imported.
    sys.path[:] = [entry for entry in sys.path if entry != tools]
    for name in [name for name in sys.modules if name.split(".")[0] == "twinspark"]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location(f"ansible.plugins.filter.plugin_{number}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        found = sys.modules.get("twinspark")
        results[Path(path).name] = [len(module.FilterModule().filters()), found and found.__file__]
    except Exception as error:
        results[Path(path).name] = f"{type(error).__name__}: {error}"
print(json.dumps(results))
"""


def test_each_plugin_loads_on_its_own_in_a_python_without_twinspark():
    plugins = sorted(PLUGINS.glob("*.py"))
    done = subprocess.run([*BARE, LOAD_EACH_ALONE, *map(str, plugins)], capture_output=True, text=True, timeout=120,
                          cwd=REPO / "filter_plugins", env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    package = str(REPO / "python_tools" / "twinspark" / "__init__.py")
    failed = {name: result for name, result in results.items() if not isinstance(result, list)}
    assert not failed, failed
    assert all(count > 0 for count, _ in results.values()), results
    assert {name for name, (_, origin) in results.items() if origin != package} == {"twinspark_keys.py"}, results


PLAYBOOK = """
- name: The project's filters on the controller only
  hosts: localhost
  gather_facts: false
  tasks:
    - name: One filter from each of three plugin files
      ansible.builtin.debug:
        msg: >-
          {{ {} | twinspark_api_keys }} {{ 'cpu' | twinspark_driver_default_mode }}
          {{ [] | twinspark_fork_runtime }}
"""


def test_a_playbook_runs_the_filters_without_twinspark_installed_and_warns_of_nothing(tmp_path, ansible_playbook):
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    run_playbook = BARE_PATH + (f"import runpy; sys.argv = [{str(ansible_playbook)!r}, '-i', 'localhost,', '-c', "
                                f"'local', 'play.yml']\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    probe = subprocess.run([*BARE, BARE_PATH + "import twinspark"], capture_output=True, text=True, timeout=60,
                           check=False)
    assert probe.returncode != 0 and "No module named 'twinspark'" in probe.stderr, probe.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([*BARE, run_playbook], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "skip" in output and "vllm" in output and "ok=1 " in output and "failed=0 " in output, output
    assert "[WARNING]" not in output, output
