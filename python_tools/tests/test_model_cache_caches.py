"""Role model_cache's caches.yml, run for real on localhost with throwaway paths: a converged run changes nothing and
visits no cache (one find instead of one round trip per cache), --check reports exactly the caches a run fixes, and a
run puts back a cache's mode, owner or a removed cache."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
CACHES = ("vllm", "tilelang", "flashinfer", "inductor")


def _caches(work: Path, *options: str) -> tuple[int, str, dict]:
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK} not installed (pip install the controller extras)")
    extra = {"work_dir": str(work), "owner": "nobody", "ansible_python_interpreter": sys.executable}
    done = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local",
         str(Path(__file__).parent / "playbooks" / "model_cache_caches.yml"), "-e", json.dumps(extra), *options],
        cwd=ROOT, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    recap = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", output)
    counts = dict(zip(("ok", "changed", "failed"), map(int, recap.groups()), strict=True)) if recap else {}
    return done.returncode, output, counts


@pytest.mark.skipif(os.geteuid() != 0, reason="the role gives the caches to another account (owner: nobody)")
def test_caches_converge_and_a_changed_cache_is_seen_and_fixed(tmp_path):
    nobody = pwd.getpwnam("nobody")
    rc, output, counts = _caches(tmp_path)
    assert rc == 0 and counts["changed"] == 3, output[-4000:]  # control dir, root, caches
    for name in CACHES:
        st = (tmp_path / "cache" / name).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (nobody.pw_uid, nobody.pw_gid, 0o750), name

    rc, output, counts = _caches(tmp_path)
    assert rc == 0 and counts["changed"] == 0, output[-4000:]
    assert "item=" not in output  # converged: the loop visits no cache

    (tmp_path / "cache" / "vllm").chmod(0o755)
    os.chown(tmp_path / "cache" / "flashinfer", 0, 0)
    (tmp_path / "cache" / "inductor").rmdir()
    rc, output, counts = _caches(tmp_path, "--check")
    assert rc == 0 and counts["changed"] == 1, output[-4000:]  # one task, its changed items named below
    assert sorted(re.findall(r"changed: \[localhost\] => \(item=(\w+)\)", output)) == ["flashinfer", "inductor",
                                                                                        "vllm"], output[-4000:]
    assert (tmp_path / "cache" / "vllm").stat().st_mode & 0o777 == 0o755  # --check wrote nothing
    rc, output, counts = _caches(tmp_path)
    assert rc == 0 and counts["changed"] == 1, output[-4000:]
    for name in CACHES:
        st = (tmp_path / "cache" / name).stat()
        assert (st.st_uid, st.st_mode & 0o777) == (nobody.pw_uid, 0o750), name
    rc, output, counts = _caches(tmp_path)
    assert rc == 0 and counts["changed"] == 0, output[-4000:]
