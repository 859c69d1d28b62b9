"""What a node is, as plain JSON facts, read with the Python standard library alone.

The preflight (playbooks/preflight.yml) ships this one file to every node and runs it with the node's own python3
before the drivers, the fabric or the runtime are installed, so it imports nothing outside the standard library
(tests/test_doctor_collect.py holds it to that) and changes nothing. `twinspark doctor --collect` runs the same
code on a node that has the package.

A fact that cannot be known yet (no NVIDIA module loaded before the drivers play, no runtime venv before the runtime
play, no RDMA devices before the RDMA driver) is `{"unavailable": "<why>"}`, never an error: the rules
(twinspark/doctor/rules.py) report it as not yet known.

Every path is built from a root (`--sys`, `--proc`, `--etc`, default /sys, /proc, /etc) and directory listings, so
the tests run it against fake trees; nothing here trusts a name it did not list itself.

Run as a script: python3 collect.py [--nccl-so PATH] [--venv DIR] [--path LABEL=DIR]... [--unit NAME] [--record FILE]
                               [--file FILE]...
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import grp
import hashlib
import json
import os
import pwd
import re
import shutil
import socket
import stat
import struct
import subprocess
import sys
import time

SCHEMA = 1
MELLANOX_VENDOR = "0x15b3"
MAX_ATTRIBUTE_BYTES = 1 << 16
# Process names that hold unified memory a serving node cannot spare: a desktop session (the DSpark runbook stopped
# gdm3 on both nodes), and earlyoom, which kills vLLM under deep-context load.
DESKTOP_PROCESSES = ("gdm3", "gdm", "Xorg", "Xwayland", "gnome-shell")
EARLYOOM_PROCESS = "earlyoom"
CHRONYC_TIMEOUT_S = 5


def unavailable(why: str) -> dict[str, str]:
    """The shape of a fact that cannot be known yet."""
    return {"unavailable": why}


def read_text(path: str) -> str | None:
    """A small regular file's text (a sysfs or procfs attribute, an os-release), stripped; None when it is missing,
    is not a regular file, is larger than an attribute can be, or the kernel will not show it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_ATTRIBUTE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_ATTRIBUTE_BYTES:
        return None
    return data.decode("utf-8", errors="replace").strip()


