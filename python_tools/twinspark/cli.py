"""The `twinspark` command: one sub-command group per module.

COMMANDS names every sub-command with the module that registers it and its one-line help. Only the chosen
sub-command's module is imported, so a dependency missing on this machine (huggingface_hub on a controller,
ansible on a node) breaks the commands that need it and no other; `twinspark --help` is built from the table alone.
Each module exposes `register(subparsers)`, which adds its parser(s) and sets `func` (a callable taking the parsed
args and returning the exit code). A new module is one line per sub-command it registers in COMMANDS;
tests/test_cli.py fails when the table and a module's registrations disagree.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module that registers it, help shown by `twinspark --help`); the order is the order of --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "apikeys": ("twinspark.apikeys", "the head's accepted API keys (rotation without a restart)"),
    "bench": ("twinspark.bench", "concurrency sweep of streaming chat completions (TTFT, tok/s)"),
    "doctor": ("twinspark.doctor.command",
               "judge this node (or saved facts) against the failures Spark pairs hit; exit 0, 1 or 2"),
    "env": ("twinspark.envcli", "check env files, print defaults"),
    "settings": ("twinspark.envcli", "files generated from the knob registry"),
    "fabric": ("twinspark.fabric.commands", "the interconnect: GID index, port table, bandwidth benchmark"),
    "firewall": ("twinspark.firewall", "watch the host firewall's nftables table; re-apply it when deleted"),
    "deploy": ("twinspark.frontdoor", "make both nodes match the inventory and serve (site.yml)"),
    "start": ("twinspark.frontdoor", "start the pair: worker first, then head (playbooks/start.yml)"),
    "stop": ("twinspark.frontdoor", "stop the pair: head, then worker (playbooks/stop.yml)"),
    "restart": ("twinspark.frontdoor", "ordered restart of both ranks (playbooks/restart.yml)"),
    "status": ("twinspark.frontdoor", "show both units and the API (playbooks/status.yml)"),
    "upgrade": ("twinspark.frontdoor",
                "stage the inventory's runtime, switch, restart, gate, roll back on failure (playbooks/upgrade.yml)"),
    "rollback": ("twinspark.frontdoor", "return both nodes to the previous runtime, once (playbooks/rollback.yml)"),
    "rotate": ("twinspark.frontdoor",
               "replace a secret while the pair serves, the new one valid before the old is dropped "
               "(playbooks/rotate.yml)"),
    "gpu": ("twinspark.gpu", "GPU facts from nvidia-smi"),
    "health": ("twinspark.health.command", "check the pair's health (table, --json, --prom-file)"),
    "serve": ("twinspark.launcher", "start this node's vLLM rank from its env files (exec, no shell)"),
    "model": ("twinspark.weights", "fetch, verify and describe model weights"),
    "monitor": ("twinspark.monitoring", "the pair's monitoring: scrape config for an existing Prometheus"),
    "route-check": ("twinspark.netguard",
                    "refuse to dial a simulated-pair address whose route would leave this machine"),
    "plan": ("twinspark.memfit",
             "whether a configuration fits a node's memory (weights, KV cache); exit 0 fits, 2 not"),
    "recipe": ("twinspark.recipecheck",
               "the recipes (models) this project serves: list, show, check against the vLLM that serves them"),
    "pair": ("twinspark.pair.cli", "keep the two ranks serving as one pair (runs on the head)"),
    "patch": ("twinspark.patching", "apply, check or revert the vLLM patches (all or nothing)"),
    "runtime": ("twinspark.runtime.installed", "report the installed serving runtime (vLLM, torch, patches)"),
    "tls": ("twinspark.tls", "the API's optional TLS (a self-signed test certificate; rotation's head steps)"),
}

# Kept for callers that list the modules (each once, in table order).
COMMAND_MODULES = list(dict.fromkeys(module for module, _ in COMMANDS.values()))


def chosen_command(argv: list[str]) -> str | None:
    """The sub-command `argv` asks for: its first word that is not an option (the top level takes no values)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _unregistered(name: str, module: str):
    def run(_args: argparse.Namespace) -> int:
        print(f"twinspark {name}: {module} did not register this command; fix COMMANDS in twinspark/cli.py",
              file=sys.stderr)
        return 2
    return run


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser: `command`'s module registers its own sub-commands, every other name is a stub with help.

    Raises ImportError when `command`'s module (or something it needs) cannot be imported.
    """
    parser = argparse.ArgumentParser(prog="twinspark", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen_module = COMMANDS[command][0] if command else None
    for name, (module, help_text) in COMMANDS.items():
        if module == chosen_module:
            importlib.import_module(module).register(subparsers)
            chosen_module = None  # registered all of its commands, at the place of its first one
        elif name not in subparsers.choices:
            stub = subparsers.add_parser(name, help=help_text, add_help=False)
            stub.set_defaults(func=_unregistered(name, module))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = chosen_command(argv)
    try:
        parser = build_parser(command)
    except ImportError as exc:
        module = COMMANDS[command][0] if command else "twinspark"
        print(f"twinspark {command}: cannot import {module} ({exc}); install what it needs on this machine "
              "(`make setup` on a controller), other commands are unaffected", file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    args.argv = argv  # the words as typed, for a command that lays them over recorded defaults (`twinspark pair`)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
