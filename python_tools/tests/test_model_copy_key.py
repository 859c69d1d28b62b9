"""The worker's side of the head's model-copy key, run for real on this machine: the forced command the role renders
(rrsync -wo -no-del -munge rooted at the model copy, then setuid bits dropped) and root's audit of the copy.

No SSH: a stand-in "remote shell" runs the forced command directly with SSH_ORIGINAL_COMMAND set, as sshd would,
as an unprivileged account when this test runs as root. Needs rsync and rrsync (Debian's rsync package).
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import jinja2
import pytest
import yaml

from twinspark import generate

ROOT = generate.repo_root()
RRSYNC = shutil.which("rrsync") or "/usr/bin/rrsync"
pytestmark = pytest.mark.skipif(not (shutil.which("rsync") and Path(RRSYNC).exists() and shutil.which("setpriv")),
                                reason="rsync, rrsync and setpriv are needed")
AS_ROOT = os.geteuid() == 0
RECEIVER = "nobody" if AS_ROOT else pwd.getpwuid(os.geteuid()).pw_name


def _render_forced_command(copy: Path, munge: bool, out: Path) -> Path:
    source = (ROOT / "roles/model_cache/templates/twinspark-model-receive.j2").read_text()
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    environment.filters["comment"] = lambda text: "# " + text
    environment.filters["quote"] = lambda text: "'" + str(text).replace("'", "'\\''") + "'"
    text = environment.from_string(source).render(
        ansible_managed="rendered by the test", model_cache_fabric_user=RECEIVER, model_cache_sync_root=str(copy),
        model_cache_receive_munge=munge, model_cache_rrsync=RRSYNC)
    out.write_text(text)
    out.chmod(0o755)
    return out


def _own(path: Path) -> Path:
    """Hand a path the test made to the receiving account (what the copy's entries belong to)."""
    if AS_ROOT:
        os.lchown(path, pwd.getpwnam(RECEIVER).pw_uid, pwd.getpwnam(RECEIVER).pw_gid)
    return path


@pytest.fixture
def worker():
    """(remote shell for rsync -e, the model copy, the sender's tree) with the forced command in place. In a
    directory every account may traverse (pytest's own tmp is root-only), removed afterwards."""
    tmp_path = Path(tempfile.mkdtemp(prefix="twinspark-copy-key-", dir="/tmp"))
    tmp_path.chmod(0o755)
    copy = tmp_path / "models" / "tiny"
    copy.mkdir(parents=True)
    (copy.parent).chmod(0o755)
    (copy / "config.json").write_text("{}\n")
    _own(copy)
    _own(copy / "config.json")
    forced = _render_forced_command(copy, True, tmp_path / "twinspark-model-receive")
    drop = f"setpriv --reuid={RECEIVER} --regid={pwd.getpwnam(RECEIVER).pw_gid} --clear-groups " if AS_ROOT else ""
    rsh = tmp_path / "fake-ssh"
    rsh.write_text(f'#!/bin/sh\nshift\nSSH_ORIGINAL_COMMAND="$*" exec {drop}{forced}\n')
    rsh.chmod(0o755)
    src = tmp_path / "head"
    (src / "twinspark").mkdir(parents=True)
    (src / "twinspark" / "__init__.py").write_text("raise SystemExit('planted')\n")
    shutil.copy("/bin/true", src / "attack-suid")
    (src / "attack-suid").chmod(0o4755)
    (src / "attack-escape").symlink_to("/etc/shadow")
    (src / "weights.safetensors").write_bytes(b"\0" * 64)
    yield rsh, copy, src
    shutil.rmtree(tmp_path)


def _rsync(rsh: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["rsync", "-rlptD", "--rsh", str(rsh), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_the_key_cannot_write_outside_the_copy_or_delete(worker):
    rsh, copy, src = worker
    legit = _rsync(rsh, str(src / "weights.safetensors"), "fake:.")
    assert legit.returncode == 0, legit.stderr  # the head's real copy works through the same forced command
    assert (copy / "weights.safetensors").stat().st_size == 64
    assert _rsync(rsh, str(src / "twinspark"), "fake:../").returncode != 0
    assert not (copy.parent / "twinspark").exists()
    assert _rsync(rsh, str(src / "twinspark"), "fake:../../twinspark-planted").returncode != 0
    assert _rsync(rsh, "--delete", str(src / "twinspark") + "/", "fake:.").returncode != 0
    assert (copy / "config.json").exists()
    _rsync(rsh, str(src / "attack-suid"), f"fake:{copy.parent}/absolute")
    assert not (copy.parent / "absolute").exists(), "an absolute path must stay anchored below the copy"


def test_setuid_bits_are_dropped_and_links_are_munged(worker):
    rsh, copy, src = worker
    result = _rsync(rsh, "--perms", str(src / "attack-suid"), str(src / "attack-escape"), "fake:.")
    assert result.returncode == 0, result.stderr
    mode = (copy / "attack-suid").lstat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID)
    assert (copy / "attack-suid").owner() == RECEIVER
    target = os.readlink(copy / "attack-escape")
    assert target != "/etc/shadow" and target.startswith("/rsyncd-munged/")


def _audit(copy: Path, owner: str, links_allowed: bool) -> subprocess.CompletedProcess:
    tasks = yaml.safe_load((ROOT / "roles/model_cache/tasks/audit.yml").read_text())
    argv = tasks[0]["ansible.builtin.command"]["argv"]
    code = argv[3]
    return subprocess.run(["/usr/bin/python3", "-I", "-c", code, str(copy), owner, "yes" if links_allowed else "no"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_roots_audit_passes_a_clean_copy_and_names_every_planted_entry(worker):
    rsh, copy, src = worker
    owner = RECEIVER
    assert _audit(copy, owner, links_allowed=False).returncode == 0
    (copy / "snapshots").mkdir()
    _own(copy / "snapshots")
    (copy / "snapshots" / "inside").symlink_to("../config.json")
    _own(copy / "snapshots" / "inside")
    assert _audit(copy, owner, links_allowed=True).returncode == 0
    assert _audit(copy, owner, links_allowed=False).returncode == 1
    (copy / "snapshots" / "inside").unlink()
    (copy / "escape").symlink_to("../../../etc")
    (copy / "world").write_text("")
    (copy / "suid").write_text("")
    for name in ("escape", "world", "suid"):
        _own(copy / name)
    (copy / "world").chmod(0o666)
    (copy / "suid").chmod(0o4755)
    if AS_ROOT:
        (copy / "roots").write_text("")
    result = _audit(copy, owner, links_allowed=True)
    assert result.returncode == 1
    for name in ("escape", "world", "suid", *(["roots"] if AS_ROOT else [])):
        assert f"{copy / name}:" in result.stdout, (name, result.stdout)
    assert "config.json" not in result.stdout


def test_roots_audit_resolves_a_chain_of_links_that_each_look_inside(worker):
    """`here -> .` stays inside, and `out -> here/here/here/../../..` reads as the copy itself when only its text is
    normalised; resolved through `here`, it climbs three levels above the copy. The audit resolves every link."""
    _, copy, _ = worker
    owner = RECEIVER
    (copy / "here").symlink_to(".")
    _own(copy / "here")
    assert _audit(copy, owner, links_allowed=True).returncode == 0
    (copy / "out").symlink_to("here/here/here/../../..")
    _own(copy / "out")
    assert os.path.normpath(os.path.join(copy, "here/here/here/../../..")) == str(copy)  # the textual reading
    result = _audit(copy, owner, links_allowed=True)
    assert result.returncode == 1
    assert f"{copy / 'out'}: link to 'here/here/here/../../..' leaves the copy" in result.stdout
    assert f"{copy / 'here'}:" not in result.stdout


# The manifest outside the copy (issue 32, row 7): the key writes the copy, so it can rewrite a manifest inside it
# together with the weights. The role verifies against the node's own manifest, outside the copy, instead.


def _role_verify(copy: Path, outside: Path, *extra: str) -> tuple[int, str]:
    """`twinspark model verify` with the arguments the role gives the simulated worker (model_cache_verify_argv,
    rendered by Ansible from inventory/sim), its model directory and manifest moved to this test's copy and
    `outside`; run in this process as the test's account (the role adds setpriv in front)."""
    import contextlib
    import io

    from test_perpair import SIM, evaluator

    from twinspark import cli

    _, evaluate = evaluator(SIM)
    argv = evaluate("node2", "{{ model_cache_verify_argv }}")
    moved = {evaluate("node2", "{{ model_cache_dir }}"): str(copy),
             evaluate("node2", "{{ model_cache_manifest }}"): str(outside)}
    args = [moved.get(arg, arg) for arg in argv[argv.index("verify") + 1:]]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["model", "verify", *args, *extra])
    return code, out.getvalue()


def _own_tree(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        _own(path)


def test_weights_swapped_with_their_manifest_in_the_copy_fail_against_the_manifest_kept_outside(worker, tmp_path):
    from test_model import write_safetensors

    from twinspark import weights

    rsh, copy, _ = worker
    head = tmp_path / "head"
    write_safetensors(head / "model.safetensors", {"w": 4096, "b": 64})
    (head / "config.json").write_text("{}\n")
    outside = tmp_path / "model-manifest.json"  # written where the model was fetched, sent over Ansible
    weights.write_manifest(head, outside)
    assert _rsync(rsh, f"{head}/", "fake:.").returncode == 0  # the head's real copy
    _own_tree(copy)
    assert _role_verify(copy, outside, "--sha256")[0] == 0

    # What the key can do: other weights (valid, of another size) and a manifest that matches them, both in the copy.
    attacker = tmp_path / "attacker"
    write_safetensors(attacker / "model.safetensors", {"w": 4096, "b": 64, "planted": 512})
    (attacker / "config.json").write_text("{}\n")
    weights.write_manifest(attacker, attacker / weights.MANIFEST_NAME)
    pushed = _rsync(rsh, "--ignore-times", str(attacker / "model.safetensors"), str(attacker / weights.MANIFEST_NAME),
                    "fake:.")
    assert pushed.returncode == 0, pushed.stderr

    # Read from inside the copy, the swapped pair is consistent: the previous release's verification passed it.
    for extra in ((), ("--sha256",)):
        code, out = _role_verify(copy, copy / weights.MANIFEST_NAME, *extra)
        assert code == 0, out
    code, out = _role_verify(copy, outside)
    assert code == 1
    assert "model.safetensors: too long" in out and f"against {outside}" in out

    # Same size, other bytes: the sizes cannot tell; the digests of the manifest outside do.
    data = bytearray((head / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (attacker / "model.safetensors").write_bytes(bytes(data))
    weights.write_manifest(attacker, attacker / weights.MANIFEST_NAME)
    pushed = _rsync(rsh, "--ignore-times", str(attacker / "model.safetensors"), str(attacker / weights.MANIFEST_NAME),
                    "fake:.")
    assert pushed.returncode == 0, pushed.stderr
    code, out = _role_verify(copy, copy / weights.MANIFEST_NAME, "--sha256")
    assert code == 0, out
    code, out = _role_verify(copy, outside, "--sha256")
    assert code == 1 and "model.safetensors: checksum mismatch" in out


def test_the_role_verifies_every_node_against_the_manifest_outside_its_copy():
    from test_perpair import SIM, evaluator

    _, evaluate = evaluator(SIM)
    for node in ("node1", "node2"):
        argv = evaluate(node, "{{ model_cache_verify_argv }}")
        manifest = evaluate(node, "{{ model_cache_manifest }}")
        copy = evaluate(node, "{{ model_cache_sync_root }}")
        assert argv[argv.index("--manifest") + 1] == manifest == "/var/lib/twinspark/model-manifest.json"
        assert not manifest.startswith(copy.rstrip("/") + "/")
    excludes = evaluate("node2", "{{ model_cache_rsync_manifest_excludes }}")
    assert "--exclude=/twinspark-manifest.json" in excludes  # no copy carries a manifest to a node
