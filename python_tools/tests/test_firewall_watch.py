"""The firewall watcher (twinspark.firewall): a table deleted outside its unit is loaded again, and its verdict is what
the health sweep reports meanwhile.

The first tests drive one look at a time against an nft stand-in that keeps the table's presence in a variable; the
last one runs the real nft inside a network namespace of the test's own (root, unshare and nft needed, as .ci/run
installs them), deletes the table there and lets `twinspark firewall watch --once` bring it back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from twinspark import firewall, layout
from twinspark.health import checks

TABLE_FILE = "/etc/twinspark/firewall.nft"


class FakeNft:
    """`nft list table inet twinspark` and `nft -f FILE` over a table that is present or not."""

    LOADED = "table inet twinspark {\n\tchain input {\n\t\ttcp dport 8888 counter packets 0 bytes 0 drop\n\t}\n}\n"

    def __init__(self, present: bool, loads: bool = True, answers: bool = True) -> None:
        self.present, self.loads, self.answers = present, loads, answers
        self.rules = self.LOADED
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        argv = list(argv)
        self.calls.append(argv)
        if not self.answers:
            return subprocess.CompletedProcess(argv, 1, "", "netlink: Error: cache initialization failed: "
                                                            "Operation not permitted")
        if argv[1:3] == ["list", "table"]:
            if self.present:
                return subprocess.CompletedProcess(argv, 0, self.rules, "")
            return subprocess.CompletedProcess(argv, 1, "", "Error: No such file or directory\nlist table inet "
                                                            "twinspark\n                 ^^^^^^^^^\n")
        if argv[1] == "-f":
            if self.loads:
                self.present, self.rules = True, self.LOADED
                return subprocess.CompletedProcess(argv, 0, "", "")
            return subprocess.CompletedProcess(argv, 1, "", f"{argv[2]}:3:1-5: Error: syntax error")
        raise AssertionError(f"unexpected nft call {argv}")


class Clock:
    def __init__(self, at: float = 1000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def _watched() -> firewall.State:
    """A verdict whose reference is the table as FakeNft loads it."""
    return firewall.State("inet twinspark", True, 0, 2, digest=firewall.fingerprint(FakeNft.LOADED))


def test_a_present_table_is_left_alone():
    nft, said = FakeNft(present=True), []
    state = firewall.step(_watched(), TABLE_FILE, nft, Clock(), said.append)
    assert state.present is True and state.reapplied == 0
    assert [call[1] for call in nft.calls] == ["list"]
    assert said == []
    assert firewall.judge(json.loads(state.to_json()), 1001.0) == (0, "table inet twinspark loaded")


def test_the_first_look_loads_the_file_once_so_the_reference_is_the_watchers_own_load():
    nft, said = FakeNft(present=True), []
    nft.rules = "table inet twinspark {\n}\n"  # emptied before the watcher started
    state = firewall.step(firewall.State("inet twinspark", None, 0, 2), TABLE_FILE, nft, Clock(), said.append)
    assert [call[1] for call in nft.calls] == ["list", "-f", "list"]
    assert nft.rules == FakeNft.LOADED and state.digest == firewall.fingerprint(FakeNft.LOADED)
    assert state.present is True and said == []


def test_a_flushed_chain_is_loaded_again_and_said_once():
    nft, said, clock = FakeNft(present=True), [], Clock()
    nft.rules = "table inet twinspark {\n\tchain input {\n\t}\n}\n"  # nft flush chain inet twinspark input
    state = firewall.step(_watched(), TABLE_FILE, nft, clock, said.append)
    assert nft.calls[1] == [firewall.NFT, "-f", TABLE_FILE] and nft.rules == FakeNft.LOADED
    assert state.changed == 1 and state.reapplied == 1 and state.present is True
    assert len(said) == 1 and "held other rules" in said[0] and "without touching vLLM" in said[0]
    clock.at += 2
    firewall.step(state, TABLE_FILE, nft, clock, said.append)
    assert len(said) == 1 and state.changed == 1, "a table that holds what was loaded is left alone"
    assert firewall.judge(json.loads(state.to_json()), clock.at)[0] == 0


def test_traffic_through_the_counters_is_not_a_change():
    nft, said = FakeNft(present=True), []
    nft.rules = FakeNft.LOADED.replace("packets 0 bytes 0", "packets 1234 bytes 567890")
    state = firewall.step(_watched(), TABLE_FILE, nft, Clock(), said.append)
    assert [call[1] for call in nft.calls] == ["list"] and state.changed == 0 and said == []


def test_a_deleted_table_is_loaded_again_and_said_once():
    nft, said, clock = FakeNft(present=False), [], Clock()
    state = firewall.step(firewall.State("inet twinspark", True, 0, 2), TABLE_FILE, nft, clock, said.append)
    assert nft.calls[1] == [firewall.NFT, "-f", TABLE_FILE]
    assert state.present is True and state.reapplied == 1 and state.missing_since is None
    assert len(said) == 1 and "was missing" in said[0] and "without touching vLLM" in said[0]
    clock.at += 2
    firewall.step(state, TABLE_FILE, nft, clock, said.append)
    assert len(said) == 1, "a table that stayed loaded is not reported again"
    code, line = firewall.judge(json.loads(state.to_json()), clock.at)
    assert code == 0 and "re-applied 1 time(s)" in line


def test_a_table_that_will_not_load_is_reported_missing_with_nfts_reason():
    nft, said, clock = FakeNft(present=False, loads=False), [], Clock()
    state = firewall.step(firewall.State("inet twinspark", True, 0, 2), TABLE_FILE, nft, clock, said.append)
    assert state.present is False and state.reapplied == 0 and state.missing_since == 1000.0
    assert "syntax error" in said[0] and "unfiltered" in said[0]
    firewall.step(state, TABLE_FILE, nft, clock, said.append)
    assert len(said) == 1, "the same complaint is said once, not every interval"
    assert nft.calls[-1][1] == "-f", "but the load is tried again every interval"
    clock.at += 30
    code, line = firewall.judge(json.loads(state.to_json()) | {"checked_at": clock.at}, clock.at)
    assert code == 2
    assert "missing for 30 s" in line and "syntax error" in line


def test_an_nft_that_cannot_answer_is_unknown_not_missing():
    nft, said = FakeNft(present=False, answers=False), []
    state = firewall.step(firewall.State("inet twinspark", None, 0, 2), TABLE_FILE, nft, Clock(), said.append)
    assert state.present is None and not any(call[1] == "-f" for call in nft.calls), "never reload blind"
    assert firewall.judge(json.loads(state.to_json()), 1000.0)[0] == 1


def test_a_stale_verdict_cannot_vouch_for_the_table():
    state = json.loads(firewall.State("inet twinspark", True, 1000.0, 2).to_json())
    assert firewall.judge(state, 1000.0 + 5 * 2 + 10)[0] == 0
    code, line = firewall.judge(state, 1000.0 + 5 * 2 + 11)
    assert code == 1 and "old" in line
    assert firewall.judge(firewall.read_state(Path("/nonexistent/state.json")), 0)[0] == 1


def _facts(state: dict, watch_active: str = "active", firewall_loaded: str = "loaded", watch_loaded: str = "loaded",
           now: float = 1000.0) -> dict:
    return {"firewall_unit": {"LoadState": firewall_loaded, "ActiveState": "active"},
            "watch_unit": {"LoadState": watch_loaded, "ActiveState": watch_active}, "state": state, "now": now}


def test_health_says_what_the_watcher_says():
    loaded = json.loads(firewall.State("inet twinspark", True, 1000.0, 2).to_json())
    missing = json.loads(firewall.State("inet twinspark", False, 1000.0, 2, missing_since=990.0,
                                        error="Error: syntax error").to_json())
    assert checks.check_firewall("node1", _facts(loaded)).status == checks.OK
    result = checks.check_firewall("node1", _facts(missing))
    assert result.status == checks.DEGRADED and "missing for 10 s" in result.message and result.fix
    stale = checks.check_firewall("node1", _facts(loaded, now=2000.0))
    assert stale.status == checks.UNKNOWN
    stopped = checks.check_firewall("node1", _facts(loaded, watch_active="inactive"))
    assert stopped.status == checks.DEGRADED and "would stay deleted" in stopped.message
    absent = checks.check_firewall("node1", _facts({}, watch_loaded="not-found"))
    assert absent.status == checks.DEGRADED and "site.yml" in absent.fix
    off = checks.check_firewall("node1", _facts({}, firewall_loaded="not-found", watch_loaded="not-found"))
    assert off.status == checks.OK


def test_the_check_runs_in_every_node_sweep():
    names = [result.check for result in checks.node_checks("node1", {"firewall": _facts({}, watch_loaded="x")})]
    assert "firewall" in names


def test_watch_refuses_a_missing_file(tmp_path, capsys):
    assert firewall.watch(str(tmp_path / "absent.nft"), tmp_path / "state.json", 2, run=FakeNft(True), once=True) == 2
    assert "absent.nft does not exist" in capsys.readouterr().err
    assert not (tmp_path / "state.json").exists()


def test_watch_writes_a_verdict_others_can_read(tmp_path):
    table = tmp_path / "firewall.nft"
    table.write_text("table inet twinspark {}\n")
    state_path = tmp_path / "run" / "state.json"
    assert firewall.watch(str(table), state_path, 2, run=FakeNft(False), rounds=2, sleep=lambda _s: None) == 0
    assert oct(state_path.stat().st_mode & 0o777) == "0o644"
    assert firewall.read_state(state_path)["reapplied"] == 1


def test_the_state_path_and_unit_come_from_the_layout():
    lay = layout.default()
    assert lay.firewall_state.endswith(".json") and lay.unit_firewall_watch.endswith(".service")
    unit = (Path(__file__).parents[2] / "roles/host_firewall/templates/twinspark-firewall-watch.service.j2").read_text()
    assert "BindsTo={{ twinspark_layout_unit_firewall }}" in unit
    assert "--state {{ twinspark_layout_firewall_state }}" in unit


NFT = shutil.which("nft") or "/usr/sbin/nft"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not os.access(NFT, os.X_OK),
                    reason="needs root, unshare and nft (a network namespace of the test's own)")
def test_real_nft_a_deleted_table_comes_back_in_a_namespace_of_our_own(tmp_path):
    table, state, cli = _watched_table(tmp_path)
    watch = " ".join([*map(_q, cli), "firewall", "watch", "--file", _q(str(table)), "--state", _q(str(state)),
                      "--once"])
    status = " ".join([*map(_q, cli), "firewall", "status", "--state", _q(str(state))])
    script = f"""
        set -u
        {NFT} -f {_q(str(table))} || exit 10
        {NFT} delete table inet twinspark || exit 11
        {NFT} list table inet twinspark >/dev/null 2>&1 && exit 12
        {watch} || exit 13
        {NFT} list table inet twinspark | grep -q 'dport 8888' || exit 14
        {status} || exit 15
        """
    done = subprocess.run(["unshare", "--net", "bash", "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "was missing" in done.stdout and "re-applied 1 time(s)" in done.stdout
    assert json.loads(state.read_text())["present"] is True


def _watched_table(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """The table file both real-nft tests load, the watcher's state path, and the CLI as a command line."""
    table = tmp_path / "firewall.nft"
    table.write_text(textwrap.dedent("""\
        table inet twinspark
        delete table inet twinspark
        table inet twinspark {
            chain input {
                type filter hook input priority filter; policy accept;
                tcp dport 8888 counter drop comment "API: only the allowed networks"
            }
        }
        """))
    cli = [sys.executable, "-c", "import sys; from twinspark import cli; sys.exit(cli.main())"]
    return table, tmp_path / "state.json", cli


