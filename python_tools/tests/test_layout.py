"""The shared node layout (issue 13): python_tools/twinspark/layout.yml is the one place the venv path, the restart
flag and the unit names are written; role twinspark_layout is generated from it and every role depends on it, and
twinspark/layout.py reads it (with the node's layout file laid over it). Overriding one value once in an inventory
moves every role, every playbook and the Python tools: one test each for the restart flag, the venv and a unit name.

Everything here runs on this machine: the units are rendered by scripts/render-units (connection local), the handler
runs against a temporary directory, and the inventory copies have stand-in hosts that are never contacted.
"""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
import yaml

from twinspark import generate, layout, recipe

ROOT = generate.repo_root()
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
DEFAULTS = layout.defaults()
# The layout role itself and the registry are the defining places; tests (the alert rules' promtool cases too),
# molecule (the simulated pair's test scenario), prose and the runtime's locks (sha256 digests, where any run of
# digits turns up) are not searched.
DEFINING = {"python_tools/twinspark/layout.yml", "roles/twinspark_layout/defaults/main.yml",
            "roles/twinspark_layout/meta/argument_specs.yml"}
NOT_SEARCHED = ("python_tools/tests/", "molecule/", "docs/", "roles/monitoring/files/alerts/tests/",
                "roles/vllm_runtime/files/locks/")

OVERRIDE_VENV = "/srv/other-venv"
OVERRIDE_UNIT = "other-rank.service"


def _code_lines(path: Path, text: str) -> list[str]:
    """The lines of a file that are code, not prose: comment lines and Python docstrings dropped."""
    lines = text.splitlines()
    prose: set[int] = set()
    if path.suffix == ".py" or text.startswith("#!/usr/bin/env python"):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            tree = None
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                        and isinstance(first.value.value, str):
                    prose.update(range(first.lineno, first.end_lineno + 1))
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:  # a comment after code: keep the code, drop the comment
                row, col = token.start
                lines[row - 1] = lines[row - 1][:col]
    else:
        prose = {i for i, line in enumerate(lines, 1) if line.lstrip().startswith(("#", "{#"))}
    return [line for i, line in enumerate(lines, 1) if i not in prose]


def _places(literal: str, root: Path = ROOT) -> set[str]:
    """The tracked files under `root` that spell `literal` in code (tests, molecule and prose aside)."""
    files = subprocess.run(["git", "grep", "-l", "-F", literal], cwd=root, capture_output=True, text=True,
                           timeout=60, check=False).stdout.split()
    found = set()
    for rel in files:
        if rel.startswith(NOT_SEARCHED) or rel.endswith(".md"):
            continue
        path = root / rel
        # A template's file name (`src: twinspark-vllm.service.j2`) is not the unit's name.
        code = [line.replace(f"{literal}.j2", "") for line in _code_lines(path, path.read_text(encoding="utf-8"))]
        if any(literal in line for line in code):
            found.add(rel)
    return found


@pytest.mark.parametrize("name", ["restart_flag", "venv", "unit_vllm", "pair_lock", "guard_pause", "guard_dir",
                                  "guard_state", "control_dir", "serve_env", "secrets_env", "node_file",
                                  "runtime_root", "metrics_dir", "monitoring_record"])
def test_each_default_is_written_in_one_place_per_side(name):
    assert _places(DEFAULTS[name]) == DEFINING, (
        f"{DEFAULTS[name]} is spelled outside the layout; use twinspark_layout_{name} (YAML) or "
        f"twinspark.layout (Python)")


# The knob registry and the file generated from it for Ansible; docs/CONFIG.md (also generated) is prose.
SETTINGS_DEFINING = {"python_tools/twinspark/settings.yml", "roles/serve_env/meta/argument_specs.yml"}


@pytest.mark.parametrize("name", ["router_port", "router_metrics_port", "router_upstream_port", "alertmanager_port",
                                  "node_exporter_port"])
