"""twinspark.inventory: the controller's one reading of the pair's inventory (head, worker, API URL), shared by
`twinspark health`, `bench` and the playbook verbs."""

from __future__ import annotations

import pytest
from test_health_remote import INVENTORY, write

from twinspark import inventory, nodeenv


def test_the_api_port_is_read_like_the_env_file_reads_it(tmp_path):
    """A quoted port, as YAML often carries it, is the same port the launcher binds: normalised through nodeenv."""
    pair = inventory.read_inventory(write(tmp_path, INVENTORY.replace("twinspark_vllm_port: 8899",
                                                                      "twinspark_vllm_port: ' 08899 '")))
    assert pair.api_url == "http://10.78.0.1:8899"


@pytest.mark.parametrize("port", ["99999", "http", "0"])
def test_an_invalid_api_port_is_named_by_its_inventory_variable_with_the_allowed_range(tmp_path, port):
    with pytest.raises(inventory.InventoryError, match=r"twinspark_vllm_port: is not a TCP port.*1-65535"):
        inventory.read_inventory(write(tmp_path, INVENTORY.replace("twinspark_vllm_port: 8899",
                                                                   f"twinspark_vllm_port: '{port}'")))


def test_the_head_and_worker_rule_is_the_one_the_ansible_filters_apply(tmp_path):
    """The same host in both groups is refused by the controller exactly as by the playbooks' filter."""
    text = INVENTORY.replace("        twinspark_worker:\n          hosts:\n            node2:",
                             "        twinspark_worker:\n          hosts:\n            node1:")
    groups = {"twinspark_head": ["node1"], "twinspark_worker": ["node1"]}
    [expected] = nodeenv.group_problems(groups)
    with pytest.raises(inventory.InventoryError) as raised:
        inventory.read_inventory(write(tmp_path, text))
    assert str(raised.value).endswith(expected)
    with pytest.raises(nodeenv.NodeEnvError):
        nodeenv.pair_hosts(groups)
    assert nodeenv.pair_hosts({"twinspark_head": ["a"], "twinspark_worker": ["b"], "all": ["a", "b"]}) == ("a", "b")


def test_head_setting_falls_back_to_the_registry_default_for_the_hosts_profile():
    assert nodeenv.head_setting({}, "VLLM_PORT") == "8888"
    assert nodeenv.head_setting({"twinspark_profile": "cpu", "twinspark_max_model_len": None}, "MAX_MODEL_LEN") == "512"
    assert nodeenv.head_setting({"twinspark_max_model_len": "4096"}, "MAX_MODEL_LEN") == "4096"


def test_the_commands_read_the_inventory_from_its_own_module_not_from_health():
    """bench, the front door and the guard reach the inventory and SSH through twinspark.inventory; only health's
    own command (the closing table) is asked of health/."""
    import ast
    from pathlib import Path

    package = Path(inventory.__file__).parent
    for name in ("bench.py", "frontdoor.py", "pair/io.py", "pair/lifecycle.py", "pair/guard.py", "pair/cli.py",
                 "pair/rules.py"):
        tree = ast.parse((package / name).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        imported |= {f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     and node.module == "twinspark.health" for alias in node.names}
        assert not {"twinspark.health.remote", "twinspark.health.gather"} & imported, name
