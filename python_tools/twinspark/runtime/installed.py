"""What a node's serving runtime is, in the terms the two nodes must agree on, and whether it accepts our flags.

`twinspark runtime facts [--json]` reports the installed vLLM (distribution and version), torch, the patch status
and a digest of the installed `twinspark` package (its files' content, not its version number, so a rebuilt package
with the same version still counts as different), the versioned runtime's id (docs/UPGRADES.md), and the runtime
flavour (stock or fork): --flavour when given, else TWINSPARK_RUNTIME_FLAVOUR from the node's env file (--env-file,
default /etc/twinspark/serve.env; the registry's default when the file does not set it, null when the file is absent
or unreadable). The vllm_runtime role compares these between the two nodes. It reads installed metadata only: it
imports neither vLLM nor torch.

Exit codes: 0 the report was produced (whatever it says); 2 invalid input.

`twinspark runtime check --env FILE...` builds the exact argv and environment `twinspark serve` would exec (same
launcher function, same env files) and asks the installed vLLM whether it accepts them: its `vllm serve` parser,
`validate_parsed_serve_args`, `AsyncEngineArgs.from_cli_args`, and, when the model's config.json is found and a GPU
is visible (or --capability is given), vLLM's DeepSeek-V4 attention- and MoE-backend checks for that capability
(see twinspark/vllmcheck.py). Run it in the serving venv before the units start; it loads no weights.
It also asks the memory planner (`twinspark plan`, this node's memory, the model's files when they are here): a
configuration that does not fit is refused (one line with the planner's advice) unless TWINSPARK_PLAN_FIT=warn.
The report names the account it ran as (`as` line; `account` and `uid` in --json): the playbooks never run it as
root, but as the serving account in a sandboxed transient unit (twinspark/runtime/sandbox.py, docs/RUNTIME.md).
Exit codes: 0 vLLM accepts everything checked and the planner finds it fits (or could not judge it); 1 vLLM refuses
(one line per flag with vLLM's reason), vLLM cannot be imported, or the planner refuses; 2 invalid input (env files,
--capability, --model-config).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as metadata
import json
import os
import pwd
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from twinspark import envfile, launcher, layout, memfit, patching, settings, vllm_entry, vllmcheck
from twinspark.runtime import store

PACKAGE = "twinspark"


def package_digest(files: Iterable[tuple[str, bytes]]) -> str:
    """SHA-256 over (relative path, content) pairs in path order; the same files give the same digest anywhere."""
    outer = hashlib.sha256()
    for path, content in sorted(files):
        outer.update(f"{path}\0{hashlib.sha256(content).hexdigest()}\n".encode())
    return outer.hexdigest()


def installed_files(distribution: metadata.Distribution) -> list[tuple[str, bytes]]:
    """The files the installer recorded with a hash (code and data; not RECORD itself, not bytecode)."""
    result = []
    for entry in distribution.files or []:
        if entry.hash is None or entry.suffix == ".pyc":
            continue
        result.append((str(entry), Path(distribution.locate_file(entry)).read_bytes()))
    return result


def _version(name: str, find: Callable[[str], metadata.Distribution]) -> str | None:
    try:
        return find(name).version
    except metadata.PackageNotFoundError:
        return None


FLAVOUR_ENV = "TWINSPARK_RUNTIME_FLAVOUR"


def default_env_file() -> str:
    """This node's serve.env (the layout, read when first needed: importing this module reads no file)."""
    return layout.current().serve_env


def flavour_from_env(path: Path) -> str | None:
    """The flavour an env file selects: its TWINSPARK_RUNTIME_FLAVOUR, the registry's default when unset or empty
    there, None when the file cannot be read (not written yet on a fresh node)."""
    read = envfile.read_files([path])
    if read.refused:
        return None
    if read.values.get(FLAVOUR_ENV):
        return read.values[FLAVOUR_ENV]
    knob = next((k for k in settings.load().knobs if k.env == FLAVOUR_ENV), None)
    return None if knob is None else knob.default


