#!/usr/bin/python
"""Read, in one module call, the state a role's tasks would converge: paths (never followed), packages, systemd
units, accounts. The role then runs each task only where the answer does not prove it converged (the rules:
python_tools/twinspark/converged.py, through filter_plugins/twinspark_converged.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: twinspark_probe
short_description: Read paths, packages, systemd units and accounts in one call, changing nothing
description:
  - Answers what several C(file), C(copy), C(template), C(package), C(systemd_service), C(user) and C(group) tasks
    would look at, so that a converged re-run skips them instead of paying one round trip each.
  - Paths are read with lstat (a link is reported as a link, never followed); a regular file's sha1 is read when it is
    not larger than I(checksum_limit).
options:
  paths:
    description: Paths to lstat that the role converges (mode, owner, content or link target set by one of its tasks).
    type: list
    elements: str
    default: []
  reads:
    description: Paths to lstat that the role only reads (a venv's python, a pointer another role switches), reported
      in the same C(paths) result; kept apart so that whoever lists what a role manages (make sim-drift) never takes
      them for its own.
    type: list
    elements: str
    default: []
  dirs:
    description: Directories whose entries (not recursively, links not followed) are read as if listed in I(paths);
      a directory that cannot be listed adds nothing.
    type: list
    elements: str
    default: []
  packages:
    description: Debian package names; each is reported with its installed version, or an empty string.
    type: list
    elements: str
    default: []
  units:
    description: systemd unit names; each is reported with its LoadState, ActiveState and UnitFileState.
    type: list
    elements: str
    default: []
  users:
    description: Account names looked up in the passwd database.
    type: list
    elements: str
    default: []
  groups:
    description: Group names looked up in the group database.
    type: list
    elements: str
    default: []
  contents:
    description: Paths whose text is returned in C(contents) when each is a regular file (never a link) within
      I(checksum_limit) that reads as UTF-8 (public keys, authorized_keys); also read as if listed in I(paths).
    type: list
    elements: str
    default: []
  home_paths:
    description: Paths relative to the home of each account in I(users) that exists (for example
      C(.ssh/authorized_keys)), read as if listed in I(paths) and I(contents).
    type: list
    elements: str
    default: []
  pythons:
    description: Python interpreters to run once each, reporting their version (X.Y) and machine (C(uname -m)): what
      a lock of the vllm_runtime role is chosen by.
    type: list
    elements: str
    default: []
  checksum_limit:
    description: Largest regular file, in bytes, whose sha1 (and, for I(contents), text) is read.
    type: int
    default: 1048576
author: TwinSpark
"""

RETURN = r"""
managed:
  description: The I(paths) argument as given (what the role converges; I(reads) and the entries of I(dirs) are not).
  type: list
  returned: always
paths:
  description: Per path (and per entry of I(dirs)), exists and, when it does, isreg, isdir, islnk, mode (four octal
    digits), uid, gid, pw_name, gr_name, size, resolves (whether it exists with links followed), lnk_target (links)
    and checksum (sha1 of a regular file within checksum_limit).
  type: dict
  returned: always
packages:
  description: Per package, the installed version, or an empty string when it is not installed.
  type: dict
  returned: always
units:
  description: Per unit, load, active and enabled (systemd's LoadState, ActiveState and UnitFileState).
  type: dict
  returned: always
users:
  description: Per account, exists and, when it does, uid, gid, home, shell, group (the primary group's name) and
    password_star (whether its shadow password field is exactly C(*), as C(user) with C(password="*") leaves it; the
    field itself is never returned).
  type: dict
  returned: always
groups:
  description: Per group, exists and, when it does, gid.
  type: dict
  returned: always
pythons:
  description: Per interpreter of I(pythons), version (X.Y) and machine, or error (one line) when it does not run.
  type: dict
  returned: always
contents:
  description: Per path of I(contents) and I(home_paths) that is a regular file within checksum_limit, its text.
  type: dict
  returned: always
"""

import grp
import hashlib
import os
import pwd
import stat
import subprocess

from ansible.module_utils.basic import AnsibleModule


def _name(lookup, number):
    try:
        return lookup(number)[0]
    except KeyError:
        return None


def read_path(path, checksum_limit):
    try:
        st = os.lstat(path)
    except OSError:
        return {"exists": False}
    entry = {"exists": True, "isreg": stat.S_ISREG(st.st_mode), "isdir": stat.S_ISDIR(st.st_mode),
             "islnk": stat.S_ISLNK(st.st_mode), "mode": f"{stat.S_IMODE(st.st_mode):04o}", "uid": st.st_uid,
             "gid": st.st_gid, "pw_name": _name(pwd.getpwuid, st.st_uid), "gr_name": _name(grp.getgrgid, st.st_gid),
             "size": st.st_size, "resolves": os.path.exists(path)}
    if entry["islnk"]:
        entry["lnk_target"] = os.readlink(path)
    elif entry["isreg"] and st.st_size <= checksum_limit:
        digest = hashlib.sha1()  # the checksum copy and template compare
        try:
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(65536), b""):
                    digest.update(block)
            entry["checksum"] = digest.hexdigest()
        except OSError:
            pass
    return entry