def _listing(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        return None


# ----------------------------------------------------------------------------------------------------- the system


def os_release(etc: str) -> dict:
    text = read_text(os.path.join(etc, "os-release"))
    if text is None:
        return unavailable(f"{etc}/os-release cannot be read")
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("ID", "VERSION_ID", "PRETTY_NAME", "VERSION_CODENAME"):
            found[key.strip()] = value.strip().strip('"')
    return found


def meminfo(proc: str) -> dict[str, int]:
    """/proc/meminfo's fields in bytes."""
    found = {}
    for line in (read_text(os.path.join(proc, "meminfo")) or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            found[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return found


def process_names(proc: str) -> set[str]:
    names = set()
    for entry in _listing(proc):
        if entry.isdigit():
            name = read_text(os.path.join(proc, entry, "comm"))
            if name:
                names.add(name)
    return names


def disk_free(paths: dict[str, str]) -> dict[str, dict]:
    """Free bytes on the filesystem of each labelled path; a path not created yet is measured at its nearest
    existing parent (where it will be created)."""
    found = {}
    for label, path in paths.items():
        checked = os.path.abspath(path)
        while not os.path.isdir(checked) and checked != os.path.dirname(checked):
            checked = os.path.dirname(checked)
        try:
            info = os.statvfs(checked)
        except OSError as error:
            found[label] = {"path": path, **unavailable(f"statvfs({checked}): {error.strerror}")}
            continue
        found[label] = {"path": path, "checked": checked, "free_bytes": info.f_bavail * info.f_frsize,
                        "total_bytes": info.f_blocks * info.f_frsize}
    return found


def json_record(path: str) -> object:
    """A small JSON file TwinSpark wrote on the node (the last fabric measurement), or why there is none."""
    if not path:
        return unavailable("not asked for")
    text = read_text(path)
    if text is None:
        return unavailable(f"{path} is not there")
    try:
        return json.loads(text)
    except ValueError:
        return unavailable(f"{path} is not JSON")


def unit_active(sys_root: str, unit: str) -> dict:
    """Whether a systemd unit has processes, from its cgroup (cgroup v2): no systemctl, no bus needed."""
    if not unit:
        return unavailable("no unit named")
    procs = os.path.join(sys_root, "fs", "cgroup", "system.slice", unit, "cgroup.procs")
    if not os.path.isdir(os.path.join(sys_root, "fs", "cgroup", "system.slice")):
        return unavailable(f"{sys_root}/fs/cgroup/system.slice is not there (not a cgroup v2 systemd host)")
    return {"unit": unit, "running": bool((read_text(procs) or "").strip())}


# ----------------------------------------------------------------------------------------------------- the GPU


def driver_version(sys_root: str) -> str | dict:
    version = read_text(os.path.join(sys_root, "module", "nvidia", "version"))
    return version or unavailable("no NVIDIA kernel module loaded (the drivers play installs or verifies it)")


def gpu_name(proc: str) -> str | dict:
    gpus = os.path.join(proc, "driver", "nvidia", "gpus")
    for bus in _listing(gpus):
        for line in (read_text(os.path.join(gpus, bus, "information")) or "").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model" and value.strip():
                return value.strip()
    return unavailable(f"no GPU listed under {gpus} (no NVIDIA driver loaded yet)")


# ----------------------------------------------------------------------------------------------------- NCCL


def dpkg_version(status_file: str, package: str) -> str | None:
    """The installed version of a Debian package, from dpkg's status file."""
    try:
        with open(status_file, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
        if fields.get("Package") == package and "installed" in fields.get("Status", "").split():
            return fields.get("Version")
    return None


def _nccl_version_from_name(path: str) -> str | None:
    match = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)$", os.path.basename(path))
    return match.group(1) if match else None


def _bundled_nccl(venv: str) -> tuple[str | None, str | None]:
    """The pip-bundled NCCL of the runtime venv (the nvidia-nccl-cu* wheel), and its version from the wheel."""
    libraries = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "nccl", "lib",
                                              "libnccl.so*")))
    wheels = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia_nccl_cu*.dist-info")))
    version = None
    if wheels:
        match = re.search(r"-(\d+\.\d+\.\d+)", os.path.basename(wheels[-1]))
        version = match.group(1) if match else None
    return (libraries[0] if libraries else None), version


def nccl(nccl_so: str | None, venv: str, dpkg_status: str) -> dict:
    """The NCCL library vLLM will load: VLLM_NCCL_SO_PATH when it names one, else (empty) the runtime venv's bundled
    copy; its version (from the versioned file name the link resolves to, or the wheel), and the OS package's
    version. None: not asked (a profile without NCCL)."""
    if nccl_so is None:
        return unavailable("not looked for (no --nccl-so: this profile runs no NCCL)")
    os_package = dpkg_version(dpkg_status, "libnccl2")
    if not nccl_so:
        path, version = _bundled_nccl(venv) if venv else (None, None)
        if path is None:
            return {"path": "", "source": "bundled", "os_package": os_package,
                    **unavailable(f"VLLM_NCCL_SO_PATH is empty (vLLM's bundled NCCL) and no runtime venv at "
                                  f"{venv or '(none given)'} holds one yet (the runtime play installs it)")}
        return {"path": path, "exists": True, "source": "bundled", "version": version, "os_package": os_package}
    exists = os.path.exists(nccl_so)
    resolved = os.path.realpath(nccl_so) if exists else nccl_so
    source = "bundled" if "site-packages" in resolved.split(os.sep) else "os" if resolved.startswith(
        ("/usr/lib", "/lib", "/usr/local/lib")) else "other"
    return {"path": nccl_so, "exists": exists, "resolved": resolved, "source": source,
            "version": _nccl_version_from_name(resolved), "os_package": os_package}


# ----------------------------------------------------------------------------------------------------- the network


