"""twinspark.apikeys: the digests file the patched vLLM rereads, and the wait that proves which keys the API takes."""

from __future__ import annotations

import hashlib
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from twinspark import apikeys, cli


def test_render_writes_each_keys_digest_once_in_order_and_no_key():
    text = apikeys.render(["new-key", "old-key", "new-key"])
    assert "new-key" not in text and "old-key" not in text
    assert apikeys.parse(text) == [hashlib.sha256(b"new-key").hexdigest(), hashlib.sha256(b"old-key").hexdigest()]


@pytest.mark.parametrize("keys", [[], [""], ["  "]])
def test_render_refuses_no_key_or_an_empty_one(keys):
    with pytest.raises(ValueError):
        apikeys.render(keys)


@pytest.mark.parametrize("text", ["", "# nothing\n", "abc\n", "zz" * 32 + "\n", "a" * 70000])
def test_parse_refuses_what_the_middleware_would_ignore(text):
    with pytest.raises(ValueError):
        apikeys.parse(text)


def test_verdicts_name_keys_by_role_and_place_never_by_value():
    answers = {"new": 200, "old": 200, "gone": 200}
    wrong = apikeys.verdicts(["new", "old"], ["gone"], answers.__getitem__)
    assert wrong == ["key 1 of 1 to be refused answered 200"]
    answers["gone"] = 401
    assert apikeys.verdicts(["new", "old"], ["gone"], answers.__getitem__) == []
    answers["old"] = "port 8888 on 127.0.0.1 is held by nobody (uid 65534), not the serving account"
    assert apikeys.verdicts(["new", "old"], [], answers.__getitem__) == [
        "key 2 of 2 to be accepted answered port 8888 on 127.0.0.1 is held by nobody (uid 65534), not the serving "
        "account"]


def test_wait_asks_again_until_the_api_agrees_or_the_time_is_up():
    seen = iter([401, 401, 200, 200])
    clock = iter(range(100))
    assert apikeys.wait(["new"], [], lambda key: next(seen), timeout=10, sleep=lambda s: None,
                        clock=lambda: next(clock)) == []
    stuck = apikeys.wait(["new"], [], lambda key: 401, timeout=3, sleep=lambda s: None, clock=iter(range(100)).__next__)
    assert stuck == ["key 1 of 1 to be accepted answered 401"]


def test_a_verdict_counts_only_when_it_still_holds_after_the_apis_recheck_interval():
    """One instance of the API may answer with the keys it held for up to a second after the file changed (the
    patch looks at it once a second): a first good verdict is asked again `settle_s` later, and a flip back (the old
    key taken once more) keeps the wait going."""
    seen = iter([401, 200, 401, 200, 200])
    naps: list[float] = []
    assert apikeys.wait([], ["old"], lambda key: {200: 401, 401: 200}[next(seen)], timeout=10, sleep=naps.append,
                        clock=iter(range(100)).__next__) == []
    assert naps == [0.5, apikeys.SETTLE_S, 0.5, apikeys.SETTLE_S]
    import re
    from pathlib import Path

    for patch in (Path(__file__).resolve().parents[2] / "patches").glob("*/auth-every-path.patch"):
        recheck = float(re.search(r"^\+DIGESTS_RECHECK_S = ([0-9.]+)$", patch.read_text(), re.M)[1])
        assert recheck < apikeys.SETTLE_S, patch


class _Api(BaseHTTPRequestHandler):
    accepted = {"Bearer new"}

    def log_message(self, *_args):
        pass

    def do_GET(self):
        self.send_response(200 if self.headers.get("Authorization") in self.accepted else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_the_command_reads_keys_on_stdin_asks_the_api_and_names_no_key(tmp_path, monkeypatch, capsys):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        serve_env = tmp_path / "serve.env"
        serve_env.write_text(f"VLLM_HOST=127.0.0.1\nVLLM_PORT={server.server_address[1]}\n")
        from twinspark import layout
        monkeypatch.setattr(layout, "current", lambda: type("L", (), {"serve_env": str(serve_env)})())
        monkeypatch.setattr("twinspark.api.serving_uid", lambda: None)  # a test machine: no serving account
        monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"accept": ["new"], "refuse": ["old"]})))
        assert cli.main(["apikeys", "wait", "--timeout", "1"]) == 0
        assert "1 key(s) accepted, 1 refused" in capsys.readouterr().out
        monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"accept": ["old"], "refuse": []})))
        assert cli.main(["apikeys", "wait", "--timeout", "1"]) == 1
        err = capsys.readouterr().err
        assert "key 1 of 1 to be accepted answered 401" in err and "old" not in err.replace("to be", "")
    finally:
        server.shutdown()


@pytest.mark.parametrize("stdin", ["", "[]", '{"accept": []}', '{"accept": [""]}', "not json"])
def test_the_command_refuses_stdin_without_a_key_to_accept(monkeypatch, capsys, stdin):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert cli.main(["apikeys", "wait", "--timeout", "1"]) == 2
    assert "twinspark apikeys wait:" in capsys.readouterr().err
