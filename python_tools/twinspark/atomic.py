"""Replacing a file so that a reader, or a crash, sees the old file or the new one and never a part of either.

Every file TwinSpark writes on a node (env files, the pinned model ref and manifest, the pair guard's state, the
files the patch engine changes in site-packages) goes through `write_atomic`: a temporary file in the target's own
directory (same filesystem, so the rename is atomic) that has its final mode (and owner, when asked) before the
first byte, is fsynced, renamed over the target, and then the directory is fsynced so the rename itself survives
a power loss. Any failure before the rename removes the temporary file and leaves the old target as it was.

Callers add their own steps around it (the patch engine reads every file back and compares).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

TEMP_SUFFIX = ".twinspark-tmp"  # what a temporary file left by a killed process is called: `.<name>.<random>` + this


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600,
                 owner: tuple[int, int] | None = None) -> None:
    """Replace `path` by `data`, atomically and durably.

    `mode` is the new file's permission bits (applied with fchmod, so the umask does not narrow them); `owner` a
    (uid, gid) pair to give it, or None to keep whoever runs this. Raises OSError as the failing call raised it.
    """
    target = Path(path)
    fd, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
    try:
        try:
            os.fchmod(fd, mode)
            if owner is not None and owner != (os.geteuid(), os.getegid()):
                os.fchown(fd, *owner)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    fsync_dir(target.parent)
