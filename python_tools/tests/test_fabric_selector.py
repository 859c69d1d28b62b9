"""NCCL_IB_HCA grammar (the rules in twinspark/fabric/selector.py's docstring), on plain data."""

from __future__ import annotations

import pytest

from twinspark.fabric.selector import ANY_PORT, PORT_CLAMP, parse_port, parse_selector, select_ports, selects

GB10_PORTS = [("rocep1s0f0", 1), ("rocep1s0f1", 1), ("roceP2p1s0f0", 1), ("roceP2p1s0f1", 1)]


def picked(text: str, ports=GB10_PORTS) -> list[tuple[str, int]]:
    return select_ports(parse_selector(text), ports)[0]


@pytest.mark.parametrize(
    ("text", "port"),
    [
        ("1", 1),
        ("08", 8),  # no octal
        ("010", 10),
        ("+8", 8),
        (" 8", 8),
        ("\t\n 8", 8),  # C isspace includes LF and tab
        ("8abc", 8),
        ("8\n", 8),  # stops at LF
        ("1:0:0", 1),  # rail and plane never reach the port
        ("abc", 0),  # no digits: 0, a port that matches nothing
        (" ", 0),
        ("+", 0),
        ("-", 0),
        ("-1", -1),  # NCCL's own any-port marker
        ("-0000000001", -1),
        ("4294967295", PORT_CLAMP),  # would wrap to -1 in 32-bit C
        ("4294967297", PORT_CLAMP),
        ("-4294967297", -PORT_CLAMP),
        ("18446744073709551615", PORT_CLAMP),
        ("999999999", 999999999),
        ("0000000000999999999", 999999999),  # leading zeros do not count towards the nine digits
        ("1000000000", PORT_CLAMP),
    ],
)
def test_port_is_read_like_c_atoi_and_never_wraps(text, port):
    assert parse_port(text) == port


def test_huge_port_is_clamped_not_wrapped_to_any_port():
    # 2**32 - 1 wraps to -1 in a C int; -1 would mean "every port" and select a port the user did not name.
    assert picked("rocep1s0f1:4294967295") == []
    assert picked("rocep1s0f1:-4294967297") == []


def test_literal_minus_one_is_any_port():
    assert picked("rocep1s0f1:-1") == [("rocep1s0f1", 1)]


def test_empty_port_means_any_port():
    assert parse_selector("devA:").tokens == parse_selector("devA").tokens
    assert parse_selector("devA:").tokens[0].port == ANY_PORT
    assert picked("rocep1s0f1:") == [("rocep1s0f1", 1)]


def test_empty_port_with_rail_is_still_any_port():
    assert parse_selector("devA::3").tokens[0].port == ANY_PORT


@pytest.mark.parametrize("text", ["rocep1s0f1:08", "rocep1s0f1:010", "rocep1s0f1:+8", "rocep1s0f1: 8"])
def test_ports_parsed_as_decimal_select_that_port_only(text):
    ports = [("rocep1s0f1", 1), ("rocep1s0f1", 8), ("rocep1s0f1", 10)]
    expected = 10 if text.endswith("010") else 8
    assert picked(text, ports) == [("rocep1s0f1", expected)]


def test_port_without_digits_matches_nothing():
    assert picked("rocep1s0f1:abc") == []
    assert picked("rocep1s0f1:0") == []


def test_trailing_garbage_after_port_digits_is_ignored():
    assert picked("rocep1s0f1:1abc") == [("rocep1s0f1", 1)]


def test_prefix_match_by_default():
    assert picked("rocep1s0f") == [("rocep1s0f0", 1), ("rocep1s0f1", 1)]


def test_prefix_match_is_case_sensitive():
    assert picked("rocep2") == []
    assert picked("roceP2") == [("roceP2p1s0f0", 1), ("roceP2p1s0f1", 1)]


def test_equals_asks_for_exact_names():
    assert picked("=rocep1s0f") == []
    assert picked("=rocep1s0f1,roceP2p1s0f1") == [("roceP2p1s0f1", 1), ("rocep1s0f1", 1)]


def test_caret_excludes():
    assert picked("^rocep1s0f0") == [("roceP2p1s0f0", 1), ("roceP2p1s0f1", 1), ("rocep1s0f1", 1)]


def test_caret_then_equals_excludes_exact_names_only():
    assert picked("^=rocep1s0f") == sorted(GB10_PORTS)
    assert picked("^=rocep1s0f0,roceP2p1s0f0") == [("roceP2p1s0f1", 1), ("rocep1s0f1", 1)]


def test_equals_before_caret_is_part_of_the_name():
    # Only "^" then "=" are markers, in that order: "=^x" is an exact name "^x".
    assert picked("=^rocep1s0f0") == []


def test_exclusion_with_port_keeps_the_other_ports():
    ports = [("devA", 1), ("devA", 2)]
    assert picked("^devA:1", ports) == [("devA", 2)]


def test_empty_selector_selects_everything():
    assert picked("") == sorted(GB10_PORTS)
    assert picked(None) == sorted(GB10_PORTS)
    assert picked(",,,") == sorted(GB10_PORTS)  # only empty names: an empty list


def test_bare_caret_selects_nothing():
    assert picked("^") == []
    assert picked("^,") == []
    assert picked("^=") == []


def test_empty_names_take_no_slot():
    selector = parse_selector(",".join([""] * 40 + [f"dev{i}" for i in range(32)]))
    assert [t.name for t in selector.tokens] == [f"dev{i}" for i in range(32)]
    assert selector.notes == ()
    assert parse_selector(":1,devA").tokens[0].name == "devA"


def test_only_the_first_32_names_count_and_a_note_says_so():
    selector = parse_selector(",".join(f"dev{i:02d}" for i in range(40)))
    assert len(selector.tokens) == 32
    assert selector.tokens[-1].name == "dev31"
    assert any("selector list truncated" in note for note in selector.notes)
    assert not selects(selector, "dev35", 1)


def test_names_are_cut_to_63_bytes():
    long_name = "r" * 70
    selector = parse_selector(long_name)
    assert selector.tokens[0].name == "r" * 63
    # A device whose name shares the first 63 bytes is matched by the cut prefix, as in NCCL.
    assert selects(selector, "r" * 63 + "x", 1)


def test_names_cut_inside_a_multibyte_character_stay_valid_text():
    selector = parse_selector("r" * 62 + "é")
    assert selector.tokens[0].name == "r" * 62


def test_whitespace_is_part_of_the_name_not_a_separator():
    assert picked(" rocep1s0f1") == []
    assert picked("rocep1s0f1 ,roceP2p1s0f1") == [("roceP2p1s0f1", 1)]


def test_no_globbing():
    assert picked("roce*") == []


def test_more_than_32_ports_keep_the_first_32_by_name_then_port_and_name_the_rest():
    ports = [(f"dev{d:02d}", p) for d in range(17, -1, -1) for p in (2, 1)]  # 36 ports, listed backwards
    kept, notes = select_ports(parse_selector(""), ports)
    assert len(kept) == 32
    assert kept[:3] == [("dev00", 1), ("dev00", 2), ("dev01", 1)]
    assert kept[-1] == ("dev15", 2)
    assert len(notes) == 1
    for dropped in ("dev16:1", "dev16:2", "dev17:1", "dev17:2"):
        assert dropped in notes[0]
