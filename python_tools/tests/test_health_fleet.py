"""`twinspark health` for a fleet: the report's shape from per-pair results (pure), reading a fleet inventory, and
the command wired so that a one-pair inventory prints exactly what it always printed.

Nothing here reaches a node or a router: the sweeps and the router's answer are stood in for.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from twinspark import inventory as inv
from twinspark import netguard
from twinspark.fleet import router_client
from twinspark.health import checks, command, fleetreport, report
from twinspark.health.fleetreport import PairSeen, RouterSeen

FLEET_EXAMPLE = Path(__file__).resolve().parents[2] / "inventory" / "fleet-example" / "hosts.yml"
A, B = "http://192.0.2.11:8888", "http://192.0.2.21:8888"


def healthy(name: str) -> tuple[checks.CheckResult, ...]:
    return (checks.ok(f"{name}-1", "unit", "active"), checks.ok("pair", "liveness", "one token"))


def sick(name: str, status: str) -> tuple[checks.CheckResult, ...]:
    make = checks.failed if status == checks.FAILED else checks.degraded
    return (checks.ok(f"{name}-1", "unit", "active"),
            make("pair", "liveness", "no token in 10 s", "twinspark pair restart on the head"))


# --- the router's verdict (pure) -------------------------------------------------------------------------------


def test_a_router_listing_every_serving_pair_is_ok():
    pairs = [PairSeen("pair_a", A, healthy("a")), PairSeen("pair_b", B, healthy("b"))]
    verdict = fleetreport.router_verdict(RouterSeen("http://r:30000", (A + "/", B)), pairs)
    assert verdict.status == checks.OK and verdict.message == "http://r:30000 lists 2 of 2 pairs"


def test_a_serving_pair_out_of_the_router_is_degraded_and_named():
    pairs = [PairSeen("pair_a", A, healthy("a")), PairSeen("pair_b", B, healthy("b"))]
    verdict = fleetreport.router_verdict(RouterSeen("http://r:30000", (B,)), pairs)
    assert verdict.status == checks.DEGRADED
    assert "serving but out of the router: pair_a" in verdict.message and "twinspark pair rejoin" in verdict.fix


def test_a_failed_pair_out_of_the_router_is_not_the_routers_fault():
    pairs = [PairSeen("pair_a", A, sick("a", checks.FAILED)), PairSeen("pair_b", B, healthy("b"))]
    assert fleetreport.router_verdict(RouterSeen("http://r:30000", (B,)), pairs).status == checks.OK


def test_a_url_that_is_no_pair_is_named():
    pairs = [PairSeen("pair_a", A, healthy("a"))]
    verdict = fleetreport.router_verdict(RouterSeen("http://r:30000", (A, "http://10.9.9.9:1")), pairs)
    assert verdict.status == checks.DEGRADED and "no pair here: http://10.9.9.9:1" in verdict.message


def test_a_router_that_does_not_answer_fails_the_fleet():
    pairs = [PairSeen("pair_a", A, healthy("a"))]
    verdict = fleetreport.router_verdict(RouterSeen("http://r:30000", None, "None: URLError"), pairs)
    assert verdict.status == checks.FAILED and "endpoint is down" in verdict.message
    assert fleetreport.fleet_exit(pairs, verdict) == 2


@pytest.mark.parametrize(("status", "body", "expected"), [
    (200, '{"urls":["http://a:1","http://b:1"]}', ("http://a:1", "http://b:1")),
    (200, '{"urls":"nope"}', None),
    (200, "not json", None),
    (401, "Unauthorized", None),
    (None, "URLError", None),
])
def test_the_routers_list_is_read_or_refused(status, body, expected):
    assert router_client.listed_from_answer(status, body) == expected


# --- the table and the exit code (pure) ------------------------------------------------------------------------


def test_the_table_has_a_line_per_pair_the_router_and_the_fleet_summary():
    pairs = [PairSeen("pair_a", A, healthy("a")), PairSeen("pair_b", B, sick("b", checks.DEGRADED))]
    router = fleetreport.router_verdict(RouterSeen("http://r:30000", (A, B)), pairs)
    lines = fleetreport.table(pairs, router).splitlines()
    assert lines == [
        "ok        pair_a  2 ok, 0 degraded, 0 failed",
        "DEGRADED  pair_b  1 ok, 1 degraded, 0 failed; pair liveness: no token in 10 s",
        "                  -> twinspark pair restart on the head",
        "ok        router  http://r:30000 lists 2 of 2 pairs",
        "FLEET DEGRADED: 2 pairs (1 ok, 1 degraded, 0 failed), router ok (exit 1)",
    ]
    assert fleetreport.fleet_exit(pairs, router) == 1


def test_the_exit_code_is_the_worst_of_pairs_and_router():
    ok_pairs = [PairSeen("pair_a", A, healthy("a")), PairSeen("pair_b", B, healthy("b"))]
    ok_router = fleetreport.router_verdict(RouterSeen("r", (A, B)), ok_pairs)
    assert fleetreport.fleet_exit(ok_pairs, ok_router) == 0
    assert fleetreport.fleet_exit(ok_pairs, None) == 0
    failed = [ok_pairs[0], PairSeen("pair_b", B, sick("b", checks.FAILED))]
    assert fleetreport.fleet_exit(failed, fleetreport.router_verdict(RouterSeen("r", (A, B)), failed)) == 2
    assert fleetreport.fleet_exit(ok_pairs, fleetreport.router_verdict(RouterSeen("r", (A,)), ok_pairs)) == 1


def test_a_pair_with_no_checks_back_is_failed():
    pair = PairSeen("pair_a", A, ())
    assert pair.status == checks.FAILED
    assert "no checks came back" in fleetreport.table([pair], None)


def test_the_json_carries_every_pair_and_the_router():
    pairs = [PairSeen("pair_a", A, healthy("a"))]
    data = fleetreport.as_json(pairs, fleetreport.router_verdict(RouterSeen("r", (A,)), pairs))
    assert data["status"] == "ok" and data["exit_code"] == 0
    assert data["pairs"]["pair_a"]["url"] == A and len(data["pairs"]["pair_a"]["checks"]) == 2
    assert data["router"]["status"] == "ok"


# --- reading a fleet inventory (a file; nothing is contacted) ---------------------------------------------------


def test_the_fleet_example_reads_as_two_pairs_and_a_router():
    view = inv.read_fleet(FLEET_EXAMPLE)
    assert view is not None
    assert view.pairs == (("pair_a", A), ("pair_b", B))
    assert view.router_url == "http://192.0.2.30:30000"
    assert view.problems == ()


def test_one_pair_of_a_fleet_reads_as_a_one_pair_inventory_would():
    pair = inv.read_inventory(FLEET_EXAMPLE, "pair_b")
    assert (pair.head.name, pair.worker.name, pair.api_url) == ("spark-b1", "spark-b2", B)
    with pytest.raises(inv.InventoryError, match="no well-formed pair 'pair_c'.*pair_a, pair_b"):
        inv.read_inventory(FLEET_EXAMPLE, "pair_c")


ONE_PAIR = """\
all:
  children:
    twinspark_head:
      hosts:
        node1: {ansible_host: 192.0.2.41}
    twinspark_worker:
      hosts:
        node2: {ansible_host: 192.0.2.42}
