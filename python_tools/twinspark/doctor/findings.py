"""The doctor's finding ids and what each means: the contract the inventory acknowledges findings by
(twinspark_doctor_ack, which validation checks against this table) and docs/DOCTOR.md documents. The rules that find
them are in twinspark/doctor/rules.py.

Severities: `stop` (the pair would not serve, or would stop serving: exit 2) and `warn` (it serves, worse: exit 1).
`fixed_by`: the play of site.yml that makes the finding go away on a node where it is found before that play runs
(the preflight runs before them all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STOP = "stop"
WARN = "warn"
EXIT_CODES = {STOP: 2, WARN: 1}
ACK_ENV = "TWINSPARK_DOCTOR_ACK"

FABRIC_PLAY = "playbooks/fabric.yml"
DRIVERS_PLAY = "playbooks/drivers.yml"

# Beyond this the node's clock is not kept (NTP offsets are milliseconds), and the two ranks' logs, the pair guard's
# expiring pauses and TLS validity start to disagree.
CLOCK_OFFSET_BOUND_S = 0.5


@dataclass(frozen=True)
class Rule:
    severity: str
    profiles: tuple[str, ...]
    summary: str
    fixed_by: str = ""
    """The site.yml play that makes this true on a node where it is not yet (the preflight runs before it)."""


BOTH = ("gb10", "cpu")
GB10 = ("gb10",)

# The finding ids are a contract: the inventory acknowledges them by name (twinspark_doctor_ack) and docs/DOCTOR.md
# documents each. Add new ones; never rename one.
CATALOGUE: dict[str, Rule] = {
    "kernel.cma-enomem": Rule(STOP, GB10, "kernel 7.0.0-1019 / 7.0.0-31 without kho=off: NCCL init fails (ENOMEM)"),
    "pcie.link-degraded": Rule(STOP, GB10, "a ConnectX-7 function trained narrower or slower than it can"),
    "pcie.fatal-error": Rule(STOP, GB10, "a fatal PCIe error on a ConnectX-7 function since boot"),
    "rdma.twin-missing": Rule(STOP, GB10, "an RDMA device NCCL_IB_HCA names is not there (a twin port missing)"),
    "rdma.port-down": Rule(STOP, GB10, "a selected RDMA port is not ACTIVE", FABRIC_PLAY),
    "netdev.speed-low": Rule(STOP, GB10, "a fabric netdev links below 200G"),
    "nccl.bundled": Rule(STOP, GB10, "vLLM would load its pip-bundled NCCL instead of the OS's"),
    "nccl.missing": Rule(STOP, GB10, "VLLM_NCCL_SO_PATH names no library", DRIVERS_PLAY),
    "fabric.interface-missing": Rule(STOP, BOTH, "the fabric interface (NCCL_SOCKET_IFNAME) does not exist"),
    "fabric.address": Rule(STOP, BOTH, "the node's fabric address is not on its fabric interface", FABRIC_PLAY),
    "fabric.mtu": Rule(WARN, BOTH, "a fabric interface without jumbo frames", FABRIC_PLAY),
    "fabric.shared-subnet": Rule(STOP, BOTH, "a fabric netdev shares its subnet with another netdev of the node"),
    "single.address": Rule(STOP, BOTH, "a single Spark's address (VLLM_HOST_IP) is none of its own"),
    "gid.unresolvable": Rule(STOP, GB10, "no RoCE v2 GID index the selected HCAs share", FABRIC_PLAY),
    "gid.pinned-drift": Rule(STOP, GB10, "the pinned NCCL_IB_GID_INDEX is not the one this node resolves"),
    "clock.unsynchronised": Rule(WARN, BOTH, "the clock is not synchronised"),
    "clock.offset": Rule(WARN, BOTH, f"the clock is more than {CLOCK_OFFSET_BOUND_S} s off its time source"),
    "memory.budget": Rule(STOP, GB10, "less memory available than GPU_MEMORY_UTILIZATION asks vLLM to take"),
    "memory.desktop": Rule(WARN, GB10, "a desktop session holds unified memory"),
    "earlyoom.running": Rule(WARN, BOTH, "earlyoom runs and kills vLLM under deep-context load", DRIVERS_PLAY),
    "disk.low": Rule(WARN, BOTH, "under 10 GiB free for the model, caches or state"),
    "disk.full": Rule(STOP, BOTH, "under 2 GiB free for the model, caches or state"),
    "pair.kernel": Rule(WARN, BOTH, "the two nodes run different kernels"),
    "pair.driver": Rule(WARN, GB10, "the two nodes run different NVIDIA drivers"),
    "pair.nccl": Rule(STOP, GB10, "the two nodes would load different NCCL versions"),
    "pair.mtu": Rule(STOP, BOTH, "the two nodes' fabric MTUs differ", FABRIC_PLAY),
    "pair.clock": Rule(WARN, BOTH, f"the two clocks are more than {CLOCK_OFFSET_BOUND_S} s apart"),
    "pair.firmware": Rule(WARN, GB10, "the two nodes' ConnectX firmware differs"),
    "pair.os": Rule(WARN, BOTH, "the two nodes run different OS releases"),
    "pair.cabling": Rule(STOP, BOTH, "a peer's fabric address answers from a MAC that is none of that peer's"),
}



def acknowledged_ids(text: str) -> list[str]:
    """The finding ids of a TWINSPARK_DOCTOR_ACK value (spaces or commas between them)."""
    return [word for word in re.split(r"[\s,]+", text or "") if word]


def unknown_ids(ids: list[str]) -> list[str]:
    return [i for i in ids if i not in CATALOGUE]
