"""What the tools ask systemd: the `systemctl show` command line and the parse of its answer, in one place.

Health (health/gather.py) and the pair guard (pair/io.py) both read unit properties this way.
"""

from __future__ import annotations

from collections.abc import Sequence


def show_argv(unit: str, properties: Sequence[str]) -> list[str]:
    """`systemctl show UNIT --property=A,B`: only the named properties, one `A=value` line each."""
    return ["systemctl", "show", unit, "--property=" + ",".join(properties)]


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show` output (`A=value` lines) as a mapping; lines without `=` are skipped."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values