"""


def test_a_one_pair_inventory_is_no_fleet(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text(ONE_PAIR)
    assert inv.read_fleet(path) is None


# --- the command: a fleet gets the fleet table, a one-pair inventory what it always got ------------------------


def _args(inventory, **more):
    base = dict(inventory=str(inventory), local=False, pair=False, no_pair=False, json=False, quiet=False,
                prom_file=None, timeout=3.0, node=None, env=None)
    return argparse.Namespace(**{**base, **more})


@pytest.fixture
def stood_in(monkeypatch):
    """Each pair's sweep and the router's list stood in for; records what was asked."""
    asked: dict[str, object] = {"pairs": [], "router": []}

    def sweep_pair(inventory, timeout, nodes=True, probe_pair=True, pair_name=None):
        asked["pairs"].append(pair_name)
        results = list(healthy(pair_name) if pair_name == "pair_a" else sick(pair_name, checks.FAILED))
        return results, {}, {}, {"VLLM_API_KEY": "sk-fleet"}

    def list_workers(url, key, timeout, ca=None):
        asked["router"].append((url, key))
        asked["router_ca"] = ca
        return 200, json.dumps({"urls": [A]})

    monkeypatch.setattr(command, "sweep_pair", sweep_pair)
    monkeypatch.setattr(command, "_list_workers", list_workers)
    monkeypatch.setattr(netguard, "check", lambda targets, *a, **k: [])
    return asked


def test_health_on_a_fleet_sweeps_every_pair_then_asks_the_router(stood_in, capsys):
    code = command.run(_args(FLEET_EXAMPLE))
    out = capsys.readouterr().out
    print(out)
    assert stood_in["pairs"] == ["pair_a", "pair_b"]
    # the front's admin listener over TLS (issue 43, row 8), verified against the certificate role router fetched
    assert stood_in["router"] == [("https://192.0.2.30:30443", "sk-fleet")]
    assert stood_in["router_ca"].endswith("/.cache/twinspark/routers/router-1.pem")
    assert code == 2
    assert out.splitlines()[-1] == "FLEET FAILED: 2 pairs (1 ok, 0 degraded, 1 failed), router ok (exit 2)"
    assert "sk-fleet" not in out


def test_health_asks_the_routers_list_with_its_admin_key_from_the_inventory(stood_in, tmp_path, capsys):
    """The router's front refuses the pairs' key on /list_workers (403); the inventory's admin key gets the list."""
    inventory = tmp_path / "fleet"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(FLEET_EXAMPLE.read_text())
    (inventory / "group_vars" / "all.yml").write_text("twinspark_router_admin_key: admin-test-only-key\n")
    command.run(_args(inventory / "hosts.yml"))
    out = capsys.readouterr().out
    assert stood_in["router"] == [("https://192.0.2.30:30443", "admin-test-only-key")]
    assert "admin-test-only-key" not in out
    assert "admin-test-only-key" not in repr(inv.read_fleet(inventory / "hosts.yml"))


