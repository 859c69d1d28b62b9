"""The alert rules (roles/monitoring/templates/twinspark.rules.yml.j2) as Prometheus loads them, tested with promtool.

The template is rendered the way the role renders it (Ansible's templating, the role's defaults), into a temporary
directory next to a copy of its promtool unit tests (roles/monitoring/files/alerts/tests/*.yml, at Prometheus'
default scrape interval; tests/sim/*.yml again with the simulated pair's 5 s interval). Then `promtool check rules`
and `promtool test rules` run on it, and the rule file is held to issue 30's contract: every alert named there
exists, carries `for:`, a severity and the pair, a summary and a runbook entry that docs/OPERATIONS.md has, and
has a promtool case where it fires and one where it does not.

promtool comes with Debian's `prometheus` package (`make setup` installs it without starting Prometheus). Where it
is missing the promtool tests are skipped, saying so, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from twinspark import generate

ROOT = generate.repo_root()
ROLE = ROOT / "roles" / "monitoring"
TEMPLATE = ROLE / "templates" / "twinspark.rules.yml.j2"
TESTS = ROLE / "files" / "alerts" / "tests"
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
RULES_NAME = "twinspark.rules.yml"  # what each test file's rule_files names, one directory up
SIM_SCRAPE_INTERVAL_S = 5  # the simulated pair's scrape interval (tests/sim/)

# Issue 30's contract: the alerts the role routes and the docs list.
CONTRACT_ALERTS = ("TwinSparkPairDown", "TwinSparkGuardGaveUp", "TwinSparkGuardPausedTooLong", "TwinSparkRankWedged",
                   "TwinSparkRankRestartingOften", "TwinSparkKVCacheHigh", "TwinSparkTTFTHigh", "TwinSparkQueueGrowing",
                   "TwinSparkFabricDown", "TwinSparkRuntimesDisagree", "TwinSparkDiskLow", "TwinSparkCertExpiring",
                   "TwinSparkTargetDown")
SEVERITIES = ("page", "ticket")


def render(overrides: dict[str, object] | None = None) -> str:
    """The rule file as the role's template task writes it: Ansible's templating with the role's defaults."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    loader = DataLoader()
    values = loader.load_from_file(str(ROLE / "defaults" / "main.yml"), trusted_as_template=True)
    values.update({"ansible_managed": "Ansible managed", **(overrides or {})})
    return Templar(loader=loader, variables=values).template(trust_as_template(TEMPLATE.read_text()))


def lay_out(where: Path, rules: str, tests: list[Path]) -> Path:
    """`where`/twinspark.rules.yml and the test files in `where`/tests (their rule_files: ../twinspark.rules.yml)."""
    (where / "tests").mkdir(parents=True)
    (where / RULES_NAME).write_text(rules)
    for test in tests:
        shutil.copy(test, where / "tests" / test.name)
    return where


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    """Two renders, each next to its tests: the defaults, and the simulated pair's scrape interval."""
    base = tmp_path_factory.mktemp("alerts")
    return {
        "default": lay_out(base / "default", render(), sorted(TESTS.glob("*.yml"))),
        "sim": lay_out(base / "sim", render({"monitoring_scrape_interval_s": SIM_SCRAPE_INTERVAL_S}),
                       sorted((TESTS / "sim").glob("*.yml"))),
    }


def rules_of(text: str) -> list[dict]:
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def rules(rendered) -> list[dict]:
    return rules_of((rendered["default"] / RULES_NAME).read_text())


def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("promtool is not installed and CI=true: the alert rules must be tested here; make setup installs "
                    "it (Debian's prometheus package, without starting Prometheus)")
    pytest.skip("promtool is not installed (make setup installs Debian's prometheus package as root, without "
                "starting it)")


