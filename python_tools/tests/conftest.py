"""The suite's order: the files whose tests are marked slow run first, the slowest file first.

`make test` runs pytest-xdist with one file per worker at a time (--dist loadfile) and without xdist's own reorder
(which puts files with many tests first, so a file of one long role run started last and ran alone at the end).
Handing out the longest files first lets the workers finish together. The files that need the vLLM parser venv
(fixture `vllm_python`) come right after the other slow files: as soon as the selection needs that venv, one worker
starts building it in the background once its collection is done, so on a fresh machine (where the build takes a
minute or two) no worker waits for it at the start; the fixture then waits for that build, or builds the venv
itself.

`@pytest.mark.slow(seconds)` marks a test that costs real time here (a role run on localhost, the vLLM parser
venv, a real sshd or router, network namespaces), with about how many seconds it took on the 2-core development
machine; a file's weight is the sum over its tests. The figures only order the files: nothing is timed or compared
with them. `make test` runs every test; `pytest -m "not slow"` leaves the marked ones out for a quick round.

A test that runs ansible-playbook or builds a venv is slow whatever it says: it asks for the fixture
`ansible_playbook` (the venv's binary) or `vllm_python` (the vLLM parser venv's python), and either makes it slow here
(SLOW_FIXTURES). An unmarked test that starts such a command anyway fails, naming the fixture to ask for, so the
quick round stays quick and no slow test hides in it.

Under CI=true (CI's `.ci/run` installs every tool the suite uses) a skipped test fails instead, unless it carries
`@pytest.mark.ci_may_skip("why")`: a tool that is missing there is CI's bug, never a pass.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
BUILD_PARSER_VENV = REPO / "scripts" / "build-vllm-parser-venv"
PARSER_VLLM_VERSION = "0.33.0"
_BACKGROUND: list[subprocess.Popen] = []  # the background parser venv build (kept, so it is not reported as lost)
# The fixtures whose users are slow, with about what one such test costs on 2 cores (orders the files only).
SLOW_FIXTURES = {"vllm_python": 60.0, "ansible_playbook": 10.0}


def pytest_configure(config: pytest.Config) -> None:
    # Loaded here, once, so that the guard below can refuse its `run` to unmarked tests (the front door imports it
    # when it runs a playbook). A controller extra: without it there is nothing to guard.
    with contextlib.suppress(ImportError):
        import ansible_runner  # noqa: F401
    config.addinivalue_line(
        "markers", "slow(seconds): costs real time here (about `seconds` on 2 cores); files with the most run first")
    config.addinivalue_line(
        "markers", "ci_may_skip(why): this test may skip under CI=true (any other skip fails there)")


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
    for item in items:
        costs = [SLOW_FIXTURES[name] for name in getattr(item, "fixturenames", ()) if name in SLOW_FIXTURES]
        if costs and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow(max(costs)))
    weight: dict[str, float] = {}
    for item in items:
        weight[_file(item)] = weight.get(_file(item), 0.0) + _seconds(item)
    parser = {_file(item) for item in items if "vllm_python" in getattr(item, "fixturenames", ())}
    first_seen = {name: index for index, name in enumerate(dict.fromkeys(_file(item) for item in items))}
    # Stable: the tests of a file keep their order, and unmarked files keep theirs after the marked ones.
    items.sort(key=lambda item: (_band(_file(item), weight, parser), -weight[_file(item)], first_seen[_file(item)]))


def pytest_collection_finish(session: pytest.Session) -> None:
    # After every deselection (`-m "not slow"`, `-k`): only a run that will ask for the parser venv builds it.
    if any("vllm_python" in getattr(item, "fixturenames", ()) for item in session.items):
        _start_parser_venv_build()


def _band(name: str, weight: dict[str, float], parser: set[str]) -> int:
    """0: slow files that need no parser venv; 1: those that need it (its build has a head start); 2: the rest."""
    if name in parser:
        return 1
    return 0 if weight[name] > 0 else 2


def _start_parser_venv_build() -> None:
    """Start building the vLLM parser venv in the background, once per run (the first worker, or the only process).

    The build script takes a lock per venv and returns at once when the venv is complete, so a build already under
    way, or a second caller, costs nothing; its output goes to a log next to the venvs. The `vllm_python` fixture runs
    the same script and waits on the same lock; if this build failed, the fixture's own run says why."""
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    root = Path(os.environ.get("TWINSPARK_VLLM_PARSER_VENV_ROOT", "/var/tmp/twinspark-vllm-parser-venv"))
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        with open(root / "background-build.log", "wb") as log:
            _BACKGROUND.append(subprocess.Popen([str(BUILD_PARSER_VENV), PARSER_VLLM_VERSION], stdin=subprocess.DEVNULL,
                                                stdout=log, stderr=log, start_new_session=True))


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


