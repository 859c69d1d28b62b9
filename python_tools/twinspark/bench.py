"""`twinspark bench`: a concurrency sweep of streaming chat completions against the pair's API.

For each concurrency level c, c streams run at once, each sending `--requests-per-stream` requests one after the
other. Every request has a prompt of about `--prompt-tokens` tokens (sized with the server's /tokenize; a unique
first line per request, so the prefix cache cannot answer it) and asks for exactly `--max-tokens` tokens
(ignore_eos). Reported per level: time to first token (TTFT), decode tokens/s per stream (tokens after the first
over the time after the first) and aggregate tokens/s (every completion token over the level's wall time). With
`--profile gb10` the DSpark runbook's published figures for the DGX Spark pair are shown beside the measured ones.

Exit codes: 0 every request completed; 1 some request failed or timed out; 2 invalid input.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import requests

from twinspark import api, netguard
from twinspark import inventory as pair_inventory
from twinspark.fleet import rules as fleet
from twinspark.inventory import InventoryError

# Figures published for DeepSeek-V4-Flash-0731 at TP=2 on two DGX Sparks, the numbers a gb10 pair should reach
# (docs/OPERATIONS.md, "`twinspark bench`").
PUBLISHED_GB10 = {
    1: {"decode_tok_s_per_stream": (62.0, 83.0)},
    6: {"aggregate_tok_s": (162.0, 191.0)},
}
PUBLISHED_TTFT_128K_S = 78.8
WORDS = ("alpha", "river", "stone", "cloud", "maple", "orbit", "lantern", "quartz", "meadow", "signal")


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float | None = None
    total_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    error: str | None = None

    @property
    def decode_tok_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.total_s is None or self.completion_tokens < 2:
            return None
        decode_time = self.total_s - self.ttft_s
        return (self.completion_tokens - 1) / decode_time if decode_time > 0 else None


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    failed: int
    wall_s: float
    prompt_tokens: float | None
    completion_tokens: int
    ttft_s_mean: float | None
    ttft_s_max: float | None
    decode_tok_s_per_stream_mean: float | None
    decode_tok_s_per_stream_min: float | None
    aggregate_tok_s: float | None
    errors: list[str]


def make_prompt(words: int, request_id: int) -> str:
    """`words` plain words after a first line unique to the request (so the prefix cache cannot answer it)."""
    body = " ".join(WORDS[(i * 7 + request_id) % len(WORDS)] for i in range(max(words, 1)))
    return f"Request {request_id}. Repeat the following words back, one per line.\n{body}"


@dataclass(frozen=True)
class TokenFit:
    """Chat prompt tokens = overhead + per_word * words, measured with the server's own tokenizer."""

    overhead: float = 12.0
    per_word: float = 1.0

    def words_for(self, tokens: int) -> int:
        return max(round((tokens - self.overhead) / self.per_word), 1)


def fit_tokens(count: Callable[[str], int]) -> TokenFit:
    """Fit the prompt size from two token counts (`count` tokenizes one chat prompt)."""
    small, large = count(make_prompt(8, 0)), count(make_prompt(64, 0))
    per_word = max((large - small) / 56, 0.1)
    return TokenFit(overhead=small - 8 * per_word, per_word=per_word)


def server_token_count(session, url: str, model: str, headers: Mapping[str, str]) -> Callable[[str], int]:
    """Count a chat prompt's tokens with vLLM's /tokenize (the chat template included)."""

    def count(prompt: str) -> int:
        response = session.post(f"{url}/tokenize", headers=dict(headers), timeout=10,
                                json={"model": model, "messages": [{"role": "user", "content": prompt}]})
        response.raise_for_status()
        return int(response.json()["count"])

    return count


