"""`twinspark env check`: every rule, fed a bad env file, checked by exit code and message."""

from __future__ import annotations

import pytest

from twinspark import cli, nodeenv, settings, validate

SECRET = "sk-test-Zq81-very-secret"


def head_env(profile: str = "gb10", rank: int = 0) -> dict[str, str]:
    serve, secrets = nodeenv.example_env(profile, rank)
    return {**serve, **secrets}


def write_env(tmp_path, values: dict[str, str], name: str = "serve.env", raw_lines: str = "") -> str:
    path = tmp_path / name
    body = "".join(f"{k}={v}\n" for k, v in values.items()) + raw_lines
    path.write_text(body, encoding="utf-8")
    path.chmod(0o600)
    return str(path)


def check(capsys, *files: str) -> tuple[int, list[str]]:
    code = cli.main(["env", "check", *files])
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line]


def check_with(tmp_path, capsys, profile: str = "gb10", rank: int = 0, **changes: str) -> tuple[int, list[str]]:
    values = head_env(profile, rank)
    values.update(changes)
    return check(capsys, write_env(tmp_path, values))


@pytest.mark.parametrize("profile", ["gb10", "cpu"])
@pytest.mark.parametrize("rank", [0, 1])
def test_defaults_validate_cleanly(tmp_path, capsys, profile, rank):
    assert cli.main(["env", "defaults", "--profile", profile, "--rank", str(rank)]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "defaults.env"
    path.write_text(text)
    assert check(capsys, str(path)) == (0, [])
    assert f"TWINSPARK_PROFILE={profile}\n" in text
    assert f"NODE_RANK={rank}\n" in text
    assert "VLLM_USE_BREAKABLE_CUDAGRAPH=0\n" in text


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        ("MTP_NUM_TOKENS", "4", "MTP_NUM_TOKENS: must be at least 5 (got '4') (allowed: integer >= 5)"),
        ("MTP_NUM_TOKENS", "five", "MTP_NUM_TOKENS: is not a whole number"),
        ("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "4000",
         "VLLM_PREFIX_CACHE_RETENTION_INTERVAL: must be a multiple of 256 (got '4000')"),
        ("VLLM_PORT", "0", "VLLM_PORT: is not a TCP port (got '0') (allowed: 1-65535)"),
        ("VLLM_PORT", "65536", "VLLM_PORT: is not a TCP port (got '65536') (allowed: 1-65535)"),
        ("MASTER_PORT", "-1", "MASTER_PORT: is not a TCP port"),
        ("GPU_MEMORY_UTILIZATION", "0", "GPU_MEMORY_UTILIZATION: must be greater than 0 (got '0')"),
        ("GPU_MEMORY_UTILIZATION", "1.2", "GPU_MEMORY_UTILIZATION: must be at most 1 (got '1.2')"),
        ("GPU_MEMORY_UTILIZATION", "80%", "GPU_MEMORY_UTILIZATION: is not a decimal number"),
        ("DEFAULT_THINKING", "medium",
         "DEFAULT_THINKING: is not one of the allowed values (got 'medium') (allowed: off, low, high, max)"),
        ("DEFAULT_THINKING", "High", "DEFAULT_THINKING: is not one of the allowed values (got 'High')"),
        ("DRAFT_SAMPLE_METHOD", 'greedy","x":"y',
         "DRAFT_SAMPLE_METHOD: is not one of the allowed values (got 'greedy\",\"x\":\"y') "
         "(allowed: probabilistic, greedy)"),
        ("DSPARK_MAX_INFLIGHT_PREFILLS", "0", "DSPARK_MAX_INFLIGHT_PREFILLS: must be at least 1"),
        ("DSPARK_MAX_INFLIGHT_PREFILLS", "4", "DSPARK_MAX_INFLIGHT_PREFILLS: must be at most 3"),
        ("DSPARK_MAX_INFLIGHT_PREFILLS", "2x", "DSPARK_MAX_INFLIGHT_PREFILLS: is not a whole number"),
        ("VLLM_USE_BREAKABLE_CUDAGRAPH", "maybe", "VLLM_USE_BREAKABLE_CUDAGRAPH: is not a boolean (got 'maybe') "
         "(allowed: 1/0 (also true/false, yes/no, on/off), auto)"),
        ("ENFORCE_EAGER", "auto", "ENFORCE_EAGER: is not a boolean (got 'auto')"),
        ("LONG_PREFILL_TOKEN_THRESHOLD", "0", "LONG_PREFILL_TOKEN_THRESHOLD: must be at least 1"),
        ("TWINSPARK_PROFILE", "gb200", "TWINSPARK_PROFILE: unknown profile (got 'gb200') (allowed: gb10, cpu)"),
        ("TWINSPARK_RUNTIME_FLAVOUR", "forked",
         "TWINSPARK_RUNTIME_FLAVOUR: is not one of the allowed values (got 'forked') (allowed: stock, fork)"),
        ("MASTER_ADDR", "192.0.2.300", "MASTER_ADDR: is not an IPv4 address"),
        ("VLLM_HOST", "localhost", "VLLM_HOST: is not an IP address"),
        ("MODEL", "just-a-name", "MODEL: is neither a Hugging Face repository id"),
        ("NCCL_IB_HCA", "=rocep1s0f0, roceP2p1s0f0", "NCCL_IB_HCA: contains whitespace"),
        ("NCCL_SOCKET_IFNAME", "an-interface-name-too-long", "NCCL_SOCKET_IFNAME: names an interface longer than"),
        ("NCCL_IB_GID_INDEX", "x3", "NCCL_IB_GID_INDEX: is not a whole number"),
        ("VLLM_NCCL_SO_PATH", "libnccl.so.2", "VLLM_NCCL_SO_PATH: is not an absolute path"),
        ("MAX_NUM_SEQ", "8", "MAX_NUM_SEQ: unknown variable; did you mean MAX_NUM_SEQS?"),
        ("max_num_seqs", "8", "max_num_seqs: unknown variable; did you mean MAX_NUM_SEQS?"),
        ("VLLM_USE_BREAKABLE_CUDAGRAPHS", "0",
         "VLLM_USE_BREAKABLE_CUDAGRAPHS: unknown variable; did you mean VLLM_USE_BREAKABLE_CUDAGRAPH?"),
        ("NCCL_DEBUG", "INFO", "NCCL_DEBUG: is fixed by the gb10 profile (WARN)"),
        ("VLLM_CPU_KVCACHE_SPACE", "4", "VLLM_CPU_KVCACHE_SPACE: applies only to the cpu profile, not gb10"),
        ("TWINSPARK_ROUTER_URL", "10.0.0.9:30000", "TWINSPARK_ROUTER_URL: is not a base URL like http://"),
        ("TWINSPARK_ROUTER_URL", "http://10.0.0.9:30000/v1", "TWINSPARK_ROUTER_URL: is not a base URL"),
        ("TWINSPARK_ROUTER_URL", "http://10.0.0.9:99999", "TWINSPARK_ROUTER_URL: has a port that is not 1-65535"),
        ("TWINSPARK_ROUTER_URL", "http://10.0.0.9:30000",
         "TWINSPARK_ROUTER_PAIR_URL: is required when TWINSPARK_ROUTER_URL is set"),
        ("TWINSPARK_ROUTER_PAIR_URL", "ftp://10.0.0.1:8000", "TWINSPARK_ROUTER_PAIR_URL: is not a base URL"),
    ],
)
def test_bad_value_is_rejected_with_its_rule(tmp_path, capsys, var, value, expected):
    changes = {var: value}
    knob = settings.load().get(var)
    if knob is not None and knob.flavours == ("fork",):
        changes["TWINSPARK_RUNTIME_FLAVOUR"] = "fork"  # fork-only knobs are checked where they are read
    code, lines = check_with(tmp_path, capsys, **changes)
    assert code == 2
    assert any(line.startswith(expected) for line in lines), lines


