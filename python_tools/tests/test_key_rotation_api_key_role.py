"""`twinspark rotate api-key` (playbooks/rotate.yml -> role serve_env, tasks/rotate_api_key.yml), run for real on this
machine: connection local, the simulated pair's inventory limited to its head, every path under tmp_path. Two
stand-ins take the place of what only a node has: `systemctl` (names a process of the test's own as the head
rank, with or without the digests variable in its environment) and the node's `twinspark` (answers `env check`, and
`apikeys wait` with the exit status the test chooses, after recording the keys it was asked about). The patched
vLLM's side (the digests file reread) is test_auth_patch.py's; the whole thing on a serving pair is
scripts/sim/rotate-check, in CI's fault step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from twinspark import apikeys

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
OLD, NEW = "old-test-only-key", "new-test-only-key"


@pytest.fixture
def head(tmp_path):
    """(tmp_path, run): the head's files under tmp_path and a function running the rotation against them."""
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK} not installed")
    if os.geteuid() != 0:
        pytest.skip("the role writes root-owned files")
    etc, bin_dir = tmp_path / "etc", tmp_path / "bin"
    etc.mkdir()
    bin_dir.mkdir()
    (etc / "serve.env").write_text("SERVED_MODEL_NAME=tiny\n")
    (etc / "secrets.env").write_text(f"VLLM_API_KEY={OLD}\n")
    (etc / "api-keys.sha256").write_text(apikeys.render([OLD]))
    digests = etc / "api-keys.sha256"
    (bin_dir / "twinspark").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        [ "$1" = env ] && exit 0
        cat >> {tmp_path}/asked.jsonl
        cp {digests} {tmp_path}/digests-at-wait-$(wc -l < {tmp_path}/asked.jsonl)
        [ "$(cat {tmp_path}/wait-rc 2>/dev/null || echo 0)" = 0 ] && exit 0
        echo "twinspark apikeys wait: after 30 s, key 1 of 2 to be accepted answered 401" >&2; exit 1
        """))
    (bin_dir / "twinspark").chmod(0o755)
    rank = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"],
                                                    "TWINSPARK_VLLM_API_KEY_DIGESTS": str(digests)})
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho {rank.pid}\n")
    (bin_dir / "systemctl").chmod(0o755)

    def run(*extra: str) -> tuple[int, str]:
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
               "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        done = subprocess.run(
            [str(ANSIBLE_PLAYBOOK), "-i", "inventory/sim", "playbooks/rotate.yml", "-l", "localhost,twinspark_head",
             "-e", "ansible_connection=local", "-e", "ansible_become=false",
             "-e", f"ansible_python_interpreter={sys.executable}", "-e", "twinspark_rotate=api-key",
             "-e", f"twinspark_vllm_api_key={NEW}", "-e", "serve_env_group=root",
             "-e", f"twinspark_layout_serve_env={etc}/serve.env",
             "-e", f"twinspark_layout_secrets_env={etc}/secrets.env",
             "-e", f"twinspark_layout_api_key_digests={digests}", "-e", f"twinspark_layout_cli={bin_dir}/twinspark",
             *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
        return done.returncode, done.stdout + done.stderr

    try:
        yield tmp_path, run
    finally:
        rank.kill()
        rank.wait(timeout=10)


def _asked(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "asked.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow(20)
def test_the_new_key_is_accepted_beside_the_old_before_the_old_is_dropped(head):
    tmp_path, run = head
    code, out = run()
    assert code == 0, out[-3000:]
    assert apikeys.parse((tmp_path / "digests-at-wait-1").read_text()) == [apikeys.digest(NEW), apikeys.digest(OLD)]
    assert apikeys.parse((tmp_path / "digests-at-wait-2").read_text()) == [apikeys.digest(NEW)]
    assert _asked(tmp_path) == [{"accept": [NEW, OLD], "refuse": []}, {"accept": [NEW], "refuse": [OLD]}]
    assert f"VLLM_API_KEY={NEW}" in (tmp_path / "etc" / "secrets.env").read_text()
    assert apikeys.parse((tmp_path / "etc" / "api-keys.sha256").read_text()) == [apikeys.digest(NEW)]
    assert NEW not in out and OLD not in out, "a key was printed"


@pytest.mark.slow(20)
def test_a_new_key_vllm_does_not_take_puts_the_old_digests_back_and_changes_nothing_else(head):
    tmp_path, run = head
    (tmp_path / "wait-rc").write_text("1\n")
    code, out = run()
    assert code != 0
    assert "did not take the new key within 30 s (twinspark apikeys wait: after 30 s, key 1 of 2 to be accepted " \
           "answered 401); the old digests were put back" in " ".join(out.split()), out[-3000:]
    assert apikeys.parse((tmp_path / "etc" / "api-keys.sha256").read_text()) == [apikeys.digest(OLD)]
    assert (tmp_path / "etc" / "secrets.env").read_text() == f"VLLM_API_KEY={OLD}\n"
    assert NEW not in out and OLD not in out, "a key was printed"


@pytest.mark.slow(20)
def test_a_head_whose_vllm_cannot_reread_keys_is_refused_before_anything_is_written(head, tmp_path):
    _, run = head
    code, out = run("-e", f"twinspark_layout_api_key_digests={tmp_path}/etc/elsewhere.sha256")
    assert code != 0
    assert "the running vLLM was started before it could take keys without a restart" in " ".join(out.split())
    assert not (tmp_path / "asked.jsonl").exists() and not (tmp_path / "etc" / "elsewhere.sha256").exists()
    assert (tmp_path / "etc" / "secrets.env").read_text() == f"VLLM_API_KEY={OLD}\n"


def test_on_a_fleet_the_pairs_add_before_the_router_and_the_router_drops_before_the_pairs():
    """playbooks/rotate.yml's order for the API key where a router fronts the pairs: a client that moved to the new key
    must be taken everywhere before any old-key client is refused anywhere."""
    import yaml

    plays = yaml.safe_load((ROOT / "playbooks" / "rotate.yml").read_text())
    steps = []
    for play in plays:
        for task in play.get("tasks", []):
            role = task.get("ansible.builtin.include_role", {})
            if role.get("tasks_from") in ("api_key", "rotate_api_key"):
                phase = task.get("vars", {}).get("key_rotation_api_phase") or task.get("vars", {}).get(
                    "router_rotate_phase") or "as asked"
                steps.append((role["name"], phase))
    assert steps == [("key_rotation", "{{ 'add' if key_rotation_routed | bool else key_rotation_phase }}"),
                     ("router", "add"), ("router", "drop"), ("key_rotation", "drop")]
    pause = [t for p in plays for t in p.get("tasks", []) if "ansible.builtin.pause" in t]
    assert len(pause) == 1 and "key_rotation_grace_s" in pause[0]["ansible.builtin.pause"]["seconds"]
