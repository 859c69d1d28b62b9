"""The inventory side: the twinspark_node_env filter, playbooks/validate.yml and the serve_env role.

The role runs for real against this machine (connection local) with its directories pointed into a temporary
directory; validation on the "node" uses this checkout's own `twinspark` command.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from twinspark import apikeys, envfile, generate, recipe, settings, validate

ROOT = generate.repo_root()
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
TWINSPARK = Path(sys.executable).with_name("twinspark")


def load_filters():
    spec = importlib.util.spec_from_file_location("twinspark_filters", ROOT / "filter_plugins" / "twinspark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inventory_vars(source: Path):
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(source)])
    variables = VariableManager(loader=loader, inventory=inventory)
    hostvars = {host.name: variables.get_vars(host=host) for host in inventory.get_hosts()}
    return hostvars, inventory.get_groups_dict()


def layout_args(etc: Path, state: Path) -> list[str]:
    """The env files, the restart flag, the node's layout file and the venv (this checkout's) under tmp_path."""
    return ["-e", f"twinspark_layout_serve_env={etc}/serve.env",
            "-e", f"twinspark_layout_secrets_env={etc}/secrets.env",
            "-e", f"twinspark_layout_api_key_digests={etc}/api-keys.sha256",
            "-e", f"twinspark_layout_control_dir={state}",
            "-e", f"twinspark_layout_restart_flag={state}/restart-pending",
            "-e", f"twinspark_layout_router_drain_key={state}/router-drain.key",
            "-e", f"twinspark_layout_venv={TWINSPARK.parent.parent}",
            "-e", f"twinspark_layout_node_file={etc}/layout.json"]


def playbook(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCAL_TEMP": os.environ.get("TMPDIR", "/tmp")}
    result = subprocess.run([str(ANSIBLE_PLAYBOOK), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_filter_on_the_sim_inventory():
    filters = load_filters()
    hostvars, groups = inventory_vars(ROOT / "inventory" / "sim")
    head = filters.twinspark_node_env(hostvars["node1"], hostvars, groups)
    worker = filters.twinspark_node_env(hostvars["node2"], "node2", groups, hostvars)
    assert (head["NODE_RANK"], head["VLLM_HOST_IP"], head["MASTER_ADDR"]) == ("0", "10.77.0.1", "10.77.0.1")
    assert (worker["NODE_RANK"], worker["VLLM_HOST_IP"], worker["WORKER_HOST"]) == ("1", "10.77.0.2", "10.77.0.2")
    assert head["TWINSPARK_PROFILE"] == worker["TWINSPARK_PROFILE"] == "cpu"
    assert (head["VLLM_CPU_OMP_THREADS_BIND"], worker["VLLM_CPU_OMP_THREADS_BIND"]) == ("0", "1")
    assert head["GLOO_SOCKET_IFNAME"] == "ic0"
    for env in (head, worker):
        assert validate.validate(env).ok
    # The secrets file's knobs; the role leaves the router's admin key out of secrets.env (roles/serve_env/vars: the
    # drain reads it from its root-only file; test_the_routers_admin_key_goes_to_the_heads_drain_key_only...).
    assert filters.twinspark_env_file(head, "secrets") == {
        "VLLM_API_KEY": "twinspark-sim-test-only-key",
        "TWINSPARK_ROUTER_ADMIN_KEY": "twinspark-sim-test-only-admin-key"}
    assert "VLLM_API_KEY" not in filters.twinspark_env_file(head, "serve")


def test_filter_on_the_example_inventory_is_valid():
    filters = load_filters()
    hostvars, groups = inventory_vars(ROOT / "inventory" / "example")
    assert filters.twinspark_pair_problems(hostvars, groups) == []
    env = filters.twinspark_node_env(hostvars["spark-b"], hostvars, groups)
    assert (env["TWINSPARK_PROFILE"], env["MASTER_ADDR"], env["VLLM_HOST_IP"]) == ("gb10", "198.51.100.1",
                                                                                  "198.51.100.2")


def test_filter_reports_group_and_pair_problems():
    filters = load_filters()
    hostvars, groups = inventory_vars(ROOT / "inventory" / "sim")
    two_heads = {**groups, "twinspark_head": ["node1", "node2"], "twinspark_worker": ["node2"]}
    problems = filters.twinspark_pair_problems(hostvars, two_heads)
    assert problems[0].startswith("group twinspark_head: must hold exactly one host, the head (rank 0); it holds 2")
    assert problems[1].startswith("groups twinspark_head and twinspark_worker: node2 is in both")
    skewed = {**hostvars, "node2": {**hostvars["node2"], "twinspark_max_model_len": 1024}}
    assert filters.twinspark_pair_problems(skewed, groups) == [
        "node1, node2: twinspark_max_model_len: differs between the nodes (node1: '512', node2: '1024'); it must be "
        "the same on both, so set it for the whole pair (group_vars), not per host"]


def test_example_inventory_comments_show_the_registry_defaults():
    registry = settings.load()
    shown = {}
    for path in (ROOT / "inventory" / "example" / "group_vars" / "all").glob("*.yml"):
        for line in path.read_text().splitlines():
            if line.startswith("# twinspark_") and ": " in line and "!vault" not in line:
                name, value = line[2:].split(": ", 1)
                shown[name] = (path.stem, yaml.safe_load(value))
    assert shown, "the example inventory shows no knob"
    for name, (concern, value) in shown.items():
        knob = registry.by_var(name)
        assert knob is not None, name
        if knob.env == "NCCL_IB_GID_INDEX" or knob.type == "keys":
            continue
        assert knob.concern == concern, f"{name} belongs in {knob.concern}.yml"
        default = recipe.default_value(knob, "gb10")  # the default recipe's value, else the profile's
        assert settings.to_env_text(value) == (default or ""), name


@pytest.mark.slow(10)
@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook not installed")
def test_validate_playbook_passes_on_the_sim_inventory_and_names_a_bad_variable():
    ok = playbook("-i", "inventory/sim", "playbooks/validate.yml", check=True)
    assert "Inventory valid: head node1 (rank 0), worker node2 (rank 1), profile cpu." in ok.stdout
    bad = playbook("-i", "inventory/sim", "playbooks/validate.yml", "-e", "twinspark_mtp_num_tokens=3",
                   "-e", "twinspark_vllm_port=70000", "-e", "twinspark_vllm_api_key=-leaky-key")
    assert bad.returncode != 0
    assert "no host was touched" in bad.stdout
    assert "twinspark_vllm_port (VLLM_PORT): is not a TCP port (got '70000')" in bad.stdout
    assert "twinspark_mtp_num_tokens (MTP_NUM_TOKENS): applies only to the gb10 profile, not cpu" in bad.stdout
    assert "twinspark_vllm_api_key (VLLM_API_KEY): has a key starting with '-'" in bad.stdout
    assert "leaky" not in bad.stdout + bad.stderr


@pytest.mark.slow(60)
@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook not installed")
def test_role_renders_validated_files_atomically_and_idempotently(tmp_path):
    etc, state = tmp_path / "etc", tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)  # the restart marker's directory, left too open: the role makes it root-only again
    args = ["-i", "inventory/sim", "playbooks/serve_env.yml", "-l", "node2", "-e", "ansible_connection=local",
            "-e", "ansible_become=false", "-e", f"ansible_python_interpreter={sys.executable}",
            *layout_args(etc, state)]
    first = playbook(*args, check=True)
    # directory, layout file, the marker's directory's mode, secrets.env made empty and 0600 before its first write
    # (issue 43, row 12: never a moment with the secret under the default mode), two env files, restart marker
    assert "changed=7" in first.stdout.replace(" ", "")
    made, written = (first.stdout.index(f"TASK [serve_env : {name}]") for name in
                     ("Create secrets.env empty and root-only before its first write", "Write secrets.env"))
    assert made < written
    assert state.stat().st_mode & 0o777 == 0o700
    node_layout = json.loads((etc / "layout.json").read_text())
    assert node_layout["venv"] == str(TWINSPARK.parent.parent)
    assert node_layout["restart_flag"] == f"{state}/restart-pending"
    assert "twinspark-sim-test-only-key" not in first.stdout + first.stderr
    serve, secrets = etc / "serve.env", etc / "secrets.env"
    assert serve.stat().st_mode & 0o777 == 0o640
    assert secrets.stat().st_mode & 0o777 == 0o600
    assert (state / "restart-pending").exists()
    assert not (etc / "api-keys.sha256").exists(), "the worker serves no API: no digests file"
    text = serve.read_text()
    assert text.startswith("#")
    assert "NODE_RANK=1\n" in text and "VLLM_HOST_IP=10.77.0.2\n" in text
    assert "VLLM_USE_BREAKABLE_CUDAGRAPH=0\n" in text
    assert "VLLM_API_KEY" not in text
    assert envfile.read_files([serve, secrets]).values["VLLM_API_KEY"] == "twinspark-sim-test-only-key"
    check = subprocess.run([str(TWINSPARK), "env", "check", str(serve), str(secrets)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stderr

    (state / "restart-pending").unlink()
    again = playbook(*args, check=True)
    assert "changed=0" in again.stdout.replace(" ", "")
    assert not (state / "restart-pending").exists()

    # A drifted mode alone is put back without the restart marker: vLLM reads the files only at start.
    serve.chmod(0o644)
    secrets.chmod(0o640)
    healed = playbook(*args, check=True)
    assert "changed=2" in healed.stdout.replace(" ", ""), healed.stdout
    assert (serve.stat().st_mode & 0o777, secrets.stat().st_mode & 0o777) == (0o640, 0o600)
    assert not (state / "restart-pending").exists()

    changed = playbook(*args, "-e", "twinspark_max_model_len=256", "--diff", check=True)
    assert "MAX_MODEL_LEN=256" in serve.read_text()
    assert (state / "restart-pending").exists()
    assert "twinspark-sim-test-only-key" not in changed.stdout + changed.stderr


@pytest.mark.slow(30)
@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook not installed")
def test_the_hf_token_never_reaches_secrets_env(tmp_path):
    """Only the model download needs HF_TOKEN (role model_cache hands it to that command): secrets.env, whose copy
    becomes the vLLM unit's credential, keeps the API key and drops the token."""
    etc, state = tmp_path / "etc", tmp_path / "state"
    state.mkdir()
    token = "hf_test_only_token_that_protects_nothing"
    result = playbook("-i", "inventory/sim", "playbooks/serve_env.yml", "-l", "node1", "-e", "ansible_connection=local",
                      "-e", "ansible_become=false", "-e", f"ansible_python_interpreter={sys.executable}",
                      *layout_args(etc, state), "-e", f"twinspark_hf_token={token}", check=True)
    secrets = envfile.read_files([etc / "secrets.env"]).values
    assert secrets["VLLM_API_KEY"] == "twinspark-sim-test-only-key"
    assert "HF_TOKEN" not in secrets
    assert token not in (etc / "secrets.env").read_text() + (etc / "serve.env").read_text()
    assert token not in result.stdout + result.stderr
    # The head's patched vLLM takes its keys from their digests (docs/ROTATION.md): the key's sha256, never the key.
    digests = (etc / "api-keys.sha256").read_text()
    assert apikeys.parse(digests) == [hashlib.sha256(b"twinspark-sim-test-only-key").hexdigest()]
    assert "twinspark-sim-test-only-key" not in digests and oct((etc / "api-keys.sha256").stat().st_mode)[-3:] == "640"