def facts(
    site_packages: Path,
    patches_dir: Path,
    find: Callable[[str], metadata.Distribution],
    only: list[str] | None = None,
    flavour: str | None = None,
) -> dict:
    vllm = {name: version for name in patching.DISTRIBUTIONS if (version := _version(name, find))}
    try:
        package = package_digest(installed_files(find(PACKAGE)))
    except metadata.PackageNotFoundError:
        package = None
    try:
        outcome = patching.run("status", site_packages, patches_dir, only)
        patches = {state.patch.name: state.state for state in outcome.states}
        patch_error = None
    except patching.PatchError as exc:
        patches, patch_error = {}, str(exc)
    return {
        "vllm": " ".join(f"{name}=={version}" for name, version in sorted(vllm.items())) or None,
        "torch": _version("torch", find),
        "patches": patches,
        "patch_error": patch_error,
        "twinspark_version": _version(PACKAGE, find),
        "twinspark_digest": package,
        "python": ".".join(map(str, sys.version_info[:3])),
        "flavour": flavour,
        "runtime_id": runtime_id_of(site_packages),
    }


def runtime_id_of(site_packages: Path) -> str | None:
    """The versioned runtime a site-packages belongs to (<root>/<id>/venv/lib/pythonX.Y/site-packages, links
    resolved: /opt/twinspark/venv goes through `current`), None outside that layout."""
    parts = site_packages.resolve().parts
    if len(parts) >= 5 and parts[-4] == "venv" and store.is_id(parts[-5]):
        return parts[-5]
    return None


def _command(args: argparse.Namespace) -> int:
    site_packages = Path(args.site_packages)
    if not site_packages.is_dir():
        print(f"twinspark runtime facts: --site-packages {site_packages} is not a directory", file=sys.stderr)
        return 2
    flavour = args.flavour or flavour_from_env(Path(args.env_file))
    found = facts(site_packages, Path(args.patches_dir), lambda name: _find(name, site_packages), args.only,
                  flavour)
    if args.json:
        print(json.dumps(found, indent=2, sort_keys=True))
    else:
        width = max(len(key) for key in found)
        for key, value in found.items():
            shown = ", ".join(f"{k}: {v}" for k, v in value.items()) if isinstance(value, dict) else value
            print(f"{key.ljust(width)}  {shown if shown not in (None, '') else '-'}")
    return 0


def survey(site_packages: Path, patches_dir: Path, only: list[str] | None, flavour: str | None) -> dict:
    """Everything the vllm_runtime role reads of a staged runtime, from one process: its site-packages, the patch
    status (as `twinspark patch status --json` prints it, exit_code included), which fork-only knobs it reads (as
    `twinspark runtime knobs`) and its facts (as `twinspark runtime facts --json`)."""
    try:
        outcome = patching.run("status", site_packages, patches_dir, only)
        patch = patching.as_json(outcome, site_packages)
    except patching.PatchError as exc:
        patch = {"action": "status", "exit_code": exc.exit_code, "error": str(exc), "patches": []}
    return {"site_packages": str(site_packages), "patch": patch, "knobs": store.knob_readers(site_packages),
            "facts": facts(site_packages, patches_dir, lambda name: _find(name, site_packages), only, flavour)}


def _survey_command(args: argparse.Namespace) -> int:
    site_packages = Path(args.site_packages)
    if not (site_packages / "vllm").is_dir():
        print(f"twinspark runtime survey: --site-packages {site_packages} holds no vllm package", file=sys.stderr)
        return 2
    flavour = args.flavour or flavour_from_env(Path(args.env_file))
    print(json.dumps(survey(site_packages, Path(args.patches_dir), args.only, flavour), sort_keys=True))
    return 0


def _find(name: str, site_packages: Path) -> metadata.Distribution:
    for distribution in metadata.distributions(path=[str(site_packages)]):
        if (distribution.metadata["Name"] or "").lower().replace("_", "-") == name:
            return distribution
    raise metadata.PackageNotFoundError(name)


SCRATCH_DIRS = ("VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TILELANG_CACHE_DIR",
                "TRITON_CACHE_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")


def model_config_path(values: dict[str, str]) -> Path | None:
    """Where this node's config.json for MODEL would be: the local directory, or the pinned Hub snapshot."""
    directory = memfit.model_dir(values)
    return None if directory is None else directory / "config.json"


