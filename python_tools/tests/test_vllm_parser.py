"""The CI proof without a GPU: vLLM 0.33.0's own code judges the gb10 argv that `twinspark serve` builds.

A throwaway venv (scripts/build-vllm-parser-venv: vllm==0.33.0 --no-deps, the CPU torch wheel from pip's
find-links, and only what vLLM's CLI import chain needs; cached under /var/tmp between runs) runs:
(1) both gb10 ranks' argv through vLLM's real `vllm serve` parser, `validate_parsed_serve_args` and
    `AsyncEngineArgs.from_cli_args`, through `twinspark runtime check`, the command the service role runs;
(2) vLLM's DeepSeek-V4 attention- and MoE-backend functions for compute capability 12.1 (SM121, GB10), with a
    hand-shaped config.json standing in for the pinned checkpoint's.
The venv build is skipped only when no CPU torch wheel is in pip's find-links (exit 3 of the script).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest

from twinspark import cli, launcher, nodeenv, recipe, validate, vllmcheck

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).parent / "fixtures" / "handshaped_deepseek_v4_flash_config.json"
GB10 = "12.1"


@pytest.fixture(scope="session")
def hf_home(tmp_path_factory) -> Path:
    """An HF_HOME holding only the pinned snapshot's config.json (the hand-shaped one), as a node's would after the
    model role ran: with HF_HUB_OFFLINE=1 vLLM resolves the model there and never reaches the network."""
    return _pinned_snapshot(tmp_path_factory.mktemp("hf"))


def _pinned_snapshot(home: Path) -> Path:
    defaults = recipe.defaults("gb10")
    from twinspark.weights import snapshot_dir

    snapshot = snapshot_dir(home, defaults["MODEL"], defaults["MODEL_REVISION"])
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(CONFIG.read_text())
    return home


def _vllm_env(hf_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "NCCL_", "HF_"))}
    env.update(PYTHONPATH=str(REPO / "python_tools"), VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR",
               HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    return env


def runtime_check(python: Path, hf_home: Path, env_file: Path, *extra: str) -> tuple[int, dict, str]:
    """`twinspark runtime check` as the service role runs it, config.json found in the pinned snapshot. vLLM's cache
    is kept beside the venv (--vllm-cache), as the recipe proofs keep it: its registry inspects a model class in a
    subprocess of its own (a second vLLM import) only the first time."""
    done = subprocess.run(
        [str(python), "-m", "twinspark.cli", "runtime", "check", "--env", str(env_file), "--capability", GB10,
         "--assume-kernels", "--json", "--vllm-cache", str(python.parents[2] / "vllm-cache"), *extra],
        capture_output=True, text=True, timeout=600, env=_vllm_env(hf_home), cwd=REPO,
    )
    assert done.stdout.strip(), done.stderr[-4000:]
    return done.returncode, json.loads(done.stdout), done.stderr


def with_runbook_kv_dtype(argv: list[str]) -> list[str]:
    """The stock argv with the DSpark runbook's nvfp4_ds_mla put back as its KV-cache dtype (deliberately wrong)."""
    out = list(argv)
    out[out.index("--kv-cache-dtype") + 1] = "nvfp4_ds_mla"
    return out


@pytest.fixture(scope="session")
def judged(vllm_python, hf_home) -> dict[str, object]:
    """vLLM's own code in the throwaway venv on argv built here, all cases in one process (vLLM imports once, the
    dearest step on this machine): case name -> vllmcheck.check's findings, plus "tls_ssl_args", what vLLM's serve
    parser puts into ssl_certfile, ssl_keyfile, ssl_ca_certs and enable_ssl_refresh for the TLS head's argv."""
    config = json.loads(CONFIG.read_text())
    clamped = {**config, "swiglu_limit": 10.0,
               "quantization_config": {**config["quantization_config"], "moe_quant_algo": "NVFP4"}}
    stock = gb10_argv(0)
    cases = {
        "nvfp4_ds_mla_under_stock": (with_runbook_kv_dtype(stock), config),
        "parser_rejects_a_value": (stock + ["--max-num-seqs", "six"], config),
        "unclamped_nvfp4_backend": (stock + ["--moe-backend", "flashinfer_b12x"], clamped),
        "tls_head": (tls_head_argv(), config),
    }
    script = ("import json, sys; from twinspark import vllmcheck; "
              "from vllm.utils.argparse_utils import FlexibleArgumentParser; cases = json.load(sys.stdin); "
              "out = {name: [str(f) for f in vllmcheck.check(argv, config, (12, 1), assume_kernels=True).findings] "
              "for name, (argv, config) in cases.items()}; "
              "parser = FlexibleArgumentParser(prog='vllm'); sub = parser.add_subparsers(dest='subparser'); "
              "vllmcheck._serve_cli_args().make_arg_parser(sub.add_parser('serve', prog='vllm serve')); "
              "args = parser.parse_args(['serve', *cases['tls_head'][0]]); "
              "out['tls_ssl_args'] = [args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs, "
              "args.enable_ssl_refresh]; "
              "print(json.dumps(out))")
    done = subprocess.run([str(vllm_python), "-c", script], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=600, env=_vllm_env(hf_home))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def env_file(tmp_path: Path, rank: int, extra: str = "", hf_home: Path | None = None) -> Path:
    serve, secrets = nodeenv.example_env("gb10", rank)
    if hf_home is not None:
        serve["HF_HOME"] = str(hf_home)
    path = tmp_path / f"gb10-{rank}.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in {**serve, **secrets}.items()) + extra)
    path.chmod(0o600)
    return path