def test_the_routers_default_ports_are_written_in_the_layout_only(name):
    """settings.yml may name the port in its documentation of TWINSPARK_ROUTER_URL; no code may."""
    assert _places(DEFAULTS[name]) <= DEFINING | SETTINGS_DEFINING, (
        f"{DEFAULTS[name]} is spelled outside the layout; use twinspark_layout_{name} (YAML), "
        f"twinspark.layout (Python) or layout_value {name} (scripts/sim)")


@pytest.mark.parametrize(("env", "defining"), [
    ("HF_HOME", SETTINGS_DEFINING),
    ("MODEL", {"python_tools/twinspark/recipes/deepseek-v4-flash.yml", "roles/serve_env/meta/argument_specs.yml"}),
    ("MODEL_REVISION", {"python_tools/twinspark/recipes/deepseek-v4-flash.yml",
                        "roles/serve_env/meta/argument_specs.yml"}),
])
def test_each_pinned_default_is_written_in_settings_or_its_recipe_only(env, defining):
    """HF_HOME lives in settings.yml, the model pin (the default recipe's MODEL and MODEL_REVISION) in the recipe's
    file: Python reads them through twinspark.recipe.knob_default (weights.py's PINNED_*), Ansible through the filter
    twinspark_knob_default."""
    value = recipe.knob_default(env)
    assert value and _places(value) == defining, (
        f"{value} ({env}'s default) is spelled outside {sorted(defining)}; use recipe.knob_default({env!r}) "
        f"(Python) or '{env}' | twinspark_knob_default (YAML)")


def test_the_default_profile_is_written_once():
    """`twinspark_profile | default(...)` is the generated twinspark_layout_profile (generate.py writes it into the
    layout role's defaults from settings.yml); roles and playbooks read that."""
    spelled = {rel for quote in "'\"" for rel in _places(f"twinspark_profile | default({quote}")}
    assert spelled == {"roles/twinspark_layout/defaults/main.yml", "python_tools/twinspark/generate.py"}, (
        f"{sorted(spelled)}: read twinspark_layout_profile instead of defaulting twinspark_profile")


def test_the_literal_search_catches_a_playbook_or_script_that_spells_a_default(tmp_path):
    """The checks above search every tracked file but tests, molecule and prose: a playbook or a script that spells
    a registry's value in code is found, the same words in a comment are not."""
    repo = tmp_path / "repo"
    for rel, text in {"playbooks/a.yml": f"- hosts: all\n  vars:\n    env_file: {DEFAULTS['serve_env']}\n",
                      "playbooks/b.yml": f"# reads {DEFAULTS['serve_env']}\n- hosts: all\n",
                      "scripts/x": f"#!/usr/bin/env python3\nPATH = {DEFAULTS['secrets_env']!r}\n",
                      "python_tools/tests/test_x.py": f"PATH = {DEFAULTS['serve_env']!r}\n"}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=60)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True, timeout=60)
    assert _places(DEFAULTS["serve_env"], repo) == {"playbooks/a.yml"}
    assert _places(DEFAULTS["secrets_env"], repo) == {"scripts/x"}


def test_the_registry_and_the_layout_type_agree():
    assert [entry.name for entry in layout.entries()] == list(layout.Layout.__dataclass_fields__)


def test_every_role_that_uses_the_layout_depends_on_it_and_none_redefines_it():
    """A role reading twinspark_layout_* must load the role that defines them (a role that uses none of them, such
    as nvidia_driver, needs not). Role vars outrank inventory vars: a role that set twinspark_layout_* itself would
    shadow an override."""
    users = set()
    for role in sorted(p for p in (ROOT / "roles").iterdir() if p.name != "twinspark_layout"):
        uses = any(layout.VAR_PREFIX in path.read_text() for path in role.rglob("*") if path.is_file())
        meta = yaml.safe_load((role / "meta" / "main.yml").read_text())
        if uses:
            users.add(role.name)
            assert {"role": "twinspark_layout"} in meta["dependencies"], f"{role.name}: depend on twinspark_layout"
        for part in ("defaults", "vars"):
            path = role / part / "main.yml"
            data = yaml.safe_load(path.read_text()) if path.exists() else {}
            shadowing = [key for key in data or {} if key.startswith(layout.VAR_PREFIX)]
            assert not shadowing, f"{path}: {shadowing} belong to role twinspark_layout only"
    assert {"vllm_runtime", "vllm_service", "serve_env", "model_cache", "health_timer"} <= users


