"""`twinspark gpu info` on hand-shaped nvidia-smi outputs (fixtures handshaped_nvidia_smi_*: no GPU here, see
their .md)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from handshaped_nvidia_smi import handshaped, parse_handshaped

from twinspark import cli, gpu


def test_handshaped_gb10_on_driver_580_is_listed_with_unified_memory_reported_as_unknown():
    query = parse_handshaped("gb10_driver_580")
    assert query.status == "ok" and query.exit_code == 0
    (only,) = query.gpus
    assert only.name == "NVIDIA GB10"
    assert only.driver_version == "580.95.05" and only.driver_branch == 580
    assert only.memory_total_mib is None and only.memory_used_mib is None
    assert only.persistence_mode is True
    assert only.compute_capability == "12.1"
    assert only.pci_bus_id == "0000000F:01:00.0"


def test_handshaped_h100_line_reports_memory_in_mib():
    (only,) = parse_handshaped("h100_driver_570").gpus
    assert only.name == "NVIDIA H100 80GB HBM3"
    assert (only.memory_total_mib, only.memory_used_mib) == (81559, 1)
    assert only.driver_branch == 570


def test_handshaped_persistence_off_is_false_not_unknown():
    (only,) = parse_handshaped("gb10_persistence_off").gpus
    assert only.persistence_mode is False


@pytest.mark.parametrize(
    ("case", "status", "exit_code", "advice"),
    [
        ("version_mismatch", "version_mismatch", 5, "reboot the node"),
        ("driver_unreachable", "driver_unreachable", 4, "dkms status"),
        ("no_devices", "no_devices", 6, "lspci"),
    ],
)
def test_each_handshaped_failure_gets_its_own_status_exit_code_and_advice(case, status, exit_code, advice):
    query = parse_handshaped(case)
    assert (query.status, query.exit_code) == (status, exit_code)
    assert advice in query.message
    assert query.gpus == ()


def test_only_the_handshaped_mismatch_asks_for_a_reboot():
    assert parse_handshaped("version_mismatch").reboot_required
    assert not parse_handshaped("driver_unreachable").reboot_required
    assert not parse_handshaped("gb10_driver_580").reboot_required


def test_the_handshaped_mismatch_detail_quotes_nvidia_smi():
    assert parse_handshaped("version_mismatch").detail == "Failed to initialize NVML: Driver/library version mismatch"


def test_unknown_failure_keeps_nvidia_smi_message():
    query = gpu.parse_query_output('Field "compute_cap" is not a valid field to query.\n', "", 2)
    assert query.status == "failed" and query.exit_code == 1
    assert "compute_cap" in query.message


def test_line_with_wrong_number_of_fields_is_a_failure_not_a_gpu():
    query = gpu.parse_query_output("0, NVIDIA GB10, 580.95.05\n", "", 0)
    assert query.status == "failed"
    assert "expected 9 comma-separated fields, got 3" in query.message


def test_empty_output_means_no_devices():
    assert gpu.parse_query_output("", "", 0).status == "no_devices"


def test_query_asks_for_every_field_the_parser_reads():
    command = gpu.query_command("/usr/bin/nvidia-smi")
    assert command[0] == "/usr/bin/nvidia-smi"
    assert command[1] == "--query-gpu=" + ",".join(gpu.QUERY_FIELDS)
    assert command[2] == "--format=csv,noheader,nounits"


def fake_nvidia_smi(tmp_path: Path, case: str) -> Path:
    """An executable standing in for nvidia-smi: prints a hand-shaped output and exits with its status."""
    stdout, stderr, returncode = handshaped(case)
    (tmp_path / "out").write_text(stdout)
    (tmp_path / "err").write_text(stderr)
    script = tmp_path / f"fake_nvidia_smi_{case}"
    script.write_text(f'#!/bin/sh\ncat "{tmp_path}/out"\ncat "{tmp_path}/err" >&2\nexit {returncode}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_cli_json_on_fake_gb10_lists_the_gpu(tmp_path, capsys):
    code = cli.main(["gpu", "info", "--json", "--nvidia-smi", str(fake_nvidia_smi(tmp_path, "gb10_driver_580"))])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["status"] == "ok"
    assert report["gpus"][0]["name"] == "NVIDIA GB10"
    assert report["gpus"][0]["driver_branch"] == 580
    assert report["gpus"][0]["memory_total_mib"] is None


def test_cli_table_on_fake_gb10_shows_na_memory_and_persistence(tmp_path, capsys):
    code = cli.main(["gpu", "info", "--nvidia-smi", str(fake_nvidia_smi(tmp_path, "gb10_driver_580"))])
    header, row = capsys.readouterr().out.splitlines()
    assert code == 0
    assert header.split()[:2] == ["idx", "name"]
    assert "NVIDIA GB10" in row and "580.95.05" in row and "n/a" in row and " on " in row


def test_cli_on_fake_nvidia_smi_mismatch_exits_5_and_says_reboot(tmp_path, capsys):
    code = cli.main(["gpu", "info", "--nvidia-smi", str(fake_nvidia_smi(tmp_path, "version_mismatch"))])
    out = capsys.readouterr().out
    assert code == 5
    assert out.startswith("version_mismatch: ") and "reboot the node" in out


def test_cli_json_on_fake_nvidia_smi_still_reports_no_devices(tmp_path, capsys):
    code = cli.main(["gpu", "info", "--json", "--nvidia-smi", str(fake_nvidia_smi(tmp_path, "no_devices"))])
    report = json.loads(capsys.readouterr().out)
    assert code == 6 and report["exit_code"] == 6 and report["status"] == "no_devices" and report["gpus"] == []


def test_cli_missing_binary_exits_3_and_names_the_path(tmp_path, capsys):
    missing = tmp_path / "no-such-nvidia-smi"
    code = cli.main(["gpu", "info", "--nvidia-smi", str(missing)])
    out = capsys.readouterr().out
    assert code == 3
    assert str(missing) in out and "nvidia_driver_mode=install" in out


def test_cli_non_executable_nvidia_smi_is_a_failure_naming_the_path(tmp_path, capsys):
    not_executable = tmp_path / "nvidia-smi"
    not_executable.write_text("#!/bin/sh\n")
    not_executable.chmod(0o644)
    code = cli.main(["gpu", "info", "--nvidia-smi", str(not_executable)])
    assert code == 1
    assert f"{not_executable} is not executable" in capsys.readouterr().out


def _recorded(case: str) -> tuple[str, str, int]:
    directory = Path(__file__).parent / "fixtures" / f"recorded_nvidia_smi_{case}"
    return ((directory / "stdout.txt").read_text(), (directory / "stderr.txt").read_text(),
            int((directory / "returncode").read_text()))


def test_the_recorded_h200_output_parses_as_the_machine_reported_it():
    """fixtures/recorded_nvidia_smi_h200: the tools' own query on a real H200 with driver 580 (scripts/device/gpu-facts
    printed gpu info's JSON there with the same values)."""
    query = gpu.parse_query_output(*_recorded("h200"))
    assert (query.status, query.exit_code, query.reboot_required) == ("ok", 0, False)
    (only,) = query.gpus
    assert only.name == "NVIDIA H200" and only.pci_bus_id == "00000000:00:06.0"
    assert (only.driver_version, only.driver_branch) == ("580.159.04", 580)
    assert (only.memory_total_mib, only.memory_used_mib) == (143771, 0)
    assert only.persistence_mode is True and only.compute_capability == "9.0"
