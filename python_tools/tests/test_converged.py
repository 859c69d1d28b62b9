"""twinspark.converged: the rules that let a converged run skip a task say "converged" only on an exact match.

The node side is what `ansible.builtin.find` returns; here it is recorded from a real find-shaped walk of a tmp
directory (find_like below stats the files the way the module does), so owners and modes are this machine's own.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import stat
from pathlib import Path

from twinspark import converged


def find_like(directory: Path) -> list[dict]:
    """The fields of find's `files` (file_type any, get_checksum) the rules read, for everything below directory."""
    out = []
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            entry = {"path": path, "mode": f"{stat.S_IMODE(st.st_mode):04o}", "isreg": stat.S_ISREG(st.st_mode),
                     "isdir": stat.S_ISDIR(st.st_mode), "islnk": stat.S_ISLNK(st.st_mode),
                     "uid": st.st_uid, "gid": st.st_gid,
                     "pw_name": pwd.getpwuid(st.st_uid).pw_name, "gr_name": grp.getgrgid(st.st_gid).gr_name}
            if stat.S_ISREG(st.st_mode):
                entry["checksum"] = hashlib.sha1(Path(path).read_bytes()).hexdigest()  # noqa: S324
            out.append(entry)
    return out


def _pair(tmp_path: Path) -> tuple[Path, Path, str, str]:
    source = tmp_path / "src"
    source.mkdir(parents=True)
    (source / "a.patch").write_bytes(b"--- a\n+++ b\n")
    (source / "manifest.yml").write_bytes(b"patches: []\n")
    (source / ".hidden").write_bytes(b"x")
    dest = tmp_path / "runtime" / "patches" / "target"
    dest.mkdir(parents=True)
    for path in source.iterdir():
        (dest / path.name).write_bytes(path.read_bytes())
        (dest / path.name).chmod(0o644)
    me = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    return source, dest, me, group


def test_identical_copy_is_converged(tmp_path):
    source, dest, me, group = _pair(tmp_path)
    found = find_like(dest.parent)
    assert converged.tree_copy_converged(source, str(dest), found, me, group, "0644")
    assert converged.tree_copy_converged(source, str(dest) + "/", found, me, group, "644")


def test_every_difference_the_copy_would_fix_is_not_converged(tmp_path):
    source, dest, me, group = _pair(tmp_path)
    (dest / "a.patch").write_bytes(b"--- a\n+++ changed\n")
    assert not converged.tree_copy_converged(source, str(dest), find_like(dest.parent), me, group, "0644")

    source, dest, me, group = _pair(tmp_path / "2")
    (dest / ".hidden").unlink()
    assert not converged.tree_copy_converged(source, str(dest), find_like(dest.parent), me, group, "0644")

    source, dest, me, group = _pair(tmp_path / "3")
    (dest / "manifest.yml").chmod(0o664)
    assert not converged.tree_copy_converged(source, str(dest), find_like(dest.parent), me, group, "0644")

    source, dest, me, group = _pair(tmp_path / "4")
    assert not converged.tree_copy_converged(source, str(dest), find_like(dest.parent), "nobody-else", group, "0644")
    assert not converged.tree_copy_converged(source, str(dest), find_like(dest.parent), me, "nogroup-else", "0644")

    source, dest, me, group = _pair(tmp_path / "5")
    (dest / "a.patch").unlink()
    (dest / "a.patch").symlink_to(source / "a.patch")  # same content, but a link: the copy replaces it
    assert not converged.tree_copy_converged(source, str(dest), find_like(dest.parent), me, group, "0644")


def test_what_the_rule_does_not_model_leaves_the_copy_to_decide(tmp_path):
    source, dest, me, group = _pair(tmp_path)
    (source / "sub").mkdir()  # a subdirectory: the copy's own directory handling decides
    assert not converged.tree_copy_converged(source, str(dest), find_like(dest.parent), me, group, "0644")
    assert not converged.tree_copy_converged(tmp_path / "absent", str(dest), [], me, group, "0644")
    assert not converged.tree_copy_converged(source, str(dest), [], me, group, "0644")  # nothing found on the node


def test_extra_files_on_the_node_do_not_count(tmp_path):
    source, dest, me, group = _pair(tmp_path)
    (dest / "left-over.patch").write_bytes(b"old")  # the copy never removes files either
    assert converged.tree_copy_converged(source, str(dest), find_like(dest.parent), me, group, "0644")


def _caches(tmp_path: Path) -> tuple[Path, str, str]:
    root = tmp_path / "cache"
    root.mkdir()
    for name in ("vllm", "tilelang", ".hidden"):
        (root / name).mkdir()
        (root / name).chmod(0o750)
    return root, pwd.getpwuid(os.getuid()).pw_name, str(os.getgid())


