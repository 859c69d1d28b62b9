"""twinspark.systemd: the one `systemctl show` command line and parse that health and the pair guard share."""

from __future__ import annotations

from twinspark import systemd


def test_show_asks_only_for_the_named_properties():
    assert systemd.show_argv("twinspark-vllm.service", ("ActiveState", "MainPID")) == [
        "systemctl", "show", "twinspark-vllm.service", "--property=ActiveState,MainPID"]


def test_parse_keeps_everything_after_the_first_equals_and_skips_other_lines():
    text = "ActiveState=active\nExecStart={ path=/usr/bin/x ; argv[]=/usr/bin/x --a=b }\nnot a property\nResult=\n"
    assert systemd.parse_show(text) == {"ActiveState": "active", "Result": "",
                                        "ExecStart": "{ path=/usr/bin/x ; argv[]=/usr/bin/x --a=b }"}
