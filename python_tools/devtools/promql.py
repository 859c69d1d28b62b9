"""The metric names a PromQL expression reads, found by a small tokenizer (the dashboards' tests and monitor-check).

promtool cannot parse a bare expression (`promtool check` reads rule files, `promtool query` needs a server), and
no Python PromQL parser is packaged, so this reads just enough of the grammar to tell a metric name from a function,
an aggregation, a keyword, a label inside `{...}` or `by (...)`, a duration inside `[...]`, a number or a string.
It refuses what it cannot classify (an unknown function, an unbalanced bracket, a Grafana variable where a metric
name goes) with ValueError, so a typo fails the test instead of passing unseen.

Grafana's variable queries (`label_values(EXPR, LABEL)`) go through `variable_query_metric_names`.
"""

from __future__ import annotations

import re

# Prometheus 2.42's functions (docs: querying/functions) and aggregation operators (querying/operators).
FUNCTIONS = frozenset([
    "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "avg_over_time", "ceil",
    "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time", "day_of_month", "day_of_week",
    "day_of_year", "days_in_month", "deg", "delta", "deriv", "end", "exp", "floor", "histogram_count",
    "histogram_fraction", "histogram_quantile", "histogram_sum", "holt_winters", "hour", "idelta", "increase",
    "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2", "max_over_time",
    "min_over_time", "minute", "month", "pi", "predict_linear", "present_over_time", "quantile_over_time", "rad",
    "rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_desc", "sqrt", "start",
    "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "vector", "year",
])
AGGREGATIONS = frozenset([
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
])
# Keywords after which a parenthesised list holds label names, not expressions.
LABEL_LISTS = frozenset(["by", "without", "on", "ignoring", "group_left", "group_right"])
KEYWORDS = LABEL_LISTS | frozenset(["bool", "offset", "and", "or", "unless", "atan2"])
NUMBER_WORDS = frozenset(("inf", "nan"))

_DURATION = r"(?:\d+(?:ms|s|m|h|d|w|y))+"
_TOKEN = re.compile(rf"""
    (?P<space>\s+)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<variable>\$\{{[^}}]*\}}|\$\w+|\[\[\w+\]\])
  | (?P<number>{_DURATION}|0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<open>[({{\[])
  | (?P<close>[)}}\]])
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=,@])
""", re.VERBOSE)
_PAIRS = {")": "(", "}": "{", "]": "["}


def tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text) for every token but white space; ValueError naming the position of a character it cannot read."""
    found = []
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise ValueError(f"cannot read {expr[position:position + 20]!r} at {position} in {expr!r}")
        if match.lastgroup != "space":
            found.append((match.lastgroup or "", match.group()))
        position = match.end()
    return found


def metric_names(expr: str) -> list[str]:
    """The metric names `expr` selects, in order of first use; ValueError for what the tokenizer cannot classify."""
    found = tokens(expr)
    names: list[str] = []
    # What each open bracket is: "{" a selector's matchers, "[" a range, "labels" a by/on list, "(" anything else.
    stack: list[tuple[str, str]] = []
    for index, (kind, text) in enumerate(found):
        following = found[index + 1] if index + 1 < len(found) else ("", "")
        inside = stack[-1][0] if stack else ""
        if kind == "open":
            previous = found[index - 1] if index else ("", "")
            role = text
            if text == "(" and previous[0] == "ident" and previous[1] in LABEL_LISTS:
                role = "labels"
            stack.append((role, text))
        elif kind == "close":
            if not stack or stack[-1][1] != _PAIRS[text]:
                raise ValueError(f"unbalanced {text!r} in {expr!r}")
            stack.pop()
        elif kind == "variable" and inside not in ("{", "["):
            raise ValueError(f"Grafana variable {text} where a metric name or a number goes in {expr!r}")
        elif kind == "string" and inside == "{" and index >= 2 and found[index - 2] == ("ident", "__name__"):
            _add(names, text[1:-1])
        elif kind == "ident" and inside not in ("{", "[", "labels"):
            if text in AGGREGATIONS or text in KEYWORDS or text.lower() in NUMBER_WORDS:
                continue
            if following == ("open", "("):
                if text not in FUNCTIONS:
                    raise ValueError(f"unknown function {text}() in {expr!r}")
                continue
            _add(names, text)
    if stack:
        raise ValueError(f"unclosed {stack[-1][1]!r} in {expr!r}")
    return names


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<expr>.*?)\s*,\s*(?P<label>[A-Za-z_]\w*)\s*\)\s*$", re.S)


def variable_query_metric_names(query: str) -> list[str]:
    """The metric names a Grafana Prometheus variable query `label_values(EXPR, LABEL)` reads (only that form)."""
    return metric_names(label_values_parts(query)[0])


def label_values_parts(query: str) -> tuple[str, str]:
    """`label_values(EXPR, LABEL)` -> (EXPR, LABEL); ValueError for any other form."""
    match = _LABEL_VALUES.match(query)
    if match is None:
        raise ValueError(f"only label_values(EXPR, LABEL) variable queries are read here (got {query!r})")
    return match.group("expr"), match.group("label")


def _add(names: list[str], name: str) -> None:
    if name not in names:
        names.append(name)