def gb10_argv(rank: int) -> list[str]:
    serve, secrets = nodeenv.example_env("gb10", rank)
    result = validate.validate({**serve, **secrets})
    assert result.ok, result.problems
    return launcher.build_command(result.values, result.others).argv[1 + len(launcher.VLLM_ENTRY):]


@pytest.mark.slow(35)
@pytest.mark.parametrize("rank", [0, 1])
def test_stock_gb10_rank_passes_vllm_0_33_0_parser_and_sm121_backends(vllm_python, hf_home, tmp_path, rank):
    code, report, err = runtime_check(vllm_python, hf_home, env_file(tmp_path, rank, hf_home=hf_home))
    print(f"rank {rank}: " + "; ".join(report["checked"] + report["notes"]))
    assert code == 0, err
    assert report["ok"] and report["findings"] == []
    assert report["flavour"] == "stock" and report["capability"] == GB10
    assert report["model_config"].endswith("/snapshots/" + recipe.defaults("gb10")["MODEL_REVISION"]
                                           + "/config.json")
    assert report["account"] == pwd.getpwuid(os.geteuid()).pw_name and report["uid"] == os.geteuid()
    checked = "\n".join(report["checked"])
    assert "validate_parsed_serve_args passed" in checked
    assert "AsyncEngineArgs.from_cli_args passed" in checked
    assert "DeepseekV4FlashInferSM120Attention -> FLASHINFER_MLA_SPARSE_DSV4" in checked
    assert "accepts kv_cache_dtype=fp8_ds_mla" in checked
    assert "mxfp4 experts, moe_backend=auto" in checked


@pytest.mark.slow(35)
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("unshare"),
                    reason="needs root, setpriv and unshare to become another account in a network namespace")
@pytest.mark.ci_may_skip("CI's Python lives under /root (pyenv), which the unprivileged account cannot enter: no tool "
                         "is missing")
