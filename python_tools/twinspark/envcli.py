"""`twinspark env check|defaults` and `twinspark settings generate`.

Exit codes: 0 valid / up to date, 1 generated files stale (`settings generate --check`), 2 invalid input.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path

from twinspark import envfile, generate, layout, nodeenv, settings, validate
from twinspark.runtime import store

EXIT_OK = 0
EXIT_STALE = 1
EXIT_INVALID = 2


def register(subparsers) -> None:
    env = subparsers.add_parser("env", help="check env files, print defaults")
    env_verbs = env.add_subparsers(dest="verb", required=True, metavar="VERB")

    check = env_verbs.add_parser("check", help="validate env files (later files override earlier ones)")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.add_argument("--json", action="store_true", help="print the outcome as JSON on stdout")
    check.add_argument("--skip-permissions", action="store_true",
                       help="do not require secrets to come from a 0600 file (for a temporary copy being validated)")
    check.add_argument("--runtime", metavar="DIR",
                       help="also refuse knobs set in the files that this installed runtime never reads (a venv "
                            f"such as {layout.current().venv}, or a runtime directory under "
                            f"{layout.current().runtime_root})")
    check.set_defaults(func=cmd_check)

    defaults = env_verbs.add_parser("defaults", help="print a complete env file of every default")
    defaults.add_argument("--profile", choices=("gb10", "cpu"), default="gb10")
    defaults.add_argument("--rank", type=int, choices=(0, 1), default=0)
    defaults.add_argument("--output", metavar="FILE", help="write it (atomically, mode 0640) instead of printing")
    defaults.set_defaults(func=cmd_defaults)

    settings_parser = subparsers.add_parser("settings", help="files generated from the knob registry")
    settings_verbs = settings_parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    generate = settings_verbs.add_parser("generate", help="write docs/CONFIG.md and the serve_env argument specs")
    generate.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is stale")
    generate.add_argument("--root", type=Path, help="repository root (default: the tree this package is in)")
    generate.set_defaults(func=cmd_generate)


def _loose_secrets(files: list[str], origin: dict[str, str]) -> list[str]:
    """Secrets read from a file that group or others may read."""
    registry = settings.load()
    problems = []
    for name, where in origin.items():
        knob = registry.get(name)
        if knob is None or not knob.secret:
            continue
        path = where.rsplit(":", 1)[0]
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            problems.append(f"{name}: read from {path}, which group or others can read; keep secrets in a file "
                            f"of mode 0600 (chmod 600 {path})")
    return problems


def cmd_check(args: argparse.Namespace) -> int:
    read = envfile.read_files(args.files)
    if read.refused:  # judging what is left would only add noise: the file itself is the problem
        for line in read.problems:
            print(line, file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "problems": read.problems, "profile": None, "values": {}}, indent=2))
        return EXIT_INVALID
    result = validate.validate(read.values)
    problems = read.problems + [str(p) for p in result.problems]
    if not args.skip_permissions:
        problems += _loose_secrets(args.files, read.origin)
    if args.runtime:
        reads = store.reads_of(Path(args.runtime))
        if reads is None:
            problems.append(f"--runtime {args.runtime}: no venv with a vllm package there; give the serving venv "
                            f"({layout.current().venv}) or a directory under {layout.current().runtime_root}")
        else:
            problems += store.unread_knobs(read.values, reads)
    for line in problems:
        print(line, file=sys.stderr)
    if args.json:
        registry = settings.load()
        shown = {k: v for k, v in result.values.items() if not registry[k].secret}
        print(json.dumps({"ok": not problems, "problems": problems, "profile": result.profile, "values": shown},
                         indent=2))
    return EXIT_INVALID if problems else EXIT_OK


def cmd_defaults(args: argparse.Namespace) -> int:
    registry = settings.load()
    serve, secrets = nodeenv.example_env(args.profile, args.rank)
    header = (
        f"TwinSpark env file: every default of the {args.profile} profile for rank {args.rank} "
        f"({nodeenv.ROLE_OF_RANK[args.rank]}).\n"
        f"MASTER_ADDR, WORKER_HOST and VLLM_HOST_IP come from the documentation range 192.0.2.0/24:\n"
        "put the nodes' own fabric addresses there. Reference: docs/CONFIG.md."
    )
    text = envfile.render({**serve, **secrets}, header)
    written = {**serve, **secrets}
    unset = [k.env for k in registry.knobs if k.applies_to(args.profile) and k.env not in written]
    if unset:
        text += "# Absent unless set (see docs/CONFIG.md):\n" + "".join(f"# {name}=\n" for name in unset)
    if args.output:
        envfile.write_atomic(args.output, text, mode=0o640)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def cmd_generate(args: argparse.Namespace) -> int:
    root = args.root or generate.repo_root()
    if args.check:
        stale = generate.stale(root)
        for rel in stale:
            print(f"{rel}: stale; run `twinspark settings generate`", file=sys.stderr)
        return EXIT_STALE if stale else EXIT_OK
    for rel, text in generate.outputs().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        envfile.write_atomic(path, text, mode=0o644)
        print(f"wrote {rel}")
    return EXIT_OK
