"""The NCCL_IB_HCA selector grammar, as NCCL's parseStringList and matchIfList read it.

Pure functions over plain data: nothing here touches the filesystem. A selector only ever filters names that were
listed from sysfs; it is never turned into a path.

Grammar (docs/FABRIC.md says it in short):

- a leading ``^`` excludes the listed devices instead of selecting them;
- then a leading ``=`` asks for exact names (otherwise a token is a name prefix);
- comma-separated tokens ``name[:port[:rail[:plane]]]``; rail and plane are ignored;
- empty names are dropped, only the first 32 named tokens count, names are cut to 63 bytes;
- an empty port (``devA:``) means any port; otherwise the port is read like C ``atoi``;
- an empty list selects every port; a bare ``^`` selects none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MAX_TOKENS = 32
"""NCCL keeps at most this many selector entries (MAX_IB_DEVS)."""

MAX_NAME_BYTES = 63
"""NCCL copies names into a 64-byte buffer with a terminating NUL."""

MAX_PORTS = 32
"""NCCL uses at most this many IB ports; the rest are ignored."""

ANY_PORT = -1
"""NCCL's own marker for "any port"; also what an empty or absent port means."""

PORT_CLAMP = 999_999_999
"""Ports with more than nine significant digits are clamped to +-this value so they can never wrap to -1."""

_C_SPACE = " \t\n\v\f\r"


@dataclass(frozen=True)
class Token:
    """One selector entry: a device name (or prefix) and a port, ANY_PORT meaning any."""

    name: str
    port: int = ANY_PORT


@dataclass(frozen=True)
class Selector:
    """A parsed NCCL_IB_HCA value."""

    text: str
    exclude: bool
    exact: bool
    tokens: tuple[Token, ...]
    notes: tuple[str, ...] = ()


def parse_port(text: str) -> int:
    """Read a port the way C ``atoi`` does, clamped so it never wraps.

    Leading whitespace and one sign are accepted, digits are read in base 10 until the first non-digit, and no digits
    at all give 0 (a port that matches nothing). More than nine significant digits clamp to +-999999999.
    """
    rest = text.lstrip(_C_SPACE)
    sign = 1
    if rest[:1] in ("+", "-"):
        sign = -1 if rest[0] == "-" else 1
        rest = rest[1:]
    digits = ""
    for char in rest:
        if char not in "0123456789":
            break
        digits += char
    significant = digits.lstrip("0")
    if len(significant) > 9:
        return sign * PORT_CLAMP
    return sign * int(significant or "0")


def _cut_name(name: str) -> str:
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) <= MAX_NAME_BYTES:
        return name
    return encoded[:MAX_NAME_BYTES].decode("utf-8", "ignore")


def _parse_token(raw: str) -> Token | None:
    name, colon, rest = raw.partition(":")
    if not name:
        return None
    port_field = rest.split(":", 1)[0] if colon else ""
    port = parse_port(port_field) if port_field else ANY_PORT
    return Token(name=_cut_name(name), port=port)


def parse_selector(text: str | None) -> Selector:
    """Parse an NCCL_IB_HCA value (None or empty: select everything)."""
    raw = text or ""
    body = raw
    exclude = body.startswith("^")
    if exclude:
        body = body[1:]
    exact = body.startswith("=")
    if exact:
        body = body[1:]
    tokens: list[Token] = []
    notes: list[str] = []
    for part in body.split(","):
        token = _parse_token(part)
        if token is None:
            continue
        if len(tokens) == MAX_TOKENS:
            notes.append(f"selector list truncated: only the first {MAX_TOKENS} entries of NCCL_IB_HCA are used")
            break
        tokens.append(token)
    return Selector(text=raw, exclude=exclude, exact=exact, tokens=tuple(tokens), notes=tuple(notes))


def _name_matches(token: Token, device: str, exact: bool) -> bool:
    return device == token.name if exact else device.startswith(token.name)


def _port_matches(token: Token, port: int) -> bool:
    return token.port == ANY_PORT or port == ANY_PORT or token.port == port


def listed(selector: Selector, device: str, port: int) -> bool:
    """Whether some selector entry names this device port (before ``^`` is applied)."""
    return any(_name_matches(t, device, selector.exact) and _port_matches(t, port) for t in selector.tokens)


def selects(selector: Selector, device: str, port: int) -> bool:
    """Whether the selector picks this device port."""
    if not selector.tokens:
        return not selector.exclude
    return listed(selector, device, port) != selector.exclude


def select_ports(
    selector: Selector, ports: Iterable[tuple[str, int]], limit: int = MAX_PORTS
) -> tuple[list[tuple[str, int]], list[str]]:
    """The ports the selector picks, in device-name then port order, at most ``limit`` of them.

    Returns (kept, notes); a note names every port dropped by the limit.
    """
    chosen = sorted({(device, port) for device, port in ports if selects(selector, device, port)})
    notes: list[str] = []
    if len(chosen) > limit:
        dropped = ", ".join(f"{device}:{port}" for device, port in chosen[limit:])
        notes.append(f"more than {limit} ports selected; NCCL uses the first {limit}, ignoring {dropped}")
        chosen = chosen[:limit]
    return chosen, notes
