"""One read per role (library/twinspark_probe.py) and the rules that gate tasks on it (twinspark.converged).

The module runs for real through ansible-playbook on localhost; the gated tasks are the real copy, template and file
modules, run four times: fresh (they change), converged (they are skipped and nothing changes), after drift (they run
again and repair it), and in check mode after drift (they say what they would change).
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from twinspark import converged

REPO = Path(__file__).resolve().parents[2]
ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name


def ansible_playbook(tmp_path: Path, playbook: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(tmp_path / "roles"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACKS_ENABLED="twinspark_timing",
               TWINSPARK_TASK_TIMES=str(tmp_path / "times.jsonl"))
    (tmp_path / "times.jsonl").unlink(missing_ok=True)
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"root={tmp_path / 'node'}", *extra,
         str(playbook)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)


def outcomes(tmp_path: Path) -> dict[str, str]:
    rows = [json.loads(line) for line in (tmp_path / "times.jsonl").read_text().splitlines()]
    return {row["task"]: row["hosts"].get("localhost", "") for row in rows}


def probe_once(tmp_path: Path, arguments: str) -> dict:
    """Run one twinspark_probe task with these (YAML, indented for the task) arguments; its registered result."""
    out = tmp_path / "probe.json"
    playbook = tmp_path / "probe.yml"
    playbook.write_text(f"""
- name: Probe
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Read everything in one call
      twinspark_probe:
{arguments}
      register: probed
    - name: Keep the answer
      ansible.builtin.copy:
        content: "{{{{ probed | to_json }}}}"
        dest: {out}
        mode: "0644"
""")
    done = ansible_playbook(tmp_path, playbook)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


@pytest.mark.slow(3)
def test_the_module_reads_an_interpreters_version_and_machine(tmp_path):
    # What chooses the vllm_runtime role's lock: the interpreter the runtime's venv is made from, run once.
    (tmp_path / "node").mkdir()
    probed = probe_once(tmp_path, f"""\
        pythons: ["{sys.executable}", "{{{{ root }}}}/no-such-python"]""")
    assert probed["pythons"][sys.executable] == {"version": f"{sys.version_info[0]}.{sys.version_info[1]}",
                                                 "machine": os.uname().machine}
    assert "No such file" in probed["pythons"][f"{tmp_path}/node/no-such-python"]["error"]


@pytest.mark.slow(5)
def test_the_module_reads_paths_without_following_links_and_the_accounts(tmp_path):
    node = tmp_path / "node"
    (node / "dir").mkdir(parents=True)
    (node / "dir" / "inner").write_bytes(b"inner\n")
    (node / "file").write_bytes(b"payload\n")
    (node / "file").chmod(0o640)
    (node / "link").symlink_to(node / "file")
    (node / "dangling").symlink_to(node / "nowhere")
    (node / "read-only").write_bytes(b"kept\n")
    probed = probe_once(tmp_path, f"""\
        paths: ["{{{{ root }}}}/file", "{{{{ root }}}}/dir", "{{{{ root }}}}/link", "{{{{ root }}}}/dangling",
                "{{{{ root }}}}/absent"]
        dirs: ["{{{{ root }}}}/dir", "{{{{ root }}}}/not-a-dir"]
        reads: ["{{{{ root }}}}/read-only"]
        packages: [dpkg, twinspark-no-such-package]
        users: [{ME}, twinspark-no-such-user]
        groups: [{MY_GROUP}, twinspark-no-such-group]
        units: [twinspark-no-such.service]""")
    assert probed["changed"] is False
    paths = probed["paths"]
    entry = paths[f"{node}/file"]
    assert (entry["isreg"], entry["islnk"], entry["mode"], entry["pw_name"], entry["gr_name"], entry["size"]) == (
        True, False, "0640", ME, MY_GROUP, 8)
    assert entry["checksum"] == hashlib.sha1(b"payload\n").hexdigest()  # noqa: S324
    assert paths[f"{node}/dir"]["isdir"] and "checksum" not in paths[f"{node}/dir"]
    link = paths[f"{node}/link"]
    assert (link["islnk"], link["isreg"], link["lnk_target"], link["resolves"]) == (True, False, str(node / "file"),
                                                                                    True)
    assert paths[f"{node}/dangling"]["islnk"] and paths[f"{node}/dangling"]["resolves"] is False
    assert paths[f"{node}/absent"] == {"exists": False}
    # A path the role only reads is read the same way, but not declared among those it converges (make sim-drift
    # drifts only those, from the module's arguments).
    assert paths[f"{node}/read-only"]["checksum"] == hashlib.sha1(b"kept\n").hexdigest()  # noqa: S324
    assert f"{node}/read-only" not in probed["managed"] and f"{node}/file" in probed["managed"]
    assert paths[f"{node}/dir/inner"]["checksum"] == hashlib.sha1(b"inner\n").hexdigest()  # noqa: S324
    assert not any(path.startswith(f"{node}/not-a-dir") for path in paths)
    if shutil.which("dpkg-query"):
        assert probed["packages"]["dpkg"]
    assert probed["packages"]["twinspark-no-such-package"] == ""
    assert probed["users"][ME]["exists"] and probed["users"][ME]["uid"] == os.getuid()
    assert probed["users"]["twinspark-no-such-user"] == {"exists": False}
    assert probed["groups"][MY_GROUP] == {"exists": True, "gid": os.getgid()}
    assert probed["groups"]["twinspark-no-such-group"] == {"exists": False}
    # Whatever systemctl says of a unit that does not exist (or when there is no systemd), it is never converged.
    assert not converged.probe_unit_converged(probed, "twinspark-no-such.service", enabled=True)


GATED_ROLE = """
- name: Read what the role keeps, in one call
  twinspark_probe:
    paths: ["{{ root }}/etc", "{{ root }}/etc/unit.conf", "{{ root }}/etc/static", "{{ root }}/current"]
  register: gated_probe

