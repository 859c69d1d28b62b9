"""Ansible filters over twinspark.converged: whether a task's target is already as the task would leave it, from
one `find` on the node (python_tools/twinspark/converged.py holds the rules)."""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))  # python_tools/ on sys.path

from twinspark import converged


def twinspark_tree_copy_converged(found, source_dir, dest_dir, owner, group, mode):
    """True when copying source_dir/ (controller) to dest_dir/ would change nothing; `found`: a find's result."""
    files = found.get("files", []) if hasattr(found, "get") else found
    return converged.tree_copy_converged(Path(source_dir), dest_dir, files, owner, group, mode)


def twinspark_dirs_to_converge(names, found, root, owner, group, mode):
    """The names below root whose `file: state=directory` task would still change; all of them when the find that
    gave `found` was skipped."""
    files = None if not found or found.get("skipped") else found.get("files", [])
    return converged.dirs_to_converge(names, root, files, owner, group, mode)


def twinspark_entries_present(result, root, names):
    """The existing names in root as {item, path, isdir, islnk, uid}, from a find's result (file_type any, directly
    in root) or, when the find was skipped, from a `stat` loop's result over the same names."""
    if "results" in result:
        return converged.stat_entries_present(result["results"])
    return converged.entries_present(names, root, result.get("files", []))


def twinspark_paths_to_remove(paths, found, root):
    """The paths a `file: state=absent` loop would still remove: what the find directly in root listed, and every
    path outside root or when the find was skipped."""
    files = None if not found or found.get("skipped") else found.get("files", [])
    return converged.paths_to_remove(paths, root, files)


def twinspark_paths_outside(paths, root):
    """The paths not directly in root (a directory or a list): a find there cannot speak for them."""
    return converged.paths_outside(paths, root)


def twinspark_unlinked_present(paths, found, root, stats):
    """The paths that exist and are not links: from a find directly in root for those there, from a stat loop's
    result (`stats`) for the others."""
    return converged.unlinked_present(paths, root, found.get("files", []), stats.get("results", []))


def twinspark_probe_file(probe, path, sha1=None, mode=None, owner=None, group=None):
    """True when a copy/template of content with this sha1 (None: not compared) to path would change nothing."""
    return converged.probe_file_converged(probe, path, sha1, mode, owner, group)


def twinspark_probe_executable(probe, path):
    """True when path is a command that can be run (a regular file with an execute bit, or a link that resolves)."""
    return converged.probe_executable(probe, path)


def twinspark_probe_dir(probe, path, mode=None, owner=None, group=None):
    """True when `file: state=directory` on path would change nothing."""
    return converged.probe_dir_converged(probe, path, mode, owner, group)


def twinspark_probe_link(probe, path, target, owner=None, group=None):
    """True when `file: state=link src=target` on path would change nothing."""
    return converged.probe_link_converged(probe, path, target, owner, group)


def twinspark_probe_resolves(probe, path):
    """True when path exists with links followed (a command's `creates:`)."""
    return converged.probe_resolves(probe, path)


def twinspark_file_sha1(path):
    """The sha1 of a file on the controller (what copy compares with the node's copy)."""
    return converged.file_sha1(Path(path))


def twinspark_file_sha256(path):
    """The sha256 of a file on the controller (what `stat: checksum_algorithm=sha256` reports)."""
    return converged.file_sha256(Path(path))


def twinspark_probe_find(probe, root):
    """What `find: paths=root file_type=any hidden=true` would list, from a probe that listed root (its dirs
    option): {files: [...]}, or {skipped: true} when the probe did not run."""
    return converged.probe_find(probe, root)


def twinspark_probe_absent(probe, path):
    """True when `file: state=absent` on path would change nothing."""
    return converged.probe_absent(probe, path)


def twinspark_probe_packages_missing(probe, names):
    """The packages a `package: state=present` task would still install."""
    return converged.probe_packages_missing(probe, [names] if isinstance(names, str) else names)


def twinspark_probe_unit(probe, name, enabled=None, started=None, masked=None):
    """True when `systemd_service` with these enabled/started (or masked) would change nothing."""
    return converged.probe_unit_converged(probe, name, enabled, started, masked)


def twinspark_probe_user(probe, name, group=None, home=None, shell=None, password_star=False):
    """True when `user:` for an existing account with these group, home and shell (and `password: "*"` with
    password_star) would change nothing."""
    return converged.probe_user_converged(probe, name, group, home, shell, password_star)


def twinspark_probe_text(probe, path):
    """The text the probe read of path (its contents option), else None."""
    return converged.probe_text(probe, path)


def twinspark_probe_line(probe, path, regexp, line, mode=None, owner=None, group=None):
    """True when `lineinfile: path regexp line` (present) would change nothing."""
    return converged.probe_line_converged(probe, path, regexp, line, mode, owner, group)


def twinspark_probe_line_absent(probe, path, regexp):
    """True when `lineinfile: path regexp state=absent` would change nothing."""
    return converged.probe_line_absent(probe, path, regexp)


def twinspark_probe_group(probe, name):
    """True when `group: name` would change nothing."""
    return converged.probe_group_converged(probe, name)


class FilterModule:
    def filters(self):
        return {"twinspark_tree_copy_converged": twinspark_tree_copy_converged,
                "twinspark_dirs_to_converge": twinspark_dirs_to_converge,
                "twinspark_entries_present": twinspark_entries_present,
                "twinspark_paths_to_remove": twinspark_paths_to_remove,
                "twinspark_paths_outside": twinspark_paths_outside,
                "twinspark_unlinked_present": twinspark_unlinked_present,
                "twinspark_probe_file": twinspark_probe_file,
                "twinspark_probe_dir": twinspark_probe_dir,
                "twinspark_probe_link": twinspark_probe_link,
                "twinspark_probe_resolves": twinspark_probe_resolves,
                "twinspark_probe_executable": twinspark_probe_executable,
                "twinspark_file_sha1": twinspark_file_sha1,
                "twinspark_file_sha256": twinspark_file_sha256,
                "twinspark_probe_absent": twinspark_probe_absent,
                "twinspark_probe_find": twinspark_probe_find,
                "twinspark_probe_packages_missing": twinspark_probe_packages_missing,
                "twinspark_probe_unit": twinspark_probe_unit,
                "twinspark_probe_user": twinspark_probe_user,
                "twinspark_probe_text": twinspark_probe_text,
                "twinspark_probe_line": twinspark_probe_line,
                "twinspark_probe_line_absent": twinspark_probe_line_absent,
                "twinspark_probe_group": twinspark_probe_group}
