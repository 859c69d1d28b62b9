"""What "healthy" means for a TwinSpark pair: pure functions from gathered facts to check results.

Every function here takes plain data (dicts, lists, numbers, the shapes gather.py produces) and returns one or more
`CheckResult`s. Nothing here reads files, runs commands or talks to the network, so every rule is testable with
plain data, and the CLI, the playbook and the systemd timer all judge with the same code.

Statuses: `ok` (nothing to do), `degraded` (serving, but something needs attention), `failed` (not serving, or
about to stop serving), `unknown` (the check could not look, e.g. refused by the sandbox it runs in: it vouches for
nothing, so it counts like degraded in the overall verdict and the exit code, never like failed). A result that is
not ok always says what to do (`fix`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from twinspark import firewall, layout

OK = "ok"
DEGRADED = "degraded"
FAILED = "failed"
UNKNOWN = "unknown"
STATUS_ORDER = {OK: 0, DEGRADED: 1, FAILED: 2}
# How bad each status is for the overall verdict and the exit code: an unknown check vouches for nothing (1).
RANK = {**STATUS_ORDER, UNKNOWN: 1}
# The textfile's per-check value: an unknown check is -1, so an alert on `== 2` never pages for a check that could
# not look, and one on `< 0` can say so.
PROM_VALUE = {**STATUS_ORDER, UNKNOWN: -1}
# How each status reads in the tables (a single sweep's and a fleet's).
MARKS = {OK: "ok", DEGRADED: "DEGRADED", FAILED: "FAILED", UNKNOWN: "UNKNOWN"}

# The node label of checks that concern both nodes (cross-node comparisons) or the serving API of the pair.
PAIR = "pair"

START_HINT = "start both ranks in order, worker first: ansible-playbook playbooks/start.yml"
RESTART_HINT = "restart both ranks, worker first: ansible-playbook playbooks/restart.yml"


def rank_unit() -> str:
    """The rank's unit on this node (the layout, read when first needed: importing this module reads no file)."""
    return layout.current().unit_vllm


def journal_hint() -> str:
    return f"journalctl -u {rank_unit().removesuffix('.service')} -n 120"

# The driver branch vLLM needs on a GB10 (docs/DRIVERS.md).
MIN_DRIVER_MAJOR = 580
# Jumbo frames on every fabric hop: MTU 9000, well above 1500 in NCCL bus bandwidth (docs/FABRIC.md).
FABRIC_MTU = 9000
# The QSFP link between two Sparks' ConnectX-7 ports negotiates 200 GbE; less is a cable or port that came up slower
# (docs/FABRIC.md). Only the gb10 profile checks it (the simulated pair's veth links say 10000).
FABRIC_SPEED_MBPS_GB10 = 200_000
# Disk below these on the cache/state filesystem: JIT and compile caches stop fitting (degraded), then writes fail.
DISK_DEGRADED_BYTES = 10 * 2**30
DISK_FAILED_BYTES = 2 * 2**30
# KV cache nearly full: new requests queue behind running ones.
KV_CACHE_DEGRADED = 0.95


@dataclass(frozen=True)
class CheckResult:
    node: str
    check: str
    status: str
    message: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def ok(node: str, check: str, message: str) -> CheckResult:
    return CheckResult(node, check, OK, message)


def degraded(node: str, check: str, message: str, fix: str) -> CheckResult:
    return CheckResult(node, check, DEGRADED, message, fix)


def failed(node: str, check: str, message: str, fix: str) -> CheckResult:
    return CheckResult(node, check, FAILED, message, fix)


def unknown(node: str, check: str, message: str, fix: str) -> CheckResult:
    return CheckResult(node, check, UNKNOWN, message, fix)


def worst(statuses: Iterable[str]) -> str:
    """The overall status: the worst of the given ones (ok when there are none; degraded before unknown)."""
    return max(statuses, key=RANK.__getitem__, default=OK)


def overall(results: Iterable[CheckResult]) -> str:
    return worst(r.status for r in results)


def exit_code(status: str) -> int:
    """0 healthy, 1 degraded (or a check could not look), 2 failed (the documented exit codes of `twinspark
    health`)."""
    return RANK[status]


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


# ---------------------------------------------------------------------------------------------------------------
# Per node
# ---------------------------------------------------------------------------------------------------------------