def parse_sse_line(line: str) -> dict | None:
    """One server-sent-events line -> the JSON chunk it carries (None for keep-alives and the [DONE] marker)."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    return json.loads(payload)


def chunk_has_text(chunk: Mapping) -> bool:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            return True
    return False


def stream_chat(session, url: str, model: str, prompt: str, max_tokens: int, headers: Mapping[str, str],
                timeout: float, clock: Callable[[], float] = time.monotonic) -> RequestResult:
    """One streaming chat completion, timed from sending to the first text chunk and to the end."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    started = clock()
    first: float | None = None
    usage: Mapping = {}
    chunks = 0
    try:
        with session.post(f"{url}/v1/chat/completions", json=body, headers=dict(headers), stream=True,
                          timeout=(10, timeout)) as response:
            if response.status_code != 200:
                return RequestResult(False, error=f"HTTP {response.status_code}: {response.text[:120]}")
            for line in response.iter_lines(decode_unicode=True):
                if clock() - started > timeout:
                    return RequestResult(False, error=f"not finished within {timeout:g} s")
                chunk = parse_sse_line(line or "")
                if chunk is None:
                    continue
                if chunk_has_text(chunk):
                    chunks += 1
                    if first is None:
                        first = clock()
                usage = chunk.get("usage") or usage
    except Exception as error:  # noqa: BLE001 - every transport failure is one failed request in the report
        return RequestResult(False, error=f"{type(error).__name__}: {str(error)[:120]}")
    finished = clock()
    if first is None:
        return RequestResult(False, error="the stream carried no text")
    return RequestResult(True, ttft_s=first - started, total_s=finished - started,
                         prompt_tokens=usage.get("prompt_tokens"),
                         completion_tokens=int(usage.get("completion_tokens") or chunks))


def summarise(concurrency: int, results: Sequence[RequestResult], wall_s: float) -> LevelResult:
    good = [r for r in results if r.ok]
    ttfts = [r.ttft_s for r in good if r.ttft_s is not None]
    decode = [d for r in good if (d := r.decode_tok_s) is not None]
    prompts = [r.prompt_tokens for r in good if r.prompt_tokens]
    completion = sum(r.completion_tokens for r in good)
    return LevelResult(
        concurrency=concurrency,
        requests=len(results),
        failed=len(results) - len(good),
        wall_s=wall_s,
        prompt_tokens=statistics.mean(prompts) if prompts else None,
        completion_tokens=completion,
        ttft_s_mean=statistics.mean(ttfts) if ttfts else None,
        ttft_s_max=max(ttfts) if ttfts else None,
        decode_tok_s_per_stream_mean=statistics.mean(decode) if decode else None,
        decode_tok_s_per_stream_min=min(decode) if decode else None,
        aggregate_tok_s=completion / wall_s if good and wall_s > 0 else None,
        errors=sorted({r.error for r in results if r.error})[:3],
    )


def run_level(send: Callable[[int], RequestResult], concurrency: int, per_stream: int,
              progress: Callable[[str], None]) -> LevelResult:
    """c streams at once, each sending `per_stream` requests in a row."""
    total = concurrency * per_stream
    done: list[RequestResult] = []
    lock = threading.Lock()

    def stream(index: int) -> None:
        for n in range(per_stream):
            result = send(index * per_stream + n)
            with lock:
                done.append(result)
                failed = sum(not r.ok for r in done)
                progress(f"c={concurrency}: {len(done)}/{total} requests done" + (f", {failed} failed" if failed
                                                                                    else ""))

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(stream, range(concurrency)))
    return summarise(concurrency, done, time.monotonic() - started)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def published_for(level: LevelResult) -> str:
    figures = PUBLISHED_GB10.get(level.concurrency, {})
    parts = [f"{name.replace('_tok_s', '').replace('_', ' ')} {low:g}-{high:g} tok/s"
             for name, (low, high) in figures.items()]
    return "; ".join(parts)


