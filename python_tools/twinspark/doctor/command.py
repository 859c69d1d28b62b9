"""`twinspark doctor`: this node's facts, judged against the failures Spark pair owners hit (docs/DOCTOR.md).

  twinspark doctor [--json]                          collect here and judge, with this node's env file
  twinspark doctor --collect                         print the facts as JSON (the settings the rules read included)
  twinspark doctor --facts FILE [--facts FILE] [--preflight] [--json]
                                                     judge saved facts; two to eight are compared too

Settings come from --env FILE... (default: this node's serve env file when it can be read), else the registry's
defaults for --profile. Exit codes: 0 clean, 1 warnings only, 2 a finding that stops serving (acknowledged ones
in TWINSPARK_DOCTOR_ACK do not count), 3 bad input (one line naming it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping

from twinspark import envfile, layout, safeio, settings
from twinspark.doctor import collect, rules

EXIT_BAD_INPUT = 3
MAX_FACTS_BYTES = 8 << 20


def default_env_file() -> str:
    """This node's serve.env (the layout, read when first needed: importing this module reads no file)."""
    return layout.current().serve_env


class BadInput(Exception):
    """One line naming the file or option and what to do."""


def _env_values(paths: list[str], profile: str | None) -> dict[str, str]:
    """The settings the rules read, from the env files (later override earlier) or, with none readable, the
    registry's defaults for `profile`."""
    explicit = bool(paths)
    read = envfile.read_files(paths or [default_env_file()])
    if read.refused and explicit:
        raise BadInput(read.refused[0] + "; pass readable env files with --env, or none to use --profile's defaults")
    values = {} if read.refused else dict(read.values)
    if profile:
        values.setdefault("TWINSPARK_PROFILE", profile)
    return rules.settings_of({}, values)


def _recorded(values: Mapping[str, str]) -> dict[str, str]:
    return {name: values[name] for name in rules.SETTINGS_READ if name in values}


def collect_here(values: Mapping[str, str]) -> dict:
    lay = layout.current()
    options = rules.collector_options(values, lay.venv, lay.state_dir, lay.unit_vllm, lay.bandwidth_record)
    facts = collect.collect(options["nccl_so"], str(options["venv"]), dict(options["paths"]), str(options["unit"]),
                            str(options["record"]))
    facts["settings"] = _recorded(values)
    return facts


def _load_facts(path: str) -> dict:
    try:
        data = json.loads(safeio.read_bounded(path, MAX_FACTS_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise BadInput(f"--facts {path}: no such file; write one with `twinspark doctor --collect > FILE`") from None
    except (safeio.RefusedFile, UnicodeDecodeError, ValueError) as error:
        raise BadInput(f"--facts {path}: not a facts file ({error}); write one with `twinspark doctor --collect`") \
            from None
    if not isinstance(data, dict) or data.get("schema") != collect.SCHEMA:
        raise BadInput(f"--facts {path}: not a facts file of schema {collect.SCHEMA}; write one with "
                       "`twinspark doctor --collect`")
    return data


def _host(facts: Mapping, fallback: str) -> str:
    return str(facts.get("hostname") or fallback)


def run(args: argparse.Namespace) -> int:
    try:
        if args.collect and args.facts:
            raise BadInput("--collect and --facts exclude each other: collect here, or judge saved facts")
        if len(args.facts) > 8:
            raise BadInput("--facts: give one file (a node), or two to eight (a pair or a group), not more")
        given = _env_values(args.env_files, args.profile) if (args.env_files or not args.facts) else None
        if args.collect:
            print(json.dumps(collect_here(given or {}), indent=1, sort_keys=True))
            return 0
        if args.facts:
            loaded = [_load_facts(path) for path in args.facts]
            facts = {}
            for index, item in enumerate(loaded):
                host = _host(item, args.facts[index])
                facts[host if host not in facts else f"{host}#{index + 1}"] = item
        else:
            here = collect_here(given or {})
            facts = {_host(here, "this node"): here}
        override = _recorded(given) if given is not None else \
            {"TWINSPARK_PROFILE": args.profile} if args.profile else None
        envs = {host: rules.settings_of(item, override) for host, item in facts.items()}
    except BadInput as error:
        print(f"twinspark doctor: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = rules.judge_pair(facts, envs)
    unused = rules.unused_acknowledgements(report, envs)
    if args.json:
        print(json.dumps({**report.to_dict(args.preflight), "unused_acknowledgements": unused}, indent=2))
    else:
        print(rules.table(report, args.preflight))
        for line in unused:
            print(f"note   acknowledged but not found: {line} (remove it from twinspark_doctor_ack)")
    return report.exit_code(args.preflight)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor", help="judge this node (or saved facts) against the failures Spark pairs hit; exit 0, 1 or 2",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collect", action="store_true", help="print this node's facts as JSON, judge nothing")
    parser.add_argument("--facts", action="append", default=[], metavar="FILE",
                        help="judge facts saved by --collect; twice for the two nodes of a pair, up to eight times "
                             "for a group (compared across every node)")
    parser.add_argument("--env", action="append", default=[], metavar="FILE", dest="env_files",
                        help=f"env file(s) to judge against (default: {default_env_file()}, or with --facts the "
                             "settings recorded in the facts)")
    parser.add_argument("--profile", choices=settings.PROFILES,
                        help="the profile whose defaults apply when no env file can be read (default gb10)")
    parser.add_argument("--preflight", action="store_true",
                        help="judge as playbooks/preflight.yml does: a finding a later play of site.yml fixes does "
                             "not count")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.set_defaults(func=run)

