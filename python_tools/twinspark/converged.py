"""Converged-state rules: is a task's target already as the task would leave it? Plain functions over what one
`ansible.builtin.find` on the node returned, so a converged run skips per-file or per-item round trips.

Each rule answers conservatively: whenever it cannot be sure nothing would change (an entry it does not model, a
link, an unknown owner), it says "not converged" and the role runs its original task, which then decides and reports
exactly as before. A wrong "converged" would hide a change, so every rule only says so on an exact match.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path


def _by_path(found: Iterable[Mapping]) -> dict[str, Mapping]:
    """find's `files` keyed by normalised path."""
    return {os.path.normpath(str(entry.get("path", ""))): entry for entry in found or []}


def _mode_equal(found_mode: object, wanted: str) -> bool:
    try:
        return int(str(found_mode), 8) == int(str(wanted), 8)
    except ValueError:
        return False


def tree_copy_converged(source_dir: Path, dest_dir: str, found: Iterable[Mapping], owner: str, group: str,
                        mode: str) -> bool:
    """True when `copy: src=<source_dir>/ dest=<dest_dir>/ owner group mode` would change nothing on the node.

    `found`: find's files under dest_dir's parent or dest_dir (file_type any, hidden, get_checksum, sha1). The source
    must hold regular files only (a subdirectory or link: False, the copy decides); each must be on the node as a
    regular file (not a link) with the same sha1, `mode`, owner and group names. Extra files on the node do not
    count: the copy does not remove them either.
    """
    source = Path(source_dir)
    if not source.is_dir():
        return False
    entries = sorted(source.iterdir())
    if not entries or any(path.is_symlink() or not path.is_file() for path in entries):
        return False
    on_node = _by_path(found)
    for path in entries:
        entry = on_node.get(os.path.normpath(os.path.join(dest_dir, path.name)))
        if (entry is None or not entry.get("isreg") or entry.get("islnk")
                or entry.get("checksum") != hashlib.sha1(path.read_bytes()).hexdigest()  # noqa: S324 (copy's own)
                or not _mode_equal(entry.get("mode"), mode)
                or entry.get("pw_name") != owner or entry.get("gr_name") != group):
            return False
    return True


def _id_matches(spec: str, name: object, number: object) -> bool:
    """A task's owner/group (a name or a number as text) against find's name and number for the entry."""
    spec = str(spec)
    return spec == str(number) if spec.isdigit() else spec == name


def dirs_to_converge(names: Iterable[str], root: str, found: Iterable[Mapping] | None, owner: str, group: str,
                     mode: str) -> list[str]:
    """The names below `root` that `file: path=<root>/<name> state=directory owner group mode follow=false` would
    still change, in their order; every name when `found` is None (the find did not run).

    `found`: find's files directly in root (file_type any, hidden). Converged: a real directory (not a link) with
    exactly `mode`, owned by `owner` and `group` (a name, or a number as text).
    """
    names = list(names)
    if found is None:
        return names
    on_node = _by_path(found)
    waiting = []
    for name in names:
        entry = on_node.get(os.path.normpath(os.path.join(root, str(name))))
        if (entry is None or not entry.get("isdir") or entry.get("islnk") or not _mode_equal(entry.get("mode"), mode)
                or not _id_matches(owner, entry.get("pw_name"), entry.get("uid"))
                or not _id_matches(group, entry.get("gr_name"), entry.get("gid"))):
            waiting.append(name)
    return waiting


def entries_present(names: Iterable[str], root: str, found: Iterable[Mapping]) -> list[dict]:
    """The names that exist directly in `root` (links too, never followed), in their order, each as {item, path,
    isdir, islnk, uid}: what a `stat: path=<root>/<name> follow=false` loop says of the existing ones.

    `found`: find's files directly in root (file_type any, hidden). `path` is written as the stat loop would get it,
    `<root>/<name>`.
    """
    on_node = _by_path(found)
    present = []
    for name in names:
        path = f"{root}/{name}"
        entry = on_node.get(os.path.normpath(path))
        if entry is not None:
            present.append({"item": name, "path": path, "isdir": bool(entry.get("isdir")),
                            "islnk": bool(entry.get("islnk")), "uid": entry.get("uid")})
    return present


def stat_entries_present(results: Iterable[Mapping]) -> list[dict]:
    """The same shape from a `stat` loop's results (follow=false): the existing entries only."""
    return [{"item": result.get("item"), "path": result["stat"].get("path"), "isdir": bool(result["stat"].get("isdir")),
             "islnk": bool(result["stat"].get("islnk")), "uid": result["stat"].get("uid")}
            for result in results or [] if result.get("stat", {}).get("exists")]


def _roots(root: str | Iterable[str]) -> set[str]:
    return {os.path.normpath(r) for r in ([root] if isinstance(root, str) else root)}


