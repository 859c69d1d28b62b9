"""The head's accepted API keys as a file of sha256 digests, and the probe that proves which keys the API takes.

The patched vLLM (patch auth-every-path) reads the file named by TWINSPARK_VLLM_API_KEY_DIGESTS again whenever it
changes, and from then on accepts exactly the keys it lists, so keys change without a restart:
`twinspark rotate api-key` (roles/key_rotation/tasks/api_key.yml) writes the old and the new key's digests, proves
both are taken, moves every TwinSpark client to the new key, then writes the new one's alone and proves the old is
refused (docs/ROTATION.md). The file holds no key: a digest of a random key gives nothing to an attacker.

    twinspark apikeys wait [--timeout S]   (stdin: {"accept": [KEY...], "refuse": [KEY...]})
        on the head: asks the API (/v1/models) with each key until every key of `accept` is taken and every key of
        `refuse` answered 401, or the timeout; exit 0, else 1 with one line naming what was still wrong (keys are
        never printed: "the new key", "key 2 of 2"). Keys arrive on stdin, never in argv. A key goes only to a
        listener the serving account owns (twinspark.api.key_withheld).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping

HEADER = ("# The sha256 of each API key the head's vLLM accepts, one a line; no key is written here.\n"
          "# Written by role serve_env and `twinspark rotate api-key`; the patched vLLM reads it again on change.\n")
MAX_BYTES = 65536


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def render(keys: Iterable[str]) -> str:
    """The digests file for these keys, in order, each once."""
    seen: list[str] = []
    for key in keys:
        if not isinstance(key, str) or not key.strip():
            raise ValueError("an API key is empty")
        if digest(key) not in seen:
            seen.append(digest(key))
    if not seen:
        raise ValueError("no API key to write: a head without keys has no digests file")
    return HEADER + "".join(f"{hexdigest}\n" for hexdigest in seen)


def parse(text: str) -> list[str]:
    """The digests in a file as the patched middleware reads it; ValueError when it would ignore the file."""
    if len(text.encode("utf-8")) > MAX_BYTES:
        raise ValueError(f"over {MAX_BYTES} bytes")
    found = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    for line in found:
        if len(line) != 64 or any(char not in "0123456789abcdefABCDEF" for char in line):
            raise ValueError(f"{line[:16]!r}... is not a sha256 hex digest")
    if not found:
        raise ValueError("no digest in it")
    return [line.lower() for line in found]


# ------------------------------------------------------------------------------------------------------ the probe
def verdicts(accept: list[str], refuse: list[str], status: Callable[[str], int | str]) -> list[str]:
    """What is still wrong, one phrase per key (keys named by role and place, never by value); empty when every key
    of `accept` answers 200 and every key of `refuse` 401. `status(key)` gives an HTTP status or a reason."""
    wrong = []
    for role, keys, wanted in (("accepted", accept, 200), ("refused", refuse, 401)):
        for index, key in enumerate(keys, 1):
            got = status(key)
            if got != wanted:
                wrong.append(f"key {index} of {len(keys)} to be {role} answered {got}")
    return wrong


# The patched vLLM looks at its digests file at most once a second per middleware instance (patch auth-every-path,
# DIGESTS_RECHECK_S), so one instance may still answer with the keys it held up to a second after another one took
# the new file. A verdict counts only when it holds again this long after it was first seen: by then every instance
# looks at the file before it answers.
SETTLE_S = 1.2


def wait(accept: list[str], refuse: list[str], status: Callable[[str], int | str], timeout: float,
         sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
         settle_s: float = SETTLE_S) -> list[str]:
    """verdicts() again every half second until none is left, twice in a row `settle_s` apart, or `timeout` passed;
    the last verdicts."""
    deadline = clock() + timeout
    while True:
        wrong = verdicts(accept, refuse, status)
        if not wrong:
            sleep(settle_s)
            wrong = verdicts(accept, refuse, status)
            if not wrong:
                return wrong
        if clock() >= deadline:
            return wrong
        sleep(0.5)


def _env_status(env: Mapping[str, str], timeout: float) -> Callable[[str], int | str]:
    # api imports requests: only the live probe needs it.
    from twinspark import api

    url = api.url_from_env(env)
    http = api.session(api.tls_ca(env))

    def status(key: str) -> int | str:
        withheld = api.key_withheld(url, api.serving_uid())
        if withheld:
            return withheld
        result, response = api.request(http, "GET", f"{url}/v1/models", timeout, headers=api.auth_headers(key))
        return response.status_code if response is not None else str(result.get("error") or "no answer")

    return status


def _read_keys(stream) -> tuple[list[str], list[str]]:
    try:
        asked = json.loads(stream.read(MAX_BYTES) or "{}")
        accept, refuse = asked.get("accept", []), asked.get("refuse", [])
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"stdin must be JSON {{\"accept\": [...], \"refuse\": [...]}} ({exc})") from None
    if not all(isinstance(k, str) and k for k in [*accept, *refuse]) or not accept:
        raise ValueError("stdin must list at least one key to accept, every key a non-empty string")
    return accept, refuse


def command(opts: argparse.Namespace) -> int:
    # The env files and the node's layout: only the command on a node reads them.
    from twinspark import envfile, layout

    try:
        accept, refuse = _read_keys(sys.stdin)
        read = envfile.read_files([layout.current().serve_env])
        if read.refused:
            raise ValueError("; ".join(read.refused))
        env = read.values
    except (OSError, ValueError) as exc:
        print(f"twinspark apikeys wait: {exc}", file=sys.stderr)
        return 2
    wrong = wait(accept, refuse, _env_status(env, opts.request_timeout), opts.timeout)
    if wrong:
        print(f"twinspark apikeys wait: after {opts.timeout:g} s, {'; '.join(wrong)}", file=sys.stderr)
        return 1
    print(f"twinspark apikeys wait: {len(accept)} key(s) accepted, {len(refuse)} refused")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("apikeys", help="the head's accepted API keys (rotation without a restart)")
    verbs = parser.add_subparsers(dest="apikeys_verb", required=True)
    waiter = verbs.add_parser("wait", help="wait until the API takes and refuses the keys given on stdin (JSON)")
    waiter.add_argument("--timeout", type=float, default=30.0, help="seconds to wait in all (default 30)")
    waiter.add_argument("--request-timeout", type=float, default=5.0, help="seconds per request (default 5)")
    waiter.set_defaults(func=command)
