"""Whether an env mapping is valid, and its normalised form.

`validate(raw)` is a pure function: it takes what the env files (or the inventory) say, as strings, and returns
the normalised mapping with every default filled in, plus a list of problems. A problem names the variable, what
is wrong and what is allowed; it never contains a secret's value.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from twinspark import budget, layout, recipe, settings
from twinspark.doctor import findings
from twinspark.settings import Knob, Registry

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
AUTO = "auto"
_DIGITS = re.compile(r"[0-9]+\Z")
_DECIMAL = re.compile(r"([0-9]+(\.[0-9]*)?|\.[0-9]+)\Z")
_MULTILINE = re.compile(r"[\r\n\v\f]")
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+\Z")
_REVISION = re.compile(r"[A-Za-z0-9._/-]+\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_IFNAME_LIST = re.compile(r"[\^=]?[A-Za-z0-9_.:@-]+(,[A-Za-z0-9_.:@-]+)*\Z")
IFNAMSIZ = 16  # Linux interface names are at most 15 bytes
TYPO_CUTOFF = 0.9
PASSTHROUGH = "ENV_PASSTHROUGH"


@dataclass(frozen=True)
class Problem:
    var: str
    message: str
    allowed: str = ""

    def __str__(self) -> str:
        return f"{self.var}: {self.message}" + (f" (allowed: {self.allowed})" if self.allowed else "")


@dataclass
class Result:
    """The outcome of validating one node's env mapping."""

    profile: str
    values: dict[str, str] = field(default_factory=dict)
    """Every knob that applies, normalised, defaults filled in, absent ones left out; registry order."""
    others: dict[str, str] = field(default_factory=dict)
    """Variables that are not knobs but are named in ENV_PASSTHROUGH (handed to vLLM unchanged)."""
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def rank(self) -> int | None:
        value = self.values.get("NODE_RANK")
        return int(value) if value is not None else None


