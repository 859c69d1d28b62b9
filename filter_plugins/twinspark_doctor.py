"""Ansible filters for playbooks/preflight.yml and playbooks/fabric-check.yml: thin adapters over twinspark.doctor.

The collector runs on the nodes (shipped by the script module); the judging, the bandwidth decision and the fabric
check's record are made here, on the controller, by the same rules `twinspark doctor` applies (docs/DOCTOR.md).
"""

from __future__ import annotations

import json
import runpy
import shlex
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))  # python_tools/ on sys.path

from ansible.errors import AnsibleFilterError
from twinspark.doctor import bandwidth, collect, rules


def _settings(node_env, fabric_mtu=None) -> dict[str, str]:
    """The non-secret settings the rules read, from a node's env (twinspark_node_env), and the fabric's MTU."""
    values = {name: str(node_env[name]) for name in rules.SETTINGS_READ if node_env.get(name) is not None}
    if fabric_mtu is not None:
        values[rules.FABRIC_MTU_KEY] = str(fabric_mtu)
    return rules.settings_of({}, values)


def _facts(text, host):
    try:
        facts = json.loads(str(text))
    except ValueError as error:
        raise AnsibleFilterError(f"{host}: the doctor's collector printed no JSON ({error}); run "
                                 f"`python3 {collect.__file__}` there to see why") from None
    if not isinstance(facts, dict) or facts.get("schema") != collect.SCHEMA:
        raise AnsibleFilterError(f"{host}: the collector's output is not facts of schema {collect.SCHEMA}")
    return facts


def twinspark_doctor_collect_cmd(node_env, venv, state_dir, unit, record, files=()):
    """The script module's `cmd`: the collector (this checkout's file) and the options a node with this env and
    layout is looked at with (rules.collector_options), each quoted for the node's shell; `files`: managed files
    to read as twinspark_probe would (the preflight's layout file)."""
    options = rules.collector_options(_settings(node_env), str(venv), str(state_dir), str(unit), str(record),
                                      [str(path) for path in files])
    return " ".join(shlex.quote(word) for word in [collect.__file__, *rules.collector_argv(options)])


def twinspark_doctor_verdict(collected, node_envs, fabric_mtu=None, requested=False):
    """One pair's verdict, as the preflight counts it: `collected` maps each host to the collector's stdout,
    `node_envs` each host to its env. Returns {lines (the doctor's table), stops (one line per finding that stops
    the run), exit_code, bandwidth ({host: why it is due, or ""}), bandwidth_due}."""
    facts = {str(host): _facts(text, host) for host, text in dict(collected).items()}
    envs = {host: _settings(dict(node_envs)[host], fabric_mtu) for host in facts}
    report = rules.judge_pair(facts, envs)
    unused = rules.unused_acknowledgements(report, envs)
    due = {host: bandwidth.why_due(facts[host].get("bandwidth_record"), bandwidth.fingerprint(facts[host], envs[host]),
                                   bool(requested)) for host in facts}
    return {
        "lines": rules.table(report, preflight=True).splitlines()
        + [f"acknowledged but not found: {line} (remove it from twinspark_doctor_ack)" for line in unused],
        "stops": [f"{f.host}: {f.id}: {f.message}. Fix: {f.fix}" for f in report.stops(preflight=True)],
        "exit_code": report.exit_code(preflight=True),
        "bandwidth": due,
        "bandwidth_due": any(due.values()),
    }


def twinspark_bandwidth_record(bench, ports, collected, node_env, fabric_mtu, checked_at):
    """The record the fabric check leaves on a node (twinspark.doctor.bandwidth.make_record): `bench` is the
    registered `twinspark fabric bench --json` result, `ports` the head's ib_write_bw results ([] elsewhere),
    `collected` the collector's stdout just before (the fabric's fingerprint as measured)."""
    try:
        reduce = {**json.loads(bench.get("stdout") or "{}"), "rc": bench.get("rc")}
    except ValueError:
        reduce = {"rc": bench.get("rc")}
    if bench.get("rc") != 0:
        # torch's own warnings ("[W ...") are not the reason it failed.
        errors = [line for line in str(bench.get("stderr") or "").splitlines()
                  if line.strip() and not line.startswith("[W")]
        reduce["error"] = errors[-1] if errors else "no output"
    env = _settings(node_env, fabric_mtu)
    facts = _facts(collected, "this node")
    return bandwidth.make_record(reduce, list(ports or []), bandwidth.fingerprint(facts, env), str(checked_at),
                                 env.get("TWINSPARK_PROFILE", "gb10"))


def twinspark_bandwidth_summary(record):
    return bandwidth.summary(record)


class FilterModule:
    def filters(self):
        return {
            "twinspark_doctor_collect_cmd": twinspark_doctor_collect_cmd,
            "twinspark_doctor_verdict": twinspark_doctor_verdict,
            "twinspark_bandwidth_record": twinspark_bandwidth_record,
            "twinspark_bandwidth_summary": twinspark_bandwidth_summary,
        }
