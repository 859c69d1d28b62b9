"""scripts/build-twinspark-wheel: the same sources give the same wheel bytes, so nodes reinstall only on change."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-twinspark-wheel"


@pytest.mark.slow(10)
def test_two_builds_of_the_same_sources_are_byte_identical(tmp_path):
    source = tmp_path / "repo"
    (source / "scripts").mkdir(parents=True)
    shutil.copy2(SCRIPT, source / "scripts")
    shutil.copytree(
        REPO / "python_tools", source / "python_tools", ignore=shutil.ignore_patterns("tests", "*.egg-info")
    )
    script = source / "scripts" / SCRIPT.name
    (source / "python_tools" / "build" / "lib" / "twinspark").mkdir(parents=True)
    (source / "python_tools" / "build" / "lib" / "twinspark" / "deleted_module.py").write_text("stale = True\n")

    first = subprocess.run(
        [str(script), str(tmp_path / "a"), sys.executable], capture_output=True, text=True, check=True, timeout=600
    ).stdout.strip()
    second = subprocess.run(
        [str(script), str(tmp_path / "b"), sys.executable], capture_output=True, text=True, check=True, timeout=600
    ).stdout.strip()
    first_bytes, second_bytes = Path(first).read_bytes(), Path(second).read_bytes()
    assert hashlib.sha256(first_bytes).hexdigest() == hashlib.sha256(second_bytes).hexdigest()
    names = zipfile.ZipFile(first).namelist()
    assert "twinspark/patching.py" in names
    assert "twinspark/deleted_module.py" not in names, "a stale build/ folder leaked into the wheel"
    assert (source / "python_tools" / "devtools" / "yardstick.py").is_file()
    shipped = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert shipped == {"twinspark"}, f"only the twinspark package ships to the nodes, not {shipped - {'twinspark'}}"

    (source / "python_tools" / "twinspark" / "patching.py").write_text("# changed\n", encoding="utf-8")
    third = subprocess.run(
        [str(script), str(tmp_path / "a"), sys.executable], capture_output=True, text=True, check=True, timeout=600
    ).stdout.strip()
    assert Path(third).read_bytes() != first_bytes
