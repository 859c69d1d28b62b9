"""The fork flavour's install path: the inventory's pinned wheels, the requirements the role renders from them,
and the real `pip install --no-index --require-hashes` the role runs, against two tiny wheels built here."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import jinja2
import localplay
import pytest
import yaml

from twinspark import wheelhouse

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "vllm_runtime"


def filters():
    spec = importlib.util.spec_from_file_location("twinspark_wheelhouse_filters",
                                                  ROOT / "filter_plugins" / "twinspark_wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(directory: Path, name: str, version: str, requires: list[str] = ()) -> Path:
    """A minimal pure-Python wheel (stored, not compressed), written as a zip the way a wheel builder would."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{info}/METADATA": "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                     *(f"Requires-Dist: {r}\n" for r in requires),
                                     "Summary: a throwaway wheel for the fork-flavour test\n"]).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: twinspark-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},sha256={_b64(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pip_argv(venv_python: Path, wheel_dir: Path, requirements: Path) -> list[str]:
    """The role's own install command (tasks/fork.yml), rendered with jinja2 for this venv and wheelhouse."""
    tasks = yaml.safe_load((ROLE / "tasks" / "fork.yml").read_text())
    install = next(t for t in tasks if t["name"].startswith("Install the fork offline"))
    values = {"vllm_runtime_venv_python": str(venv_python), "vllm_runtime_fork_wheelhouse": str(wheel_dir),
              "vllm_runtime_fork_requirements": str(requirements)}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    return [env.from_string(str(item)).render(values) for item in install["ansible.builtin.command"]["argv"]]


GOOD = "0" * 63 + "a"


def test_wheel_names_give_distribution_and_version():
    assert wheelhouse.wheel_name_version("vllm-0.33.0+dspark.1-cp312-cp312-linux_aarch64.whl") == (
        "vllm", "0.33.0+dspark.1")
    assert wheelhouse.wheel_name_version("Flash_Attn-2.8.0-1-cp312-cp312-linux_aarch64.whl") == (
        "flash-attn", "2.8.0")
    with pytest.raises(ValueError, match="not a wheel file name"):
        wheelhouse.wheel_name_version("vllm-0.33.0.tar.gz")


def test_inventory_problems_name_the_variable_and_the_fix():
    problem = filters()["twinspark_fork_wheel_problems"]
    assert problem([{"file": "vllm-0.33.0-py3-none-any.whl", "sha256": GOOD}]) == []
    assert "vllm_runtime_fork_wheels must be a non-empty list" in problem([])[0]
    assert "vllm_runtime_fork_wheels must be a non-empty list" in problem("vllm.whl")[0]
    [line] = problem([{"file": "vllm-0.33.0-py3-none-any.whl", "sha256": "TODO"}])
    assert line.startswith("vllm_runtime_fork_wheels[0].sha256") and "sha256sum vllm-0.33.0-py3-none-any.whl" in line
    [line] = problem([{"file": "/srv/vllm-0.33.0-py3-none-any.whl", "sha256": GOOD}])
    assert "vllm_runtime_fork_wheels[0].file" in line and "no directory" in line
    [line] = problem([{"file": "torch-2.10.0-py3-none-any.whl", "sha256": GOOD}])
    assert "exactly one vllm wheel" in line
    [line] = problem([{"file": "vllm-0.33.0-py3-none-any.whl"}])
    assert "exactly the keys file and sha256" in line


def test_requirements_pin_each_distribution_with_every_hash():
    render = filters()["twinspark_fork_requirements"]
    text = render([{"file": "vllm-0.33.0+f1-cp312-cp312-linux_aarch64.whl", "sha256": "b" * 64},
                   {"file": "vllm-0.33.0+f1-cp312-cp312-linux_x86_64.whl", "sha256": "a" * 64},
                   {"file": "forkdep-1.0-py3-none-any.whl", "sha256": "c" * 64}])
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body == ["forkdep==1.0 \\", f"    --hash=sha256:{'c' * 64}",
                    "vllm==0.33.0+f1 \\", f"    --hash=sha256:{'a' * 64} \\", f"    --hash=sha256:{'b' * 64}"]


def test_fork_runtime_names_the_patch_target():
    runtime = filters()["twinspark_fork_runtime"]
    assert runtime([{"file": "forkdep-1.0-py3-none-any.whl", "sha256": GOOD},
                    {"file": "vllm-0.33.0+dspark.1-py3-none-any.whl", "sha256": GOOD}]) == {
        "distribution": "vllm", "version": "0.33.0+dspark.1", "target": "vllm-0.33.0+dspark.1"}
    assert runtime([])["version"] == ""


@pytest.fixture
def wheels(tmp_path: Path) -> tuple[Path, list[dict]]:
    wheel_dir = tmp_path / "fork-wheels"
    wheel_dir.mkdir()
    fork = build_wheel(wheel_dir, "vllm", "0.33.0+fork.1", ["forkdep==1.0"])
    dep = build_wheel(wheel_dir, "forkdep", "1.0")
    return wheel_dir, [{"file": fork.name, "sha256": sha256(fork)}, {"file": dep.name, "sha256": sha256(dep)}]


def test_hash_check_names_the_wheel_and_both_hashes(wheels):
    wheel_dir, pinned = wheels
    mismatches = filters()["twinspark_fork_hash_mismatches"]

    def stat_results():  # the shape ansible.builtin.stat registers over a loop, with checksum_algorithm sha256
        return [{"item": entry, "stat": {"exists": (wheel_dir / entry["file"]).exists(), "isreg": True,
                                         "checksum": sha256(wheel_dir / entry["file"])
                                         if (wheel_dir / entry["file"]).exists() else None}}
                for entry in pinned]

    assert mismatches(pinned, stat_results(), str(wheel_dir)) == []
    dep = wheel_dir / pinned[1]["file"]
    dep.write_bytes(dep.read_bytes()[:-1] + bytes([dep.read_bytes()[-1] ^ 1]))
    [line] = mismatches(pinned, stat_results(), str(wheel_dir))
    assert line.startswith(f"{dep}: sha256 is {sha256(dep)}, vllm_runtime_fork_wheels pins {pinned[1]['sha256']}")
    dep.unlink()
    [line] = mismatches(pinned, stat_results(), str(wheel_dir))
    assert line.startswith(f"{dep}: missing")


def _installed(venv_python: Path) -> str:
    return subprocess.run(
        [str(venv_python), "-c", "import importlib.metadata as m; print(sorted((d.metadata['Name'], d.version) "
         "for d in m.distributions() if d.metadata['Name'] in ('vllm', 'forkdep')))"],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip()


@pytest.mark.slow(25)
def test_role_install_takes_the_pinned_wheels_and_refuses_a_flipped_byte(wheels, tmp_path):
    wheel_dir, pinned = wheels
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=180)
    python = venv / "bin" / "python"
    requirements = tmp_path / "fork-requirements.txt"
    requirements.write_text(filters()["twinspark_fork_requirements"](pinned))
    argv = pip_argv(python, wheel_dir, requirements)
    assert {"--no-index", "--require-hashes"} <= set(argv) and argv[argv.index("--find-links") + 1] == str(wheel_dir)

    def install() -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=180)

    # One byte of the dependency flipped: pip installs nothing and names the wheel with both hashes.
    dep = wheel_dir / pinned[1]["file"]
    original = dep.read_bytes()
    at = original.index(b"Summary: a throwaway") + len(b"Summary: ")
    dep.write_bytes(original[:at] + b"A" + original[at + 1:])
    refused = install()
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert "DO NOT MATCH THE HASHES" in output and dep.name in output
    assert pinned[1]["sha256"] in output and sha256(dep) in output
    assert _installed(python) == "[]"

    # A wheel left out of the pins: --require-hashes refuses the whole set.
    dep.write_bytes(original)
    requirements.write_text(filters()["twinspark_fork_requirements"](pinned[:1]))
    unlisted = install()
    assert unlisted.returncode != 0 and "forkdep" in unlisted.stdout + unlisted.stderr
    assert _installed(python) == "[]"

    requirements.write_text(filters()["twinspark_fork_requirements"](pinned))
    done = install()
    assert done.returncode == 0, done.stdout + done.stderr
    assert _installed(python) == "[('forkdep', '1.0'), ('vllm', '0.33.0+fork.1')]"


def run_role(step: str, work_dir: Path, wheel_dir: Path, venv_dir: Path, fork_wheels) -> tuple[int, str, dict]:
    """tests/playbooks/vllm_runtime_fork.yml on localhost (local connection, throwaway paths); (rc, output, recap)."""
    extra = {"step": step, "work_dir": str(work_dir), "wheel_dir": str(wheel_dir), "venv_dir": str(venv_dir),
             "fork_wheels": fork_wheels, "ansible_python_interpreter": sys.executable}
    return localplay.run("vllm_runtime_fork.yml", extra)


@pytest.mark.slow(5)
def test_role_preflight_refuses_bad_fork_input_naming_the_variable(tmp_path):
    rc, output, _ = run_role("preflight", tmp_path, tmp_path / "wheels", tmp_path / "venv",
                             [{"file": "vllm-0.33.0-py3-none-any.whl", "sha256": "TODO"}])
    assert rc != 0
    assert "vllm_runtime_fork_wheels[0].sha256 must be the wheel's sha256" in output


@pytest.mark.slow(55)
def test_role_installs_the_fork_once_and_refuses_a_changed_wheel(wheels, tmp_path):
    wheel_dir, pinned = wheels
    venv = tmp_path / "runtimes" / "vllm-0.33.0+fork.1-aaaaaaaaaaaa" / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=180)
    python = venv / "bin" / "python"
    work = tmp_path / "work"
    work.mkdir()

    rc, output, counts = run_role("install", work, wheel_dir, venv, pinned)
    assert rc == 0, output[-4000:]
    assert _installed(python) == "[('forkdep', '1.0'), ('vllm', '0.33.0+fork.1')]"
    assert "--require-hashes" in (work / "fork-requirements.txt").read_text() or \
        "--hash=sha256:" + pinned[0]["sha256"] in (work / "fork-requirements.txt").read_text()
    # Installed into a runtime of its own, which no rank runs yet: staging asks for no restart (the switch does).
    assert not (work / "restart-pending").exists()
    assert counts["changed"] >= 3

    rc, output, counts = run_role("install", work, wheel_dir, venv, pinned)
    assert rc == 0 and counts["changed"] == 0, output[-4000:]  # converged: nothing installed, nothing marked
    assert not (work / "restart-pending").exists()

    dep = wheel_dir / pinned[1]["file"]
    dep.write_bytes(dep.read_bytes()[:-1] + bytes([dep.read_bytes()[-1] ^ 1]))
    rc, output, counts = run_role("install", work, wheel_dir, venv, pinned)
    assert rc != 0 and counts["failed"] == 1
    assert f"{dep}: sha256 is {sha256(dep)}, vllm_runtime_fork_wheels pins {pinned[1]['sha256']}" in output
    assert "Nothing was installed" in output and "Install the fork offline" not in output


