"""The controller-side checks of vllm_runtime and model_cache judge each pair of a fleet by its own settings.

The tasks run exactly as the roles have them (read from the role's task file by name), on a fleet of four local
hosts in two pairs (local connection: nothing but this machine is contacted). pair_b names what pair_a does not
have: a vLLM pin without a patch manifest, a local model source that is not a checkpoint. Run once per play, the
check would look at the first pair only and let pair_b through; per node, pair_b stops with the line naming the
variable and pair_a goes on.
"""

from __future__ import annotations

import sys

import localplay
import pytest
import yaml

ROOT = localplay.ROOT


def _tasks(path: str, *prefixes: str) -> list[dict]:
    """The tasks of a role's task file whose names start with the prefixes, in the file's order."""
    tasks = yaml.safe_load((ROOT / path).read_text())
    chosen = [task for task in tasks if any(task["name"].startswith(prefix) for prefix in prefixes)]
    assert len(chosen) == len(prefixes), f"{path}: expected tasks {prefixes}, found {[t['name'] for t in chosen]}"
    return chosen


def _fleet(tmp_path, pair_vars: dict[str, dict]) -> str:
    """A two-pair inventory of local hosts; `pair_vars` per pair name."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    children = {name: {"hosts": {f"{name}_head": dict(local), f"{name}_worker": dict(local)}, "vars": values}
                for name, values in pair_vars.items()}
    path = tmp_path / "fleet.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"twinspark_pair": {"children": children}}}}))
    return str(path)


def _play(tmp_path, tasks: list[dict], play_vars: dict) -> str:
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump([{"name": "Per-pair checks", "hosts": "twinspark_pair", "gather_facts": False,
                                     "vars": play_vars, "tasks": tasks}], sort_keys=False))
    return str(path)


def _outcome(output: str) -> dict[str, str]:
    """host -> 'ok' or 'failed', from the play's recap."""
    found = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[1] == ":" and parts[2].startswith("ok="):
            failed = next(p for p in parts if p.startswith("failed="))
            found[parts[0]] = "failed" if failed != "failed=0" else "ok"
    return found


@pytest.mark.usefixtures("ansible_playbook")
def test_each_pair_needs_the_patch_manifest_of_its_own_pin(tmp_path):
    patches = tmp_path / "patches"
    (patches / "vllm-0.32.0").mkdir(parents=True)
    (patches / "vllm-0.32.0" / "manifest.yml").write_text("patches: []\n")
    tasks = _tasks("roles/vllm_runtime/tasks/preflight.yml", "Look on the controller for the patches of",
                   "Require a patch manifest for the pinned vLLM")
    inventory = _fleet(tmp_path, {"pair_a": {"vllm_runtime_target": "vllm-0.32.0"},
                                  "pair_b": {"vllm_runtime_target": "vllm-0.99.0"}})
    play = _play(tmp_path, tasks, {"vllm_runtime_patches_source": str(patches), "vllm_runtime_flavour": "stock"})
    code, output, _ = localplay.run(play, {}, inventory=inventory)
    assert code != 0
    assert _outcome(output) == {"pair_a_head": "ok", "pair_a_worker": "ok",
                                "pair_b_head": "failed", "pair_b_worker": "failed"}, output
    assert f"No {patches}/vllm-0.99.0/manifest.yml" in output
    assert "vllm-0.32.0/manifest.yml: the patches" not in output


@pytest.mark.usefixtures("ansible_playbook")
def test_each_pair_needs_its_own_local_model_source_to_be_a_checkpoint(tmp_path):
    good, empty = tmp_path / "good-model", tmp_path / "not-a-model"
    good.mkdir()
    empty.mkdir()
    (good / "model.safetensors").write_bytes(b"weights")
    tasks = _tasks("roles/model_cache/tasks/preflight.yml",
                   "Stop when the local source is not a safetensors checkpoint")
    inventory = _fleet(tmp_path, {"pair_a": {"model_cache_local_source": str(empty)},
                                  "pair_b": {"model_cache_local_source": str(good)}})
    play = _play(tmp_path, tasks, {"model_cache_source": "local"})
    code, output, _ = localplay.run(play, {}, inventory=inventory)
    assert code != 0
    assert _outcome(output) == {"pair_a_head": "failed", "pair_a_worker": "failed",
                                "pair_b_head": "ok", "pair_b_worker": "ok"}, output
    assert f"model_cache_local_source '{empty}' on the controller has neither" in output
