"""Alertmanager behind basic auth (issue 43, row 10): library/twinspark_web_auth.py keeps the password root-only and
the web configuration with its bcrypt hash, converged runs change nothing; and the real Alertmanager 0.25 (Debian's
prometheus-alertmanager, `make setup`), started here on 127.0.0.1 with that web configuration, refuses a silence and
its status to a request without the password and takes them with it."""

from __future__ import annotations

import base64
import grp
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from fileload import load_module, stop

from twinspark import monitoring

ROOT = Path(__file__).resolve().parents[2]
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


web_auth = load_module("twinspark_web_auth", ROOT / "library" / "twinspark_web_auth.py")
GROUP = grp.getgrgid(os.getgid()).gr_name

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the module writes a root-only file (run as root)")


def _ensure(tmp_path: Path, check: bool = False) -> dict[str, bool]:
    return web_auth.ensure(str(tmp_path / "password"), str(tmp_path / "web.yml"), monitoring.ALERTMANAGER_USER,
                           GROUP, "test", check)


def test_the_password_is_made_once_root_only_and_a_converged_run_changes_nothing(tmp_path):
    assert _ensure(tmp_path, check=True) == {"password_changed": True, "web_config_changed": True, "changed": True}
    assert not (tmp_path / "password").exists() and not (tmp_path / "web.yml").exists()  # check mode writes nothing
    assert _ensure(tmp_path)["changed"]
    password = (tmp_path / "password").read_text().strip()
    assert len(password) >= 40
    assert oct((tmp_path / "password").stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "web.yml").stat().st_mode & 0o777) == "0o640"
    web = yaml.safe_load((tmp_path / "web.yml").read_text())
    hashed = web["basic_auth_users"][monitoring.ALERTMANAGER_USER]
    assert hashed.startswith("$2") and web_auth.hash_matches(hashed, password)
    assert password not in (tmp_path / "web.yml").read_text()
    before = (tmp_path / "web.yml").read_text()
    assert _ensure(tmp_path, check=True)["changed"] is False
    assert _ensure(tmp_path) == {"password_changed": False, "web_config_changed": False, "changed": False}
    assert (tmp_path / "web.yml").read_text() == before  # the hash is kept, not made again (bcrypt salts)
    # A hash that no longer matches (a hand edit) is made again from the kept password.
    (tmp_path / "web.yml").write_text(web_auth.render("test", monitoring.ALERTMANAGER_USER, web_auth.make_hash("x")))
    assert _ensure(tmp_path) == {"password_changed": False, "web_config_changed": True, "changed": True}
    assert (tmp_path / "password").read_text().strip() == password
    # A lost password is made anew, and the hash with it.
    (tmp_path / "password").unlink()
    assert _ensure(tmp_path)["password_changed"]
    assert (tmp_path / "password").read_text().strip() != password


def test_check_mode_before_the_package_made_its_group_says_changed(tmp_path):
    result = web_auth.ensure(str(tmp_path / "password"), str(tmp_path / "web.yml"), "twinspark",
                             "no-such-group-twinspark", "test", True)
    assert result == {"password_changed": True, "web_config_changed": True, "changed": True}
    with pytest.raises(ValueError, match="no group"):
        web_auth.ensure(str(tmp_path / "password"), str(tmp_path / "web.yml"), "twinspark",
                        "no-such-group-twinspark", "test", False)


def test_a_link_in_place_of_the_password_is_refused(tmp_path):
    (tmp_path / "elsewhere").write_text("x\n")
    (tmp_path / "password").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="not a regular file"):
        _ensure(tmp_path)


def test_promtool_accepts_the_web_configuration(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed here (Debian's prometheus package; make setup)")
    _ensure(tmp_path)
    done = subprocess.run([promtool, "check", "web-config", str(tmp_path / "web.yml")], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ask(url: str, method: str = "GET", body: object = None, password: str | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if password is not None:
        token = base64.b64encode(f"{monitoring.ALERTMANAGER_USER}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.slow(10)
def test_alertmanager_refuses_a_silence_and_its_status_without_the_password(tmp_path):
    if not os.access(ALERTMANAGER, os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus-alertmanager is not installed and CI=true: make setup installs it")
        pytest.skip("prometheus-alertmanager is not installed here (make setup)")
    _ensure(tmp_path)
    password = (tmp_path / "password").read_text().strip()
    hook = "http://192.0.2.9:9/hook-with-a-secret-token"  # never dialled: no alert fires in this test
    config = monitoring.alertmanager_config(monitoring.Receiver(webhook_url=hook), "10s", "1m", "4h")
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(config))
    (tmp_path / "data").mkdir()
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "alertmanager.log").open("w")
    process = subprocess.Popen(
        [ALERTMANAGER, f"--config.file={tmp_path / 'alertmanager.yml'}",
         f"--web.config.file={tmp_path / 'web.yml'}", f"--web.listen-address=127.0.0.1:{port}",
         f"--storage.path={tmp_path / 'data'}", "--cluster.listen-address="],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if _ask(f"{base}/-/ready", password=password)[0] == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None, (tmp_path / "alertmanager.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "alertmanager.log").read_text()
            time.sleep(0.2)
        now = time.time()
        silence = monitoring.silence_request("pair1", "test", now, now + 600)
        # Without the password, or with another one: refused, for the silence, the status (the receiver's URL)
        # and the list of silences alike.
        for attempt in (None, "wrong"):
            assert _ask(f"{base}/api/v2/silences", "POST", silence, attempt)[0] == 401
            status, text = _ask(f"{base}/api/v2/status", password=attempt)
            assert status == 401 and hook not in text
            assert _ask(f"{base}/api/v2/silences", password=attempt)[0] == 401
            assert _ask(f"{base}/metrics", password=attempt)[0] == 401
        # With it (Prometheus, and the planned restarts run as root on the monitor): taken.
        status, text = _ask(f"{base}/api/v2/silences", "POST", silence, password)
        assert status == 200, text
        silence_id = json.loads(text)["silenceID"]
        status, text = _ask(f"{base}/api/v2/silences", password=password)
        assert status == 200 and [s["id"] for s in json.loads(text)] == [silence_id]
        status, text = _ask(f"{base}/api/v2/status", password=password)
        assert status == 200 and hook in json.loads(text)["config"]["original"]
    finally:
        stop(process)
        log.close()