def check_agent(node: str, error: str | None) -> CheckResult | None:
    """The health agent could not run on the node (SSH unreachable, twinspark missing, unreadable output)."""
    if error is None:
        return None
    return failed(node, "reach", error, "check the node is up and reachable over SSH with the inventory's user and "
                  "key; `twinspark` must be installed on it (ansible-playbook site.yml, role vllm_runtime)")


def check_unit(node: str, unit: Mapping[str, str]) -> CheckResult:
    """State of twinspark-vllm.service from `systemctl show` properties."""
    load = unit.get("LoadState", "")
    active = unit.get("ActiveState", "")
    sub = unit.get("SubState", "")
    enabled = unit.get("UnitFileState", "")
    restarts = unit.get("NRestarts", "0") or "0"
    if load != "loaded":
        return failed(node, "unit", f"{rank_unit()} is not installed (LoadState={load or 'unknown'})",
                      "install the service: ansible-playbook site.yml (role vllm_service)")
    state = f"{active} ({sub})" if sub else active
    if active == "active":
        note = f", restarted {restarts} time(s)" if restarts not in ("0", "") else ""
        if enabled not in ("enabled", "static", "enabled-runtime", "indirect", "generated"):
            return degraded(node, "unit", f"{rank_unit()} {state} but {enabled or 'not enabled'}{note}: it will not "
                            "come back after a reboot", "systemctl enable twinspark-vllm (or run site.yml)")
        return ok(node, "unit", f"{rank_unit()} {state}, {enabled}{note}")
    if active in ("activating", "reloading"):
        return degraded(node, "unit", f"{rank_unit()} {state}: still starting (first-boot JIT can take 30+ minutes)",
                        f"wait; follow it with {journal_hint()} -f")
    result = unit.get("Result", "")
    why = f", last result {result}" if result and result != "success" else ""
    return failed(node, "unit", f"{rank_unit()} {state}{why}", f"{START_HINT}; see why with {journal_hint()}")


def check_process(node: str, unit: Mapping[str, str], processes: Mapping[str, object]) -> CheckResult:
    """The vLLM process: running under the unit when it is active, and no stray vLLM outside it.

    `processes` holds `main_pid` (the unit's MainPID, 0 when none), `main_cmdline` and `vllm` (a list of
    {pid, cmdline, rss_bytes} for every process on the node that runs vLLM).
    """
    vllm = list(processes.get("vllm") or [])
    main_pid = int(processes.get("main_pid") or 0)
    in_unit = [p for p in vllm if p.get("in_unit")]
    outside = [p for p in vllm if not p.get("in_unit")]
    active = unit.get("ActiveState") == "active"
    if outside:
        pids = ", ".join(str(p["pid"]) for p in outside[:6])
        return failed(node, "process", f"vLLM running outside {rank_unit()} (pid {pids}): a stale rank blocks the pair",
                      f"stop it (kill {outside[0]['pid']}), then {START_HINT}")
    if not active:
        return failed(node, "process", "no vLLM process", START_HINT)
    if not in_unit:
        return failed(node, "process", f"{rank_unit()} is active (main pid {main_pid}) but no vLLM process runs in it",
                      f"{RESTART_HINT}; see why with {journal_hint()}")
    rss = sum(int(p.get("rss_bytes") or 0) for p in in_unit)
    return ok(node, "process", f"vLLM pid {main_pid}, {len(in_unit)} process(es), RSS {_gib(rss)}")


