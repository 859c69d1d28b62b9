"""Recipes (twinspark/recipe.py, twinspark/recipes/): the default recipes change nothing, one precedence rule, and a
broken recipe is refused before any host is touched. The proofs against vLLM 0.33.0's own code are in
test_recipe_proofs.py."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from twinspark import budget, cli, envfile, nodeenv, recipe, settings, validate

REPO = Path(__file__).resolve().parents[2]
# Recorded at commit 85dc2ad, before recipes existed: every default env (both profiles, both ranks, both runtime
# flavours), its `twinspark serve --dry-run --json` without the interpreter path, and the env files the sim and
# example inventories rendered.
GROUP_ENVS = ("NNODES", "TENSOR_PARALLEL_SIZE", "PIPELINE_PARALLEL_SIZE")  # docs/GROUPS.md, absent on a pair
RECORDED = json.loads((Path(__file__).parent / "fixtures" / "recorded_before_recipes.json").read_text())
RECIPE_FILES = sorted((REPO / "python_tools" / "twinspark" / "recipes").glob("*.yml"))


def _dry_run(path: Path) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["serve", "--dry-run", "--json", "--skip-gid", "--env", str(path)]) == 0
    shown = json.loads(out.getvalue())
    shown["argv"] = shown["argv"][1:]
    return shown


@pytest.mark.parametrize("case", [k for k in RECORDED if not k.startswith("inventory/")])
def test_no_recipe_set_serves_exactly_what_was_served_before_recipes(tmp_path, case):
    profile, flavour, rank = case.split("/")
    serve, secrets = nodeenv.node_env({"TWINSPARK_PROFILE": profile, "TWINSPARK_RUNTIME_FLAVOUR": flavour},
                                      int(rank[-1]), nodeenv.EXAMPLE_HEAD_ADDRESS, nodeenv.EXAMPLE_WORKER_ADDRESS)
    before = RECORDED[case]
    # The env files: line for line what they were (the default recipe is not written, so a runtime whose launcher
    # predates recipes, the one a rollback returns to, still reads them).
    assert recipe.RECIPE_ENV not in serve
    assert list(serve.items()) == list(before["serve_env"].items())
    assert secrets == before["secrets_env"]
    path = tmp_path / "node.env"
    path.write_text("".join(f"{k}={envfile.quote(v)}\n" for k, v in {**serve, **secrets}.items()))
    path.chmod(0o600)
    shown = _dry_run(path)
    # One deliberate addition since the recording: the process groups' timeouts from the first-boot budget, last.
    timeouts = budget.vllm_args(profile, budget.first_boot_timers(profile, serve[budget.BUDGET_ENV])["budget_s"])
    assert shown["argv"][-len(timeouts):] == timeouts
    assert shown["argv"][:-len(timeouts)] == before["dry_run"]["argv"]
    assert shown["env"] == before["dry_run"]["env"]
    # The launcher keeps its own knobs out of vLLM's environment: TWINSPARK_RECIPE and the group's size and layout
    # (absent on a pair) join them.
    assert sorted(shown["unset"]) == sorted([*before["dry_run"]["unset"], recipe.RECIPE_ENV, *GROUP_ENVS])


@pytest.mark.slow(6)
@pytest.mark.parametrize("inventory", ["sim", "example"])
def test_todays_inventories_render_the_same_env_files_but_the_recipe_line(inventory):
    """ansible-inventory reads the inventory files only (no host is contacted); the filter renders as the role does."""
    spec = importlib.util.spec_from_file_location("twinspark_filters_recipes", REPO / "filter_plugins" / "twinspark.py")
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    listed = json.loads(subprocess.run([str(REPO / ".venv" / "bin" / "ansible-inventory"), "-i",
                                        str(REPO / "inventory" / inventory), "--list"], capture_output=True,
                                       text=True, check=True, timeout=120, cwd=REPO).stdout)
    hostvars = listed["_meta"]["hostvars"]
    groups = {name: spec.get("hosts", []) for name, spec in listed.items() if name != "_meta"}
    compared = 0
    for key, before in RECORDED.items():
        if not key.startswith(f"inventory/{inventory}/"):
            continue
        host = key.rsplit("/", 1)[1]
        env = filters.twinspark_node_env(hostvars[host], host, groups, hostvars)
        files = {name: filters.twinspark_env_file(env, name) for name in settings.FILES}
        assert list(files["serve"].items()) == list(before["serve"].items()), host
        assert files["secrets"] == before["secrets"], host
        compared += 1
    assert compared == 2


def test_every_packaged_recipe_loads_and_is_named_after_its_file():
    catalogue = recipe.catalogue()
    assert [p.stem for p in RECIPE_FILES] == sorted(catalogue)
    assert {recipe.default_name(p) for p in settings.PROFILES} == {"deepseek-v4-flash", "tiny-llama"}
    gb10 = [r for r in catalogue.values() if r.profile == "gb10"]
    assert len(gb10) >= 6 and len({r.architecture["architectures"][0] for r in gb10}) == len(gb10)
    for chosen in catalogue.values():
        assert chosen.verified is None, f"{chosen.name}: nothing here ran on hardware; `verified` stays null"
        assert chosen.verified_text() == "not verified on hardware"
        for layout in chosen.layouts:
            assert chosen.heads % layout.tp == 0


def test_every_recipe_knob_value_obeys_its_knobs_own_rule():
    registry = settings.load()
    for chosen in recipe.catalogue().values():
        for env, value in chosen.knob_defaults().items():
            assert validate.normalise(registry[env], value) == value, (chosen.name, env)


# ------------------------------------------------------------------------------------------------ broken recipes


def _data(name: str = "gpt-oss-120b") -> dict:
    return yaml.safe_load((REPO / "python_tools" / "twinspark" / "recipes" / f"{name}.yml").read_text())


def _refused(data: dict) -> str:
    with pytest.raises(recipe.RecipeError) as caught:
        recipe.parse(data, "broken.yml")
    return str(caught.value)


def test_a_revision_that_is_a_branch_is_refused_naming_the_fix():
    data = _data()
    data["model"]["revision"] = "main"
    message = _refused(data)
    assert message.startswith("broken.yml: model.revision 'main' is not a commit hash") and "never a branch" in message
    del data["model"]["revision"]
    assert "model.revision None is not a commit hash" in _refused(data)


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_refused():
    data = _data("deepseek-v4-flash")
    data["parallel"]["layouts"].append({"tp": 3})
    assert _refused(data) == ("broken.yml: parallel.layouts TP3xPP1: tensor parallel 3 does not divide the 64 "
                              "attention heads; use a TP that divides them (pipeline parallel for the rest)")
    data = _data("minimax-m2")  # 48 heads divide by 3; its 8 KV heads do not
    data["parallel"]["layouts"].append({"tp": 3})
    assert "tensor parallel 3 neither divides the 8 KV heads nor is a multiple of them" in _refused(data)


def test_pipeline_parallel_needs_the_model_to_say_it_supports_it():
    data = _data("deepseek-v4-flash")
    data["parallel"]["layouts"].append({"tp": 1, "pp": 3})
    assert "pipeline parallel needs parallel.pipeline: true" in _refused(data)


@pytest.mark.parametrize(("flag", "owner"), [("--max-model-len", "MAX_MODEL_LEN"), ("--revision", "MODEL_REVISION"),
                                             ("--tensor-parallel-size", "the group's shared flags"),
                                             ("--speculative-config", "MTP_NUM_TOKENS")])
def test_a_flag_a_knob_owns_is_refused(flag, owner):
    data = _data()
    data["args"] += [flag, "1"]
    assert f"flag {flag} belongs to {owner}" in _refused(data)


@pytest.mark.parametrize(("knob", "value", "expected"), [
    ("NCCL_IB_HCA", "=x", "knobs.NCCL_IB_HCA is a fabric knob, not the model's"),
    ("MODEL", "a/b", "knobs.MODEL: write it as model.id"),
    ("NO_SUCH_KNOB", 1, "knobs.NO_SUCH_KNOB is not a knob of settings.yml"),
    ("VLLM_CPU_KVCACHE_SPACE", 4, "knobs.VLLM_CPU_KVCACHE_SPACE applies only to the cpu profile"),
])
def test_a_knob_that_is_not_the_models_is_refused(knob, value, expected):
    data = _data()
    data["knobs"][knob] = value
    assert expected in _refused(data)


def test_an_unknown_field_and_a_verified_record_without_its_facts_are_refused():
    data = _data()
    data["revison"] = "x"
    assert "unknown field(s) revison" in _refused(data)
    data = _data()
    data["verified"] = {"hardware": "2x GB10"}
    assert "verified is null (not verified on hardware) or exactly benchmark, date, hardware, runtime" in \
        _refused(data)


# ------------------------------------------------------------------------------------------------ choosing one


def _node(extra: dict, profile: str = "gb10", rank: int = 0) -> dict[str, str]:
    serve, _ = nodeenv.node_env({"TWINSPARK_PROFILE": profile, **extra}, rank, nodeenv.EXAMPLE_HEAD_ADDRESS,
                                nodeenv.EXAMPLE_WORKER_ADDRESS)
    return serve


def _problems(extra: dict, profile: str = "gb10") -> list[str]:
    with pytest.raises(nodeenv.NodeEnvError) as caught:
        _node(extra, profile)
    return caught.value.problems


def test_precedence_is_inventory_then_recipe_then_profile():
    profile_default = settings.load()["GPU_MEMORY_UTILIZATION"].default_for("gb10")
    assert _node({})["GPU_MEMORY_UTILIZATION"] == profile_default == "0.835"  # the default recipe gives none
    chosen = _node({"twinspark_recipe": "gpt-oss-120b"})
    assert chosen["GPU_MEMORY_UTILIZATION"] == "0.7"  # the recipe's
    assert (chosen["MODEL"], chosen["MODEL_REVISION"], chosen["SERVED_MODEL_NAME"]) == (
        "openai/gpt-oss-120b", "b5c939de8f754692c1647ca79fbf85e8c1e70f8a", "gpt-oss-120b")
    assert "MTP_NUM_TOKENS" not in chosen and "DEFAULT_THINKING" not in chosen  # DeepSeek's own, not gpt-oss's
    overridden = _node({"twinspark_recipe": "gpt-oss-120b", "twinspark_gpu_memory_utilization": 0.8,
                        "twinspark_max_model_len": 65536})
    assert (overridden["GPU_MEMORY_UTILIZATION"], overridden["MAX_MODEL_LEN"]) == ("0.8", "65536")  # the inventory's


def test_the_recipes_flags_and_variables_reach_vllm(tmp_path):
    serve = _node({"twinspark_recipe": "gpt-oss-120b"})
    path = tmp_path / "node.env"
    path.write_text("".join(f"{k}={envfile.quote(v)}\n" for k, v in serve.items()))
    shown = _dry_run(path)
    argv = shown["argv"]
    assert argv[argv.index("serve") + 1] == "openai/gpt-oss-120b"
    assert argv[argv.index("--tool-call-parser") + 1] == "openai"
    assert argv[argv.index("--reasoning-parser") + 1] == "openai_gptoss"
    assert "--speculative-config" not in argv and "deepseek_v4" not in " ".join(argv)
    assert "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB" not in shown["env"]  # DeepSeek-V4's, not in the gb10 profile
    assert shown["env"]["NCCL_NET"] == "IB"  # the profile's, whatever the model


@pytest.mark.parametrize(("extra", "profile", "expected"), [
    ({"twinspark_recipe": "gpt-oss-12b"}, "gb10",
     "twinspark_recipe (TWINSPARK_RECIPE): is not a recipe of python_tools/twinspark/recipes/; did you mean "
     "gpt-oss-120b?"),
    ({"twinspark_recipe": "gpt-oss-120b"}, "cpu",
     "twinspark_recipe (TWINSPARK_RECIPE): gpt-oss-120b is a gb10 recipe; the cpu profile serves tiny-llama"),
    ({"twinspark_recipe": "gpt-oss-120b", "twinspark_runtime_flavour": "fork"}, "gb10",
     "twinspark_recipe (TWINSPARK_RECIPE): gpt-oss-120b is written for the stock runtime, not fork; set "
     "TWINSPARK_RUNTIME_FLAVOUR=stock or pick another recipe"),
    ({"twinspark_recipe": "minimax-m2"}, "gb10",
     "twinspark_recipe (TWINSPARK_RECIPE): minimax-m2 runs on 4 or 8 nodes (TP4xPP1, TP8xPP1, TP2xPP2); this group "
     "is 2 nodes in TP2xPP1: pick a recipe laid out for it (`twinspark recipe list`)"),
    ({"twinspark_model": "org/other"}, "gb10",
     "twinspark_model_revision (MODEL_REVISION): is the deepseek-v4-flash recipe's pin for "
     "deepseek-ai/DeepSeek-V4-Flash-0731, not for MODEL=org/other; set MODEL_REVISION to the commit of org/other "
     "you serve (or empty for none), or pick that model's recipe"),
])
def test_a_wrong_recipe_choice_is_one_line_naming_the_variable_and_the_fix(extra, profile, expected):
    problems = _problems(extra, profile)
    assert any(p.startswith(expected) for p in problems), problems


def test_a_recipe_giving_a_knob_a_bad_value_is_named(monkeypatch):
    data = _data()
    data["knobs"]["GPU_MEMORY_UTILIZATION"] = 1.5
    broken = recipe.parse(data, "gpt-oss-120b.yml")
    catalogue = {**recipe.catalogue(), "gpt-oss-120b": broken}
    monkeypatch.setattr(recipe, "catalogue", lambda: catalogue)
    problems = _problems({"twinspark_recipe": "gpt-oss-120b"})
    assert any(p.startswith("twinspark_recipe (TWINSPARK_RECIPE): the gpt-oss-120b recipe gives "
                            "GPU_MEMORY_UTILIZATION a value that") and "fix knobs.GPU_MEMORY_UTILIZATION" in p
               for p in problems), problems


def test_a_recipe_does_not_change_another_recipes_copy():
    chosen = recipe.get("deepseek-v4-flash")
    defaults = chosen.knob_defaults()
    defaults["MODEL"] = "x"
    assert chosen.knob_defaults()["MODEL"] == "deepseek-ai/DeepSeek-V4-Flash-0731"
    assert copy.deepcopy(chosen) == chosen
