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


UNIT, FLAG = "twinspark-vllm.service", "/var/lib/twinspark/restart-pending"


def probes(states, exists):
    """A twinspark_probe loop over node1, node2 (units: the rank's, paths: the restart flag)."""
    nodes = enumerate(zip(states, exists, strict=True), 1)
    return {"results": [{"item": f"node{i}", "units": {UNIT: {"load": "loaded", "active": s, "enabled": "enabled"}},
                         "paths": {FLAG: {"exists": e}}} for i, (s, e) in nodes]}


def test_a_serving_pair_without_flags_needs_no_restart():
    assert service_filters().twinspark_pair_restart_reasons(probes(["active", "active"], [False, False]), FLAG,
                                                            UNIT) == []


def test_a_flag_on_either_node_or_a_rank_down_asks_for_one_ordered_restart():
    reasons = service_filters().twinspark_pair_restart_reasons(probes(["active", "failed"], [False, True]), FLAG,
                                                              UNIT)
    assert reasons == ["node2: twinspark-vllm.service is failed",
                       "node2: /var/lib/twinspark/restart-pending (what vLLM runs changed)"]


def test_a_node_whose_probe_lacks_the_unit_or_the_flag_is_never_taken_as_serving():
    answer = probes(["active", "active"], [False, False])
    del answer["results"][0]["units"][UNIT]
    del answer["results"][1]["paths"][FLAG]
    assert service_filters().twinspark_pair_restart_reasons(answer, FLAG, UNIT) == [
        "node1: twinspark-vllm.service is unknown", f"node2: {FLAG} could not be read"]
