"""The `twinspark` command: one sub-command group per module.

Each module listed in COMMAND_MODULES exposes `register(subparsers)`, which adds its parser(s) and sets
`func` (a callable taking the parsed args and returning the exit code). Modules must be cheap to import:
heavy imports (torch, ansible) belong inside the functions that need them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = [
    "twinspark.bench",
    "twinspark.envcli",
    "twinspark.fabric.commands",
    "twinspark.frontdoor",
    "twinspark.gpu",
    "twinspark.health",
    "twinspark.launcher",
    "twinspark.model",
    "twinspark.netguard",
    "twinspark.pairguard",
    "twinspark.patching",
    "twinspark.runtime",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="twinspark", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