def table(levels: Sequence[LevelResult], profile: str) -> str:
    header = ["c", "requests", "failed", "prompt tok", "TTFT mean s", "TTFT max s", "decode tok/s/stream",
              "aggregate tok/s"]
    if profile == "gb10":
        header.append("published (2x Spark)")
    rows = [header]
    for level in levels:
        row = [str(level.concurrency), str(level.requests), str(level.failed), _fmt(level.prompt_tokens, 0),
               _fmt(level.ttft_s_mean, 3), _fmt(level.ttft_s_max, 3),
               f"{_fmt(level.decode_tok_s_per_stream_mean)} (min {_fmt(level.decode_tok_s_per_stream_min)})",
               _fmt(level.aggregate_tok_s)]
        if profile == "gb10":
            row.append(published_for(level))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(widths[i]) if i < len(header) - 1 or profile != "gb10" else cell
                       for i, cell in enumerate(row)).rstrip() for row in rows]
    if profile == "gb10":
        lines.append(f"published TTFT at a 128K-token prompt: {PUBLISHED_TTFT_128K_S} s")
    for level in levels:
        for error in level.errors:
            lines.append(f"c={level.concurrency}: {error}")
    return "\n".join(lines)


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--concurrency must be integers separated by commas (got {text!r})"
                                         ) from None
    if not levels or any(level < 1 or level > 64 for level in levels):
        raise argparse.ArgumentTypeError(f"--concurrency levels must be 1-64 (got {text!r})")
    return levels


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {text})")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="concurrency sweep of streaming chat completions (TTFT, tok/s)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="API base URL (default: the inventory's head; its API key and served name are "
                        "then read from the head's env files over SSH, like `twinspark health` does)")
    parser.add_argument("-i", "--inventory", help="Ansible inventory to find the head in when --url is not given")
    aim = parser.add_mutually_exclusive_group()
    aim.add_argument("--pair", metavar="NAME",
                     help="on a fleet inventory: bench this pair's head (its group name, e.g. pair_a)")
    aim.add_argument("--router", action="store_true",
                     help="on a fleet inventory: bench the fleet's router (key and model read from a pair's head)")
    parser.add_argument("--model", help="model name to request (default: the first one /v1/models lists)")
    parser.add_argument("--concurrency", type=parse_levels, default=[1, 2, 4, 6], metavar="C,C,...",
                        help="concurrency levels (default 1,2,4,6)")
    parser.add_argument("--prompt-tokens", type=positive, default=256, metavar="N", help="prompt size (default 256)")
    parser.add_argument("--max-tokens", type=positive, default=128, metavar="N",
                        help="tokens generated per request (default 128)")
    parser.add_argument("--requests-per-stream", type=positive, default=2, metavar="N",
                        help="requests each concurrent stream sends one after the other (default 2)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="seconds allowed per request (default 300)")
    parser.add_argument("--api-key-env", default="TWINSPARK_API_KEY", metavar="VAR",
                        help="environment variable holding the API key, if keys are set (default TWINSPARK_API_KEY; "
                        "it wins over the key read from the head)")
    parser.add_argument("--ca", metavar="FILE",
                        help="with an https --url: verify the server's certificate against FILE (the pair's CA, or "
                        "its self-signed certificate); without --url the inventory's twinspark_vllm_tls_ca/_cert")
    parser.add_argument("--profile", choices=("gb10", "cpu"), default="gb10",
                        help="gb10 shows the DSpark runbook's published figures beside the measured ones")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=run)