class _SockaddrIn(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("port", ctypes.c_uint16), ("addr", ctypes.c_uint8 * 4),
                ("zero", ctypes.c_uint8 * 8)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [("next", ctypes.POINTER(_Ifaddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.POINTER(_SockaddrIn)), ("netmask", ctypes.POINTER(_SockaddrIn)),
                     ("ifu", ctypes.c_void_p), ("data", ctypes.c_void_p)]


def ipv4_by_netdev(with_prefix: bool = False) -> dict[str, list[str]]:
    """Every netdev's IPv4 addresses (primary first, as the kernel lists them), from the C library's getifaddrs(3);
    {} when it fails. No `ip` subprocess: iproute2 drops capabilities at start (capset), which a hardened unit's
    `SystemCallFilter=~@privileged` refuses; getifaddrs asks the kernel over netlink and needs no privilege.
    `with_prefix`: each as address/prefix length (10.77.0.1/24), from its netmask."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return {}
    found: dict[str, list[str]] = {}
    try:
        entry = head
        while entry:
            item = entry.contents
            if item.addr and item.addr.contents.family == socket.AF_INET:
                name = item.name.decode("utf-8", errors="replace")
                address = socket.inet_ntop(socket.AF_INET, bytes(item.addr.contents.addr))
                if with_prefix and item.netmask:
                    mask = int.from_bytes(bytes(item.netmask.contents.addr), "big")
                    address += f"/{bin(mask).count('1')}"
                found.setdefault(name, []).append(address)
            entry = item.next
    finally:
        libc.freeifaddrs(head)
    return found


def _pci_address(device_link: str) -> str | None:
    """The PCI function a sysfs `device` link points at (0000:01:00.0), or None for a virtual device."""
    target = os.path.basename(os.path.realpath(device_link)) if os.path.islink(device_link) else ""
    return target if re.fullmatch(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]", target) else None


def netdevs(sys_root: str, addresses: dict[str, list[str]], networks: dict[str, list[str]] | None = None) -> list[dict]:
    """Every netdev: operstate, administratively up, carrier, speed, MTU, driver, PCI function, IPv4 addresses, and
    with `networks` (ipv4_by_netdev(with_prefix=True)) the same addresses with their prefix length (ipv4_cidr)."""
    class_net = os.path.join(sys_root, "class", "net")
    found = []
    for name in _listing(class_net):
        base = os.path.join(class_net, name)
        flags = _int(read_text(os.path.join(base, "flags")))
        admin_up = bool(flags & 1) if flags is not None else None
        # carrier and speed read only while the interface is administratively up (EINVAL otherwise).
        carrier = _int(read_text(os.path.join(base, "carrier"))) if admin_up else None
        speed = _int(read_text(os.path.join(base, "speed"))) if admin_up else None
        driver = os.path.join(base, "device", "driver")
        found.append({
            "name": name,
            "operstate": (read_text(os.path.join(base, "operstate")) or "unknown").upper(),
            "admin_up": admin_up,
            "carrier": None if carrier is None else carrier == 1,
            "speed_mbps": speed if speed is not None and speed > 0 else None,
            "mtu": _int(read_text(os.path.join(base, "mtu"))),
            "driver": os.path.basename(os.path.realpath(driver)) if os.path.islink(driver) else None,
            "pci": _pci_address(os.path.join(base, "device")),
            "mac": (read_text(os.path.join(base, "address")) or "").lower() or None,
            "ipv4": list(addresses.get(name, [])),
            **({"ipv4_cidr": list(networks.get(name, []))} if networks is not None else {}),
        })
    return found


# The neighbour table over rtnetlink (no `ip` subprocess, for the reason ipv4_by_netdev gives).
RTM_NEWNEIGH, RTM_GETNEIGH = 28, 30
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NDA_DST, NDA_LLADDR = 1, 2
NUD_STATES = {0x01: "INCOMPLETE", 0x02: "REACHABLE", 0x04: "STALE", 0x08: "DELAY", 0x10: "PROBE", 0x20: "FAILED",
              0x40: "NOARP", 0x80: "PERMANENT"}
_NLMSGHDR = struct.Struct("=IHHII")
_NDMSG = struct.Struct("=BBHiHBB")
_RTATTR = struct.Struct("=HH")


def parse_neighbours(data: bytes, ifname=socket.if_indextoname) -> tuple[list[dict], bool]:
    """rtnetlink RTM_NEWNEIGH messages -> ([{ip, mac, netdev, state}] of the IPv4 entries with a MAC, done).
    `done` is True once NLMSG_DONE was read."""
    found, offset = [], 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        if kind == NLMSG_DONE:
            return found, True
        if kind == NLMSG_ERROR:
            raise OSError("the kernel refused the neighbour dump")
        body = offset + _NLMSGHDR.size
        if kind == RTM_NEWNEIGH and body + _NDMSG.size <= offset + length:
            family, _p1, _p2, index, state, _nflags, _ntype = _NDMSG.unpack_from(data, body)
            attrs, at = {}, body + _NDMSG.size
            while at + _RTATTR.size <= offset + length:
                size, kind_attr = _RTATTR.unpack_from(data, at)
                if size < _RTATTR.size:
                    break
                attrs[kind_attr] = data[at + _RTATTR.size:at + size]
                at += (size + 3) & ~3
            if family == socket.AF_INET and len(attrs.get(NDA_DST, b"")) == 4 and attrs.get(NDA_LLADDR):
                try:
                    netdev = ifname(index)
                except OSError:
                    netdev = str(index)
                found.append({"ip": socket.inet_ntoa(attrs[NDA_DST]),
                              "mac": ":".join(f"{b:02x}" for b in attrs[NDA_LLADDR]),
                              "netdev": netdev, "state": NUD_STATES.get(state, hex(state))})
        offset += (length + 3) & ~3
    return found, False


def neighbours() -> list[dict] | dict:
    """The kernel's IPv4 neighbour entries that have a MAC (its ARP table): address, MAC, netdev and state. The
    doctor compares the MAC each peer's fabric address answers from with the peer's own (pair.cabling)."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
            sock.settimeout(5)
            request = _NDMSG.pack(socket.AF_INET, 0, 0, 0, 0, 0, 0)
            sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(request), RTM_GETNEIGH, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
                      + request)
            found: list[dict] = []
            for _ in range(1000):
                part, done = parse_neighbours(sock.recv(1 << 16))
                found += part
                if done:
                    return found
    except OSError as error:
        return unavailable(f"the neighbour table could not be read ({error})")
    return unavailable("the neighbour table did not end")


def _aer_fatal(device_dir: str) -> int | None:
    """TOTAL_ERR_FATAL of a PCI function's AER counters (None where the kernel keeps none)."""
    for line in (read_text(os.path.join(device_dir, "aer_dev_fatal")) or "").splitlines():
        name, _, count = line.rpartition(" ")
        if name.strip() == "TOTAL_ERR_FATAL":
            return _int(count)
    return None


def _link(device_dir: str, kind: str) -> dict:
    """LnkCap (kind max) or LnkSta (kind current): width and speed, as sysfs spells them."""
    width = _int(read_text(os.path.join(device_dir, f"{kind}_link_width")))
    return {"width": width, "speed": read_text(os.path.join(device_dir, f"{kind}_link_speed"))}


def pcie(sys_root: str) -> list[dict]:
    """Every Mellanox/NVIDIA networking PCI function (a ConnectX-7 twin port is one each): its link as capable
    (LnkCap) and as trained (LnkSta), its fatal AER count, and the netdevs and RDMA devices on it."""
    devices = os.path.join(sys_root, "bus", "pci", "devices")
    found = []
    for address in _listing(devices):
        base = os.path.join(devices, address)
        if read_text(os.path.join(base, "vendor")) != MELLANOX_VENDOR:
            continue
        found.append({
            "address": address,
            "device_id": read_text(os.path.join(base, "device")),
            "lnkcap": _link(base, "max"),
            "lnksta": _link(base, "current"),
            "aer_fatal": _aer_fatal(base),
            "netdevs": _listing(os.path.join(base, "net")),
            "rdma": _listing(os.path.join(base, "infiniband")),
        })
    return found


def _gids(port_dir: str) -> list[dict]:
    """A port's populated GID entries (the kernel lists its whole table; unused entries read as zero)."""
    entries = []
    for name in _listing(os.path.join(port_dir, "gids")):
        if not name.isdigit():
            continue
        gid = read_text(os.path.join(port_dir, "gids", name))
        if not gid or not gid.replace("0", "").replace(":", ""):
            continue
        entries.append({"index": int(name), "gid": gid,
                        "type": read_text(os.path.join(port_dir, "gid_attrs", "types", name)),
                        "ndev": read_text(os.path.join(port_dir, "gid_attrs", "ndevs", name)) or None})
    return sorted(entries, key=lambda entry: entry["index"])


def rdma(sys_root: str) -> list[dict] | dict:
    """Every RDMA device: firmware, PCI function, and each port's state, link layer, netdev and GID table."""
    class_ib = os.path.join(sys_root, "class", "infiniband")
    if not os.path.isdir(class_ib):
        return unavailable(f"{class_ib} is not there (no RDMA driver loaded: the fabric play installs the RDMA "
                           "user space; DGX OS loads the ConnectX driver at boot)")
    found = []
    for device in _listing(class_ib):
        base = os.path.join(class_ib, device)
        net_by_port = {}
        for netdev in _listing(os.path.join(base, "device", "net")):
            dev_port = _int(read_text(os.path.join(base, "device", "net", netdev, "dev_port")))
            net_by_port.setdefault((dev_port or 0) + 1, netdev)
        ports = []
        for number in _listing(os.path.join(base, "ports")):
            if not number.isdigit():
                continue
            port_dir = os.path.join(base, "ports", number)
            gids = _gids(port_dir)
            state = read_text(os.path.join(port_dir, "state"))
            ports.append({
                "port": int(number),
                "state": state.split(":", 1)[-1].strip() if state else None,
                "link_layer": read_text(os.path.join(port_dir, "link_layer")),
                "netdev": next((g["ndev"] for g in gids if g["ndev"]), None) or net_by_port.get(int(number)),
                "gids": gids,
            })
        found.append({"device": device, "fw_ver": read_text(os.path.join(base, "fw_ver")),
                      "pci": _pci_address(os.path.join(base, "device")), "ports": ports})
    return found


# ----------------------------------------------------------------------------------------------------- the clock


class _Timeval(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time", _Timeval), ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long),
                ("jitter", ctypes.c_long), ("shift", ctypes.c_int), ("stabil", ctypes.c_long),
                ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long),
                ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int), ("reserved", ctypes.c_int * 11)]


