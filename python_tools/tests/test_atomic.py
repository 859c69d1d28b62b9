"""twinspark.atomic: the one way TwinSpark replaces a file. Each test fails when its step is removed."""

from __future__ import annotations

import os

import pytest

from twinspark import atomic


def _names(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_new_file_has_its_mode_whatever_the_umask(tmp_path):
    target = tmp_path / "state.json"
    old = os.umask(0o077)
    try:
        atomic.write_atomic(target, b"{}\n", mode=0o644)
    finally:
        os.umask(old)
    assert target.read_bytes() == b"{}\n"
    assert target.stat().st_mode & 0o7777 == 0o644
    assert _names(tmp_path) == ["state.json"]


def test_replacing_keeps_no_temp_file_and_fsyncs_the_directory(tmp_path, monkeypatch):
    target = tmp_path / "serve.env"
    target.write_bytes(b"OLD=1\n")
    synced = []
    real = atomic.fsync_dir
    monkeypatch.setattr(atomic, "fsync_dir", lambda d: (synced.append(str(d)), real(d)))
    atomic.write_atomic(target, b"NEW=2\n" * 50000)  # larger than one write() may take
    assert target.read_bytes() == b"NEW=2\n" * 50000
    assert synced == [str(tmp_path)]
    assert _names(tmp_path) == ["serve.env"]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failure_before_the_rename_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch, failing):
    target = tmp_path / "secrets.env"
    target.write_bytes(b"OLD=1\n")

    def broken(*_args, **_kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, failing, broken)
    with pytest.raises(OSError, match="Input/output error"):
        atomic.write_atomic(target, b"NEW=2\n")
    monkeypatch.undo()
    assert target.read_bytes() == b"OLD=1\n"
    assert _names(tmp_path) == ["secrets.env"]


def test_owner_is_given_only_when_it_differs(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "fchown", lambda fd, uid, gid: calls.append((uid, gid)))
    atomic.write_atomic(tmp_path / "a", b"x", owner=(os.geteuid(), os.getegid()))
    assert calls == []
    atomic.write_atomic(tmp_path / "b", b"x", owner=(os.geteuid() + 1, os.getegid()))
    assert calls == [(os.geteuid() + 1, os.getegid())]