def read_text(path, checksum_limit):
    """A regular file's text (links are never followed), or None when it is not one or cannot be read as UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > checksum_limit:
            return None
        with os.fdopen(fd, "rb") as handle:
            fd = None
            return handle.read(checksum_limit + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        if fd is not None:
            os.close(fd)


def read_shadow_stars(names):
    """The accounts among names whose shadow password field is exactly '*' (the field itself is never kept)."""
    stars = set()
    try:
        with open("/etc/shadow", encoding="utf-8") as handle:
            for line in handle:
                fields = line.rstrip("\n").split(":")
                if len(fields) > 1 and fields[0] in names and fields[1] == "*":
                    stars.add(fields[0])
    except (OSError, UnicodeDecodeError):
        pass
    return stars


def read_packages(names):
    """Installed versions from one dpkg-query call ('' for a package that is not installed)."""
    found = dict.fromkeys(names, "")
    if not names:
        return found
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${binary:Package}\t${db:Status-Abbrev}\t${Version}\n",
                              *names], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return found
    for line in out.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[1].startswith("ii"):
            name = fields[0].split(":")[0]
            if name in found:
                found[name] = fields[2]
    return found


def read_units(names):
    found = {name: {"load": "", "active": "", "enabled": ""} for name in names}
    if not names:
        return found
    try:
        out = subprocess.run(["systemctl", "show", "--property=Id,LoadState,ActiveState,UnitFileState", "--", *names],
                             capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return found
    # systemctl show prints one block per unit, in the order asked, separated by an empty line.
    blocks = [block for block in out.strip("\n").split("\n\n")]
    for name, block in zip(names, blocks):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        found[name] = {"load": props.get("LoadState", ""), "active": props.get("ActiveState", ""),
                       "enabled": props.get("UnitFileState", "")}
    return found


def read_users(names):
    found = {}
    stars = read_shadow_stars(set(names)) if names else set()
    for name in names:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            found[name] = {"exists": False}
            continue
        found[name] = {"exists": True, "uid": entry.pw_uid, "gid": entry.pw_gid, "home": entry.pw_dir,
                       "shell": entry.pw_shell, "group": _name(grp.getgrgid, entry.pw_gid),
                       "password_star": name in stars}
    return found


def read_groups(names):
    found = {}
    for name in names:
        try:
            found[name] = {"exists": True, "gid": grp.getgrnam(name).gr_gid}
        except KeyError:
            found[name] = {"exists": False}
    return found


READ_PYTHON = "import platform, sys; print('%d.%d' % sys.version_info[:2], platform.machine())"


def read_pythons(paths):
    found = {}
    for path in paths:
        try:
            done = subprocess.run([path, "-I", "-c", READ_PYTHON], capture_output=True, text=True, timeout=60,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            found[path] = {"error": str(error)}
            continue
        words = done.stdout.split()
        if done.returncode != 0 or len(words) != 2:
            found[path] = {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
        else:
            found[path] = {"version": words[0], "machine": words[1]}
    return found


def main():
    module = AnsibleModule(
        argument_spec={"paths": {"type": "list", "elements": "str", "default": []},
                       "reads": {"type": "list", "elements": "str", "default": []},
                       "dirs": {"type": "list", "elements": "str", "default": []},
                       "packages": {"type": "list", "elements": "str", "default": []},
                       "units": {"type": "list", "elements": "str", "default": []},
                       "users": {"type": "list", "elements": "str", "default": []},
                       "groups": {"type": "list", "elements": "str", "default": []},
                       "contents": {"type": "list", "elements": "str", "default": []},
                       "home_paths": {"type": "list", "elements": "str", "default": []},
                       "pythons": {"type": "list", "elements": "str", "default": []},
                       "checksum_limit": {"type": "int", "default": 1048576}},
        supports_check_mode=True)
    params = module.params
    paths = {path: read_path(path, params["checksum_limit"]) for path in params["paths"] + params["reads"]}
    for directory in params["dirs"]:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            paths.setdefault(path, read_path(path, params["checksum_limit"]))
    users = read_users(params["users"])
    text_paths = list(params["contents"])
    for name in params["users"]:
        if users[name].get("exists"):
            text_paths += [os.path.join(users[name]["home"], rel) for rel in params["home_paths"]]
    contents = {}
    for path in text_paths:
        paths.setdefault(path, read_path(path, params["checksum_limit"]))
        text = read_text(path, params["checksum_limit"])
        if text is not None:
            contents[path] = text
    module.exit_json(changed=False, paths=paths, managed=list(params["paths"]), contents=contents,
                     packages=read_packages(params["packages"]), units=read_units(params["units"]),
                     users=users, groups=read_groups(params["groups"]),
                     pythons=read_pythons(params["pythons"]))


if __name__ == "__main__":
    main()
