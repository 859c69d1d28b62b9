"""Loads the handshaped_nvidia_smi_* fixtures: nvidia-smi outputs standing in for a GPU this machine lacks."""

from __future__ import annotations

from pathlib import Path

from twinspark import gpu

FIXTURES = Path(__file__).parent / "fixtures"


def handshaped(case: str) -> tuple[str, str, int]:
    """(stdout, stderr, exit status) of the hand-shaped nvidia-smi query for `case`."""
    directory = FIXTURES / f"handshaped_nvidia_smi_{case}"
    return (
        (directory / "stdout.txt").read_text(),
        (directory / "stderr.txt").read_text(),
        int((directory / "returncode").read_text()),
    )


def parse_handshaped(case: str) -> gpu.GpuQuery:
    return gpu.parse_query_output(*handshaped(case))
