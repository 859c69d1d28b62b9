"""Reading env files the way systemd does, and writing them atomically."""

from __future__ import annotations

import os

import pytest

from twinspark import envfile


def test_systemd_quoting_rules():
    text = (
        "# a comment\n"
        "; another comment\n"
        "PLAIN=value  \n"
        "  SPACED = spaced value\t\n"
        "SINGLE='it''s  \\n literal'\n"
        'DOUBLE="a \\"quoted\\" \\$HOME \\\\ \\x"\n'
        "ESCAPED=a\\ b\n"
        "CONTINUED=one\\\ntwo\n"
        'MULTI="line1\nline2"\n'
        "EMPTY=\n"
        "HCA==rocep1s0f0,roceP2p1s0f0\n"
        'MID=a"b c"\n'
        "# continued comment \\\nHIDDEN=1\n"
        "JOINED='a' \"b\"\n"
    )
    values = envfile.parse(text).values
    assert values == {
        "PLAIN": "value",
        "SPACED": "spaced value",
        "SINGLE": "its  \\n literal",
        "DOUBLE": 'a "quoted" $HOME \\ \\x',
        "ESCAPED": "a b",
        "CONTINUED": "onetwo",
        "MULTI": "line1\nline2",
        "EMPTY": "",
        "HCA": "=rocep1s0f0,roceP2p1s0f0",
        "MID": 'a"b c"',
        "JOINED": "ab",
    }


def test_bom_and_crlf_are_normalised():
    parsed = envfile.parse("\ufeffA=1\r\nB='x y'\r\nC=3\r")
    assert parsed.values == {"A": "1", "B": "x y", "C": "3"}
    assert parsed.problems == []


def test_lines_without_equals_and_bad_names_are_problems_that_hide_the_text():
    parsed = envfile.parse("GOOD=1\nsecret-looking-line\n9BAD=2\n", "f.env")
    assert parsed.values == {"GOOD": "1"}
    assert parsed.problems == ["f.env:2: line has no '=' (systemd ignores it)",
                               "f.env:3: not a valid variable name"]


@pytest.mark.parametrize("value", ["plain", "two words", 'q"uote', "back\\slash", "$HOME", "=lead", "", "a'b", "`x`"])
def test_render_round_trips(value):
    assert envfile.parse(envfile.render({"K": value})).values == {"K": value}


def test_write_atomic_sets_mode_and_content(tmp_path):
    target = tmp_path / "serve.env"
    old_umask = os.umask(0)
    try:
        envfile.write_atomic(target, "A=1\n", mode=0o640)
    finally:
        os.umask(old_umask)
    assert target.read_text() == "A=1\n"
    assert target.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["serve.env"]


def test_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "secrets.env"
    target.write_text("OLD=1\n")

    def broken_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        envfile.write_atomic(target, "NEW=2\n")
    assert target.read_text() == "OLD=1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["secrets.env"]
