"""The package's import graph has no cycle. A cycle hides which module depends on which, and it only works while
one of its imports stays inside a function, so every import counts here: at module top, inside a function, under a
condition. The graph is read from the source (the AST), so nothing is imported to build it. `twinspark.cli` picks a
sub-command's module by name (importlib), which is no edge: that table is tested in test_cli.py.

Imports sit at module top. One inside a function is kept only for an optional dependency (ansible on a node, vLLM
outside the serving venv) or a measured start-up cost, and the comment line right above it says which.
"""

from __future__ import annotations

import ast
from pathlib import Path

import twinspark

PACKAGE = Path(twinspark.__file__).parent


def modules(package: Path) -> dict[str, Path]:
    """Every module of the package under `package` (a directory with __init__.py), by dotted name."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The package's modules that module `name` imports anywhere in its file -> the first line that does.

    `from a.b import c` is an edge to a.b.c when c is a module, else to a.b (whose __init__ defines c)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target in known and target != name:
                edges.setdefault(target, node.lineno)
    return edges


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def graph_of(package: Path) -> dict[str, dict[str, int]]:
    known = modules(package)
    return {name: imported(name, path, known) for name, path in known.items()}


def describe(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    members = set(component)
    return "; ".join(f"{name} imports {target} (line {line})" for name in component
                     for target, line in sorted(graph[name].items()) if target in members)


def test_the_package_has_no_import_cycle():
    graph = graph_of(PACKAGE)
    assert "twinspark.pair.guard" in graph and graph["twinspark.pair.guard"], "the graph is read from the source"
    found = [describe(graph, component) for component in cycles(graph)]
    assert not found, "import cycles (move what both need into one of them, or into a third module): " + \
        " | ".join(found)


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def late():\n    from pkg import a\n    return a\n")
    (package / "c.py").write_text("from . import a\n")
    graph = graph_of(package)
    assert graph["pkg.sub.b"] == {"pkg.a": 2} and graph["pkg.c"] == {"pkg.a": 1}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]
    assert describe(graph, ["pkg.a", "pkg.sub.b"]) == \
        "pkg.a imports pkg.sub.b (line 1); pkg.sub.b imports pkg.a (line 2)"


def unexplained_local_imports(path: Path) -> list[str]:
    """`path:line` of every import inside a function with no comment line right above its block of imports."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for function in ast.walk(ast.parse(text, str(path))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            above = node.lineno - 2
            while above >= 0 and lines[above].strip().startswith(("import ", "from ")):
                above -= 1
            if above < 0 or not lines[above].strip().startswith("#"):
                found.append(f"{path}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_every_import_inside_a_function_says_why_it_is_not_at_the_top():
    found = [line for path in modules(PACKAGE).values() for line in unexplained_local_imports(path)]
    assert not found, ("move these imports to the module's top, or say on the line above why they cannot be there "
                       "(an optional dependency, a measured start-up cost):\n" + "\n".join(found))


def test_an_import_inside_a_function_without_its_reason_is_named(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    # torch: only in the serving venv\n    import torch\n    import torch.cuda\n"
                      "    return torch\n\n\ndef g():\n    x = 1\n    import json\n    return json, x\n")
    assert unexplained_local_imports(module) == [f"{module}:10: import json"]
