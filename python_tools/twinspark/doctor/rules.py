"""Judging a node's facts (twinspark/doctor/collect.py) against the failures Spark pair owners report.

Pure functions over plain data: the facts dict, the node's settings (env-file names and values, non-secret) and, for
the pair, two facts dicts. Each finding has a stable id, a severity, the profiles it applies to and, where a later
play of site.yml makes it true, that play (twinspark/doctor/findings.py): the preflight runs before them, so a
finding such a play fixes does not stop it. Every finding names what is wrong and the fix. docs/DOCTOR.md is the
prose of the same table.

An id listed in TWINSPARK_DOCTOR_ACK (twinspark_doctor_ack) is still reported, marked acknowledged, and no longer
counts for the exit code or the preflight; a fact the node cannot know yet is reported as `later`, never as a
finding.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple

from twinspark import recipe
from twinspark.doctor.findings import (
    ACK_ENV,
    CATALOGUE,
    CLOCK_OFFSET_BOUND_S,
    EXIT_CODES,
    STOP,
    WARN,
    acknowledged_ids,
)
from twinspark.fabric import gid as gid_rules
from twinspark.fabric import links, selector
from twinspark.fabric.sysfs import GidEntry, PortInfo
from twinspark.health.checks import DISK_DEGRADED_BYTES, DISK_FAILED_BYTES, FABRIC_MTU

# Kernels whose NCCL init fails with ibv_reg_mr_iova2 ENOMEM on DGX OS (CMA shows 0), and the boot option that
# avoids it.
ENOMEM_KERNELS = re.compile(r"7\.0\.0-(1019|31)(?!\d)")
ENOMEM_BOOT_OPTION = "kho=off"
# A direct Spark-to-Spark QSFP cable links each twin netdev at 200G.
FABRIC_SPEED_MBPS = 200_000


# The settings the rules read (none of them secret): `twinspark doctor --collect` records them with the facts, so a
# saved file can be judged anywhere.
SETTINGS_READ = (
    "TWINSPARK_PROFILE", "TWINSPARK_RUNTIME_FLAVOUR", "NODE_RANK", "MASTER_ADDR", "WORKER_HOST", "VLLM_HOST_IP",
    "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_AUTO", "NCCL_IB_GID_INDEX",
    "GID_MATCH_IP", "VLLM_NCCL_SO_PATH", "GPU_MEMORY_UTILIZATION", "NNODES", ACK_ENV,
)
FABRIC_MTU_KEY = "fabric_mtu"
"""Not a knob: the MTU the fabric play sets (spark_fabric_mtu), which the preflight passes along."""


class Found(NamedTuple):
    """What a rule found: its id, what is wrong, the fix, and the play that fixes it when that differs from the
    catalogue's (None: the catalogue's)."""

    id: str
    message: str
    fix: str
    fixed_by: str | None = None


@dataclass(frozen=True)
class Finding:
    id: str
    host: str
    message: str
    fix: str
    severity: str = ""
    fixed_by: str = ""
    acknowledged: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Later:
    """A fact the node cannot know yet: reported, never judged."""

    host: str
    fact: str
    why: str


@dataclass
class Report:
    findings: list[Finding]
    later: list[Later]

    def counted(self, preflight: bool = False) -> list[Finding]:
        """The findings that count: not acknowledged and, before site.yml's plays (`preflight`), not fixed by one."""
        return [f for f in self.findings if not f.acknowledged and not (preflight and f.fixed_by)]

    def exit_code(self, preflight: bool = False) -> int:
        return max((EXIT_CODES[f.severity] for f in self.counted(preflight)), default=0)

    def stops(self, preflight: bool = False) -> list[Finding]:
        return [f for f in self.counted(preflight) if f.severity == STOP]

    def to_dict(self, preflight: bool = False) -> dict[str, object]:
        return {"exit_code": self.exit_code(preflight),
                "findings": [f.to_dict() for f in self.findings],
                "later": [asdict(item) for item in self.later]}