def paths_to_remove(paths: Iterable[str], root: str | Iterable[str], found: Iterable[Mapping] | None) -> list[str]:
    """The paths a `file: state=absent` loop would still change, in their order: those directly in `root` (one
    directory or several) that the find listed (links included), and every path the find could not speak for
    (another directory, or no find).

    `found`: find's files directly in the root(s) (file_type any, hidden), None when the find did not run.
    """
    paths = list(paths)
    if found is None:
        return paths
    listed = set(_by_path(found))
    here = _roots(root)
    return [path for path in paths
            if os.path.dirname(os.path.normpath(path)) not in here or os.path.normpath(path) in listed]


def paths_outside(paths: Iterable[str], root: str | Iterable[str]) -> list[str]:
    """The paths not directly in `root` (one directory or several): those a find there cannot speak for."""
    here = _roots(root)
    return [path for path in paths if os.path.dirname(os.path.normpath(path)) not in here]


def unlinked_present(paths: Iterable[str], root: str | Iterable[str], found: Iterable[Mapping],
                     stat_results: Iterable[Mapping]) -> list[str]:
    """The paths that exist and are not links (never followed), in their order: from the find for those directly in
    `root`, from a `stat: follow=false` loop's results for the others (paths_outside)."""
    listed = _by_path(found)
    here = _roots(root)
    stats = {result.get("item"): result.get("stat") or {} for result in stat_results or []}
    present = []
    for path in paths:
        if os.path.dirname(os.path.normpath(path)) in here:
            entry = listed.get(os.path.normpath(path))
            if entry is not None and not entry.get("islnk"):
                present.append(path)
        elif stats.get(path, {}).get("exists") and not stats[path].get("islnk"):
            present.append(path)
    return present


# Rules over one `twinspark_probe` call (library/twinspark_probe.py): what a single file, copy, template, package,
# systemd_service, user or group task would change. Each takes the probe's registered result; a probe that did not
# run (skipped, failed, or check mode on a node that lacks it) proves nothing, so every rule then says "not converged".

def _probed(probe: Mapping | None, section: str, key: str) -> Mapping | None:
    if not probe or probe.get("skipped") or probe.get("failed"):
        return None
    found = probe.get(section)
    if not isinstance(found, Mapping):
        return None
    entry = found.get(key)
    return entry if isinstance(entry, Mapping) else None


def _owned(entry: Mapping, mode: str | None, owner: str | None, group: str | None) -> bool:
    return ((mode is None or _mode_equal(entry.get("mode"), mode))
            and (owner is None or _id_matches(owner, entry.get("pw_name"), entry.get("uid")))
            and (group is None or _id_matches(group, entry.get("gr_name"), entry.get("gid"))))


def probe_file_converged(probe: Mapping | None, path: str, sha1: str | None = None, mode: str | None = None,
                         owner: str | None = None, group: str | None = None) -> bool:
    """True when a copy or template of content with this sha1 (None: a `file: state=file` task, content not
    compared) to `path`, with these mode, owner and group (None: not set by the task), would change nothing: a
    regular file, not a link, whose checksum the probe read."""
    entry = _probed(probe, "paths", path)
    if entry is None or not entry.get("exists") or not entry.get("isreg") or entry.get("islnk"):
        return False
    if sha1 is not None and entry.get("checksum") != sha1:
        return False
    return _owned(entry, mode, owner, group)


def probe_dir_converged(probe: Mapping | None, path: str, mode: str | None = None, owner: str | None = None,
                        group: str | None = None) -> bool:
    """True when `file: state=directory` on `path` would change nothing: a real directory (a link never counts)."""
    entry = _probed(probe, "paths", path)
    if entry is None or not entry.get("exists") or not entry.get("isdir") or entry.get("islnk"):
        return False
    return _owned(entry, mode, owner, group)


def probe_link_converged(probe: Mapping | None, path: str, target: str, owner: str | None = None,
                         group: str | None = None) -> bool:
    """True when `file: state=link src=<target>` (owner and group of the link itself) on `path` would change nothing:
    a link pointing at exactly target."""
    entry = _probed(probe, "paths", path)
    return bool(entry and entry.get("exists") and entry.get("islnk") and entry.get("lnk_target") == target
                and _owned(entry, None, owner, group))


def probe_resolves(probe: Mapping | None, path: str) -> bool:
    """True when `path` exists with links followed (what a command's `creates:` looks at)."""
    entry = _probed(probe, "paths", path)
    return bool(entry and entry.get("exists") and entry.get("resolves"))


def probe_executable(probe: Mapping | None, path: str) -> bool:
    """True when `path` is a command that can be run: a regular file with an execute bit, or a link that resolves
    (its target's mode is not read). False when the probe did not read it."""
    entry = _probed(probe, "paths", path)
    if entry is None or not entry.get("exists"):
        return False
    if entry.get("islnk"):
        return bool(entry.get("resolves"))
    return bool(entry.get("isreg")) and int(str(entry.get("mode") or "0"), 8) & 0o111 != 0


