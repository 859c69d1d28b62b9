"""`twinspark fabric bench`: bandwidth arithmetic, verdicts and exit codes (torch replaced where it would run)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from twinspark import cli
from twinspark.fabric import bench


@pytest.mark.parametrize(
    ("text", "value"),
    [("64K", 65536), ("1M", 1 << 20), ("16MiB", 16 << 20), ("1G", 1 << 30), ("4096", 4096), (" 2g ", 2 << 30)],
)
def test_sizes_are_binary_units(text, value):
    assert bench.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "1T", "-1M", "0", "6", "1.5M", "M"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ValueError):
        bench.parse_size(text)


def test_size_list_is_sorted_and_deduplicated():
    assert bench.parse_sizes("16M,1M,16M") == [1 << 20, 16 << 20]


def test_busbw_factor_is_two_n_minus_one_over_n():
    assert bench.bus_factor(2) == 1.0
    assert bench.bus_factor(8) == 1.75
    assert bench.bus_factor(1) == 0.0


def test_algbw_and_busbw_for_the_pair():
    # 1 GiB in 0.05 s: 21.47 GB/s algbw; with two ranks busbw equals algbw.
    result = bench.size_result(1 << 30, 0.05, 2)
    assert result.algbw_gbps == pytest.approx(21.474836, rel=1e-6)
    assert result.busbw_gbps == result.algbw_gbps
    assert bench.size_result(1 << 30, 0.05, 4).busbw_gbps == pytest.approx(21.474836 * 1.5, rel=1e-6)


def test_gb10_pass_mark_is_nvidias_and_cpu_has_none():
    assert bench.default_threshold("gb10") == 21.875
    assert bench.default_threshold("cpu") is None


def results(*busbw_at_1g: float) -> list[bench.SizeResult]:
    return [bench.size_result(1 << 30, (1 << 30) / (b * 1e9), 2) for b in busbw_at_1g]


def test_peak_is_judged_not_the_last_size():
    verdict = bench.judge(results(22.5, 21.0), 21.875)
    assert verdict.peak_busbw_gbps == pytest.approx(22.5)
    assert verdict.passed is True


def test_below_threshold_fails_and_no_threshold_only_reports():
    assert bench.judge(results(21.8), 21.875).passed is False
    assert bench.judge(results(3.0), None).passed is None


def run_cli(monkeypatch, capsys, figures: list[bench.SizeResult], *args: str) -> tuple[int, str, str, dict]:
    """Run the CLI with the torch part replaced by fixed figures; returns the arguments it would have run with."""
    seen: dict = {}

    def fake_run(**kwargs):
        seen.update(kwargs)
        return figures

    monkeypatch.setattr(bench, "run_all_reduce", fake_run)
    code = cli.main(["fabric", "bench", "--rank", "0", "--master", "127.0.0.1", *args])
    out, err = capsys.readouterr()
    return code, out, err, seen


def test_gb10_below_the_pass_mark_exits_1(monkeypatch, capsys):
    code, out, _, seen = run_cli(monkeypatch, capsys, results(3.1), "--profile", "gb10")
    assert code == 1
    assert "FAIL (threshold 21.875 GB/s)" in out
    assert seen["backend"] == "nccl"


def test_gb10_above_the_pass_mark_exits_0(monkeypatch, capsys):
    code, out, _, _ = run_cli(monkeypatch, capsys, results(23.7), "--backend", "nccl")
    assert code == 0
    assert "PASS" in out


def test_cpu_reports_without_judging_unless_asked(monkeypatch, capsys):
    code, out, _, _ = run_cli(monkeypatch, capsys, results(0.4), "--backend", "gloo")
    assert code == 0
    assert "report only" in out
    code, _, _, _ = run_cli(monkeypatch, capsys, results(0.4), "--backend", "gloo", "--threshold-gbps", "1")
    assert code == 1


def test_json_report(monkeypatch, capsys):
    code, out, _, _ = run_cli(monkeypatch, capsys, results(1.5, 2.5), "--backend", "gloo", "--json",
                           "--threshold-gbps", "2")
    report = json.loads(out)
    assert code == 0
    assert report["passed"] is True
    assert report["peak_busbw_gbps"] == pytest.approx(2.5)
    assert [round(r["busbw_gbps"], 3) for r in report["results"]] == [1.5, 2.5]
    assert report["world_size"] == 2


def test_bad_input_exits_2_before_any_connection(monkeypatch, capsys):
    code, _, err, seen = run_cli(monkeypatch, capsys, results(1.0), "--sizes", "1T")
    assert code == 2
    assert "--sizes" in err
    assert seen == {}


@pytest.mark.parametrize("args", [("--deadline", "0"), ("--timeout", "-1")])
def test_a_deadline_or_timeout_not_above_zero_exits_2_before_any_connection(monkeypatch, capsys, args):
    code, _, err, seen = run_cli(monkeypatch, capsys, results(1.0), *args)
    assert code == 2
    assert "--timeout and --deadline must be above 0 seconds" in err
    assert seen == {}


def test_the_watchdog_gives_up_with_exit_1_after_its_deadline_and_not_once_cancelled(capsys):
    codes: list[int] = []
    fired = threading.Event()

    def give_up(code: int) -> None:
        codes.append(code)
        fired.set()

    bench.watchdog(0.05, "no result within 0.05 s", give_up)
    assert fired.wait(5)
    assert codes == [1]
    assert "no result within 0.05 s" in capsys.readouterr().err
    cancelled = bench.watchdog(0.05, "never", give_up)
    cancelled.cancel()
    time.sleep(0.2)
    assert codes == [1]


def test_a_finished_run_cancels_its_watchdog(monkeypatch, capsys):
    timers: list[threading.Timer] = []
    real = bench.watchdog
    monkeypatch.setattr(bench, "watchdog", lambda *a: timers.append(real(3600, "never", lambda code: None))
                        or timers[-1])
    code, _, _, _ = run_cli(monkeypatch, capsys, results(1.0), "--backend", "gloo")
    assert code == 0
    assert len(timers) == 1 and timers[0].finished.is_set()


def test_table_shows_each_size(monkeypatch, capsys):
    figures = [bench.size_result(1 << 20, 0.001, 2), bench.size_result(64 << 20, 0.05, 2)]
    _, out, _, _ = run_cli(monkeypatch, capsys, figures, "--backend", "gloo")
    rows = [line.split() for line in out.splitlines()[2:4]]
    assert rows[0][:2] == ["1M", "1048576"]
    assert rows[1][:2] == ["64M", "67108864"]
    assert rows[1][3] == rows[1][4] == f"{(64 << 20) / 0.05 / 1e9:.3f}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_ranks_over_loopback_with_gloo(vllm_python):
    """Real torch.distributed over loopback: the parser venv's CPU torch runs this package's bench (the dev venv
    carries no torch)."""
    port = str(free_port())
    common = ["-m", "twinspark.cli", "fabric", "bench", "--master", "127.0.0.1", "--port", port, "--backend", "gloo",
              "--ifname", "lo", "--sizes", "64K,1M", "--iters", "3", "--warmup", "1", "--timeout", "60", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    ranks = [subprocess.Popen([str(vllm_python), *common, "--rank", str(r)], stdout=subprocess.PIPE, text=True,
                              env=env)
             for r in (0, 1)]
    outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0]
    reports = [json.loads(output) for output in outputs]
    assert [r["bytes"] for r in reports[0]["results"]] == [65536, 1 << 20]
    assert reports[0]["peak_busbw_gbps"] == reports[1]["peak_busbw_gbps"] > 0


def test_a_rendezvous_port_that_accepts_and_never_answers_ends_at_the_deadline(vllm_python):
    """Real torch: rank 1's client waits for the store's reply past its own --timeout (it hung over 10 minutes on the
    simulated pair, and in CI); the run's deadline ends it with exit 1 and one line."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = str(silent.getsockname()[1])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        started = time.monotonic()
        done = subprocess.run([str(vllm_python), "-m", "twinspark.cli", "fabric", "bench", "--rank", "1", "--master",
                               "127.0.0.1", "--port", port, "--backend", "gloo", "--ifname", "lo", "--timeout", "2",
                               "--deadline", "8", "--json"], capture_output=True, text=True, env=env, timeout=120)
        took = time.monotonic() - started
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        f"twinspark fabric bench: all_reduce with gloo to 127.0.0.1:{port} gave no result within 8 s (--deadline); "
        "giving up")
    assert 8 <= took < 60