- name: Create the directory
  ansible.builtin.file:
    path: "{{ root }}/etc"
    state: directory
    mode: "0750"
  when: not (gated_probe | twinspark_probe_dir(root ~ '/etc', '0750', me, my_group))

- name: Write the templated file
  ansible.builtin.template:
    src: unit.conf.j2
    dest: "{{ root }}/etc/unit.conf"
    mode: "0640"
  when: not (gated_probe | twinspark_probe_file(root ~ '/etc/unit.conf',
    lookup('ansible.builtin.template', 'unit.conf.j2') | hash('sha1'), '0640', me, my_group))

- name: Write the static file
  ansible.builtin.copy:
    content: "{{ gated_line }}\\n"
    dest: "{{ root }}/etc/static"
    mode: "0644"
  when: not (gated_probe | twinspark_probe_file(root ~ '/etc/static', (gated_line ~ '\\n') | hash('sha1'), '0644'))

- name: Point the link
  ansible.builtin.file:
    path: "{{ root }}/current"
    src: "{{ root }}/etc"
    state: link
  when: not (gated_probe | twinspark_probe_link(root ~ '/current', root ~ '/etc'))
"""

TEMPLATE = ("{{ ansible_managed | comment }}\n[Unit]\nDescription={{ gated_line }}\n"
            "{% if true %}\nAfter=x\n{% endif %}\n")


@pytest.fixture
def gated(tmp_path):
    role = tmp_path / "roles" / "gated"
    (role / "tasks").mkdir(parents=True)
    (role / "templates").mkdir()
    (role / "tasks" / "main.yml").write_text(GATED_ROLE)
    (role / "templates" / "unit.conf.j2").write_text(TEMPLATE)
    (tmp_path / "node").mkdir()
    playbook = tmp_path / "site.yml"
    playbook.write_text(f"""