def test_a_router_and_its_pair_url_validate_and_lose_a_trailing_slash(tmp_path, capsys):
    code, lines = check_with(tmp_path, capsys, TWINSPARK_ROUTER_URL="http://10.0.0.9:30000/",
                             TWINSPARK_ROUTER_PAIR_URL="https://10.0.0.1:8000")
    assert code == 0, lines
    assert validate.base_url(" http://10.0.0.9:30000/ ") == "http://10.0.0.9:30000"


def test_every_problem_is_reported_at_once(tmp_path, capsys):
    code, lines = check_with(tmp_path, capsys, MTP_NUM_TOKENS="3", VLLM_PORT="x", DEFAULT_THINKING="on")
    assert code == 2
    assert [line.split(":")[0] for line in lines] == ["VLLM_PORT", "DEFAULT_THINKING", "MTP_NUM_TOKENS"]


def test_variables_outside_the_registry_are_refused_by_name(tmp_path, capsys):
    code, lines = check_with(tmp_path, capsys, NCCL_IB_TC="106", CUDA_VISIBLE_DEVICES="0")
    assert code == 2
    assert [line.split(":")[0] for line in lines] == ["NCCL_IB_TC", "CUDA_VISIBLE_DEVICES"]
    assert all("name it in ENV_PASSTHROUGH" in line for line in lines), lines


