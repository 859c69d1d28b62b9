"""The vllm_service role's filters: how the head's API is probed, and when the pair needs an ordered restart."""

from __future__ import annotations

import importlib.util

import pytest
from test_serve_env_role import ROOT, inventory_vars, load_filters


def service_filters():
    spec = importlib.util.spec_from_file_location("twinspark_service_filters",
                                                  ROOT / "filter_plugins" / "twinspark_service.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sim_head_is_probed_on_loopback_with_the_first_key():
    hostvars, groups = inventory_vars(ROOT / "inventory" / "sim")
    head_env = load_filters().twinspark_node_env(hostvars["node1"], hostvars, groups)
    api = service_filters().twinspark_pair_api(head_env)
    assert api["url"] == "http://127.0.0.1:8888"
    assert api["served_name"] == head_env["SERVED_MODEL_NAME"]
    assert api["max_model_len"] == 512
    assert api["keyed"] is True
    assert api["headers"] == {"Authorization": f"Bearer {head_env['VLLM_API_KEY']}"}


def test_missing_served_name_fails_the_task_naming_it():
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="SERVED_MODEL_NAME"):
        service_filters().twinspark_pair_api({"VLLM_PORT": "8888"})


def units(*states):
    return {"results": [{"item": f"node{i}", "status": {"ActiveState": s}} for i, s in enumerate(states, 1)]}


def flags(*exists):
    return {"results": [{"item": f"node{i}", "stat": {"exists": e}} for i, e in enumerate(exists, 1)]}


def test_a_serving_pair_without_flags_needs_no_restart():
    assert service_filters().twinspark_pair_restart_reasons(units("active", "active"), flags(False, False)) == []


def test_a_flag_on_either_node_or_a_rank_down_asks_for_one_ordered_restart():
    reasons = service_filters().twinspark_pair_restart_reasons(units("active", "failed"), flags(False, True),
                                                              "/var/lib/twinspark/restart-pending",
                                                              "twinspark-vllm.service")
    assert reasons == ["node2: twinspark-vllm.service is failed",
                       "node2: /var/lib/twinspark/restart-pending (what vLLM runs changed)"]