def test_converged_cache_dirs_are_left_out_and_the_rest_kept_in_order(tmp_path):
    root, me, gid = _caches(tmp_path)
    names = ["vllm", "flashinfer", "tilelang", ".hidden", "inductor"]
    assert converged.dirs_to_converge(names, str(root), find_like(root), me, gid, "0750") == ["flashinfer", "inductor"]
    assert converged.dirs_to_converge(names, str(root), find_like(root), str(os.getuid()), gid, "750") == [
        "flashinfer", "inductor"]
    assert converged.dirs_to_converge(names, str(root), None, me, gid, "0750") == names  # the find was skipped


def test_a_cache_dir_the_file_task_would_change_stays_in(tmp_path):
    root, me, gid = _caches(tmp_path)
    (root / "vllm").chmod(0o755)
    (root / "tilelang").rmdir()
    (root / "tilelang").symlink_to(root / ".hidden")  # a link to a good directory is still not one (follow: false)
    (root / "file").write_bytes(b"")
    names = ["vllm", "tilelang", "file", ".hidden"]
    assert converged.dirs_to_converge(names, str(root), find_like(root), me, gid, "0750") == names[:3]
    assert converged.dirs_to_converge([".hidden"], str(root), find_like(root), "someone-else", gid, "0750") == [
        ".hidden"]
    assert converged.dirs_to_converge([".hidden"], str(root), find_like(root), me, str(os.getgid() + 1), "0750") == [
        ".hidden"]


def _stat_loop(root: Path, names: list[str]) -> list[dict]:
    """The fields of a `stat: follow=false` loop's results the rule reads (the stat module uses lstat too)."""
    results = []
    for name in names:
        path = f"{root}/{name}"
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            results.append({"item": name, "stat": {"exists": False}})
            continue
        results.append({"item": name, "stat": {"exists": True, "path": path, "isdir": stat.S_ISDIR(st.st_mode),
                                               "islnk": stat.S_ISLNK(st.st_mode), "uid": st.st_uid}})
    return results


def test_one_find_says_what_the_stat_loop_said_of_the_state_entries(tmp_path):
    root = tmp_path / "state"
    root.mkdir()
    (root / "models").mkdir()
    (root / "hf").symlink_to(tmp_path)  # a link to a directory: not a directory (never followed)
    (root / "cache").mkdir()
    if os.geteuid() == 0:
        os.chown(root / "cache", pwd.getpwnam("nobody").pw_uid, -1)
    (root / ".dot").write_bytes(b"")
    (root / "other").mkdir()
    names = ["models", "hf", "cache", "metrics", ".dot"]
    from_find = converged.entries_present(names, str(root), find_like(root))
    assert from_find == converged.stat_entries_present(_stat_loop(root, names))
    assert [e["item"] for e in from_find] == ["models", "hf", "cache", ".dot"]  # metrics is absent, other not asked
    assert [e["item"] for e in from_find if not e["isdir"]] == ["hf", ".dot"]
    assert from_find[0]["path"] == f"{root}/models"


def test_only_listed_paths_are_left_to_remove_and_others_are_kept(tmp_path):
    root = tmp_path / "state"
    root.mkdir()
    (root / "restart-pending").write_bytes(b"")
    (root / "ssh").symlink_to(tmp_path / "nowhere")  # a dangling link still exists for state: absent
    paths = [f"{root}/restart-pending", f"{root}/ssh", f"{root}/gone", f"{tmp_path}/elsewhere/x"]
    assert converged.paths_to_remove(paths, str(root), find_like(root)) == [paths[0], paths[1], paths[3]]
    assert converged.paths_to_remove(paths, str(root) + "/", find_like(root)) == [paths[0], paths[1], paths[3]]
    assert converged.paths_to_remove(paths, str(root), None) == paths  # no find: the loop decides for each
    (root / "restart-pending").unlink()
    (root / "ssh").unlink()
    assert converged.paths_to_remove(paths[:3], str(root), find_like(root)) == []


def test_stable_paths_from_one_find_and_a_stat_for_the_rest(tmp_path):
    base = tmp_path / "opt"
    base.mkdir()
    (base / "venv").mkdir()  # the previous layout: a real directory
    (base / "patches").symlink_to(tmp_path)  # already a link: left alone
    outside = tmp_path / "elsewhere" / "venv"
    paths = [f"{base}/venv", f"{base}/patches", str(outside)]
    assert converged.paths_outside(paths, [str(base), f"{base}/dist"]) == [str(outside)]
    stats = {"results": [{"item": str(outside), "stat": {"exists": True, "islnk": False}}]}
    assert converged.unlinked_present(paths, [str(base)], find_like(base), stats["results"]) == [paths[0], paths[2]]
    stats = {"results": [{"item": str(outside), "stat": {"exists": False}}]}
    assert converged.unlinked_present(paths, [str(base)], find_like(base), stats["results"]) == [paths[0]]
    (base / "venv").rmdir()
    assert converged.unlinked_present(paths, [str(base)], find_like(base), []) == []
