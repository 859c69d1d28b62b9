"""Docs and comments name only files that are in the repository.

Scans every markdown file, and the comments and docstrings of every Python, YAML and Jinja2 file, for
repository-relative paths (`roles/...`, `python_tools/...`, `docs/...`, ...) and for bare template and markdown
file names, and fails naming each one that does not exist. A placeholder segment (`inventory/<site>/`,
`patches/<vllm-version>/`) or a glob (`roles/*/README.md`) must match at least one real path. A file that cites a
document kept outside the repository (RECIPE.md, SIM.md) fails too: say the fact, or cite docs/ or a role README.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "__pycache__", "artifacts", "build", "dist", ".cache", ".ansible", ".pytest_cache",
             ".ruff_cache", "node_modules"}
ROOTS = ("roles", "python_tools", "scripts", "docs", "playbooks", "molecule", "patches", "inventory",
         "filter_plugins")
PATH = re.compile(r"(?<![\w./<>-])((?:" + "|".join(ROOTS) + r")/[\w./<>*{},-]*[\w/>*}])")
BARE_NAME = re.compile(r"(?<![\w./<>*-])([\w-]+(?:\.[\w-]+)*\.(?:j2|md))\b")
OUTSIDE_DOCS = re.compile(r"\b(?:RECIPE|SIM)\.md\b")
# Paths that are named on purpose although they are not in the repository, each with its reason.
ALLOWED: dict[str, str] = {
    "inventory/<site>/group_vars/all/vault.yml": "the operator creates it with ansible-vault (README.md)",
}


def _walk(repo: Path = REPO) -> list[Path]:
    """Every file and directory of the repository, without VCS, venv, caches and build output."""
    found = []
    stack = [repo]
    while stack:
        for entry in sorted(stack.pop().iterdir()):
            found.append(entry)
            if entry.is_dir() and not entry.is_symlink() and entry.name not in SKIP_DIRS \
                    and not entry.name.endswith(".egg-info"):
                stack.append(entry)
    return found


def _files() -> list[Path]:
    """The files whose prose is checked (this file aside: it names missing files on purpose)."""
    this = Path(__file__).resolve()
    return [p for p in _walk() if p.is_file() and p.suffix in {".md", ".py", ".yml", ".yaml", ".j2"}
            and p.resolve() != this]


def python_prose(text: str) -> str:
    """The comments and docstrings of a Python source."""
    parts = [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    return "\n".join(parts)


def hash_comments(text: str) -> str:
    """`#` comments of YAML or a rendered template (whole-line or after a space), and `{# #}` Jinja2 comments."""
    parts = re.findall(r"\{#(.*?)#\}", text, re.DOTALL)
    parts += [m.group(1) for m in re.finditer(r"(?:^|\s)#(?!\})(.*)$", text, re.MULTILINE)]
    return "\n".join(parts)


def prose_of(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return text
    if path.suffix == ".py":
        return python_prose(text)
    return hash_comments(text)


def _as_glob(mention: str) -> list[str]:
    """Placeholders (<x>) and globs become glob patterns; {a,b} expands to one pattern each."""
    pattern = re.sub(r"<[^>/]*>", "*", mention.rstrip("/"))
    brace = re.search(r"\{([^{}]*)\}", pattern)
    if brace:
        return [p for alt in brace.group(1).split(",")
                for p in _as_glob(pattern[:brace.start()] + alt + pattern[brace.end():])]
    return [pattern]


def mention_exists(mention: str, repo: Path = REPO, names: frozenset[str] | None = None) -> bool:
    if mention in ALLOWED:
        return True
    if "/" not in mention:  # a bare file name: somewhere in the repository
        return mention in (names if names is not None else _names(repo))
    return all(any(True for _ in repo.glob(p)) if any(c in p for c in "*?[") else (repo / p).exists()
               for p in _as_glob(mention))


def _names(repo: Path) -> frozenset[str]:
    return frozenset(p.name for p in _walk(repo))


def mentions(prose: str) -> set[str]:
    return set(PATH.findall(prose)) | set(BARE_NAME.findall(prose))


def broken_mentions(repo: Path = REPO) -> list[str]:
    names = _names(repo)
    broken = []
    for path in _files():
        for mention in sorted(mentions(prose_of(path))):
            if not mention_exists(mention, repo, names):
                broken.append(f"{path.relative_to(repo)}: names {mention}, which is not in the repository")
    return broken


def outside_citations(repo: Path = REPO) -> list[str]:
    cited = []
    for path in _files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE_DOCS.search(line):
                cited.append(f"{path.relative_to(repo)}:{number}: cites {OUTSIDE_DOCS.search(line).group(0)}")
    return cited


def test_docs_and_comments_name_only_files_that_exist():
    broken = broken_mentions()
    assert not broken, "fix or remove these references:\n" + "\n".join(broken)


def test_no_file_cites_a_document_outside_the_repository():
    cited = outside_citations()
    assert not cited, "state the fact or cite docs/ or a role README instead:\n" + "\n".join(cited)


def test_the_scan_sees_the_files_it_should():
    scanned = {str(p.relative_to(REPO)) for p in _files()}
    assert {"docs/ARCHITECTURE.md", "python_tools/twinspark/cli.py", "site.yml"} <= scanned
    assert not any(part in SKIP_DIRS for s in scanned for part in Path(s).parts)


# --- the rules themselves, on small inputs: each fails when its rule is removed ------------------------------

def test_python_prose_is_comments_and_docstrings_only():
    source = '"""Module: see docs/A.md."""\nX = "docs/B.md"  # docs/C.md\ndef f():\n    """docs/D.md"""\n'
    assert mentions(python_prose(source)) == {"docs/A.md", "docs/C.md", "docs/D.md"}


def test_hash_comments_of_yaml_and_templates():
    text = "a: docs/x.md\n# roles/r/tasks/main.yml\nb: 1  # playbooks/p.yml\n{# scripts/s #}\nc: '{#x#}'\n"
    assert mentions(hash_comments(text)) == {"roles/r/tasks/main.yml", "playbooks/p.yml", "scripts/s"}


@pytest.mark.parametrize(("prose", "expected"), [
    ("see docs/OPERATIONS.md.", {"docs/OPERATIONS.md"}),
    ("(roles/serve_env/templates/env.j2), and env.j2's header", {"roles/serve_env/templates/env.j2", "env.j2"}),
    ("RECIPE.md, `peer-control.sh.j2`", {"RECIPE.md", "peer-control.sh.j2"}),
    ("/opt/twinspark/venv and /etc/twinspark/serve.env", set()),
    ("inventory/<site>/group_vars", {"inventory/<site>/group_vars"}),
])
def test_path_mentions_are_found_without_their_punctuation(prose, expected):
    assert mentions(prose) == expected


def test_placeholders_and_globs_must_match_something(tmp_path):
    (tmp_path / "inventory/example/group_vars").mkdir(parents=True)
    (tmp_path / "roles/a").mkdir(parents=True)
    (tmp_path / "roles/a/README.md").write_text("")
    assert mention_exists("inventory/<site>/group_vars", tmp_path)
    assert mention_exists("roles/*/README.md", tmp_path)
    assert mention_exists("roles/{a,*}/README.md", tmp_path)
    assert not mention_exists("inventory/<site>/host_vars", tmp_path)
    assert not mention_exists("roles/{a,b}/README.md", tmp_path)
    assert not mention_exists("docs/RECIPE.md", tmp_path)
    assert mention_exists("README.md", tmp_path) and not mention_exists("serve.env.j2", tmp_path)
