"""Role model_cache's caches.yml, run for real on localhost with throwaway paths: a converged run changes nothing and
visits no cache (one find instead of one round trip per cache), --check reports exactly the caches a run fixes, and a
run puts back a cache's mode, owner or a removed cache."""

from __future__ import annotations

import os
import pwd
import re
import sys
from pathlib import Path

import localplay
import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHES = ("vllm", "tilelang", "flashinfer", "inductor")


def _caches(work: Path, *options: str) -> tuple[int, str, dict]:
    extra = {"work_dir": str(work), "owner": "nobody", "ansible_python_interpreter": sys.executable}
    return localplay.run("model_cache_caches.yml", extra, *options)


@pytest.mark.slow(45)
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