TIME_ERROR = 5
STA_UNSYNC = 0x0040
STA_NANO = 0x2000


def _chrony_clock(chronyc: str) -> dict | None:
    """chronyd's own view (`chronyc -c tracking`): the system clock's offset from NTP time, and leap status."""
    try:
        done = subprocess.run([chronyc, "-c", "tracking"], capture_output=True, text=True,
                              timeout=CHRONYC_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = done.stdout.strip().split(",")
    if done.returncode != 0 or len(fields) < 14:
        return None
    try:
        offset = float(fields[4])
        dispersion = float(fields[11])
    except ValueError:
        return None
    return {"source": "chronyc tracking", "synchronised": fields[13].strip() != "Not synchronised",
            "offset_s": offset, "max_error_s": dispersion}


def _kernel_clock() -> dict:
    """The kernel's NTP state (adjtimex(2), read-only): what timedatectl's NTPSynchronized and an NTP daemon's
    offset and error estimates say."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    timex = _Timex()
    state = libc.adjtimex(ctypes.byref(timex))
    if state < 0:
        return unavailable(f"adjtimex failed (errno {ctypes.get_errno()})")
    scale = 1e9 if timex.status & STA_NANO else 1e6
    return {"source": "adjtimex", "synchronised": state != TIME_ERROR and not timex.status & STA_UNSYNC,
            "offset_s": timex.offset / scale, "max_error_s": timex.maxerror / 1e6}


def clock() -> dict:
    chronyc = shutil.which("chronyc")
    return (_chrony_clock(chronyc) if chronyc else None) or _kernel_clock()


# ----------------------------------------------------------------------------------------------------- files


def _owner_name(lookup, number: int) -> str | None:
    try:
        return lookup(number)[0]
    except KeyError:
        return None


def file_state(path: str) -> dict:
    """A managed file as a twinspark_probe read reports it (lstat: a link is never followed; the sha1 copy and
    template compare), so the playbook that writes it can gate on this read with the same filter
    (twinspark_probe_file) and a converged run costs no round trip; json_object says whether it parses as one JSON
    object. Only for small files the project writes."""
    try:
        st = os.lstat(path)
    except OSError:
        return {"exists": False, "parent_isdir": os.path.isdir(os.path.dirname(path))}
    entry = {"exists": True, "isreg": stat.S_ISREG(st.st_mode), "isdir": stat.S_ISDIR(st.st_mode),
             "islnk": stat.S_ISLNK(st.st_mode), "mode": f"{stat.S_IMODE(st.st_mode):04o}", "uid": st.st_uid,
             "gid": st.st_gid, "pw_name": _owner_name(pwd.getpwuid, st.st_uid),
             "gr_name": _owner_name(grp.getgrgid, st.st_gid), "parent_isdir": True}
    if entry["isreg"] and st.st_size <= MAX_ATTRIBUTE_BYTES:
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError:
            return entry
        entry["checksum"] = hashlib.sha1(raw).hexdigest()
        try:
            entry["json_object"] = isinstance(json.loads(raw), dict)
        except ValueError:
            entry["json_object"] = False
    return entry


# ----------------------------------------------------------------------------------------------------- all of it


def collect(nccl_so: str | None = None, venv: str = "", paths: dict[str, str] | None = None, unit: str = "",
            record: str = "", sys_root: str = "/sys", proc: str = "/proc", etc: str = "/etc",
            dpkg_status: str = "/var/lib/dpkg/status", addresses: dict[str, list[str]] | None = None,
            clock_reader=clock, files: list[str] | None = None) -> dict:
    """Every fact, as one JSON-ready dict (docs/DOCTOR.md lists them). `addresses` (address/prefix, or a bare address
    whose prefix is then not known) and `clock_reader` stand in for the kernel's in tests."""
    memory = meminfo(proc)
    running = process_names(proc)
    networks = ipv4_by_netdev(with_prefix=True) if addresses is None else addresses
    plain = {name: [address.split("/")[0] for address in found] for name, found in networks.items()}
    networks = {name: [address for address in found if "/" in address] for name, found in networks.items()}
    return {
        "schema": SCHEMA,
        "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hostname": socket.gethostname(),
        "kernel": read_text(os.path.join(proc, "sys", "kernel", "osrelease")),
        "cmdline": read_text(os.path.join(proc, "cmdline")) or "",
        "os_release": os_release(etc),
        "driver_version": driver_version(sys_root),
        "gpu_name": gpu_name(proc),
        "nccl": nccl(nccl_so, venv, dpkg_status),
        "memory_total_bytes": memory.get("MemTotal"),
        "memory_available_bytes": memory.get("MemAvailable"),
        "swap": {"total_bytes": memory.get("SwapTotal"), "free_bytes": memory.get("SwapFree")},
        "earlyoom": {"running": EARLYOOM_PROCESS in running},
        "desktop": sorted(running.intersection(DESKTOP_PROCESSES)),
        "serving": unit_active(sys_root, unit),
        "disk_free_bytes": disk_free(paths or {}),
        "netdevs": netdevs(sys_root, plain, networks),
        "neighbours": neighbours(),
        "pcie": pcie(sys_root),
        "rdma": rdma(sys_root),
        "clock": clock_reader(),
        "bandwidth_record": json_record(record),
        "files": {path: file_state(path) for path in files or []},
    }


def _label_path(text: str) -> tuple[str, str]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path.startswith("/"):
        raise argparse.ArgumentTypeError(f"--path wants LABEL=/absolute/dir (got {text!r})")
    return label, path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nccl-so", default=None, metavar="PATH",
                        help="VLLM_NCCL_SO_PATH (empty: vLLM's bundled NCCL in --venv)")
    parser.add_argument("--venv", default=None, metavar="DIR", help="the serving venv (where a bundled NCCL is)")
    parser.add_argument("--path", action="append", type=_label_path, default=[], metavar="LABEL=DIR",
                        help="a directory whose filesystem's free space to report (repeatable)")
    parser.add_argument("--unit", default=None, metavar="NAME", help="the rank's unit (serving or not)")
    parser.add_argument("--record", default=None, metavar="FILE", help="the last fabric measurement's record")
    parser.add_argument("--file", action="append", default=[], dest="files", metavar="FILE",
                        help="a managed file to report as a twinspark_probe read would (repeatable)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="collect.py", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    facts = collect(args.nccl_so, args.venv or "", dict(args.path), args.unit or "", args.record or "",
                    files=args.files)
    print(json.dumps(facts, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