def test_filter_plugin_finds_the_package_without_an_install(tmp_path):
    """A controller with only ansible and PyYAML (no twinspark installed) still loads the filter."""
    site = tmp_path / "site"
    (site / "ansible").mkdir(parents=True)
    (site / "ansible" / "__init__.py").write_text("")
    (site / "ansible" / "errors.py").write_text("class AnsibleFilterError(Exception):\n    pass\n")
    (site / "yaml").symlink_to(Path(yaml.__file__).parent)
    code = (
        "import sys; sys.path[:] = [p for p in sys.path if 'site-packages' not in p and 'python_tools' not in p]; "
        f"sys.path.insert(0, {str(site)!r}); import runpy; "
        f"module = runpy.run_path({str(ROOT / 'filter_plugins' / 'twinspark.py')!r}); "
        "print(module['nodeenv'].__file__)"
    )
    result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(ROOT / "python_tools" / "twinspark" / "nodeenv.py")


@pytest.mark.slow(45)
@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook not installed")
def test_tls_files_go_to_the_head_only_and_the_key_never_shows(tmp_path):
    """In check mode (nothing is written to this machine's /etc): with twinspark_vllm_tls_cert/_key set, the head
    would get both files and the worker would get none; the key's content never appears in the output."""
    etc, state = tmp_path / "etc", tmp_path / "state"
    state.mkdir()
    key_text = "-----BEGIN PRIVATE KEY-----\nnot-a-real-key-only-a-marker\n-----END PRIVATE KEY-----\n"
    (tmp_path / "server.key").write_text(key_text)
    (tmp_path / "server.crt").write_text("-----BEGIN CERTIFICATE-----\nmarker\n-----END CERTIFICATE-----\n")
    common = ["-i", "inventory/sim", "playbooks/serve_env.yml", "-e", "ansible_connection=local", "-e",
              "ansible_become=false", "-e", f"ansible_python_interpreter={sys.executable}",
              *layout_args(etc, state), "-e", f"twinspark_vllm_tls_cert={tmp_path}/server.crt", "-e",
              f"twinspark_vllm_tls_key={tmp_path}/server.key", "--check", "-v"]
    head = playbook(*common, "-l", "node1", check=True)
    installed = head.stdout.split("TASK [serve_env : Install the API's TLS files on the head]", 1)[1].split("TASK [")[0]
    assert installed.count("changed: [node1]") == 2, installed
    assert "not-a-real-key-only-a-marker" not in head.stdout + head.stderr
    worker = playbook(*common, "-l", "node2", check=True)
    skipped = worker.stdout.split("TASK [serve_env : Install the API's TLS files on the head]", 1)[1].split("TASK [")[0]
    assert "changed: [node2]" not in skipped and "skipping: [node2]" in skipped, skipped