def _q(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


@pytest.mark.slow(5)
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not os.access(NFT, os.X_OK),
                    reason="needs root, unshare and nft (a network namespace of the test's own)")
def test_real_nft_a_flushed_chain_is_loaded_again_by_the_running_watcher(tmp_path):
    """Issue 43, row 9: `nft flush chain inet twinspark input` left the chain empty under its accept policy."""
    table, state, cli = _watched_table(tmp_path)
    watch = " ".join([*map(_q, cli), "firewall", "watch", "--file", _q(str(table)), "--state", _q(str(state)),
                      "--interval", "0.2"])
    script = f"""
        set -u
        {NFT} -f {_q(str(table))} || exit 10
        {watch} & watcher=$!
        trap 'kill $watcher' EXIT
        for i in $(seq 50); do [ -s {_q(str(state))} ] && break; sleep 0.1; done
        sleep 0.5
        {NFT} flush chain inet twinspark input || exit 11
        for i in $(seq 50); do
            {NFT} list table inet twinspark | grep -q 'dport 8888' && grep -q '"changed": 1' {_q(str(state))} && exit 0
            sleep 0.1
        done
        exit 12
        """
    done = subprocess.run(["unshare", "--net", "bash", "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "held other rules" in done.stdout


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not os.access(NFT, os.X_OK),
                    reason="needs root, unshare and nft (a network namespace of the test's own)")
def test_real_nft_the_lone_copy_watches_the_routers_table(tmp_path):
    """The router host runs this file alone (roles/router copies it as firewallwatch.py) with the system Python and
    `-I`, so it must import nothing else of the package; a flushed chain of `inet twinspark_router` comes back."""
    lone = tmp_path / "firewallwatch.py"
    shutil.copy(Path(firewall.__file__), lone)
    table = tmp_path / "router.nft"
    table.write_text(textwrap.dedent("""\
        table inet twinspark_router
        delete table inet twinspark_router
        table inet twinspark_router {
            chain input {
                type filter hook input priority filter; policy accept;
                tcp dport 30000 counter drop comment "router: only the allowed networks"
            }
        }
        """))
    state = tmp_path / "run" / "firewall.json"
    watch = " ".join(map(_q, [sys.executable, "-I", str(lone), "firewall", "watch", "--file", str(table), "--state",
                              str(state), "--table", "inet twinspark_router", "--interval", "0.2"]))
    script = f"""
        set -u
        {NFT} -f {_q(str(table))} || exit 10
        {watch} & watcher=$!
        trap 'kill $watcher' EXIT
        for i in $(seq 50); do [ -s {_q(str(state))} ] && break; sleep 0.1; done
        sleep 0.5
        {NFT} flush chain inet twinspark_router input || exit 11
        for i in $(seq 50); do
            {NFT} list table inet twinspark_router | grep -q 'dport 30000' && grep -q '"changed": 1' {_q(str(state))} \
                && exit 0
            sleep 0.1
        done
        exit 12
        """
    done = subprocess.run(["unshare", "--net", "bash", "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=60, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "table inet twinspark_router held other rules" in done.stdout
    assert json.loads(state.read_text())["table"] == "inet twinspark_router"


def test_a_table_without_its_family_is_refused(tmp_path, capsys):
    table = tmp_path / "t.nft"
    table.write_text("table inet x {}\n")
    assert firewall.main(["firewall", "watch", "--file", str(table), "--state", str(tmp_path / "s.json"),
                          "--table", "twinspark_router", "--once"]) == 2
    assert "--table 'twinspark_router': give the family and the name" in capsys.readouterr().err