class _Invalid(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _got(knob: Knob, raw: str) -> str:
    """The offending value for a message, or nothing for a secret."""
    if knob.secret:
        return ""
    shown = raw if len(raw) <= 60 else raw[:57] + "..."
    return f" (got {shown!r})"


def _bool(knob: Knob, text: str) -> str:
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return "1"
    if word in FALSE_WORDS:
        return "0"
    if knob.allow_auto and word == AUTO:
        return AUTO
    raise _Invalid("is not a boolean")


def _number_bounds(knob: Knob, number: float) -> None:
    if knob.min_exclusive is not None and number <= knob.min_exclusive:
        raise _Invalid(f"must be greater than {settings._num(knob.min_exclusive)}")
    if knob.min is not None and number < knob.min:
        raise _Invalid(f"must be at least {settings._num(knob.min)}")
    if knob.max is not None and number > knob.max:
        raise _Invalid(f"must be at most {settings._num(knob.max)}")
    if knob.multiple_of is not None and number % knob.multiple_of:
        raise _Invalid(f"must be a multiple of {knob.multiple_of}")


def _int(knob: Knob, text: str) -> str:
    text = text.strip()
    if not _DIGITS.match(text):
        raise _Invalid("is not a whole number (base 10 digits only)")
    number = int(text, 10)
    _number_bounds(knob, number)
    return str(number)


def _port(knob: Knob, text: str) -> str:
    text = text.strip()
    if not _DIGITS.match(text) or not 1 <= int(text, 10) <= 65535:
        raise _Invalid("is not a TCP port")
    return str(int(text, 10))


def _float(knob: Knob, text: str) -> str:
    text = text.strip()
    if not _DECIMAL.match(text):
        raise _Invalid("is not a decimal number")
    _number_bounds(knob, float(text))
    return text


def _choice(knob: Knob, text: str) -> str:
    text = text.strip()
    if text not in knob.choices:
        raise _Invalid("is not one of the allowed values")
    return text


def _single_line(text: str) -> str:
    if _MULTILINE.search(text):
        raise _Invalid("must be a single line")
    return text.strip()


def _ipv4(knob: Knob, text: str) -> str:
    text = text.strip()
    try:
        address = ipaddress.IPv4Address(text)
    except ValueError:
        raise _Invalid("is not an IPv4 address") from None
    if address.is_unspecified or address.is_loopback or address.is_multicast:
        raise _Invalid("must be a node's own unicast address (never 0.0.0.0, 127.x or multicast)")
    return str(address)


def _ip(knob: Knob, text: str) -> str:
    text = text.strip()
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise _Invalid("is not an IP address") from None
    return text


def _path(knob: Knob, text: str) -> str:
    text = _single_line(text)
    if not text.startswith("/"):
        raise _Invalid("is not an absolute path")
    return text


def _model(knob: Knob, text: str) -> str:
    text = _single_line(text)
    if not (text.startswith("/") or _REPO_ID.match(text)):
        raise _Invalid("is neither a Hugging Face repository id (org/name) nor an absolute path")
    return text


def _revision(knob: Knob, text: str) -> str:
    text = text.strip()
    if text and not _REVISION.match(text):
        raise _Invalid("is not a revision (letters, digits, . _ / - only)")
    return text


def _ifname(knob: Knob, text: str) -> str:
    text = text.strip()
    if not _IFNAME_LIST.match(text):
        raise _Invalid("is not a list of interface names")
    names = text.lstrip("^=").split(",")
    if any(len(name.encode()) >= IFNAMSIZ for name in names):
        raise _Invalid("names an interface longer than 15 bytes")
    return text


def _hca(knob: Knob, text: str) -> str:
    if _MULTILINE.search(text) or re.search(r"\s", text.strip()):
        raise _Invalid("contains whitespace, which NCCL would take as part of a device name")
    text = text.strip()
    if not text.lstrip("^="):
        raise _Invalid("selects no device")
    return text


def _str(knob: Knob, text: str) -> str:
    return _single_line(text)


def base_url(text: str) -> str:
    """A base URL (http or https, a host, no path, query or fragment) without its trailing slash; ValueError says
    why not. The rule of the `url` type, and of the drain's router URLs on the node (twinspark.fleet.drain)."""
    parsed = urllib.parse.urlsplit(text.strip())
    try:
        parsed.port  # noqa: B018 - raises ValueError on a port that is not a number or out of range
    except ValueError:
        raise ValueError("has a port that is not 1-65535") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/") \
            or parsed.query or parsed.fragment:
        example = f"http://10.0.0.5:{layout.default().router_port}"
        raise ValueError(f"is not a base URL like {example} (http or https, a host, no path)")
    return text.strip().rstrip("/")


def _url(knob: Knob, text: str) -> str:
    try:
        return base_url(_single_line(text))
    except ValueError as error:
        raise _Invalid(str(error)) from None


def _passthrough(knob: Knob, text: str) -> str:
    return text


def _names(knob: Knob, text: str) -> str:
    names = [name for name in re.split(r"[\s,]+", text.strip()) if name]
    bad = [name for name in names if not _ENV_NAME.match(name)]
    if bad:
        raise _Invalid(f"{bad[0]!r} is not a variable name")
    registry = settings.load()
    known = [name for name in names if registry.get(name) is not None]
    if known:
        raise _Invalid(f"{known[0]} is a TwinSpark setting, not a variable to pass through; set it directly")
    return " ".join(dict.fromkeys(names))


def _findings(knob: Knob, text: str) -> str:
    ids = findings.acknowledged_ids(_single_line(text))
    unknown = findings.unknown_ids(ids)
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(findings.CATALOGUE), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise _Invalid(f"{unknown[0]!r} is not a doctor finding id{hint}")
    return " ".join(dict.fromkeys(ids))


def _keys(knob: Knob, text: str) -> str:
    if _MULTILINE.search(text):
        raise _Invalid("must be a single line (no carriage return, line feed, vertical tab or form feed)")
    if "\\" in text:
        raise _Invalid("must not contain a backslash")
    keys = [key for key in re.split(r"[ \t]+", text) if key]
    if knob.single and len(keys) > 1:
        raise _Invalid("holds more than one key; put several keys in DSPARK_API_KEYS")
    if any(key.startswith("-") for key in keys):
        raise _Invalid("has a key starting with '-', which vLLM would read as an option")
    return " ".join(keys)


def _recipe(knob: Knob, text: str) -> str:
    text = text.strip()
    if text not in recipe.catalogue():
        close = difflib.get_close_matches(text, list(recipe.catalogue()), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise _Invalid(f"is not a recipe of python_tools/twinspark/recipes/{hint}")
    return text


_NORMALISERS = {
    "str": _str, "int": _int, "float": _float, "bool": _bool, "choice": _choice, "port": _port, "ipv4": _ipv4,
    "ip": _ip, "path": _path, "model": _model, "revision": _revision, "ifname": _ifname, "hca": _hca,
    "keys": _keys, "passthrough": _passthrough, "names": _names, "url": _url, "findings": _findings,
    "recipe": _recipe,
}


def normalise(knob: Knob, text: str) -> str:
    """One knob's value as env-file text, by the rule `validate` applies to it; ValueError says why it is invalid
    (without the value when the knob is secret)."""
    try:
        return _NORMALISERS[knob.type](knob, text)
    except _Invalid as exc:
        raise ValueError(exc.message + _got(knob, text)) from None


def _is_blank(knob: Knob, text: str) -> bool:
    if knob.type == "passthrough":
        return text == ""
    if knob.type == "keys":
        return text.strip(" \t") == ""
    return text.strip() == ""


def validate(raw: Mapping[str, str], registry: Registry | None = None) -> Result:
    """Validate and normalise one node's env mapping (values as env-file text)."""
    registry = registry or settings.load()
    problems: list[Problem] = []
    with_nul = [name for name, text in raw.items() if "\0" in text]
    for name in with_nul:
        problems.append(Problem(name, "contains a NUL byte, which no process environment or argument can carry; "
                                      "remove it"))
    profile_knob = registry["TWINSPARK_PROFILE"]
    if "TWINSPARK_PROFILE" in with_nul:  # every other rule depends on the profile: judging them would be noise
        return Result(profile=profile_knob.default_for("gb10") or "gb10", problems=problems)
    profile = raw.get("TWINSPARK_PROFILE", "").strip() or profile_knob.default_for("gb10")
    if profile not in settings.PROFILES:
        problems.append(Problem("TWINSPARK_PROFILE", f"unknown profile{_got(profile_knob, profile)}",
                                profile_knob.allowed()))
        profile = "gb10"
    result = Result(profile=profile)
    flavour_knob = registry.get("TWINSPARK_RUNTIME_FLAVOUR")
    flavour = raw.get("TWINSPARK_RUNTIME_FLAVOUR", "").strip() or "stock"
    if flavour not in settings.FLAVOURS:
        flavour = "stock"  # the knob's own check below reports the bad value
    rank_text = raw.get("NODE_RANK", "").strip()
    rank = int(rank_text) if rank_text.isdigit() and len(rank_text) == 1 else None
    chosen, recipe_problem = _chosen_recipe(raw, profile, flavour, registry)
    if recipe_problem:
        problems.append(recipe_problem)

    for knob in registry.knobs:
        if knob.env in with_nul:
            continue
        text = raw.get(knob.env)
        if not knob.applies_to(profile):
            if text is not None and not _is_blank(knob, text):
                problems.append(Problem(
                    knob.env,
                    f"applies only to the {'/'.join(knob.profiles)} profile, not {profile}; remove it",
                ))
            continue
        if not knob.read_by(flavour):
            if text is not None and not _is_blank(knob, text):
                problems.append(Problem(
                    knob.env,
                    f"is read only by the {'/'.join(knob.flavours)} runtime; the {flavour} runtime never reads it. "
                    f"Remove it, or set TWINSPARK_RUNTIME_FLAVOUR={knob.flavours[0]}",
                ))
            continue
        value: str | None
        if text is None or (_is_blank(knob, text) and knob.empty != "keep"):
            value = recipe.default_value(knob, profile, rank, chosen, registry)
            if value is not None and knob.env in chosen.knobs:  # the recipe's own value obeys the knob's rule
                try:
                    value = _NORMALISERS[knob.type](knob, value)
                except _Invalid as exc:
                    problems.append(Problem(recipe.RECIPE_ENV, f"the {chosen.name} recipe gives {knob.env} a value "
                                                               f"that {exc.message.removeprefix('is ')}; fix "
                                                               f"knobs.{knob.env} in its file", knob.allowed()))
                    continue
            if text is not None and knob.empty == "absent":
                # Set empty on purpose: absent for vLLM. Kept as "" when a default exists, so that a rendered
                # file says so (leaving the line out would bring the default back).
                value = "" if value is not None else None
        else:
            try:
                value = _NORMALISERS[knob.type](knob, text)
            except _Invalid as exc:
                problems.append(Problem(knob.env, exc.message + _got(knob, text), knob.allowed()))
                continue
        if value is None and knob.default_from:
            value = result.values.get(knob.default_from)
        if value is not None:
            result.values[knob.env] = value
        elif knob.required:
            how = "derived from the inventory" if knob.derived else "set"
            problems.append(Problem(knob.env, f"is required (it is {how} per node); add it to the env file"))

    passed_on = set(result.values.get(PASSTHROUGH, "").split())
    for name, text in raw.items():
        if registry.get(name) is None and name not in with_nul:
            problem = _unknown_variable(name, profile, registry, flavour, chosen.name)
            if problem:
                problems.append(problem)
            elif name in passed_on:
                result.others[name] = text
            else:
                problems.append(Problem(name, f"is not a TwinSpark setting, so it is not handed to vLLM; remove it, "
                                              f"or name it in {PASSTHROUGH} to pass it on"))

    problems.extend(_cross_checks(result.values, profile))
    problems.extend(_recipe_checks(raw, result.values, chosen))
    if flavour_knob is not None and flavour != "stock" and profile != "gb10":
        problems.append(Problem("TWINSPARK_RUNTIME_FLAVOUR", f"{flavour} is for the gb10 profile only (the {profile} "
                                                             "profile runs its own wheelhouse); set it to stock"))
    result.problems = problems
    return result


def _chosen_recipe(raw: Mapping[str, str], profile: str, flavour: str, registry: Registry):
    """(the recipe this env names, or the profile's default when it names none or a wrong one; the problem)."""
    default = recipe.chosen(profile, None, registry)
    text = (raw.get(recipe.RECIPE_ENV) or "").strip()
    if not text or text not in recipe.catalogue():
        return default, None  # an unknown name is the knob's own problem (its normaliser)
    chosen = recipe.get(text)
    if chosen.profile != profile:
        others = ", ".join(recipe.names(profile))
        return default, Problem(recipe.RECIPE_ENV, f"{text} is a {chosen.profile} recipe; the {profile} profile "
                                                   f"serves {others}", others)
    if flavour not in chosen.flavours:
        return chosen, Problem(recipe.RECIPE_ENV, f"{text} is written for the {'/'.join(chosen.flavours)} runtime, "
                                                  f"not {flavour}; set TWINSPARK_RUNTIME_FLAVOUR="
                                                  f"{chosen.flavours[0]} or pick another recipe")
    return chosen, None


def _recipe_checks(raw: Mapping[str, str], values: Mapping[str, str], chosen) -> list[Problem]:
    """The recipe fits the group (its node count is one the recipe was laid out for), and a model named by hand
    keeps the recipe's pinned revision only when it is the recipe's own model."""
    problems = []
    group = recipe.group_layout()
    if group not in chosen.layouts:
        counts = " or ".join(str(n) for n in chosen.node_counts)
        problems.append(Problem(recipe.RECIPE_ENV, f"{chosen.name} runs on {counts} nodes "
                                                   f"({', '.join(map(str, chosen.layouts))}); this group is "
                                                   f"{group.nodes} nodes in {group}: pick a recipe laid out for it "
                                                   f"(`twinspark recipe list`)"))
    model = (raw.get("MODEL") or "").strip()
    if model and model != chosen.model and not (raw.get("MODEL_REVISION") or "").strip() \
            and "MODEL_REVISION" not in raw and chosen.revision is not None and not model.startswith("/"):
        problems.append(Problem("MODEL_REVISION", f"is the {chosen.name} recipe's pin for {chosen.model}, not for "
                                                  f"MODEL={model}; set MODEL_REVISION to the commit of {model} you "
                                                  "serve (or empty for none), or pick that model's recipe"))
    return problems


def _unknown_variable(name: str, profile: str, registry: Registry, flavour: str = "stock",
                      recipe_name: str | None = None) -> Problem | None:
    if name in budget.VLLM_ENV:
        return Problem(name, f"is derived from {budget.BUDGET_ENV} by the launcher; remove it and set "
                             f"{budget.BUDGET_ENV} ({budget.BUDGET_VAR} in the inventory) instead")
    fixed = recipe.fixed_env(profile, flavour, recipe_name, registry)
    if name in fixed:
        owner = f"{profile} profile" if name in registry.profile_env(profile) else \
            f"{recipe.chosen(profile, recipe_name, registry).name} recipe"
        return Problem(name, f"is fixed by the {owner} ({fixed[name]}) and set by the launcher; remove it")
    for other in settings.FLAVOURS:
        if other != flavour and name in recipe.fixed_env(profile, other, recipe_name, registry):
            return Problem(name, f"is read only by the {other} runtime; the {flavour} runtime never reads it. "
                                 f"Remove it, or set TWINSPARK_RUNTIME_FLAVOUR={other}")
    known = [k.env for k in registry.knobs]
    upper = name.upper()
    if upper != name and upper in known:
        return Problem(name, f"unknown variable; did you mean {upper}? (names are case-sensitive)")
    close = difflib.get_close_matches(upper, known, n=1, cutoff=TYPO_CUTOFF)
    if close:
        return Problem(name, f"unknown variable; did you mean {close[0]}?")
    return None


PAIR_LAYOUT = (2, 2, 1)  # NNODES, TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE of a pair (settings.yml common args)


def group_layout(values: Mapping[str, str]) -> tuple[int, int, int]:
    """(nodes, TP, PP) of the group a validated env belongs to: a pair's when NNODES is absent; TP defaults to the
    node count and PP to 1 (docs/GROUPS.md)."""
    if not values.get("NNODES"):
        size, tp, pp = PAIR_LAYOUT
    else:
        size = int(values["NNODES"])
        tp, pp = size, 1
    return (size, int(values.get("TENSOR_PARALLEL_SIZE") or tp), int(values.get("PIPELINE_PARALLEL_SIZE") or pp))


def _cross_checks(values: Mapping[str, str], profile: str) -> list[Problem]:
    problems = []
    rank = values.get("NODE_RANK")
    host_ip = values.get("VLLM_HOST_IP")
    master = values.get("MASTER_ADDR")
    worker = values.get("WORKER_HOST")
    if rank == "0" and host_ip and master and host_ip != master:
        problems.append(Problem("VLLM_HOST_IP", f"on the head (NODE_RANK=0) must equal MASTER_ADDR ({master}), "
                                                f"got {host_ip}"))
    if rank == "1" and host_ip and worker and host_ip != worker:
        problems.append(Problem("VLLM_HOST_IP", f"on the worker (NODE_RANK=1) must equal WORKER_HOST ({worker}), "
                                                f"got {host_ip}"))
    size, tp, pp = group_layout(values)
    if master and worker and master == worker and size > 1:
        problems.append(Problem("WORKER_HOST", f"equals MASTER_ADDR ({master}); the two nodes need their own "
                                               "fabric addresses"))
    if rank is not None and rank.isdigit() and int(rank) >= size:
        problems.append(Problem("NODE_RANK", f"is {rank}, but the group has {size} node(s) (NNODES): ranks are "
                                             f"0..{size - 1}"))
    if tp * pp != size:
        problems.append(Problem("TENSOR_PARALLEL_SIZE", f"{tp} x PIPELINE_PARALLEL_SIZE {pp} is {tp * pp}, not the "
                                                        f"group's {size} node(s) (NNODES); vLLM needs one GPU per "
                                                        "rank and TP x PP of them"))
    if values.get("NCCL_IB_GID_AUTO") == "0" and "NCCL_IB_GID_INDEX" not in values:
        problems.append(Problem("NCCL_IB_GID_INDEX", "is required when NCCL_IB_GID_AUTO=0; pin it, or set "
                                                     "NCCL_IB_GID_AUTO=1 to resolve it on each node at start"))
    if values.get("TWINSPARK_ROUTER_URL") and not values.get("TWINSPARK_ROUTER_PAIR_URL"):
        problems.append(Problem("TWINSPARK_ROUTER_PAIR_URL", "is required when TWINSPARK_ROUTER_URL is set: the "
                                                             "drain must tell the router which pair to take out; "
                                                             "set it to this pair's entry in the router's "
                                                             "--worker-urls"))
    model = values.get("MODEL", "")
    if model.startswith("/") and values.get("MODEL_REVISION"):
        problems.append(Problem("MODEL_REVISION", f"must be empty for a local model directory (MODEL={model}); "
                                                  "set MODEL_REVISION= (empty)"))
    cert_env, key_env, ca_env = "TWINSPARK_VLLM_TLS_CERT", "TWINSPARK_VLLM_TLS_KEY", "TWINSPARK_VLLM_TLS_CA"
    cert, key, ca = values.get(cert_env), values.get(key_env), values.get(ca_env)
    if bool(cert) != bool(key):
        missing, present = (key_env, cert_env) if cert else (cert_env, key_env)
        problems.append(Problem(missing, f"must be set together with {present} (TLS needs both the certificate and "
                                         "its key); set both, or neither for plain HTTP"))
    if ca and not cert:
        problems.append(Problem(ca_env, f"is set but TLS is off (no {cert_env}); set the certificate and key too, "
                                        "or remove it"))
    if values.get("VLLM_API_KEY") and values.get("DSPARK_API_KEYS"):
        problems.append(Problem("VLLM_API_KEY, DSPARK_API_KEYS", "both are set; keep exactly one of them "
                                                                 "(DSPARK_API_KEYS holds several keys)"))
    return problems
