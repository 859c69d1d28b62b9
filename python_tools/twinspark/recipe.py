"""Recipes: the model a pair serves, as data apart from the hardware profile (docs/RECIPES.md).

One YAML file per recipe in twinspark/recipes/ (shipped in the package, so the launcher on a node reads the same
file the controller validated). A recipe names the checkpoint (Hub id and a pinned commit), the runtime it needs,
the architecture facts the tools read (config.json's own keys), the parallel layouts it may run in, the vLLM flags
and variables it needs (per runtime flavour where they differ), the defaults it gives knobs, what the planner needs
to size it, its expected first-boot time, and a `verified` record of a run on real hardware (null until someone
runs it on Sparks).

Precedence, one rule everywhere: a knob set in the inventory (or an env file) > the recipe's value > the hardware
profile's default (settings.yml). The profile keeps what the hardware decides.

Everything here is pure: loading checks a recipe against its own facts and the registry (a revision that is not a
commit, a tensor-parallel size that does not divide the heads, a flag a knob owns); `twinspark recipe check`
(twinspark/recipecheck.py) judges it against the vLLM code that will run it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from twinspark import settings

RECIPE_ENV = "TWINSPARK_RECIPE"
RECIPE_VAR = "twinspark_recipe"
COMMIT = re.compile(r"[0-9a-f]{40}")
NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")
ATTENTION_KINDS = ("full", "sliding", "hybrid", "mla", "deepseek_v4")
FIELDS = {
    "name", "doc", "profile", "model", "runtime", "architecture", "parallel", "args", "env", "flavours", "knobs",
    "memory", "first_boot_s", "verified", "sources",
}
MODEL_FIELDS = {"id", "revision", "served_name"}
VERIFIED_FIELDS = {"runtime", "hardware", "date", "benchmark"}
# Knobs a recipe may not give: the model section names the checkpoint; the rest are the node's, the fabric's or the
# operator's own (derived addresses, secrets, the profile and the recipe choice themselves).
MODEL_KNOBS = {"MODEL": "id", "MODEL_REVISION": "revision", "SERVED_MODEL_NAME": "served_name"}
NOT_FROM_A_RECIPE_CONCERNS = ("fabric", "security", "cluster")
FIRST_BOOT_KNOB = "TWINSPARK_FIRST_BOOT_BUDGET_S"
# Facts read from `architecture` (config.json's keys), by what they mean.
HEADS_KEYS = ("num_attention_heads", "n_head", "num_heads")
KV_HEADS_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


class RecipeError(ValueError):
    """A recipe file is malformed or contradicts itself; the message names the file, the field and the fix."""


@dataclass(frozen=True)
class Layout:
    """A parallel layout: world size = tensor parallel x pipeline parallel = the node count."""

    tp: int
    pp: int = 1

    @property
    def nodes(self) -> int:
        return self.tp * self.pp

    def __str__(self) -> str:
        return f"TP{self.tp}xPP{self.pp}"


@dataclass(frozen=True)
class Verified:
    """A run on real hardware: which runtime, which hardware, when, and the benchmark it got."""

    runtime: str
    hardware: str
    date: str
    benchmark: str


@dataclass(frozen=True)
class Recipe:
    name: str
    doc: str
    profile: str
    model: str
    revision: str | None
    served_name: str
    flavours: tuple[str, ...]
    min_runtime: str
    architecture: dict[str, Any]
    layouts: tuple[Layout, ...]
    pipeline: bool
    args: tuple[str, ...]
    env: dict[str, str]
    flavour_args: dict[str, tuple[str, ...]]
    flavour_env: dict[str, dict[str, str]]
    knobs: dict[str, str]
    memory: dict[str, Any]
    first_boot_s: int
    verified: Verified | None
    sources: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ what the tools read

    @property
    def heads(self) -> int:
        return _first_int(self.architecture, HEADS_KEYS)

    @property
    def kv_heads(self) -> int:
        return _first_int(self.architecture, KV_HEADS_KEYS) or self.heads

    @property
    def experts(self) -> int:
        return _first_int(self.architecture, EXPERT_KEYS)

    @property
    def layers(self) -> int:
        return int(self.architecture.get("num_hidden_layers") or 0)

    @property
    def attention(self) -> str:
        return str(self.architecture.get("attention") or "full")

    @property
    def node_counts(self) -> tuple[int, ...]:
        return tuple(sorted({layout.nodes for layout in self.layouts}))

    def config(self) -> dict[str, Any]:
        """The architecture facts as a config.json would hold them (the planner's input without the weights)."""
        return {k: v for k, v in self.architecture.items() if k != "attention"}

    def fixed_args(self, flavour: str = "stock") -> tuple[str, ...]:
        """The flags this recipe adds after the profile's, the flavour's own last."""
        return self.args + self.flavour_args.get(flavour, ())

    def fixed_env(self, flavour: str = "stock") -> dict[str, str]:
        return {**self.env, **self.flavour_env.get(flavour, {})}

    def knob_defaults(self) -> dict[str, str]:
        """Every knob value this recipe gives (the model section's included), as env-file text."""
        out = {"MODEL": self.model, "SERVED_MODEL_NAME": self.served_name}
        if self.revision is not None:
            out["MODEL_REVISION"] = self.revision
        out[FIRST_BOOT_KNOB] = str(self.first_boot_s)
        out.update(self.knobs)
        return out

    def flag_value(self, flag: str, flavour: str = "stock") -> str | None:
        """The value this recipe passes for `flag` under `flavour` (None when it passes none)."""
        args = list(self.fixed_args(flavour))
        return args[args.index(flag) + 1] if flag in args[:-1] else None

    def layout_for(self, nodes: int) -> Layout | None:
        return next((layout for layout in self.layouts if layout.nodes == nodes), None)

    def verified_text(self) -> str:
        if self.verified is None:
            return "not verified on hardware"
        return f"verified on {self.verified.hardware} with {self.verified.runtime}, {self.verified.date}"


def _first_int(data: dict[str, Any], keys: tuple[str, ...]) -> int:
    for key in keys:
        if isinstance(data.get(key), int):
            return int(data[key])
    return 0


# ----------------------------------------------------------------------------------------------------- parsing


def parse(data: Any, where: str, registry: settings.Registry | None = None) -> Recipe:
    """One recipe from its parsed YAML; RecipeError names `where`, the field and the fix."""
    registry = registry or settings.load()
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: a recipe is one YAML mapping")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise RecipeError(f"{where}: unknown field(s) {', '.join(unknown)}; a recipe has {', '.join(sorted(FIELDS))}")
    missing = sorted({"name", "profile", "model", "runtime", "architecture", "parallel", "first_boot_s"} - set(data))
    if missing:
        raise RecipeError(f"{where}: missing {', '.join(missing)} (docs/RECIPES.md lists every field)")
    name = str(data["name"])
    if not NAME.fullmatch(name):
        raise RecipeError(f"{where}: name {name!r} must be lower-case letters, digits, dots and dashes")
    profile = str(data["profile"])
    if profile not in settings.PROFILES:
        raise RecipeError(f"{where}: profile {profile!r} is not one of {', '.join(settings.PROFILES)}")
    model = _mapping(data["model"], f"{where}: model")
    if set(model) - MODEL_FIELDS or not {"id", "served_name"} <= set(model):
        raise RecipeError(f"{where}: model needs id and served_name, and revision for a Hub id "
                          f"(fields: {', '.join(sorted(MODEL_FIELDS))})")
    model_id, revision = str(model["id"]), model.get("revision")
    if model_id.startswith("/"):
        if revision is not None:
            raise RecipeError(f"{where}: model.revision must be absent for a local model directory ({model_id})")
    elif revision is None or not COMMIT.fullmatch(str(revision)):
        raise RecipeError(f"{where}: model.revision {revision!r} is not a commit hash (40 lower-case hex digits); "
                          "pin the commit you proved, never a branch or tag, so every node serves the same weights")
    runtime = _mapping(data["runtime"], f"{where}: runtime")
    flavours = tuple(str(f) for f in runtime.get("flavours") or ("stock",))
    if not set(flavours) <= set(settings.FLAVOURS):
        raise RecipeError(f"{where}: runtime.flavours {list(flavours)} must be among {', '.join(settings.FLAVOURS)}")
    min_runtime = str(runtime.get("min_vllm") or "")
    if not re.fullmatch(r"\d+\.\d+\.\d+", min_runtime):
        raise RecipeError(f"{where}: runtime.min_vllm must be a version such as 0.33.0, got {min_runtime!r}")
    architecture = _mapping(data["architecture"], f"{where}: architecture")
    arch_names = architecture.get("architectures")
    if not isinstance(arch_names, list) or not arch_names or not all(isinstance(a, str) for a in arch_names):
        raise RecipeError(f"{where}: architecture.architectures must list config.json's architecture name(s)")
    attention = str(architecture.get("attention") or "full")
    if attention not in ATTENTION_KINDS:
        raise RecipeError(f"{where}: architecture.attention {attention!r} must be one of {', '.join(ATTENTION_KINDS)}")
    heads = _first_int(architecture, HEADS_KEYS)
    if heads <= 0:
        raise RecipeError(f"{where}: architecture needs num_attention_heads (from the model's config.json)")
    parallel = _mapping(data["parallel"], f"{where}: parallel")
    pipeline = bool(parallel.get("pipeline", False))
    layouts = []
    for entry in parallel.get("layouts") or ():
        if not isinstance(entry, dict) or not isinstance(entry.get("tp"), int) or entry["tp"] < 1 \
                or not isinstance(entry.get("pp", 1), int) or entry.get("pp", 1) < 1:
            raise RecipeError(f"{where}: parallel.layouts entries are {{tp: N, pp: M}} with positive integers")
        layouts.append(Layout(int(entry["tp"]), int(entry.get("pp", 1))))
    if not layouts:
        raise RecipeError(f"{where}: parallel.layouts must list at least one {{tp, pp}} layout")
    for layout in layouts:
        if heads % layout.tp:
            raise RecipeError(f"{where}: parallel.layouts {layout}: tensor parallel {layout.tp} does not divide the "
                              f"{heads} attention heads; use a TP that divides them (pipeline parallel for the rest)")
        kv_heads = _first_int(architecture, KV_HEADS_KEYS) or heads
        if (kv_heads % layout.tp if kv_heads >= layout.tp else layout.tp % kv_heads):
            raise RecipeError(f"{where}: parallel.layouts {layout}: tensor parallel {layout.tp} neither divides the "
                              f"{kv_heads} KV heads nor is a multiple of them (vLLM splits or replicates KV heads "
                              "evenly); use a TP that does")
        if layout.pp > 1 and not pipeline:
            raise RecipeError(f"{where}: parallel.layouts {layout}: pipeline parallel needs parallel.pipeline: true, "
                              "and only models that implement it in vLLM may say so")
    args = _words(data.get("args"), f"{where}: args")
    flavour_args: dict[str, tuple[str, ...]] = {}
    flavour_env: dict[str, dict[str, str]] = {}
    for flavour, spec in (_mapping(data.get("flavours") or {}, f"{where}: flavours")).items():
        if flavour not in flavours:
            raise RecipeError(f"{where}: flavours.{flavour} is not in runtime.flavours {list(flavours)}")
        spec = _mapping(spec or {}, f"{where}: flavours.{flavour}")
        flavour_args[flavour] = _words(spec.get("args"), f"{where}: flavours.{flavour}.args")
        flavour_env[flavour] = _env(spec.get("env"), f"{where}: flavours.{flavour}.env")
    env = _env(data.get("env"), f"{where}: env")
    knobs = _knobs(data.get("knobs"), where, profile, flavours, registry)
    first_boot = data["first_boot_s"]
    if not isinstance(first_boot, int) or first_boot < int(registry[FIRST_BOOT_KNOB].min or 0):
        raise RecipeError(f"{where}: first_boot_s must be whole seconds, at least {registry[FIRST_BOOT_KNOB].min:g}")
    recipe = Recipe(
        name=name,
        doc=" ".join(str(data.get("doc") or "").split()),
        profile=profile,
        model=model_id,
        revision=None if revision is None else str(revision),
        served_name=str(model["served_name"]),
        flavours=flavours,
        min_runtime=min_runtime,
        architecture=dict(architecture),
        layouts=tuple(layouts),
        pipeline=pipeline,
        args=args,
        env=env,
        flavour_args=flavour_args,
        flavour_env=flavour_env,
        knobs=knobs,
        memory=dict(_mapping(data.get("memory") or {}, f"{where}: memory")),
        first_boot_s=first_boot,
        verified=_verified(data.get("verified"), where),
        sources={str(k): " ".join(str(v).split()) for k, v in (data.get("sources") or {}).items()},
    )
    _check_flags(recipe, where, registry)
    return recipe


def _mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise RecipeError(f"{where} must be a mapping")
    return value


def _words(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise RecipeError(f"{where} must be a list of words (each flag and each value its own item)")
    return tuple(str(v) for v in value)


def _env(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    mapping = _mapping(value, where)
    bad = [k for k in mapping if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", str(k))]
    if bad:
        raise RecipeError(f"{where}: {', '.join(map(str, bad))} is not an environment variable name")
    return {str(k): settings.to_env_text(v) for k, v in mapping.items()}


def _knobs(value: Any, where: str, profile: str, flavours: tuple[str, ...],
           registry: settings.Registry) -> dict[str, str]:
    """The knob values a recipe gives, as env-file text. Each is judged by its knob's own rule where it is used
    (twinspark.validate names the recipe when one is wrong) and for every packaged recipe in `make test`."""
    out: dict[str, str] = {}
    for name, raw in (_mapping(value or {}, f"{where}: knobs")).items():
        knob = registry.get(str(name))
        if knob is None:
            raise RecipeError(f"{where}: knobs.{name} is not a knob of settings.yml")
        if knob.env in MODEL_KNOBS:
            raise RecipeError(f"{where}: knobs.{name}: write it as model.{MODEL_KNOBS[knob.env]}")
        if knob.env == FIRST_BOOT_KNOB:
            raise RecipeError(f"{where}: knobs.{name}: write it as first_boot_s")
        if knob.derived or knob.secret or knob.concern in NOT_FROM_A_RECIPE_CONCERNS:
            raise RecipeError(f"{where}: knobs.{name} is a {knob.concern} knob, not the model's: the inventory or "
                              "the profile sets it")
        if not knob.applies_to(profile):
            raise RecipeError(f"{where}: knobs.{name} applies only to the {'/'.join(knob.profiles)} profile")
        if not any(knob.read_by(f) for f in flavours):
            raise RecipeError(f"{where}: knobs.{name} is read only by the {'/'.join(knob.flavours)} runtime")
        if raw is None or isinstance(raw, (dict, list)):
            raise RecipeError(f"{where}: knobs.{name} must be one value ({knob.allowed()})")
        out[knob.env] = settings.to_env_text(raw)
    return out


def _verified(value: Any, where: str) -> Verified | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != VERIFIED_FIELDS:
        raise RecipeError(f"{where}: verified is null (not verified on hardware) or exactly "
                          f"{', '.join(sorted(VERIFIED_FIELDS))}")
    return Verified(**{k: " ".join(str(v).split()) for k, v in value.items()})


def _check_flags(recipe: Recipe, where: str, registry: settings.Registry) -> None:
    """A recipe's flags and variables may not take what a knob, the shared flags or the profile already own:
    two sources for one value is how a setting silently stops applying."""
    owned = {knob.arg: knob.env for knob in registry.knobs if knob.arg}
    owned.update({flag: "the group's shared flags (settings.yml, common)" for flag in registry.common_args
                  if flag.startswith("--")})
    launcher_flags = {"--speculative-config": "MTP_NUM_TOKENS / NGRAM_NUM_TOKENS",
                      "--default-chat-template-kwargs": "DEFAULT_THINKING",
                      "--max-cudagraph-capture-size": "MAX_NUM_SEQS x (MTP_NUM_TOKENS + 1)",
                      "--headless": "the node's rank"}
    owned.update(launcher_flags)
    for flavour in ("", *recipe.flavours):
        for word in recipe.fixed_args(flavour) if flavour else recipe.args:
            if word.split("=", 1)[0] in owned:
                raise RecipeError(f"{where}: flag {word.split('=', 1)[0]} belongs to {owned[word.split('=', 1)[0]]}"
                                  "; give the knob's value under knobs: instead")
    profile_env = {**registry.common_env, **registry.profiles[recipe.profile].fixed_env}
    for flavour in ("stock", *recipe.flavours):
        for name in recipe.fixed_env(flavour):
            if registry.get(name) is not None:
                raise RecipeError(f"{where}: env {name} is a knob; give it under knobs: instead")
            if name in profile_env:
                raise RecipeError(f"{where}: env {name} is fixed by the {recipe.profile} profile")


# ----------------------------------------------------------------------------------------------------- the catalogue


@functools.cache
def catalogue() -> dict[str, Recipe]:
    """Every packaged recipe by name (cached: the files never change while a process runs)."""
    registry = settings.load()
    found: dict[str, Recipe] = {}
    folder = resources.files("twinspark").joinpath("recipes")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yml"):
            continue
        where = f"twinspark/recipes/{entry.name}"
        recipe = parse(yaml.load(entry.read_text(encoding="utf-8"), Loader=settings.SAFE_LOADER), where, registry)
        if recipe.name != entry.name[:-4]:
            raise RecipeError(f"{where}: name {recipe.name!r} must equal the file's name without .yml")
        found[recipe.name] = recipe
    return found


def load_file(path: str) -> Recipe:
    """A recipe file outside the package (one being written), added to this process's catalogue; its name may not
    be a packaged recipe's."""
    try:
        data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=settings.SAFE_LOADER)
    except (OSError, yaml.YAMLError) as error:
        raise RecipeError(f"{path}: cannot read it as YAML ({error})") from None
    loaded = parse(data, path)
    if loaded.name in catalogue():
        raise RecipeError(f"{path}: name {loaded.name!r} is a packaged recipe's; give yours its own name")
    catalogue()[loaded.name] = loaded
    return loaded


def group_layout(registry: settings.Registry | None = None) -> Layout:
    """The layout the shared flags give the group (--tensor-parallel-size x --pipeline-parallel-size; the pair's
    is TP2xPP1)."""
    args = list((registry or settings.load()).common_args)

    def flag(name: str) -> int:
        return int(args[args.index(name) + 1]) if name in args[:-1] else 1

    return Layout(flag("--tensor-parallel-size"), flag("--pipeline-parallel-size"))


def names(profile: str | None = None) -> list[str]:
    return [name for name, r in catalogue().items() if profile is None or r.profile == profile]


def default_name(profile: str, registry: settings.Registry | None = None) -> str:
    """The recipe a pair of `profile` serves when its inventory names none (TWINSPARK_RECIPE's default)."""
    value = (registry or settings.load())[RECIPE_ENV].default_for(profile)
    if value is None:
        raise RecipeError(f"settings.yml: {RECIPE_ENV} has no default for the {profile} profile")
    return value


def get(name: str) -> Recipe:
    try:
        return catalogue()[name]
    except KeyError:
        raise RecipeError(f"{RECIPE_VAR}: no recipe named {name!r}; known: {', '.join(catalogue())}") from None


def for_values(values: dict[str, str] | Any, registry: settings.Registry | None = None) -> Recipe:
    """The recipe a node's env names (TWINSPARK_RECIPE), or its profile's default recipe."""
    profile = (values.get("TWINSPARK_PROFILE") or "").strip() or settings.default_profile(registry)
    name = (values.get(RECIPE_ENV) or "").strip() or default_name(profile, registry)
    return get(name)


# ----------------------------------------------------------------------------------------------------- precedence


def chosen(profile: str, name: str | None = None, registry: settings.Registry | None = None) -> Recipe:
    """The recipe `name`, or `profile`'s default recipe when None or empty."""
    return get(name or default_name(profile, registry))


def default_value(knob: settings.Knob, profile: str, rank: int | None = None, recipe: Recipe | None = None,
                  registry: settings.Registry | None = None) -> str | None:
    """`knob`'s default as env-file text below the inventory: the recipe's value where it gives one, else the
    profile's (inventory > recipe > profile). `recipe` None means the profile's default recipe."""
    if not knob.applies_to(profile):
        return None
    recipe = recipe or chosen(profile, None, registry)
    given = recipe.knob_defaults().get(knob.env) if recipe.profile == profile else None
    return given if given is not None else knob.default_for(profile, rank)


def defaults(profile: str, rank: int | None = None, flavour: str = "stock", name: str | None = None,
             registry: settings.Registry | None = None) -> dict[str, str]:
    """Every knob's default under `profile`/`rank`/`flavour` and recipe `name` (the profile's default when None),
    absent ones left out, in registry order."""
    registry = registry or settings.load()
    recipe = chosen(profile, name, registry)
    return registry.profile_defaults(profile, rank, flavour,
                                     lambda knob: default_value(knob, profile, rank, recipe, registry))


def fixed_args(profile: str, flavour: str = "stock", name: str | None = None,
               registry: settings.Registry | None = None) -> tuple[str, ...]:
    """The shared flags, the profile's, then the recipe's (its runtime flavour's own last)."""
    registry = registry or settings.load()
    return registry.profile_args(profile) + chosen(profile, name, registry).fixed_args(flavour)


def fixed_env(profile: str, flavour: str = "stock", name: str | None = None,
              registry: settings.Registry | None = None) -> dict[str, str]:
    """The shared variables, the profile's, then the recipe's."""
    registry = registry or settings.load()
    return {**registry.profile_env(profile), **chosen(profile, name, registry).fixed_env(flavour)}


def knob_default(env: str, profile: str | None = None, name: str | None = None,
                 registry: settings.Registry | None = None) -> str | None:
    """`env`'s default under `profile` (the default profile when None) and recipe `name` (that profile's default
    recipe when None), as the env file would carry it; None when the knob has none there."""
    registry = registry or settings.load()
    return defaults(profile or settings.default_profile(registry), name=name or None, registry=registry).get(env)
