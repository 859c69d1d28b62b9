"""Drain before touch (twinspark.fleet.drain): the rules, the order around the work, and the pair CLI with a router.

The router and the pair are stood in for here; tests/test_drain_loopback.py runs the same code against the real
vllm-router on loopback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_pairlife_cycle import Head

from twinspark import cli
from twinspark.fleet import drain
from twinspark.pair import cli as pair_cli
from twinspark.pair import guard, rules
from twinspark.pair import lifecycle as pl
from twinspark.pair.rules import Generation

# --- rules (pure) ----------------------------------------------------------------------------------------------


def test_no_router_named_means_no_drain():
    assert drain.router_from_env({"VLLM_PORT": "8000"}, "k") is None
    assert drain.router_from_env({drain.ROUTER_URL_ENV: "  "}, "k") is None


def test_a_named_router_needs_the_pairs_url_and_says_which_variable():
    with pytest.raises(ValueError, match="TWINSPARK_ROUTER_PAIR_URL is empty.*twinspark_router_pair_url"):
        drain.router_from_env({drain.ROUTER_URL_ENV: "http://10.0.0.9:30000"}, "k")
    with pytest.raises(ValueError, match="TWINSPARK_ROUTER_URL='ftp://x' is not a base URL"):
        drain.router_from_env({drain.ROUTER_URL_ENV: "ftp://x", drain.PAIR_URL_ENV: "http://h:8000"}, "k")


def test_the_router_reference_carries_both_urls_and_the_key():
    ref = drain.router_from_env({drain.ROUTER_URL_ENV: "http://10.0.0.9:30000/",
                                 drain.PAIR_URL_ENV: "http://10.0.0.1:8000"}, "sk-1")
    assert ref == drain.RouterRef("http://10.0.0.9:30000", "http://10.0.0.1:8000", "sk-1")
    # the admin listener comes from this head's record when it names the same router
    admin = {"router": "http://10.0.0.9:30000", "url": "https://10.0.0.9:30443", "ca": "/ca.pem"}
    ref = drain.router_from_env({drain.ROUTER_URL_ENV: "http://10.0.0.9:30000/",
                                 drain.PAIR_URL_ENV: "http://10.0.0.1:8000"}, "sk-1", admin)
    assert (ref.admin_url, ref.ca) == ("https://10.0.0.9:30443", "/ca.pem")


@pytest.mark.parametrize(("router", "admin", "where"), [
    # a record of this very router: its admin listener and certificate
    ("http://10.0.0.9:30000", {"router": "http://10.0.0.9:30000/", "url": "https://10.0.0.9:30443", "ca": "/c"},
     ("https://10.0.0.9:30443", "/c")),
    # a record of another router (the env files moved on): not used
    ("http://10.0.0.8:30000", {"router": "http://10.0.0.9:30000", "url": "https://10.0.0.9:30443", "ca": "/c"},
     (None, None)),
    # no record: nowhere, unless the router is on this host's loopback (plain HTTP that never leaves the host)
    ("http://10.0.0.9:30000", None, (None, None)),
    ("http://127.0.0.1:30000", None, ("http://127.0.0.1:30000", None)),
    ("http://10.0.0.9:30000", {"router": "", "url": "", "ca": ""}, (None, None))])
def test_where_the_admin_key_goes(router, admin, where):
    assert drain.admin_listener(router, admin) == where


def test_the_admin_key_never_goes_to_another_host_in_plain_http_nor_unverified(tmp_path):
    """Issue 43, row 8: the drain sends nothing without an admin listener it can verify, and says why."""
    ca = tmp_path / "ca.pem"
    base = ("http://10.0.0.9:30000", "http://10.0.0.1:8000", "sk-1")
    assert "not known on this head" in drain.admin_refusal(drain.RouterRef(*base))
    assert "plain http to another host" in drain.admin_refusal(drain.RouterRef(*base, "http://10.0.0.9:30000"))
    assert f"not at {ca}" in drain.admin_refusal(drain.RouterRef(*base, "https://10.0.0.9:30443", str(ca)))
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert drain.admin_refusal(drain.RouterRef(*base, "https://10.0.0.9:30443", str(ca))) is None
    assert drain.admin_refusal(drain.RouterRef(*base, "http://127.0.0.1:30000")) is None
    sent = []
    router = drain.Router(drain.RouterRef(*base))
    router._post = router._http("POST")
    import twinspark.fleet.router_client as client
    original, client.request = client.request, lambda *a, **k: sent.append(a) or (200, "")
    try:
        ok, line = router.call("remove")
    finally:
        client.request = original
    assert ok is False and "not known on this head" in line and sent == []


@pytest.mark.parametrize(("url", "local"), [
    ("http://127.0.0.1:30000", True), ("http://127.9.0.1:1", True), ("http://localhost:30000", True),
    ("http://[::1]:30000", True), ("http://[::ffff:127.0.0.1]:30000", True), ("http://10.0.0.9:30000", False),
    ("http://[::ffff:10.0.0.9]:30000", False), ("http://router.lan:30000", False)])
def test_only_this_hosts_loopback_is_local(url, local):
    assert drain.is_local(url) is local


def test_the_admin_record_is_read_only_when_it_is_one(tmp_path):
    record = tmp_path / "router-admin.json"
    assert drain.read_admin(record) is None
    record.write_text(json.dumps({"router": "http://r:1", "url": "https://r:2", "ca": "/c", "extra": 1}))
    assert drain.read_admin(record) == {"router": "http://r:1", "url": "https://r:2", "ca": "/c"}
    for bad in ("[]", "{", json.dumps({"router": "http://r:1", "url": 2, "ca": "/c"}), "x" * 5000):
        record.write_text(bad)
        assert drain.read_admin(record) is None


def test_admin_paths_quote_the_pair_url():
    assert drain.admin_path("remove", "http://10.0.0.1:8000") == "/remove_worker?url=http://10.0.0.1:8000"
    assert drain.admin_path("add", "http://h:1/?x") == "/add_worker?url=http://h:1/%3Fx"
    with pytest.raises(ValueError, match="not add or remove"):
        drain.admin_path("flush", "http://h:1")


@pytest.mark.parametrize(("verb", "status", "body", "ok", "words"), [
    ("remove", 200, "Successfully removed worker", True, "remove_worker done"),
    ("add", 200, "Successfully added", True, "add_worker done"),
    # what vllm-router 0.1.17 answers when the pair is already in (seen on loopback)
    ("add", 400, "Worker http://h:1 already exists", True, "nothing to do"),
    ("remove", 404, "Worker not found", True, "nothing to do"),
    ("remove", None, "URLError", False, "cannot be reached"),
    ("add", 401, "Unauthorized", False, "refused the key"),
    ("add", 500, "boom", False, "answered 500"),
])
def test_admin_outcomes(verb, status, body, ok, words):
    got, line = drain.admin_outcome(verb, status, body, "http://r:1")
    assert got is ok
    assert words in line
    if not ok:
        assert "going on" in line


@pytest.mark.parametrize(("metrics", "expected"), [
    ({"running": 0.0, "waiting": 0.0}, True),
    ({"running": 1.0, "waiting": 0.0}, False),
    ({"running": 0.0, "waiting": 2.0}, False),
    ({"running": None, "waiting": None}, None),
    ({"error": "refused", "unreachable": True}, None),
])
def test_idle_reads_running_and_waiting(metrics, expected):
    assert drain.idle(metrics) is expected


def test_who_stays_out():
    assert drain.stay_out_reason(served=True, gave_up=False, stopping=False) is None
    assert drain.stay_out_reason(True, False, stopping=True) == "the pair was stopped"
    assert drain.stay_out_reason(True, gave_up=True, stopping=False) == "the pair guard gave up on it"
    assert drain.stay_out_reason(False, False, False) == "it did not serve a generation"


# --- the order around the work, router and pair stood in for ----------------------------------------------------


class Recorder:
    def __init__(self, answers=None):
        self.calls: list[str] = []
        self.answers = answers or {}

    def post(self, path, _timeout_s):
        verb = path.split("_worker")[0].lstrip("/")
        self.calls.append(f"router {verb}")
        return self.answers.get(verb, (200, "ok"))


def _router(recorder):
    return drain.Router(drain.RouterRef("http://r:1", "http://p:1", "k"), post=recorder.post)


def test_out_wait_work_back_in_that_order():
    rec = Recorder()
    readings = iter([{"running": 2.0, "waiting": 0.0}, {"running": 1.0, "waiting": 1.0},
                     {"running": 0.0, "waiting": 0.0}])

    def metrics():
        rec.calls.append("metrics")
        return next(readings)

    def work():
        rec.calls.append("work")
        return drain.WorkResult(served=True)

    _, lines = drain.drained(_router(rec), work, lambda _p, _m: None, metrics, sleep=lambda _s: None)
    assert rec.calls == ["router remove", "metrics", "metrics", "metrics", "work", "router add"]
    assert lines[1].startswith("the pair is idle")


def test_the_idle_wait_is_bounded_and_the_work_goes_on():
    rec = Recorder()
    now = {"t": 0.0}

    def sleep(seconds):
        now["t"] += seconds

    _, lines = drain.drained(_router(rec), lambda: drain.WorkResult(True), lambda _p, _m: None,
                             lambda: {"running": 1.0, "waiting": 0.0}, idle_timeout_s=5,
                             clock=lambda: now["t"], sleep=sleep)
    assert "not idle after 5 s (1 running, 0 waiting); going on" in lines[1]
    assert rec.calls == ["router remove", "router add"]


@pytest.mark.parametrize(("result", "stopping"), [
    (drain.WorkResult(served=False), False),
    (drain.WorkResult(served=True, gave_up=True), False),
    (drain.WorkResult(served=True), True),
])
def test_no_way_back_without_a_generation_after_a_give_up_or_a_stop(result, stopping):
    rec = Recorder()
    _, lines = drain.drained(_router(rec), lambda: result, lambda _p, _m: None,
                             lambda: {"running": 0.0, "waiting": 0.0}, stopping=stopping)
    assert rec.calls == ["router remove"]
    assert "stays out" in lines[-1] and "twinspark pair rejoin" in lines[-1]


def test_a_router_down_is_said_and_the_work_still_runs():
    rec = Recorder({"remove": (None, "ConnectionRefusedError"), "add": (None, "ConnectionRefusedError")})
    worked = []
    logged = []
    drain.drained(_router(rec), lambda: worked.append(1) or drain.WorkResult(True),
                  lambda p, m: logged.append((p, m)), lambda: pytest.fail("no idle wait when the pair is not out"))
    assert worked == [1]
    assert rec.calls == ["router remove", "router add"]
    assert [p for p, _ in logged] == [4, 4] and all("cannot be reached" in m for _, m in logged)


def test_without_a_router_only_the_work_runs_and_nothing_is_said():
    logged = []
    result, lines = drain.drained(None, lambda: drain.WorkResult(False), lambda p, m: logged.append(m),
                                  lambda: pytest.fail("no metrics without a router"))
    assert result == drain.WorkResult(False) and lines == [] and logged == []


# --- the pair CLI on the head with a router named ---------------------------------------------------------------


class RoutedHead(Head):
    """A pair whose units, worker and API are stood in for (test_pairlife_cycle.Head), behind a recorded router."""

    def __init__(self, head_state="active", worker_state="active", serves=True, add_answer=(200, "ok")):
        super().__init__(head_state, worker_state)
        self.add_answer = add_answer
        self.serves = serves
        self.router = drain.Router(drain.RouterRef("http://r:1", "http://p:1", "k"), post=self._post, get=self._get)
        self.listed = ["http://p:1"]

    def _get(self, path, _timeout_s):
        self.calls.append(f"router {path.lstrip('/')}")
        return 200, json.dumps({"urls": self.listed})

    def _post(self, path, _timeout_s):
        verb = path.split("_worker")[0].lstrip("/")
        self.calls.append(f"router {verb}")
        return self.add_answer if verb == "add" else (200, "ok")

    def metrics(self, timeout_s=10.0):
        self.calls.append("metrics")
        return {"running": 0.0, "waiting": 0.0}

    def probe(self, timeout_s):
        return (Generation.OK, "one token") if self.serves else (Generation.TIMEOUT, "no token")

    def observe(self, probe_timeout_s, policy=None, state=None):
        return rules.Observation(self.states["head"], self.states["worker"], Generation.SKIPPED, "", 0.0, ())


@pytest.fixture
def routed(tmp_path: Path, monkeypatch):
    box: dict[str, object] = {"head": RoutedHead()}
    monkeypatch.setattr(pair_cli, "_pair_from_args", lambda args: box["head"])
    monkeypatch.setattr(pl, "stop_guard_run", lambda timeout_s=150.0: "")
    box["state"] = tmp_path / "state.json"
    box["args"] = ["--env", str(tmp_path / "none.env"), "--worker", "127.0.0.1", "--state-file", str(box["state"]),
                   "--lock-file", str(tmp_path / "pair.lock"), "--pause-file", str(tmp_path / "paused"),
                   "--ready-timeout", "1"]  # a restart that does not serve gives up after it: 1 s of the suite each
    return box


STEPS = ["head stop", "worker stop", "worker start", "head start"]


def test_pair_restart_takes_the_pair_out_first_and_back_once_it_serves(routed):
    assert cli.main(["pair", "restart", *routed["args"]]) == 0
    assert routed["head"].calls == ["router remove", "metrics", *STEPS, "router add"]


def test_a_restart_that_does_not_serve_leaves_the_pair_out(routed):
    routed["head"] = RoutedHead(serves=False)
    assert cli.main(["pair", "restart", *routed["args"]]) == 1
    assert routed["head"].calls == ["router remove", "metrics", *STEPS]


def test_pair_stop_takes_the_pair_out_and_leaves_it_out(routed):
    assert cli.main(["pair", "stop", *routed["args"], "--json"]) == 0
    assert routed["head"].calls == ["router remove", "metrics", "head stop", "worker stop"]


def test_a_no_wait_restart_leaves_the_pair_out_for_rejoin(routed, capsys):
    assert cli.main(["pair", "restart", "--no-wait", *routed["args"], "--json"]) == 0
    assert routed["head"].calls == ["router remove", "metrics", *STEPS]
    assert "twinspark pair rejoin" in json.loads(capsys.readouterr().out)["router"][-1]
    assert cli.main(["pair", "rejoin", *routed["args"]]) == 0
    assert routed["head"].calls[-1] == "router add"


def test_a_serving_pair_that_start_leaves_alone_is_not_taken_out(routed):
    assert cli.main(["pair", "start", *routed["args"]]) == 0
    assert routed["head"].calls == []


def test_rejoin_refuses_a_pair_the_guard_gave_up_on(routed, capsys):
    from twinspark.pair.rules import GuardState

    guard.save_state(Path(routed["state"]), GuardState(gave_up_at=1.0, gave_up_reason="3 restarts failed"))
    assert cli.main(["pair", "rejoin", *routed["args"]]) == 1
    assert routed["head"].calls == []
    assert "the pair guard gave up on it" in capsys.readouterr().err


def test_rejoin_refuses_a_pair_that_does_not_serve(routed):
    routed["head"] = RoutedHead(serves=False)
    assert cli.main(["pair", "rejoin", *routed["args"]]) == 1
    assert routed["head"].calls == []


def test_the_env_files_name_the_router_or_leave_it_out(tmp_path: Path):
    base = "VLLM_HOST=127.0.0.1\nVLLM_PORT=8000\nSERVED_MODEL_NAME=tiny\n"
    plain, routed_env = tmp_path / "plain.env", tmp_path / "routed.env"
    plain.write_text(base)
    routed_env.write_text(base + "TWINSPARK_ROUTER_URL=http://127.0.0.1:30000\n"
                                 "TWINSPARK_ROUTER_PAIR_URL=http://10.0.0.1:8000\n")
    parser_args = ["--worker", "127.0.0.1", "--ready-timeout", "5"]

    def pair_of(env_file):
        import argparse

        parser = argparse.ArgumentParser()
        pair_cli.register(parser.add_subparsers(dest="cmd"))
        args = parser.parse_args(["pair", "check", "--env", str(env_file), *parser_args])
        return pair_cli._pair_from_args(args)

    assert pair_of(plain).router is None
    ref = pair_of(routed_env).router.ref
    assert (ref.url, ref.pair_url) == ("http://127.0.0.1:30000", "http://10.0.0.1:8000")


def test_rejoin_of_a_pair_the_router_lists_already_is_no_change(routed, capsys):
    # what the playbooks' changed_when reads: a site.yml run that restarted nothing changes nothing
    routed["head"] = RoutedHead(add_answer=(400, "Worker http://p:1 already exists"))
    assert cli.main(["pair", "rejoin", *routed["args"]]) == 0
    assert routed["head"].calls == ["router add"]
    assert "nothing to do" in capsys.readouterr().err


def test_rejoin_says_so_when_the_router_does_not_take_the_pair(routed, capsys):
    routed["head"] = RoutedHead(add_answer=(None, "ConnectionRefusedError"))
    assert cli.main(["pair", "rejoin", *routed["args"]]) == 1
    assert "cannot be reached" in capsys.readouterr().err


def test_an_operators_restart_of_a_pair_the_guard_gave_up_on_puts_it_back_once_it_serves(routed):
    from twinspark.pair.rules import GuardState

    guard.save_state(Path(routed["state"]), GuardState(gave_up_at=1.0, gave_up_reason="3 restarts failed"))
    assert cli.main(["pair", "restart", *routed["args"]]) == 0
    assert routed["head"].calls == ["router remove", "metrics", *STEPS, "router add"]
    assert guard.load_state(Path(routed["state"])).gave_up_at is None


def test_the_guard_never_restarts_nor_puts_back_a_pair_it_gave_up_on(routed, monkeypatch):
    from twinspark.pair.rules import GuardState

    routed["head"] = RoutedHead(head_state="failed", serves=False)
    monkeypatch.setattr(pl.KickInbox, "inherited", classmethod(lambda cls, environ=None: cls()))
    guard.save_state(Path(routed["state"]), GuardState(gave_up_at=1.0, gave_up_reason="3 restarts failed"))
    cli.main(["pair", "guard", *routed["args"]])
    # no restart and no add; only the look that keeps it out of a router restarted since it left
    assert routed["head"].calls == ["router list_workers", "router remove"]
    routed["head"].calls.clear()
    routed["head"].listed = []
    cli.main(["pair", "guard", *routed["args"]])
    assert routed["head"].calls == ["router list_workers"]


@pytest.mark.parametrize(("listing", "removal", "expected", "priority", "words", "posted"), [
    ((200, '{"urls": ["http://p:1"]}'), (200, "Successfully removed worker"), True, 4, "listed the pair again", 1),
    ((200, '{"urls": ["http://other:1"]}'), None, False, 7, "stays out", 0),
    ((None, "ConnectionRefusedError"), None, None, 4, "cannot be reached", 0),
    ((401, "Unauthorized"), None, None, 4, "answered 401 to /list_workers", 0),
    ((200, '{"urls": ["http://p:1/"]}'), (None, "timed out"), None, 4, "cannot be reached", 1),
])
def test_keep_out_removes_the_pair_only_when_the_router_lists_it(listing, removal, expected, priority, words, posted):
    said, posts = [], []
    ref = drain.RouterRef("http://r:1", "http://p:1", "k")

    def post(path, _timeout_s):
        assert path == "/remove_worker?url=http://p:1"
        posts.append(path)
        return removal

    router = drain.Router(ref, post=post, get=lambda path, _t: listing if path == "/list_workers" else pytest.fail())
    assert drain.keep_out(router, lambda p, m: said.append((p, m))) is expected
    assert len(said) == 1 and said[0][0] == priority and words in said[0][1], said
    assert len(posts) == posted
    assert drain.keep_out(None, lambda p, m: pytest.fail("no router, nothing said")) is None


def test_a_guard_restart_that_does_not_serve_takes_the_pair_out_and_leaves_it_out(routed, monkeypatch):
    routed["head"] = RoutedHead(head_state="failed", serves=False)
    monkeypatch.setattr(pl.KickInbox, "inherited", classmethod(lambda cls, environ=None: cls()))
    cli.main(["pair", "guard", *routed["args"]])
    assert routed["head"].calls == ["router remove", "metrics", *STEPS]


def test_a_pair_whose_metrics_do_not_answer_is_not_waited_for():
    rec = Recorder()
    now = {"t": 0.0}
    _, lines = drain.drained(_router(rec), lambda: drain.WorkResult(True), lambda _p, _m: None,
                             lambda: {"error": "ConnectionRefusedError", "unreachable": True}, idle_timeout_s=120,
                             clock=lambda: now["t"], sleep=lambda s: pytest.fail("no wait for a pair that is gone"))
    assert lines[1] == "cannot tell whether the pair is idle (ConnectionRefusedError); going on"
    assert rec.calls == ["router remove", "router add"]


def test_the_guard_does_not_wait_for_requests_on_a_pair_it_judged_broken(routed, monkeypatch):
    head = RoutedHead(head_state="failed")
    head.metrics = lambda timeout_s=10.0: head.calls.append("metrics") or {"running": 3.0, "waiting": 0.0}
    routed["head"] = head
    monkeypatch.setattr(pl.KickInbox, "inherited", classmethod(lambda cls, environ=None: cls()))
    cli.main(["pair", "guard", *routed["args"]])
    # one reading only: a wait would read again (and again) until --drain-timeout
    assert head.calls == ["router remove", "metrics", *STEPS, "router add"]


# --- a drained pair comes back by itself -------------------------------------------------------------------------


@pytest.mark.parametrize(("listing", "adding", "expected", "priority", "words", "posted"), [
    ((200, '{"urls": ["http://other:1"]}'), (200, "Successfully added"), True, 5, "put it back", 1),
    ((200, '{"urls": ["http://p:1/"]}'), None, False, None, "", 0),
    ((None, "ConnectionRefusedError"), None, None, 6, "cannot be reached", 0),
    ((200, '{"urls": []}'), (401, "Unauthorized"), None, 4, "putting it back failed", 1),
])
def test_keep_in_adds_a_serving_pair_only_when_the_router_does_not_list_it(listing, adding, expected, priority,
                                                                          words, posted):
    said, posts = [], []
    ref = drain.RouterRef("http://r:1", "http://p:1", "k")

    def post(path, _timeout_s):
        assert path == "/add_worker?url=http://p:1"
        posts.append(path)
        return adding

    router = drain.Router(ref, post=post, get=lambda path, _t: listing if path == "/list_workers" else pytest.fail())
    assert drain.keep_in(router, lambda p, m: said.append((p, m))) is expected
    assert len(posts) == posted
    if priority is None:
        assert said == []
    else:
        assert len(said) == 1 and said[0][0] == priority and words in said[0][1], said
    assert drain.keep_in(None, lambda p, m: pytest.fail("no router, nothing said")) is None


def test_a_pair_left_out_by_a_failed_restart_goes_back_on_the_first_healthy_guard_run(routed, monkeypatch):
    """The guard's restart did not serve (the pair stays out); the operator fixes the cause; the next guard run that
    finds the pair serving puts it back, with no `twinspark pair rejoin`."""
    monkeypatch.setattr(pl.KickInbox, "inherited", classmethod(lambda cls, environ=None: cls()))
    head = routed["head"] = RoutedHead(head_state="failed", serves=False)
    cli.main(["pair", "guard", *routed["args"]])
    assert head.calls == ["router remove", "metrics", *STEPS]
    head.listed = []  # the router dropped it, as the removal asked
    head.calls.clear()
    head.serves = True
    head.observe = lambda probe_timeout_s, policy=None, state=None: rules.Observation(
        "active", "active", Generation.OK, "one token", 60.0, ())
    assert cli.main(["pair", "guard", *routed["args"]]) == 0
    assert head.calls == ["router list_workers", "router add"]
    head.listed = ["http://p:1"]
    head.calls.clear()
    assert cli.main(["pair", "guard", *routed["args"]]) == 0
    assert head.calls == ["router list_workers"], "a listed pair is only looked at"


def test_the_drain_key_is_the_files_first_key_and_none_without_one(tmp_path: Path):
    path = tmp_path / "router-drain.key"
    assert drain.read_key(path) is None
    path.write_text("# the router's admin key\n\nadmin-test-only-key\nsecond\n")
    assert drain.read_key(path) == "admin-test-only-key"
    path.write_text("\n# nothing\n")
    assert drain.read_key(path) is None
    path.write_bytes(b"k" * (drain.MAX_KEY_FILE_BYTES + 1))
    assert drain.read_key(path) is None


def test_the_pair_verbs_drain_with_the_routers_admin_key_never_the_pairs_api_key(tmp_path: Path, monkeypatch):
    """`twinspark pair` (and so the guard) builds its router from the env files and the head's drain key file: the
    pair's API key would be refused (403) by the router's front on /remove_worker and /add_worker."""
    import argparse

    from twinspark import layout

    env = tmp_path / "serve.env"
    env.write_text("VLLM_API_KEY=pair-client-key\nSERVED_MODEL_NAME=tiny\nTWINSPARK_ROUTER_URL=http://10.0.0.9:30000\n"
                   "TWINSPARK_ROUTER_PAIR_URL=http://10.0.0.1:8888\n")
    key_file = tmp_path / "router-drain.key"
    key_file.write_text("router-admin-key\n")
    admin_file = tmp_path / "router-admin.json"
    admin_file.write_text(json.dumps({"router": "http://10.0.0.9:30000", "url": "https://10.0.0.9:30443",
                                      "ca": "/var/lib/twinspark-control/router-ca.pem"}))
    current = layout.current()
    monkeypatch.setattr(layout, "current", lambda: type(current)(**{**current.__dict__,
                                                                     "router_drain_key": str(key_file),
                                                                     "router_drain_admin": str(admin_file)}))
    args = argparse.Namespace(env=[str(env)], worker=["10.0.0.2"], ssh_user="root", ssh_key="k", known_hosts="h",
                              state_file=str(tmp_path / "state.json"))
    pair = pair_cli._pair_from_args(args)
    assert pair.router is not None and pair.router.ref.key == "router-admin-key"
    # and sends it only to the admin listener role router recorded, trusting the router's certificate alone
    assert (pair.router.ref.admin_url, pair.router.ref.ca) == ("https://10.0.0.9:30443",
                                                              "/var/lib/twinspark-control/router-ca.pem")
