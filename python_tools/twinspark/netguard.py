"""The simulated pair's network rule: a simulated address is dialled only while its route stays on this machine.

The simulated pair (scripts/sim) lives at 10.77.0.0/24 (interconnect) and 10.78.0.0/24 (management). Those addresses
are reachable only through the harness bridge `tsbr0` on the host, or through a node's own `mgmt0`/`ic0` inside its
network namespace. When the bridge is missing (the pair is down or being rebuilt) the kernel would otherwise send such
packets along the host's default route, off the machine. The harness keeps blackhole routes for both ranges for that
reason; this module is the second line: every tool that dials an address checks the route first and refuses, in one
line, when the route to a simulated address goes anywhere else.

Only addresses inside the simulated ranges are checked; every other address (a real pair) is left alone. A site whose
real pair happens to use one of these ranges sets `TWINSPARK_SIM_NETWORKS` to its own list (or to `none`).

`twinspark route-check ADDRESS|URL...` runs the same check from a shell or a playbook: exit 0 all safe, 1 refused
(one line per refused address on stderr), 2 bad input. `twinspark route-check --connect HOST PORT` checks, then relays
stdin/stdout to HOST:PORT: the simulated inventory's SSH ProxyCommand, so no Ansible connection to a simulated
address can leave the machine.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import selectors
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from urllib.parse import urlsplit

NETWORKS_ENV = "TWINSPARK_SIM_NETWORKS"
DEFAULT_NETWORKS = ("10.77.0.0/24", "10.78.0.0/24")
# The harness bridge on the host, the node's own links inside a node's namespace, and loopback.
HARNESS_DEVICES = frozenset({"tsbr0", "mgmt0", "ic0", "lo"})
IP_TIMEOUT_S = 5.0

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
RouteLookup = Callable[[str], "tuple[dict[str, object] | None, str]"]


class UnsafeRoute(Exception):
    """A simulated address whose route would leave the machine (or cannot be known)."""


def simulated_networks(environ: Mapping[str, str] = os.environ) -> list[Network]:
    """The ranges the rule covers: TWINSPARK_SIM_NETWORKS (comma-separated, `none` for no range) or the default."""
    raw = environ.get(NETWORKS_ENV)
    if raw is None:
        return [ipaddress.ip_network(n) for n in DEFAULT_NETWORKS]
    if raw.strip().lower() in ("", "none"):
        return []
    networks = []
    for part in raw.split(","):
        try:
            networks.append(ipaddress.ip_network(part.strip(), strict=False))
        except ValueError:
            raise UnsafeRoute(f"{NETWORKS_ENV} must be a comma-separated list of networks or 'none' "
                              f"(got {part.strip()!r})") from None
    return networks


def host_of(target: str) -> str:
    """The host part of an address or URL (`http://10.78.0.1:8888/v1` -> `10.78.0.1`, `[::1]:22` -> `::1`)."""
    if "://" in target:
        return urlsplit(target).hostname or ""
    if target.startswith("["):
        return target[1:].split("]", 1)[0]
    if target.count(":") == 1:
        return target.split(":", 1)[0]
    return target


def simulated(host: str, networks: Iterable[Network]) -> bool:
    """True when host is a literal IP address inside one of the networks (names are not resolved here)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in network for network in networks)


def route_problem(host: str, route: Mapping[str, object] | None, error: str) -> str | None:
    """Why dialling host would be unsafe, from `ip -j route get` (route) or its error text; None when it is safe."""
    if route is None:
        reason = error.strip().splitlines()[-1] if error.strip() else "no route"
        if "Invalid argument" in reason:
            reason = "blackhole (no bridge or node link carries it here: is the pair down?)"
        return f"its route is {reason}"
    device = str(route.get("dev") or "")
    if route.get("type") in ("blackhole", "unreachable", "prohibit"):
        return f"its route is {route['type']} (the pair's network is down)"
    if device in HARNESS_DEVICES:
        return None
    via = f" via {route['gateway']}" if route.get("gateway") else ""
    return f"its route goes out through {device or 'an unknown device'}{via}"


def lookup_route(host: str) -> tuple[dict[str, object] | None, str]:
    """`ip -j route get HOST`: (the route, "") or (None, ip's error)."""
    try:
        done = subprocess.run(["ip", "-j", "route", "get", host], capture_output=True, text=True,
                              timeout=IP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"unknown: `ip route get` could not run ({type(error).__name__})"
    if done.returncode != 0:
        return None, done.stderr
    try:
        routes = json.loads(done.stdout)
    except ValueError:
        return None, "unknown: `ip -j route get` printed no JSON"
    return (routes[0], "") if routes else (None, "no route")


def check(targets: Iterable[str], environ: Mapping[str, str] = os.environ,
          lookup: RouteLookup = lookup_route) -> list[str]:
    """Check every target (address, host:port or URL); returns what is safe to say about each, raises UnsafeRoute."""
    networks = simulated_networks(environ)
    checked = []
    for target in targets:
        host = host_of(target)
        if not simulated(host, networks):
            checked.append(f"{host}: not a simulated address, not checked")
            continue
        route, error = lookup(host)
        problem = route_problem(host, route, error)
        if problem:
            raise UnsafeRoute(f"refusing to dial {host}, an address of the simulated pair: {problem}, not through "
                              "the harness bridge tsbr0 or a node's own links; bring the pair up with "
                              "scripts/sim/up (make sim-up) first")
        checked.append(f"{host}: via {route['dev']}")  # type: ignore[index]
    return checked


def relay(host: str, port: int, timeout: float = 10.0) -> int:
    """Connect to host:port and copy stdin to it and its answers to stdout until either side closes."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError as error:
        print(f"twinspark route-check: cannot connect to {host}:{port} ({error.strerror or error})",
              file=sys.stderr)
        return 1
    conn.settimeout(None)
    stdin, stdout = sys.stdin.buffer.fileno(), sys.stdout.buffer.fileno()
    selector = selectors.DefaultSelector()
    selector.register(stdin, selectors.EVENT_READ, "in")
    selector.register(conn, selectors.EVENT_READ, "net")
    with conn:
        while True:
            for key, _ in selector.select():
                if key.data == "in":
                    chunk = os.read(stdin, 65536)
                    if not chunk:
                        selector.unregister(stdin)
                        conn.shutdown(socket.SHUT_WR)
                        continue
                    conn.sendall(chunk)
                else:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return 0
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(stdout, view):]


def cmd_route_check(args: argparse.Namespace) -> int:
    targets = [args.connect[0]] if args.connect else args.targets
    if not targets:
        print("twinspark route-check: name at least one ADDRESS or URL (or --connect HOST PORT)", file=sys.stderr)
        return 2
    try:
        checked = check(targets)
    except UnsafeRoute as error:
        print(f"twinspark route-check: {error}", file=sys.stderr)
        return 1
    if args.connect:
        try:
            port = int(args.connect[1])
        except ValueError:
            print(f"twinspark route-check: --connect PORT must be a number (got {args.connect[1]!r})",
                  file=sys.stderr)
            return 2
        return relay(args.connect[0], port)
    if not args.quiet:
        print("\n".join(checked))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "route-check", help="refuse to dial a simulated-pair address whose route would leave this machine",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", metavar="ADDRESS|URL")
    parser.add_argument("--connect", nargs=2, metavar=("HOST", "PORT"),
                        help="check HOST, then relay stdin/stdout to HOST:PORT (an SSH ProxyCommand)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing when every target is safe")
    parser.set_defaults(func=cmd_route_check)
