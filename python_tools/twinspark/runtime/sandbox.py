"""How provisioning runs the runtime's code: as the serving account, in a sandboxed transient unit.

The check imports vLLM and torch from the runtime's venv, so every package of the runtime's wheel set runs its code
there. Started by root, a poisoned wheel would run as root on both nodes. The playbooks therefore never start the
venv's interpreter themselves: they hand the check's argv to `systemd-run`, which starts it as the serving account
(`service_user` of the layout, the account vLLM's ranks already run as) under the rank unit's sandbox, minus what
the check does not need: no network at all, no capability, no writable path but a private /tmp. The fabric's
all_reduce benchmark (`twinspark fabric bench`, playbooks/fabric-check.yml), which imports torch, runs the same way,
with the network and the devices it measures.

The command is built here, in pure functions, so the playbooks (filters `twinspark_runtime_check_sandbox` and
`twinspark_fabric_bench_sandbox`) and the tests read one definition. An operator who types `twinspark runtime
check` by hand runs it as whoever they are; the wrapped form is in docs/RUNTIME.md.

secrets.env is root's alone (0600). The unit gets a private copy of it the way the rank's unit does
(`LoadCredential=`), and the launcher reads that copy when the path it was given is unreadable
(twinspark.launcher.credential_fallback): no key is ever in argv, in a property or in a file others can read.
On the worker, whose rank gets no secret at all, the check gets none either (`secrets_env` empty: issue 43, row 11).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

# systemd stops the check after this long (the check's own bound: importing vLLM and torch takes seconds to a
# minute). `timeout` around systemd-run allows a little more, for a manager that never answers.
TIMEOUT_S = 600
CLIENT_GRACE_S = 60

# The device groups CUDA and NVML open on a GB10, as the rank's unit lists them (no RDMA: the check opens no NIC).
GB10_DEVICES = ("char-nvidia-frontend", "char-nvidia", "char-nvidiactl", "char-nvidia-uvm", "char-nvidia-caps",
                "char-nvidia-caps-imex-channels")

SYSTEMD_RUN = ("systemd-run", "--wait", "--pipe", "--collect", "--quiet", "--service-type=exec")


def check_command(python: str, env_files: Sequence[str]) -> list[str]:
    """The check as the rank's unit starts the launcher: the venv's interpreter in isolated mode (neither the
    working directory nor PYTHON* variables reach sys.path)."""
    argv = [python, "-I", "-m", "twinspark.cli", "runtime", "check"]
    for path in env_files:
        argv += ["--env", path]
    return argv


def properties(profile: str, user: str, secrets_env: str, timeout_s: int = TIMEOUT_S) -> list[str]:
    """The runtime check's transient unit, one `Name=value` each.

    Kept from the rank's unit (twinspark-vllm.service.j2): its account (User= alone: the primary group is the
    service group, which may read serve.env), the credential, the device policy of the profile and every directive of
    its sandbox. Added, since the check needs neither: PrivateNetwork=yes with IPAddressDeny=any, and nothing
    writable but its private /tmp (where the check keeps what vLLM and torch cache while importing). Not set, as in
    the rank's unit: MemoryDenyWriteExecute= (torch's and oneDNN's code generators) and ProcSubset=pid (the memory
    planner reads /proc/meminfo, NVML /proc/driver/nvidia).
    """
    credential = [f"LoadCredential={Path(secrets_env).name}:{secrets_env}"] if secrets_env else []
    return [*_account(user, timeout_s), *credential,
            "PrivateNetwork=yes", "IPAddressDeny=any", *_devices(profile, rdma=False), *SANDBOX]


def fabric_bench_properties(profile: str, user: str, timeout_s: int) -> list[str]:
    """`twinspark fabric bench`'s transient unit (it imports torch and runs an all_reduce with the peer): the rank
    unit's account, devices (the RDMA verbs too, on gb10) and sandbox, with the network it measures, and the rank's
    LimitMEMLOCK=infinity (NCCL registers its buffers with the NIC, which root alone could do without it)."""
    return [*_account(user, timeout_s), "LimitMEMLOCK=infinity", *_devices(profile, rdma=True), *SANDBOX]


def _account(user: str, timeout_s: int) -> list[str]:
    if not user or user == "root":
        raise ValueError(f"the runtime's code runs as the serving account, never as root (got {user!r})")
    return [f"User={user}", f"RuntimeMaxSec={int(timeout_s)}", "UMask=0077", "NoNewPrivileges=yes",
            "CapabilityBoundingSet=", "AmbientCapabilities=", "ProtectSystem=strict", "ProtectHome=yes",
            "PrivateTmp=yes"]


def _devices(profile: str, rdma: bool) -> list[str]:
    if profile == "gb10":
        groups = GB10_DEVICES + (("char-infiniband_verbs",) if rdma else ())
        return ["DevicePolicy=closed", *(f"DeviceAllow={group} rw" for group in groups)]
    if profile == "cpu":
        return ["PrivateDevices=yes", "DevicePolicy=closed", "ProtectKernelTunables=yes"]
    raise ValueError(f"profile must be one of cpu, gb10 (got {profile!r})")


# The rank unit's sandbox directives that apply to both (twinspark-vllm.service.j2).
SANDBOX = (
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "ProtectProc=invisible",
    "RestrictNamespaces=yes",
    "RestrictRealtime=yes",
    "RestrictSUIDSGID=yes",
    "LockPersonality=yes",
    "RemoveIPC=yes",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "SystemCallArchitectures=native",
    "SystemCallFilter=@system-service",
    "SystemCallFilter=~@privileged @mount @module @raw-io @reboot @swap @obsolete @cpu-emulation @clock",
    "SystemCallErrorNumber=EPERM",
)


def wrap(command: Sequence[str], profile: str, user: str, secrets_env: str, timeout_s: int = TIMEOUT_S) -> list[str]:
    """The runtime check as root hands it to systemd (see run_argv)."""
    return run_argv(command, properties(profile, user, secrets_env, timeout_s), timeout_s,
                    "twinspark runtime check (as the serving account)")


def wrap_fabric_bench(command: Sequence[str], profile: str, user: str, environment: Mapping[str, str],
                      timeout_s: int) -> list[str]:
    """`twinspark fabric bench` as root hands it to systemd, with the NCCL variables it is measured under (a
    transient unit starts with the manager's environment, not the caller's)."""
    return run_argv(command, fabric_bench_properties(profile, user, timeout_s), timeout_s,
                    "twinspark fabric bench (as the serving account)", environment)


def run_argv(command: Sequence[str], props: Sequence[str], timeout_s: int, description: str,
             environment: Mapping[str, str] | None = None) -> list[str]:
    """`timeout` (a bound on systemd-run itself), `systemd-run --wait --pipe` (the command's stdout, stderr and exit
    code come back unchanged), the properties and variables, then `--` and the command."""
    return [
        "timeout", str(int(timeout_s) + CLIENT_GRACE_S), *SYSTEMD_RUN, f"--description={description}",
        *(f"--property={item}" for item in props),
        *(f"--setenv={name}={value}" for name, value in (environment or {}).items()),
        "--", *command,
    ]


def unit_text(command: Sequence[str], profile: str, user: str, secrets_env: str) -> str:
    """The same properties as a unit file, for `systemd-analyze security --offline=true` (the exposure figure)."""
    lines = ["[Service]", "Type=exec", "ExecStart=" + " ".join(command),
             *properties(profile, user, secrets_env)]
    return "\n".join(lines) + "\n"