def collector_options(env: Mapping[str, str], venv: str, state_dir: str, unit: str, record: str,
                      files: Sequence[str] = ()) -> dict[str, object]:
    """What the collector is asked to look at on a node with these settings and this layout: the NCCL library
    (gb10), the runtime venv, the model's and the state's filesystems, the rank's unit, the last fabric
    measurement. The preflight (filter twinspark_doctor_collect_cmd) and `twinspark doctor` ask the same."""
    model = env.get("MODEL", "")
    return {"nccl_so": env.get("VLLM_NCCL_SO_PATH", "") if env.get("TWINSPARK_PROFILE") == "gb10" else None,
            "venv": venv, "unit": unit, "record": record, "files": [str(path) for path in files],
            "paths": {"model": model if model.startswith("/") else env.get("HF_HOME", state_dir), "state": state_dir}}


def collector_argv(options: Mapping[str, object]) -> list[str]:
    """The same options as collect.py's command line."""
    argv = ["--venv", str(options["venv"]), "--unit", str(options["unit"]), "--record", str(options["record"])]
    if options.get("nccl_so") is not None:
        argv += ["--nccl-so", str(options["nccl_so"])]
    for label, path in dict(options.get("paths") or {}).items():
        argv += ["--path", f"{label}={path}"]
    for path in options.get("files") or []:
        argv += ["--file", str(path)]
    return argv


# ----------------------------------------------------------------------------------------------------- helpers


def _known(value: object) -> bool:
    return value is not None and not (isinstance(value, Mapping) and "unavailable" in value)


def _by_name(facts: Mapping) -> dict[str, Mapping]:
    return {str(n.get("name")): n for n in facts.get("netdevs") or []}


def _rdma(facts: Mapping) -> list[Mapping] | None:
    value = facts.get("rdma")
    return list(value) if isinstance(value, list) else None


def _ports(facts: Mapping) -> list[PortInfo]:
    """The facts' RDMA ports in the GID rules' own shape (twinspark.fabric.gid), with each netdev's MTU."""
    mtus = {name: n.get("mtu") for name, n in _by_name(facts).items()}
    ports = []
    for device in _rdma(facts) or []:
        for port in device.get("ports") or []:
            netdev = port.get("netdev")
            gids = tuple(GidEntry(int(g["index"]), g.get("gid"), g.get("type"), g.get("ndev"))
                         for g in port.get("gids") or [])
            ports.append(PortInfo(str(device["device"]), int(port["port"]), port.get("state"),
                                  port.get("link_layer"), gids, netdev, mtus.get(netdev)))
    return ports


def _selected_ports(facts: Mapping, env: Mapping[str, str]) -> list[PortInfo]:
    parsed = selector.parse_selector(env.get("NCCL_IB_HCA", ""))
    return [p for p in _ports(facts) if selector.selects(parsed, p.device, p.port)]


def fabric_netdevs(facts: Mapping, env: Mapping[str, str]) -> list[str]:
    """The netdevs serving traffic crosses: NCCL's socket interface and, on gb10, the netdevs of the HCAs
    NCCL_IB_HCA selects (both twins of the port)."""
    names = links.fabric_ifnames(env)
    if env.get("TWINSPARK_PROFILE") == "gb10":
        names += [p.netdev for p in _selected_ports(facts, env) if p.netdev]
    return list(dict.fromkeys(names))


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def _speed_gts(text: str | None) -> float | None:
    match = re.match(r"\s*([0-9.]+)\s*GT/s", text or "")
    return float(match.group(1)) if match else None


# ----------------------------------------------------------------------------------------------------- node rules
# Each: (facts, settings) -> [Found].


def kernel_cma_enomem(facts: Mapping, env: Mapping[str, str]) -> list[Found]:
    kernel = str(facts.get("kernel") or "")
    if not ENOMEM_KERNELS.match(kernel) or ENOMEM_BOOT_OPTION in str(facts.get("cmdline") or "").split():
        return []
    return [Found(
        "kernel.cma-enomem",
        f"kernel {kernel} without {ENOMEM_BOOT_OPTION} on its command line: NCCL init fails with ibv_reg_mr_iova2 "
        "ENOMEM (CMA shows 0), so the pair never starts",
        f"add {ENOMEM_BOOT_OPTION} to the kernel command line (GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, "
        "update-grub, reboot), or boot the 6.17 kernel")]


