"""The per-task timing callback (callback_plugins/twinspark_timing.py) through a real ansible-playbook run on
localhost, and what devtools.taskprofile and scripts/bench/rerun-profile make of its record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import taskprofile

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "scripts" / "bench" / "rerun-profile"


def row(task: str, seconds: float, hosts: dict[str, str], play: str = "p", role: str = "") -> str:
    return json.dumps({"play": play, "role": role, "task": task, "seconds": seconds, "hosts": hosts})


def test_records_are_read_and_a_bad_line_is_named_with_its_number():
    rows = taskprofile.read_records([row("a", 1.5, {"n1": "ok"}), "", row("b", 0.25, {})], "rec")
    assert [(r.task, r.seconds, r.outcome()) for r in rows] == [("a", 1.5, "ok"), ("b", 0.25, "none")]
    with pytest.raises(ValueError, match=r"^rec: line 2 is not a twinspark_timing record"):
        taskprofile.read_records([row("a", 1, {}), '{"play": "p"}'], "rec")


def test_a_task_reports_the_worst_outcome_of_its_hosts():
    hosts = {"n1": "skipped", "n2": "ok"}
    assert taskprofile.TaskTime("p", "", "t", 1, hosts).outcome() == "ok"
    assert taskprofile.TaskTime("p", "", "t", 1, {**hosts, "n3": "changed"}).outcome() == "changed"
    assert taskprofile.TaskTime("p", "", "t", 1, {"n1": "skipped"}).outcome() == "skipped"


def test_recap_counts_sum_every_host_and_only_the_recap():
    out = ("TASK [x] changed=9\nPLAY RECAP ***\n"
           "node1 : ok=10 changed=1 unreachable=0 failed=0 skipped=4 rescued=0 ignored=0\n"
           "node2 : ok=7  changed=0 unreachable=0 failed=1 skipped=2 rescued=0 ignored=1\n")
    assert taskprofile.recap_counts(out) == {"ok": 17, "changed": 1, "unreachable": 0, "failed": 1, "skipped": 6,
                                             "rescued": 0, "ignored": 1}
    assert taskprofile.recap_counts("no recap here") == {}


def test_the_summary_ranks_plays_roles_and_tasks_slowest_first():
    rows = taskprofile.read_records([
        row("fast", 0.5, {"n1": "ok"}, "play A", "r1"),
        row("slow", 4.0, {"n1": "ok"}, "play B", "r2"),
        row("skip", 1.0, {"n1": "skipped"}, "play A", "r1"),
    ])
    lines = taskprofile.summary(rows, top=2)
    assert lines[0] == "3 tasks, 5.5 s in tasks"
    plays = lines[lines.index("== per play") + 1:lines.index("== per play") + 3]
    assert plays == ["    4.0 s    1 tasks  play B", "    1.5 s    2 tasks  play A"]
    assert "== skipped on every host: 1 tasks, 1.0 s" in lines
    assert lines[-3:] == ["== slowest 2 tasks", "   4.00 s  ok        r2 : slow", "   1.00 s  skipped   r1 : skip"]


def run_playbook(tmp_path: Path, record: Path, enabled: bool) -> subprocess.CompletedProcess:
    role_tasks = tmp_path / "roles" / "timed_role" / "tasks"
    role_tasks.mkdir(parents=True)
    (role_tasks / "main.yml").write_text("- name: A role's task\n  ansible.builtin.debug:\n    msg: hi\n")
    playbook = tmp_path / "p.yml"
    playbook.write_text("""
- name: A timed play
  hosts: localhost
  gather_facts: false
  roles:
    - timed_role
  tasks:
    - name: Sleep a little
      ansible.builtin.command: sleep 1.2
      changed_when: false
    - name: Change a file
      ansible.builtin.copy:
        content: "x\\n"
        dest: "{{ out }}"
        mode: "0644"
    - name: Never runs
      ansible.builtin.debug:
        msg: no
      when: false