def check_gpu(node: str, gpu: Mapping[str, object]) -> CheckResult:
    """GPU presence, driver branch and persistence (gb10 profile only).

    `gpu` holds either `error` (why the GPU facts could not be read, e.g. nvidia-smi's own message) or `gpus`, a
    list of {name, driver_version, memory_total_mib, memory_used_mib, persistence_mode}.
    """
    error = gpu.get("error")
    if error:
        text = str(error)
        if gpu.get("status") == "version_mismatch" or "mismatch" in text.lower():
            return failed(node, "gpu", f"NVIDIA driver/library version mismatch: {text}",
                          "reboot the node to load the installed driver (role nvidia_driver does this)")
        return failed(node, "gpu", f"GPU facts unavailable: {text}",
                      "check `nvidia-smi` on the node; ansible-playbook site.yml (role nvidia_driver, mode verify)")
    gpus = list(gpu.get("gpus") or [])
    if not gpus:
        return failed(node, "gpu", "no GPU visible to nvidia-smi",
                      "check the driver with `nvidia-smi`; reboot after a driver change")
    first = gpus[0]
    name = str(first.get("name", ""))
    driver = str(first.get("driver_version", ""))
    try:
        major = int(driver.split(".")[0])
    except ValueError:
        major = 0
    if major < MIN_DRIVER_MAJOR:
        return failed(node, "gpu", f"driver {driver or 'unknown'} is older than branch {MIN_DRIVER_MAJOR}",
                      f"install driver branch {MIN_DRIVER_MAJOR} (role nvidia_driver, mode install) and reboot")
    used = first.get("memory_used_mib")
    memory = f", {used} MiB used" if isinstance(used, int | float) else ""
    if "GB10" not in name.upper():
        return degraded(node, "gpu", f"GPU is {name!r}, not a GB10{memory}",
                        "this profile expects a DGX Spark (GB10); use the profile that matches the hardware")
    persistence = str(first.get("persistence_mode", "")).lower()
    if persistence not in ("enabled", "on", "true", "1"):
        return degraded(node, "gpu", f"{name}, driver {driver}{memory}, persistence mode off",
                        "systemctl enable --now nvidia-persistenced (role nvidia_driver)")
    return ok(node, "gpu", f"{name}, driver {driver}{memory}")


def check_fabric(node: str, fabric: Mapping[str, object]) -> CheckResult:
    """The interconnect interface(s) this node's vLLM uses: present, up, addressed, jumbo frames, GID resolvable.

    `fabric` holds `interfaces` (list of {ifname, exists, up, operstate, mtu, addresses, speed_mbps}),
    `expected_address` (the node's VLLM_HOST_IP, or empty), `expected_speed_mbps` (gb10's 200 GbE, or None: not
    checked), `error` (the interface list could not be read) and, on gb10, `gid` as {index} or {error}. A group of
    one (a single Spark) sends `alone` instead: it has no fabric.
    """
    if fabric.get("alone"):
        return ok(node, "fabric", "none: a single Spark (a group of one) serves without a fabric")
    if fabric.get("unknown"):
        return unknown(node, "fabric", f"could not look at the fabric interfaces: {fabric['unknown']}",
                       "run `twinspark health` as root on the node, or `ip addr`, to see the interfaces")
    if fabric.get("error"):
        return failed(node, "fabric", f"cannot read the fabric interfaces: {fabric['error']}",
                      "check `ip addr` on the node; ansible-playbook site.yml (role spark_fabric)")
    interfaces = list(fabric.get("interfaces") or [])
    if not interfaces:
        return failed(node, "fabric", "no fabric interface configured (NCCL_SOCKET_IFNAME is empty)",
                      "set twinspark_nccl_socket_ifname in the inventory and rerun site.yml")
    expected = str(fabric.get("expected_address") or "")
    problems: list[str] = []
    small_mtu: list[str] = []
    slow: list[str] = []
    addresses: list[str] = []
    for iface in interfaces:
        name = iface.get("ifname")
        if not iface.get("exists"):
            problems.append(f"{name} does not exist")
            continue
        state = str(iface.get("operstate", "")).upper()
        if not iface.get("up", state in ("UP", "UNKNOWN")):
            problems.append(f"{name} is down (operstate {state or 'unknown'})")
        mtu = int(iface.get("mtu") or 0)
        if mtu < FABRIC_MTU:
            small_mtu.append(f"{name} MTU {mtu}")
        speed, wanted = iface.get("speed_mbps"), fabric.get("expected_speed_mbps")
        if isinstance(speed, int) and isinstance(wanted, int) and speed < wanted:
            slow.append(f"{name} at {speed // 1000} Gb/s, not {wanted // 1000}")
        addresses.extend(iface.get("addresses") or [])
    if expected and expected not in addresses:
        names = ", ".join(str(i.get("ifname")) for i in interfaces)
        problems.append(f"VLLM_HOST_IP {expected} is not on {names} (has {', '.join(addresses) or 'no address'})")
    gid = fabric.get("gid")
    if isinstance(gid, Mapping) and gid.get("error"):
        problems.append(f"no usable RoCE v2 GID: {gid['error']}")
    if problems:
        return failed(node, "fabric", "; ".join(problems),
                      "check cabling and `ip addr`; ansible-playbook site.yml (role spark_fabric)")
    names = ", ".join(f"{i['ifname']} mtu {i.get('mtu')}" for i in interfaces)
    gid_note = f", GID index {gid['index']}" if isinstance(gid, Mapping) and "index" in gid else ""
    if small_mtu:
        return degraded(node, "fabric", f"{'; '.join(small_mtu)} (jumbo frames lost: NCCL bandwidth drops)",
                        f"set the fabric MTU to {FABRIC_MTU} on every hop (spark_fabric_mtu) and rerun site.yml")
    if slow:
        return degraded(node, "fabric", f"{'; '.join(slow)} (the link came up slower: NCCL bandwidth drops)",
                        "reseat or replace the QSFP cable; `ethtool <interface>` on both nodes must say 200000Mb/s")
    return ok(node, "fabric", f"{names}, {expected or ', '.join(addresses)}{gid_note}")


