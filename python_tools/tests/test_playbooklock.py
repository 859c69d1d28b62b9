"""The bench scripts' hold on the pair's playbook lock (devtools.playbooklock): taken when free, refused in one
line when another process holds it for the whole wait or when it cannot be opened."""

from __future__ import annotations

import subprocess

import pytest

from devtools import playbooklock


def test_a_free_lock_is_taken_and_released_with_its_handle(tmp_path):
    path = str(tmp_path / "pair.lock")
    handle = playbooklock.hold(path, wait_s=0)
    handle.close()
    playbooklock.hold(path, wait_s=0).close()  # free again


def test_a_lock_another_process_holds_is_refused_after_the_wait(tmp_path):
    path = str(tmp_path / "pair.lock")
    holder = subprocess.Popen(["flock", path, "sleep", "30"])
    try:
        for _ in range(50):  # until flock(1) holds it
            try:
                playbooklock.hold(path, wait_s=0).close()
            except playbooklock.LockError:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        slept, ticks = [], iter(range(100))
        with pytest.raises(playbooklock.LockError) as refused:
            playbooklock.hold(path, wait_s=3, clock=lambda: float(next(ticks)), sleep=slept.append)
        assert str(refused.value) == f"{path} is held (a playbook is running against the pair) after 3 s; try " \
            "again when it ends"
        assert slept == [1, 1, 1], "it polled once a second until the wait was over"
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_that_cannot_be_opened_is_named(tmp_path):
    with pytest.raises(playbooklock.LockError, match=r"^cannot open the pair's playbook lock .*/no/such/dir/x"):
        playbooklock.hold(str(tmp_path / "no" / "such" / "dir" / "x"), wait_s=0)

