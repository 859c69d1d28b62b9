"""`twinspark recipe`: the catalogue, and the proofs that a recipe will start on the vLLM that serves it.

  twinspark recipe list [--json]
  twinspark recipe show NAME [--json]
  twinspark recipe check NAME|--all [--nodes N] [--flavour F] [--python PATH] [--memory-bytes N] [--json]
  twinspark recipe switch NAME [-i INVENTORY] [--limit PAIR] [--check] ...   (playbooks/recipe.yml, docs/RECIPES.md)

`check` runs, per layout of the recipe (or the one for --nodes), every proof docs/RECIPES.md lists: the planner's
fit on a node's memory, and, with vLLM importable (a node's runtime venv, or --python naming a venv holding the vLLM
to judge by, such as the one scripts/build-vllm-parser-venv builds from a release's wheel), vLLM's own verdicts: its
`vllm serve` parser and validation on the rank's argv, the architecture in its model registry, the heads against the
tensor-parallel size and pipeline support (ModelConfig.verify_with_parallel_config), the tool-call and reasoning
parsers, the quantization method, the KV-cache dtype and every VLLM_* variable the recipe sets.

Exit codes: 0 every proof passed, 2 a proof failed (each failure names the recipe field to fix), 3 bad input (no
such recipe or layout, vLLM not importable). `switch` has the front door's codes (twinspark.frontdoor): 2 for an
unknown recipe, refused before Ansible runs, else the playbook's exit code or, after it, the health exit code.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

from twinspark import frontdoor, inventory, launcher, memfit, recipe, settings, vllmcheck
from twinspark import weights as checkpoint

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 2, 3
# `recipe switch` keeps the front door's codes: 2 refused before any run, else the playbook's or health's.
SWITCH_BAD_INPUT = 2
# A Spark's memory as the doctor's collector reads it (MemTotal of the handshaped GB10 head in the tests'
# fixtures, docs/DOCTOR.md): what the planner judges a gb10 recipe against when no node is asked.
GB10_MEMORY_BYTES = 128_505_040_896
# The example fabric addresses the argv is built with (nothing is contacted).
HEAD, WORKER = "192.0.2.1", "192.0.2.2"


class CheckInputError(ValueError):
    """One line naming the option or recipe and the fix."""


@dataclass(frozen=True)
class Proof:
    name: str
    ok: bool
    detail: str


# ----------------------------------------------------------------------------------------------------- argv


def stand_in_models(names: Sequence[str], root: Path) -> dict[str, str]:
    """A model directory per recipe holding only a config.json written from the recipe's architecture facts, where
    vLLM looks: the pinned snapshot under `root` (used as HF_HOME, offline) for a Hub id, `root`/local/<name> for a
    local model (its argv names that directory instead). Returns {recipe: the model argv names}. vLLM judges the
    recipe's own facts this way; on a node, `twinspark runtime check` judges the downloaded checkpoint's file."""
    models = {}
    for name in names:
        chosen = recipe.get(name)
        if chosen.model.startswith("/"):
            folder, models[name] = root / "local" / name, str(root / "local" / name)
        else:
            folder, models[name] = checkpoint.snapshot_dir(root, chosen.model, chosen.revision), chosen.model
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(chosen.config(), indent=1), encoding="utf-8")
    return models


def rank_argv(chosen: recipe.Recipe, layout: recipe.Layout, flavour: str, model: str | None = None) -> list[str]:
    """The words after `serve` that rank 0 of a group in `layout` would run with the recipe's defaults (the model
    named `model` when given: a stand-in directory)."""
    values = recipe.defaults(chosen.profile, 0, flavour, chosen.name)
    values.update({recipe.RECIPE_ENV: chosen.name, "TWINSPARK_RUNTIME_FLAVOUR": flavour, "NODE_RANK": "0",
                   "MASTER_ADDR": HEAD, "WORKER_HOST": WORKER, "VLLM_HOST_IP": HEAD})
    argv = launcher.build_command(values).argv
    words = argv[argv.index("serve") + 1:]
    if model is not None:
        words[0] = model
    for flag, value in (("--tensor-parallel-size", layout.tp), ("--pipeline-parallel-size", layout.pp),
                        ("--nnodes", layout.nodes)):
        if flag in words:
            words[words.index(flag) + 1] = str(value)
    return words


# ----------------------------------------------------------------------------------------------------- proofs


def plan_proof(chosen: recipe.Recipe, layout: recipe.Layout, flavour: str, memory: int) -> Proof:
    values = recipe.defaults(chosen.profile, 0, flavour, chosen.name)
    values[recipe.RECIPE_ENV] = chosen.name
    weights = int(chosen.memory.get("weights_bytes") or 0)
    if weights <= 0:
        return Proof("planner fit", False, "memory.weights_bytes is missing: give the checkpoint's size in bytes")
    try:
        plan = memfit.make_plan(values, chosen.config(), weights, memory, layout.tp, layout.pp)
    except memfit.PlanInputError as error:
        return Proof("planner fit", False, f"{error} (fix the recipe's architecture facts)")
    detail = (f"{plan.weights_bytes / memfit.GIB:.1f} GiB weights per rank, {plan.kv_cache_tokens} KV tokens for "
              f"MAX_MODEL_LEN {plan.max_model_len} on {memory / memfit.GIB:.1f} GiB")
    if not plan.fits:
        detail += "; " + "; ".join(plan.advice) + " (set it under the recipe's knobs:)"
    return Proof("planner fit", plan.fits, detail)


def vllm_available(python: str | None = None) -> bool:
    return python is not None or importlib.util.find_spec("vllm") is not None


def _literal(relative: str, name: str) -> list[str]:
    """The members of a Literal[...] type alias in vLLM's source (vLLM keeps some choices only there)."""
    root = Path(importlib.util.find_spec("vllm").origin).parent
    for node in ast.parse((root / relative).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return [e.value for e in node.value.slice.elts if isinstance(e, ast.Constant)]
    raise LookupError(f"{name} not found in vllm/{relative}")


def _answer_or_error(fn) -> tuple[bool, object]:
    """(True, fn()) or (False, the error's text): run in vLLM's registry subprocess, one class's failure to import
    does not cost the others their answers."""
    try:
        return True, fn()
    except Exception as error:  # noqa: BLE001 - reported per class, as vLLM's registry logs and answers None
        return False, repr(error)


class _Catalogues:
    """vLLM's own lists, read once per process (importing them costs seconds)."""

    def __init__(self) -> None:
        # vllm: only where it is installed, and seconds to import.
        import vllm.envs
        from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
        from vllm.model_executor.models.registry import ModelRegistry
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager

        self.registry = ModelRegistry
        self.architectures = set(ModelRegistry.get_supported_archs())
        self.tool_parsers = set(ToolParserManager.list_registered())
        self.reasoning_parsers = set(ReasoningParserManager.list_registered())
        self.quantizations = set(QUANTIZATION_METHODS)
        self.kv_dtypes = set(_literal("config/cache.py", "CacheDType"))
        self.environment = set(vllm.envs.environment_variables)
        self.version = getattr(vllm, "__version__", "?")
        self._pp: dict[str, bool | None] = {}

    def inspect_together(self, architectures: Sequence[str]) -> None:
        """Have vLLM's registry inspect, in one subprocess, every model class of `architectures` it has not cached.

        The registry imports each class it has not seen in a subprocess of its own, which imports vLLM and torch again
        (seconds each; nine recipes, nine subprocesses on a fresh machine). Here each class's own
        `inspect_model_cls` runs twice: first to collect what it would run in its subprocess (its cache lookup comes
        first, so a cached class asks for nothing), then, once one subprocess has run them all, to take its answer and
        cache it exactly as vLLM does, by its source hash. A class that cannot be imported there answers None, as
        vLLM's own `_try_inspect_model_cls` does; should the subprocess itself fail, nothing is cached and each class
        is inspected on its own when asked, as before."""
        # vllm: only where it is installed.
        from vllm.model_executor.models import registry as vllm_registry

        class Deferred(Exception):
            pass

        def defer(fn):
            asked.append(fn)
            raise Deferred

        run_alone = vllm_registry._run_in_subprocess
        waiting, asked = [], []
        try:
            vllm_registry._run_in_subprocess = defer
            for name in dict.fromkeys(architectures):
                model = self.registry.models.get(name)
                try:
                    if model is not None:
                        model.inspect_model_cls()
                except Deferred:
                    waiting.append((name, model))
            if len(waiting) < 2:
                return
            try:
                answers = run_alone(lambda: [_answer_or_error(fn) for fn in asked])
            except Exception:  # noqa: BLE001 - each class is then inspected on its own, as vLLM would
                return
            for (name, model), (answered, answer) in zip(waiting, answers, strict=True):
                if not answered:
                    # What vLLM's _try_inspect_model_cls answers for a class it cannot import: None.
                    self._pp[name] = None
                    continue
                vllm_registry._run_in_subprocess = lambda _fn, answer=answer: answer
                model.inspect_model_cls()
        finally:
            vllm_registry._run_in_subprocess = run_alone

    def supports_pp(self, architecture: str) -> bool | None:
        """vLLM's registry's answer (it imports the model class in a subprocess and caches the answer under
        VLLM_CACHE_ROOT); None when the class cannot be imported here."""
        if architecture not in self._pp:
            info = self.registry._try_inspect_model_cls(architecture)
            self._pp[architecture] = None if info is None else bool(info.supports_pp)
        return self._pp[architecture]


def _heads_proof(chosen: recipe.Recipe, layout: recipe.Layout, found: _Catalogues) -> Proof:
    """vLLM's ModelConfig.verify_with_parallel_config on the recipe's facts: its own heads and pipeline rules."""
    # vllm: only where it is installed, and seconds to import.
    from vllm.config.model import ModelConfig

    architecture = chosen.architecture["architectures"][0]
    answer: dict[str, bool | None] = {}

    def is_pp_supported_model(architectures, model_config) -> bool:
        answer["pp"] = found.supports_pp(architecture)
        return bool(answer["pp"])

    model = SimpleNamespace(
        model_arch_config=SimpleNamespace(total_num_attention_heads=chosen.heads,
                                          total_num_kv_heads=chosen.kv_heads),
        registry=SimpleNamespace(is_pp_supported_model=is_pp_supported_model),
        architectures=[architecture], use_mla=chosen.attention in ("mla", "deepseek_v4"),
        multimodal_config=None, get_total_num_kv_heads=lambda: chosen.kv_heads)
    parallel = SimpleNamespace(enable_hc_sp=False, tensor_parallel_size=layout.tp, enable_expert_parallel=False,
                               pipeline_parallel_size=layout.pp, decode_context_parallel_size=1,
                               world_size_across_dp=layout.nodes)
    try:
        ModelConfig.verify_with_parallel_config(model, parallel)
    except (ValueError, NotImplementedError) as error:
        fix = "parallel.layouts" if "divisible" in str(error) else "parallel.pipeline and parallel.layouts"
        if answer.get("pp") is None and "pp" in answer:
            return Proof("heads and layout (vLLM)", False, f"vLLM could not import {architecture} here to ask "
                                                           "whether it supports pipeline parallel")
        return Proof("heads and layout (vLLM)", False, f"{error} (fix {fix})")
    said = f"{chosen.heads} heads, {chosen.kv_heads} KV heads in {layout}"
    return Proof("heads and layout (vLLM)", True, said + (", pipeline supported" if layout.pp > 1 else ""))


def _named(found_set: set[str], value: str | None, what: str, field: str) -> Proof:
    if value is None:
        return Proof(what, True, "none passed")
    if value in found_set:
        return Proof(what, True, value)
    return Proof(what, False, f"{value!r} is not one this vLLM has (fix {field}); it has {len(found_set)}, e.g. "
                              f"{', '.join(sorted(found_set)[:6])}")


def vllm_proofs(chosen: recipe.Recipe, layout: recipe.Layout, flavour: str, found: _Catalogues,
                model: str | None = None) -> list[Proof]:
    argv = rank_argv(chosen, layout, flavour, model)
    report = vllmcheck.Report()
    engine_args = vllmcheck.serve_args(argv, report)
    architecture = chosen.architecture["architectures"][0]
    if engine_args is not None and found.supports_pp(architecture) is None:
        # vLLM's model config imports the model class (in a subprocess); where this interpreter lacks a package the
        # class needs, that says nothing about the recipe: a node's `twinspark runtime check` judges it there.
        report.notes.append(f"model config check skipped: vLLM cannot import {architecture} in this interpreter")
    elif engine_args is not None:
        vllmcheck.model_config(engine_args, argv, report)  # the model's own limits, from the stand-in config.json
    passed = engine_args is not None and report.ok
    proofs = [Proof("vllm serve parser and validation", passed,
                    "; ".join(report.checked + report.notes) if passed else
                    "; ".join(str(f) for f in report.findings) + " (fix the recipe's args, knobs or architecture)")]
    proofs.append(Proof("model registry", architecture in found.architectures,
                        f"{architecture} is registered" if architecture in found.architectures else
                        f"{architecture} is not in vLLM {found.version}'s model registry (fix "
                        "architecture.architectures, or serve it with a vLLM that has it)"))
    proofs.append(_heads_proof(chosen, layout, found))
    proofs.append(_named(found.tool_parsers, vllmcheck.flag_value(argv, "--tool-call-parser"), "tool-call parser",
                         "args --tool-call-parser"))
    proofs.append(_named(found.reasoning_parsers, vllmcheck.flag_value(argv, "--reasoning-parser"),
                         "reasoning parser", "args --reasoning-parser"))
    proofs.append(_named(found.quantizations, vllmcheck.flag_value(argv, "--quantization"), "quantization flag",
                         "args --quantization"))
    declared = (chosen.architecture.get("quantization_config") or {}).get("quant_method")
    proofs.append(_named(found.quantizations, declared, "checkpoint quantization",
                         "architecture.quantization_config"))
    proofs.append(_named(found.kv_dtypes, vllmcheck.flag_value(argv, "--kv-cache-dtype"), "KV-cache dtype",
                         "args or flavours --kv-cache-dtype"))
    unknown = sorted(name for name in chosen.fixed_env(flavour) if name.startswith("VLLM_")
                     and name not in found.environment)
    proofs.append(Proof("environment", not unknown,
                        f"vLLM {found.version} reads none of {', '.join(unknown)} (fix env)" if unknown else
                        "every VLLM_* variable is one vLLM reads" if chosen.fixed_env(flavour) else "none set"))
    return proofs


def layouts_for(chosen: recipe.Recipe, nodes: int | None) -> list[recipe.Layout]:
    if nodes is None:
        return list(chosen.layouts)
    found = [layout for layout in chosen.layouts if layout.nodes == nodes]
    if not found:
        raise CheckInputError(f"--nodes {nodes}: {chosen.name} is laid out for "
                              f"{', '.join(str(n) for n in chosen.node_counts)} nodes")
    return found


def check(names: Sequence[str], nodes: int | None, flavour: str | None, memory: int | None,
          with_vllm: bool, every: bool = False) -> dict[str, object]:
    """{recipe: {"flavour": ..., "layouts": {layout: [proof...]}}} for each recipe named."""
    models: dict[str, str] = {}
    if with_vllm:
        # Before vLLM (and huggingface_hub, which reads these once) is imported: an offline hub cache of stand-ins.
        home = Path(tempfile.mkdtemp(prefix="twinspark-recipe-check-"))
        models = stand_in_models(names, home)
        os.environ.update(HF_HOME=str(home), HF_HUB_OFFLINE="1")
    found = _Catalogues() if with_vllm else None
    if found is not None:
        found.inspect_together([recipe.get(name).architecture["architectures"][0] for name in names])
    out: dict[str, object] = {"vllm": found.version if found else None, "recipes": {}}
    if every and nodes is not None:
        names = [name for name in names if recipe.get(name).layout_for(nodes) is not None]
    for name in names:
        chosen = recipe.get(name)
        flavours = [flavour] if flavour else list(chosen.flavours[:1])
        if flavours[0] not in chosen.flavours:
            raise CheckInputError(f"--flavour {flavour}: {name} is written for {', '.join(chosen.flavours)}")
        node_memory = memory or (GB10_MEMORY_BYTES if chosen.profile == "gb10" else memfit.node_memory())
        layouts = {}
        for layout in layouts_for(chosen, nodes):
            proofs = [plan_proof(chosen, layout, flavours[0], node_memory)]
            if found is not None:
                proofs += vllm_proofs(chosen, layout, flavours[0], found, models.get(name))
            layouts[str(layout)] = [asdict(p) for p in proofs]
        out["recipes"][name] = {"flavour": flavours[0], "layouts": layouts}
    return out


def _passed(result: dict) -> bool:
    return all(p["ok"] for r in result["recipes"].values() for proofs in r["layouts"].values() for p in proofs)


# ----------------------------------------------------------------------------------------------------- commands


def _fits_here(chosen: recipe.Recipe) -> str:
    group = recipe.group_layout()
    if group not in chosen.layouts:
        return f"needs {' or '.join(str(n) for n in chosen.node_counts)} nodes"
    memory = GB10_MEMORY_BYTES if chosen.profile == "gb10" else memfit.node_memory()
    proof = plan_proof(chosen, group, chosen.flavours[0], memory)
    return "fits" if proof.ok else "does not fit"


def cmd_list(args: argparse.Namespace) -> int:
    rows = []
    for name, chosen in recipe.catalogue().items():
        rows.append({"name": name, "profile": chosen.profile, "model": chosen.model, "revision": chosen.revision,
                     "nodes": list(chosen.node_counts), "layouts": [str(x) for x in chosen.layouts],
                     "pair": _fits_here(chosen), "verified": chosen.verified_text(),
                     "default": name == recipe.default_name(chosen.profile)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    print(f"{'recipe':24} {'profile':7} {'nodes':9} {'this pair (TP2)':18} {'hardware':26} model")
    for row in rows:
        mark = " (default)" if row["default"] else ""
        print(f"{row['name']:24} {row['profile']:7} {','.join(map(str, row['nodes'])):9} {row['pair']:18} "
              f"{row['verified']:26} {row['model']}{mark}")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    chosen = recipe.get(args.name)
    shown = {
        "name": chosen.name, "doc": chosen.doc, "profile": chosen.profile, "model": chosen.model,
        "revision": chosen.revision, "served_name": chosen.served_name, "flavours": list(chosen.flavours),
        "min_vllm": chosen.min_runtime, "architecture": chosen.architecture,
        "layouts": [str(x) for x in chosen.layouts], "args": {f: list(chosen.fixed_args(f)) for f in chosen.flavours},
        "env": {f: chosen.fixed_env(f) for f in chosen.flavours}, "knobs": chosen.knob_defaults(),
        "memory": chosen.memory, "first_boot_s": chosen.first_boot_s, "verified": chosen.verified_text(),
        "sources": chosen.sources,
    }
    if args.json:
        print(json.dumps(shown, indent=2))
        return EXIT_OK
    for key, value in shown.items():
        print(f"{key}: {value if isinstance(value, str) else json.dumps(value)}")
    return EXIT_OK


def _in_other_python(args: argparse.Namespace) -> int:
    """Run the check in --python (a venv holding the vLLM to judge by) with this package on its path."""
    argv = [args.python, "-m", "twinspark.cli", "recipe", "check", *(args.names or []), "--json"]
    for path in args.file or ():
        argv += ["--file", os.path.abspath(path)]
    if args.all:
        argv.append("--all")
    for flag, value in (("--nodes", args.nodes), ("--flavour", args.flavour), ("--memory-bytes", args.memory_bytes)):
        if value is not None:
            argv += [flag, str(value)]
    package_root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": package_root, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE",
                                                                                            "cpu")}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"twinspark recipe check: --python {args.python}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if done.returncode == EXIT_BAD_INPUT or not done.stdout.strip():
        sys.stderr.write(done.stderr[-4000:])
        return EXIT_BAD_INPUT
    return _report(json.loads(done.stdout), args.json)


def _report(result: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print(f"vLLM: {result['vllm'] or 'not importable here: planner only (run on a node, or give --python)'}")
        for name, entry in result["recipes"].items():
            for layout, proofs in entry["layouts"].items():
                verdict = "ok" if all(p["ok"] for p in proofs) else "REFUSED"
                print(f"{name} {layout} ({entry['flavour']}): {verdict}")
                for proof in proofs:
                    print(f"  {'ok  ' if proof['ok'] else 'FAIL'} {proof['name']}: {proof['detail']}")
    return EXIT_OK if _passed(result) else EXIT_FAILED


def cmd_check(args: argparse.Namespace) -> int:
    try:
        names = [recipe.load_file(path).name for path in args.file or ()]
    except recipe.RecipeError as error:
        print(f"twinspark recipe check: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    names += list(recipe.catalogue()) if args.all else list(args.names or [])
    if not names:
        print("twinspark recipe check: name a recipe (twinspark recipe list), give --file or --all", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        for name in names:
            recipe.get(name)
        if args.python:
            return _in_other_python(args)
        result = check(names, args.nodes, args.flavour, args.memory_bytes, vllm_available(), args.all)
    except (recipe.RecipeError, CheckInputError, memfit.PlanInputError) as error:
        print(f"twinspark recipe check: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return _report(result, args.json)


def cmd_switch(args: argparse.Namespace) -> int:
    """`twinspark recipe switch NAME -i INVENTORY`: playbooks/recipe.yml through the front door (a fleet pair by
    pair); an unknown recipe is refused here, before Ansible runs (exit 2, as the front door refuses)."""
    try:
        recipe.get(args.name)
    except recipe.RecipeError as error:
        print(f"twinspark recipe switch: {error}", file=sys.stderr)
        return SWITCH_BAD_INPUT
    rc = frontdoor.run_verb(args)
    named = inventory_recipes(args.inventory or inventory.default_inventory())
    if rc == 0 and not args.check and named != {args.name}:
        print(f"twinspark recipe switch: the pairs serve {args.name}; the inventory, which names "
              f"{', '.join(sorted(named)) or 'no recipe'}, is not edited: set {recipe.RECIPE_VAR}: {args.name} there, "
              "or the next site.yml goes back to the inventory's recipe", file=sys.stderr)
    return rc


def inventory_recipes(source: str) -> set[str]:
    """The recipes an inventory's heads serve (twinspark_recipe, else their profile's default); empty when it cannot
    be read."""
    try:
        host_vars, groups = inventory.read_hosts(source)
    except Exception:  # noqa: BLE001 - only the closing hint depends on it
        return set()
    found = set()
    for head in groups.get("twinspark_head", []):
        own = host_vars.get(head, {})
        profile = str(own.get("twinspark_profile") or settings.default_profile())
        found.add(str(own.get(recipe.RECIPE_VAR) or recipe.default_name(profile)))
    return found


def register(subparsers) -> None:
    parser = subparsers.add_parser("recipe", help="the recipes (models) this project serves: list, show, check "
                                                  "against the vLLM that serves them")
    sub = parser.add_subparsers(dest="recipe_command", required=True)
    listing = sub.add_parser("list", help="every recipe: nodes, fit on this pair, verified on hardware")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
    show = sub.add_parser("show", help="one recipe in full")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
    checker = sub.add_parser("check", help="prove a recipe against the vLLM that will serve it (docs/RECIPES.md)")
    checker.add_argument("names", nargs="*", metavar="NAME")
    checker.add_argument("--all", action="store_true", help="every recipe")
    checker.add_argument("--file", action="append", help="a recipe file being written (not yet in the package)")
    checker.add_argument("--nodes", type=int, help="only the layout for this many nodes (with --all: only the "
                                                   "recipes laid out for it)")
    checker.add_argument("--flavour", choices=settings.FLAVOURS, help="runtime flavour (default: the recipe's first)")
    checker.add_argument("--python", help="a Python whose vLLM judges (e.g. the venv scripts/build-vllm-parser-venv "
                                          "prints); default: this one, planner only when it has no vLLM")
    checker.add_argument("--memory-bytes", type=int, help="a node's memory for the planner (default: a Spark's)")
    checker.add_argument("--json", action="store_true")
    checker.set_defaults(func=cmd_check)
    switch = sub.add_parser("switch", help="switch the pair (a fleet: pair by pair) to recipe NAME while it serves, "
                                           "back to the old recipe when the new one does not serve "
                                           "(playbooks/recipe.yml)")
    switch.add_argument("name", metavar="NAME")
    frontdoor.add_run_arguments(switch, walked=True)
    switch.set_defaults(func=cmd_switch, verb="recipe-switch")
