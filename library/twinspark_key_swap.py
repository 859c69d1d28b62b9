#!/usr/bin/python
"""Put a rotated SSH key in place: `<key>.next` becomes `<key>`, its public half `<key>.pub`, while the pair's
lifecycle lock is held (role key_rotation, roles/key_rotation/README.md)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: twinspark_key_swap
short_description: Replace an SSH key by the one generated beside it, with the pair's lifecycle lock held
description:
  - ssh reads a key's C(.pub) when it starts and the private key only once the server has accepted that public key;
    a connection that straddles a swap of either file fails ("private key contents do not match public"). So the
    swap holds the pair's lifecycle lock, which every guard run and every start, stop and restart holds for its
    whole run (the guard never waits for it: a run that finds it taken does nothing and the next run looks again).
  - The files change in an order where every moment leaves a matching pair for ssh, so a process killed at any
    point leaves a key that works (a rerun of the rotation finishes the job); C(<key>.pub) removed, C(<key>.next)
    renamed over C(<key>) (ssh then reads the public half from the private key), C(<key>.pub) written atomically
    from that key, C(<key>.next.pub) removed.
  - Refuses (changing nothing) a next key that is a link, not a regular file, not owned by the caller, or readable
    or writable by its group or others.
options:
  key:
    description: The private key the tools use; the new one is C(<key>.next) beside it.
    type: path
    required: true
  lock_file:
    description: The pair's lifecycle lock (twinspark_layout_pair_lock), never followed as a link.
    type: path
    required: true
  lock_timeout:
    description: Seconds to wait for the lock before failing (an ordered restart holds it for minutes).
    type: float
    default: 300
"""

RETURN = r"""
public_key:
  description: The public half of the key in place afterwards (C(<key>.pub)).
  type: str
  returned: always
"""

import errno
import fcntl
import json
import os
import stat
import subprocess
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

WHAT = "key rotation: swapping the SSH key"
MAX_HOLDER_BYTES = 4096


class SwapError(Exception):
    """The swap cannot be done; the message names the path and the fix. Nothing was changed."""


def next_key_problem(path, caller_uid):
    """Why the next key may not be put in place (a link, not a file, not the caller's, open to others), or None."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        return f"{path} is not a regular file (a link or something else); remove it and rerun the rotation"
    if info.st_uid != caller_uid:
        return f"{path} is owned by uid {info.st_uid}, not uid {caller_uid}; remove it and rerun the rotation"
    if info.st_mode & 0o077:
        return (f"{path} has mode {info.st_mode & 0o777:04o}: its group or others could have read it; remove it and "
                f"rerun the rotation (ssh refuses such a key too)")
    return None


def public_half(path):
    """The public key line (`type blob comment`) ssh-keygen derives from a private key; SwapError when it cannot."""
    done = subprocess.run(["ssh-keygen", "-y", "-f", path], capture_output=True, text=True, check=False, timeout=30,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not done.stdout.startswith("ssh-"):
        raise SwapError(f"{path} is not a private key ssh-keygen can read: remove it and rerun the rotation")
    return done.stdout.strip() + "\n"


def write_atomic(path, text, mode):
    """Replace `path` by `text` (a temporary file in its directory, fsynced, renamed over it, directory fsynced)."""
    directory = os.path.dirname(path) or "."
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".twinspark-tmp")
    try:
        os.fchmod(fd, mode)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.rename(temp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        os.unlink(temp)
        raise
    fsync_dir(directory)


def fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_if_there(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def hold_lock(path, timeout_s, clock=time.monotonic, sleep=time.sleep):
    """The lifecycle lock's descriptor, locked (as twinspark.pair.lifecycle takes it: flock, holder written in)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        hint = "is a link; remove it" if exc.errno == errno.ELOOP else "run site.yml first, and as root"
        raise SwapError(f"cannot open the pair's lifecycle lock {path} ({exc.strerror}): {hint}") from exc
    started = clock()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if clock() - started >= timeout_s:
                holder = os.pread(fd, MAX_HOLDER_BYTES, 0).decode("utf-8", "replace").strip() or "someone"
                os.close(fd)
                raise SwapError(f"the pair's lifecycle lock {path} is still held after {timeout_s:.0f} s by {holder} "
                                "(a start, stop or restart); rerun the rotation once it has ended (the key in place "
                                "still works, and the new one is authorized beside it)") from None
            sleep(0.2)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"what": WHAT, "pid": os.getpid(), "since": time.time()}).encode(), 0)
    return fd


def release_lock(fd):
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


def swap(key, lock_file, lock_timeout_s, check_mode=False):
    """(changed, public key in place). Without `<key>.next` there is nothing to swap: the key in place stays, and a
    missing `<key>.pub` is written from it."""
    nxt = key + ".next"
    problem = next_key_problem(nxt, os.geteuid())
    if problem:
        raise SwapError(problem)
    if not os.path.lexists(nxt):
        current = public_half(key)
        try:
            with open(key + ".pub", encoding="utf-8") as handle:
                in_place = handle.read()
        except FileNotFoundError:
            in_place = None
        if in_place == current:
            return False, current
        if not check_mode:
            write_atomic(key + ".pub", current, 0o644)
        return True, current
    new = public_half(nxt)
    if check_mode:
        return True, new
    fd = hold_lock(lock_file, lock_timeout_s)
    try:
        # Each step leaves a matching pair: no .pub makes ssh take the public half from the private key itself.
        unlink_if_there(key + ".pub")
        os.rename(nxt, key)
        fsync_dir(os.path.dirname(key) or ".")
        write_atomic(key + ".pub", new, 0o644)
        unlink_if_there(nxt + ".pub")
    finally:
        release_lock(fd)
    return True, new


def main():
    module = AnsibleModule(
        argument_spec={"key": {"type": "path", "required": True},
                       "lock_file": {"type": "path", "required": True},
                       "lock_timeout": {"type": "float", "default": 300}},
        supports_check_mode=True)
    try:
        changed, public_key = swap(module.params["key"], module.params["lock_file"], module.params["lock_timeout"],
                                   module.check_mode)
    except (SwapError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=changed, public_key=public_key)


if __name__ == "__main__":
    main()