# ---- the node side: the file the role writes, laid over the defaults -----------------------------------------------


def test_the_node_file_overlays_the_defaults(tmp_path):
    node_file = tmp_path / "layout.json"
    node_file.write_text(json.dumps({"venv": OVERRIDE_VENV, "unit_vllm": OVERRIDE_UNIT}))
    got = layout.load(node_file)
    assert (got.venv, got.cli, got.unit_vllm) == (OVERRIDE_VENV, f"{OVERRIDE_VENV}/bin/twinspark", OVERRIDE_UNIT)
    assert got.restart_flag == DEFAULTS["restart_flag"]
    assert layout.load(tmp_path / "absent.json") == layout.default()


def test_a_bad_node_file_names_itself_and_the_fix(tmp_path):
    node_file = tmp_path / "layout.json"
    node_file.write_text("{not json")
    with pytest.raises(ValueError, match=r"layout.json: not JSON .*rerun site.yml"):
        layout.load(node_file)
    node_file.write_text(json.dumps({"venvv": "/x"}))
    with pytest.raises(ValueError, match="unknown layout key 'venvv'"):
        layout.load(node_file)


def _tools_on_a_node(tmp_path: Path, values: dict[str, str]) -> dict[str, str]:
    """What the Python tools use, imported fresh in a process whose node file holds `values`."""
    node_file = tmp_path / "node-layout.json"
    node_file.write_text(json.dumps(values))
    code = (
        "import json\n"
        "from twinspark import envcli\n"
        "from twinspark.pair import rules as guard_rules\n"
        "from twinspark.health import checks, gather\n"
        "from twinspark.pair import guard, lifecycle\n"
        "from twinspark.runtime import store\n"
        "print(json.dumps({'guard_rules': guard_rules.rank_unit(), 'checks': checks.rank_unit(),\n"
        "  'gather': gather.rank_unit(), 'journal': checks.journal_hint(), 'guard': lifecycle.guard_service(),\n"
        "  'lock': lifecycle.default_lock_file(), 'pause': lifecycle.default_pause_file(),\n"
        "  'state': guard.default_state_file(), 'runtimes': store.default_root()}))\n"
    )
    env = {**os.environ, layout.LAYOUT_FILE_ENV: str(node_file)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                            check=True)
    return json.loads(result.stdout)


# The modules that read the node's layout file; importing any of them must read no file (the layout is read when a
# default is first needed), so a tool that never needs it, or a test, imports them on any machine.
LAYOUT_READERS = ("twinspark.doctor.command", "twinspark.health.checks", "twinspark.health.gather",
                  "twinspark.pair.cli", "twinspark.pair.guard", "twinspark.pair.lifecycle", "twinspark.pair.rules",
                  "twinspark.runtime.installed", "twinspark.runtime.store")


def test_importing_the_tools_reads_no_layout_file(tmp_path):
    """Every module that uses the node's layout imports with a node file that cannot be read as a layout; the file
    is read, and refused naming itself, only when a default is asked for."""
    node_file = tmp_path / "layout.json"
    node_file.write_text("{not json")
    code = ("import importlib, sys\n"
            f"for name in {LAYOUT_READERS!r}:\n"
            "    importlib.import_module(name)\n"
            "from twinspark.health import checks\n"
            "try:\n"
            "    checks.rank_unit()\n"
            "except ValueError as error:\n"
            "    print(error)\n")
    env = {**os.environ, layout.LAYOUT_FILE_ENV: str(node_file)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert f"{node_file}: not JSON" in result.stdout


def _inventory_copy(tmp_path: Path, overrides: dict[str, str]) -> Path:
    """The simulated pair's inventory values (read only, its hosts are never contacted) plus `overrides` in one
    group_vars file, as an operator would set them."""
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "sim", inventory)
    (inventory / "group_vars" / "all" / "layout.yml").write_text(yaml.safe_dump(overrides))
    return inventory