def pcie_links(facts: Mapping, env: Mapping[str, str]) -> list[Found]:
    found = []
    for function in facts.get("pcie") or []:
        cap, sta = function.get("lnkcap") or {}, function.get("lnksta") or {}
        narrower = cap.get("width") and sta.get("width") is not None and sta["width"] < cap["width"]
        cap_speed, sta_speed = _speed_gts(cap.get("speed")), _speed_gts(sta.get("speed"))
        slower = cap_speed and sta_speed is not None and sta_speed < cap_speed
        where = f"ConnectX function {function.get('address')} ({', '.join(function.get('netdevs') or []) or '-'})"
        if narrower or slower:
            found.append(Found(
                "pcie.link-degraded",
                f"{where} trained at x{sta.get('width')} {sta.get('speed')} but can do x{cap.get('width')} "
                f"{cap.get('speed')}: that twin port's bandwidth is cut",
                "power the node off and on (a cold boot retrains the link); if it stays degraded, have the "
                "ConnectX-7 serviced"))
        if function.get("aer_fatal"):
            found.append(Found(
                "pcie.fatal-error",
                f"{where} logged {function['aer_fatal']} fatal PCIe error(s) since boot; such errors have "
                "soft-locked a Spark head",
                "read `journalctl -k | grep -i aer`, then power the node off and on before serving; if it recurs, "
                "have the ConnectX-7 serviced"))
    return found


def rdma_devices(facts: Mapping, env: Mapping[str, str]) -> list[Found]:
    devices = _rdma(facts)
    if devices is None:
        return []
    parsed = selector.parse_selector(env.get("NCCL_IB_HCA", ""))
    present = sorted(str(d.get("device")) for d in devices)
    found = []
    missing = [t.name for t in parsed.tokens
               if not any(d == t.name if parsed.exact else d.startswith(t.name) for d in present)]
    if missing and not parsed.exclude:
        found.append(Found(
            "rdma.twin-missing",
            f"NCCL_IB_HCA names {', '.join(t.name for t in parsed.tokens)} but {', '.join(missing)} is not there "
            f"(present: {', '.join(present) or 'none'}): a twin PCIe function of the port did not come up, so the "
            "link runs at half bandwidth or not at all",
            "power the node off and on; look for the missing function with `ibdev2netdev` and `lspci | grep "
            "Mellanox`; correct twinspark_nccl_ib_hca if this node's names differ"))
    by_name = _by_name(facts)
    for port in _selected_ports(facts, env):
        if port.state in (None, gid_rules.ACTIVE_STATE):
            continue
        netdev = by_name.get(port.netdev or "", {})
        if netdev.get("admin_up") is False:
            found.append(Found("rdma.port-down", f"RDMA port {port.label} is {port.state}: {port.netdev} is "
                                                 "administratively down",
                               "playbooks/fabric.yml brings the fabric interfaces up"))
            continue
        why = f"{port.netdev or 'its netdev'} has no carrier" if netdev.get("carrier") is False else "no link"
        found.append(Found("rdma.port-down", f"RDMA port {port.label} is {port.state}: {why}",
                           "check the QSFP cable between the two nodes (`ibstat`, `ethtool` on the netdev)",
                           fixed_by=""))  # a cable or the peer: no play fixes that
    return found


def fabric_links(facts: Mapping, env: Mapping[str, str]) -> list[Found]:
    by_name = _by_name(facts)
    found = []
    ifnames = links.fabric_ifnames(env)
    for name in ifnames:
        if name not in by_name:
            found.append(Found(
                "fabric.interface-missing",
                f"fabric interface {name} (NCCL_SOCKET_IFNAME) does not exist on this node (it has "
                f"{', '.join(sorted(by_name)) or 'none'})",
                "set twinspark_nccl_socket_ifname for this host to its fabric netdev (`ibdev2netdev` names them on "
                "a Spark)"))
    own = env.get("VLLM_HOST_IP", "")
    present = [name for name in ifnames if name in by_name]
    on_fabric = [a for name in present for a in by_name[name].get("ipv4") or []]
    if own and present and own not in on_fabric:
        found.append(Found(
            "fabric.address",
            f"the node's fabric address {own} is not on {', '.join(present)} (has "
            f"{', '.join(on_fabric) or 'no address'})",
            "playbooks/fabric.yml puts twinspark_fabric_address on the fabric interface"))
    wanted = int(env.get(FABRIC_MTU_KEY) or FABRIC_MTU)
    for name in fabric_netdevs(facts, env):
        mtu = by_name.get(name, {}).get("mtu")
        if mtu is not None and mtu < wanted:
            found.append(Found(
                "fabric.mtu",
                f"{name} has MTU {mtu}, not {wanted}: without jumbo frames NCCL's bus bandwidth drops to a "
                "fraction (about 3 GB/s at 1500)",
                f"playbooks/fabric.yml sets MTU {wanted} (spark_fabric_mtu) on every fabric interface"))
        speed = by_name.get(name, {}).get("speed_mbps")
        if speed is not None and speed < FABRIC_SPEED_MBPS:
            found.append(Found(
                "netdev.speed-low",
                f"{name} links at {speed // 1000}G, below the {FABRIC_SPEED_MBPS // 1000}G of a direct Spark cable",
                f"check the cable and both ends (`ethtool {name}`); a 100G cable or a degraded port halves the "
                "fabric"))
    return found


