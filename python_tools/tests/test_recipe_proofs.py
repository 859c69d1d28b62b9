"""Every shipped recipe proven against vLLM 0.33.0's own code (`twinspark recipe check --all` run by the vLLM
parser venv's Python, scripts/build-vllm-parser-venv): the planner's fit, vLLM's serve parser and validation, its
model config on a stand-in config.json written from the recipe's facts, its model registry, its heads and pipeline
rules (ModelConfig.verify_with_parallel_config), the tool-call and reasoning parsers, the quantization method, the
KV-cache dtype and the VLLM_* variables; and a broken recipe refused."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from twinspark import recipe

REPO = Path(__file__).resolve().parents[2]
PROOFS = ["planner fit", "vllm serve parser and validation", "model registry", "heads and layout (vLLM)",
          "tool-call parser", "reasoning parser", "quantization flag", "checkpoint quantization", "KV-cache dtype",
          "environment"]


def _check(python: Path, *args: str, tmp_path: Path) -> tuple[int, dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_"))}
    # vLLM's registry caches what it learns of each model class by the class's source hash: kept beside the venv.
    env.update(PYTHONPATH=str(REPO / "python_tools"), VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR",
               VLLM_CACHE_ROOT=str(python.parents[2] / "vllm-cache"), TMPDIR=str(tmp_path))
    done = subprocess.run([str(python), "-m", "twinspark.cli", "recipe", "check", *args, "--json"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


@pytest.fixture(scope="module")
def every_recipe(vllm_python, tmp_path_factory) -> tuple[int, dict, str]:
    return _check(vllm_python, "--all", tmp_path=tmp_path_factory.mktemp("proofs"))


def test_every_shipped_recipe_passes_every_proof_on_every_layout(every_recipe):
    code, result, stderr = every_recipe
    assert result.get("vllm") == "0.33.0", stderr[-3000:]
    assert sorted(result["recipes"]) == sorted(recipe.catalogue())
    failed = [f"{name} {layout}: {p['name']}: {p['detail']}" for name, entry in result["recipes"].items()
              for layout, proofs in entry["layouts"].items() for p in proofs if not p["ok"]]
    assert not failed and code == 0, "\n".join(failed)
    for name, entry in result["recipes"].items():
        assert sorted(entry["layouts"]) == sorted(str(x) for x in recipe.get(name).layouts)
        for proofs in entry["layouts"].values():
            assert [p["name"] for p in proofs] == PROOFS, name


def test_the_proofs_say_what_they_proved(every_recipe):
    _, result, _ = every_recipe
    gpt = {p["name"]: p["detail"] for p in result["recipes"]["gpt-oss-120b"]["layouts"]["TP2xPP1"]}
    assert (gpt["tool-call parser"], gpt["reasoning parser"], gpt["KV-cache dtype"]) == ("openai", "openai_gptoss",
                                                                                            "fp8")
    assert gpt["model registry"] == "GptOssForCausalLM is registered"
    assert "create_model_config passed" in gpt["vllm serve parser and validation"]
    minimax = {p["name"]: p["detail"] for p in result["recipes"]["minimax-m2"]["layouts"]["TP2xPP2"]}
    assert minimax["heads and layout (vLLM)"] == "48 heads, 8 KV heads in TP2xPP2, pipeline supported"
    deepseek = {p["name"]: p["detail"] for p in result["recipes"]["deepseek-v4-flash"]["layouts"]["TP2xPP1"]}
    assert deepseek["KV-cache dtype"] == "fp8_ds_mla" and deepseek["tool-call parser"] == "deepseek_v4"


def _broken(tmp_path: Path, name: str, change) -> Path:
    data = yaml.safe_load((REPO / "python_tools" / "twinspark" / "recipes" / "gpt-oss-120b.yml").read_text())
    data["name"] = name
    change(data)
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_parser_vllm_does_not_have_is_refused_naming_the_field(vllm_python, tmp_path):
    def bad_parsers(data):
        args = data["args"]
        args[args.index("--tool-call-parser") + 1] = "openai_v9"
        args[args.index("--reasoning-parser") + 1] = "no_such_reasoner"

    path = _broken(tmp_path, "broken-parsers", bad_parsers)
    code, result, stderr = _check(vllm_python, "--file", str(path), "--nodes", "2", tmp_path=tmp_path)
    assert code == 2, stderr[-3000:]
    proofs = {p["name"]: p for p in result["recipes"]["broken-parsers"]["layouts"]["TP2xPP1"]}
    assert not proofs["tool-call parser"]["ok"]
    assert proofs["tool-call parser"]["detail"].startswith("'openai_v9' is not one this vLLM has (fix args "
                                                           "--tool-call-parser)")
    assert not proofs["reasoning parser"]["ok"] and "no_such_reasoner" in proofs["reasoning parser"]["detail"]
    assert proofs["model registry"]["ok"] and proofs["KV-cache dtype"]["ok"]  # the rest of the recipe is fine


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["model"].update(revision="main"), "model.revision 'main' is not a commit hash"),
    (lambda d: d["parallel"]["layouts"].append({"tp": 3}), "tensor parallel 3 does not divide the 64 attention "
                                                           "heads"),
])
def test_a_recipe_that_contradicts_itself_is_refused_before_vllm_is_asked(tmp_path, capsys, change, expected):
    from twinspark import cli

    path = _broken(tmp_path, "broken-facts", change)
    assert cli.main(["recipe", "check", "--file", str(path)]) == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and expected in err, err