def test_health_on_a_fleet_as_json(stood_in, capsys):
    assert command.run(_args(FLEET_EXAMPLE, json=True)) == 2
    data = json.loads(capsys.readouterr().out)
    assert sorted(data["pairs"]) == ["pair_a", "pair_b"] and data["router"]["status"] == "ok"


def test_health_on_a_fleet_writes_the_fleets_textfile(stood_in, tmp_path, capsys):
    prom = tmp_path / "metrics" / "twinspark.prom"
    assert command.run(_args(FLEET_EXAMPLE, prom_file=prom)) == 2
    assert capsys.readouterr().out.splitlines()[-1].startswith("FLEET FAILED: 2 pairs")
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(prom.read_text()) for s in family.samples}
    assert samples[("twinspark_health_pair_status", (("pair", "pair_a"),))] == 0
    assert samples[("twinspark_health_pair_status", (("pair", "pair_b"),))] == 2
    assert samples[("twinspark_health_router_status", ())] == 0
    assert samples[("twinspark_health_status", ())] == 2  # the worst, as the exit code
    liveness_b = (("check", "liveness"), ("node", "pair"), ("pair", "pair_b"))
    assert samples[("twinspark_health_check_status", liveness_b)] == 2
    assert ("twinspark_health_duration_seconds", ()) in samples
    assert "sk-fleet" not in prom.read_text()


def test_health_on_one_pair_prints_what_it_always_printed(tmp_path, monkeypatch, capsys):
    path = tmp_path / "hosts.yml"
    path.write_text(ONE_PAIR)
    results = list(healthy("node"))
    monkeypatch.setattr(command, "controller_sweep", lambda args: (results, {}, {}))
    monkeypatch.setattr(command, "fleet_sweep", lambda *a, **k: pytest.fail("a one-pair inventory is no fleet"))
    assert command.run(_args(path)) == 0
    assert capsys.readouterr().out == report.table(results) + "\n"