def shared_subnet(facts: Mapping, env: Mapping[str, str]) -> list[Found]:
    """A fabric netdev whose subnet another netdev of the node also has an address in: the kernel then sends every
    packet for that subnet out of one of them, its own choice, and NCCL hangs without a word (the twins of a port on
    one /24, or a stray address). Needs the facts' address/prefix pairs (ipv4_cidr); older facts say nothing."""
    fabric = set(fabric_netdevs(facts, env))
    held: list[tuple[str, ipaddress.IPv4Interface]] = []
    for name, netdev in _by_name(facts).items():
        if name == "lo":
            continue
        for text in netdev.get("ipv4_cidr") or []:
            try:
                held.append((name, ipaddress.IPv4Interface(str(text))))
            except ValueError:
                continue
    clashes: dict[str, set[str]] = {}
    for index, (name, one) in enumerate(held):
        for other_name, other in held[index + 1:]:
            if name != other_name and (name in fabric or other_name in fabric) and one.network.overlaps(other.network):
                key = str(min(one.network, other.network, key=lambda n: n.prefixlen))
                clashes.setdefault(key, set()).update({f"{name} ({one})", f"{other_name} ({other})"})
    return [Found(
        "fabric.shared-subnet",
        f"{', '.join(sorted(holders))} share the subnet {network}: the kernel picks one of them for every packet to "
        "it, and NCCL can hang without a word",
        "give each fabric netdev a subnet of its own (a port's twins: spark_fabric_twin_network; a mesh or ring: "
        "twinspark_links, docs/GROUPS.md) and remove any stray address (`ip addr del ADDRESS dev NETDEV`)")
        for network, holders in sorted(clashes.items())]


def single_address(facts: Mapping, env: Mapping[str, str]) -> list[Found]:
    """A single Spark (NNODES=1) has no fabric, but vLLM still sets up its process group on VLLM_HOST_IP (the node's
    twinspark_fabric_address): it must be an address this node holds, on any netdev."""
    own = env.get("VLLM_HOST_IP", "")
    if not links.no_fabric(env) or not own or "netdevs" not in facts:
        return []
    held = sorted({str(a) for netdev in _by_name(facts).values() for a in netdev.get("ipv4") or []})
    if own in held:
        return []
    return [Found("single.address",
                  f"this single Spark's address {own} (VLLM_HOST_IP) is none of its own (it has "
                  f"{', '.join(held) or 'no address'}): vLLM could not set up its process group",
                  "set twinspark_fabric_address for this host to one of its own addresses (its LAN address will do)")]


def gid_index(facts: Mapping, env: Mapping[str, str]) -> list[Found]:
    """The launcher's own GID resolution (twinspark.fabric.gid) over the facts' ports and addresses."""
    if _rdma(facts) is None:
        return []
    addresses = {name: list(n.get("ipv4") or []) for name, n in _by_name(facts).items()}
    match = gid_rules.match_ip(env, lambda name: addresses.get(name, []))
    hca = env.get("NCCL_IB_HCA", "")
    try:
        resolution = gid_rules.choose_index(hca, gid_rules.select_members(hca, _ports(facts)), match or None,
                                            addresses)
    except gid_rules.GidResolutionError as error:
        return [Found("gid.unresolvable", f"the launcher's GID resolution fails: {error}",
                      "playbooks/fabric.yml gives the fabric netdevs their addresses; if it did, fix NCCL_IB_HCA")]
    pinned = env.get("NCCL_IB_GID_INDEX", "")
    if env.get("NCCL_IB_GID_AUTO") == "0" and pinned and int(pinned) != resolution.index:
        return [Found(
            "gid.pinned-drift",
            f"NCCL_IB_GID_INDEX is pinned to {pinned} with NCCL_IB_GID_AUTO=0, but this node's RoCE v2 GID for "
            f"{match or 'its addresses'} is index {resolution.index} now (indexes move after reboots): NCCL init "
            "would wedge",
            f"set twinspark_nccl_ib_gid_auto: 1 (the launcher resolves it at every start), or pin "
            f"{resolution.index} for this host")]
    return []


