"""Reading a file that someone else may have planted: regular files only, never more than a bound.

A path handed to TwinSpark (an env file, a sysfs attribute, a patch target) may turn out to be a FIFO, a device
such as /dev/zero or a link to one, or a file far larger than anything legitimate. A plain `read_bytes()` then
blocks forever or reads until memory runs out. `read_bounded` opens without blocking, looks at what it opened
(fstat, so the answer is about the very file it reads, not a name that could be swapped) and reads at most `limit`
bytes; anything else ends in `RefusedFile`, whose message is one line naming the path.
"""

from __future__ import annotations

import os
import stat

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class RefusedFile(Exception):
    """The file exists but is not something to read: not a regular file, too large, or unreadable."""


class UnreadableFile(RefusedFile):
    """Opening or reading failed (permissions, I/O error, a sysfs attribute the kernel will not show)."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "not a regular file"


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them.

    Raises FileNotFoundError when nothing is there (callers decide whether that is fine) and RefusedFile, with a
    one-line message that starts with the path, for a FIFO, device or socket or a file over `limit` bytes; its
    subclass UnreadableFile for a directory and any other error of opening or reading.
    """
    shown = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnreadableFile(f"{shown}: cannot open ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):  # harmless (no read blocks on it), and what read() would say
            raise UnreadableFile(f"{shown}: cannot read (Is a directory)")
        if not stat.S_ISREG(info.st_mode):
            raise RefusedFile(f"{shown}: is {kind_of(info.st_mode)}, not a regular file; refusing to read it")
        if info.st_size > limit:
            raise RefusedFile(f"{shown}: is {info.st_size} bytes, more than the {limit} allowed; refusing to read it")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # it grew while being read, or reports a size it does not have
            raise RefusedFile(f"{shown}: holds more than the {limit} bytes allowed; refusing to read it")
        return b"".join(chunks)
    except OSError as exc:  # RefusedFile is no OSError: it passes through
        raise UnreadableFile(f"{shown}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
