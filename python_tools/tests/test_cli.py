"""The `twinspark` entry point: the static command table, and importing only the chosen command's module."""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from twinspark import cli

PACKAGE = Path(cli.__file__).parent


def _registered(module: str) -> list[tuple[str, str]]:
    subparsers = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(module).register(subparsers)
    return [(action.dest, action.help) for action in subparsers._choices_actions]


@pytest.mark.parametrize("module", cli.COMMAND_MODULES)
def test_table_matches_what_each_module_registers(module):
    in_table = [(name, help_text) for name, (owner, help_text) in cli.COMMANDS.items() if owner == module]
    assert _registered(module) == in_table, f"update COMMANDS in twinspark/cli.py for {module}"


def test_every_module_with_a_register_function_is_in_the_table():
    registering = set()
    for path in PACKAGE.rglob("*.py"):
        if re.search(r"^def register\(", path.read_text(encoding="utf-8"), re.MULTILINE):
            registering.add(".".join(("twinspark", *path.relative_to(PACKAGE).with_suffix("").parts)))
    missing = {m for m in registering
               if not any(m == owner or m.startswith(owner + ".") for owner in cli.COMMAND_MODULES)}
    assert registering and not missing, f"modules that register commands but are not in cli.COMMANDS: {missing}"


def test_help_lists_every_command_with_its_help(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for name, (_, help_text) in cli.COMMANDS.items():
        assert f"{name} {' '.join(help_text.split())}" in out, name


def test_only_the_chosen_commands_module_is_imported():
    """A fresh interpreter: `env defaults` must not load any other command module."""
    code = ("import sys; from twinspark import cli; rc = cli.main(['env', 'defaults', '--profile', 'cpu', "
            "'--rank', '0']); print(' '.join(sorted(sys.modules)), file=sys.stderr); sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stderr.split())
    assert "twinspark.envcli" in loaded
    others = {m for m in cli.COMMAND_MODULES if m != "twinspark.envcli"}
    assert not others & loaded, f"imported without being chosen: {sorted(others & loaded)}"


def test_a_module_that_fails_to_import_breaks_only_its_own_commands(monkeypatch, capsys):
    for module in cli.COMMAND_MODULES:
        if module != "twinspark.envcli":
            monkeypatch.setitem(sys.modules, module, None)  # `import` now raises ImportError for it
    assert cli.main(["env", "defaults", "--profile", "cpu", "--rank", "0"]) == 0
    assert "VLLM" in capsys.readouterr().out
    assert cli.main(["model", "verify", "/nonexistent"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("twinspark model: cannot import twinspark.weights") and err.count("\n") == 1
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0 and "fetch, verify and describe model weights" in capsys.readouterr().out


def test_unknown_command_is_still_a_usage_error(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["no-such-command"])
    assert done.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "expected"), [
    (["pair", "state"], "pair"), (["-h", "gpu"], "gpu"), ([], None), (["--", "gpu"], None), (["nope"], None)])
def test_chosen_command(argv, expected):
    assert cli.chosen_command(argv) == expected
