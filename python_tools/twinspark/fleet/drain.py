"""Drain before touch: a pair that sits behind the fleet's router leaves it before it is restarted or stopped.

When the head's env files name a router (TWINSPARK_ROUTER_URL, and TWINSPARK_ROUTER_PAIR_URL: this pair's head API
as the router lists it in --worker-urls), every operation that restarts or stops the pair (the guard's ordered
restart, `twinspark pair restart|start|stop`, and so the restart playbooks) goes:

  1. POST <router>/remove_worker?url=<pair>: the router sends the pair nothing new;
  2. wait, bounded, until the pair's own /metrics shows no running and no waiting request (the requests the router
     had already sent finish; a removed worker drops out of the router's own load figures, so only the pair can
     tell);
  3. the work (the ordered restart, or the stop);
  4. POST <router>/add_worker?url=<pair>, only when the work ended with the pair serving a generation (the existing
     one-token probe) and the guard has not given up on it. A stopped pair, a pair that does not serve, and a pair
     the guard gave up on stay out; the guard's next run that finds it serving puts it back (`keep_in`), and
     `twinspark pair rejoin` (after one more probe) does the same at once.

The calls carry the router's admin key, read from the head's root-only drain key file (`read_key`,
twinspark_layout_router_drain_key, written by role serve_env): the router's front refuses the clients' key on these
paths (docs/FLEET.md, "API keys"), and the serving account cannot read the file.

A router that cannot be reached, or that refuses the call, never blocks the pair: the operation says so in one line
and goes on (a pair must stay restartable while the router is down; the router's own health checks then keep a
dead pair out, and a router restart lists every pair from the inventory again).

A pair the guard gave up on is kept out on every later guard run (`keep_out`): the router keeps its list in memory
only, so a router restart lists every pair of its --worker-urls again, and the next guard run takes such a pair out.

Rules (`router_from_env`, `key_from_text`, `admin_path`, `admin_outcome`, `idle`, `stay_out_reason`) are pure;
`read_key` reads the drain key file; `Router` speaks HTTP to the router and nothing else; `drained` ties them
together around any piece of work.
"""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from twinspark import validate
from twinspark.fleet import router_client

ROUTER_URL_ENV = "TWINSPARK_ROUTER_URL"
PAIR_URL_ENV = "TWINSPARK_ROUTER_PAIR_URL"
DEFAULT_IDLE_TIMEOUT_S = 120.0
ADMIN_TIMEOUT_S = 10.0
# /add_worker returns only once the worker's /health answers; the pair serves already, so this is a margin.
ADD_TIMEOUT_S = 60.0


# ---------------------------------------------------------------------------------------------------------------
# Rules (pure)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterRef:
    """The fleet's router as one pair sees it: where it is, the pair's URL in its list, and the key it demands."""

    url: str
    pair_url: str
    key: str | None
    # Where the admin key goes (issue 43, row 8): the router front's admin listener (https) and the router's
    # certificate, its only trust anchor, as role router wrote them on this head; None when not known here.
    admin_url: str | None = None
    ca: str | None = None


def _http_url(value: str, env: str) -> str:
    try:
        return validate.base_url(value)
    except ValueError as error:
        raise ValueError(f"{env}={value!r} {error}; set {env.lower()} in the inventory and render the env files "
                         "with site.yml") from None


def router_from_env(env: Mapping[str, str], key: str | None,
                    admin: Mapping[str, str] | None = None) -> RouterRef | None:
    """The router named by the env files, or None when there is none (a pair without a router: no drain at all).
    `admin`: this head's record of the router's admin listener (`read_admin`), used when it names the same router.

    Raises ValueError naming the variable when the router is named but the pair's URL is missing or malformed."""
    router = (env.get(ROUTER_URL_ENV) or "").strip()
    if not router:
        return None
    pair = (env.get(PAIR_URL_ENV) or "").strip()
    if not pair:
        raise ValueError(f"{ROUTER_URL_ENV} is set but {PAIR_URL_ENV} is empty: the drain cannot tell the router "
                         f"which pair to take out; set {PAIR_URL_ENV.lower()} to this pair's entry in "
                         "the router's --worker-urls")
    url = _http_url(router, ROUTER_URL_ENV)
    admin_url, ca = admin_listener(url, admin)
    return RouterRef(url, _http_url(pair, PAIR_URL_ENV), key, admin_url, ca)


