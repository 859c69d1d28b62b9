#!/usr/bin/python
"""Basic auth for a Prometheus-toolkit web listener (Alertmanager's --web.config.file): a password generated on the
host and kept root-only, and the web configuration holding its bcrypt hash (role monitoring, docs/MONITORING.md)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: twinspark_web_auth
short_description: Keep a generated password root-only and its bcrypt hash in an exporter-toolkit web configuration
description:
  - The password is made here (32 random bytes, URL-safe base64) the first time, written root-only (0600) and never
    returned, shown or diffed; later runs keep it.
  - The web configuration (C(basic_auth_users) with one user) is rewritten only when its hash does not verify the
    password (a new password, a hand edit) or its text, owner, group or mode differ; otherwise it is kept, so a
    converged run changes nothing (bcrypt salts each hash: hashing every run would rewrite the file every run).
  - The hash is made with the C(bcrypt) module (Debian's and Ubuntu's python3-bcrypt), else with the standard
    library's C(crypt) (C($2b$), Python 3.12 and older).
  - Refuses a password file or web configuration that is a link or not a regular file. Supports check mode.
options:
  password_file:
    description: The root-only file that holds the password.
    type: path
    required: true
  web_config:
    description: The web configuration file the listener reads (C(--web.config.file)).
    type: path
    required: true
  username:
    description: The one user of C(basic_auth_users).
    type: str
    required: true
  group:
    description: The web configuration's group (the listener's account reads it); its owner is root, mode 0640.
    type: str
    required: true
  comment:
    description: The first line of the web configuration, without its C(#).
    type: str
    default: managed by TwinSpark
"""

RETURN = r"""
password_changed:
  description: A new password was made (whoever holds a copy of the old one must read it again).
  type: bool
  returned: always
web_config_changed:
  description: The web configuration was (or in check mode would be) written.
  type: bool
  returned: always
"""

import grp
import json
import os
import secrets
import stat
import tempfile
import warnings

from ansible.module_utils.basic import AnsibleModule

try:
    import bcrypt
except ImportError:  # the crypt fallback below
    bcrypt = None


def make_hash(password: str) -> str:
    """A bcrypt hash of `password` (Go's bcrypt, which exporter-toolkit uses, reads $2a$, $2b$ and $2y$)."""
    if bcrypt is not None:
        return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt
    made = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1024))
    if not made or not made.startswith("$2"):
        raise RuntimeError("no bcrypt here: install python3-bcrypt")
    return made


def hash_matches(hashed: str, password: str) -> bool:
    if not hashed.startswith("$2"):
        return False
    if bcrypt is not None:
        try:
            return bcrypt.checkpw(password.encode(), hashed.encode())
        except ValueError:
            return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt
    return secrets.compare_digest(crypt.crypt(password, hashed) or "", hashed)


def render(comment: str, username: str, hashed: str) -> str:
    """The web configuration's whole text (JSON strings are YAML strings)."""
    return f"# {comment}\nbasic_auth_users:\n  {json.dumps(username)}: {json.dumps(hashed)}\n"


def current_hash(text: str, username: str) -> str:
    """The hash the text of a web configuration we wrote gives `username` ('' when none)."""
    prefix = f"  {json.dumps(username)}: "
    for line in text.splitlines():
        if line.startswith(prefix):
            try:
                value = json.loads(line[len(prefix):])
            except ValueError:
                return ""
            return value if isinstance(value, str) else ""
    return ""


def read_regular(path: str) -> tuple[str | None, os.stat_result | None]:
    """(text, stat) of a regular file; (None, None) when absent. Raises ValueError for a link or anything else."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None, None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{path} is not a regular file (a link or something else): remove it and run again")
    with open(path, encoding="utf-8") as handle:
        return handle.read(), info


def write_atomic(path: str, text: str, uid: int, gid: int, mode: int) -> None:
    directory = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".twinspark-web-auth.")
    try:
        os.fchmod(handle, 0o600)
        os.fchown(handle, uid, gid)
        os.write(handle, text.encode())
        os.fsync(handle)
        os.fchmod(handle, mode)
        os.close(handle)
        handle = -1
        os.rename(temporary, path)
    finally:
        if handle >= 0:
            os.close(handle)
        if os.path.lexists(temporary):
            os.unlink(temporary)


def ensure(password_file: str, web_config: str, username: str, group: str, comment: str,
           check: bool) -> dict[str, bool]:
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        if not check:
            raise ValueError(f"no group {group} here (its package makes it): install it first") from None
        # --check on a fresh host, before the package that makes the group: everything would be written.
        return {"password_changed": not os.path.exists(password_file), "web_config_changed": True, "changed": True}
    uid = os.geteuid()
    password, info = read_regular(password_file)
    password = (password or "").strip()
    password_changed = not password
    owner_fixed = False
    if password_changed:
        password = secrets.token_urlsafe(32)
    elif info is not None and (stat.S_IMODE(info.st_mode) != 0o600 or info.st_uid != uid or info.st_gid != 0):
        owner_fixed = True
        if not check:
            os.chown(password_file, uid, 0)
            os.chmod(password_file, 0o600)
    text, web = read_regular(web_config)
    hashed = current_hash(text or "", username)
    keep = (not password_changed and text is not None and hash_matches(hashed, password)
            and text == render(comment, username, hashed))
    web_changed = not keep or (web is not None and (stat.S_IMODE(web.st_mode) != 0o640 or web.st_uid != uid
                                                    or web.st_gid != gid))
    changed = password_changed or owner_fixed or web_changed
    if check:
        return {"password_changed": password_changed, "web_config_changed": web_changed, "changed": changed}
    if password_changed:
        write_atomic(password_file, password + "\n", uid, 0, 0o600)
    if not keep:
        write_atomic(web_config, render(comment, username, make_hash(password)), uid, gid, 0o640)
    elif web_changed:
        os.chown(web_config, uid, gid)
        os.chmod(web_config, 0o640)
    return {"password_changed": password_changed, "web_config_changed": web_changed, "changed": changed}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "password_file": {"type": "path", "required": True, "no_log": False},  # a path, not the password
            "web_config": {"type": "path", "required": True},
            "username": {"type": "str", "required": True},
            "group": {"type": "str", "required": True},
            "comment": {"type": "str", "default": "managed by TwinSpark"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = ensure(params["password_file"], params["web_config"], params["username"], params["group"],
                        params["comment"], module.check_mode)
    except (ValueError, OSError, KeyError, RuntimeError) as error:
        module.fail_json(msg=f"basic auth for {params['web_config']}: {error}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