def check_env(node: str, env: Mapping[str, object]) -> CheckResult:
    """The node's env files exist, are readable and validate.

    `env` holds `files` (path -> "ok" or why not), `problems` (validator messages; never secret values) and
    `count` (number of settings).
    """
    files = dict(env.get("files") or {})
    bad = {path: why for path, why in files.items() if why != "ok"}
    if bad:
        listed = "; ".join(f"{path}: {why}" for path, why in bad.items())
        return failed(node, "env", listed, "render the env files: ansible-playbook site.yml (role serve_env); "
                      "run health as a user that can read them (root)")
    problems = list(env.get("problems") or [])
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        return failed(node, "env", "; ".join(problems[:3]) + more,
                      f"fix the inventory and rerun site.yml; `twinspark env check {' '.join(map(str, files))}` "
                      "lists every problem")
    return ok(node, "env", f"{len(files)} env file(s) valid, {env.get('count', 0)} settings")


def check_model(node: str, model: Mapping[str, object]) -> CheckResult:
    """The configured model passes the model role's own verification on this node.

    gather.read_model resolves the model (a directory, or the pinned hub snapshot found offline in HF_HOME; either
    counts as on the node only when it holds config.json) and runs `twinspark model verify`'s rules on it
    (twinspark/weights.py, verify_model_dir): every shard (the index's weight_map, or the single model.safetensors) is
    there at its full size, the size the manifest records or else the size the shard's own safetensors header
    implies; and, when the node holds the role's manifest (layout model_manifest, outside the copy), every other
    file the manifest lists is there at the size it records. SHA-256 is not recomputed here (`twinspark model
    verify --sha256` does that).
    `model` holds `model` (id or path), `revision`, `path` (the resolved directory, None when not on the node),
    `missing` ("<file> (<what is wrong>)" per problem: missing, short, too long, unreadable header ...), `shards`
    (how many were checked) and `error` (MODEL unset, or a manifest that cannot be read).
    """
    name = model.get("model") or "?"
    if model.get("error"):
        return failed(node, "model", f"{name}: {model['error']}",
                      "fetch and verify the model: ansible-playbook site.yml (role model_cache)")
    if not model.get("path"):
        return failed(node, "model", f"{name}@{model.get('revision') or 'unpinned'} is not on this node",
                      "fetch and verify the model: ansible-playbook site.yml (role model_cache)")
    missing = list(model.get("missing") or [])
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        listed = ", ".join(missing[:5])
        return failed(node, "model", f"{name}: {len(missing)} file(s) missing or damaged: {listed}{more}",
                      "complete the copy: ansible-playbook site.yml (role model_cache)")
    shards = model.get("shards")
    counted = f", {shards} shard(s)" if shards else ""
    return ok(node, "model", f"{name} at {model['path']}{counted}")


def check_disk(node: str, disk: Mapping[str, object]) -> CheckResult:
    """Free space on the filesystem holding the caches and state (/var/lib/twinspark)."""
    path = disk.get("path", "/var/lib/twinspark")
    if disk.get("error"):
        return failed(node, "disk", f"{path}: {disk['error']}", "create it: ansible-playbook site.yml")
    free = int(disk.get("free_bytes") or 0)
    total = int(disk.get("total_bytes") or 0)
    message = f"{path}: {_gib(free)} free of {_gib(total)}"
    fix = f"free space on the filesystem of {path} (old JIT caches, logs, unused model revisions)"
    if free < DISK_FAILED_BYTES:
        return failed(node, "disk", message, fix)
    if free < DISK_DEGRADED_BYTES:
        return degraded(node, "disk", message, fix)
    return ok(node, "disk", message)


