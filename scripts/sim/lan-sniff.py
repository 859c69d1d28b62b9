#!/usr/bin/env python3
"""Listen on the simulated management LAN while a command runs, as any host on that LAN could, and say whether a
secret crossed it in clear text (issue 43, row 8; molecule/fleet/verify.yml attack 17).

    TWINSPARK_SNIFF_SECRET=... python3 scripts/sim/lan-sniff.py --iface tsbr0 --port 30443 [--seconds 60] -- CMD...

Runs CMD while it reads every frame on IFACE (an AF_PACKET socket: root only), then prints one JSON line: the
command's exit code and output tail, how many frames it saw, how many TCP segments went to or came from PORT, and
whether the secret (from the environment, never printed) appeared in any frame, as it is or base64-encoded. The
capture stops when the command ends or after --seconds. Exit 0 when the command succeeded and the secret never
showed; 1 otherwise; 2 on bad use.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
SOL_PACKET, PACKET_ADD_MEMBERSHIP, PACKET_MR_PROMISC = 263, 1, 1  # linux/if_packet.h


def tcp_ports(frame: bytes) -> tuple[int, int] | None:
    """(source port, destination port) of an Ethernet frame carrying IPv4 TCP; None for anything else."""
    if len(frame) < 14 + 20 or struct.unpack("!H", frame[12:14])[0] != ETH_P_IP:
        return None
    ip = frame[14:]
    if ip[9] != 6:  # not TCP
        return None
    header = (ip[0] & 0x0F) * 4
    if len(ip) < header + 4:
        return None
    return struct.unpack("!HH", ip[header:header + 4])


def needles(secret: str) -> list[bytes]:
    raw = secret.encode()
    return [raw, base64.b64encode(raw), base64.b64encode(b"Bearer " + raw)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iface", required=True)
    parser.add_argument("--port", type=int, required=True, help="count the TCP segments of this port")
    parser.add_argument("--seconds", type=float, default=60.0, help="bound on the capture and the command")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    secret = os.environ.get("TWINSPARK_SNIFF_SECRET", "")
    if not command or not secret:
        parser.error("give a command after -- and the secret in TWINSPARK_SNIFF_SECRET")
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((args.iface, 0))
    # Promiscuous: a bridge then passes up the frames it forwards between its ports too, not only its own.
    membership = struct.pack("iHH8s", socket.if_nametoindex(args.iface), PACKET_MR_PROMISC, 0, b"")
    sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, membership)
    sock.setblocking(False)
    wanted = needles(secret)
    seen = {"frames": 0, "port_segments": 0, "secret_seen": False}
    done = threading.Event()
    result: dict[str, object] = {}

    def run() -> None:
        try:
            finished = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds, check=False)
            result["rc"], result["tail"] = finished.returncode, (finished.stdout + finished.stderr)[-400:]
        except subprocess.TimeoutExpired:
            result["rc"], result["tail"] = "timeout", ""
        done.set()

    end = time.monotonic() + args.seconds + 5
    threading.Thread(target=run, daemon=True).start()
    # A short tail after the command: the last segments of its connections are on the wire by then.
    settle_until: float | None = None
    while time.monotonic() < end:
        if done.is_set() and settle_until is None:
            settle_until = time.monotonic() + 1.0
        if settle_until is not None and time.monotonic() >= settle_until:
            break
        ready, _, _ = select.select([sock], [], [], 0.2)
        if not ready:
            continue
        while True:
            try:
                frame = sock.recv(65536)
            except BlockingIOError:
                break
            seen["frames"] += 1
            ports = tcp_ports(frame)
            if ports and args.port in ports:
                seen["port_segments"] += 1
            if any(needle in frame for needle in wanted):
                seen["secret_seen"] = True
    sock.close()
    print(json.dumps({"rc": result.get("rc", "running"), **seen, "tail": result.get("tail", "")}))
    return 0 if result.get("rc") == 0 and not seen["secret_seen"] else 1


if __name__ == "__main__":
    sys.exit(main())