def nccl_library(facts: Mapping, env: Mapping[str, str]) -> list[Found]:
    nccl = facts.get("nccl") or {}
    wanted = env.get("VLLM_NCCL_SO_PATH", "")
    if not wanted or nccl.get("source") == "bundled":
        shown = nccl.get("resolved") or nccl.get("path") or "the runtime venv's nvidia-nccl wheel"
        return [Found(
            "nccl.bundled",
            f"vLLM would load its pip-bundled NCCL ({shown}): on Spark pairs it has hung TP=2 after 20-30 minutes "
            "under load, while the OS's libnccl of the same version did not",
            "set twinspark_vllm_nccl_so_path to the OS library (the gb10 default, from package libnccl2, which the "
            "nvidia_driver role installs)")]
    if nccl.get("exists") is False:
        return [Found("nccl.missing", f"VLLM_NCCL_SO_PATH is {wanted}, which does not exist on this node",
                      "playbooks/drivers.yml installs libnccl2 (nvidia_driver_nccl_install); otherwise point "
                      "twinspark_vllm_nccl_so_path at the library")]
    return []


def clock_state(facts: Mapping, env: Mapping[str, str]) -> list[Found]:
    clock = facts.get("clock")
    if not _known(clock):
        return []
    found = []
    if clock.get("synchronised") is False:
        found.append(Found("clock.unsynchronised", f"the clock is not synchronised ({clock.get('source')})",
                           "enable time synchronisation (systemd-timesyncd or chrony) against the same source on "
                           "both nodes"))
    offset = clock.get("offset_s")
    if offset is not None and abs(float(offset)) > CLOCK_OFFSET_BOUND_S:
        found.append(Found(
            "clock.offset",
            f"the clock is {float(offset):+.3f} s off its time source ({clock.get('source')}), more than "
            f"{CLOCK_OFFSET_BOUND_S} s",
            "check the time daemon (`chronyc tracking` or `timedatectl timesync-status`) and its servers"))
    return found


def memory_state(facts: Mapping, env: Mapping[str, str]) -> list[Found]:
    found = []
    total, available = facts.get("memory_total_bytes"), facts.get("memory_available_bytes")
    serving = facts.get("serving") or {}
    utilisation = env.get("GPU_MEMORY_UTILIZATION", "")
    if total and available is not None and utilisation and serving.get("running") is not True:
        wanted = float(utilisation) * int(total)
        if available < wanted:
            found.append(Found(
                "memory.budget",
                f"vLLM would refuse to start: GPU_MEMORY_UTILIZATION {utilisation} asks for {_gib(wanted)} of "
                f"{_gib(int(total))} unified memory, but only {_gib(available)} is available (a unified-memory "
                "node that runs out is hard-reset, not OOM-killed)",
                "stop what holds the memory (a desktop session: systemctl stop gdm3; other GPU jobs), or lower "
                "twinspark_gpu_memory_utilization (`twinspark plan` shows what still fits)"))
    if facts.get("desktop"):
        found.append(Found("memory.desktop", f"a desktop session runs ({', '.join(facts['desktop'])}) and holds "
                                             "unified memory the serving rank may need",
                           "systemctl disable --now gdm3 (the DSpark runbook stopped it on both nodes)"))
    return found


def hygiene(facts: Mapping, env: Mapping[str, str]) -> list[Found]:
    found = []
    if (facts.get("earlyoom") or {}).get("running"):
        found.append(Found("earlyoom.running", "earlyoom is running: it kills vLLM under deep-context load",
                           "playbooks/drivers.yml (role node_hygiene) disables it"))
    for label, disk in (facts.get("disk_free_bytes") or {}).items():
        free = disk.get("free_bytes")
        if free is None:
            continue
        where = f"{disk.get('path')} ({label}, on the filesystem of {disk.get('checked')}): {_gib(free)} free"
        fix = "free space there (old JIT caches, unused model revisions) or move the directory to a larger disk"
        if free < DISK_FAILED_BYTES:
            found.append(Found("disk.full", where, fix))
        elif free < DISK_DEGRADED_BYTES:
            found.append(Found("disk.low", where, fix))
    return found