def check_earlyoom(node: str, earlyoom: Mapping[str, str]) -> CheckResult:
    """earlyoom must be off: it kills vLLM under deep-context load (docs/DRIVERS.md)."""
    active = earlyoom.get("ActiveState", "")
    if earlyoom.get("LoadState") == "loaded" and active in ("active", "activating"):
        return degraded(node, "earlyoom", "earlyoom is running and will kill vLLM under deep-context load",
                        "systemctl disable --now earlyoom (ansible-playbook site.yml does it)")
    return ok(node, "earlyoom", "earlyoom absent" if earlyoom.get("LoadState") != "loaded" else "earlyoom stopped")


def check_firewall(node: str, facts: Mapping[str, object]) -> CheckResult:
    """The host firewall's table is loaded, and its watcher is running and looking (twinspark.firewall)."""
    lay = layout.current()
    watcher = lay.unit_firewall_watch
    fw_unit = facts.get("firewall_unit") or {}
    watch_unit = facts.get("watch_unit") or {}
    if fw_unit.get("LoadState") != "loaded":
        return ok(node, "firewall", "no TwinSpark firewall on this node (vllm_service_firewall_enabled: false)")
    if watch_unit.get("LoadState") != "loaded":
        return degraded(node, "firewall", f"{watcher} is not installed: a deleted table would stay "
                        "deleted", "ansible-playbook site.yml (role host_firewall installs it)")
    if watch_unit.get("ActiveState") not in ("active", "activating", "reloading"):
        state = watch_unit.get("ActiveState") or "not running"
        return degraded(node, "firewall", f"{watcher} is {state}: a deleted table would stay deleted",
                        f"systemctl start {watcher} (it also loads the table)")
    code, line = firewall.judge(facts.get("state") or {}, float(facts.get("now") or 0))
    if code == 2:
        return degraded(node, "firewall", line, f"the watcher reloads it within seconds; if it cannot: journalctl -u "
                        f"{watcher.removesuffix('.service')}, then systemctl restart "
                        f"{lay.unit_firewall} (this restarts the rank: the guard then restarts the pair in order)")
    if code == 1:
        return unknown(node, "firewall", line, f"journalctl -u {watcher.removesuffix('.service')}")
    return ok(node, "firewall", line)


def check_bandwidth(node: str, bandwidth: Mapping[str, object]) -> CheckResult:
    """The fabric's last measurement on this node (docs/DOCTOR.md): it passed, and the fabric is still the one it
    measured. `bandwidth` holds `measured` (a record exists), `passed` (its verdict), `summary` (its figures in one
    line) and `due` (why it must be measured again, "" while it holds)."""
    again = "ansible-playbook playbooks/fabric-check.yml (site.yml runs it before serving when it is due)"
    if not bandwidth.get("measured"):
        return unknown(node, "bandwidth", "no fabric measurement is recorded on this node", again)
    summary = str(bandwidth.get("summary") or "")
    due = str(bandwidth.get("due") or "")
    if not bandwidth.get("passed"):
        return degraded(node, "bandwidth", f"the last fabric measurement failed: {summary}",
                        f"check the cable, MTU {FABRIC_MTU} on every hop and `twinspark doctor`, then {again}")
    if due:
        return degraded(node, "bandwidth", f"{due}: {summary}", again)
    return ok(node, "bandwidth", summary)


def check_knobs(node: str, runtime: Mapping[str, object]) -> CheckResult:
    """Every knob set in the env files is read by the installed runtime (fork-only knobs on a build without them
    tune nothing)."""
    unread = list(runtime.get("unread_knobs") or [])
    if unread:
        names = ", ".join(line.split()[0] for line in unread)
        return degraded(node, "knobs", f"set but never read by the installed runtime: {names}",
                        "remove them from the inventory, or install a build that reads them "
                        f"(`twinspark env check --runtime {layout.current().venv} FILE...` says why; docs/UPGRADES.md)")
    return ok(node, "knobs", "every set knob is read by the installed runtime")


MONITORING_FIX = "rerun ansible-playbook playbooks/monitoring.yml (role monitoring)"