def test_the_check_passes_as_an_unprivileged_account_without_network_with_secrets_as_a_credential(vllm_python):
    """What the transient unit gives the check, short of systemd itself (twinspark.runtime.sandbox): another account
    (nobody), no network (a namespace of the test's own, lo down), a HOME it cannot write, serve.env readable,
    secrets.env root's alone at its path and handed over as a credential the way LoadCredential= does. The check must
    still judge the flags, and say who it ran as."""
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--no-new-privs",
                 "--inh-caps=-all", "--bounding-set=-all", "--"]
    # vLLM inspects the model in a child of sys.executable, which nobody must be able to start too
    probe = subprocess.run([*as_nobody, str(vllm_python), "-I", "-c",
                            "import subprocess, sys; subprocess.run([sys.executable, '-c', ''], check=True)"],
                           capture_output=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"nobody may not run {vllm_python} (its interpreter is {os.path.realpath(vllm_python)})")
    shared = Path(tempfile.mkdtemp(prefix="twinspark-unprivileged-check-"))
    try:
        shared.chmod(0o755)
        hf_home = _pinned_snapshot(shared / "hf")
        serve, secrets = nodeenv.example_env("gb10", 0)
        serve["HF_HOME"] = str(hf_home)
        etc, credentials = shared / "etc", shared / "credentials"
        etc.mkdir()
        credentials.mkdir()
        for path, values, mode in ((etc / "serve.env", serve, 0o644), (etc / "secrets.env", secrets, 0o600),
                                   (credentials / "secrets.env", secrets, 0o400)):
            path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
            path.chmod(mode)
        nobody = pwd.getpwnam("nobody")
        os.chown(credentials / "secrets.env", nobody.pw_uid, nobody.pw_gid)
        env = {**_vllm_env(hf_home), "CREDENTIALS_DIRECTORY": str(credentials), "HOME": str(shared)}
        done = subprocess.run(
            ["unshare", "-n", *as_nobody, str(vllm_python), "-m", "twinspark.cli", "runtime", "check",
             "--env", str(etc / "serve.env"), "--env", str(etc / "secrets.env"), "--capability", GB10,
             "--assume-kernels", "--json"],
            capture_output=True, text=True, timeout=600, env=env, cwd=shared)
        assert done.stdout.strip(), done.stderr[-4000:]
        report = json.loads(done.stdout)
        assert done.returncode == 0, done.stderr[-4000:]
        assert report["account"] == "nobody" and report["uid"] == nobody.pw_uid
        assert not any(note.startswith("ran as root") for note in report["notes"])
        assert "AsyncEngineArgs.from_cli_args passed" in report["checked"]
    finally:
        shutil.rmtree(shared)


def test_the_account_is_named_or_numbered():
    from twinspark.runtime import installed

    assert installed.running_as(os.geteuid()) == pwd.getpwuid(os.geteuid()).pw_name
    unused = next(n for n in range(60000, 65000) if n not in {entry.pw_uid for entry in pwd.getpwall()})
    assert installed.running_as(unused) == str(unused)


@pytest.mark.slow(45)
def test_nvfp4_ds_mla_as_the_stock_default_fails_with_vllms_reason(judged):
    findings = judged["nvfp4_ds_mla_under_stock"]
    print("\n".join(findings))
    assert any(line.startswith("--kv-cache-dtype: ") and "only supports fp8 kv-cache, got nvfp4_ds_mla" in line
               for line in findings), findings
    assert any("FLASHINFER_MLA_SPARSE_DSV4 refuses kv_cache_dtype=nvfp4_ds_mla on SM121: kv_cache_dtype not "
               "supported" in line for line in findings), findings


@pytest.mark.slow(35)
def test_fork_flags_on_stock_vllm_fail_naming_each_flag(vllm_python, hf_home, tmp_path):
    path = env_file(tmp_path, 1, "TWINSPARK_RUNTIME_FLAVOUR=fork\n", hf_home=hf_home)
    code, report, err = runtime_check(vllm_python, hf_home, path)
    print(err)
    assert code == 1
    flags = {finding["flag"] for finding in report["findings"]}
    assert flags == {"--kv-cache-dtype", "--moe-backend"}
    assert "moe_backend='flashinfer_b12x' is not supported for MXFP4 MoE" in err
    assert "rank 1 (fork runtime)" in err


def test_a_value_vllms_parser_rejects_names_the_flag(judged):
    findings = judged["parser_rejects_a_value"]
    assert len(findings) == 1, findings
    assert findings[0].startswith("--max-num-seqs: vLLM's argument parser: ")
    assert "'six'" in findings[0]


def test_an_explicit_nvfp4_moe_backend_without_clamp_is_refused_for_a_clamped_model(judged):
    assert judged["unclamped_nvfp4_backend"] == [
        "--moe-backend: vLLM refuses it for nvfp4 experts: Model sets swiglu_limit=10.0, but the explicitly "
        "requested moe_backend='flashinfer_b12x' does not apply the SwiGLU clamp"]


TLS_LINES = ("TWINSPARK_VLLM_TLS_CERT=/etc/twinspark/tls/server.crt\n"
             "TWINSPARK_VLLM_TLS_KEY=/etc/twinspark/tls/server.key\nTWINSPARK_VLLM_TLS_CA=/etc/twinspark/tls/ca.crt\n")


def tls_head_argv() -> list[str]:
    """The head's argv with the API's TLS on, as the launcher builds it from the env files."""
    serve, secrets = nodeenv.example_env("gb10", 0)
    values = validate.validate({**serve, **secrets, **dict(line.split("=", 1) for line in TLS_LINES.split())}).values
    return launcher.build_command(values).argv[1 + len(launcher.VLLM_ENTRY):]