def _progress(message: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K{message}")
    else:
        sys.stderr.write(message + "\n")
    sys.stderr.flush()


def from_inventory(inventory: str | None, timeout: float = 10.0, pair: str | None = None, router: bool = False,
                   ) -> tuple[str, str | None, str | None, str | None]:
    """(API URL, first API key, served name, CA file) of the inventory's head; the key and name come from the head's
    env files over SSH, as `twinspark health` reads them (None when they cannot be read); the CA (None: plain HTTP)
    from the inventory's TLS settings (twinspark.api.tls_ca_from_inventory).

    On a fleet inventory `pair` names the pair whose head is benched, or `router` aims at the fleet's router (the key
    and served name then come from the first pair's head: the fleet serves one model under one key); neither is an
    InventoryError naming both. On a one-pair inventory `pair` may only name its one pair (twinspark_pair)."""
    source = inventory or pair_inventory.default_inventory()
    view = pair_inventory.read_fleet(source)
    names = [name for name, _ in view.pairs] if view else [fleet.SINGLE_PAIR]
    if view is None:
        if router:
            raise pair_inventory.InventoryError(f"inventory {source}: has one pair and no router; --router benches "
                                                "a fleet's router (docs/FLEET.md), leave it out here")
        if pair not in (None, fleet.SINGLE_PAIR):
            raise pair_inventory.InventoryError(f"inventory {source}: has one pair ({fleet.SINGLE_PAIR}); --pair "
                                                f"{pair} names none, leave --pair out")
        chosen = None
    else:
        if not pair and not router:
            raise pair_inventory.InventoryError(
                f"inventory {source}: is a fleet (pairs: {', '.join(names) or 'none'}): pass --pair NAME to bench "
                "one pair's head, or --router to bench the fleet's router")
        if router and view.router_url is None:
            raise pair_inventory.InventoryError(f"inventory {source}: has no host in group twinspark_router, so "
                                                "--router has nothing to bench; pass --pair NAME instead")
        chosen = pair or (names[0] if names else None)  # read_inventory names an unknown pair
    head = pair_inventory.read_inventory(source, chosen)
    try:
        env = pair_inventory.head_env(head, timeout)
    except Exception as error:  # noqa: BLE001 - without the env files the bench still runs, keyless
        _progress(f"could not read the head's env files ({type(error).__name__}); sending no API key")
        env = {}
    url, ca = (view.router_url, None) if router else (head.api_url, head.api_ca)
    return url, api.first_key(env), env.get("SERVED_MODEL_NAME") or None, ca


def run(args: argparse.Namespace) -> int:
    key = (os.environ.get(args.api_key_env, "").split() or [None])[0]
    model = args.model
    url = args.url
    if url and (args.pair or args.router):
        print(f"twinspark bench: --url and {'--pair' if args.pair else '--router'} both say where to aim; pass one",
              file=sys.stderr)
        return 2
    ca = getattr(args, "ca", None)
    if not url:
        try:
            url, inventory_key, served, inventory_ca = from_inventory(args.inventory, pair=args.pair,
                                                                      router=args.router)
        except InventoryError as error:
            print(f"twinspark bench: {error}", file=sys.stderr)
            return 2
        key = key or inventory_key
        model = model or served
        ca = ca or inventory_ca
    url = url.rstrip("/")
    try:
        netguard.check([url])
    except netguard.UnsafeRoute as error:
        print(f"twinspark bench: {error}", file=sys.stderr)
        return 2
    headers = api.auth_headers(key)
    session = api.session(ca, pool=max(args.concurrency))
    if not model:
        try:
            answer = session.get(f"{url}/v1/models", headers=headers, timeout=10)
            answer.raise_for_status()
            model = answer.json()["data"][0]["id"]
        except (requests.RequestException, ValueError, KeyError, IndexError) as error:
            print(f"twinspark bench: cannot list models at {url}/v1/models ({api.describe_error(error, ca)[:200]}); "
                  "is the pair serving? `twinspark health` tells", file=sys.stderr)
            return 1
    levels: list[LevelResult] = []
    serial = 0
    serial_lock = threading.Lock()

    try:
        fit = fit_tokens(server_token_count(session, url, model, headers))
    except (requests.RequestException, ValueError, KeyError) as error:
        _progress(f"cannot size prompts with {url}/tokenize ({type(error).__name__}); assuming one token per word")
        fit = TokenFit()
    words = fit.words_for(args.prompt_tokens)

    def send(_index: int) -> RequestResult:
        nonlocal serial
        with serial_lock:
            serial += 1
            request_id = serial
        return stream_chat(session, url, model, make_prompt(words, request_id), args.max_tokens, headers,
                           args.timeout)

    _progress(f"benchmarking {model} at {url}: c={','.join(map(str, args.concurrency))}, "
              f"{args.prompt_tokens} prompt / {args.max_tokens} generated tokens")
    for concurrency in args.concurrency:
        levels.append(run_level(send, concurrency, args.requests_per_stream, _progress))
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    if args.json:
        published = {str(c): {k: list(v) for k, v in f.items()} for c, f in PUBLISHED_GB10.items()}
        print(json.dumps({"url": url, "model": model, "profile": args.profile, "prompt_tokens": args.prompt_tokens,
                          "max_tokens": args.max_tokens, "levels": [asdict(level) for level in levels],
                          "published_gb10": published if args.profile == "gb10" else None}, indent=2))
    else:
        print(f"{model} at {url}")
        print(table(levels, args.profile))
    return 1 if any(level.failed for level in levels) else 0