def is_local(url: str) -> bool:
    """Whether a URL names this host's loopback (plain HTTP stays on the host there)."""
    host = (urllib.parse.urlsplit(url.strip()).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def admin_listener(router_url: str, admin: Mapping[str, str] | None) -> tuple[str | None, str | None]:
    """(where the admin key goes, the certificate to verify it against) for the router at `router_url`: the admin
    listener this head's record names for that same router; else, for a router on this host's loopback, the router
    URL itself (plain HTTP that never leaves the host); else (None, None): the admin key is not sent."""
    if admin:
        try:
            named = validate.base_url(str(admin.get("router", "")))
            listener = validate.base_url(str(admin.get("url", "")))
        except ValueError:
            named = listener = ""
        if named == router_url and listener:
            return listener, str(admin.get("ca") or "") or None
    if is_local(router_url):
        return router_url, None
    return None, None


MAX_ADMIN_FILE_BYTES = 4096


def read_admin(path: Path) -> dict[str, str] | None:
    """This head's record of the router's admin listener ({"router", "url", "ca"}, written by role router); None
    when it is missing, unreadable or not such a record."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_ADMIN_FILE_BYTES + 1)
        record = json.loads(raw) if len(raw) <= MAX_ADMIN_FILE_BYTES else None
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("router", "url", "ca")):
        return None
    return {k: record[k] for k in ("router", "url", "ca")}


def key_from_text(text: str) -> str | None:
    """The drain key file's key: its first line that is neither blank nor a # comment; None when there is none."""
    for line in text.splitlines():
        if line.strip() and not line.strip().startswith("#"):
            return line.strip()
    return None


def admin_path(verb: str, pair_url: str) -> str:
    """The router's admin call for `verb` (add or remove) of one worker URL."""
    if verb not in ("add", "remove"):
        raise ValueError(f"router verb {verb!r} is not add or remove")
    return f"/{verb}_worker?url={urllib.parse.quote(pair_url, safe=':/')}"


def admin_outcome(verb: str, status: int | None, body: str, router: str) -> tuple[bool, str]:
    """The router's answer to /add_worker or /remove_worker -> (the pair is where we want it, one line).

    Removing a worker the router does not list, or adding one it lists already, is the wanted state too. A router
    that answered is quoted in 160 characters; a call that got no answer keeps its whole line (what went wrong and the
    fix, router_client's)."""
    text = " ".join(body.split())[:160 if status is not None else 600]
    if status == 200:
        return True, f"router {router}: {verb}_worker done"
    lowered = text.lower()
    if status is not None and ((verb == "remove" and "not found" in lowered)
                               or (verb == "add" and "already" in lowered)):
        return True, f"router {router}: {verb}_worker: nothing to do ({text})"
    if status is None:
        return False, (f"router {router} cannot be reached ({text or 'no answer'}) for {verb}_worker; going on "
                       "without it (its health checks keep a dead pair out)")
    if status in (401, 403):
        return False, (f"router {router} refused the key for {verb}_worker ({status}); the head's drain key file "
                       "must hold the router's admin key (twinspark_router_admin_key; site.yml writes it); going on "
                       "without it")
    return False, f"router {router} answered {status} to {verb}_worker ({text}); going on without it"


def idle(metrics: Mapping[str, object]) -> bool | None:
    """Whether the pair's /metrics (api.parse_metrics' summary) shows no running and no waiting request; None when
    the metrics say nothing (an error, or no vLLM counters)."""
    if metrics.get("error"):
        return None
    running, waiting = metrics.get("running"), metrics.get("waiting")
    if running is None and waiting is None:
        return None
    return float(running or 0) + float(waiting or 0) == 0  # type: ignore[arg-type]


def stay_out_reason(served: bool, gave_up: bool, stopping: bool) -> str | None:
    """Why the pair is not put back after the work; None when it goes back."""
    if stopping:
        return "the pair was stopped"
    if gave_up:
        return "the pair guard gave up on it"
    if not served:
        return "it did not serve a generation"
    return None


# ---------------------------------------------------------------------------------------------------------------
# I/O
# ---------------------------------------------------------------------------------------------------------------


Post = Callable[[str, float], tuple[int | None, str]]
MAX_KEY_FILE_BYTES = 4096


def read_key(path: Path) -> str | None:
    """The router's admin key from the head's drain key file; None when the file is missing, unreadable or holds no
    key (the router then refuses the drain's calls, which the drain says in one line and goes on)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_KEY_FILE_BYTES:
        return None
    return key_from_text(raw.decode("utf-8", errors="replace"))


def admin_refusal(ref: RouterRef) -> str | None:
    """Why the admin key may not be sent for `ref` (issue 43, row 8: it goes over the network only in TLS, to the
    admin listener, verified against the router's certificate); None when it may."""
    where = "site.yml's router play writes the record and the certificate on each head it fronts"
    if not ref.admin_url:
        return (f"the router's admin listener is not known on this head (no record for {ref.url}), so the admin key "
                f"is not sent; {where}")
    if ref.admin_url.lower().startswith("https://"):
        if not (ref.ca and Path(ref.ca).is_file()):
            return f"the router's certificate is not at {ref.ca} on this head, so the admin key is not sent; {where}"
        return None
    if not is_local(ref.admin_url):
        return f"{ref.admin_url} is plain http to another host: the admin key goes there only over TLS; {where}"
    return None


class Router:
    """The router's admin API for one pair."""

    def __init__(self, ref: RouterRef, post: Post | None = None, get: Post | None = None) -> None:
        self.ref = ref
        self._post = post or self._http("POST")
        self._get = get or self._http("GET")

    def _http(self, method: str) -> Post:
        def send(path: str, timeout_s: float) -> tuple[int | None, str]:
            refused = admin_refusal(self.ref)
            if refused:
                return None, refused
            return router_client.request(str(self.ref.admin_url), path, self.ref.key, method, timeout_s=timeout_s,
                                         ca=self.ref.ca)

        return send

    def listed(self) -> tuple[tuple[str, ...] | None, str]:
        """The router's worker URLs (None when it cannot be read), and a line saying why not."""
        status, body = self._get("/list_workers", ADMIN_TIMEOUT_S)
        urls = router_client.listed_from_answer(status, body)
        if urls is not None:
            return urls, ""
        text = " ".join(body.split())[:160 if status is not None else 600]
        if status is None:
            return None, f"router {self.asked} cannot be reached ({text or 'no answer'}) for /list_workers"
        return None, f"router {self.asked} answered {status} to /list_workers ({text})"

    @property
    def asked(self) -> str:
        """The router's listener its admin calls go to (the admin listener; the client URL where none is known)."""
        return str(self.ref.admin_url or self.ref.url)

    def call(self, verb: str) -> tuple[bool, str]:
        status, body = self._post(admin_path(verb, self.ref.pair_url),
                                  ADD_TIMEOUT_S if verb == "add" else ADMIN_TIMEOUT_S)
        return admin_outcome(verb, status, body, self.asked)


def wait_idle(read_metrics: Callable[[], Mapping[str, object]], timeout_s: float,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
              poll_s: float = 0.5) -> tuple[bool, str]:
    """Poll the pair's /metrics until it shows no request (True) or `timeout_s` passes (False); one line.

    A /metrics that does not answer, or answers without vLLM's counters, ends the wait at once: such a pair is not
    serving anything that waiting would save, and waiting would only delay its repair."""
    started = clock()
    while True:
        metrics = read_metrics()
        verdict = idle(metrics)
        waited = clock() - started
        if verdict:
            return True, f"the pair is idle after {waited:.1f} s"
        if verdict is None:
            return False, f"cannot tell whether the pair is idle ({metrics.get('error')}); going on"
        last = f"{metrics.get('running') or 0:.0f} running, {metrics.get('waiting') or 0:.0f} waiting"
        if waited >= timeout_s:
            return False, f"the pair is not idle after {timeout_s:.0f} s ({last}); going on"
        sleep(min(poll_s, max(timeout_s - waited, 0.01)))


def _pair_listed(router: Router, log: Callable[[int, str], None], priority: int) -> bool | None:
    """Whether the router lists this pair; None (said at `priority`) when its list cannot be read."""
    listed, line = router.listed()
    if listed is None:
        log(priority, f"drain: {line}")
        return None
    return router.ref.pair_url.rstrip("/") in {url.rstrip("/") for url in listed}


def keep_out(router: Router | None, log: Callable[[int, str], None]) -> bool | None:
    """Make sure the router does not list a pair that must stay out (one the guard gave up on); True when it did
    and was told to drop it, False when it did not list it, None when the router could not be asked.

    The router keeps its worker list in memory only, so a router restarted since the pair left lists every pair of
    its --worker-urls again. The guard calls this on each of its runs while it has given up (its timer, every 20 s by
    default, is the safety net), which takes such a pair out again. It asks the list first (vllm-router 0.1.17
    answers 200 to removing a worker it does not list, so the removal alone cannot tell), and removes only when the
    pair is on it."""
    if router is None:
        return None
    listed = _pair_listed(router, log, 4)
    if listed is None:
        return None
    if not listed:
        log(7, f"drain: the pair stays out of router {router.ref.url} (not in its list)")
        return False
    out, line = router.call("remove")
    if not out:
        log(4, f"drain: {line}")
        return None
    log(4, f"drain: router {router.ref.url} listed the pair again (restarted since the pair left?), though the pair "
           "guard gave up on it; took it out again")
    return True


def keep_in(router: Router | None, log: Callable[[int, str], None]) -> bool | None:
    """Put a serving pair back in the router's list when it is not there; True when it was out and is back, False
    when it was listed already, None when the router could not be asked or refused.

    A pair leaves the router when the guard restarts it or gives up on it, and stays out when it did not serve
    afterwards. Once it serves again (the operator fixed the cause, or the pair healed by itself), the guard's next
    healthy run calls this, so a drained pair comes back without `twinspark pair rejoin`. A router that cannot be
    reached is said at info priority: the fleet's health reports the router itself."""
    if router is None:
        return None
    listed = _pair_listed(router, log, 6)
    if listed is None:
        return None
    if listed:
        return False
    back, line = router.call("add")
    if not back:
        log(4, f"drain: the pair serves but is not in router {router.ref.url}'s list, and putting it back failed: "
               f"{line}")
        return None
    log(5, f"drain: the pair serves again and was not in router {router.ref.url}'s list (drained while it did not "
           f"serve); put it back: {line}")
    return True


@dataclass(frozen=True)
class WorkResult:
    """What the drained work says about the pair afterwards."""

    served: bool  # it ended with a one-token generation answered by the pair
    gave_up: bool = False  # the guard has given up on the pair


def drained(router: Router | None, work: Callable[[], WorkResult], log: Callable[[int, str], None],
            read_metrics: Callable[[], Mapping[str, object]], idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
            stopping: bool = False, clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> tuple[WorkResult, list[str]]:
    """Take the pair out of the router, wait until it is idle, do `work`, put it back when it serves.

    Without a router: only `work`, nothing else, no line. Returns the work's result and the lines logged."""
    lines: list[str] = []

    def say(priority: int, line: str) -> None:
        lines.append(line)
        log(priority, f"drain: {line}")

    if router is None:
        return work(), lines
    out, line = router.call("remove")
    say(5 if out else 4, line)
    if out:
        quiet, line = wait_idle(read_metrics, idle_timeout_s, clock, sleep)
        say(5 if quiet else 4, line)
    result = work()
    reason = stay_out_reason(result.served, result.gave_up, stopping)
    if reason is not None:
        say(5, f"the pair stays out of router {router.ref.url}: {reason} (`twinspark pair rejoin` puts it back "
               "once it serves)")
        return result, lines
    back, line = router.call("add")
    say(5 if back else 4, line)
    return result, lines
