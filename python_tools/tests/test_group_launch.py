"""A group's env files and vLLM command line, rank by rank (docs/GROUPS.md): nodeenv.group_envs and the launcher,
held to twinspark.group.launch_args, with today's pair unchanged."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from twinspark import cli, envfile, group, nodeenv

CPU = {"twinspark_profile": "cpu"}


def hosts(count: int, **first) -> tuple[list[str], dict[str, dict]]:
    """`count` simulated nodes s0.. with their fabric addresses, the cpu profile, rank 0's extra settings."""
    names = [f"s{i}" for i in range(count)]
    host_vars = {name: {**CPU, "twinspark_rank": i, "twinspark_fabric_address": f"10.77.0.{i + 1}"}
                 for i, name in enumerate(names)}
    host_vars[names[0]].update(first)
    return names, host_vars


def dry_run(tmp_path, serve: dict, secrets: dict) -> dict:
    path = tmp_path / f"rank{serve['NODE_RANK']}.env"
    path.write_text("".join(f"{k}={envfile.quote(v)}\n" for k, v in {**serve, **secrets}.items()))
    path.chmod(0o600)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["serve", "--dry-run", "--json", "--skip-gid", "--env", str(path)]) == 0
    return json.loads(out.getvalue())


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


MULTI_NODE = ("--tensor-parallel-size", "--pipeline-parallel-size", "--nnodes", "--node-rank", "--master-addr",
              "--master-port")


@pytest.mark.parametrize(("count", "tp", "pp"), [(4, None, None), (4, 2, 2), (3, 1, 3), (8, None, None)])
def test_every_rank_of_a_group_gets_the_flags_the_group_rules_decide(tmp_path, count, tp, pp):
    names, host_vars = hosts(count, twinspark_topology="switch",
                             **({group.TP_VAR: tp} if tp else {}), **({group.PP_VAR: pp} if pp else {}))
    shape = group.read("g", names, host_vars, {})
    envs = nodeenv.group_envs(host_vars, shape.ranks, shape.tp, shape.pp)
    for rank, name in enumerate(shape.ranks):
        serve, secrets = envs[name]
        assert serve["NODE_RANK"] == str(rank) and serve["VLLM_HOST_IP"] == f"10.77.0.{rank + 1}"
        assert serve["MASTER_ADDR"] == "10.77.0.1" and serve["NNODES"] == str(count)
        shown = dry_run(tmp_path, serve, secrets)
        argv = shown["argv"]
        wanted = group.launch_args(shape, rank, "10.77.0.1", int(serve["MASTER_PORT"]))
        for name_ in MULTI_NODE:
            assert flag(argv, name_) == flag(wanted, name_), name_
        assert ("--headless" in argv) == (rank != 0) == ("--headless" in wanted)
        # only rank 0 serves the API, so only rank 0's vLLM gets the keys
        assert ("TWINSPARK_VLLM_API_KEYS" in shown["env"]) == (rank == 0 and "TWINSPARK_VLLM_API_KEYS" in secrets)


def test_a_group_of_one_starts_without_any_multi_node_flag(tmp_path):
    names, host_vars = hosts(1)
    shape = group.read("g", names, host_vars, {})
    serve, secrets = nodeenv.group_envs(host_vars, shape.ranks, shape.tp, shape.pp)["s0"]
    assert (serve["NNODES"], serve["TENSOR_PARALLEL_SIZE"], serve["PIPELINE_PARALLEL_SIZE"]) == ("1", "1", "1")
    argv = dry_run(tmp_path, serve, secrets)["argv"]
    assert flag(argv, "--tensor-parallel-size") == "1" and flag(argv, "--pipeline-parallel-size") == "1"
    assert not {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"} & set(argv)
    assert group.launch_args(shape, 0, "10.77.0.1") == ["--tensor-parallel-size", "1", "--pipeline-parallel-size",
                                                         "1"]


def test_the_pair_read_as_a_group_renders_exactly_the_pairs_env_files():
    names, host_vars = hosts(2)
    pair = nodeenv.pair_envs(host_vars, *names)
    assert nodeenv.group_envs(host_vars, names) == pair
    assert nodeenv.group_envs(host_vars, names, 2, 1) == pair  # TP2 x PP1 declared: still the pair's files
    assert not {"NNODES", "TENSOR_PARALLEL_SIZE", "PIPELINE_PARALLEL_SIZE"} & set(pair["s0"][0])


def test_a_setting_that_differs_on_one_rank_of_four_is_refused_naming_every_node():
    names, host_vars = hosts(4, twinspark_topology="switch")
    host_vars["s2"]["twinspark_max_num_seqs"] = 3
    with pytest.raises(nodeenv.NodeEnvError) as refused:
        nodeenv.group_envs(host_vars, names, 4, 1)
    text = "\n".join(refused.value.problems)
    assert "s0, s1, s2, s3: twinspark_max_num_seqs: differs between the nodes" in text
    assert "the same on every node" in text and "for the whole group" in text


def test_a_missing_fabric_address_names_its_rank():
    names, host_vars = hosts(3, twinspark_topology="mesh")
    del host_vars["s1"]["twinspark_fabric_address"]
    with pytest.raises(nodeenv.NodeEnvError) as refused:
        nodeenv.group_envs(host_vars, names, 3, 1)
    assert any("twinspark_fabric_address: missing on rank 1" in line for line in refused.value.problems)