def parse_capability(text: str) -> tuple[int, int]:
    """"12.1" -> (12, 1); ValueError naming the expected form otherwise."""
    major, dot, minor = text.partition(".")
    if not (dot and major.isdigit() and minor.isdigit() and len(minor) == 1):
        raise ValueError(f"--capability {text!r}: expected MAJOR.MINOR, e.g. 12.1 for a GB10")
    return int(major), int(minor)


def visible_capability() -> tuple[int, int] | None:
    """The first visible GPU's compute capability, or None when torch sees none."""
    try:
        # torch: only in the serving venv, and seconds to import.
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return int(major), int(minor)
    except Exception:  # noqa: BLE001 - any failure to ask the driver means "no GPU to check against"
        return None
    return None


def running_as(uid: int) -> str:
    """The account name of `uid` (the number itself when the passwd database has none): what the vLLM code the check
    imported ran as, printed with the verdict."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _check_command(args: argparse.Namespace) -> int:
    name = "twinspark runtime check"
    if not args.env_files and not args.environ:
        print(f"{name}: give --env FILE (repeatable) or --environ", file=sys.stderr)
        return 2
    try:
        capability = parse_capability(args.capability) if args.capability else None
    except ValueError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    registry = settings.load()
    result, problems = launcher.read_settings(args.env_files, args.environ, registry)
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        return 2
    values = dict(result.values)
    # The GID index only reaches NCCL's environment, never vLLM's parser: no fabric needed to check.
    command = launcher.build_command(values, result.others, registry)
    argv = command.argv[1 + len(launcher.VLLM_ENTRY):]

    config_path = Path(args.model_config) if args.model_config else model_config_path(values)
    hf_config = None
    if args.model_config and not config_path.is_file():
        print(f"{name}: --model-config {config_path} is not a file", file=sys.stderr)
        return 2
    if config_path is not None and config_path.is_file():
        try:
            hf_config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"{name}: {config_path} is not readable JSON: {exc}", file=sys.stderr)
            return 2
    if capability is None and not args.no_gpu:
        capability = visible_capability()
    # Before vLLM: the memory planner (twinspark plan) on this node's memory; TWINSPARK_PLAN_FIT says whether a
    # configuration that does not fit is refused or only warned about.
    fit = memfit.fit_here(values)
    rank = values.get("NODE_RANK")
    for line in filter(None, (fit.refusal, fit.warning and f"warning: {fit.warning}")):
        print(f"{name}: rank {rank}: {line}", file=sys.stderr)

    for key in command.unset:
        os.environ.pop(key, None)
    os.environ.update(command.env)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM logs to stdout; keep the report clean
    os.environ.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    vllm_entry.install_alias()
    with tempfile.TemporaryDirectory(prefix="twinspark-runtime-check-") as scratch:
        # Whatever vLLM or torch caches while importing goes to a scratch directory, never into the service user's
        # cache directories: typed by hand as root, root-owned files there would break the next start.
        os.environ.update({key: str(Path(scratch) / key.lower()) for key in SCRATCH_DIRS})
        if args.vllm_cache:
            os.environ["VLLM_CACHE_ROOT"] = os.path.abspath(args.vllm_cache)
        try:
            # vllm: only in the serving venv; importing it is the check.
            import vllm  # noqa: F401
        except ImportError as exc:
            print(f"{name}: vLLM is not importable here ({exc}); run it with the serving venv's python "
                  f"({layout.current().cli})", file=sys.stderr)
            return 1
        report = vllmcheck.check(argv, hf_config, capability, args.assume_kernels)
    flavour = values.get("TWINSPARK_RUNTIME_FLAVOUR", "stock")
    account = running_as(os.geteuid())
    if os.geteuid() == 0:
        report.notes.append("ran as root: the runtime's code had every privilege here; the playbooks run this check "
                            "as the serving account in a sandboxed unit (docs/RUNTIME.md)")
    shown = {
        "ok": report.ok,
        "account": account,
        "uid": os.geteuid(),
        "profile": values["TWINSPARK_PROFILE"],
        "flavour": flavour,
        "node_rank": values.get("NODE_RANK"),
        "capability": ".".join(map(str, capability)) if capability else None,
        "model_config": str(config_path) if hf_config is not None else None,
        "findings": [{"flag": f.flag, "reason": f.reason} for f in report.findings],
        "checked": report.checked,
        "notes": report.notes,
        "plan": fit.plan.to_dict() if fit.plan else None,
        "plan_verdict": fit.refusal or fit.warning or fit.note or "fits",
    }
    shown["ok"] = report.ok and not fit.refusal
    if args.json:
        print(json.dumps(shown, indent=2))
    else:
        print(f"as    {account} (uid {os.geteuid()})")
        for line in report.checked:
            print(f"ok    {line}")
        if fit.plan is not None and fit.plan.fits:
            print(f"ok    twinspark plan: fits ({fit.plan.kv_cache_tokens:,} KV-cache tokens for MAX_MODEL_LEN "
                  f"{fit.plan.max_model_len:,})")
        for line in [*report.notes, *filter(None, [fit.note])]:
            print(f"note  {line}")
    for finding in report.findings:
        print(f"{name}: rank {shown['node_rank']} ({flavour} runtime): {finding}", file=sys.stderr)
    return 0 if shown["ok"] else 1


def _runtime_options(parser: argparse.ArgumentParser) -> None:
    """The options `runtime facts` and `runtime survey` share."""
    parser.add_argument(
        "--site-packages",
        default=sysconfig.get_paths()["purelib"],
        help="site-packages of the serving venv (default: this interpreter's, %(default)s)",
    )
    parser.add_argument(
        "--patches-dir",
        default=os.environ.get(patching.PATCHES_DIR_ENV, patching.DEFAULT_PATCHES_DIR),
        help=f"as for `twinspark patch` (default: ${patching.PATCHES_DIR_ENV} or {patching.DEFAULT_PATCHES_DIR})",
    )
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="as for `twinspark patch`: report these patches only"
    )
    parser.add_argument("--env-file", default=default_env_file(), metavar="FILE",
                        help=f"read {FLAVOUR_ENV} from this env file (default: %(default)s)")
    parser.add_argument("--flavour", choices=("stock", "fork"),
                        help=f"report this flavour instead of reading {FLAVOUR_ENV} from --env-file")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("runtime", help="report the installed serving runtime (vLLM, torch, patches)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    checker = verbs.add_parser(
        "check", help="ask the installed vLLM whether it accepts this node's argv (before the units start)",
        description=__doc__,
    )
    checker.add_argument("--env", action="append", default=[], metavar="FILE", dest="env_files",
                         help="env file, as for `twinspark serve`; repeat it, later files override earlier ones")
    checker.add_argument("--environ", action="store_true", help="as for `twinspark serve`")
    checker.add_argument("--model-config", metavar="PATH",
                         help="the model's config.json (default: MODEL's directory, or its pinned snapshot under "
                              "HF_HOME when present)")
    checker.add_argument("--capability", metavar="MAJOR.MINOR",
                         help="check the backends for this compute capability (default: the visible GPU's)")
    checker.add_argument("--no-gpu", action="store_true", help="do not ask torch for a GPU (skip backend checks "
                                                               "unless --capability is given)")
    checker.add_argument("--assume-kernels", action="store_true",
                         help="for machines without the CUDA kernel packages (CI): assume FlashInfer's SM120 "
                              "sparse MLA API is present instead of failing on its absence; reported as a note")
    checker.add_argument("--vllm-cache", metavar="DIR",
                         help="keep vLLM's cache (among it what its registry learned of each model class, by the "
                              "class's source hash) in DIR instead of a scratch directory, so that the next check "
                              "skips the registry's subprocess; DIR must be the caller's own (default: scratch)")
    checker.add_argument("--json", action="store_true", help="print the report as JSON")
    checker.set_defaults(func=_check_command)
    report = verbs.add_parser("facts", help=__doc__.splitlines()[0], description=__doc__)
    _runtime_options(report)
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.set_defaults(func=_command)
    surveyed = verbs.add_parser(
        "survey", help="site-packages, patch status, knob reads and facts of the runtime, as one JSON object",
        description=survey.__doc__)
    _runtime_options(surveyed)
    surveyed.set_defaults(func=_survey_command)
    store.add_verbs(verbs)