def test_tls_on_the_head_is_vllms_own_ssl_flags(judged):
    """The head's argv with TLS on passes vLLM 0.33.0's checks (the ones `twinspark runtime check` runs), and
    vLLM's own parser puts the two files into its ssl_certfile/ssl_keyfile (the API server's TLS), nothing into
    ssl_ca_certs (no client certificates), and turns on its certificate refresher (enable_ssl_refresh: the files
    are reloaded when they change, which `twinspark rotate tls` relies on)."""
    assert judged["tls_head"] == []
    assert judged["tls_ssl_args"] == ["/etc/twinspark/tls/server.crt", "/etc/twinspark/tls/server.key", None, True]


# ---- no vLLM needed below: the glue's own rules and the command's input handling


def test_expert_format_follows_vllms_deepseek_v4_dispatch():
    base = json.loads(CONFIG.read_text())
    assert vllmcheck.expert_format(base) == "mxfp4"
    assert vllmcheck.expert_format({**base, "expert_dtype": "fp8"}) == "fp8"
    nvfp4 = {**base, "quantization_config": {"moe_quant_algo": "nvfp4"}}
    assert vllmcheck.expert_format(nvfp4) == "nvfp4"
    assert vllmcheck.expert_format({"model_type": "llama"}) is None


def test_flag_value_takes_the_last_occurrence_as_argparse_does():
    assert vllmcheck.flag_value(["--moe-backend", "a", "--x", "--moe-backend=b"], "--moe-backend") == "b"
    assert vllmcheck.flag_value(["--moe-backend"], "--moe-backend") is None


def test_runtime_check_bad_env_is_exit_2(tmp_path, capsys):
    path = env_file(tmp_path, 0, "MAX_NUM_SEQS=many\n")
    assert cli.main(["runtime", "check", "--env", str(path)]) == 2
    assert "MAX_NUM_SEQS: is not a whole number" in capsys.readouterr().err


def test_runtime_check_bad_capability_is_exit_2(tmp_path, capsys):
    assert cli.main(["runtime", "check", "--env", str(env_file(tmp_path, 0)), "--capability", "sm121"]) == 2
    assert "--capability 'sm121': expected MAJOR.MINOR" in capsys.readouterr().err


@pytest.mark.skipif(bool(__import__("importlib.util").util.find_spec("vllm")), reason="vLLM is installed here")
def test_runtime_check_without_vllm_is_exit_1_naming_the_venv(tmp_path, capsys):
    code = cli.main(["runtime", "check", "--env", str(env_file(tmp_path, 0)), "--no-gpu"])
    assert code == 1
    assert "vLLM is not importable here" in capsys.readouterr().err


def test_vllms_cache_is_scratch_unless_the_caller_names_its_own(tmp_path, monkeypatch):
    """--vllm-cache moves only VLLM_CACHE_ROOT, and only when given; the other caches stay in the scratch."""
    seen: list[dict[str, str]] = []

    class Judged(Exception):
        pass

    def judge(*_args, **_kwargs):
        seen.append({key: os.environ[key] for key in ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME")})
        raise Judged

    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setattr(vllmcheck, "check", judge)
    for extra in ([], ["--vllm-cache", str(tmp_path / "cache")]):
        with pytest.raises(Judged):
            cli.main(["runtime", "check", "--env", str(env_file(tmp_path, 0)), "--capability", GB10, *extra])
    scratch = Path(seen[0]["XDG_CACHE_HOME"]).parent
    assert scratch.name.startswith("twinspark-runtime-check-") and not scratch.exists()
    assert seen[0]["VLLM_CACHE_ROOT"] == str(scratch / "vllm_cache_root")
    assert seen[1]["VLLM_CACHE_ROOT"] == str(tmp_path / "cache")
    assert Path(seen[1]["XDG_CACHE_HOME"]).parent.name.startswith("twinspark-runtime-check-")


def test_model_config_path_is_the_pinned_snapshot_or_the_local_directory():
    from twinspark.runtime import installed

    values = {"MODEL": "org/name", "MODEL_REVISION": "abc", "HF_HOME": "/hf"}
    assert str(installed.model_config_path(values)) == "/hf/hub/models--org--name/snapshots/abc/config.json"
    assert str(installed.model_config_path({"MODEL": "/m"})) == "/m/config.json"
    assert installed.model_config_path({"MODEL": "org/name", "MODEL_REVISION": ""}) is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
