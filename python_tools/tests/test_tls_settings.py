"""The TLS settings (twinspark_vllm_tls_cert/_key/_ca): inventory rules, the controller's file checks, what the
head gets and the vLLM argv it leads to."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from twinspark import api, launcher, nodeenv, settings, tls, validate

HEAD, WORKER = "10.0.0.1", "10.0.0.2"
ON = {"twinspark_profile": "cpu", "twinspark_vllm_tls_cert": "/inv/server.crt",
      "twinspark_vllm_tls_key": "/inv/server.key"}


def problems_of(knobs: dict, rank: int = 0) -> list[str]:
    with pytest.raises(nodeenv.NodeEnvError) as caught:
        nodeenv.node_env(knobs, rank, HEAD, WORKER)
    return caught.value.problems


def test_the_head_env_names_its_own_copies_and_the_worker_gets_none():
    serve, _ = nodeenv.node_env({**ON, "twinspark_vllm_tls_ca": "/inv/ca.crt"}, 0, HEAD, WORKER)
    assert {k: v for k, v in serve.items() if "TLS" in k} == {
        "TWINSPARK_VLLM_TLS_CERT": "/etc/twinspark/tls/server.crt",
        "TWINSPARK_VLLM_TLS_KEY": "/etc/twinspark/tls/server.key",
        "TWINSPARK_VLLM_TLS_CA": "/etc/twinspark/tls/ca.crt"}
    worker, _ = nodeenv.node_env(ON, 1, HEAD, WORKER)
    assert not [k for k in worker if "TLS" in k]


def test_off_by_default():
    serve, _ = nodeenv.node_env({"twinspark_profile": "cpu"}, 0, HEAD, WORKER)
    assert not [k for k in serve if "TLS" in k]
    assert api.url_from_env(serve).startswith("http://")


def test_certificate_without_key_names_the_missing_variable_and_the_fix():
    problems = problems_of({"twinspark_profile": "cpu", "twinspark_vllm_tls_cert": "/inv/server.crt"})
    assert problems == ["twinspark_vllm_tls_key (TWINSPARK_VLLM_TLS_KEY): must be set together with "
                        "TWINSPARK_VLLM_TLS_CERT (TLS needs both the certificate and its key); set both, or neither "
                        "for plain HTTP"]


def test_a_ca_without_tls_is_refused():
    problems = problems_of({"twinspark_profile": "cpu", "twinspark_vllm_tls_ca": "/inv/ca.crt"})
    assert len(problems) == 1 and problems[0].startswith("twinspark_vllm_tls_ca (TWINSPARK_VLLM_TLS_CA): is set but "
                                                         "TLS is off")


def test_a_relative_controller_path_is_one_line_with_the_fix():
    problems = problems_of({**ON, "twinspark_vllm_tls_key": "tls/server.key"})
    assert problems == ["twinspark_vllm_tls_key: must be an absolute path to a file on the controller (got "
                        "'tls/server.key'); write it as \"{{ inventory_dir }}/tls/server.key\" to keep it beside the "
                        "inventory"]


def test_both_nodes_of_a_pair_with_tls_are_valid_together():
    hosts = {name: {**ON, "twinspark_fabric_address": address} for name, address in (("h", HEAD), ("w", WORKER))}
    envs = nodeenv.pair_envs(hosts, "h", "w")
    assert "TWINSPARK_VLLM_TLS_CERT" in envs["h"][0] and "TWINSPARK_VLLM_TLS_CERT" not in envs["w"][0]


def test_vllm_gets_its_own_tls_flags_on_the_head_only_and_never_the_ca():
    values = validate.validate(nodeenv.node_env({**ON, "twinspark_vllm_tls_ca": "/inv/ca.crt"}, 0, HEAD,
                                                WORKER)[0]).values
    command = launcher.build_command(values)
    argv = command.argv
    assert argv[argv.index("--ssl-certfile") + 1] == "/etc/twinspark/tls/server.crt"
    assert argv[argv.index("--ssl-keyfile") + 1] == "/etc/twinspark/tls/server.key"
    assert "/etc/twinspark/tls/ca.crt" not in argv and "TWINSPARK_VLLM_TLS_CA" not in command.env
    assert "TWINSPARK_VLLM_TLS_CA" in command.unset
    worker = launcher.build_command(validate.validate(nodeenv.node_env(ON, 1, HEAD, WORKER)[0]).values).argv
    assert "--ssl-certfile" not in worker and "--ssl-keyfile" not in worker


def test_a_tls_head_reloads_its_certificate_when_the_files_change_and_a_plain_head_has_no_refresher():
    """`twinspark rotate tls` needs vLLM's certificate refresher; it comes with the certificate, never alone."""
    head = launcher.build_command(validate.validate(nodeenv.node_env(ON, 0, HEAD, WORKER)[0]).values).argv
    assert head.count("--enable-ssl-refresh") == 1
    plain = launcher.build_command(validate.validate(nodeenv.node_env({}, 0, HEAD, WORKER)[0]).values).argv
    worker = launcher.build_command(validate.validate(nodeenv.node_env(ON, 1, HEAD, WORKER)[0]).values).argv
    assert "--enable-ssl-refresh" not in plain and "--enable-ssl-refresh" not in worker


