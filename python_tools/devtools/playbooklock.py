"""The lock every playbook run against the simulated pair holds (`flock /var/tmp/twinspark-sim.lock`), for the bench
scripts that must not overlap a playbook run: `scripts/bench/yardstick` and `scripts/bench/rerun-profile`."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable
from typing import IO

PATH = "/var/tmp/twinspark-sim.lock"


class LockError(Exception):
    """The lock could not be opened, or another run held it for the whole wait; the message says which."""


def hold(path: str = PATH, wait_s: float = 600, clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> IO[str]:
    """Take the lock, waiting at most `wait_s` seconds; the open handle holds it until it is closed or the process
    ends."""
    try:
        handle = open(path, "a")  # noqa: SIM115 - held by the caller
    except OSError as exc:
        raise LockError(f"cannot open the pair's playbook lock {path}: {exc.strerror}") from None
    deadline = clock() + wait_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if clock() > deadline:
                handle.close()
                raise LockError(f"{path} is held (a playbook is running against the pair) after {wait_s:g} s; "
                                "try again when it ends") from None
            sleep(1)