def _render(tmp_path: Path, overrides: dict[str, str]) -> dict[str, str]:
    """Every unit and script of roles vllm_service, health_timer and model_cache, rendered for both nodes."""
    out = tmp_path / "rendered"
    result = subprocess.run([str(ROOT / "scripts" / "render-units"), str(_inventory_copy(tmp_path, overrides)),
                             str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr
    return {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()}


def _controller_cli(tmp_path: Path, overrides: dict[str, str]) -> str:
    from twinspark import inventory

    return inventory.read_inventory(_inventory_copy(tmp_path / "controller", overrides)).head.twinspark


@pytest.mark.slow(8)
@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook not installed")
def test_overriding_the_venv_once_moves_roles_playbooks_and_tools(tmp_path):
    rendered = _render(tmp_path, {"twinspark_layout_venv": OVERRIDE_VENV})
    units = {name: text for name, text in rendered.items() if name.endswith((".service", ".timer", ".socket"))}
    for node in ("node1", "node2"):
        rank_unit = units[f"{node}/twinspark-vllm.service"]
        assert f"ExecStart={OVERRIDE_VENV}/bin/python -I -m twinspark.cli serve" in rank_unit
    assert f"{OVERRIDE_VENV}/bin/twinspark pair guard" in units["node1/twinspark-pair-guard.service"]
    assert f"ExecStart={OVERRIDE_VENV}/bin/python -I -m twinspark.cli health" in units["node1/twinspark-health.service"]
    stale = [name for name, text in rendered.items() if DEFAULTS["venv"] in text]
    assert not stale, f"still {DEFAULTS['venv']}: {stale}"
    # The controller's health sweep runs the node's twinspark from the inventory's venv.
    assert _controller_cli(tmp_path, {"twinspark_layout_venv": OVERRIDE_VENV}) == f"{OVERRIDE_VENV}/bin/twinspark"
    # And on the node, the file the role writes moves the tools.
    assert layout.load(_write(tmp_path, {"venv": OVERRIDE_VENV})).python == f"{OVERRIDE_VENV}/bin/python"


@pytest.mark.slow(7)
@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook not installed")
def test_overriding_the_rank_unit_once_moves_roles_playbooks_and_tools(tmp_path):
    rendered = _render(tmp_path, {"twinspark_layout_unit_vllm": OVERRIDE_UNIT})
    assert f"Before=network-pre.target {OVERRIDE_UNIT}" in rendered["node1/twinspark-firewall.service"]
    assert f"unit={OVERRIDE_UNIT}" in rendered["node2/twinspark-peer-control"]
    for name, text in rendered.items():
        code = "\n".join(_code_lines(Path(name), text))
        assert DEFAULTS["unit_vllm"] not in code, f"{name} still names {DEFAULTS['unit_vllm']}"
    tools = _tools_on_a_node(tmp_path, {"unit_vllm": OVERRIDE_UNIT})
    assert (tools["guard_rules"], tools["checks"], tools["gather"]) == (OVERRIDE_UNIT,) * 3
    assert tools["journal"] == "journalctl -u other-rank -n 120"


@pytest.mark.slow(4)
@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists() or os.geteuid() != 0,
                    reason="the handler sets owner root: needs ansible-playbook and root")
def test_overriding_the_restart_flag_once_moves_the_handler_the_check_and_tools(tmp_path):
    control = tmp_path / "control"
    control.mkdir(mode=0o700)
    flag = control / "pending-restart"
    overrides = {"twinspark_layout_control_dir": str(control), "twinspark_layout_restart_flag": str(flag)}
    inventory = tmp_path / "inventory"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    (inventory / "group_vars" / "all" / "layout.yml").write_text(yaml.safe_dump(overrides))
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {"twinspark_pair": {"children": {"twinspark_head": {"hosts": {"node1": None}},
                                                     "twinspark_worker": {"hosts": {"node2": None}}}}}}}))
    # Any role's change notifies the one handler by name; it marks the inventory's flag, and the serving role's
    # restart check (tasks/_pair_facts.yml) looks at the same variable.
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "A role changed what vLLM runs", "hosts": "node1", "gather_facts": False,
        "roles": [{"role": "twinspark_layout"}],
        "tasks": [{"name": "A change", "ansible.builtin.command": "true", "changed_when": True,
                   "notify": "Mark the pair for an ordered restart"}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(playbook)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert flag.exists() and (flag.stat().st_mode & 0o777) == 0o600
    facts = yaml.safe_load((ROOT / "roles" / "vllm_service" / "tasks" / "_pair_facts.yml").read_text())
    assert any(task.get("twinspark_probe", {}).get("reads") == ["{{ twinspark_layout_restart_flag }}"]
               for task in facts)
    lock, pause, state = control / "lock", control / "paused", tmp_path / "guard" / "state.json"
    tools = _tools_on_a_node(tmp_path, {"control_dir": str(control), "restart_flag": str(flag), "pair_lock": str(lock),
                                        "guard_pause": str(pause), "guard_state": str(state)})
    assert (tools["lock"], tools["pause"], tools["state"]) == (str(lock), str(pause), str(state))


def _write(tmp_path: Path, values: dict[str, str]) -> Path:
    path = tmp_path / "written-layout.json"
    path.write_text(json.dumps(values))
    return path


@pytest.mark.usefixtures("ansible_playbook")
def test_the_pair_check_refuses_a_node_whose_pair_is_not_one_head_and_one_worker(tmp_path):
    """The one pair check (role twinspark_layout, tasks_from pair_check; vllm_service and model_cache include it):
    two heads in a one-pair inventory stop it, naming the pair, what it holds and the fix."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {"twinspark_pair": {"children": {"twinspark_head": {"hosts": {"node1": None, "node3": None}},
                                                     "twinspark_worker": {"hosts": {"node2": None}}}}}}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Any role", "hosts": "node1", "gather_facts": False,
                                         "tasks": [{"name": "The pair check", "ansible.builtin.include_role": {
                                             "name": "twinspark_layout", "tasks_from": "pair_check"}}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(playbook)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode != 0
    assert "node1: its pair twinspark_pair must hold exactly one head and one worker" in result.stdout
    assert "fix the inventory's hosts.yml" in result.stdout


@pytest.mark.parametrize(("extra", "named"), [
    ({"vllm_service_venv": "/opt/old", "twinspark_layout_restart_flag": "/elsewhere/flag"},
     "instead. twinspark_layout_restart_flag (/elsewhere/flag) must lie"),
    ({"vllm_service_venv": "/opt/old"}, "vllm_service_venv set in the inventory but no longer read"),
    ({"twinspark_layout_restart_flag": "/elsewhere/flag"}, "twinspark_layout_restart_flag (/elsewhere/flag) must lie "
                                                           "directly in twinspark_layout_control_dir"),
    ({}, None),
])
@pytest.mark.usefixtures("ansible_playbook")
def test_the_layout_role_refuses_retired_names_and_a_misplaced_flag_in_one_task(tmp_path, extra, named):
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{"name": "The layout's checks", "hosts": "localhost", "gather_facts": False,
                                         "roles": [{"role": "twinspark_layout"}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", str(playbook),
                             "-e", json.dumps({"ansible_python_interpreter": sys.executable, **extra})],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = " ".join((result.stdout + result.stderr).split())
    if named is None:
        assert result.returncode == 0, output
    else:
        assert result.returncode != 0 and named in output, output
