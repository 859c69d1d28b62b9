"""A node's env from inventory values: head/worker derivation, per-node overrides, every problem at once."""

from __future__ import annotations

import pytest

from twinspark import nodeenv

HEAD, WORKER = "198.51.100.1", "198.51.100.2"


def test_head_and_worker_are_derived_from_rank_and_fabric_addresses():
    head, _ = nodeenv.node_env({}, 0, HEAD, WORKER)
    worker, _ = nodeenv.node_env({}, 1, HEAD, WORKER)
    for env, rank, own in ((head, "0", HEAD), (worker, "1", WORKER)):
        assert (env["NODE_RANK"], env["MASTER_ADDR"], env["WORKER_HOST"], env["VLLM_HOST_IP"]) == (
            rank, HEAD, WORKER, own)
    assert head["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"


def test_inventory_values_by_variable_or_env_name_are_normalised():
    knobs = {"twinspark_profile": "cpu", "twinspark_enforce_eager": False, "MAX_NUM_SEQS": 4,
             "twinspark_vllm_port": "08080", "twinspark_dspark_api_keys": ["k1", "k2"],
             "twinspark_vllm_use_breakable_cudagraph": True}
    serve, secrets = nodeenv.node_env(knobs, 1, HEAD, WORKER)
    assert serve["TWINSPARK_PROFILE"] == "cpu"
    assert serve["ENFORCE_EAGER"] == "0"
    assert serve["MAX_NUM_SEQS"] == "4"
    assert serve["VLLM_PORT"] == "8080"
    assert serve["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "1"
    assert serve["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert secrets == {"DSPARK_API_KEYS": "k1 k2"}
    assert "DSPARK_API_KEYS" not in serve


def test_yaml_off_for_thinking_means_off():
    serve, _ = nodeenv.node_env({"twinspark_default_thinking": False}, 0, HEAD, WORKER)
    assert serve["DEFAULT_THINKING"] == "off"


def test_per_node_override_for_the_worker_twin_ports():
    serve, _ = nodeenv.node_env({"twinspark_nccl_ib_hca": "=rocep1s0f0,roceP2p1s0f0"}, 1, HEAD, WORKER,
                                {"twinspark_nccl_ib_hca": "=rocep1s0f1,roceP2p1s0f1"})
    assert serve["NCCL_IB_HCA"] == "=rocep1s0f1,roceP2p1s0f1"


def test_every_problem_is_named_by_its_inventory_variable():
    knobs = {"twinspark_mtp_num_tokens": 3, "twinspark_master_addr": "192.0.2.1", "twinspark_max_num_seq": 8,
             "twinspark_vllm_api_key": "secret-value-1234"}
    with pytest.raises(nodeenv.NodeEnvError) as caught:
        nodeenv.node_env(knobs, 0, HEAD, "", {"twinspark_max_num_seqs": 2})
    problems = caught.value.problems
    assert problems == [
        "twinspark_master_addr: is derived from twinspark_fabric_address and the inventory groups; remove it from "
        "the inventory",
        "twinspark_max_num_seq: unknown variable; did you mean twinspark_max_num_seqs?",
        "twinspark_max_num_seqs: must be the same on both nodes; set it for the whole pair (group_vars), not per host",
        "twinspark_fabric_address: missing on the worker; set the node's own fabric address as a host variable",
        "twinspark_mtp_num_tokens (MTP_NUM_TOKENS): must be at least 5 (got '3') (allowed: integer >= 5)",
    ]
    assert "secret-value-1234" not in str(caught.value)


def test_unrelated_project_variables_are_ignored():
    serve, _ = nodeenv.node_env({"twinspark_health_interval": 30, "twinspark_layout_venv": "/x"}, 0, HEAD, WORKER)
    assert "twinspark_health_interval" not in serve