def test_inventory_validation_checks_the_fork_wheels_before_any_host_is_touched():
    """playbooks/validate.yml's filter (controller only) reports unusable fork wheels, naming the variable."""
    from test_serve_env_role import inventory_vars, load_filters

    hostvars, groups = inventory_vars(ROOT / "inventory" / "example")
    head, worker = groups["twinspark_head"][0], groups["twinspark_worker"][0]

    def with_fork(wheels) -> dict:
        return {**hostvars, **{host: {**hostvars[host], "twinspark_runtime_flavour": "fork",
                                      "vllm_runtime_fork_wheels": wheels} for host in (head, worker)}}

    problems = load_filters().twinspark_pair_problems
    assert problems(with_fork([{"file": "vllm-0.33.0+f1-cp312-cp312-linux_aarch64.whl", "sha256": GOOD}]),
                    groups) == []
    assert problems(with_fork([]), groups) == [
        f"{head}, {worker}: vllm_runtime_fork_wheels must be a non-empty list of {{file: NAME.whl, sha256: HEX}}, "
        "one per wheel of the fork's wheelhouse (sha256sum *.whl prints both)"]
    # Under stock the list is not read at all.
    assert problems({**hostvars, head: {**hostvars[head], "vllm_runtime_fork_wheels": "junk"}}, groups) == []
