"""Docs and comments name only files that are in the repository.

Scans every markdown file, and the comments and docstrings of every Python, YAML and Jinja2 file, for
repository-relative paths (`roles/...`, `python_tools/...`, `docs/...`, ...) and for bare template and markdown
file names, and fails naming each one that does not exist. In markdown it also follows every relative link
(`[text](../docs/X.md)`, resolved from the document's own folder) and checks backticked-or-bare file names
ending .py/.yml/.sh/.cfg, which a reader looks for in the repository. A placeholder segment (`inventory/<site>/`,
`patches/<vllm-version>/`) or a glob (`roles/*/README.md`) must match at least one real path. A file that cites a
document kept outside the repository (RECIPE.md, SIM.md, "RECIPE issue 79") fails too, in patches as well: say
the fact, or cite docs/ or a role README. On-node paths (/etc/..., /opt/...) and URLs are not repository paths.
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
         "filter_plugins", "callback_plugins")
PATH = re.compile(r"(?<![\w./<>-])((?:" + "|".join(ROOTS) + r")/[\w./<>*{},-]*[\w/>*}])")
BARE_NAME = re.compile(r"(?<![\w./<>*-])([\w-]+(?:\.[\w-]+)*\.(?:j2|md))\b")
DOC_BARE_NAME = re.compile(r"(?<![\w./<>*-])([\w-]+(?:\.[\w-]+)*\.(?:py|yml|yaml|sh|cfg))\b")
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?")
OUTSIDE_DOCS = re.compile(r"\b(?:RECIPE|SIM)\.md\b|\bRECIPE\b")
# vLLM's own files, named by the patches and the settings that describe what vLLM does: not repository files.
UPSTREAM_NAMES = frozenset({"authenticate.py", "grpc_server.py", "shm_broadcast.py", "flashinfer_sparse.py"})
# Files that still cite an outside document and are rewritten by a change in flight elsewhere, each with why.
PENDING_CITATIONS: dict[str, str] = {}
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


def mentions(prose: str, markdown: bool = False) -> set[str]:
    found = set(PATH.findall(prose)) | set(BARE_NAME.findall(prose))
    if markdown:
        found |= {name for name in DOC_BARE_NAME.findall(prose) if name not in UPSTREAM_NAMES}
    return found


def link_targets(markdown: str) -> list[str]:
    """Relative link targets of a markdown text, without their #anchor (URLs, mail and same-page anchors left out)."""
    targets = []
    for target in LINK.findall(markdown):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def broken_links(repo: Path = REPO) -> list[str]:
    broken = []
    for path in _files():
        if path.suffix != ".md":
            continue
        for target in link_targets(path.read_text(encoding="utf-8")):
            resolved = (path.parent / target).resolve()
            if not resolved.exists() or not resolved.is_relative_to(repo):
                broken.append(f"{path.relative_to(repo)}: links to {target}, which is not in the repository")
    return broken


def broken_mentions(repo: Path = REPO) -> list[str]:
    names = _names(repo)
    broken = []
    for path in _files():
        for mention in sorted(mentions(prose_of(path), markdown=path.suffix == ".md")):
            if not mention_exists(mention, repo, names):
                broken.append(f"{path.relative_to(repo)}: names {mention}, which is not in the repository")
    return broken


def outside_citations(repo: Path = REPO) -> list[str]:
    cited = []
    patches = [p for p in (repo / "patches").rglob("*.patch")]
    for path in _files() + patches:
        if str(path.relative_to(repo)) in PENDING_CITATIONS:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE_DOCS.search(line):
                cited.append(f"{path.relative_to(repo)}:{number}: cites {OUTSIDE_DOCS.search(line).group(0)}")
    return cited


def test_docs_and_comments_name_only_files_that_exist():
    broken = broken_mentions()
    assert not broken, "fix or remove these references:\n" + "\n".join(broken)


def test_markdown_links_lead_to_files_in_the_repository():
    broken = broken_links()
    assert not broken, "fix these links:\n" + "\n".join(broken)


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


def test_markdown_also_names_code_and_config_files_by_their_bare_names():
    prose = "see `guard_rules.py`, hosts.yml and `shm_broadcast.py` (vLLM's), not /etc/twinspark/serve.env"
    assert mentions(prose, markdown=True) == {"guard_rules.py", "hosts.yml"}
    assert mentions(prose) == set(), "comments name modules freely; only markdown is held to it"


def test_links_are_relative_to_the_document_and_urls_are_not_followed():
    text = "[a](../../docs/RUNTIME.md#top) [b](https://x.org/y.md) [c](#here) [d](<defaults/main.yml>)"
    assert link_targets(text) == ["../../docs/RUNTIME.md", "defaults/main.yml"]


def test_recipe_is_caught_as_a_citation_but_not_inside_a_name():
    assert OUTSIDE_DOCS.search("spin loop (RECIPE issue 79)")
    assert not OUTSIDE_DOCS.search("RECIPE_KNOBS = [")


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



def unplaced(text: str, repo: Path) -> list[str]:
    """What of the house (roles, playbooks, packages, plugins, molecule scenarios) `text` does not name."""
    wanted = {f"`{p.name}`" for p in (repo / "roles").iterdir() if (p / "tasks").is_dir()}
    wanted |= {p.name for p in (repo / "playbooks").glob("*.yml")}
    wanted |= {p.name for p in (repo / "playbooks" / "tasks").glob("*.yml")}
    wanted |= {f"`twinspark/{p.name}/`" for p in (repo / "python_tools" / "twinspark").iterdir()
               if (p / "__init__.py").exists()}
    wanted |= {f"`{p.name}/`" for p in (repo / "python_tools").iterdir() if p.name == "devtools"}
    for folder in ("filter_plugins", "callback_plugins", "library"):
        wanted |= {p.name for p in (repo / folder).glob("*.py")}
    wanted |= {f"molecule/{p.name}" for p in (repo / "molecule").iterdir() if (p / "molecule.yml").exists()}
    return sorted(name for name in wanted if name not in text)


def test_the_architecture_map_names_every_role_playbook_package_and_plugin():
    """docs/ARCHITECTURE.md covers the whole house: a new role, playbook, package or plugin must be placed on it."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    missing = unplaced(text, REPO)
    assert not missing, f"docs/ARCHITECTURE.md does not place: {', '.join(missing)}"
    assert "## How to add" in text


def test_the_architecture_check_names_a_role_a_playbook_and_a_package_the_map_leaves_out(tmp_path):
    for folder in ("roles/known/tasks", "roles/newrole/tasks", "playbooks/tasks", "python_tools/twinspark/newpkg",
                   "filter_plugins", "callback_plugins", "library", "molecule/default"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "playbooks" / "new.yml").write_text("---\n")
    (tmp_path / "python_tools" / "twinspark" / "newpkg" / "__init__.py").write_text("")
    (tmp_path / "molecule" / "default" / "molecule.yml").write_text("---\n")
    text = "`known` and molecule/default"
    assert unplaced(text, tmp_path) == ["`newrole`", "`twinspark/newpkg/`", "new.yml"]
