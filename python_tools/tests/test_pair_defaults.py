"""`twinspark pair VERB` typed by hand on the head takes its defaults from what site.yml recorded there (layout
pair_args, written by roles/pair_guard/tasks/_install.yml), so `twinspark pair rejoin` needs no --worker; options
typed on the command line win, and a repeated option typed at all (--worker, --env) replaces the recorded ones."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from twinspark import cli, layout
from twinspark.pair import cli as pair_cli

RECORDED = ["--env", "/etc/twinspark/serve.env", "--env", "/etc/twinspark/secrets.env", "--worker=10.0.0.2",
            "--worker=192.168.50.2", "--ssh-user", "twinspark-guard", "--ready-timeout", "3600", "--probe-timeout",
            "120", "--fabric-wait", "300"]


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    path = tmp_path / "pair-args.json"
    path.write_text(json.dumps({"argv": RECORDED}))
    monkeypatch.setattr(layout, "current", lambda: replace(layout.default(), pair_args=str(path)))
    seen = {}

    def capture(args):
        seen["args"] = args
        raise ValueError("stand-in pair: nothing to reach")

    monkeypatch.setattr(pair_cli, "_pair_from_args", capture)
    return {"path": path, "seen": seen}


def test_a_verb_without_worker_takes_every_recorded_option(recorded, tmp_path):
    assert cli.main(["pair", "check", "--state-file", str(tmp_path / "s.json")]) == 2
    args = recorded["seen"]["args"]
    assert args.worker == ["10.0.0.2", "192.168.50.2"]
    assert args.env == ["/etc/twinspark/serve.env", "/etc/twinspark/secrets.env"]
    assert (args.ssh_user, args.ready_timeout, args.fabric_wait) == ("twinspark-guard", 3600.0, 300.0)
    assert args.startup_grace == 3600.0, "derived defaults follow the recorded values"
    assert args.state_file == str(tmp_path / "s.json"), "typed options are kept"


def test_typed_options_win_and_a_typed_worker_replaces_the_recorded_ones(recorded):
    cli.main(["pair", "rejoin", "--ready-timeout", "5", "--env", "/tmp/other.env"])
    args = recorded["seen"]["args"]
    assert args.ready_timeout == 5.0 and args.env == ["/tmp/other.env"]
    assert args.worker == ["10.0.0.2", "192.168.50.2"]
    cli.main(["pair", "rejoin", "--worker", "node2"])
    assert recorded["seen"]["args"].worker == ["node2"], "with --worker given, nothing recorded is read"
    assert recorded["seen"]["args"].ready_timeout == 1800.0


def test_without_a_recorded_file_the_verb_says_what_to_give(recorded, capsys):
    recorded["path"].unlink()
    assert cli.main(["pair", "rejoin"]) == 2
    err = capsys.readouterr().err
    assert "give --worker ADDRESS" in err and str(recorded["path"]) in err and "site.yml writes it" in err
    assert "args" not in recorded["seen"], "nothing was looked at"


@pytest.mark.parametrize("content", ["not json", '{"argv": "10.0.0.2"}', '{"argv": [1, 2]}', "[]"])
def test_a_malformed_recorded_file_is_named(recorded, capsys, content):
    recorded["path"].write_text(content)
    assert cli.main(["pair", "restart"]) == 2
    assert str(recorded["path"]) in capsys.readouterr().err


def test_merged_words_keep_order_and_drop_replaced_repeats():
    assert pair_cli.merged_words(["--worker", "a", "--worker=b", "--env", "e", "--ready-timeout", "9"],
                                 ["--worker", "c", "--ready-timeout", "1"]) == [
        "--env", "e", "--ready-timeout", "9", "--worker", "c", "--ready-timeout", "1"]
    assert pair_cli.merged_words(["--env=x"], []) == ["--env=x"]


def test_the_role_records_what_the_guard_runs_with():
    from pathlib import Path

    root = Path(__file__).parents[2]
    variables = (root / "roles/pair_guard/vars/main.yml").read_text()
    assert "pair_guard_pair_args_json: \"{{ {'argv': pair_guard_cli_args" in variables
    assert 'pair_guard_cli_args: "{{ vllm_service_pair_cli_args }}"' in variables
    assert "pair guard {{ pair_guard_cli_args | join(' ') }}" in variables
    tasks = (root / "roles/pair_guard/tasks/_install.yml").read_text()
    assert "dest: \"{{ twinspark_layout_pair_args }}\"" in tasks and 'mode: "0600"' in tasks
