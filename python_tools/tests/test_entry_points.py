"""A role's task file run on its own (`include_role: tasks_from: X`, as playbooks and the molecule scenarios do) has
none of the role's one-call probes unless it registers them itself: main.yml's probe is never run for it, and one
left by an earlier play of the same run may be stale. Every such file, with the files it imports, may read a probe
registered elsewhere only through `default(...)`, so that a task there runs as written rather than failing on an
undefined variable or skipping on stale facts. CI's faults scenario failed on exactly that (round 10: firewall.yml,
included on its own to narrow the API networks, read vllm_service_probe unguarded)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from twinspark import generate

ROOT = generate.repo_root()
ROLES = ROOT / "roles"
IMPORT_KEYS = ("ansible.builtin.import_tasks", "ansible.builtin.include_tasks", "import_tasks", "include_tasks")


def _yaml_files() -> list[Path]:
    skip = {".venv", ".git", "node_modules"}
    return [p for p in ROOT.rglob("*.yml") if not skip.intersection(p.relative_to(ROOT).parts)]


def _tasks(node):
    """Every task mapping in a task list, blocks included."""
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        yield node
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks"):
            if key in node:
                yield from _tasks(node[key])


def _entry_points() -> set[tuple[str, str]]:
    """(role, task file) for every `tasks_from` in the repository whose role and file are literal."""
    found = set()
    for path in _yaml_files():
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue
        for task in _tasks(doc):
            for key in ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role"):
                spec = task.get(key)
                if isinstance(spec, dict) and "tasks_from" in spec and "{{" not in str(spec.get("name", "{{")):
                    name, tasks_from = spec["name"], str(spec["tasks_from"])
                    if "{{" not in tasks_from:
                        found.add((name, tasks_from if tasks_from.endswith(".yml") else tasks_from + ".yml"))
    return found


def _closure(role: str, task_file: str) -> list[Path]:
    """The task file and every file it imports or includes by a literal name, recursively."""
    seen: list[Path] = []
    todo = [ROLES / role / "tasks" / task_file]
    while todo:
        path = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.append(path)
        for task in _tasks(yaml.safe_load(path.read_text()) or []):
            for key in IMPORT_KEYS:
                target = task.get(key)
                if isinstance(target, dict):
                    target = target.get("file")
                if isinstance(target, str) and "{{" not in target:
                    todo.append(path.parent / target)
    return seen


def _registered(paths: list[Path]) -> set[str]:
    names = set()
    for path in paths:
        for task in _tasks(yaml.safe_load(path.read_text()) or []):
            if isinstance(task.get("register"), str):
                names.add(task["register"])
    return names


PROBES = {name for name in _registered(sorted(ROLES.glob("*/tasks/*.yml"))) if name.endswith("_probe")}


def test_the_repository_has_entry_points_and_probes():
    """The scan finds what it guards: the pair entry points and the firewall's and guard's boot.yml, and the roles'
    one-call probes."""
    entries = _entry_points()
    assert ("host_firewall", "boot.yml") in entries and ("pair_guard", "boot.yml") in entries
    assert ("vllm_service", "pair_start.yml") in entries
    assert {"vllm_service_probe", "host_firewall_probe", "pair_guard_probe", "model_cache_probe",
            "vllm_runtime_probe"} <= PROBES


def _unguarded(files: list[Path], probes: set[str], root: Path = ROOT) -> list[str]:
    """Lines of `files` that read one of `probes` not registered in `files` without `| default(`."""
    own = _registered(files)
    found = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if any(re.search(rf"\b{name}\b(?!\s*\|\s*default\()", line) for name in probes - own):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize("role,task_file", sorted(_entry_points()))
def test_entry_point_reads_outside_probes_only_with_a_default(role, task_file):
    files = _closure(role, task_file)
    assert files, f"roles/{role}/tasks/{task_file} is named by a tasks_from but does not exist"
    unguarded = _unguarded(files, PROBES)
    assert not unguarded, "read without a default although run on its own:\n" + "\n".join(unguarded)


def test_the_rule_catches_an_unguarded_read(tmp_path):
    """The rule on made-up task files: an unguarded read is caught, a guarded one is not, and a file that registers
    the probe itself may read it as it likes."""
    solo = tmp_path / "solo.yml"
    task = "- name: t\n  ansible.builtin.debug:\n    msg: hi\n  when: {}\n"
    solo.write_text(task.format("r_probe | twinspark_probe_text('/x') is none"))
    expected = "solo.yml:4: when: r_probe | twinspark_probe_text('/x') is none"
    assert _unguarded([solo], {"r_probe"}, tmp_path) == [expected]
    solo.write_text(task.format("r_probe | default({}) | twinspark_probe_text('/x') is none"))
    assert _unguarded([solo], {"r_probe"}, tmp_path) == []
    own = tmp_path / "own.yml"
    own.write_text("- name: p\n  ansible.builtin.stat:\n    path: /x\n  register: r_probe\n")
    solo.write_text(task.format("r_probe.stat.exists"))
    assert _unguarded([solo], {"r_probe"}, tmp_path) != []
    assert _unguarded([own, solo], {"r_probe"}, tmp_path) == []
