"""GPU facts from `nvidia-smi`: `twinspark gpu info [--json]`.

Running nvidia-smi is the only I/O here (`run_nvidia_smi`); everything else is a pure function over its output, so the
parser is tested on hand-shaped outputs and reused by the `nvidia_driver` role (through the Ansible filters) and the
health checks.

Exit codes of `twinspark gpu info` (also the `exit_code` field of `--json`):

| code | status               | meaning                                                                           |
| ---- | -------------------- | --------------------------------------------------------------------------------- |
| 0    | ok                   | at least one GPU listed                                                           |
| 1    | failed               | nvidia-smi failed in a way not listed below (its message is shown)                |
| 3    | missing              | no nvidia-smi binary: the driver's user-space tools are not installed             |
| 4    | driver_unreachable   | nvidia-smi can't talk to the kernel driver: the module is not loaded              |
| 5    | version_mismatch     | kernel module and user-space library differ (after an upgrade): reboot the node   |
| 6    | no_devices           | the driver runs but sees no GPU                                                   |
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
from dataclasses import asdict, dataclass

DEFAULT_NVIDIA_SMI = "nvidia-smi"
NVIDIA_SMI_TIMEOUT_S = 30

# Order matters: parse_query_output reads the columns in this order.
QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "driver_version",
    "memory.total",
    "memory.used",
    "persistence_mode",
    "compute_cap",
)

EXIT_CODES = {
    "ok": 0,
    "failed": 1,
    "missing": 3,
    "driver_unreachable": 4,
    "version_mismatch": 5,
    "no_devices": 6,
}

# What nvidia-smi prints for a field it can't report; GB10's unified memory makes memory.* "[N/A]".
_UNAVAILABLE = {"[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]", ""}

_NO_DEVICES = "the NVIDIA driver is loaded but reports no GPU: check `lspci -d 10de:` and the kernel log"

# Known failure texts (nvidia-smi writes them to stdout, sometimes stderr), checked in this order.
_FAILURES = (
    (
        "version_mismatch",
        re.compile(r"Driver/library version mismatch", re.IGNORECASE),
        "the loaded NVIDIA kernel module and the user-space driver library differ (typically after a driver upgrade "
        "without a reboot): reboot the node",
    ),
    (
        "driver_unreachable",
        re.compile(r"couldn't communicate with the NVIDIA driver|Failed to initialize NVML: Driver Not Loaded"),
        "nvidia-smi can't reach the NVIDIA kernel driver (module not loaded, or built for another kernel): check "
        "`lsmod | grep nvidia` and `dkms status`, or reboot after installing the driver",
    ),
    (
        "no_devices",
        re.compile(r"No devices were found", re.IGNORECASE),
        _NO_DEVICES,
    ),
)


@dataclass(frozen=True)
class Gpu:
    """One line of the nvidia-smi query. Fields nvidia-smi can't report are None."""

    index: int
    name: str
    uuid: str | None
    pci_bus_id: str | None
    driver_version: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    persistence_mode: bool | None
    compute_capability: str | None

    @property
    def driver_branch(self) -> int | None:
        return driver_branch(self.driver_version)


@dataclass(frozen=True)
class GpuQuery:
    """The outcome of one nvidia-smi query: a status from EXIT_CODES, the GPUs, and a message for humans."""

    status: str
    gpus: tuple[Gpu, ...] = ()
    message: str = ""
    detail: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def reboot_required(self) -> bool:
        return self.status == "version_mismatch"

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "message": self.message,
            "detail": self.detail,
            "reboot_required": self.reboot_required,
            "gpus": [dict(asdict(gpu), driver_branch=gpu.driver_branch) for gpu in self.gpus],
        }


def _text(value: str) -> str | None:
    value = value.strip()
    return None if value.lower() in _UNAVAILABLE else value


def _integer(value: str) -> int | None:
    text = _text(value)
    try:
        return None if text is None else int(float(text))
    except ValueError:
        return None


def driver_branch(driver_version: str | None) -> int | None:
    """The branch of a driver version: '580.95.05' -> 580; None when it can't be read."""
    match = re.match(r"\s*(\d+)\.", driver_version or "")
    return int(match.group(1)) if match else None


def _parse_persistence(value: str | None) -> bool | None:
    if value is None:
        return None
    return {"enabled": True, "disabled": False}.get(value.lower())


