"""roles/vllm_runtime/files/resolve-wheels.py: the wheel-set resolution the runtime role runs on every node, cached
for a wheelhouse source only, and resolved again when anything in the wheelhouse changes. Real pip (this venv's),
handshaped wheels, no network (--no-index; the index case is refused before pip could reach anything)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_runtime_flow import handshaped_wheel

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "vllm_runtime" / "files" / "resolve-wheels.py"


def _resolve(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(cache), *args], capture_output=True, text=True,
                          timeout=300, check=False)


def _names(report: str) -> list[str]:
    return sorted(item["metadata"]["name"] for item in json.loads(report)["install"])


@pytest.mark.slow(8)
def test_wheelhouse_answer_is_cached_until_the_wheelhouse_changes(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    handshaped_wheel(house, "demo-top", "1.0", {"demo_top/__init__.py": b""}, ("demo-dep",))
    handshaped_wheel(house, "demo-dep", "2.0", {"demo_dep/__init__.py": b""})
    cache = tmp_path / "cache"
    args = ("--no-index", "--find-links", str(house), "demo-top==1.0")

    first = _resolve(cache, *args)
    assert first.returncode == 0, first.stderr
    assert _names(first.stdout) == ["demo-dep", "demo-top"]
    kept = list(cache.glob("resolve-*.json"))
    answer = json.loads(first.stdout)
    assert answer.pop("twinspark_pip_wheel") is None  # this interpreter's own pip ran
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == answer  # the cache keeps pip's report as it is
    assert oct(cache.stat().st_mode & 0o777) == "0o700"

    # The second run answers from the cache: a marker written into the kept report comes back verbatim.
    marker = json.dumps({"install": [{"metadata": {"name": "from-cache"}}]})
    kept[0].write_text(marker)
    assert json.loads(_resolve(cache, *args).stdout) == {**json.loads(marker), "twinspark_pip_wheel": None}

    # A new wheel in the wheelhouse is a new key: pip resolves again and the newer dependency wins.
    handshaped_wheel(house, "demo-dep", "2.1", {"demo_dep/__init__.py": b"# newer\n"})
    again = _resolve(cache, *args)
    assert again.returncode == 0, again.stderr
    versions = {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(again.stdout)["install"]}
    assert versions == {"demo-top": "1.0", "demo-dep": "2.1"}
    assert [json.loads(p.read_text()) for p in cache.glob("resolve-*.json")] == [
        {key: value for key, value in json.loads(again.stdout).items() if key != "twinspark_pip_wheel"}]


@pytest.mark.slow(23)
def test_a_venv_without_pip_resolves_with_the_distributions_pip_wheel(tmp_path: Path) -> None:
    # The role makes the resolver venv with --without-pip; pip then runs from the wheel ensurepip would install.
    venv = tmp_path / "probe"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    assert subprocess.run([python, "-c", "import pip"], capture_output=True, timeout=60).returncode != 0
    house = tmp_path / "house"
    house.mkdir()
    handshaped_wheel(house, "demo-top", "1.0", {"demo_top/__init__.py": b""}, ("demo-dep",))
    handshaped_wheel(house, "demo-dep", "2.0", {"demo_dep/__init__.py": b""})
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    result = subprocess.run([python, str(SCRIPT), str(tmp_path / "cache"), "--no-index", "--find-links", str(house),
                             "demo-top==1.0"], capture_output=True, text=True, timeout=300, check=False,
                            env={**env, "PIP_CONFIG_FILE": os.devnull})
    assert result.returncode == 0, result.stderr
    assert _names(result.stdout) == ["demo-dep", "demo-top"]
    assert subprocess.run([python, "-c", "import pip"], capture_output=True, timeout=60).returncode != 0
    # The report names the pip wheel that ran: the role installs the runtime with it into a venv made without pip,
    # and the same wheel gives the venv its own pip (tasks/stage.yml), as here.
    wheel = json.loads(result.stdout)["twinspark_pip_wheel"]
    assert wheel.endswith(".whl") and Path(wheel).is_file()
    installed = subprocess.run([python, str(Path(wheel) / "pip"), "install", "--disable-pip-version-check",
                                "--no-index", "--no-deps", "--find-links", str(house), "demo-dep==2.0", wheel],
                               capture_output=True, text=True, timeout=300, check=False,
                               env={**env, "PIP_CONFIG_FILE": os.devnull})
    assert installed.returncode == 0, installed.stderr
    assert subprocess.run([python, "-m", "pip", "--version"], capture_output=True, timeout=60).returncode == 0
    assert subprocess.run([python, "-c", "import demo_dep"], capture_output=True, timeout=60).returncode == 0


def test_no_pip_and_no_pip_wheel_is_one_clear_line(tmp_path: Path) -> None:
    venv = tmp_path / "probe"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    # The same script with the places it looks for a pip wheel pointed at an empty directory.
    script = tmp_path / "resolve-wheels.py"
    text = SCRIPT.read_text()
    assert 'WHEEL_DIRS = ["/usr/share/python-wheels"]' in text
    script.write_text(text.replace('WHEEL_DIRS = ["/usr/share/python-wheels"]', f'WHEEL_DIRS = ["{tmp_path}"]')
                      .replace('"_bundled"', '"_absent"'))
    result = subprocess.run([str(venv / "bin" / "python"), str(script), str(tmp_path / "cache"), "--no-index",
                             "--find-links", str(tmp_path), "demo-top==1.0"], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"resolve-wheels.py: {venv}/bin/python has no pip and no pip wheel was found in {tmp_path} or "
        "ensurepip/_bundled: install python3-venv (python3-pip-whl), or pip into this venv"]


def test_a_missing_wheel_fails_and_nothing_is_cached(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    handshaped_wheel(house, "demo-top", "1.0", {"demo_top/__init__.py": b""}, ("demo-absent",))
    cache = tmp_path / "cache"
    result = _resolve(cache, "--no-index", "--find-links", str(house), "demo-top==1.0")
    assert result.returncode != 0
    assert "demo-absent" in result.stderr
    assert not cache.exists() or not list(cache.glob("resolve-*.json"))


def test_an_index_source_is_never_cached(tmp_path: Path) -> None:
    # An unroutable index that pip cannot reach without the network: port 9 on loopback (discard), one retry.
    cache = tmp_path / "cache"
    env = dict(os.environ, PIP_RETRIES="0", PIP_TIMEOUT="2")
    result = subprocess.run([sys.executable, str(SCRIPT), str(cache), "--index-url", "http://127.0.0.1:9/simple",
                             "demo-top==1.0"], capture_output=True, text=True, timeout=120, check=False, env=env)
    assert result.returncode != 0
    assert not cache.exists()


def test_usage_without_arguments() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and "usage" in result.stderr


def test_the_newest_pip_wheel_of_the_first_place_that_has_one_is_taken(tmp_path: Path, monkeypatch) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("resolve_wheels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    first, second = tmp_path / "distribution", tmp_path / "other"
    first.mkdir()
    second.mkdir()
    for name in ("pip-9.0.1-py3-none-any.whl", "pip-23.0.1-py3-none-any.whl", "setuptools-66.1.1-py3-none-any.whl"):
        (first / name).write_bytes(b"")
    (second / "pip-99.0-py3-none-any.whl").write_bytes(b"")
    monkeypatch.setattr(module, "WHEEL_DIRS", [str(first), str(second)])
    assert [Path(p).name for p in module.bundled_pip_wheels()] == ["pip-9.0.1-py3-none-any.whl",
                                                                   "pip-23.0.1-py3-none-any.whl"]