def test_variables_named_in_the_passthrough_knob_are_accepted(tmp_path, capsys):
    assert check_with(tmp_path, capsys, NCCL_IB_TC="106", CUDA_VISIBLE_DEVICES="0",
                      ENV_PASSTHROUGH="NCCL_IB_TC, CUDA_VISIBLE_DEVICES") == (0, [])


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"VLLM_HOST_IP": "192.0.2.9"}, "VLLM_HOST_IP: on the head (NODE_RANK=0) must equal MASTER_ADDR (192.0.2.1)"),
        ({"WORKER_HOST": "192.0.2.1"}, "WORKER_HOST: equals MASTER_ADDR"),
        ({"NCCL_IB_GID_AUTO": "0"}, "NCCL_IB_GID_INDEX: is required when NCCL_IB_GID_AUTO=0"),
        ({"MODEL": "/srv/models/ds4"}, "MODEL_REVISION: must be empty for a local model directory"),
        ({"NODE_RANK": "2"}, "NODE_RANK: is 2, but the group has 2 node(s) (NNODES): ranks are 0..1"),
        ({"NODE_RANK": "8"}, "NODE_RANK: is not one of the allowed values (got '8') (allowed: 0, 1, 2, 3, 4, 5, 6, 7)"),
        ({"NNODES": "4", "TENSOR_PARALLEL_SIZE": "3"},
         "TENSOR_PARALLEL_SIZE: 3 x PIPELINE_PARALLEL_SIZE 1 is 3, not the group's 4 node(s)"),
        ({"NNODES": "4", "NODE_RANK": "5"}, "NODE_RANK: is 5, but the group has 4 node(s) (NNODES): ranks are 0..3"),
    ],
)
def test_cross_rules(tmp_path, capsys, changes, expected):
    code, lines = check_with(tmp_path, capsys, **changes)
    assert code == 2
    assert any(line.startswith(expected) for line in lines), lines


def test_worker_must_not_bind_the_heads_address(tmp_path, capsys):
    code, lines = check_with(tmp_path, capsys, rank=1, VLLM_HOST_IP="192.0.2.1")
    assert code == 2
    assert any(line.startswith("VLLM_HOST_IP: on the worker (NODE_RANK=1) must equal WORKER_HOST") for line in lines)


def test_missing_required_variable(tmp_path, capsys):
    values = head_env()
    del values["MASTER_ADDR"]
    code, lines = check(capsys, write_env(tmp_path, values))
    assert code == 2
    assert lines == ["MASTER_ADDR: is required (it is derived from the inventory per node); add it to the env file"]


def test_pinned_gid_index_satisfies_auto_off(tmp_path, capsys):
    assert check_with(tmp_path, capsys, NCCL_IB_GID_AUTO="no", NCCL_IB_GID_INDEX="3") == (0, [])


def test_empty_revision_means_unpinned_and_is_valid():
    values = head_env()
    values["MODEL_REVISION"] = ""
    result = validate.validate(values)
    assert result.ok
    assert result.values["MODEL_REVISION"] == ""


@pytest.mark.parametrize(
    ("written", "normalised"),
    [("true", "1"), ("Yes", "1"), ("on", "1"), ("1", "1"), ("FALSE", "0"), ("no", "0"), ("off", "0"), ("0", "0"),
     (" auto ", "auto")],
)
def test_breakable_cudagraph_is_normalised(written, normalised):
    values = head_env()
    values["VLLM_USE_BREAKABLE_CUDAGRAPH"] = written
    assert validate.validate(values).values["VLLM_USE_BREAKABLE_CUDAGRAPH"] == normalised


