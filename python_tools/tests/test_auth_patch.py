"""Patch auth-every-path, run: the patched vLLM middleware (from the real wheel) refuses every path without the key.

starlette is not installed here, so a handshaped stand-in of the three starlette names the module imports (Headers,
JSONResponse, the ASGI types) is put in sys.modules; the middleware's own code is vLLM's, as the patch leaves it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
import types

import pytest
from vllm_wheels import PATCHES, TARGETS, pristine_fixture  # noqa: F401  (the fixture `pristine`)

from twinspark import apikeys
from twinspark.cli import main

MODULE = "vllm/entrypoints/serve/middleware/authenticate.py"
KEY = "test-only-key"


def _handshaped_starlette() -> dict[str, types.ModuleType]:
    class Headers(dict):
        def __init__(self, scope):
            super().__init__((k.decode().lower(), v.decode()) for k, v in scope.get("headers", []))

        def get(self, name, default=None):
            return super().get(name.lower(), default)

    class JSONResponse:
        def __init__(self, content, status_code):
            self.status_code = status_code

        async def __call__(self, scope, receive, send):
            await send({"type": "http.response.start", "status": self.status_code})

    modules = {name: types.ModuleType(name) for name in
               ("starlette", "starlette.datastructures", "starlette.responses", "starlette.types")}
    modules["starlette.datastructures"].Headers = Headers
    modules["starlette.responses"].JSONResponse = JSONResponse
    for name in ("ASGIApp", "Receive", "Scope", "Send"):
        setattr(modules["starlette.types"], name, object)
    return modules


def _load(path, monkeypatch):
    for name, module in _handshaped_starlette().items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("authenticate_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _inference(scope, receive, send):
    await send({"type": "http.response.start", "status": 200})


def _status(module, path: str, key: str | None, method: str = "POST", kind: str = "http") -> int:
    """Status of one request through the module's middleware (200: it reached the app behind it)."""
    middleware = module.AuthenticationMiddleware(_inference, tokens=[KEY])
    sent = []

    async def send(message):
        sent.append(message)

    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    scope = {"type": kind, "method": method, "path": path, "root_path": "", "headers": headers}
    asyncio.run(middleware(scope, None, send))
    return sent[0]["status"]


@pytest.fixture(params=TARGETS)
def patched(request, pristine, tmp_path, monkeypatch):
    root = tmp_path / "site-packages"
    shutil.copytree(pristine[request.param], root)
    assert main(["patch", "apply", "--site-packages", str(root), "--patches-dir", str(PATCHES),
                 "--only", "auth-every-path"]) == 0
    return _load(root / MODULE, monkeypatch), _load(pristine[request.param] / MODULE, monkeypatch)


INFERENCE_PATHS = ["/invocations", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize", "/pooling",
                   "/score", "/rerank", "/classify", "/generate", "/v2/rerank", "/inference/v1/generate",
                   "/health/../invocations", "/healthz", "/metrics-x", "/"]


@pytest.mark.parametrize("path", INFERENCE_PATHS)
def test_every_path_but_the_allow_list_needs_the_key(patched, path):
    module, _ = patched
    assert _status(module, path, None) == 401
    assert _status(module, path, "wrong") == 401
    assert _status(module, path, KEY) == 200
    assert _status(module, path, None, kind="websocket") == 401


@pytest.mark.parametrize("path", ["/health", "/ping", "/metrics", "/metrics/"])
def test_the_allow_list_answers_without_a_key(patched, path):
    module, _ = patched
    assert _status(module, path, None, method="GET") == 200


def test_the_original_let_invocations_through_without_a_key(patched):
    """The attack the patch closes, shown on the unpatched file from the same wheel."""
    _, original = patched
    assert _status(original, "/invocations", None) == 200


# ----------------------------------------------------------------------------------------------- key rotation
NEW_KEY = "test-only-new-key"


def _digests(*keys: str) -> str:
    """The file as role serve_env and `twinspark rotate api-key` write it (twinspark.apikeys.render)."""
    return apikeys.render(keys)


def _through(middleware, key: str | None, path: str = "/v1/models") -> int:
    sent = []

    async def send(message):
        sent.append(message)

    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    asyncio.run(middleware({"type": "http", "method": "GET", "path": path, "root_path": "", "headers": headers},
                           None, send))
    return sent[0]["status"]


def _rotating(module, tmp_path, monkeypatch):
    """One middleware (as vLLM keeps one for its life) started with KEY and a digests file that does not exist yet."""
    ring = tmp_path / "api-keys.sha256"
    monkeypatch.setenv("TWINSPARK_VLLM_API_KEY_DIGESTS", str(ring))
    monkeypatch.setattr(module, "DIGESTS_RECHECK_S", 0.0, raising=False)
    return module.AuthenticationMiddleware(_inference, tokens=[KEY]), ring


def test_a_new_key_is_accepted_and_the_old_one_dropped_without_a_restart(patched, tmp_path, monkeypatch):
    module, _ = patched
    middleware, ring = _rotating(module, tmp_path, monkeypatch)
    assert (_through(middleware, KEY), _through(middleware, NEW_KEY)) == (200, 401)  # no file yet: start-up keys
    ring.write_text(_digests(NEW_KEY, KEY))
    assert (_through(middleware, KEY), _through(middleware, NEW_KEY)) == (200, 200)  # both, during the rotation
    staged = tmp_path / "staged"
    staged.write_text(_digests(NEW_KEY))
    staged.replace(ring)  # as Ansible's copy writes: a new file renamed over the old
    assert (_through(middleware, KEY), _through(middleware, NEW_KEY), _through(middleware, None)) == (401, 200, 401)


@pytest.mark.parametrize("content", ["", "# only a comment\n", "not-hex\n", "abcd\n", "ab" * 33 + "\n", "é\n"])
def test_a_digests_file_that_is_empty_or_malformed_keeps_the_last_good_keys(patched, tmp_path, monkeypatch, content):
    module, _ = patched
    middleware, ring = _rotating(module, tmp_path, monkeypatch)
    ring.write_text(_digests(NEW_KEY))
    assert _through(middleware, NEW_KEY) == 200
    ring.write_text(content)
    assert (_through(middleware, KEY), _through(middleware, NEW_KEY)) == (401, 200)
    ring.unlink()
    assert (_through(middleware, KEY), _through(middleware, NEW_KEY)) == (401, 200)


def test_the_digests_file_is_read_only_when_the_launcher_names_it(patched, tmp_path, monkeypatch):
    module, original = patched
    ring = tmp_path / "api-keys.sha256"
    ring.write_text(_digests(NEW_KEY))
    monkeypatch.delenv("TWINSPARK_VLLM_API_KEY_DIGESTS", raising=False)
    assert _through(module.AuthenticationMiddleware(_inference, tokens=[KEY]), NEW_KEY) == 401
    # The unpatched middleware never reads it: rotation needs the patch.
    monkeypatch.setenv("TWINSPARK_VLLM_API_KEY_DIGESTS", str(ring))
    assert _through(original.AuthenticationMiddleware(_inference, tokens=[KEY]), NEW_KEY) == 401
    assert _through(module.AuthenticationMiddleware(_inference, tokens=[KEY]), NEW_KEY) == 200
