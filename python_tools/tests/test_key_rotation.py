"""Rotating the head's SSH keys (role key_rotation, `playbooks/rotate.yml -e twinspark_rotate=guard-key|copy-key`).

The rules (filter_plugins/twinspark_keys.py): which authorized_keys line is whose key, the new key's line copied from
the old one's options, the regexp that drops the others. The swap (library/twinspark_key_swap.py): refuses a next
key open to others, waits for the pair's lifecycle lock, leaves a matching key pair at every step. The role's order:
added before proven before swapped before dropped. And the real thing: sshd with a forced command (in a network
namespace of the test's own, as in test_health_remote_sshd.py) while a stand-in guard connects with the key in place
in a loop, under the lifecycle lock as the guard takes it: every one of its connections must succeed."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest
import sshd_namespace
import yaml

from twinspark import generate
from twinspark.pair import lifecycle

ROOT = generate.repo_root()
ROLE = ROOT / "roles" / "key_rotation"
PORT = sshd_namespace.PORT
GUARD_OPTIONS = 'restrict,command="/usr/local/libexec/twinspark-peer-control",from="10.77.0.1,10.78.0.1"'
COPY_OPTIONS = 'restrict,from="10.77.0.1",command="/usr/local/libexec/twinspark-model-receive"'
OPERATOR = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINklMIiZDgXFFmdGX/KbXIr6Mki4AZePkcWSlaLd7U4N operator"
OLD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKubZVxdKSf2F+M9PHo13F20GyOLDOLDOLDOLDOLDOLDOLD1 twinspark-pair-guard@node1"
NEW = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKubZVxdKSf2F+M9PHo13F20GyNEWNEWNEWNEWNEWNEWNEW2 twinspark-pair-guard@node1"


def load(kind: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / kind / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


keys = load("filter_plugins", "twinspark_keys")
swap_module = load("library", "twinspark_key_swap")


def lineinfile_absent(text: str, regexp: str) -> str:
    """What `lineinfile: state=absent regexp=...` leaves (it drops every line the regexp searches true on)."""
    pattern = re.compile(regexp)
    return "".join(line for line in text.splitlines(keepends=True) if not pattern.search(line))


# --- the rules ---

def test_the_new_line_copies_the_old_keys_options_and_is_what_site_yml_renders_from_the_new_pub():
    authorized = f"{OPERATOR}\n{GUARD_OPTIONS} {OLD}\n"
    line = keys.twinspark_authorized_line_for(authorized, " twinspark-pair-guard@", OLD, NEW + "\n")
    assert line == f"{GUARD_OPTIONS} {NEW}"  # the line role peer_key writes with the new .pub in place


def test_lines_sharing_a_comment_are_told_apart_by_their_key():
    """Mid-rotation both lines carry the same comment: the one holding the key in place is found by its material,
    whichever comes first."""
    other_options = 'restrict,command="/bin/false"'
    authorized = f"{other_options} {NEW}\n{GUARD_OPTIONS} {OLD}\n"
    third = NEW.replace("NEWNEW", "THIRD1", 1)
    assert keys.twinspark_authorized_line_for(authorized, " twinspark-pair-guard@", OLD, third) == \
        f"{GUARD_OPTIONS} {third}"
    assert keys.twinspark_authorized_line_for(authorized, " twinspark-pair-guard@", NEW, third) == \
        f"{other_options} {third}"


def test_a_key_the_worker_does_not_accept_stops_the_rotation():
    with pytest.raises(Exception, match="run site.yml first"):
        keys.twinspark_authorized_line_for(f"{OPERATOR}\n", " twinspark-pair-guard@", OLD, NEW)


@pytest.mark.parametrize(("marker", "options", "comment"), [
    (" twinspark-pair-guard@", GUARD_OPTIONS, "twinspark-pair-guard@node1"),
    (" twinspark-model-sync$", COPY_OPTIONS, "twinspark-model-sync"),
])
def test_the_drop_removes_every_other_key_of_its_kind_and_nothing_else(marker, options, comment):
    old, new = (key.rsplit(" ", 1)[0] + " " + comment for key in (OLD, NEW))
    other_kind = f"{COPY_OPTIONS} {OLD.rsplit(' ', 1)[0]} twinspark-model-sync" if "guard" in marker else \
        f"{GUARD_OPTIONS} {OLD}"
    authorized = f"{OPERATOR}\n{options} {old}\n{other_kind}\n{options} {new}\n{options} {old}\n"
    left = lineinfile_absent(authorized, keys.twinspark_other_keys_regexp(marker, new))
    assert left == f"{OPERATOR}\n{other_kind}\n{options} {new}\n"
    assert keys.twinspark_key_lines(left, marker) == [f"{options} {new}"]


def test_a_key_whose_blob_starts_another_keys_blob_is_still_dropped():
    prefix = OLD.rsplit(" ", 1)[0][:-5] + " twinspark-pair-guard@node1"
    authorized = f"{GUARD_OPTIONS} {OLD}\n"
    assert lineinfile_absent(authorized, keys.twinspark_other_keys_regexp(" twinspark-pair-guard@", prefix)) == ""


def test_the_option_the_pair_verbs_run_with_is_the_last_one_given():
    argv = ["--worker=10.77.0.2", "--ssh-key", "/a", "--ssh-user", "root", "--ssh-key=/b"]
    assert keys.twinspark_option(argv, "--ssh-key") == "/b"
    assert keys.twinspark_option(argv, "--ssh-user") == "root"
    assert keys.twinspark_option(argv, "--known-hosts") is None


def _peer_key_vars(path) -> dict:
    """The vars a task file passes to its one include of role peer_key."""
    found = [task["vars"] for task in yaml.safe_load(path.read_text())
             if (task.get("ansible.builtin.include_role") or {}).get("name") == "peer_key"]
    assert len(found) == 1, path
    return found[0]


def test_the_markers_and_fallbacks_are_the_ones_site_yml_uses():
    rotation = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    service = yaml.safe_load((ROOT / "roles" / "pair_guard" / "vars" / "main.yml").read_text())
    assert rotation["key_rotation_guard_marker"] == service["pair_guard_authorized_regexp"]
    # both keys' lines are written by role peer_key, found by the marker each caller gives it
    copy_include = _peer_key_vars(ROOT / "roles" / "model_cache" / "tasks" / "fabric_key.yml")
    assert copy_include["peer_key_marker"] == rotation["key_rotation_copy_marker"]
    guard_include = _peer_key_vars(ROOT / "roles" / "pair_guard" / "tasks" / "_install.yml")
    assert guard_include["peer_key_marker"] == "{{ pair_guard_authorized_regexp }}"
    cache = yaml.safe_load((ROOT / "roles" / "model_cache" / "defaults" / "main.yml").read_text())
    assert cache["model_cache_fabric_key"].replace("{{ twinspark_layout_control_dir }}", "C") in \
        rotation["key_rotation_copy_key"].replace("twinspark_layout_control_dir ~ '", "C")
    assert cache["model_cache_fabric_known_hosts"].replace("{{ twinspark_layout_control_dir }}", "C") in \
        rotation["key_rotation_copy_known_hosts"].replace("twinspark_layout_control_dir ~ '", "C")
    assert f"default('{cache['model_cache_fabric_user']}')" in rotation["key_rotation_copy_user"]


# --- the role's order ---

def _steps() -> list[dict]:
    tasks = yaml.safe_load((ROLE / "tasks" / "ssh_key.yml").read_text())
    flat: list[dict] = []
    for task in tasks:
        flat.extend(task.get("block", [task]))
    return flat


def test_the_new_key_is_authorized_and_proven_before_it_is_swapped_in_and_the_old_one_dropped_last():
    steps = _steps()
    kinds = [next(key for key in step if key not in ("name", "when", "register", "vars", "delegate_to", "loop",
                                                      "changed_when", "failed_when", "check_mode"))
             for step in steps]
    authorize = next(i for i, s in enumerate(steps) if kinds[i] == "ansible.builtin.lineinfile"
                     and s[kinds[i]].get("state", "present") == "present")
    swap = kinds.index("twinspark_key_swap")
    drop = next(i for i, s in enumerate(steps) if kinds[i] == "ansible.builtin.lineinfile"
                and s[kinds[i]].get("state") == "absent")
    proofs = [i for i, s in enumerate(steps) if s.get("register") == "key_rotation_proof"]
    assert authorize < proofs[0] < swap < proofs[1] < drop, [step["name"] for step in steps]
    assert "regexp" not in steps[authorize][kinds[authorize]], "adding with site.yml's regexp would replace the old"
    assert steps[proofs[0]]["vars"]["key_rotation_key_under_test"] == "{{ key_rotation_key }}.next"
    assert "key_rotation_swapped.public_key" in steps[drop][kinds[drop]]["regexp"]
    mutating = [steps[i]["name"] for i in (authorize, swap, drop)]
    guarded = [step["name"] for task in yaml.safe_load((ROLE / "tasks" / "ssh_key.yml").read_text())
               if task.get("when") == "not ansible_check_mode" for step in task.get("block", [])]
    assert set(mutating) <= set(guarded), "--check must change nothing"


# --- the swap ---

def _keygen(path: Path, comment: str = "twinspark-pair-guard@node1") -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True,
                   timeout=30)
    return path.with_name(path.name + ".pub").read_text()


def test_a_next_key_readable_by_others_is_refused_and_nothing_changes(tmp_path):
    key = tmp_path / "id_ed25519"
    old = _keygen(key)
    _keygen(tmp_path / "id_ed25519.next")
    (tmp_path / "id_ed25519.next").chmod(0o644)
    with pytest.raises(swap_module.SwapError, match="mode 0644"):
        swap_module.swap(str(key), str(tmp_path / "pair.lock"), 1)
    assert (tmp_path / "id_ed25519.pub").read_text() == old and (tmp_path / "id_ed25519.next").exists()


def test_the_swap_puts_the_next_key_and_its_public_half_in_place(tmp_path):
    key = tmp_path / "id_ed25519"
    _keygen(key)
    new = _keygen(tmp_path / "id_ed25519.next")
    assert swap_module.swap(str(key), str(tmp_path / "pair.lock"), 1) == (True, new)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["id_ed25519", "id_ed25519.pub", "pair.lock"]
    assert (tmp_path / "id_ed25519.pub").read_text() == new
    assert (key.stat().st_mode & 0o777) == 0o600
    assert swap_module.swap(str(key), str(tmp_path / "pair.lock"), 1) == (False, new)


def test_a_swap_cut_after_the_rename_is_finished_by_the_next_call(tmp_path):
    key = tmp_path / "id_ed25519"
    _keygen(key)
    new = _keygen(tmp_path / "id_ed25519.next")
    (tmp_path / "id_ed25519.pub").unlink()  # the state a process killed between the swap's steps leaves
    (tmp_path / "id_ed25519.next").rename(key)
    assert swap_module.swap(str(key), str(tmp_path / "pair.lock"), 1) == (True, new)
    assert (tmp_path / "id_ed25519.pub").read_text() == new


def test_every_step_of_the_swap_leaves_a_pair_ssh_accepts(tmp_path, monkeypatch):
    """A swap killed after any of its file operations leaves <key> and <key>.pub (if any) of one key: ssh offers the
    .pub and signs with the private key, and fails on a mismatch (the real-sshd test below shows it)."""
    key = tmp_path / "id_ed25519"
    _keygen(key)
    _keygen(tmp_path / "id_ed25519.next")
    states: list[tuple[str, str | None]] = []

    def record() -> None:
        private = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True)
        pub = key.with_name("id_ed25519.pub")
        states.append((keys.key_material(private.stdout), keys.key_material(pub.read_text()) if pub.exists() else None))

    for name in ("rename", "unlink"):
        real = getattr(os, name)

        def step(*args, _real=real, **kwargs):
            _real(*args, **kwargs)
            record()
        monkeypatch.setattr(swap_module.os, name, step)
    swap_module.swap(str(key), str(tmp_path / "pair.lock"), 1)
    monkeypatch.undo()
    assert len(states) >= 3
    assert [state for state in states if state[1] not in (None, state[0])] == []


def test_the_swap_waits_for_the_pairs_lifecycle_lock_and_names_its_holder(tmp_path):
    key = tmp_path / "id_ed25519"
    old = _keygen(key)
    _keygen(tmp_path / "id_ed25519.next")
    lock = str(tmp_path / "pair.lock")
    with lifecycle.lifecycle_lock(lock, "twinspark pair restart", 0), \
            pytest.raises(swap_module.SwapError, match="twinspark pair restart"):
        swap_module.swap(str(key), lock, 1)
    assert (tmp_path / "id_ed25519.pub").read_text() == old


# --- the real thing: sshd and a forced command ---

@pytest.fixture
def worker_sshd(tmp_path):
    """(pid, directory): sshd on 127.0.0.1:PORT in a namespace of its own, with the guard's forced command."""
    reason = sshd_namespace.missing(("unshare", "nsenter", "ssh-keygen", "ip", "ssh"))
    if reason:
        pytest.skip(reason)
    control = tmp_path / "peer-control"
    control.write_text(textwrap.dedent("""\
        #!/bin/sh
        case "$SSH_ORIGINAL_COMMAND" in
          state) echo active ;;
          *) echo "refused '$SSH_ORIGINAL_COMMAND'" >&2; exit 2 ;;
        esac
        """))
    control.chmod(0o755)
    with sshd_namespace.running(tmp_path, tmp_path / "authorized_keys", "MaxStartups 100\n") as pid:
        (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{PORT} {sshd_namespace.host_key_line(tmp_path)}\n")
        yield pid, tmp_path


def _ssh(pid: int, directory: Path, key: Path) -> subprocess.CompletedProcess:
    """The guard's ssh (twinspark.pair.io.LivePair.worker's options) inside sshd's namespace, asking `state`."""
    return subprocess.run(["nsenter", f"--target={pid}", "--net", "--", "ssh", "-i", str(key), "-o", "BatchMode=yes",
                           "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10", "-o", "StrictHostKeyChecking=yes",
                           "-o", f"UserKnownHostsFile={directory / 'known_hosts'}", "-o", "LogLevel=ERROR",
                           "-p", str(PORT), "root@127.0.0.1", "state"],
                          capture_output=True, text=True, timeout=30, check=False)


def test_a_guard_connecting_throughout_a_rotation_is_never_refused(worker_sshd):
    pid, directory = worker_sshd
    keydir = directory / "pair-guard"
    keydir.mkdir(mode=0o700)
    key, lock, marker = keydir / "id_ed25519", str(directory / "pair.lock"), " twinspark-pair-guard@"
    current = _keygen(key)
    authorized = directory / "authorized_keys"
    authorized.write_text(f"{OPERATOR}\nrestrict,command=\"{directory / 'peer-control'}\",from=\"127.0.0.1\" {current}")
    (directory / "old_key").write_bytes(key.read_bytes())
    (directory / "old_key").chmod(0o600)
    assert _ssh(pid, directory, key).stdout == "active\n"

    outcomes: list[tuple[int, str]] = []
    stop = threading.Event()

    def guard() -> None:  # a guard run: the lifecycle lock without waiting (busy: skip this run), then its ssh
        while not stop.is_set():
            try:
                with lifecycle.lifecycle_lock(lock, "the pair guard's run", 0):
                    done = _ssh(pid, directory, key)
                    outcomes.append((done.returncode, done.stdout + done.stderr))
            except lifecycle.LockBusy:
                pass
            time.sleep(0.1)  # between runs (the real guard waits vllm_service_guard_interval_s)

    runner = threading.Thread(target=guard)
    runner.start()
    try:
        # The role's steps (tasks/ssh_key.yml), with its filters and its swap module.
        new = _keygen(keydir / "id_ed25519.next")
        line = keys.twinspark_authorized_line_for(authorized.read_text(), marker, current, new)
        authorized.write_text(authorized.read_text() + line + "\n")
        assert _ssh(pid, directory, keydir / "id_ed25519.next").stdout == "active\n"
        time.sleep(0.5)
        assert swap_module.swap(str(key), lock, 10) == (True, new)
        time.sleep(0.5)
        assert _ssh(pid, directory, key).stdout == "active\n"
        authorized.write_text(lineinfile_absent(authorized.read_text(), keys.twinspark_other_keys_regexp(marker, new)))
        time.sleep(0.5)
    finally:
        stop.set()
        runner.join(timeout=60)
    failures = [outcome for outcome in outcomes if outcome != (0, "active\n")]
    assert len(outcomes) >= 5 and not failures, failures
    assert keys.twinspark_key_lines(authorized.read_text(), marker) == [line]
    assert authorized.read_text().startswith(OPERATOR)
    refused = _ssh(pid, directory, directory / "old_key")
    assert refused.returncode == 255 and "Permission denied" in refused.stderr
    assert _ssh(pid, directory, key).stdout == "active\n"


def test_ssh_offers_the_pub_beside_the_key_so_a_pair_swapped_one_file_at_a_time_fails(worker_sshd):
    """Why the swap removes <key>.pub before it renames the private key: ssh offers the .pub and then signs with
    the private key, and refuses a mismatch even when both keys are authorized."""
    pid, directory = worker_sshd
    key = directory / "id_ed25519"
    one = _keygen(key)
    two = _keygen(directory / "other")
    options = f"restrict,command=\"{directory / 'peer-control'}\""
    (directory / "authorized_keys").write_text(f"{options} {one}{options} {two}")
    assert _ssh(pid, directory, key).returncode == 0
    shutil.copy(directory / "other.pub", directory / "id_ed25519.pub")
    mismatched = _ssh(pid, directory, key)
    assert mismatched.returncode == 255, mismatched
    (directory / "id_ed25519.pub").unlink()
    assert _ssh(pid, directory, key).stdout == "active\n", "without .pub, ssh takes the public half from the key"