NODE_RULES: tuple[Callable[[Mapping, Mapping[str, str]], list[Found]], ...] = (
    kernel_cma_enomem, pcie_links, rdma_devices, fabric_links, shared_subnet, gid_index, single_address, nccl_library,
    clock_state, memory_state, hygiene,
)
# The rules about the cables between ranks; a group of one has none (its NNODES is 1).
FABRIC_RULES = frozenset({rdma_devices, fabric_links, shared_subnet, gid_index})

# Facts whose absence is "not yet known" rather than a finding, per profile.
LATER_FACTS = {"gb10": ("driver_version", "gpu_name", "nccl", "rdma", "clock", "serving"),
               "cpu": ("clock", "serving")}


# ----------------------------------------------------------------------------------------------------- pair rules


def _fabric_mtu(facts: Mapping, env: Mapping[str, str]) -> int | None:
    by_name = _by_name(facts)
    mtus = [by_name[name].get("mtu") for name in links.fabric_ifnames(env) if name in by_name]
    return min((m for m in mtus if m is not None), default=None)


def _nccl_version(facts: Mapping) -> str | None:
    nccl = facts.get("nccl") or {}
    return nccl.get("version") if _known(nccl) else None


def _firmware(facts: Mapping) -> str | None:
    versions = sorted({str(d.get("fw_ver")) for d in _rdma(facts) or [] if d.get("fw_ver")})
    return ", ".join(versions) or None


def _os(facts: Mapping) -> str | None:
    release = facts.get("os_release")
    return f"{release.get('ID', '?')} {release.get('VERSION_ID', '?')}" if _known(release) else None


def _offset(facts: Mapping) -> float | None:
    clock = facts.get("clock")
    return float(clock["offset_s"]) if _known(clock) and clock.get("offset_s") is not None else None


def pair_rules(a: str, b: str, facts: Mapping[str, Mapping], envs: Mapping[str, Mapping[str, str]]) -> list[Found]:
    """Compare the two nodes of a pair: kernel, driver, NCCL, fabric MTU, clock, firmware, OS."""
    return group_rules([a, b], facts, envs)


def group_rules(hosts: Sequence[str], facts: Mapping[str, Mapping],
                envs: Mapping[str, Mapping[str, str]]) -> list[Found]:
    """Compare every node of a group (a pair is the group of two): kernel, driver, NCCL, fabric MTU, clock, firmware,
    OS. A value a node does not know is left out of its comparison; the finding lists every node's value."""
    found = []
    every = "both nodes" if len(hosts) == 2 else "every node of the group"

    def differ(finding: str, what: str, read: Callable[[str], object], fix: str) -> None:
        values = {host: read(host) for host in hosts}
        known = {host: value for host, value in values.items() if value is not None}
        if len(set(map(str, known.values()))) > 1:
            found.append(Found(finding, f"{what} differ: " + ", ".join(f"{h} {v}" for h, v in known.items()), fix))

    differ("pair.kernel", "the kernels", lambda host: facts[host].get("kernel"),
           "boot the same kernel on both nodes (DGX OS: apt full-upgrade on both, then reboot both)" if len(hosts) == 2
           else f"boot the same kernel on {every} (DGX OS: apt full-upgrade on each, then reboot them)")
    differ("pair.driver", "the NVIDIA drivers",
           lambda host: facts[host].get("driver_version") if _known(facts[host].get("driver_version")) else None,
           f"install the same driver on {'both' if len(hosts) == 2 else every} (nvidia_driver_mode=install pins one "
           f"branch; DGX OS: upgrade {'both' if len(hosts) == 2 else 'them all'})")
    differ("pair.nccl", "the NCCL versions vLLM would load", lambda host: _nccl_version(facts[host]),
           f"install the same libnccl2 on {'both' if len(hosts) == 2 else every} (nvidia_driver_nccl_version pins "
           "one); NCCL ranks of different versions can fail to connect or hang")
    differ("pair.mtu", "the fabric MTUs", lambda host: _fabric_mtu(facts[host], envs[host]),
           f"playbooks/fabric.yml sets one MTU (spark_fabric_mtu) on {every}; a mismatch drops every jumbo frame")
    differ("pair.firmware", "the ConnectX firmware versions", lambda host: _firmware(facts[host]),
           f"flash {'both ConnectX-7s' if len(hosts) == 2 else 'every ConnectX-7'} to the same firmware (DGX OS "
           f"firmware updates, then reboot {'both' if len(hosts) == 2 else 'them'})")
    differ("pair.os", "the OS releases", lambda host: _os(facts[host]),
           f"upgrade {every} to the same release")
    offsets = {host: offset for host in hosts if (offset := _offset(facts[host])) is not None}
    if len(offsets) >= 2 and max(offsets.values()) - min(offsets.values()) > CLOCK_OFFSET_BOUND_S:
        spread = max(offsets.values()) - min(offsets.values())
        which = "the two clocks are" if len(hosts) == 2 else "the group's clocks are up to"
        found.append(Found("pair.clock", f"{which} {spread:.3f} s apart ("
                                         + ", ".join(f"{h} {o:+.3f} s" for h, o in offsets.items())
                                         + f" off their sources), more than {CLOCK_OFFSET_BOUND_S} s",
                           f"synchronise {every} against the same time source"))
    return found + cabling(hosts, facts, envs)


