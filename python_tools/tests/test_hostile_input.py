"""Hostile input through the real `twinspark` command: each case ends in one line naming the path or variable,
exit 2 (bad input), and nothing written; none hangs or grows memory.

Every case runs the CLI in a child process with a time limit, so a regression that blocks on a FIFO or reads
/dev/zero forever fails here (timeout) instead of hanging the suite. The table in docs/OPERATIONS.md ("Hostile
input") lists the same cases.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import fake_sysfs
import pytest
from test_patching import _two_file_target

from twinspark import nodeenv

LIMIT_S = 30


def twinspark(*args: str, cwd: Path, user: str | None = None) -> tuple[int, list[str], str]:
    """(exit code, stderr lines, stdout) of `twinspark ARGS`, run in `cwd` with a time limit."""
    command = [sys.executable, "-m", "twinspark.cli", *args]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=LIMIT_S, check=False,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return done.returncode, done.stderr.splitlines(), done.stdout


def snapshot(root: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every entry under root: mode and content (link target for links, nothing read from FIFOs or devices)."""
    found: dict[str, tuple[int, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if path.is_symlink():
            found[str(path)] = (info.st_mode, os.readlink(path))
        elif path.is_file():
            found[str(path)] = (info.st_mode, path.read_bytes())
        else:
            found[str(path)] = (info.st_mode, "")
    return found


def env_file(tmp_path: Path, extra: str = "", profile: str = "cpu") -> Path:
    serve, secrets = nodeenv.example_env(profile, 0)
    path = tmp_path / "node.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in {**serve, **secrets}.items()) + extra)
    path.chmod(0o600)
    return path


def assert_one_line(code: int, lines: list[str], stdout: str, expected_code: int, start: str, *words: str) -> None:
    assert code == expected_code, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(start), lines
    for word in words:
        assert word in lines[0], lines
    assert stdout == ""


# ----------------------------------------------------------------------------------------------------------------
# Env files


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _dev_zero(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


def _oversized(path: Path) -> Path:
    with path.open("wb") as handle:  # sparse: 2 MiB of NULs, costs no disk
        handle.truncate(2 << 20)
    return path


ENV_FILE_CASES = {
    "fifo": (_fifo, "is a FIFO, not a regular file"),
    "link to /dev/zero": (_dev_zero, "is a character device, not a regular file"),
    "2 MiB file": (_oversized, "is 2097152 bytes, more than the 1048576 allowed"),
}


@pytest.mark.parametrize("verb", ["serve", "env check"])
@pytest.mark.parametrize("case", sorted(ENV_FILE_CASES))
def test_an_env_file_that_is_not_a_small_regular_file_is_refused_without_reading_it(tmp_path, verb, case):
    make, message = ENV_FILE_CASES[case]
    bad = make(tmp_path / "hostile.env")
    before = snapshot(tmp_path)
    args = ["serve", "--dry-run", "--skip-gid", "--env", str(bad)] if verb == "serve" else ["env", "check", str(bad)]
    assert_one_line(*twinspark(*args, cwd=tmp_path), 2, f"{bad}: {message}")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", sorted(ENV_FILE_CASES))
def test_the_pair_guard_refuses_the_same_env_files_before_looking_at_any_node(tmp_path, case):
    make, message = ENV_FILE_CASES[case]
    bad = make(tmp_path / "hostile.env")
    before = snapshot(tmp_path)
    code, lines, stdout = twinspark("pair", "check", "--env", str(bad), "--worker", "127.0.0.1",
                                    "--state-file", str(tmp_path / "state.json"), cwd=tmp_path)
    assert code == 2 and stdout == "", lines
    assert len(lines) == 1 and f"{bad}: {message}" in lines[0], lines
    assert snapshot(tmp_path) == before


def test_a_refused_env_file_among_good_ones_is_still_the_one_line(tmp_path):
    good = env_file(tmp_path)
    bad = _fifo(tmp_path / "hostile.env")
    assert_one_line(*twinspark("serve", "--skip-gid", "--dry-run", "--env", str(good), "--env", str(bad),
                               cwd=tmp_path), 2, f"{bad}: is a FIFO")


def test_a_nul_byte_in_a_value_names_the_variable_at_serve(tmp_path):
    path = env_file(tmp_path, "SERVED_MODEL_NAME=tiny\0evil\n")
    before = snapshot(tmp_path)
    # Not a dry run: this is where the NUL byte used to reach execve and end in a traceback.
    assert_one_line(*twinspark("serve", "--env", str(path), cwd=tmp_path), 2,
                    "SERVED_MODEL_NAME: contains a NUL byte")
    assert snapshot(tmp_path) == before


def test_a_nul_byte_in_the_profile_is_the_only_line(tmp_path):
    path = env_file(tmp_path, "TWINSPARK_PROFILE=cpu\0\n")
    assert_one_line(*twinspark("env", "check", str(path), cwd=tmp_path), 2, "TWINSPARK_PROFILE: contains a NUL byte")


def test_a_nul_byte_in_a_secret_names_the_variable_and_not_the_value(tmp_path):
    path = env_file(tmp_path, "VLLM_API_KEY=sk-visible\0rest\n")
    code, lines, stdout = twinspark("env", "check", str(path), cwd=tmp_path)
    assert_one_line(code, lines, stdout, 2, "VLLM_API_KEY: contains a NUL byte")
    assert "sk-visible" not in lines[0]


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONPATH", "FOO"])
def test_a_variable_the_registry_does_not_know_is_refused_by_name(tmp_path, name):
    path = env_file(tmp_path, f"{name}=/tmp/evil.so\n")
    before = snapshot(tmp_path)
    assert_one_line(*twinspark("serve", "--dry-run", "--skip-gid", "--env", str(path), cwd=tmp_path), 2,
                    f"{name}: is not a TwinSpark setting", "ENV_PASSTHROUGH")
    assert snapshot(tmp_path) == before


def test_a_variable_named_in_env_passthrough_reaches_vllm_and_others_still_do_not(tmp_path):
    path = env_file(tmp_path, "FOO=bar\nENV_PASSTHROUGH=FOO\n")
    code, lines, stdout = twinspark("serve", "--dry-run", "--skip-gid", "--env", str(path), cwd=tmp_path)
    assert (code, lines) == (0, [])
    assert "FOO=bar" in stdout.splitlines()
    assert "ENV_PASSTHROUGH" in stdout.splitlines()[-2]  # the knob itself is unset, never handed to vLLM

    path = env_file(tmp_path, "FOO=bar\nLD_PRELOAD=/tmp/evil.so\nENV_PASSTHROUGH=FOO\n")
    assert_one_line(*twinspark("serve", "--dry-run", "--skip-gid", "--env", str(path), cwd=tmp_path), 2,
                    "LD_PRELOAD: is not a TwinSpark setting")


def test_env_passthrough_refuses_a_knob_and_a_malformed_name(tmp_path):
    code, lines, _ = twinspark("env", "check", str(env_file(tmp_path, "ENV_PASSTHROUGH=MAX_NUM_SEQS\n")),
                               cwd=tmp_path)
    assert code == 2 and lines[0].startswith("ENV_PASSTHROUGH: MAX_NUM_SEQS is a TwinSpark setting"), lines
    code, lines, _ = twinspark("env", "check", str(env_file(tmp_path, "ENV_PASSTHROUGH=A-B\n")), cwd=tmp_path)
    assert code == 2 and lines[0].startswith("ENV_PASSTHROUGH: 'A-B' is not a variable name"), lines


# ----------------------------------------------------------------------------------------------------------------
# sysfs


@pytest.mark.parametrize("case", ["link to /dev/zero", "fifo"])
def test_a_gid_attribute_that_is_not_a_regular_file_fails_fast_with_one_line(tmp_path, case):
    root = fake_sysfs.build(tmp_path, fake_sysfs.gb10_devices())
    gid0 = (root / "rocep1s0f1").resolve() / "ports" / "1" / "gids" / "0"
    gid0.unlink()
    _dev_zero(gid0) if case == "link to /dev/zero" else _fifo(gid0)
    kind = "a character device" if case == "link to /dev/zero" else "a FIFO"
    before = snapshot(tmp_path)
    code, lines, stdout = twinspark("fabric", "resolve-gid", "--hca", "=rocep1s0f1", "--match-ip", "10.77.0.1",
                                    "--sysfs-root", str(root), cwd=tmp_path)
    assert_one_line(code, lines, stdout, 2, "twinspark fabric resolve-gid: ", f"/ports/1/gids/0: is {kind}")
    code, lines, stdout = twinspark("fabric", "show", "--sysfs-root", str(root), cwd=tmp_path)
    assert_one_line(code, lines, stdout, 2, "twinspark fabric show: ", f"/ports/1/gids/0: is {kind}")
    assert snapshot(tmp_path) == before


def test_a_missing_sysfs_root_names_the_directory(tmp_path):
    missing = tmp_path / "no" / "infiniband"
    assert_one_line(*twinspark("fabric", "resolve-gid", "--hca", "=rocep1s0f1", "--sysfs-root", str(missing),
                               cwd=tmp_path), 2, f"twinspark fabric resolve-gid: {missing}: does not exist")
    path = env_file(tmp_path, profile="gb10")
    before = snapshot(tmp_path)
    assert_one_line(*twinspark("serve", "--dry-run", "--env", str(path), "--sysfs-root", str(missing),
                               cwd=tmp_path), 2,
                    f"NCCL_IB_GID_INDEX: could not be resolved on this node: {missing}: does not exist")
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------------------------------------------
# Patch targets


def _patch_args(site: Path, patches: Path) -> list[str]:
    return ["--site-packages", str(site), "--patches-dir", str(patches)]


@pytest.mark.parametrize("action", ["apply", "status", "revert"])
@pytest.mark.parametrize("case", ["fifo", "directory"])
def test_a_patch_target_that_cannot_be_read_is_named_without_a_traceback(tmp_path, action, case):
    site, patches = _two_file_target(tmp_path)
    target = site / "vllm/b.py"
    target.unlink()
    _fifo(target) if case == "fifo" else target.mkdir()
    message = "is a FIFO, not a regular file" if case == "fifo" else "cannot read (Is a directory)"
    before = snapshot(site)
    assert_one_line(*twinspark("patch", action, *_patch_args(site, patches), cwd=tmp_path), 2,
                    f"twinspark patch {action}: {target}: {message}", "nothing was written")
    assert snapshot(site) == before


def test_a_patch_target_without_read_permission_is_named_without_a_traceback():
    if shutil.which("setpriv") is None and os.geteuid() == 0:
        pytest.skip("root reads every file; dropping to another account needs setpriv (util-linux)")
    # Root reads any file, so as root the command runs as nobody, on a tree outside root's private temp dir.
    with tempfile.TemporaryDirectory(prefix="twinspark-hostile-") as name:
        work = Path(name)
        work.chmod(0o755)
        site, patches = _two_file_target(work)
        for path in [work, *work.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        target = site / "vllm/b.py"
        target.chmod(0)
        before = snapshot(site)
        user = "65534" if os.geteuid() == 0 else None
        assert_one_line(*twinspark("patch", "apply", *_patch_args(site, patches), cwd=work, user=user), 2,
                        f"twinspark patch apply: {target}: cannot open (Permission denied)", "nothing was written")
        assert snapshot(site) == before