def check_monitoring(node: str, monitoring: Mapping[str, object]) -> CheckResult:
    """What role monitoring runs on this node is running, at which version, and where the pair's Prometheus and
    Alertmanager answer. `monitoring`: gather.read_monitoring's {record, units} ({error} for a bad record)."""
    if monitoring.get("error"):
        return degraded(node, "monitoring", str(monitoring["error"]), MONITORING_FIX)
    record = monitoring.get("record") or {}
    units = monitoring.get("units") or {}
    components = [c for c in record.get("components") or [] if isinstance(c, Mapping)]
    urls = record.get("monitor") or {}
    where = (f"Prometheus {urls['prometheus']}, Alertmanager {urls['alertmanager']}"
             if urls.get("prometheus") and urls.get("alertmanager") else "no monitor host")
    down = [(c, units.get(str(c.get("unit"))) or {}) for c in components]
    down = [(c, unit) for c, unit in down if unit.get("ActiveState") != "active"]
    running = ", ".join(str(c.get("summary") or c.get("name")) for c in components) or "nothing"
    if down:
        states = ", ".join(f"{c.get('name')} ({c.get('unit')}) {unit.get('ActiveState') or 'unknown'}"
                           for c, unit in down)
        first = str(down[0][0].get("unit", "")).removesuffix(".service")
        return degraded(node, "monitoring", f"not running: {states}; {where}",
                        f"see why with journalctl -u {first} -n 40, then {MONITORING_FIX}")
    return ok(node, "monitoring", f"{running} running; {where}")


GUARD_RESUME_FIX = ("when the pair should be watched again: `twinspark pair resume` on the head, or start the pair "
                    "(`twinspark pair start`, playbooks/start.yml), which ends the pause")


def check_guard(node: str, guard: Mapping[str, object]) -> CheckResult:
    """The pair guard on the head: watching, or paused (by whom, since when, why). `guard`: gather.read_guard's."""
    if guard.get("error"):
        return unknown(node, "guard", str(guard["error"]), "see journalctl -u twinspark-pair-guard -n 40")
    age = float(guard.get("age_s") or 0.0)
    if guard.get("paused"):
        since = guard.get("since")
        when = ("an unknown time" if not isinstance(since, int | float) else
                time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)))
        return degraded(node, "guard", f"the pair guard is paused by {guard.get('by') or '?'} since {when}: "
                                       f"{guard.get('reason') or '?'} (a rank that dies now stays down)",
                        GUARD_RESUME_FIX)
    return ok(node, "guard", f"the pair guard watches the pair (its last run {age:.0f} s ago: "
                             f"{guard.get('decision') or 'no decision recorded'})")


def node_checks(node: str, facts: Mapping[str, object]) -> list[CheckResult]:
    """Every per-node check over one node's gathered facts (the `facts` of gather.gather_node)."""
    unit = facts.get("unit") or {}
    results = [check_unit(node, unit), check_process(node, unit, facts.get("processes") or {})]
    if facts.get("gpu") is not None:
        results.append(check_gpu(node, facts["gpu"]))
    results += [
        check_fabric(node, facts.get("fabric") or {}),
        check_env(node, facts.get("env") or {}),
        check_model(node, facts.get("model") or {}),
        check_disk(node, facts.get("disk") or {}),
        check_earlyoom(node, facts.get("earlyoom") or {}),
        check_firewall(node, facts.get("firewall") or {}),
    ]
    if facts.get("bandwidth") is not None:  # an agent of an older release does not send it
        results.append(check_bandwidth(node, facts["bandwidth"]))
    if facts.get("runtime") is not None:
        results.append(check_knobs(node, facts["runtime"]))
    if facts.get("monitoring") is not None:  # no record: the node runs no monitoring (off, or not deployed yet)
        results.append(check_monitoring(node, facts["monitoring"]))
    if facts.get("guard") is not None:  # the head, where the pair guard writes its textfile
        results.append(check_guard(node, facts["guard"]))
    return results


# ---------------------------------------------------------------------------------------------------------------
# Across nodes
# ---------------------------------------------------------------------------------------------------------------