def _macs(facts: Mapping) -> set[str]:
    """Every MAC the node's own netdevs have (a node may answer for an address on any of them), none of zeros."""
    return {str(n["mac"]).lower() for n in facts.get("netdevs") or [] if n.get("mac")} - {"00:00:00:00:00:00"}


# Entries the kernel has just confirmed, or that someone pinned; a STALE one may still hold the MAC of a node
# replaced since (it is checked again only when traffic flows).
JUDGED_NEIGHBOUR_STATES = ("REACHABLE", "PERMANENT")


def cabling(hosts: Sequence[str], facts: Mapping[str, Mapping],
            envs: Mapping[str, Mapping[str, str]]) -> list[Found]:
    """Each node's neighbour entry for every other node's fabric address must carry one of that node's own MACs.
    Another MAC there means another machine answers for the address: a duplicate address, a stray device on the
    switch, or a cable in the wrong port, and the ranks' traffic goes to it. Only entries the kernel has just confirmed
    (REACHABLE) or that were pinned (PERMANENT) are judged: no entry, a STALE one, or facts from before neighbours
    were collected leave the address unjudged."""
    owner = {str(n["mac"]).lower(): (host, n.get("name")) for host in hosts
             for n in facts[host].get("netdevs") or [] if n.get("mac")}
    found = []
    for here in hosts:
        entries = facts[here].get("neighbours")
        if not isinstance(entries, list):
            continue
        by_address = {e.get("ip"): e for e in entries
                      if isinstance(e, Mapping) and e.get("state") in JUDGED_NEIGHBOUR_STATES}
        for peer in hosts:
            own = _macs(facts[peer])
            if peer == here or not own:
                continue
            names = set(fabric_netdevs(facts[peer], envs[peer]))
            for netdev in facts[peer].get("netdevs") or []:
                if netdev.get("name") not in names:
                    continue
                for address in netdev.get("ipv4") or []:
                    entry = by_address.get(address)
                    if not entry or str(entry.get("mac")).lower() in own:
                        continue
                    mac = str(entry.get("mac")).lower()
                    holder = owner.get(mac)
                    whose = f"{holder[0]}'s {holder[1]}" if holder else "no node of the group"
                    found.append(Found(
                        "pair.cabling",
                        f"{here} reaches {peer}'s fabric address {address} ({netdev['name']}) at {mac} on "
                        f"{entry.get('netdev')}, which is {whose}, not {peer}",
                        f"another machine answers for {address}: a duplicate address or a cable in the wrong port; "
                        f"find who holds it (`ip -br addr` on each node, the switch's MAC table), correct it, then "
                        f"`ip neigh del {address} dev {entry.get('netdev')}` on {here} and run playbooks/fabric.yml"))
    return found


# ----------------------------------------------------------------------------------------------------- judging