""")
    return ansible_playbook(tmp_path, playbook, enabled, TWINSPARK_TASK_TIMES=str(record))


def ansible_playbook(tmp_path: Path, playbook: Path, enabled: bool, **env_extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(tmp_path / "roles"),
               ANSIBLE_NOCOLOR="1", **env_extra)
    if enabled:
        env["ANSIBLE_CALLBACKS_ENABLED"] = "twinspark_timing"
    else:
        env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"out={tmp_path / 'out'}", str(playbook)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow(12)
def test_the_callback_records_each_task_with_its_time_and_outcomes(tmp_path):
    record = tmp_path / "times.jsonl"
    done = run_playbook(tmp_path, record, enabled=True)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = taskprofile.read_records(record.read_text().splitlines())
    assert [(r.play, r.role, r.task, r.outcome()) for r in rows][0] == ("A timed play", "timed_role",
                                                                        "A role's task", "ok")
    rows = rows[1:]
    assert all(r.role == "" for r in rows)
    assert [(r.play, r.task, r.outcome()) for r in rows] == [
        ("A timed play", "Sleep a little", "ok"),
        ("A timed play", "Change a file", "changed"),
        ("A timed play", "Never runs", "skipped"),
    ]
    assert rows[0].seconds >= 1.2  # the sleep is inside the task's span
    assert all(r.hosts == {"localhost": r.outcome()} for r in rows)


@pytest.mark.slow(10)
def test_the_callback_writes_nothing_unless_enabled(tmp_path):
    record = tmp_path / "times.jsonl"
    done = run_playbook(tmp_path, record, enabled=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not record.exists()
    assert "time per phase:" not in done.stdout


@pytest.mark.slow(10)
def test_the_callback_sums_the_stage_playbooks_into_the_demos_phases(tmp_path):
    """What scripts/sim/demo keeps for the yardstick (TWINSPARK_PHASE_TIMES) and the table at the end of the run,
    from stage playbooks named as site.yml's are: validate and fabric are both "packages", runtime is its own."""
    (tmp_path / "roles").mkdir()
    for stage, seconds in (("validate", 0), ("fabric", 0), ("runtime", 1.1)):
        (tmp_path / f"{stage}.yml").write_text(
            f"- name: The {stage} stage\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
            f"    - name: Work of {stage}\n      ansible.builtin.command: sleep {seconds}\n"
            f"      changed_when: false\n")
    site = tmp_path / "site.yml"
    site.write_text("".join(f"- name: Stage {s}\n  ansible.builtin.import_playbook: {s}.yml\n"
                            for s in ("validate", "fabric", "runtime")))
    phases_file, tasks_file = tmp_path / "phases.jsonl", tmp_path / "tasks.jsonl"
    done = ansible_playbook(tmp_path, site, True, TWINSPARK_PHASE_TIMES=str(phases_file),
                            TWINSPARK_TASK_TIMES=str(tasks_file))
    assert done.returncode == 0, done.stdout + done.stderr
    phases = [json.loads(line) for line in phases_file.read_text().splitlines()]
    assert [p["phase"] for p in phases] == ["packages", "runtime"]
    assert phases[1]["seconds"] >= 1.1
    assert [r.task for r in taskprofile.read_records(tasks_file.read_text().splitlines())] == [
        "Work of validate", "Work of fabric", "Work of runtime"]
    table = done.stdout[done.stdout.index("time per play:"):].splitlines()
    assert [line.split()[2:] for line in table[1:4]] == [["validate", "The", "validate", "stage"],
                                                         ["fabric", "The", "fabric", "stage"],
                                                         ["runtime", "The", "runtime", "stage"]]
    assert table[4] == "time per phase:" and table[5].split()[2:] == ["packages"]
    assert table[6].split()[2:] == ["runtime"]


def test_rerun_profile_reprints_a_saved_record_and_names_a_bad_one(tmp_path):
    saved = tmp_path / "saved.jsonl"
    saved.write_text(row("slow task", 3.0, {"node1": "ok"}, "Play", "role_a") + "\n")
    done = subprocess.run([sys.executable, str(PROFILE), "--from-record", str(saved), "--top", "1"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "   3.00 s  ok        role_a : slow task"
    saved.write_text("not json\n")
    done = subprocess.run([sys.executable, str(PROFILE), "--from-record", str(saved)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == f"rerun-profile: --from-record {saved}: {saved}: line 1 is not a " \
        "twinspark_timing record (Expecting value: line 1 column 1 (char 0))"


def test_rerun_profile_refuses_an_inventory_that_is_not_there(tmp_path):
    done = subprocess.run([sys.executable, str(PROFILE), "-i", "inventory/nope", "--record", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--inventory inventory/nope: no such inventory" in done.stderr
    assert not (tmp_path / "r").exists()