def test_breakable_cudagraph_left_out_is_written_as_zero():
    values = head_env()
    del values["VLLM_USE_BREAKABLE_CUDAGRAPH"]
    assert validate.validate(values).values["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"


@pytest.mark.parametrize(("written", "normalised"), [("08080", "8080"), ("  8888", "8888"), ("00001", "1")])
def test_port_leading_zeros_are_normalised(written, normalised):
    values = head_env()
    values["VLLM_PORT"] = written
    result = validate.validate(values)
    assert result.ok
    assert result.values["VLLM_PORT"] == normalised


def test_empty_values_fall_back_to_defaults():
    values = head_env()
    values.update(DRAFT_SAMPLE_METHOD="", DSPARK_MAX_INFLIGHT_PREFILLS=" ", TWINSPARK_RUNTIME_FLAVOUR="fork")
    result = validate.validate(values)
    assert result.ok
    assert result.values["DRAFT_SAMPLE_METHOD"] == "probabilistic"
    assert result.values["DSPARK_MAX_INFLIGHT_PREFILLS"] == "2"


def test_empty_nccl_passthrough_is_absent_and_value_is_kept_byte_for_byte():
    values = head_env()
    values.update(NCCL_IB_MERGE_NICS="", NCCL_NET_GDR_LEVEL=" PHB")
    result = validate.validate(values)
    assert result.ok
    assert "NCCL_IB_MERGE_NICS" not in result.values
    assert result.values["NCCL_NET_GDR_LEVEL"] == " PHB"


# --- API keys --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        ("VLLM_API_KEY", f'"{SECRET}\nsecond"', "VLLM_API_KEY: must be a single line"),
        ("DSPARK_API_KEYS", f'"{SECRET}\vx"', "DSPARK_API_KEYS: must be a single line"),
        ("DSPARK_API_KEYS", f'"{SECRET}\fx"', "DSPARK_API_KEYS: must be a single line"),
        ("VLLM_API_KEY", f"'{SECRET}\\x'", "VLLM_API_KEY: must not contain a backslash"),
        ("DSPARK_API_KEYS", f'"k1 -{SECRET}"', "DSPARK_API_KEYS: has a key starting with '-'"),
        ("VLLM_API_KEY", f'"{SECRET} other"', "VLLM_API_KEY: holds more than one key"),
    ],
)
def test_api_key_rules_never_echo_the_key(tmp_path, capsys, var, value, expected):
    values = head_env()
    path = write_env(tmp_path, values, raw_lines=f"{var}={value}\n")
    code, lines = check(capsys, path)
    assert code == 2
    assert any(line.startswith(expected) for line in lines), lines
    assert not any(SECRET in line or "Zq81" in line for line in lines)


def test_both_key_variables_set_is_an_error_naming_both(tmp_path, capsys):
    path = write_env(tmp_path, head_env(), raw_lines=f"VLLM_API_KEY={SECRET}\nDSPARK_API_KEYS=k2 k3\n")
    code, lines = check(capsys, path)
    assert code == 2
    assert lines == ["VLLM_API_KEY, DSPARK_API_KEYS: both are set; keep exactly one of them "
                     "(DSPARK_API_KEYS holds several keys)"]


def test_blank_keys_mean_unset():
    values = head_env()
    values.update(VLLM_API_KEY=" \t ", DSPARK_API_KEYS="k1")
    result = validate.validate(values)
    assert result.ok
    assert "VLLM_API_KEY" not in result.values


def test_keys_keep_order_and_duplicates():
    values = head_env()
    values["DSPARK_API_KEYS"] = "\tk2  k1\tk2 "
    assert validate.validate(values).values["DSPARK_API_KEYS"] == "k2 k1 k2"


def test_secret_in_a_readable_file_is_reported_without_its_value(tmp_path, capsys):
    serve = write_env(tmp_path, head_env())
    secrets = write_env(tmp_path, {"VLLM_API_KEY": SECRET}, name="secrets.env")
    (tmp_path / "secrets.env").chmod(0o644)
    code, lines = check(capsys, serve, secrets)
    assert code == 2
    assert lines == [f"VLLM_API_KEY: read from {secrets}, which group or others can read; keep secrets in a file "
                     f"of mode 0600 (chmod 600 {secrets})"]


def test_secret_typo_never_echoes_the_value(tmp_path, capsys):
    code, lines = check(capsys, write_env(tmp_path, head_env(), raw_lines=f"VLLM_API_KEYS={SECRET}\n"))
    assert code == 2
    assert lines == ["VLLM_API_KEYS: unknown variable; did you mean VLLM_API_KEY?"]


def test_stray_line_of_a_multiline_key_is_reported_without_its_text(tmp_path, capsys):
    code, lines = check(capsys, write_env(tmp_path, head_env(), raw_lines=f"DSPARK_API_KEYS=k1\n{SECRET}\n"))
    assert code == 2
    assert len(lines) == 1 and "has no '='" in lines[0] and SECRET not in lines[0]