def settings_of(facts: Mapping, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings to judge with: those recorded in the facts (`twinspark doctor --collect`), overridden by `env`,
    filled with the registry's defaults for the profile and rank."""
    given = {**dict(facts.get("settings") or {}), **{k: str(v) for k, v in (env or {}).items() if v is not None}}
    profile = given.get("TWINSPARK_PROFILE") or "gb10"
    rank = int(given["NODE_RANK"]) if given.get("NODE_RANK") in ("0", "1") else None
    flavour = given.get("TWINSPARK_RUNTIME_FLAVOUR") or "stock"
    return {**recipe.defaults(profile, rank, flavour, given.get(recipe.RECIPE_ENV) or None), **given}


def _finding(found: Found, host: str, acked: Sequence[str]) -> Finding:
    rule = CATALOGUE[found.id]
    fixed_by = rule.fixed_by if found.fixed_by is None else found.fixed_by
    return Finding(found.id, host, found.message, found.fix, rule.severity, fixed_by, found.id in acked)


def judge_node(host: str, facts: Mapping, env: Mapping[str, str]) -> Report:
    """Every rule of the node's profile over one node's facts and settings (settings_of)."""
    profile = env.get("TWINSPARK_PROFILE", "gb10")
    acked = acknowledged_ids(env.get(ACK_ENV, ""))
    alone = links.no_fabric(env)  # a group of one: no fabric to judge (docs/GROUPS.md, "A single Spark")
    rules = [rule for rule in NODE_RULES if not (alone and rule in FABRIC_RULES)]
    findings = [_finding(found, host, acked) for rule in rules for found in rule(facts, env)
                if profile in CATALOGUE[found.id].profiles]
    later = [Later(host, name, str(facts[name]["unavailable"])) for name in LATER_FACTS.get(profile, ())
             if isinstance(facts.get(name), Mapping) and "unavailable" in facts[name]
             and not (alone and name == "rdma")]
    return Report(findings, later)


def judge_pair(facts: Mapping[str, Mapping], envs: Mapping[str, Mapping[str, str]]) -> Report:
    """Every node's own rules, then the comparison across them; `facts` and `envs` are keyed by host (two for a pair,
    up to eight for a group)."""
    findings: list[Finding] = []
    later: list[Later] = []
    for host in facts:
        report = judge_node(host, facts[host], envs[host])
        findings += report.findings
        later += report.later
    if len(facts) >= 2:
        hosts = list(facts)
        profile = envs[hosts[0]].get("TWINSPARK_PROFILE", "gb10")
        acked = [i for host in hosts for i in acknowledged_ids(envs[host].get(ACK_ENV, ""))]
        findings += [_finding(found, "+".join(hosts), acked) for found in group_rules(hosts, facts, envs)
                     if profile in CATALOGUE[found.id].profiles]
    return Report(findings, later)


def unused_acknowledgements(report: Report, envs: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Acknowledged ids nothing was found for, per host: worth removing from the inventory."""
    found = {(host, f.id) for f in report.findings for host in f.host.split("+")}
    return [f"{host}: {finding}" for host, env in envs.items() for finding in acknowledged_ids(env.get(ACK_ENV, ""))
            if (host, finding) not in found]


# ----------------------------------------------------------------------------------------------------- output

MARKS = {STOP: "STOP", WARN: "WARN"}


def table(report: Report, preflight: bool = False) -> str:
    """One line per finding (what, then `->` the fix), the facts not known yet, and a verdict line."""
    lines = []
    for f in sorted(report.findings, key=lambda f: (-EXIT_CODES[f.severity], f.host, f.id)):
        if f.acknowledged:
            mark = "ack"
        elif preflight and f.fixed_by:
            mark = "later"
        else:
            mark = MARKS[f.severity]
        lines.append(f"{mark:<5}  {f.host}  {f.id}  {f.message}")
        note = " (acknowledged in twinspark_doctor_ack; still true)" if f.acknowledged else \
            f" (site.yml runs {f.fixed_by} after the preflight)" if preflight and f.fixed_by else ""
        lines.append(f"{'':<5}  -> {f.fix}{note}")
    for item in report.later:
        lines.append(f"{'n/a':<5}  {item.host}  {item.fact}  not known yet: {item.why}")
    code = report.exit_code(preflight)
    verdict = {0: "CLEAN", 1: "WARNINGS", 2: "STOP"}[code]
    counted = report.counted(preflight)
    lines.append(f"{verdict}: {sum(f.severity == STOP for f in counted)} stop, "
                 f"{sum(f.severity == WARN for f in counted)} warn, "
                 f"{sum(f.acknowledged for f in report.findings)} acknowledged, {len(report.later)} not known yet "
                 f"(exit {code})")
    return "\n".join(lines)
