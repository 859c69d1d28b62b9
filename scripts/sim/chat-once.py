#!/usr/bin/env python3
"""Ask the serving pair one chat question through the head's OpenAI-compatible API and print the answer.

Usage: chat-once.py [--tools] BASE_URL [QUESTION]
--tools also sends the question with a `tools` list and tool_choice auto, which vLLM answers only when the served
recipe has a tool-call parser (--enable-auto-tool-choice); the parsed tool calls and reasoning are printed.
The API key, when the pair has one, comes from the environment (TWINSPARK_API_KEY) and is never printed. An https
BASE_URL is verified against the file TWINSPARK_API_CA names (the pair's CA, or its self-signed certificate).
The first request after a start compiles a kernel on each rank, so the wait is long but bounded.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python_tools"))
from twinspark import api, netguard  # noqa: E402

TIMEOUT_S = 300


def main(argv: list[str]) -> int:
    tools = "--tools" in argv[1:2]
    if tools:
        argv = [argv[0], *argv[2:]]
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    base = argv[1].rstrip("/")
    question = argv[2] if len(argv) == 3 else "Hello! Which two nodes are answering me?"
    try:
        netguard.check([base])
    except netguard.UnsafeRoute as error:
        print(f"chat-once: {error}", file=sys.stderr)
        return 2
    headers = api.auth_headers(os.environ.get("TWINSPARK_API_KEY") or None)
    ca = os.environ.get("TWINSPARK_API_CA") or None
    http = api.session(ca)
    try:
        models = http.get(f"{base}/v1/models", headers=headers, timeout=30)
        models.raise_for_status()
        model = models.json()["data"][0]["id"]
        started = time.monotonic()
        answer = http.post(
            f"{base}/v1/chat/completions",
            headers=headers,
            json={"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 16},
            timeout=TIMEOUT_S,
        )
        answer.raise_for_status()
    except (requests.RequestException, KeyError, IndexError, ValueError) as error:
        print(f"chat completion through {base} failed: {api.describe_error(error, ca)}", file=sys.stderr)
        return 1
    body = answer.json()
    usage = body.get("usage", {})
    print(f"model {model} answered in {time.monotonic() - started:.1f} s")
    print(f"  question: {question}")
    print(f"  answer:   {body['choices'][0]['message']['content']!r}")
    print(f"  tokens:   {usage.get('prompt_tokens')} in, {usage.get('completion_tokens')} out")
    return ask_with_tools(http, base, headers, model, question, ca) if tools else 0


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def ask_with_tools(http, base: str, headers: dict, model: str, question: str, ca: str | None) -> int:
    """One chat with tools set and tool_choice auto: vLLM refuses it (400) unless a tool-call parser serves."""
    try:
        answer = http.post(f"{base}/v1/chat/completions", headers=headers, timeout=TIMEOUT_S, json={
            "model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 16,
            "tools": [WEATHER_TOOL], "tool_choice": "auto"})
        answer.raise_for_status()
        message = answer.json()["choices"][0]["message"]
    except (requests.RequestException, KeyError, IndexError, ValueError) as error:
        print(f"chat completion with tools through {base} failed: {api.describe_error(error, ca)}", file=sys.stderr)
        return 1
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    print(f"  with tools: parsed tool calls {message.get('tool_calls')!r}, content {message.get('content')!r}, "
          f"reasoning {reasoning!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
