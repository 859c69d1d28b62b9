"""The yardstick's rules (scripts/bench/yardstick): what the demo's phases are compared with, and when not to run.

The yardstick does the pair's unavoidable work by hand on the simulated pair (a plain pip install from the
wheelhouse on both nodes at once, a plain copy of the model, both ranks started straight from the launcher's argv)
and prints each demo phase beside it as a ratio. Everything here is a plain function of its input; the script
does the I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The steps the yardstick times, in order, and the demo phases (scripts/sim/demo, its callback's STAGE_PHASES) each
# one is the by-hand version of. `serve` ends at the first one-token answer, so it stands for the demo's service
# phase and its first chat together.
STEPS = ("runtime", "model", "serve")
STEP_PHASES: dict[str, tuple[str, ...]] = {
    "runtime": ("runtime",),
    "model": ("model",),
    "serve": ("service ready", "first chat"),
}
# Issue #16's bar: the runtime phase takes at most 1.2 x a plain parallel pip install from the wheelhouse.
TARGETS: dict[str, float] = {"runtime": 1.2}

# The launcher's argv starts [python, -I, -m, twinspark.vllm_entry, serve, MODEL, ...] (twinspark.launcher).
VLLM_ENTRY = ("-I", "-m", "twinspark.vllm_entry", "serve")
REDACTED = "<redacted>"
API_KEYS_ENV = "TWINSPARK_VLLM_API_KEYS"
# A rank unit in one of these states holds (or is about to hold) the CPUs, ports and caches the yardstick needs.
BUSY_STATES = ("active", "activating", "reloading", "deactivating", "refreshing")

# What `scripts/sim/demo` prints at its end: "  runtime        123.4 s".
_PRINTED_ROW = re.compile(r"^\s+(?P<phase>\S(?:.*\S)?)\s+(?P<seconds>-?\d+(?:\.\d+)?) s\s*$")
_PRINTED_HEADER = "== time to a serving pair"


class RecordError(ValueError):
    """A phase record that cannot be read; the message names the line and what is wrong."""


def _phase_row(item: object, where: str) -> tuple[str, float]:
    if not isinstance(item, Mapping) or "phase" not in item or "seconds" not in item:
        raise RecordError(f"{where}: expected {{\"phase\": NAME, \"seconds\": NUMBER}}, got {item!r}")
    phase, seconds = item["phase"], item["seconds"]
    if not isinstance(phase, str) or not phase.strip():
        raise RecordError(f"{where}: \"phase\" must be a non-empty string, got {phase!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0 or seconds != seconds:
        raise RecordError(f"{where}: \"seconds\" of {phase!r} must be a number >= 0, got {seconds!r}")
    return phase.strip(), float(seconds)


def parse_phase_record(text: str) -> list[tuple[str, float]]:
    """(phase, seconds) pairs, in order, from a phase record.

    Accepted: JSON lines ({"phase", "seconds"} per line, what scripts/sim/demo keeps and this script writes), one
    JSON list of such objects or {"phases": [...]}, or the demo's printed output (the table after
    "== time to a serving pair"; its "total" row is dropped). A phase named twice is summed. Raises RecordError.
    """
    stripped = text.strip()
    if not stripped:
        raise RecordError("the phase record is empty: run `make demo` first (it keeps one)")
    if _PRINTED_HEADER in text:
        return _merge(_parse_printed(text))
    try:
        document = json.loads(stripped)
    except json.JSONDecodeError:
        document = None  # JSON lines (or not JSON at all: said per line below)
    if isinstance(document, Mapping) and "phases" in document:
        document = document["phases"]
        if not isinstance(document, list):
            raise RecordError("\"phases\" must be a list of {\"phase\", \"seconds\"} objects")
    if isinstance(document, list):
        return _merge([_phase_row(item, f"item {i}") for i, item in enumerate(document, 1)])
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordError(f"line {number}: not JSON ({exc.msg}); expected one {{\"phase\", \"seconds\"}} "
                              f"object per line, or the demo's printed output") from None
        rows.append(_phase_row(item, f"line {number}"))
    return _merge(rows)


def _parse_printed(text: str) -> list[tuple[str, float]]:
    rows = []
    seen_header = False
    for line in text.splitlines():
        if line.strip() == _PRINTED_HEADER:
            seen_header, rows = True, []  # a log with several demo runs: the last table wins
            continue
        if not seen_header:
            continue
        match = _PRINTED_ROW.match(line)
        if match is None:
            if rows:
                seen_header = False
            continue
        if match["phase"] != "total":
            rows.append((match["phase"], float(match["seconds"])))
    if not rows:
        raise RecordError(f"no phase rows after {_PRINTED_HEADER!r} in the demo's output")
    return rows


def _merge(rows: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    merged: dict[str, float] = {}
    for phase, seconds in rows:
        merged[phase] = round(merged.get(phase, 0.0) + seconds, 3)
    return list(merged.items())


@dataclass(frozen=True)
class Row:
    phase: str
    demo_s: float | None
    yardstick_s: float | None

    @property
    def ratio(self) -> float | None:
        if self.demo_s is None or self.yardstick_s is None or self.yardstick_s <= 0:
            return None
        return self.demo_s / self.yardstick_s


def comparison_rows(demo: Sequence[tuple[str, float]], steps: Mapping[str, float]) -> list[Row]:
    """One row per demo phase in the demo's order; the phases a step stands for share one row, named
    "a + b", with their seconds summed. A phase with no by-hand step (harness, packages) gets no yardstick figure;
    a step whose phases the record lacks is still shown, with no demo figure."""
    demo_s = dict(demo)
    owner = {phase: step for step, phases in STEP_PHASES.items() for phase in phases}
    rows: list[Row] = []
    done: set[str] = set()
    for phase, _ in demo:
        step = owner.get(phase)
        if step is None:
            rows.append(Row(phase, demo_s[phase], None))
            continue
        if step in done:
            continue
        done.add(step)
        present = [p for p in STEP_PHASES[step] if p in demo_s]
        rows.append(Row(" + ".join(present), sum(demo_s[p] for p in present), steps.get(step)))
    for step in STEPS:
        if step not in done and step in steps:
            rows.append(Row(" + ".join(STEP_PHASES[step]), None, steps[step]))
    return rows


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(rows: Sequence[Row]) -> str:
    width = max([len("phase"), *(len(r.phase) for r in rows)])
    lines = [f"{'phase':<{width}}  {'demo s':>9}  {'yardstick s':>11}  {'ratio':>6}"]
    for r in rows:
        lines.append(f"{r.phase:<{width}}  {_cell(r.demo_s, '9.1f'):>9}  {_cell(r.yardstick_s, '11.1f'):>11}  "
                     f"{_cell(r.ratio, '6.2f'):>6}")
    return "\n".join(lines)


def verdicts(demo: Sequence[tuple[str, float]], steps: Mapping[str, float]) -> list[tuple[str, bool]]:
    """One line per target in TARGETS that both sides have a figure for, and whether it is met."""
    out = []
    demo_s = dict(demo)
    for step, bound in TARGETS.items():
        phases = [p for p in STEP_PHASES[step] if p in demo_s]
        if not phases or not steps.get(step):
            continue
        ratio = sum(demo_s[p] for p in phases) / steps[step]
        met = ratio <= bound
        out.append((f"{' + '.join(phases)} / by-hand {step} = {ratio:.2f} (target <= {bound}): "
                    f"{'met' if met else 'NOT met'}", met))
    return out


def step_line(step: str, seconds: float, what: str) -> str:
    return f"{step:<8} {seconds:8.1f} s  {what}"


def record_lines(steps: Mapping[str, float]) -> str:
    """The yardstick's own figures as JSON lines, the same shape as the demo's record."""
    return "".join(json.dumps({"phase": step, "seconds": round(seconds, 1)}) + "\n" for step, seconds in steps.items())


def refusal(ranks: Mapping[str, str], guard: str, leftovers: Mapping[str, Sequence[str]]) -> str | None:
    """Why the yardstick must not start, in one line; None when it may.

    ranks: node -> `systemctl is-active twinspark-vllm` there; guard: the same for the head's
    twinspark-pair-guard.timer (it would start the pair in the middle of the run); leftovers: node -> scratch
    things an earlier run left there (units, the scratch directory).
    """
    serving = [node for node, state in ranks.items() if state.strip() in BUSY_STATES]
    if serving:
        return (f"the pair serves (twinspark-vllm is active on {', '.join(serving)}): the yardstick needs the CPUs and "
                "the fabric to itself; stop the pair first (playbooks/stop.yml) or pass --stop-pair")
    if guard.strip() in BUSY_STATES:
        return ("twinspark-pair-guard.timer is active on the head and would start the pair in the middle of the run; "
                "stop the pair first (playbooks/stop.yml) or pass --stop-pair")
    left = [f"{node}: {', '.join(things)}" for node, things in leftovers.items() if things]
    if left:
        return (f"an earlier yardstick run left scratch things behind ({'; '.join(left)}); remove them first "
                "(`systemctl stop UNIT`, `rm -rf --one-file-system DIR` in that node)")
    return None


def _option_value(argv: Sequence[str], flag: str) -> str | None:
    for i, item in enumerate(argv):
        if item == flag and i + 1 < len(argv):
            return argv[i + 1]
        if item.startswith(flag + "="):
            return item.split("=", 1)[1]
    return None


def _set_option(argv: list[str], flag: str, value: str) -> None:
    for i, item in enumerate(argv):
        if item == flag and i + 1 < len(argv):
            argv[i + 1] = value
            return
        if item.startswith(flag + "="):
            argv[i] = f"{flag}={value}"
            return
    argv += [flag, value]


def model_index(argv: Sequence[str]) -> int:
    """Where the model sits in the launcher's argv (right after `twinspark.vllm_entry serve`)."""
    n = len(VLLM_ENTRY)
    for i in range(len(argv) - n):
        if tuple(argv[i:i + n]) == VLLM_ENTRY:
            return i + n
    raise ValueError(f"not the launcher's argv (no {' '.join(VLLM_ENTRY)} in it): {' '.join(argv[:6])} ...")


