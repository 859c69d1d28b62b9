"""The real vLLM files the patches touch, straight from the wheels (a session fixture shared by test modules).

Wheels come from $TWINSPARK_WHEEL_CACHE (default /var/tmp/twinspark-wheels); scripts/fetch-test-wheels fills it
when a wheel is missing. Only the patched files and the dist-info METADATA are unpacked: a small but real
site-packages per target.
"""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
TARGETS = sorted(p.parent.name for p in PATCHES.glob("*/manifest.yml"))
WHEEL_CACHE = Path(os.environ.get("TWINSPARK_WHEEL_CACHE", "/var/tmp/twinspark-wheels"))


def manifest(target: str) -> dict:
    return yaml.safe_load((PATCHES / target / "manifest.yml").read_text())


def wheel(target: str) -> Path:
    distribution, version = target.rsplit("-", 1)
    pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
    found = sorted(WHEEL_CACHE.glob(pattern))
    if not found:
        subprocess.run([str(REPO / "scripts" / "fetch-test-wheels")], check=True, timeout=900)
        found = sorted(WHEEL_CACHE.glob(pattern))
    assert found, f"no {pattern} in {WHEEL_CACHE} after scripts/fetch-test-wheels"
    return found[0]


@pytest.fixture(scope="session", name="pristine")
def pristine_fixture(tmp_path_factory) -> dict[str, Path]:
    """target -> a site-packages holding the original files the target's patches touch, straight from the wheel."""
    trees = {}
    for target in TARGETS:
        distribution, version = target.rsplit("-", 1)
        wanted = {f["path"] for p in manifest(target)["patches"] for f in p["files"]}
        wanted.add(f"{distribution.replace('-', '_')}-{version}.dist-info/METADATA")
        root = tmp_path_factory.mktemp(target)
        with zipfile.ZipFile(wheel(target)) as archive:
            for name in wanted:
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_bytes(archive.read(name))
        trees[target] = root
    return trees