def probe_find(probe: Mapping | None, root: str) -> dict:
    """The entries directly in `root` (a directory the probe listed with its dirs option) in the shape
    `find: paths=root file_type=any hidden=true` registers, {files: [{path, isdir, islnk, uid, ...}]}, for the rules
    above that take a find; {skipped: true} when the probe did not run (they then look on their own)."""
    if not probe or probe.get("skipped") or probe.get("failed") or not isinstance(probe.get("paths"), Mapping):
        return {"skipped": True}
    base = os.path.normpath(root)
    files = [{"path": path, **entry} for path, entry in probe["paths"].items()
             if isinstance(entry, Mapping) and entry.get("exists") and os.path.dirname(os.path.normpath(path)) == base]
    return {"files": sorted(files, key=lambda entry: entry["path"])}


def probe_absent(probe: Mapping | None, path: str) -> bool:
    """True when `file: state=absent` on `path` would change nothing."""
    entry = _probed(probe, "paths", path)
    return entry is not None and entry.get("exists") is False


def probe_packages_missing(probe: Mapping | None, names: Iterable[str]) -> list[str]:
    """The packages a `package: state=present` task would still install: those the probe did not find installed
    (all of them when the probe did not run, and any name that is not a plain package name)."""
    names = [str(name) for name in names]
    if not probe or probe.get("skipped") or probe.get("failed") or not isinstance(probe.get("packages"), Mapping):
        return names
    installed = probe["packages"]
    return [name for name in names if not installed.get(name)]


def probe_unit_converged(probe: Mapping | None, name: str, enabled: bool | None = None,
                         started: bool | None = None, masked: bool | None = None) -> bool:
    """True when `systemd_service: name enabled state=started` would change nothing: the unit is loaded, enabled
    (UnitFileState 'enabled', or 'static', which systemd_service counts as enabled and cannot enable) when asked,
    active when asked to be started. `masked`: `systemd_service: masked=true enabled=false`, converged when the unit
    is masked (any other ask with it is not modelled)."""
    entry = _probed(probe, "units", name)
    if masked:
        return entry is not None and entry.get("enabled") == "masked" and not enabled and started is None
    if entry is None or entry.get("load") != "loaded":
        return False
    if enabled and entry.get("enabled") not in ("enabled", "static"):
        return False
    return not (started and entry.get("active") != "active")


def probe_user_converged(probe: Mapping | None, name: str, group: str | None = None, home: str | None = None,
                         shell: str | None = None, password_star: bool = False) -> bool:
    """True when `user:` for an existing account with these primary group, home and shell (and, with
    password_star, `password: "*"`) would change nothing (a task that sets another password, groups, a uid or a
    comment is not modelled: do not gate it on this)."""
    entry = _probed(probe, "users", name)
    if entry is None or not entry.get("exists"):
        return False
    return ((group is None or entry.get("group") == group) and (home is None or entry.get("home") == home)
            and (shell is None or entry.get("shell") == shell)
            and (not password_star or entry.get("password_star") is True))


def probe_text(probe: Mapping | None, path: str) -> str | None:
    """The text the probe read of `path` (its `contents`), or None when it did not read it (absent, a link, too
    large, not UTF-8, or the probe did not run)."""
    if not probe or probe.get("skipped") or probe.get("failed") or not isinstance(probe.get("contents"), Mapping):
        return None
    text = probe["contents"].get(path)
    return text if isinstance(text, str) else None


def probe_line_converged(probe: Mapping | None, path: str, regexp: str, line: str, mode: str | None = None,
                         owner: str | None = None, group: str | None = None) -> bool:
    """True when `lineinfile: path regexp line` (state present) would change nothing: `path` is a regular file with
    these mode, owner and group whose text the probe read, and the last line that `regexp` matches is exactly
    `line`, newline-terminated (lineinfile replaces the last match, and adds a missing final newline). No matching
    line: not converged (lineinfile would append)."""
    entry = _probed(probe, "paths", path)
    text = probe_text(probe, path)
    if entry is None or text is None or not entry.get("isreg") or entry.get("islnk") or not _owned(entry, mode, owner,
                                                                                                    group):
        return False
    pattern = re.compile(regexp)
    last = None
    for raw in text.splitlines(keepends=True):
        if pattern.search(raw.rstrip("\r\n")):
            last = raw
    return last == line + "\n"


def probe_line_absent(probe: Mapping | None, path: str, regexp: str) -> bool:
    """True when `lineinfile: path regexp state=absent` would change nothing: the probe found no `path`, or read its
    text and no line matches `regexp`."""
    entry = _probed(probe, "paths", path)
    if entry is None:
        return False
    if entry.get("exists") is False:
        return True
    text = probe_text(probe, path)
    if text is None or entry.get("islnk"):
        return False
    pattern = re.compile(regexp)
    return not any(pattern.search(raw.rstrip("\r\n")) for raw in text.splitlines())


def probe_group_converged(probe: Mapping | None, name: str) -> bool:
    """True when `group: name` (no gid) would change nothing: the group exists."""
    entry = _probed(probe, "groups", name)
    return bool(entry and entry.get("exists"))


def file_sha1(path: Path) -> str:
    """The sha1 of a file on the controller, read in blocks (copy's own checksum)."""
    digest = hashlib.sha1()  # noqa: S324 (copy's own)
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The sha256 of a file on the controller, read in blocks (what `stat: checksum_algorithm=sha256` reports)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
