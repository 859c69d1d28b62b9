"""The knob registry (settings.yml) loaded into plain dataclasses.

Nothing here decides whether a value is valid (validate.py does); this module only answers "which knobs exist,
what are they called, and what is their default under a profile and rank".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

PROFILES = ("gb10", "cpu")
FLAVOURS = ("stock", "fork")
"""Serving runtimes: stock = vLLM from PyPI at the pinned version plus patches/; fork = an operator-built wheelhouse."""
CONCERNS = ("cluster", "fabric", "serving", "model", "security")
TYPES = (
    "str", "int", "float", "bool", "choice", "port", "ipv4", "ip", "path", "model", "revision", "ifname", "hca",
    "keys", "passthrough", "names", "url", "findings", "recipe",
)
PASSES = ("env", "arg", "launcher")
FILES = ("serve", "secrets")
EMPTY_MEANINGS = ("default", "absent", "keep")
KNOWN_FIELDS = {
    "env", "var", "type", "default", "default_from", "choices", "min", "max", "min_exclusive", "multiple_of",
    "allow_auto", "empty", "profiles", "required", "derived", "per_node", "secret", "concern", "file", "passes",
    "arg", "with_args", "doc", "single", "flavours", "installed_as",
}
INSTALLED_FIELDS = {"path", "mode", "max_bytes", "pem"}


class RegistryError(ValueError):
    """settings.yml itself is malformed (a defect in the package, not in the operator's input)."""


@dataclass(frozen=True)
class Installed:
    """Where a controller-side file a knob names lands on the head, and what it must be."""

    path: str
    mode: str
    max_bytes: int
    pem: str  # the PEM block kind the file must hold (CERTIFICATE, PRIVATE KEY)


@dataclass(frozen=True)
class Knob:
    env: str
    var: str
    type: str
    doc: str
    concern: str
    file: str
    passes: str
    default: Any = None
    default_from: str | None = None
    choices: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    min_exclusive: float | None = None
    multiple_of: int | None = None
    allow_auto: bool = False
    empty: str = "default"
    profiles: tuple[str, ...] = PROFILES
    required: bool = False
    derived: bool = False
    per_node: bool = False
    secret: bool = False
    single: bool = False
    arg: str | None = None
    with_args: tuple[str, ...] = ()
    """Flags that go with `arg` whenever the knob passes a value (vLLM switches that belong to it)."""
    flavours: tuple[str, ...] = FLAVOURS
    """The runtime flavours that read the knob; under another flavour setting it is an error."""
    installed_as: Installed | None = None
    """The inventory names a controller file; the head gets a copy there and its env file names the copy."""

    def applies_to(self, profile: str) -> bool:
        return profile in self.profiles

    def read_by(self, flavour: str) -> bool:
        return flavour in self.flavours

    def default_for(self, profile: str, rank: int | None = None) -> str | None:
        """The default as env-file text under `profile` (and `rank`), or None when the default is "absent"."""
        value = self.default
        if isinstance(value, dict) and set(value) <= set(PROFILES):
            value = value.get(profile)
        if isinstance(value, dict) and "by_rank" in value:
            ranks = value["by_rank"]  # repeated for ranks beyond the list (a group of more nodes than it names)
            value = None if rank is None else ranks[rank % len(ranks)]
        if not self.applies_to(profile):
            return None
        return None if value is None else to_env_text(value)

    def allowed(self) -> str:
        """Human description of the allowed values, for problem messages and docs."""
        if self.type == "choice":
            return ", ".join(self.choices)
        if self.type == "bool":
            base = "1/0 (also true/false, yes/no, on/off)"
            return base + (", auto" if self.allow_auto else "")
        if self.type == "port":
            return "1-65535"
        if self.type in ("int", "float"):
            parts = []
            if self.min_exclusive is not None:
                parts.append(f"> {_num(self.min_exclusive)}")
            if self.min is not None:
                parts.append(f">= {_num(self.min)}")
            if self.max is not None:
                parts.append(f"<= {_num(self.max)}")
            if self.multiple_of is not None:
                parts.append(f"multiple of {self.multiple_of}")
            kind = "integer" if self.type == "int" else "number"
            return kind + (" " + ", ".join(parts) if parts else "")
        return {
            "ipv4": "an IPv4 address",
            "ip": "an IPv4 or IPv6 address",
            "path": "an absolute path",
            "model": "a Hugging Face repository id (org/name) or an absolute path",
            "revision": "a commit hash, tag or branch; empty for none",
            "ifname": "interface names (NCCL_SOCKET_IFNAME syntax)",
            "hca": "an NCCL_IB_HCA selector",
            "keys": "a single key" if self.single else "keys separated by spaces or tabs",
            "passthrough": "any text, handed on unchanged",
            "names": "environment variable names separated by spaces or commas",
            "str": "text on one line",
            "url": "a base URL, http(s)://host[:port], no path",
            "findings": "doctor finding ids (docs/DOCTOR.md) separated by spaces or commas",
            "recipe": "a recipe name (`twinspark recipe list`)",
        }[self.type]


@dataclass(frozen=True)
class Profile:
    name: str
    doc: str
    fixed_args: tuple[str, ...]
    fixed_env: dict[str, str]


@dataclass(frozen=True)
class Flavour:
    """What one runtime flavour adds to a profile's fixed flags and environment."""

    name: str
    doc: str
    fixed_args: dict[str, tuple[str, ...]]
    """profile -> flags"""
    fixed_env: dict[str, dict[str, str]]
    """profile -> variables"""
    evidence: dict[str, str] = field(default_factory=dict)
    """flag or variable -> why (the runtime's file and line), for docs/CONFIG.md"""


@dataclass(frozen=True)
class Registry:
    knobs: tuple[Knob, ...]
    profiles: dict[str, Profile]
    common_args: tuple[str, ...]
    common_env: dict[str, str]
    flavours: dict[str, Flavour] = field(default_factory=dict)
    _by_env: dict[str, Knob] = field(default_factory=dict, repr=False)
    _by_var: dict[str, Knob] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_env.update({k.env: k for k in self.knobs})
        self._by_var.update({k.var: k for k in self.knobs})

    def get(self, env: str) -> Knob | None:
        return self._by_env.get(env)

    def by_var(self, var: str) -> Knob | None:
        return self._by_var.get(var)

    def __getitem__(self, env: str) -> Knob:
        return self._by_env[env]

    def profile_args(self, profile: str) -> tuple[str, ...]:
        """The shared flags and the profile's (a recipe's come after: twinspark.recipe.fixed_args)."""
        return self.common_args + self.profiles[profile].fixed_args

    def profile_env(self, profile: str) -> dict[str, str]:
        """The shared variables and the profile's (a recipe's come after: twinspark.recipe.fixed_env)."""
        return {**self.common_env, **self.profiles[profile].fixed_env}

    def profile_defaults(self, profile: str, rank: int | None = None, flavour: str = "stock",
                         default: Callable[[Knob], str | None] | None = None) -> dict[str, str]:
        """Every knob's default in registry order, absent ones left out: the profile's own, or what `default` says
        per knob (twinspark.recipe.defaults passes the recipe's rule)."""
        out: dict[str, str] = {}
        for knob in self.knobs:
            if not knob.read_by(flavour):
                continue
            value = default(knob) if default else knob.default_for(profile, rank)
            if value is None and knob.default_from and knob.applies_to(profile):
                value = out.get(knob.default_from)
            if value is not None:
                out[knob.env] = value
        out["TWINSPARK_PROFILE"] = profile
        return out


def to_env_text(value: Any) -> str:
    """A YAML scalar as env-file text (booleans as 1/0, numbers as written)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _tuple(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in (value or ()))


def parse_registry(data: dict[str, Any]) -> Registry:
    """Build a Registry from settings.yml's parsed content, rejecting a malformed registry early."""
    knobs = []
    for entry in data["knobs"]:
        unknown = set(entry) - KNOWN_FIELDS
        if unknown:
            raise RegistryError(f"{entry.get('env')}: unknown registry field(s) {sorted(unknown)}")
        env = entry["env"]
        var = entry.get("var", "twinspark_" + env.lower())
        knob = Knob(
            env=env,
            var=var,
            type=entry["type"],
            doc=" ".join(str(entry["doc"]).split()),
            concern=entry["concern"],
            file=entry["file"],
            passes=entry["passes"],
            default=entry.get("default"),
            default_from=entry.get("default_from"),
            choices=_tuple(entry.get("choices")),
            min=entry.get("min"),
            max=entry.get("max"),
            min_exclusive=entry.get("min_exclusive"),
            multiple_of=entry.get("multiple_of"),
            allow_auto=bool(entry.get("allow_auto", False)),
            empty=entry.get("empty", "default"),
            profiles=_tuple(entry.get("profiles", PROFILES)),
            required=bool(entry.get("required", False)),
            derived=bool(entry.get("derived", False)),
            per_node=bool(entry.get("per_node", False)),
            secret=bool(entry.get("secret", False)),
            single=bool(entry.get("single", False)),
            arg=entry.get("arg"),
            with_args=_tuple(entry.get("with_args")),
            flavours=_tuple(entry.get("flavours", FLAVOURS)),
            installed_as=_installed(env, entry.get("installed_as")),
        )
        _check_knob(knob)
        knobs.append(knob)
    envs = [k.env for k in knobs]
    if len(set(envs)) != len(envs):
        raise RegistryError("duplicate env names in the registry")
    profiles = {
        name: Profile(
            name=name,
            doc=" ".join(str(spec.get("doc", "")).split()),
            fixed_args=_tuple(spec.get("fixed_args")),
            fixed_env={str(k): to_env_text(v) for k, v in (spec.get("fixed_env") or {}).items()},
        )
        for name, spec in data["profiles"].items()
    }
    if tuple(profiles) != PROFILES:
        raise RegistryError(f"profiles must be exactly {PROFILES}")
    common = data.get("common") or {}
    flavours = {}
    for name, spec in (data.get("flavours") or {}).items():
        per_profile = {p: spec.get(p) or {} for p in PROFILES}
        flavours[name] = Flavour(
            name=name,
            doc=" ".join(str(spec.get("doc", "")).split()),
            fixed_args={p: _tuple(s.get("fixed_args")) for p, s in per_profile.items()},
            fixed_env={p: {str(k): to_env_text(v) for k, v in (s.get("fixed_env") or {}).items()}
                       for p, s in per_profile.items()},
            evidence={str(k): " ".join(str(v).split()) for k, v in (spec.get("evidence") or {}).items()},
        )
    if flavours and tuple(flavours) != FLAVOURS:
        raise RegistryError(f"flavours must be exactly {FLAVOURS}")
    return Registry(
        knobs=tuple(knobs),
        profiles=profiles,
        common_args=_tuple(common.get("fixed_args")),
        common_env={str(k): to_env_text(v) for k, v in (common.get("fixed_env") or {}).items()},
        flavours=flavours,
    )


def _installed(env: str, spec: Any) -> Installed | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) != INSTALLED_FIELDS:
        raise RegistryError(f"{env}: installed_as needs exactly {sorted(INSTALLED_FIELDS)}")
    installed = Installed(path=str(spec["path"]), mode=str(spec["mode"]), max_bytes=int(spec["max_bytes"]),
                          pem=str(spec["pem"]))
    if not installed.path.startswith("/") or installed.max_bytes <= 0:
        raise RegistryError(f"{env}: installed_as needs an absolute path and a positive max_bytes")
    return installed