@dataclass(frozen=True)
class Rank:
    argv: list[str]
    env: dict[str, str]
    served_name: str


def scratch_rank(shown: Mapping[str, object], model_dir: str, port: int, master_port: int, headless: bool) -> Rank:
    """The argv and environment `twinspark serve --dry-run --json` printed for a rank, changed only where the
    yardstick must not share anything with the real pair: the model directory (the scratch copy), the API port and
    the rendezvous port, and on the head an API bound to loopback without keys (the probe runs inside the node).

    Raises ValueError naming what the dry run's output lacks.
    """
    argv_in = shown.get("argv")
    env_in = shown.get("env")
    if not isinstance(argv_in, list) or not all(isinstance(a, str) for a in argv_in):
        raise ValueError("`twinspark serve --dry-run --json` printed no \"argv\" list of strings")
    if not isinstance(env_in, Mapping):
        raise ValueError("`twinspark serve --dry-run --json` printed no \"env\" object")
    argv = list(argv_in)
    original_model = argv[model_index(argv)]
    argv[model_index(argv)] = model_dir
    served_name = _option_value(argv, "--served-model-name") or original_model
    if _option_value(argv, "--master-port") is None:
        raise ValueError("the rank's argv has no --master-port; the yardstick cannot move it off the real pair's")
    _set_option(argv, "--master-port", str(master_port))
    _set_option(argv, "--port", str(port))
    if not headless:
        _set_option(argv, "--host", "127.0.0.1")
    env = {k: str(v) for k, v in env_in.items() if k != API_KEYS_ENV and v != REDACTED}
    return Rank(argv=argv, env=env, served_name=served_name)


def port_clash(shown: Mapping[str, object], port: int, master_port: int) -> str | None:
    """One line when a scratch port is one of the real pair's (its API port or rendezvous port), else None."""
    argv = shown.get("argv") if isinstance(shown.get("argv"), list) else []
    real = {flag: _option_value(argv, flag) for flag in ("--port", "--master-port")}
    used = {v for v in real.values() if v is not None}
    clashes = [f"{name} {value}" for name, value in (("--port", port), ("--master-port", master_port))
               if str(value) in used]
    if port == master_port:
        clashes.append(f"--port and --master-port are both {port}")
    if clashes:
        return (f"scratch port clash ({', '.join(clashes)}): the real pair uses --port {real['--port']} and "
                f"--master-port {real['--master-port']}; pick others with --port/--master-port")
    return None
