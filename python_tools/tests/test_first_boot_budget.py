"""One first-boot budget: every timer a start of the pair crosses, derived in twinspark.budget and read from there.

The table is printed (pytest -s shows it); the tests hold the orderings, and check that each consumer (the env file
and vLLM's environment, the rank unit, the role's readiness wait, the pair guard's arguments and unit, the router)
carries the derived value: rendered with a budget no default uses, so a literal put back anywhere fails.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from twinspark import budget, generate, launcher, nodeenv, recipe, settings, validate
from twinspark.fleet import router_config

ROOT = generate.repo_root()
ROLE = ROOT / "roles" / "vllm_service"
DEFAULT_BUDGETS = {"gb10": 3600, "cpu": 600}
ODD_BUDGET = 1234  # no default and no literal anywhere: a consumer showing its derived values reads the budget


def load_filters(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "filter_plugins" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_registry_defaults_are_the_budgets_this_project_runs():
    knob = settings.load()[budget.BUDGET_ENV]
    assert knob.var == budget.BUDGET_VAR and knob.passes == "launcher"
    assert {profile: int(knob.default_for(profile)) for profile in settings.PROFILES} == DEFAULT_BUDGETS


@pytest.mark.parametrize("profile", settings.PROFILES)
def test_every_timer_keeps_its_order(profile):
    print("\n" + "\n".join(budget.table(DEFAULT_BUDGETS)))
    least = int(settings.load()[budget.BUDGET_ENV].min)
    for first_boot in (least, 599, DEFAULT_BUDGETS[profile], 3601, 7200, 86400):
        t = budget.first_boot_timers(profile, first_boot)
        assert {name for name, _ in budget.TIMERS} == set(t)
        margin = budget.margin_s(first_boot)
        assert budget.MARGIN_MIN_S <= margin <= budget.MARGIN_MAX_S
        # vLLM gives up no later than systemd would, and a margin before the role and the guard do.
        assert t["vllm_engine_ready_timeout_s"] <= t["unit_start_timeout_s"]
        assert t["ready_wait_s"] >= t["vllm_engine_ready_timeout_s"] + margin
        assert t["ready_wait_s"] == first_boot
        assert 0 < t["vllm_execute_model_timeout_s"] < t["vllm_engine_ready_timeout_s"]
        assert t["guard_startup_grace_s"] >= t["vllm_engine_ready_timeout_s"]
        assert t["guard_run_timeout_s"] >= t["ready_wait_s"] + budget.GUARD_RUN_EXTRA_S
        assert t["router_startup_wait_s"] >= t["vllm_engine_ready_timeout_s"] + margin
        assert budget.problems(t) == []


def test_the_derived_values_keep_what_each_profile_ran_with():
    # gb10: the role's 3600 s wait, the DSpark runbook's 1800 s execute-model timeout, the guard unit's ready +
    # 300 s; vLLM's 600 s engine-ready default (which ended every gb10 first boot) is gone. cpu: the simulated
    # pair's 600 s wait and vLLM's own 300 s execute-model default.
    gb10, cpu = (budget.first_boot_timers(p, DEFAULT_BUDGETS[p]) for p in ("gb10", "cpu"))
    kept = ("ready_wait_s", "vllm_execute_model_timeout_s", "guard_run_timeout_s")
    assert [gb10[name] for name in kept] == [3600, 1800, 3900]
    assert gb10["vllm_engine_ready_timeout_s"] > 600
    assert [cpu[name] for name in kept] == [600, 300, 900]


def test_a_broken_ordering_is_named():
    t = {**budget.first_boot_timers("gb10", 3600), "unit_start_timeout_s": 600}
    assert budget.problems(t) == ["vLLM's engine-ready timeout must not exceed the unit's start timeout"]


@pytest.mark.parametrize("bad", ["299", "0", "soon"])
def test_a_bad_budget_fails_with_one_line_naming_the_variable(bad):
    with pytest.raises(ValueError, match=rf"^{budget.BUDGET_VAR} must be"):
        budget.first_boot_timers("gb10", bad)
    serve, _ = nodeenv.example_env("gb10", 0)
    problems = validate.validate({**serve, budget.BUDGET_ENV: bad}).problems
    assert [p.var for p in problems] == [budget.BUDGET_ENV]
    with pytest.raises(nodeenv.NodeEnvError, match=budget.BUDGET_VAR):
        nodeenv.node_env({"twinspark_profile": "gb10", budget.BUDGET_VAR: bad}, 0, "192.0.2.1", "192.0.2.2")


@pytest.mark.parametrize("profile", settings.PROFILES)
@pytest.mark.parametrize("rank", [0, 1])
def test_the_env_file_carries_the_budget_and_vllm_gets_the_derived_waits(profile, rank):
    serve, _ = nodeenv.node_env({"twinspark_profile": profile, budget.BUDGET_VAR: ODD_BUDGET}, rank,
                                "192.0.2.1", "192.0.2.2")
    assert serve[budget.BUDGET_ENV] == str(ODD_BUDGET)
    t = budget.first_boot_timers(profile, ODD_BUDGET)
    env = launcher.build_command(validate.validate(serve).values).env
    assert env[budget.ENGINE_READY_ENV] == str(t["vllm_engine_ready_timeout_s"])
    assert env[budget.EXECUTE_MODEL_ENV] == str(t["vllm_execute_model_timeout_s"])
    assert budget.BUDGET_ENV not in env  # the launcher's, not vLLM's
    default_serve, _ = nodeenv.example_env(profile, rank)
    assert default_serve[budget.BUDGET_ENV] == str(DEFAULT_BUDGETS[profile])


def test_no_fixed_environment_sets_a_derived_vllm_wait():
    for name, chosen in recipe.catalogue().items():
        for flavour in chosen.flavours:
            assert not set(budget.VLLM_ENV) & set(recipe.fixed_env(chosen.profile, flavour, name)), (name, flavour)


@pytest.mark.parametrize("name", budget.VLLM_ENV)
def test_an_env_file_cannot_set_vllms_waits_itself(name):
    serve, _ = nodeenv.example_env("cpu", 0)
    for extra in ({name: "60"}, {name: "60", "ENV_PASSTHROUGH": name}):
        problems = validate.validate({**serve, **extra}).problems
        assert len(problems) == 1 and problems[0].var == name
        assert budget.BUDGET_ENV in problems[0].message and "remove it" in problems[0].message


def test_the_inventory_cannot_set_a_derived_timer():
    filters = load_filters("twinspark")
    host_vars = {"h": {"twinspark_fabric_address": "10.0.0.1", "vllm_service_ready_timeout_s": 600},
                 "w": {"twinspark_fabric_address": "10.0.0.2"}}
    groups = {"all": ["h", "w"], "twinspark_head": ["h"], "twinspark_worker": ["w"]}
    problems = filters.twinspark_pair_problems(host_vars, groups)
    assert len(problems) == 1
    assert problems[0].startswith("h: vllm_service_ready_timeout_s: is derived from twinspark_first_boot_budget_s")
    assert load_filters("twinspark_service").twinspark_first_boot_retired(host_vars["w"]) == []


def test_the_role_reads_its_timers_from_the_budget_only():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    specs = (ROLE / "meta" / "argument_specs.yml").read_text()
    assert role_vars["vllm_service_first_boot"] == "{{ vllm_service_head_env | twinspark_first_boot_timers }}"
    for var, timer in budget.RETIRED_VARS.items():
        assert var not in defaults and f"{var}:" not in specs  # not an input of the role any more
        assert role_vars[var] == f"{{{{ vllm_service_first_boot.{timer} }}}}"
    ready = (ROLE / "tasks" / "_pair_ready.yml").read_text()
    assert "retries: \"{{ (vllm_service_ready_timeout_s | int / vllm_service_ready_poll_s | int)" in ready
    for inventory in (ROOT / "inventory").glob("*/group_vars/**/*.yml"):
        text = inventory.read_text()
        assert not any(var in text.split("#")[0] for var in budget.RETIRED_VARS), inventory
    # The filter the role calls is the rule itself.
    head_env, _ = nodeenv.node_env({"twinspark_profile": "gb10", budget.BUDGET_VAR: ODD_BUDGET}, 0,
                                   "192.0.2.1", "192.0.2.2")
    assert load_filters("twinspark_service").twinspark_first_boot_timers(head_env) == \
        budget.first_boot_timers("gb10", ODD_BUDGET)


def test_no_unit_template_or_router_flag_holds_a_literal_timer():
    for path in (ROLE / "templates" / "twinspark-vllm.service.j2",
                 ROOT / "roles" / "pair_guard" / "templates" / "twinspark-pair-guard.service.j2"):
        text, name = path.read_text(), path.name
        assert not re.search(r"^TimeoutStartSec=\s*\d", text, re.M), name
        assert not re.search(r"TimeoutStartSec=.*[+*-]\s*\d", text), name
    assert router_config.STARTUP_WAIT_FLAG not in router_config.TUNED
    assert router_config.STARTUP_WAIT_FLAG not in router_config.flags()


def _render(tmp_path: Path, inventory: str, first_boot: int) -> Path:
    source = ROOT / "inventory" / inventory
    copy = tmp_path / inventory
    shutil.copytree(source, copy, symlinks=False)
    with (copy / "group_vars" / "all" / "serving.yml").open("a") as out:
        out.write(f"\n{budget.BUDGET_VAR}: {first_boot}\n")
    out = tmp_path / f"{inventory}-units"
    result = subprocess.run([str(ROOT / "scripts" / "render-units"), str(copy), str(out)],
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.mark.slow(6)
@pytest.mark.parametrize(("profile", "inventory", "first_boot"),
                         [("cpu", "sim", ODD_BUDGET), ("gb10", "example", ODD_BUDGET)])
def test_the_rendered_units_carry_the_derived_timers(tmp_path, profile, inventory, first_boot):
    out = _render(tmp_path, inventory, first_boot)
    t = budget.first_boot_timers(profile, first_boot)
    head, worker = sorted(p for p in out.iterdir() if p.is_dir())
    for node in (head, worker):
        unit = (node / "twinspark-vllm.service").read_text()
        assert re.findall(r"^TimeoutStartSec=(.*)$", unit, re.M) == [str(t["unit_start_timeout_s"])]
    guard = (head / "twinspark-pair-guard.service").read_text()
    assert re.findall(r"^TimeoutStartSec=(.*)$", guard, re.M) == [str(t["guard_run_timeout_s"])]
    argv = shlex.split(re.search(r"^ExecStart=(.*)$", guard, re.M).group(1))
    assert float(argv[argv.index("--ready-timeout") + 1]) == t["ready_wait_s"]
    assert float(argv[argv.index("--startup-grace") + 1]) == t["guard_startup_grace_s"]


def test_the_router_waits_as_long_as_its_slowest_pair():
    host_vars = {
        "a1": {"twinspark_pair_name": "pair_a", "ansible_host": "192.0.2.11"},
        "a2": {"twinspark_pair_name": "pair_a", "ansible_host": "192.0.2.12"},
        "b1": {"twinspark_pair_name": "pair_b", "ansible_host": "192.0.2.21", "twinspark_profile": "cpu",
               budget.BUDGET_VAR: ODD_BUDGET},
        "b2": {"twinspark_pair_name": "pair_b", "ansible_host": "192.0.2.22", "twinspark_profile": "cpu"},
        "r1": {"ansible_host": "192.0.2.30"},
    }
    groups = {"all": list(host_vars), "pair_a": ["a1", "a2"], "pair_b": ["b1", "b2"], "twinspark_head": ["a1", "b1"],
              "twinspark_worker": ["a2", "b2"], "twinspark_router": ["r1"]}
    gb10 = budget.first_boot_timers("gb10", DEFAULT_BUDGETS["gb10"])["router_startup_wait_s"]
    assert router_config.startup_wait(host_vars, groups, "r1") == gb10
    host_vars["r1"]["twinspark_router_pairs"] = ["pair_b"]
    wait = router_config.startup_wait(host_vars, groups, "r1")
    assert wait == budget.first_boot_timers("cpu", ODD_BUDGET)["router_startup_wait_s"]
    filters = load_filters("twinspark_router")
    assert filters.twinspark_router_startup_wait(host_vars, groups, "r1") == wait
    argv = shlex.split(filters.twinspark_router_exec_start(["http://192.0.2.21:8888"], "/py", "/l.py", "http://k/",
                                                           "0.0.0.0", 30000, 29000, "power_of_two", None, wait))
    assert argv[argv.index(router_config.STARTUP_WAIT_FLAG) + 1] == str(wait)
    template = (ROOT / "roles" / "router" / "templates" / "twinspark-router.service.j2").read_text()
    assert "router_startup_wait_s) }}" in template
    assert "twinspark_router_startup_wait(groups, inventory_hostname)" in \
        (ROOT / "roles" / "router" / "tasks" / "main.yml").read_text()