def test_every_installed_knob_is_a_head_file_with_a_bound():
    knobs = tls.installed_knobs()
    assert [k.var for k in knobs] == ["twinspark_vllm_tls_cert", "twinspark_vllm_tls_key", "twinspark_vllm_tls_ca"]
    key = settings.load()["TWINSPARK_VLLM_TLS_KEY"].installed_as
    assert key is not None and key.mode == "0640" and key.path.startswith("/etc/twinspark/tls/")


# ---- the controller's look at the files --------------------------------------------------------------------------


def knob(env: str) -> settings.Knob:
    return settings.load()[env]


def test_file_problem_rules():
    cert = knob("TWINSPARK_VLLM_TLS_CERT")
    regular, directory = 0o100644, 0o040755
    pem = b"-----BEGIN CERTIFICATE-----\n"
    assert tls.file_problem(cert, "/c", regular, 600, pem) is None
    assert tls.file_problem(cert, "/c", None, None, b"") == ("twinspark_vllm_tls_cert: /c does not exist on the "
                                                             "controller; fix the path, or unset it")
    assert "is not a regular file" in tls.file_problem(cert, "/c", directory, 4096, b"")
    assert "more than the 1048576" in tls.file_problem(cert, "/c", regular, 2 << 20, b"")
    assert "holds no PEM CERTIFICATE block" in tls.file_problem(cert, "/c", regular, 10, b"hello")
    key = knob("TWINSPARK_VLLM_TLS_KEY")
    assert tls.file_problem(key, "/k", regular, 200, b"-----BEGIN EC PRIVATE KEY-----\n") is None
    assert "encrypted key" in tls.file_problem(key, "/k", regular, 200, b"-----BEGIN ENCRYPTED PRIVATE KEY-----\n")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")
def test_controller_problems_on_real_files(tmp_path):
    cert, key = tmp_path / "a.crt", tmp_path / "a.key"
    tls.make_cert(cert, key, ["head.example"], days=1)
    other_cert, other_key = tmp_path / "b.crt", tmp_path / "b.key"
    tls.make_cert(other_cert, other_key, [], days=1)
    good = {"twinspark_vllm_tls_cert": str(cert), "twinspark_vllm_tls_key": str(key)}
    assert tls.controller_problems(good) == []
    assert tls.controller_problems({**good, "twinspark_vllm_tls_ca": str(other_cert)}) == []
    mismatched = tls.controller_problems({**good, "twinspark_vllm_tls_key": str(other_key)})
    assert len(mismatched) == 1 and mismatched[0].startswith(f"twinspark_vllm_tls_key: {other_key} does not load "
                                                             f"with {cert}")
    missing = tls.controller_problems({**good, "twinspark_vllm_tls_ca": str(tmp_path / "nope.crt")})
    assert missing == [f"twinspark_vllm_tls_ca: {tmp_path / 'nope.crt'} does not exist on the controller; fix the "
                       "path, or unset it"]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "is not a regular file" in tls.controller_problems({**good, "twinspark_vllm_tls_cert": str(fifo)})[0]
    assert tls.controller_problems({}) == []