@pytest.fixture(scope="session")
def ansible_playbook() -> Path:
    """This venv's ansible-playbook. Asking for it marks the test slow (a playbook run costs seconds here)."""
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK} not installed (make setup)")
    return ANSIBLE_PLAYBOOK


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM parser venv's python (scripts/build-vllm-parser-venv: vllm==0.33.0 --no-deps, a CPU torch, what
    vLLM's CLI imports), built once and cached under /var/tmp. Asking for it marks the test slow."""
    done = subprocess.run([str(BUILD_PARSER_VENV), PARSER_VLLM_VERSION], capture_output=True, text=True,
                          timeout=1800)
    if done.returncode == 3:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, f"scripts/build-vllm-parser-venv failed:\n{done.stderr[-4000:]}"
    return Path(done.stdout.strip().splitlines()[-1]) / "bin" / "python"


def _slow_command(args: object) -> str | None:
    """What makes a command slow: ansible-playbook, or building a venv. None for anything else."""
    argv = [str(a) for a in args] if isinstance(args, list | tuple) else str(args).split()
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if name in ("ansible-playbook", "ansible") or any(os.path.basename(a) == "ansible-playbook" for a in argv[:3]):
        return "ansible-playbook (ask for the fixture `ansible_playbook`)"
    if name == "render-units":
        return "ansible-playbook through scripts/render-units (mark the test @pytest.mark.slow(seconds))"
    if name == BUILD_PARSER_VENV.name or (argv[1:3] == ["-m", "venv"] and "--without-pip" not in argv):
        return "a venv build (ask for the fixture `vllm_python`, or mark the test @pytest.mark.slow(seconds))"
    return None


class _Guarded(subprocess.Popen):
    """subprocess.Popen for a test not marked slow: ansible-playbook or a venv build fails it, naming the fixture."""

    nodeid = ""

    def __init__(self, args, *rest, **kwargs):
        why = _slow_command(args)
        if why:
            pytest.fail(f"{_Guarded.nodeid} is not marked slow but runs {why}", pytrace=False)
        super().__init__(args, *rest, **kwargs)


def _refuse_runner(*args, **kwargs):
    pytest.fail(f"{_Guarded.nodeid} is not marked slow but runs ansible-playbook through ansible-runner (ask for the "
                "fixture `ansible_playbook`)", pytrace=False)


def _guarded(item: pytest.Item) -> list[tuple[object, str, object]] | None:
    """Around a test's setup (module fixtures included) and call: the guard, unless the test is marked slow. Returns
    what to put back: subprocess.Popen, and ansible_runner.run (it starts ansible-playbook through a pty, not Popen)."""
    if item.get_closest_marker("slow") is not None:
        return None
    _Guarded.nodeid = item.nodeid
    saved: list[tuple[object, str, object]] = [(subprocess, "Popen", subprocess.Popen)]
    subprocess.Popen = _Guarded  # type: ignore[misc]
    runner = sys.modules.get("ansible_runner")
    if runner is not None:
        saved.append((runner, "run", runner.run))
        runner.run = _refuse_runner
    return saved


def _restore(saved: list[tuple[object, str, object]] | None) -> None:
    for owner, name, value in saved or []:
        setattr(owner, name, value)


def _guarding(item: pytest.Item):
    saved = _guarded(item)
    try:
        yield
    finally:
        _restore(saved)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    yield from _guarding(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    yield from _guarding(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get("CI") != "true" or item.get_closest_marker("ci_may_skip") is not None:
        return
    if hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped under CI=true, where every tool the suite uses is installed: {reason} "
                       "(install what it names in .ci/run or make setup, or mark the test "
                       "@pytest.mark.ci_may_skip(\"why\") when no tool is missing)")