def check_settings_agree(settings: Mapping[str, Mapping[str, str]], per_node: Iterable[str],
                         secret: Iterable[str]) -> CheckResult:
    """The shared (not per-node) settings of both nodes' env files are identical.

    `settings` maps node -> {name: value}; secret values arrive as digests and are never shown, only named.
    """
    per_node = set(per_node)
    secret = set(secret)
    nodes = list(settings)
    if len(nodes) < 2:
        return degraded(PAIR, "settings-agree", f"only {', '.join(nodes) or 'no node'} reported settings",
                        "make both nodes reachable and rerun")
    names = sorted({n for values in settings.values() for n in values} - per_node)
    differing = [n for n in names if len({settings[node].get(n) for node in nodes}) > 1]
    if not differing:
        return ok(PAIR, "settings-agree", f"{len(names)} shared settings identical on {', '.join(nodes)}")

    def show(name: str) -> str:
        if name in secret:
            return f"{name} (secret; differs)"
        values = ", ".join(f"{node}={settings[node].get(name, '<unset>')!s}" for node in nodes)
        return f"{name}: {values}"

    listed = "; ".join(show(n) for n in differing[:4])
    more = f" (+{len(differing) - 4} more)" if len(differing) > 4 else ""
    return failed(PAIR, "settings-agree", f"shared setting(s) differ: {listed}{more}",
                  "render both env files from one inventory: ansible-playbook site.yml (role serve_env), then "
                  + RESTART_HINT)


def check_runtime_agree(runtime: Mapping[str, Mapping[str, object]]) -> CheckResult:
    """The runtime flavour, vLLM, torch, the twinspark package and the patch state are identical on both nodes."""
    nodes = list(runtime)
    if len(nodes) < 2:
        return degraded(PAIR, "runtime-agree", f"only {', '.join(nodes) or 'no node'} reported its runtime",
                        "make both nodes reachable and rerun")
    items = sorted({k for values in runtime.values() for k in values})
    differing = [k for k in items if len({repr(runtime[n].get(k)) for n in nodes}) > 1]
    if differing:
        parts = "; ".join(f"{k}: " + ", ".join(f"{n}={runtime[n].get(k)}" for n in nodes) for k in differing)
        return failed(PAIR, "runtime-agree", f"runtime differs: {parts}",
                      "install the same runtime on both: ansible-playbook site.yml (role vllm_runtime), then "
                      + RESTART_HINT)
    first = runtime[nodes[0]]
    summary = ", ".join(f"{k} {first[k]}" for k in ("flavour", "vllm", "torch", "twinspark_version") if first.get(k))
    applied = first.get("patches")
    if isinstance(applied, Mapping) and applied:
        summary += f", {len(applied)} patch(es) in the same state"
    return ok(PAIR, "runtime-agree", f"identical on {', '.join(nodes)}: {summary}")


def check_model_agree(models: Mapping[str, Mapping[str, object]]) -> CheckResult:
    """Both nodes serve the same model at the same revision."""
    nodes = list(models)
    if len(nodes) < 2:
        return degraded(PAIR, "model-agree", f"only {', '.join(nodes) or 'no node'} reported its model",
                        "make both nodes reachable and rerun")
    keys = ("model", "revision", "snapshot")
    differing = [k for k in keys if len({str(models[n].get(k)) for n in nodes}) > 1]
    if differing:
        parts = "; ".join(f"{k}: " + ", ".join(f"{n}={models[n].get(k)}" for n in nodes) for k in differing)
        return failed(PAIR, "model-agree", f"model differs: {parts}",
                      "pin one revision in the inventory and rerun site.yml (role model_cache)")
    first = models[nodes[0]]
    pinned = first.get("snapshot") or first.get("revision") or "unpinned"
    return ok(PAIR, "model-agree", f"{first.get('model')}@{pinned} on {', '.join(nodes)}")


# ---------------------------------------------------------------------------------------------------------------
# The pair's API
# ---------------------------------------------------------------------------------------------------------------


def _http_problem(result: Mapping[str, object]) -> str | None:
    if result.get("error"):
        return str(result["error"])
    code = result.get("status_code")
    if code == 401:
        return "HTTP 401: the API key was refused or could not be read"
    if not isinstance(code, int) or not 200 <= code < 300:
        return f"HTTP {code}"
    return None


def _down_note(down_nodes: Sequence[str]) -> str:
    return f" ({', '.join(down_nodes)} not serving)" if down_nodes else ""


