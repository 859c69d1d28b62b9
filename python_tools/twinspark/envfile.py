"""Env files as systemd's EnvironmentFile= reads them, and an atomic writer for them.

Reading tolerates what editors and other tools leave behind (a UTF-8 byte-order mark, CRLF line endings) and
normalises it away. Quoting follows systemd: single quotes keep everything literally; double quotes understand
backslash escapes of `"`, `\\`, `` ` `` and `$`; an unquoted value loses trailing whitespace and a backslash escapes
the next character; a backslash before a newline continues the line. Lines starting with `#` or `;` are comments.
When several files are read, later files override earlier ones, as with several EnvironmentFile= lines.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from twinspark import atomic, safeio

MAX_BYTES = 1 << 20
"""The largest env file read (1 MiB): real ones are a few kilobytes."""
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_WHITESPACE = " \t\n\r"
_DOUBLE_QUOTE_ESCAPABLE = '"\\`$'
_BARE_SAFE = re.compile(r"[A-Za-z0-9_./:,+@%^-][A-Za-z0-9_./:,=+@%^-]*\Z")  # a leading '=' reads oddly: quote it


@dataclass
class EnvFile:
    """What one or more env files say: values in order, plus problems met while reading."""

    values: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    """One line per file that was not read at all (missing, unreadable, not a small regular file, not UTF-8);
    each line is also in `problems`."""


def normalise_text(text: str) -> str:
    """Strip a leading byte-order mark and turn CRLF / lone CR line endings into LF."""
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.replace("\r\n", "\n").replace("\r", "\n")


def parse(text: str, source: str = "<env>") -> EnvFile:
    """Parse env-file text the way systemd does (after normalising BOM and line endings)."""
    text = normalise_text(text)
    result = EnvFile()
    i, line_no, n = 0, 1, len(text)
    while i < n:
        start_line = line_no
        # Skip leading whitespace of the line.
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            break
        if text[i] == "\n":
            i += 1
            line_no += 1
            continue
        if text[i] in "#;":
            while i < n and text[i] != "\n":
                if text[i] == "\\" and text[i + 1 : i + 2] == "\n":  # systemd continues the comment
                    line_no += 1
                    i += 1
                i += 1
            continue
        # Key.
        key_start = i
        while i < n and text[i] not in "=\n":
            i += 1
        key = text[key_start:i].rstrip(" \t")
        if i >= n or text[i] == "\n":
            result.problems.append(f"{source}:{start_line}: line has no '=' (systemd ignores it)")
            continue
        i += 1  # the '='
        value, i, line_no = _parse_value(text, i, line_no)
        if not NAME.match(key):
            result.problems.append(f"{source}:{start_line}: not a valid variable name")
            continue
        result.values[key] = value
        result.origin[key] = f"{source}:{start_line}"
    return result


def _parse_value(text: str, i: int, line_no: int) -> tuple[str, int, int]:
    """Read one value starting after '='; returns (value, index after the line, line number after it).

    As systemd: before an unquoted part (and between quoted parts) whitespace is skipped; a quote opens a quoted
    part only there, so `a"b"` is literal; once an unquoted part starts, quotes are ordinary characters.
    """
    n = len(text)
    out: list[str] = []
    unquoted = False  # inside an unquoted part
    trailing_ws = 0  # whitespace at the end of `out` from the unquoted part (trimmed at the end)
    while i < n:
        c = text[i]
        if c == "\n":
            i += 1
            line_no += 1
            break
        if c == "\\":
            nxt = text[i + 1] if i + 1 < n else ""
            if nxt == "\n":
                line_no += 1
            else:
                out.append(nxt)
                trailing_ws = 0
            unquoted = True
            i += 2
            continue
        if not unquoted and c in " \t\r":
            i += 1
            continue
        if not unquoted and c in "'\"":
            i, line_no = _parse_quoted(text, i, line_no, out)
            continue
        unquoted = True
        out.append(c)
        trailing_ws = trailing_ws + 1 if c in _WHITESPACE else 0
        i += 1
    if trailing_ws:
        del out[-trailing_ws:]
    return "".join(out), i, line_no


def _parse_quoted(text: str, i: int, line_no: int, out: list[str]) -> tuple[int, int]:
    """Append the quoted part starting at text[i] (a quote) to `out`; return the index after its closing quote."""
    n = len(text)
    quote_char = text[i]
    i += 1
    while i < n and text[i] != quote_char:
        ch = text[i]
        if quote_char == '"' and ch == "\\" and i + 1 < n:
            nxt = text[i + 1]
            if nxt == "\n":
                line_no += 1
            elif nxt in _DOUBLE_QUOTE_ESCAPABLE:
                out.append(nxt)
            else:
                out.extend((ch, nxt))
            i += 2
            continue
        if ch == "\n":
            line_no += 1
        out.append(ch)
        i += 1
    return i + 1, line_no


def read_files(paths: Iterable[str | os.PathLike[str]]) -> EnvFile:
    """Read env files in order; later files override earlier ones. Unreadable files become problems.

    Only regular files of at most MAX_BYTES are read: a FIFO, a device (or a link to one) or an oversized file is
    a problem naming the path, found without blocking and without reading it.
    """
    merged = EnvFile()
    for path in paths:
        try:
            raw = safeio.read_bounded(path, MAX_BYTES)
        except FileNotFoundError as exc:
            merged.refused.append(f"{path}: cannot read ({exc.strerror or exc})")
            merged.problems.append(merged.refused[-1])
            continue
        except safeio.RefusedFile as exc:
            merged.refused.append(str(exc))
            merged.problems.append(merged.refused[-1])
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            merged.refused.append(f"{path}: not UTF-8 text (byte {exc.start})")
            merged.problems.append(merged.refused[-1])
            continue
        one = parse(text, str(path))
        merged.problems.extend(one.problems)
        for key, value in one.values.items():
            merged.values.pop(key, None)  # keep the order of the last assignment
            merged.values[key] = value
            merged.origin[key] = one.origin[key]
    return merged


def quote(value: str) -> str:
    """Render a value so systemd (and parse()) read it back unchanged."""
    if _BARE_SAFE.match(value):
        return value
    escaped = "".join("\\" + c if c in _DOUBLE_QUOTE_ESCAPABLE else c for c in value)
    return f'"{escaped}"'


def render(values: Mapping[str, str], header: str = "") -> str:
    """An env file holding `values` in order, after optional comment lines."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{key}={quote(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def write_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o600) -> None:
    """Replace `path` with `text` (UTF-8, LF as given) so that readers see the old file or the new one, never a
    part; the file has `mode` from its first byte. The steps are twinspark.atomic's."""
    atomic.write_atomic(path, text.encode("utf-8"), mode=mode)