def parse_query_line(line: str) -> Gpu:
    """One CSV line of `--query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits`. Raises ValueError when malformed."""
    values = next(csv.reader([line], skipinitialspace=True))
    if len(values) != len(QUERY_FIELDS):
        raise ValueError(f"expected {len(QUERY_FIELDS)} comma-separated fields, got {len(values)}: {line.strip()!r}")
    index, name, uuid, pci_bus_id, driver_version, memory_total, memory_used, persistence, compute_cap = values
    if _integer(index) is None or _text(name) is None:
        raise ValueError(f"no GPU index or name in: {line.strip()!r}")
    return Gpu(
        index=int(float(index)),
        name=name.strip(),
        uuid=_text(uuid),
        pci_bus_id=_text(pci_bus_id),
        driver_version=_text(driver_version),
        memory_total_mib=_integer(memory_total),
        memory_used_mib=_integer(memory_used),
        persistence_mode=_parse_persistence(_text(persistence)),
        compute_capability=_text(compute_cap),
    )


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def parse_query_output(stdout: str, stderr: str = "", returncode: int = 0) -> GpuQuery:
    """Turn what nvidia-smi printed, and its exit status, into a GpuQuery."""
    combined = f"{stdout}\n{stderr}"
    for status, pattern, message in _FAILURES:
        if pattern.search(combined):
            return GpuQuery(status=status, message=message, detail=_first_line(combined))
    if returncode != 0:
        detail = _first_line(combined) or f"exit status {returncode}"
        return GpuQuery(status="failed", message=f"nvidia-smi failed: {detail}", detail=detail)
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return GpuQuery(status="no_devices", message=_NO_DEVICES, detail="nvidia-smi printed nothing")
    try:
        gpus = tuple(parse_query_line(line) for line in lines)
    except ValueError as error:
        return GpuQuery(status="failed", message=f"nvidia-smi printed output this tool can't read: {error}")
    return GpuQuery(status="ok", gpus=gpus, message=f"{len(gpus)} GPU(s) found")


def missing_binary(path: str) -> GpuQuery:
    return GpuQuery(
        status="missing",
        message=f"{path} not found: the NVIDIA driver's user-space tools are not installed "
        "(on DGX OS they come with the OS; elsewhere run the nvidia_driver role with nvidia_driver_mode=install)",
    )


def query_command(nvidia_smi: str = DEFAULT_NVIDIA_SMI) -> list[str]:
    return [nvidia_smi, f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]


def run_nvidia_smi(nvidia_smi: str = DEFAULT_NVIDIA_SMI) -> GpuQuery:
    """Run the query (the I/O edge) and parse it."""
    try:
        completed = subprocess.run(
            query_command(nvidia_smi), capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        return missing_binary(nvidia_smi)
    except PermissionError:
        return GpuQuery(status="failed", message=f"{nvidia_smi} is not executable by this user: check its mode")
    except subprocess.TimeoutExpired:
        return GpuQuery(
            status="failed",
            message=f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_S} s: the driver may be hung; "
            "check the kernel log (dmesg) for NVRM errors",
        )
    return parse_query_output(completed.stdout, completed.stderr, completed.returncode)


def _cell(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def format_table(query: GpuQuery) -> str:
    """The human report: one row per GPU, or the failure and what to do."""
    if query.status != "ok":
        return f"{query.status}: {query.message}" + (f"\n  nvidia-smi said: {query.detail}" if query.detail else "")
    header = ("idx", "name", "driver", "mem total MiB", "mem used MiB", "persistence", "cc", "pci")
    rows = [header] + [
        tuple(
            _cell(value)
            for value in (
                gpu.index,
                gpu.name,
                gpu.driver_version,
                gpu.memory_total_mib,
                gpu.memory_used_mib,
                gpu.persistence_mode,
                gpu.compute_capability,
                gpu.pci_bus_id,
            )
        )
        for gpu in query.gpus
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


def _info(args: argparse.Namespace) -> int:
    query = run_nvidia_smi(args.nvidia_smi)
    if args.json:
        print(json.dumps(query.to_dict(), indent=2))
    else:
        print(format_table(query))
    return query.exit_code


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("gpu", help="GPU facts from nvidia-smi")
    verbs = group.add_subparsers(dest="gpu_command", required=True, metavar="VERB")
    info = verbs.add_parser(
        "info",
        help="list the GPUs nvidia-smi sees (name, driver, memory, persistence)",
        description="List the GPUs nvidia-smi sees. Exit codes: 0 ok, 1 nvidia-smi failed otherwise, 3 nvidia-smi "
        "missing, 4 driver not reachable, 5 driver/library version mismatch (reboot), 6 no devices.",
    )
    info.add_argument("--json", action="store_true", help="print the result as JSON (also on failure)")
    info.add_argument(
        "--nvidia-smi",
        default=DEFAULT_NVIDIA_SMI,
        metavar="PATH",
        help="the nvidia-smi binary to run (default: nvidia-smi from PATH)",
    )
    info.set_defaults(func=_info)