@pytest.mark.parametrize(("is_head", "router_url", "drain_key"), [
    (True, "http://10.78.0.5:30000", "admin-test-only-key"), (False, "http://10.78.0.5:30000", ""),
    (True, "", "")])
def test_the_routers_admin_key_goes_to_the_heads_drain_key_only_never_to_secrets_env(is_head, router_url, drain_key):
    """roles/serve_env/vars/main.yml, rendered with plain Jinja and the real twinspark_env_file filter: secrets.env
    (the vLLM unit's credential, so readable by the serving account's process) never holds the admin key; a head
    behind a router gets it for its drain key file, a worker or a pair without a router gets none."""
    import jinja2

    role_vars = yaml.safe_load((ROOT / "roles" / "serve_env" / "vars" / "main.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(load_filters().FilterModule().filters())
    env.filters["bool"] = lambda value: str(value).lower() in ("1", "true", "yes", "on")
    env.filters["dict2items"] = lambda mapping: [{"key": k, "value": v} for k, v in mapping.items()]
    env.filters["items2dict"] = lambda items: {item["key"]: item["value"] for item in items}
    node_env = {"VLLM_API_KEY": "client-test-only-key", "TWINSPARK_ROUTER_ADMIN_KEY": "admin-test-only-key",
                "TWINSPARK_ROUTER_URL": router_url}
    values = {"serve_env_node_env": node_env, "twinspark_layout_is_head": is_head}
    secrets = env.from_string(role_vars["serve_env_secret_lines"]).render(values)
    assert "client-test-only-key" in secrets and "admin-test-only-key" not in secrets
    assert env.from_string(role_vars["serve_env_drain_key"]).render(values) == drain_key