# ---- promtool -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "sim"])
def test_promtool_loads_every_rule(rendered, variant):
    binary = promtool()
    path = rendered[variant] / RULES_NAME
    done = subprocess.run([binary, "check", "rules", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    count = len(rules_of(path.read_text()))
    assert f"SUCCESS: {count} rules found" in done.stdout, done.stdout


@pytest.mark.parametrize("variant", ["default", "sim"])
def test_promtool_unit_tests_pass(rendered, variant):
    binary = promtool()
    tests = sorted(p.name for p in (rendered[variant] / "tests").glob("*.yml"))
    assert tests, f"no promtool tests for the {variant} render"
    done = subprocess.run([binary, "test", "rules", *tests], cwd=rendered[variant] / "tests", capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(tests), done.stdout


# ---- the contract ---------------------------------------------------------------------------------------------------


def test_every_contract_alert_is_a_rule_and_no_other(rules):
    names = [rule["alert"] for rule in rules]
    assert sorted(set(names)) == sorted(CONTRACT_ALERTS)
    # One rule per alert, except where severities split it (the fabric down pages, a degraded fabric is a ticket).
    for name in set(names):
        severities = [rule["labels"]["severity"] for rule in rules if rule["alert"] == name]
        assert len(severities) == len(set(severities)), f"{name}: two rules with one severity {severities}"


def test_every_rule_waits_names_its_severity_and_pair_and_says_what_to_do(rules):
    base = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["monitoring_alert_runbook_base"]
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: no `for:` duration"
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert "$labels.pair" in rule["labels"]["pair"], f"{name}: the pair label must come from the series"
        assert rule["annotations"]["summary"].strip(), name
        assert rule["annotations"]["runbook"] == f"{base}#{name.lower()}", name


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for line in markdown.splitlines():
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            found.add(text.replace(" ", "-"))
    return found


def test_every_runbook_anchor_is_a_heading_of_operations_md(rules):
    have = anchors(OPERATIONS.read_text())
    missing = sorted({rule["annotations"]["runbook"].split("#", 1)[1] for rule in rules} - have)
    assert not missing, f"docs/OPERATIONS.md has no heading for {missing}"


def cases(test_files: list[Path]) -> list[tuple[str, list[dict]]]:
    """Every (alertname, expected alerts) checked by promtool unit test files."""
    out = []
    for path in test_files:
        for test in yaml.safe_load(path.read_text())["tests"]:
            out.extend((case["alertname"], case.get("exp_alerts") or []) for case in test.get("alert_rule_test", []))
    return out


def missing_cases(rules: list[dict], checked: list[tuple[str, list[dict]]]) -> list[str]:
    """Rules without a case where they fire or without one where they do not. A rule is its alert name and its
    severity: a case fires it when an expected alert of that name carries that severity."""
    missing = []
    for rule in rules:
        name, severity = rule["alert"], rule["labels"]["severity"]
        fired = [any(alert["exp_labels"].get("severity") == severity for alert in expected)
                 for alertname, expected in checked if alertname == name]
        if True not in fired:
            missing.append(f"{name} ({severity}): no case where it fires")
        if False not in fired:
            missing.append(f"{name} ({severity}): no case where it does not fire")
    return missing


def test_every_rule_has_a_firing_and_a_not_firing_case(rules):
    checked = cases(sorted(TESTS.glob("*.yml")))
    assert not missing_cases(rules, checked)


def test_the_case_check_names_a_rule_tested_only_one_way():
    rules = [{"alert": "A", "labels": {"severity": "page"}}, {"alert": "A", "labels": {"severity": "ticket"}},
             {"alert": "B", "labels": {"severity": "ticket"}}]
    page_only = [{"exp_labels": {"severity": "page"}}]
    checked = [("A", page_only), ("A", []), ("B", [])]
    assert missing_cases(rules, checked) == ["A (ticket): no case where it fires", "B (ticket): no case where it fires"]
    assert missing_cases(rules[2:], [("B", [{"exp_labels": {"severity": "ticket"}}])]) == [
        "B (ticket): no case where it does not fire"]


def test_the_simulated_pair_pages_within_a_head_kill_the_guard_heals(rendered):
    """The pair-down wait scales with the scrape interval: at the simulated pair's 5 s it is short enough to fire
    inside the ~45 s a head kill lasts there (tests/sim/head_kill.yml proves it with promtool)."""
    sim = {rule["alert"]: rule for rule in rules_of((rendered["sim"] / RULES_NAME).read_text())}
    scrapes = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["monitoring_alert_pair_down_scrapes"]
    assert sim["TwinSparkPairDown"]["for"] == f"{scrapes * SIM_SCRAPE_INTERVAL_S}s"
    assert [alert for alert, expected in cases(sorted((TESTS / "sim").glob("*.yml"))) if expected] == [
        "TwinSparkPairDown"]
