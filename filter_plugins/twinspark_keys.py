"""Ansible filters for rotating the SSH keys the head uses on the worker (role key_rotation): which authorized_keys
line is whose key, the line that authorizes a new key exactly as the old one is, and the lines to drop afterwards.

A line is identified by its key material (type and base64 blob), never by its comment alone: during a rotation the
old and the new key share the comment that site.yml's lineinfile recognises (both kinds' regexps match it), and only
the material tells them apart. Pure functions over text; they live here rather than in the twinspark package because
that package is part of the runtime's identity on the nodes (a change to it is a new runtime there).
"""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

KEY_TYPES = re.compile(r"(?:^|\s)((?:ssh|ecdsa|sk)-[A-Za-z0-9@.-]+) ([A-Za-z0-9+/]+=*)(?=\s|$)")


def key_material(text):
    """`type blob` of the first key in `text` (a .pub file, `ssh-keygen -y` output, an authorized_keys line)."""
    found = KEY_TYPES.search(text or "")
    if not found:
        raise AnsibleFilterError("no SSH public key (type and base64 blob) in the text given; expected a line such "
                                 "as `ssh-ed25519 AAAA... comment`")
    return f"{found.group(1)} {found.group(2)}"


def _holds(line, material):
    found = KEY_TYPES.search(line)
    return bool(found) and f"{found.group(1)} {found.group(2)}" == material


def twinspark_key_material(text):
    """The key's type and blob, without its comment."""
    return key_material(text)


def twinspark_key_id(text):
    """A short name for a key in messages: its type and the end of its blob (public, and enough to tell two apart)."""
    kind, blob = key_material(text).split()
    return f"{kind} ...{blob[-12:]}"


def twinspark_key_lines(authorized_text, marker):
    """The authorized_keys lines that `marker` (the regexp site.yml's lineinfile uses) matches, in file order."""
    pattern = re.compile(marker)
    return [line for line in (authorized_text or "").splitlines() if pattern.search(line)]


def twinspark_authorized_line_for(authorized_text, marker, current_pub, new_pub):
    """The line that authorizes `new_pub` with the options of the line that authorizes `current_pub` (the forced
    command, from=, restrict): that line with the old key and comment replaced by the new public key line, which is
    how site.yml renders it from the head's .pub once the new key is in place."""
    current = key_material(current_pub)
    key_material(new_pub)
    for line in twinspark_key_lines(authorized_text, marker):
        found = KEY_TYPES.search(line)
        if found and f"{found.group(1)} {found.group(2)}" == current:
            options = line[:found.start(1)].rstrip()
            return f"{options} {new_pub.strip()}" if options else new_pub.strip()
    raise AnsibleFilterError(f"no authorized_keys line matching {marker!r} holds the key in place ({current[:40]}...): "
                             "the worker does not accept it now; run site.yml first (it authorizes the key in place)")


def twinspark_other_keys_regexp(marker, keep_pub):
    """A regexp for `lineinfile: state=absent` that matches every line `marker` matches except those holding the
    key `keep_pub`."""
    kind, blob = key_material(keep_pub).split()
    marker_body = marker[1:] if marker.startswith("^") else ".*" + marker
    return rf"^(?!.*(?:^|\s){re.escape(kind)} {re.escape(blob)}(?:\s|$)){marker_body}"


def twinspark_line_holds(line, pub):
    """True when the authorized_keys `line` holds the key of `pub`."""
    return _holds(line, key_material(pub))


def twinspark_option(argv, name):
    """The value argparse would take for option `name` in `argv` (the last one; `--name VALUE` or `--name=VALUE`),
    e.g. --ssh-key in the head's recorded pair arguments; None when it is not there."""
    value = None
    words = list(argv or [])
    for index, word in enumerate(words):
        if word == name and index + 1 < len(words):
            value = words[index + 1]
        elif word.startswith(name + "="):
            value = word[len(name) + 1:]
    return value


class FilterModule:
    def filters(self):
        return {"twinspark_key_material": twinspark_key_material,
                "twinspark_key_id": twinspark_key_id,
                "twinspark_key_lines": twinspark_key_lines,
                "twinspark_authorized_line_for": twinspark_authorized_line_for,
                "twinspark_other_keys_regexp": twinspark_other_keys_regexp,
                "twinspark_line_holds": twinspark_line_holds,
                "twinspark_option": twinspark_option}