- name: Gated
  hosts: localhost
  gather_facts: false
  vars:
    me: {ME}
    my_group: {MY_GROUP}
    gated_line: a line with a trailing newline
  roles:
    - gated
""")
    return playbook


GATED_TASKS = ["Write the templated file", "Write the static file", "Create the directory", "Point the link"]


@pytest.mark.slow(30)
def test_a_converged_run_skips_the_gated_tasks_and_drift_runs_them_again(tmp_path, gated):
    first = ansible_playbook(tmp_path, gated)
    assert first.returncode == 0, first.stdout + first.stderr
    assert {task: outcomes(tmp_path)[task] for task in GATED_TASKS} == dict.fromkeys(GATED_TASKS, "changed")

    second = ansible_playbook(tmp_path, gated)
    assert second.returncode == 0, second.stdout + second.stderr
    # The probe's sha1 of the template and of the content equals what the modules wrote: nothing runs.
    assert {task: outcomes(tmp_path)[task] for task in GATED_TASKS} == dict.fromkeys(GATED_TASKS, "skipped")
    assert "changed=0" in second.stdout

    node = tmp_path / "node"
    written = (node / "etc" / "unit.conf").read_bytes()
    (node / "etc" / "unit.conf").write_bytes(written + b"# edited by hand\n")
    (node / "etc" / "static").chmod(0o666)
    (node / "current").unlink()
    (node / "current").symlink_to(node)
    check = ansible_playbook(tmp_path, gated, "--check", "--diff")
    assert check.returncode == 0, check.stdout + check.stderr
    assert {task: outcomes(tmp_path)[task] for task in GATED_TASKS} == {
        "Write the templated file": "changed", "Write the static file": "changed", "Create the directory": "skipped",
        "Point the link": "changed"}
    assert "# edited by hand" in check.stdout  # the diff shows what would go
    assert (node / "etc" / "unit.conf").read_bytes().endswith(b"# edited by hand\n")  # check mode wrote nothing

    repair = ansible_playbook(tmp_path, gated)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert (node / "etc" / "unit.conf").read_bytes() == written
    assert oct((node / "etc" / "static").stat().st_mode & 0o777) == "0o644"
    assert os.readlink(node / "current") == str(node / "etc")
    again = ansible_playbook(tmp_path, gated)
    assert {task: outcomes(tmp_path)[task] for task in GATED_TASKS} == dict.fromkeys(GATED_TASKS, "skipped")
    assert "changed=0" in again.stdout


def _probe(**sections) -> dict:
    return {"changed": False, **sections}


def test_file_rules_say_converged_only_on_an_exact_match():
    entry = {"exists": True, "isreg": True, "isdir": False, "islnk": False, "mode": "0644", "uid": 0, "gid": 0,
             "pw_name": "root", "gr_name": "root", "checksum": "abc", "resolves": True}
    probe = _probe(paths={"/f": entry})
    assert converged.probe_file_converged(probe, "/f", "abc", "0644", "root", "root")
    assert converged.probe_file_converged(probe, "/f", "abc", "644", "0", "0")  # numbers as the task may give them
    assert converged.probe_file_converged(probe, "/f")  # nothing asked but a regular file
    for wrong in ({"sha1": "abd"}, {"mode": "0600"}, {"owner": "nobody"}, {"group": "adm"}, {"mode": "u=rw"}):
        assert not converged.probe_file_converged(probe, "/f", **{"sha1": "abc", **wrong})
    for changed in ({"islnk": True}, {"isreg": False}, {"exists": False}, {"checksum": None}):
        assert not converged.probe_file_converged(_probe(paths={"/f": {**entry, **changed}}), "/f", "abc")
    assert not converged.probe_file_converged(probe, "/other", "abc")
    for no_answer in (None, {}, {"skipped": True}, {"failed": True, "paths": {"/f": entry}}):
        assert not converged.probe_file_converged(no_answer, "/f", "abc")


def test_directory_link_and_absence_rules():
    directory = {"exists": True, "isdir": True, "islnk": False, "mode": "0700", "pw_name": "root", "gr_name": "root",
                 "uid": 0, "gid": 0}
    link = {"exists": True, "isdir": False, "islnk": True, "mode": "0777", "pw_name": "root", "gr_name": "root",
            "uid": 0, "gid": 0, "lnk_target": "/opt/current/venv"}
    probe = _probe(paths={"/d": directory, "/l": link, "/gone": {"exists": False}})
    assert converged.probe_dir_converged(probe, "/d", "0700", "root", "root")
    assert not converged.probe_dir_converged(probe, "/d", "0755", "root", "root")
    assert not converged.probe_dir_converged(probe, "/l")  # a link to a directory is never the directory
    assert converged.probe_link_converged(probe, "/l", "/opt/current/venv", "root", "root")
    assert not converged.probe_link_converged(probe, "/l", "/opt/current/venv/")
    assert not converged.probe_link_converged(probe, "/d", "/opt/current/venv")
    assert converged.probe_absent(probe, "/gone")
    assert not converged.probe_absent(probe, "/d")
    assert not converged.probe_absent(probe, "/not-probed")  # unknown is not absent


def test_package_unit_and_account_rules():
    probe = _probe(packages={"nftables": "1.0.6-2", "rsync": ""},
                   units={"a.service": {"load": "loaded", "active": "active", "enabled": "enabled"},
                          "s.service": {"load": "loaded", "active": "active", "enabled": "static"},
                          "off.service": {"load": "loaded", "active": "inactive", "enabled": "disabled"},
                          "rt.service": {"load": "loaded", "active": "active", "enabled": "enabled-runtime"},
                          "m.service": {"load": "masked", "active": "inactive", "enabled": "masked"}},
                   users={"vllm": {"exists": True, "group": "vllm", "home": "/var/lib/twinspark",
                                   "shell": "/usr/sbin/nologin"}, "gone": {"exists": False}},
                   groups={"vllm": {"exists": True, "gid": 990}, "gone": {"exists": False}})
    assert converged.probe_packages_missing(probe, ["nftables", "rsync", "not-asked"]) == ["rsync", "not-asked"]
    assert converged.probe_packages_missing({"skipped": True}, ["nftables"]) == ["nftables"]
    assert converged.probe_unit_converged(probe, "a.service", enabled=True, started=True)
    assert converged.probe_unit_converged(probe, "s.service", enabled=True, started=True)
    assert not converged.probe_unit_converged(probe, "off.service", enabled=True)
    assert not converged.probe_unit_converged(probe, "off.service", started=True)
    assert not converged.probe_unit_converged(probe, "rt.service", enabled=True)  # the module makes it permanent
    assert converged.probe_unit_converged(probe, "m.service", enabled=False, masked=True)
    assert not converged.probe_unit_converged(probe, "a.service", enabled=False, masked=True)
    assert not converged.probe_unit_converged(probe, "m.service", enabled=True)
    assert converged.probe_user_converged(probe, "vllm", "vllm", "/var/lib/twinspark", "/usr/sbin/nologin")
    assert not converged.probe_user_converged(probe, "vllm", "vllm", "/home/vllm")
    assert not converged.probe_user_converged(probe, "vllm", shell="/bin/sh")
    assert not converged.probe_user_converged(probe, "gone")
    assert converged.probe_group_converged(probe, "vllm")
    assert not converged.probe_group_converged(probe, "gone")
    assert not converged.probe_group_converged(probe, "never-asked")


def test_the_controller_sha1_of_a_file(tmp_path):
    wheel = tmp_path / "twinspark-0.1.0-py3-none-any.whl"
    wheel.write_bytes(os.urandom(3 << 20))
    assert converged.file_sha1(wheel) == hashlib.sha1(wheel.read_bytes()).hexdigest()  # noqa: S324
    assert converged.file_sha256(wheel) == hashlib.sha256(wheel.read_bytes()).hexdigest()


@pytest.mark.slow(4)
def test_the_module_reads_small_texts_and_paths_in_each_accounts_home(tmp_path):
    node = tmp_path / "node"
    node.mkdir()
    (node / "key.pub").write_text("ssh-ed25519 AAAA test@host\n")
    (node / "link.pub").symlink_to(node / "key.pub")
    (node / "big").write_bytes(b"x" * 2048)
    (node / "binary").write_bytes(b"\xff\xfe\x00")
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    probed = probe_once(tmp_path, f"""\
        contents: ["{{{{ root }}}}/key.pub", "{{{{ root }}}}/link.pub", "{{{{ root }}}}/big", "{{{{ root }}}}/binary",
                   "{{{{ root }}}}/absent"]
        users: [{ME}, twinspark-no-such-user]
        home_paths: [twinspark-no-such-file]
        checksum_limit: 1024""")
    # Only the regular file within the limit that reads as text; a link is never followed.
    assert probed["contents"] == {f"{node}/key.pub": "ssh-ed25519 AAAA test@host\n"}
    assert probed["paths"][f"{node}/link.pub"]["islnk"] and probed["paths"][f"{node}/absent"] == {"exists": False}
    assert converged.probe_text(probed, f"{node}/key.pub") == "ssh-ed25519 AAAA test@host\n"
    assert converged.probe_text(probed, f"{node}/big") is None
    # home_paths: read below the home of each account that exists, as paths.
    assert probed["paths"][f"{home}/twinspark-no-such-file"] == {"exists": False}
    assert isinstance(probed["users"][ME]["password_star"], bool)
    assert probed["users"]["twinspark-no-such-user"] == {"exists": False}


LINE_ROLE = """
- name: Read the keys file
  twinspark_probe:
    contents: ["{{ root }}/authorized_keys"]
  register: line_probe

