"""The suite's order: the files whose tests are marked slow run first, the slowest file first.

`make test` runs pytest-xdist with one file per worker at a time (--dist loadfile) and without xdist's own reorder
(which puts files with many tests first, so a file of one long role run started last and ran alone at the end).
Handing out the longest files first lets the workers finish together.

`@pytest.mark.slow(seconds)` marks a test that costs real time here (a role run on localhost, the vLLM parser
venv, a real sshd or router, network namespaces), with about how many seconds it took on the 2-core development
machine; a file's weight is the sum over its tests. The figures only order the files: nothing is timed or compared
with them. `make test` runs every test; `pytest -m "not slow"` leaves the marked ones out for a quick round.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow(seconds): costs real time here (about `seconds` on 2 cores); files with the most run first")


def _seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("slow")
    if marker is None:
        return 0.0
    seconds = marker.args[0] if marker.args else marker.kwargs.get("seconds")
    if not isinstance(seconds, int | float) or seconds <= 0:
        raise pytest.UsageError(f"{item.nodeid}: give @pytest.mark.slow the seconds it takes, e.g. slow(30)")
    return float(seconds)


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    weight: dict[str, float] = {}
    for item in items:
        weight[_file(item)] = weight.get(_file(item), 0.0) + _seconds(item)
    first_seen = {name: index for index, name in enumerate(dict.fromkeys(_file(item) for item in items))}
    # Stable: the tests of a file keep their order, and unmarked files keep theirs after the marked ones.
    items.sort(key=lambda item: (-weight[_file(item)], first_seen[_file(item)]))


@pytest.fixture(autouse=True)
def _environment_restored():
    """Every test ends with the process environment it started with.

    Some commands under test set os.environ in-process before they exec or import vLLM (`twinspark runtime check`
    puts the rank's whole environment there). With xdist's one-file-per-worker order, a later file on the same
    worker then read those values: `serve --environ` refused a cpu env file because a gb10 NCCL_IB_HCA was left
    over from an earlier test. Restoring here keeps a test's result independent of which file ran before it."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)