def test_the_health_other_commands_end_with_is_the_fleets_on_a_fleet(stood_in, capsys):
    """`check_inventory` (the playbook verbs' closing table, the fleet upgrade's gate) on a fleet inventory sweeps every
    pair and the router, as `twinspark health -i` does; before, it refused the fleet as a broken one-pair inventory."""
    code = command.check_inventory(str(FLEET_EXAMPLE), timeout=3.0)
    out = capsys.readouterr().out
    assert stood_in["pairs"] == ["pair_a", "pair_b"] and len(stood_in["router"]) == 1
    assert code == 2
    assert out.splitlines()[-1] == "FLEET FAILED: 2 pairs (1 ok, 0 degraded, 1 failed), router ok (exit 2)"


def test_the_health_other_commands_end_with_is_unchanged_on_one_pair(tmp_path, monkeypatch, capsys):
    path = tmp_path / "hosts.yml"
    path.write_text(ONE_PAIR)
    results = list(healthy("node"))
    monkeypatch.setattr(command, "sweep_inventory", lambda inventory, timeout: (results, {}, {}))
    monkeypatch.setattr(command, "fleet_sweep", lambda *a, **k: pytest.fail("a one-pair inventory is no fleet"))
    assert command.check_inventory(str(path)) == 0
    assert capsys.readouterr().out == report.table(results) + "\n"


def test_health_limited_to_one_pair_sweeps_it_and_the_routers_view_of_it(stood_in, capsys):
    """`--limit pair_a`: only pair_a is swept; the router listing pair_a only is ok, and pair_b's URL, had the router
    listed it, would be no stranger."""
    code = command.run(_args(FLEET_EXAMPLE, limit="pair_a"))
    out = capsys.readouterr().out
    assert stood_in["pairs"] == ["pair_a"]
    assert code == 0
    assert out.splitlines()[-1].startswith("FLEET OK: 1 pairs (1 ok, 0 degraded, 0 failed), router ok")
    assert "lists 1 of 1 pairs" in out


def test_the_router_listing_a_pair_left_out_by_the_limit_is_no_stranger():
    pairs = [PairSeen("pair_a", A, healthy("a"))]
    assert fleetreport.router_verdict(RouterSeen("http://r:30000", (A, B)), pairs, others=(B,)).status == checks.OK
    assert fleetreport.router_verdict(RouterSeen("http://r:30000", (A, B)), pairs).status == checks.DEGRADED


@pytest.mark.parametrize(("limit", "message"), [
    ("pair_c", "--limit pair_c: pair_c is not a pair of this inventory (pairs: pair_a, pair_b)"),
    (",", "--limit ,: name at least one pair (pairs: pair_a, pair_b)"),
])
def test_an_unknown_pair_in_the_limit_is_one_line_and_exit_2(stood_in, capsys, limit, message):
    assert command.run(_args(FLEET_EXAMPLE, limit=limit)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"twinspark health: {message}") and err.count("\n") == 1
    assert stood_in["pairs"] == []


def test_a_limit_on_a_one_pair_inventory_is_refused(tmp_path, capsys):
    path = tmp_path / "hosts.yml"
    path.write_text(ONE_PAIR)
    assert command.run(_args(path, limit="pair_a")) == 2
    assert "the inventory is one pair, not a fleet; leave --limit out" in capsys.readouterr().err


def test_the_admin_key_goes_nowhere_without_the_routers_certificate_on_the_controller(tmp_path, monkeypatch):
    """Issue 43, row 8: with no certificate to verify the admin listener against, nothing is sent at all."""
    sent = []
    monkeypatch.setattr(command.router_client, "request", lambda *a, **k: sent.append(a) or (200, "{}"))
    status, body = command._list_workers("https://192.0.2.30:30443", "admin-key", 1.0, str(tmp_path / "none.pem"))
    assert status is None and "not asked" in body and "twinspark_router_ca_file" in body
    assert sent == []
    cert = tmp_path / "router.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    assert command._list_workers("https://192.0.2.30:30443", "admin-key", 1.0, str(cert)) == (200, "{}")
    assert len(sent) == 1