def test_installed_files_tell_the_role_what_to_copy_and_what_to_remove():
    head_env, _ = nodeenv.node_env(ON, 0, HEAD, WORKER)
    files = tls.installed_files(ON, head_env)
    assert [(f["src"], f["dest"], f["mode"]) for f in files] == [
        ("/inv/server.crt", "/etc/twinspark/tls/server.crt", "0644"),
        ("/inv/server.key", "/etc/twinspark/tls/server.key", "0640"),
        (None, "/etc/twinspark/tls/ca.crt", "0644")]
    worker_env, _ = nodeenv.node_env(ON, 1, HEAD, WORKER)
    assert all(f["src"] is None for f in tls.installed_files(ON, worker_env))


def test_the_inventory_validation_filter_reports_tls_files_on_the_controller(tmp_path):
    import importlib.util

    from twinspark import generate

    spec = importlib.util.spec_from_file_location("twinspark_filters_tls",
                                                  generate.repo_root() / "filter_plugins" / "twinspark.py")
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    tls_vars = {**ON, "twinspark_vllm_tls_cert": str(tmp_path / "gone.crt"),
                "twinspark_vllm_tls_key": str(tmp_path / "gone.key")}
    hostvars = {"h": {**tls_vars, "twinspark_fabric_address": HEAD},
                "w": {**tls_vars, "twinspark_fabric_address": WORKER}}
    groups = {"all": ["h", "w"], "twinspark_head": ["h"], "twinspark_worker": ["w"]}
    assert filters.twinspark_pair_problems(hostvars, groups) == [
        f"h: twinspark_vllm_tls_cert: {tmp_path / 'gone.crt'} does not exist on the controller; fix the path, or "
        "unset it",
        f"h: twinspark_vllm_tls_key: {tmp_path / 'gone.key'} does not exist on the controller; fix the path, or "
        "unset it"]
    files = filters.twinspark_tls_files(hostvars["h"], filters.twinspark_node_env(hostvars["h"], "h", groups, hostvars))
    assert [f["dest"] for f in files if f["src"]] == ["/etc/twinspark/tls/server.crt", "/etc/twinspark/tls/server.key"]


def _leaf_signed_by(ca: Path, ca_key: Path, name: str, where: Path) -> Path:
    """A leaf certificate for `name` signed with the self-signed certificate's own key, as a thief of that key would."""
    key, request, leaf = where / f"{name}.key", where / f"{name}.csr", where / f"{name}.crt"
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(request), "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name}"], check=True, capture_output=True, timeout=60)
    subprocess.run(["openssl", "x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key),
                    "-CAcreateserial", "-days", "1", "-out", str(leaf), "-copy_extensions", "copy"],
                   check=True, capture_output=True, timeout=60)
    return leaf


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")
def test_the_self_signed_certificate_can_sign_for_its_own_names_only(tmp_path):
    """Issue 43: the helper's certificate is a CA (clients trust it as their CA file) and its key is readable by the
    serving account; name constraints keep that key from signing for any other name."""
    ca, ca_key = tmp_path / "pair.crt", tmp_path / "pair.key"
    tls.make_cert(ca, ca_key, ["head.example"], days=1)

    def verify(leaf: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["openssl", "verify", "-CAfile", str(ca), str(leaf)], capture_output=True, text=True,
                              timeout=60, check=False)

    assert verify(_leaf_signed_by(ca, ca_key, "head.example", tmp_path)).returncode == 0
    refused = verify(_leaf_signed_by(ca, ca_key, "bank.example", tmp_path))
    assert refused.returncode != 0 and "permitted subtree violation" in refused.stdout + refused.stderr