- name: Authorise the key
  ansible.builtin.lineinfile:
    path: "{{ root }}/authorized_keys"
    regexp: " line-marker$"
    line: "{{ line_wanted }}"
    create: true
    mode: "0600"
  when: not (line_probe | twinspark_probe_line(root ~ '/authorized_keys', ' line-marker$', line_wanted, '0600'))

- name: Remove the legacy key
  ansible.builtin.lineinfile:
    path: "{{ root }}/authorized_keys"
    regexp: " line-legacy$"
    state: absent
  when: not (line_probe | twinspark_probe_line_absent(root ~ '/authorized_keys', ' line-legacy$'))
"""


@pytest.mark.slow(50)
def test_lineinfile_gated_on_the_probe_runs_exactly_when_lineinfile_would_change_something(tmp_path):
    (tmp_path / "node").mkdir()
    (tmp_path / "roles" / "lines" / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "lines" / "tasks" / "main.yml").write_text(LINE_ROLE)
    playbook = tmp_path / "lines.yml"
    playbook.write_text("- name: Lines\n  hosts: localhost\n  gather_facts: false\n  vars:\n"
                        "    line_wanted: restrict ssh-ed25519 AAAA line-marker\n  roles: [lines]\n")
    keys = tmp_path / "node" / "authorized_keys"
    tasks = ["Authorise the key", "Remove the legacy key"]

    first = ansible_playbook(tmp_path, playbook)
    assert first.returncode == 0, first.stdout + first.stderr
    assert [outcomes(tmp_path)[task] for task in tasks] == ["changed", "skipped"]  # no file: nothing to remove
    assert keys.read_text() == "restrict ssh-ed25519 AAAA line-marker\n"

    again = ansible_playbook(tmp_path, playbook)
    assert [outcomes(tmp_path)[task] for task in tasks] == ["skipped", "skipped"] and "changed=0" in again.stdout

    # Drift the probe must see: an older line with the marker after the right one, a legacy key, no final newline.
    for drifted in ("restrict ssh-ed25519 AAAA line-marker\nold ssh-ed25519 BBBB line-marker\n",
                    "restrict ssh-ed25519 AAAA line-marker\nssh-ed25519 CCCC line-legacy\n",
                    "restrict ssh-ed25519 AAAA line-marker"):
        keys.write_text(drifted)
        ansible_playbook(tmp_path, playbook)
        assert "changed" in [outcomes(tmp_path)[task] for task in tasks], drifted
        ansible_playbook(tmp_path, playbook)
        assert [outcomes(tmp_path)[task] for task in tasks] == ["skipped", "skipped"], keys.read_text()
    keys.chmod(0o644)
    ansible_playbook(tmp_path, playbook)
    assert outcomes(tmp_path)["Authorise the key"] == "changed" and keys.stat().st_mode & 0o777 == 0o600


def test_line_user_and_text_rules():
    entry = {"exists": True, "isreg": True, "islnk": False, "mode": "0644", "uid": 0, "gid": 0, "pw_name": "root",
             "gr_name": "root"}
    text = "a x-marker\nkeep\nb x-marker\n"
    probe = _probe(paths={"/k": entry, "/gone": {"exists": False}}, contents={"/k": text})
    assert converged.probe_line_converged(probe, "/k", " x-marker$", "b x-marker", "0644", "root", "root")
    assert not converged.probe_line_converged(probe, "/k", " x-marker$", "a x-marker")  # lineinfile edits the last
    assert not converged.probe_line_converged(probe, "/k", " x-marker$", "b x-marker", "0600")
    assert not converged.probe_line_converged(probe, "/k", " y-marker$", "b y-marker")  # no match: it would append
    assert not converged.probe_line_converged(probe, "/gone", " x-marker$", "b x-marker")
    unread = _probe(paths={"/k": entry}, contents={})
    assert not converged.probe_line_converged(unread, "/k", " x-marker$", "b x-marker")
    assert converged.probe_line_absent(probe, "/k", " y-marker$")
    assert not converged.probe_line_absent(probe, "/k", " x-marker$")
    assert converged.probe_line_absent(probe, "/gone", " x-marker$")
    assert not converged.probe_line_absent(unread, "/k", " y-marker$")
    assert not converged.probe_line_absent(probe, "/never-read", " y-marker$")
    assert converged.probe_text({"skipped": True, "contents": {"/k": text}}, "/k") is None
    users = _probe(users={"sync": {"exists": True, "group": "sync", "home": "/h", "shell": "/bin/sh",
                                   "password_star": True},
                          "open": {"exists": True, "group": "open", "home": "/h", "shell": "/bin/sh",
                                   "password_star": False}})
    assert converged.probe_user_converged(users, "sync", "sync", "/h", "/bin/sh", password_star=True)
    assert not converged.probe_user_converged(users, "open", "open", "/h", "/bin/sh", password_star=True)
    assert converged.probe_user_converged(users, "open", "open", "/h", "/bin/sh")


def test_a_probe_listing_in_finds_shape():
    entry = {"exists": True, "isdir": True, "islnk": False, "uid": 0}
    probe = _probe(paths={"/s/models": entry, "/s/cache": {**entry, "islnk": True, "isdir": False},
                          "/s/cache/home": entry, "/s/gone": {"exists": False}, "/t": entry})
    found = converged.probe_find(probe, "/s/")
    assert [row["path"] for row in found["files"]] == ["/s/cache", "/s/models"]  # directly in /s, existing
    # The rules that take a find read it as they read find's own answer.
    assert [row["item"] for row in converged.entries_present(["models", "cache", "hf"], "/s", found["files"])] == [
        "models", "cache"]
    assert converged.probe_find({"skipped": True}, "/s") == {"skipped": True}
    assert converged.probe_find(None, "/s") == {"skipped": True}