def _check_knob(knob: Knob) -> None:
    checks = [
        (knob.type in TYPES, f"type {knob.type!r}"),
        (knob.concern in CONCERNS, f"concern {knob.concern!r}"),
        (knob.file in FILES, f"file {knob.file!r}"),
        (knob.passes in PASSES, f"passes {knob.passes!r}"),
        (knob.empty in EMPTY_MEANINGS, f"empty {knob.empty!r}"),
        (set(knob.profiles) <= set(PROFILES), f"profiles {knob.profiles!r}"),
        (bool(knob.flavours) and set(knob.flavours) <= set(FLAVOURS), f"flavours {knob.flavours!r}"),
        (knob.var.startswith("twinspark_"), f"var {knob.var!r} lacks the twinspark_ prefix"),
        (knob.passes != "arg" or bool(knob.arg), "passes: arg without an arg"),
        (not knob.with_args or (knob.passes == "arg" and knob.type != "bool"), "with_args without a valued arg"),
        (knob.type != "choice" or bool(knob.choices), "choice without choices"),
        (knob.secret == (knob.file == "secrets"), "secret knobs, and only they, live in secrets.env"),
        (knob.installed_as is None or (knob.type == "path" and not knob.per_node and knob.default is None),
         "installed_as on a knob that is not a path without default, the same on both nodes"),
    ]
    for ok, what in checks:
        if not ok:
            raise RegistryError(f"{knob.env}: bad {what}")


# libyaml's safe loader when PyYAML was built with it: the same documents, a tenth of the time (every command and
# every Ansible run reads the registry; 75 ms a read in pure Python on the development machine, 7 ms with libyaml).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def load() -> Registry:
    """The packaged registry (cached: it never changes while a process runs)."""
    text = resources.files("twinspark").joinpath("settings.yml").read_text(encoding="utf-8")
    return parse_registry(yaml.load(text, Loader=SAFE_LOADER))


def default_profile(registry: Registry | None = None) -> str:
    """The profile of a pair whose inventory names none: TWINSPARK_PROFILE's default."""
    return str((registry or load())["TWINSPARK_PROFILE"].default)