def test_later_files_override_earlier_ones(tmp_path, capsys):
    base = write_env(tmp_path, {**head_env(), "MTP_NUM_TOKENS": "3"})
    fix = write_env(tmp_path, {"MTP_NUM_TOKENS": "6"}, name="override.env")
    assert check(capsys, base, fix) == (0, [])
    assert check(capsys, fix, base)[0] == 2


def test_unreadable_file_is_invalid_input(tmp_path, capsys):
    code, lines = check(capsys, str(tmp_path / "missing.env"))
    assert code == 2
    assert lines[0].startswith(f"{tmp_path / 'missing.env'}: cannot read")


def test_bom_and_crlf_file_validates(tmp_path, capsys):
    values = head_env()
    text = "\ufeff" + "".join(f"{k}={v}\r\n" for k, v in values.items())
    path = tmp_path / "windows.env"
    path.write_bytes(text.encode("utf-8"))
    assert check(capsys, str(path)) == (0, [])


def test_json_output_hides_secrets(tmp_path, capsys):
    import json

    path = write_env(tmp_path, {**head_env(), "VLLM_API_KEY": SECRET})
    assert cli.main(["env", "check", "--json", path]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    assert json.loads(out)["values"]["MAX_NUM_SEQS"] == "6"


def test_defaults_written_to_a_file_atomically(tmp_path, capsys):
    target = tmp_path / "serve.env"
    target.write_text("OLD=1\n")
    assert cli.main(["env", "defaults", "--profile", "cpu", "--rank", "1", "--output", str(target)]) == 0
    assert capsys.readouterr().out == ""
    assert target.stat().st_mode & 0o777 == 0o640
    assert "NODE_RANK=1\n" in target.read_text() and "OLD=1" not in target.read_text()
    assert check(capsys, str(target)) == (0, [])


# Addresses a node can never be reached at: each variable refuses each class (a removed class fails one case).
NOT_A_NODE = {
    "unspecified": "0.0.0.0",
    "loopback": "127.0.0.1",
    "loopback, not the first": "127.20.30.40",
    "multicast": "224.0.0.251",
    "multicast, organisation-local": "239.255.0.1",
}


@pytest.mark.parametrize("var", ["MASTER_ADDR", "WORKER_HOST", "VLLM_HOST_IP", "GID_MATCH_IP"])
@pytest.mark.parametrize("case", sorted(NOT_A_NODE))
def test_an_address_no_node_can_have_is_refused(var, case):
    address = NOT_A_NODE[case]
    raw = head_env("gb10", 0)
    raw[var] = address
    problems = [str(p) for p in validate.validate(raw).problems]
    expected = (f"{var}: must be a node's own unicast address (never 0.0.0.0, 127.x or multicast) "
                f"(got {address!r}) (allowed: an IPv4 address)")
    assert expected in problems, problems


@pytest.mark.parametrize("var", ["MASTER_ADDR", "WORKER_HOST", "VLLM_HOST_IP", "GID_MATCH_IP"])
def test_a_node_address_passes_the_same_rule(var):
    raw = head_env("gb10", 0)
    raw.update(MASTER_ADDR="10.77.0.1", WORKER_HOST="10.77.0.2", VLLM_HOST_IP="10.77.0.1", GID_MATCH_IP="10.77.0.1")
    result = validate.validate(raw)
    assert result.problems == [] and result.values[var].startswith("10.77.0.")


# A carriage return reaches validate() from the inventory or the process environment (an env file's reader turns
# it into a line break first), and in an Authorization header it would split the header.
@pytest.mark.parametrize("var", ["VLLM_API_KEY", "DSPARK_API_KEYS"])
@pytest.mark.parametrize("where", ["inside", "at the end"])
def test_a_carriage_return_in_an_api_key_is_refused_without_showing_the_key(var, where):
    raw = head_env("gb10", 0)
    raw[var] = f"{SECRET}\rinjected: 1" if where == "inside" else f"{SECRET}\r"
    problems = [p for p in validate.validate(raw).problems if p.var == var]
    assert [p.message for p in problems] == [
        "must be a single line (no carriage return, line feed, vertical tab or form feed)"
    ]
    assert SECRET not in str(problems[0])


def test_a_carriage_return_in_an_api_key_from_the_inventory_is_refused():
    with pytest.raises(nodeenv.NodeEnvError) as caught:
        nodeenv.node_env({"twinspark_vllm_api_key": f"{SECRET}\r"}, 0, "10.77.0.1", "10.77.0.2")
    assert any("VLLM_API_KEY" in p and "single line" in p for p in caught.value.problems)
    assert SECRET not in str(caught.value)