def check_api_health(url: str, result: Mapping[str, object]) -> CheckResult:
    """GET /health answers 2xx. Not liveness on its own: the engine can be dead while this answers."""
    problem = _http_problem(result)
    if problem:
        return failed(PAIR, "api-health", f"{url}/health: {problem}",
                      f"check the head's unit; {START_HINT}")
    return ok(PAIR, "api-health", f"{url}/health {result['status_code']}")


def check_models(result: Mapping[str, object], served_name: str | None, max_model_len: int | None) -> CheckResult:
    """GET /v1/models lists the configured served name with the configured max_model_len.

    `served_name` None means the configuration could not be read: any listed model passes, and the message says so.
    """
    problem = _http_problem(result)
    if problem:
        return failed(PAIR, "models", f"/v1/models: {problem}", f"check the head's unit; {START_HINT}")
    body = result.get("json") or {}
    entries = body.get("data") if isinstance(body, Mapping) else None
    entries = entries if isinstance(entries, list) else []
    ids = [str(e.get("id")) for e in entries if isinstance(e, Mapping)]
    if served_name is None and ids:
        return degraded(PAIR, "models", f"/v1/models lists {', '.join(ids)}; the configured name is unknown "
                        "(the head's env file could not be read)", "make the head's env files readable over SSH")
    match = next((e for e in entries if isinstance(e, Mapping) and e.get("id") == served_name), None)
    if match is None:
        return failed(PAIR, "models", f"/v1/models lists {', '.join(ids) or 'nothing'}, not {served_name!r}",
                      "the head serves another configuration: render the env files (site.yml), then " + RESTART_HINT)
    served_len = match.get("max_model_len")
    if max_model_len and served_len != max_model_len:
        return degraded(PAIR, "models", f"{served_name} max_model_len {served_len}, configured {max_model_len}",
                        "the running server predates the configuration: " + RESTART_HINT)
    return ok(PAIR, "models", f"{served_name}, max_model_len {served_len}")


def check_liveness(result: Mapping[str, object], timeout: float, down_nodes: Sequence[str] = ()) -> CheckResult:
    """A one-token generation completes within the timeout: the only proof both ranks' engine works."""
    problem = _http_problem(result)
    if problem is None and not result.get("tokens"):
        problem = "the answer held no generated token"
    if problem:
        return failed(PAIR, "liveness", f"one-token generation failed: {problem}{_down_note(down_nodes)}",
                      RESTART_HINT + f"; see why with {journal_hint()} on both nodes")
    elapsed = float(result.get("elapsed") or 0.0)
    return ok(PAIR, "liveness", f"one-token generation in {elapsed:.2f} s (timeout {timeout:g} s)")


def check_metrics(metrics: Mapping[str, object]) -> CheckResult:
    """vLLM's /metrics: requests running and waiting, KV cache usage, speculative-decoding acceptance."""
    if metrics.get("error"):
        return degraded(PAIR, "metrics", f"/metrics: {metrics['error']}",
                        "check that the head serves /metrics (it does unless disabled)")
    running = metrics.get("running")
    waiting = metrics.get("waiting")
    usage = metrics.get("kv_cache_usage")
    parts = [f"running {_num(running)}", f"waiting {_num(waiting)}"]
    if isinstance(usage, int | float):
        parts.append(f"KV cache {usage * 100:.1f}%")
    acceptance = metrics.get("spec_acceptance")
    if isinstance(acceptance, int | float):
        parts.append(f"spec-decode acceptance {acceptance * 100:.1f}%")
    message = ", ".join(parts)
    if isinstance(usage, int | float) and usage >= KV_CACHE_DEGRADED:
        return degraded(PAIR, "metrics", message,
                        "the KV cache is nearly full: lower the load or MAX_NUM_SEQS, or shorten contexts")
    return ok(PAIR, "metrics", message)


def _num(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "?" if value is None else str(value)


def pair_checks(url: str, pair: Mapping[str, object], served_name: str | None, max_model_len: int | None,
                timeout: float, down_nodes: Sequence[str] = ()) -> list[CheckResult]:
    """Every check of the pair's API over the results gather.gather_pair produced."""
    return [
        check_api_health(url, pair.get("health") or {}),
        check_models(pair.get("models") or {}, served_name, max_model_len),
        check_liveness(pair.get("generate") or {}, timeout, down_nodes),
        check_metrics(pair.get("metrics") or {}),
    ]
