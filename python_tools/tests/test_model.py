"""Model weights: verification, manifest, offline refs, disk-space check and hub download arguments.

Nothing here reaches the hub. The hub's metadata call is answered by `fake_hub_*` objects built from
huggingface_hub's own RepoSibling/BlobLfsInfo classes; downloads are asserted NOT to happen.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from twinspark import cli, weights

SECRET_TOKEN = "hf_do_not_print_me_0123456789"


def write_safetensors(path: Path, tensor_bytes: dict[str, int]) -> int:
    """A real safetensors file (uint8 tensors) of the given sizes; returns its size."""
    header, offset = {}, 0
    for name, size in tensor_bytes.items():
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(range(256)) * (offset // 256) + b"\x07" * (offset % 256))
    return path.stat().st_size


def make_sharded_model(root: Path, shards: int = 3) -> list[str]:
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    weight_map = {}
    for i, name in enumerate(names):
        write_safetensors(root / name, {f"layer{i}.w": 1000 + i, f"layer{i}.b": 24})
        weight_map.update({f"layer{i}.w": name, f"layer{i}.b": name})
    (root / weights.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text('{"model_type": "llama"}')
    return names


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["model", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- verification -------------------------------------------------------------------------------------------


def test_complete_sharded_model_verifies(tmp_path, capsys):
    make_sharded_model(tmp_path)
    code, out, _ = run_cli(capsys, "verify", str(tmp_path))
    assert code == 0
    assert "ok: 3 shard(s)" in out


def test_missing_and_short_shards_are_named_and_exit_1(tmp_path, capsys):
    names = make_sharded_model(tmp_path)
    (tmp_path / names[0]).unlink()
    shard = tmp_path / names[2]
    shard.write_bytes(shard.read_bytes()[:-100])

    code, out, _ = run_cli(capsys, "verify", str(tmp_path))

    assert code == 1
    assert f"{names[0]}: missing" in out
    assert f"{names[2]}: short" in out
    assert names[1] not in out


def test_short_shard_detected_from_its_header_without_a_manifest(tmp_path):
    write_safetensors(tmp_path / weights.SINGLE_SHARD_NAME, {"w": 4096})
    path = tmp_path / weights.SINGLE_SHARD_NAME
    full = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-1])

    report = weights.verify_model_dir(tmp_path)

    assert [(p.name, p.kind, p.detail) for p in report.problems] == [
        (weights.SINGLE_SHARD_NAME, "short", f"{full - 1} of {full} bytes")
    ]


def test_shard_cut_inside_its_header_is_reported(tmp_path):
    write_safetensors(tmp_path / weights.SINGLE_SHARD_NAME, {"w": 64})
    (tmp_path / weights.SINGLE_SHARD_NAME).write_bytes(b"\x10\x00")
    report = weights.verify_model_dir(tmp_path)
    assert [(p.name, p.kind) for p in report.problems] == [(weights.SINGLE_SHARD_NAME, "unreadable header")]


def test_more_than_twenty_problems_lists_twenty_names_and_counts_the_rest(tmp_path, capsys):
    names = make_sharded_model(tmp_path, shards=25)
    for name in names:
        (tmp_path / name).unlink()

    code, out, _ = run_cli(capsys, "verify", str(tmp_path))

    assert code == 1
    listed = [line for line in out.splitlines() if line.strip().endswith(": missing")]
    assert len(listed) == weights.MAX_LISTED_PROBLEMS
    assert "and 5 more" in out
    code, out, _ = run_cli(capsys, "verify", str(tmp_path), "--json")
    assert sorted(json.loads(out)["problem_names"]) == sorted(names)


def test_directory_without_index_or_single_shard_fails(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    code, out, _ = run_cli(capsys, "verify", str(tmp_path))
    assert code == 1
    assert "not a checkpoint" in out and weights.INDEX_NAME in out


def test_an_empty_copy_checked_against_a_single_shard_manifest_names_only_the_files_it_lists(tmp_path, capsys):
    # The first copy to a node that already holds the manifest outside the copy: every listed file is missing, and
    # no index the source never had may be named (the copy would then ask rsync for a file that does not exist).
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    manifest = tmp_path / "manifest.json"
    assert run_cli(capsys, "manifest", str(source), "--output", str(manifest))[0] == 0
    copy = tmp_path / "copy"
    copy.mkdir()
    code, out, _ = run_cli(capsys, "verify", str(copy), "--manifest", str(manifest), "--json")
    assert code == 1
    assert sorted(json.loads(out)["problem_names"]) == ["config.json", "model.safetensors"]


def test_an_unreadable_index_the_manifest_lists_is_named(tmp_path, capsys):
    make_sharded_model(tmp_path, shards=2)
    manifest = tmp_path.parent / f"{tmp_path.name}-manifest.json"
    assert run_cli(capsys, "manifest", str(tmp_path), "--output", str(manifest))[0] == 0
    index = tmp_path / weights.INDEX_NAME
    index.write_text("x" * len(index.read_text()))  # same size, not JSON
    code, out, _ = run_cli(capsys, "verify", str(tmp_path), "--manifest", str(manifest), "--json")
    assert code == 1
    assert weights.INDEX_NAME in json.loads(out)["problem_names"]


def test_missing_directory_is_a_problem_not_a_crash(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "verify", str(tmp_path / "not-copied-yet"))
    assert code == 1
    assert "missing" in out


# --- manifest -----------------------------------------------------------------------------------------------


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path, capsys):
    make_sharded_model(tmp_path, shards=2)
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "vocab.txt").write_text("a\nb\n")

    code, out, _ = run_cli(capsys, "manifest", str(tmp_path))

    assert code == 0
    files = json.loads(out)["files"]
    assert set(files) == {
        "config.json",
        weights.INDEX_NAME,
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "tokenizer/vocab.txt",
    }
    vocab = files["tokenizer/vocab.txt"]
    assert vocab == {"size": 4, "sha256": hashlib.sha256(b"a\nb\n").hexdigest()}


def test_manifest_written_next_to_the_model_is_kept_until_the_model_changes(tmp_path, capsys):
    names = make_sharded_model(tmp_path, shards=2)
    out_file = tmp_path / weights.MANIFEST_NAME

    assert run_cli(capsys, "manifest", str(tmp_path), "--output", str(out_file))[1].count('"written"') == 1
    assert run_cli(capsys, "manifest", str(tmp_path), "--output", str(out_file))[1].count('"unchanged"') == 1
    assert weights.MANIFEST_NAME not in weights.load_manifest(out_file)["files"]

    write_safetensors(tmp_path / names[0], {"other": 77})
    assert run_cli(capsys, "manifest", str(tmp_path), "--output", str(out_file))[1].count('"written"') == 1
    assert weights.load_manifest(out_file)["files"][names[0]]["size"] == (tmp_path / names[0]).stat().st_size


def test_copy_verified_against_the_source_manifest(tmp_path, capsys):
    source, copy = tmp_path / "source", tmp_path / "copy"
    make_sharded_model(source, shards=2)
    run_cli(capsys, "manifest", str(source), "--output", str(source / weights.MANIFEST_NAME))
    make_sharded_model(copy, shards=2)
    (copy / weights.MANIFEST_NAME).write_bytes((source / weights.MANIFEST_NAME).read_bytes())
    (copy / "config.json").unlink()

    code, out, _ = run_cli(capsys, "verify", str(copy))

    assert code == 1
    assert "config.json: missing" in out


def test_sha256_mismatch_found_only_when_asked(tmp_path, capsys):
    names = make_sharded_model(tmp_path, shards=2)
    run_cli(capsys, "manifest", str(tmp_path), "--output", str(tmp_path / weights.MANIFEST_NAME))
    shard = tmp_path / names[1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))

    assert run_cli(capsys, "verify", str(tmp_path))[0] == 0
    code, out, _ = run_cli(capsys, "verify", str(tmp_path), "--sha256")
    assert code == 1
    assert f"{names[1]}: checksum mismatch" in out


def test_sha256_without_a_manifest_is_invalid_input(tmp_path, capsys):
    make_sharded_model(tmp_path, shards=1)
    code, _, err = run_cli(capsys, "verify", str(tmp_path), "--sha256")
    assert code == 2
    assert "needs a manifest" in err


def test_verify_against_a_manifest_outside_the_copy_ignores_the_one_inside(tmp_path, capsys):
    copy, outside = tmp_path / "copy", tmp_path / "model-manifest.json"
    make_sharded_model(copy, shards=2)
    run_cli(capsys, "manifest", str(copy), "--output", str(outside))
    (copy / "config.json").write_text('{"model_type": "llama", "planted": true}')  # other size
    run_cli(capsys, "manifest", str(copy), "--output", str(copy / weights.MANIFEST_NAME))  # rewritten to match

    assert run_cli(capsys, "verify", str(copy))[0] == 0  # the copy's own manifest vouches for the change
    code, out, _ = run_cli(capsys, "verify", str(copy), "--manifest", str(outside))
    assert code == 1
    assert "config.json: too long" in out
    assert out.splitlines()[0].endswith(f"against {outside}:")


def test_a_missing_manifest_given_with_manifest_is_a_problem_and_the_copy_s_own_is_not_read(tmp_path, capsys):
    make_sharded_model(tmp_path, shards=1)
    run_cli(capsys, "manifest", str(tmp_path), "--output", str(tmp_path / weights.MANIFEST_NAME))
    absent = tmp_path.parent / "absent-manifest.json"

    code, out, err = run_cli(capsys, "verify", str(tmp_path), "--manifest", str(absent), "--json")

    assert code == 1, err
    report = json.loads(out)
    assert report["problem_names"][0] == f"manifest {absent}"
    assert report["problems"][0]["kind"] == "missing" and report["manifest"] is None


def test_a_manifest_names_its_directory_and_is_rewritten_for_another_one(tmp_path, capsys):
    """One manifest path per node: switching back to an older snapshot with the same names and sizes (its blobs
    older than the manifest) must not keep the other snapshot's digests."""
    old, new = tmp_path / "snapshots" / ("a" * 40), tmp_path / "snapshots" / ("b" * 40)
    make_sharded_model(old, shards=1)
    make_sharded_model(new, shards=1)
    shard = new / "model-00001-of-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    outside = tmp_path / "model-manifest.json"

    assert run_cli(capsys, "manifest", str(new), "--output", str(outside))[1].count('"written"') == 1
    assert weights.load_manifest(outside)["directory"] == str(new)
    assert run_cli(capsys, "manifest", str(old), "--output", str(outside))[1].count('"written"') == 1
    assert weights.load_manifest(outside)["directory"] == str(old)
    assert run_cli(capsys, "verify", str(old), "--manifest", str(outside), "--sha256")[0] == 0


def test_a_manifest_from_before_manifests_named_their_directory_is_kept(tmp_path, capsys):
    make_sharded_model(tmp_path, shards=1)
    legacy = weights.build_manifest(tmp_path)
    del legacy["directory"]
    (tmp_path / weights.MANIFEST_NAME).write_text(json.dumps(legacy))
    out = run_cli(capsys, "manifest", str(tmp_path), "--output", str(tmp_path / weights.MANIFEST_NAME))[1]
    assert '"unchanged"' in out


# --- offline refs -------------------------------------------------------------------------------------------


def make_cached_snapshot(hf_home: Path, repo_id: str, commit: str) -> Path:
    snapshot = weights.snapshot_dir(hf_home, repo_id, commit)
    make_sharded_model(snapshot, shards=2)
    return snapshot


def test_pinned_snapshot_resolves_offline_only_after_refs_are_written(tmp_path):
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo_id, commit = "example-org/tiny", "a" * 40
    snapshot = make_cached_snapshot(tmp_path, repo_id, commit)
    cache_dir = weights.hub_cache_dir(tmp_path)

    with pytest.raises(LocalEntryNotFoundError):
        snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True)

    assert weights.write_ref(tmp_path, repo_id, commit) is True
    assert weights.ref_path(tmp_path, repo_id) == cache_dir / "models--example-org--tiny" / "refs" / "main"
    assert Path(snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True)) == snapshot
    assert weights.write_ref(tmp_path, repo_id, commit) is False


def test_ref_must_be_a_commit(tmp_path):
    with pytest.raises(weights.ModelInputError, match="40-hex commit"):
        weights.write_ref(tmp_path, "org/name", "main")


def test_verify_from_the_cache_checks_the_offline_ref(tmp_path, capsys):
    repo_id, commit = "example-org/tiny", "b" * 40
    make_cached_snapshot(tmp_path, repo_id, commit)
    args = ["verify", "--repo-id", repo_id, "--revision", commit, "--hf-home", str(tmp_path)]

    code, out, _ = run_cli(capsys, *args)
    assert code == 1
    assert "refs/main: offline ref" in out

    weights.write_ref(tmp_path, repo_id, commit)
    assert run_cli(capsys, *args)[0] == 0


def test_branch_revision_that_never_resolved_fails_with_the_ref_path(tmp_path, capsys):
    argv = ["verify", "--repo-id", "org/name", "--revision", "main", "--hf-home", str(tmp_path), "--json"]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 1
    (problem,) = json.loads(out)["problems"]
    assert problem["path"] == str(weights.ref_path(tmp_path, "org/name", "main"))
    assert "twinspark model fetch" in problem["detail"]


def test_damaged_snapshot_entry_names_the_blob_that_holds_its_bytes(tmp_path):
    """A hub snapshot's files are links into blobs/: the repair must copy the blob, not the link."""
    repo_id, commit = "example-org/tiny", "c" * 40
    storage = weights.repo_storage_dir(tmp_path, repo_id)
    blob = storage / "blobs" / ("d" * 64)
    size = write_safetensors(blob, {"w": 512})
    snapshot = weights.snapshot_dir(tmp_path, repo_id, commit)
    snapshot.mkdir(parents=True)
    (snapshot / weights.SINGLE_SHARD_NAME).symlink_to(Path("../../blobs") / blob.name)
    blob.write_bytes(blob.read_bytes()[: size // 2])

    (problem,) = weights.verify_model_dir(snapshot).problems

    assert (problem.name, problem.kind) == (weights.SINGLE_SHARD_NAME, "short")
    assert problem.path == str(blob)


# --- download plan ------------------------------------------------------------------------------------------


def test_unset_revision_pins_and_empty_revision_follows_the_default_branch():
    assert weights.resolve_revision(None) == weights.PINNED_REVISION
    assert weights.resolve_revision("") is None
    assert weights.resolve_revision("  ") is None
    assert weights.resolve_revision("v1.0") == "v1.0"


def test_download_arguments_resume_into_hf_home_hub_with_long_timeouts():
    plan = weights.build_download_plan(weights.PINNED_REPO_ID, None, "/var/lib/twinspark/hf", environ={})

    kwargs = plan.download_kwargs()
    assert kwargs["repo_id"] == "deepseek-ai/DeepSeek-V4-Flash-0731"
    assert kwargs["revision"] == "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"
    assert kwargs["cache_dir"] == "/var/lib/twinspark/hf/hub"
    assert kwargs["force_download"] is False and kwargs["local_files_only"] is False
    assert kwargs["etag_timeout"] == 30
    assert "token" not in kwargs
    env = plan.environment()
    assert env["HF_HUB_DOWNLOAD_TIMEOUT"] == "120"
    assert env["HF_HUB_ETAG_TIMEOUT"] == "30"
    assert env["HF_HUB_OFFLINE"] == "0"
    assert env["HF_HOME"] == "/var/lib/twinspark/hf"


def test_download_arguments_are_accepted_by_snapshot_download():
    import inspect

    from huggingface_hub import snapshot_download

    plan = weights.build_download_plan("org/name", "", "/srv/hf", environ={})
    inspect.signature(snapshot_download).bind(**plan.download_kwargs(), token=None)


def test_plan_says_whether_a_token_is_set_but_never_prints_it(capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET_TOKEN)
    for extra in ([], ["--json"]):
        code, out, err = run_cli(capsys, "plan", *extra)
        assert code == 0
        assert SECRET_TOKEN not in out + err
        assert "$HF_TOKEN (set)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repo-id", "no-slash"], "organisation/name"),
        (["--hf-home", "relative/hf"], "absolute path"),
    ],
)
def test_bad_plan_input_exits_2_naming_the_problem(capsys, argv, message):
    code, _, err = run_cli(capsys, "plan", *argv)
    assert code == 2
    assert message in err


# --- disk space ---------------------------------------------------------------------------------------------


def fake_hub_model_info(commit: str, files: list[tuple[str, int, str | None]]):
    """What HfApi.model_info(files_metadata=True) returns, built from huggingface_hub's own classes."""
    from huggingface_hub.hf_api import BlobLfsInfo, RepoSibling

    siblings = []
    for name, size, lfs_sha in files:
        if lfs_sha:
            lfs = BlobLfsInfo(size=size, sha256=lfs_sha, pointer_size=134)
            siblings.append(RepoSibling(rfilename=name, size=size, blob_id="git" + lfs_sha[:37], lfs=lfs))
        else:
            siblings.append(RepoSibling(rfilename=name, size=size, blob_id=f"blob-{name}"))
    return SimpleNamespace(sha=commit, siblings=siblings)


class FakeHubApi:
    """Stands in for huggingface_hub.HfApi: answers the metadata call and records how it was asked."""

    def __init__(self, info):
        self.info = info
        self.calls = []

    def model_info(self, repo_id, **kwargs):
        self.calls.append((repo_id, kwargs))
        return self.info


def test_metadata_call_asks_for_file_sizes_of_the_pinned_revision():
    info = fake_hub_model_info("c" * 40, [("config.json", 10, None), ("m.safetensors", 900, "d" * 64)])
    fake_hub_api = FakeHubApi(info)

    commit, files = weights.snapshot_metadata(fake_hub_api, "org/name", weights.PINNED_REVISION, token=None)

    assert commit == "c" * 40
    assert [(f.path, f.size, f.blob) for f in files] == [
        ("config.json", 10, "blob-config.json"),
        ("m.safetensors", 900, "d" * 64),
    ]
    ((repo_id, kwargs),) = fake_hub_api.calls
    assert repo_id == "org/name"
    assert kwargs["revision"] == weights.PINNED_REVISION
    assert kwargs["files_metadata"] is True


def test_bytes_needed_subtracts_complete_and_partial_blobs_and_counts_shared_blobs_once():
    files = [
        weights.RemoteFile("a.safetensors", 1000, "sha-a"),
        weights.RemoteFile("b.safetensors", 2000, "sha-b"),
        weights.RemoteFile("c.safetensors", 3000, "sha-c"),
        weights.RemoteFile("c-copy.safetensors", 3000, "sha-c"),
    ]
    cached = {"sha-a": 1000, "sha-b.incomplete": 500}
    assert weights.bytes_still_needed(files, cached) == 1500 + 3000
    assert weights.bytes_still_needed(files, {}) == 6000


def test_disk_space_problem_names_both_numbers():
    assert weights.disk_space_problem(needed=100, free=1000, reserve=900) is None
    message = weights.disk_space_problem(needed=160_000_000_000, free=90_000_000_000, reserve=0, where="/var/lib/x")
    assert "160000000000 bytes" in message and "90000000000 bytes" in message
    assert "/var/lib/x" in message


def test_fetch_stops_before_downloading_when_the_disk_is_too_small(tmp_path, monkeypatch):
    downloads = []
    fake_hub_module = SimpleNamespace(
        HfApi=lambda: FakeHubApi(fake_hub_model_info("e" * 40, [("model.safetensors", 50_000, "f" * 64)])),
        snapshot_download=lambda **kwargs: downloads.append(kwargs),
    )
    monkeypatch.setattr(weights, "_import_hub", lambda plan: fake_hub_module)
    monkeypatch.setattr(weights, "free_bytes", lambda path: 20_000)
    plan = weights.build_download_plan("org/name", "main", str(tmp_path), environ={})

    with pytest.raises(weights.ModelRuntimeError, match="50000 bytes.*20000 bytes"):
        weights.fetch(plan, reserve=0)
    assert downloads == []


def test_fetch_of_a_complete_pinned_snapshot_makes_no_hub_call_and_writes_the_ref(tmp_path, monkeypatch):
    def no_hub(plan):
        raise AssertionError("the hub must not be contacted for a complete pinned snapshot")

    monkeypatch.setattr(weights, "_import_hub", no_hub)
    snapshot = make_cached_snapshot(tmp_path, "org/name", weights.PINNED_REVISION)
    plan = weights.build_download_plan("org/name", None, str(tmp_path), environ={})

    first = weights.fetch(plan, reserve=0)
    second = weights.fetch(plan, reserve=0)

    assert first == {"snapshot": str(snapshot), "commit": weights.PINNED_REVISION, "downloaded": False, "changed": True}
    assert second["changed"] is False
    assert weights.resolve_offline(tmp_path, "org/name", None) == weights.PINNED_REVISION


def test_fetch_judges_a_pinned_snapshot_by_the_node_s_manifest_when_it_describes_it(tmp_path, monkeypatch):
    calls = []

    def hub_called(plan):
        calls.append(plan)
        raise weights.ModelRuntimeError("the hub was asked")

    monkeypatch.setattr(weights, "_import_hub", hub_called)
    snapshot = make_cached_snapshot(tmp_path, "org/name", weights.PINNED_REVISION)
    outside = tmp_path / "model-manifest.json"
    weights.write_manifest(snapshot, outside)
    (snapshot / "config.json").unlink()  # the shards alone still look complete
    plan = weights.build_download_plan("org/name", None, str(tmp_path), environ={})

    assert weights.fetch(plan, reserve=0)["downloaded"] is False
    with pytest.raises(weights.ModelRuntimeError, match="the hub was asked"):
        weights.fetch(plan, reserve=0, manifest=outside)
    other = json.loads(outside.read_text()) | {"directory": str(tmp_path / "another")}
    outside.write_text(json.dumps(other))
    assert weights.fetch(plan, reserve=0, manifest=outside)["downloaded"] is False  # not this snapshot's manifest


def test_prune_keeps_what_serves_and_what_a_switch_goes_back_to_and_lists_before_it_removes(tmp_path, capsys):
    models, hf_home = tmp_path / "models", tmp_path / "hf"
    for name in ("tiny-llama", "tiny-qwen3", "old-model"):
        (models / name).mkdir(parents=True)
        (models / name / "model.safetensors").write_bytes(b"x" * 100)
    for repo in ("models--org--kept", "models--org--stale"):
        (hf_home / "hub" / repo / "blobs").mkdir(parents=True)
        (hf_home / "hub" / repo / "blobs" / "b").write_bytes(b"y" * 10)
    env = tmp_path / "serve.env"
    env.write_text(f"MODEL={models}/tiny-qwen3\n")
    record = tmp_path / "recipes.json"
    record.write_text(json.dumps({"current": {"recipe": "tiny-qwen3", "model": f"{models}/tiny-qwen3"},
                                  "previous": {"recipe": "tiny-llama", "model": f"{models}/tiny-llama"}}))
    argv = ["model", "prune", "--models-dir", str(models), "--hf-home", str(hf_home), "--env", str(env),
            "--record", str(record), "--keep", "org/kept", "--json"]
    assert cli.main(argv) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(listed["removed"]) == [f"{models}/old-model", "org/stale"]
    assert sorted(listed["kept"]) == [f"{models}/tiny-llama", f"{models}/tiny-qwen3", "org/kept"]
    assert listed["freed_bytes"] == 110 and not listed["applied"] and not listed["changed"]
    assert (models / "old-model").is_dir() and (hf_home / "hub" / "models--org--stale").is_dir()  # listed only
    assert cli.main([*argv, "--apply"]) == 0
    assert json.loads(capsys.readouterr().out)["changed"] is True
    assert not (models / "old-model").exists() and not (hf_home / "hub" / "models--org--stale").exists()
    assert (models / "tiny-llama").is_dir() and (hf_home / "hub" / "models--org--kept").is_dir()


def test_prune_with_nothing_to_keep_refuses_rather_than_removing_every_copy(tmp_path, capsys):
    (tmp_path / "models" / "a").mkdir(parents=True)
    assert cli.main(["model", "prune", "--models-dir", str(tmp_path / "models"), "--hf-home", str(tmp_path / "hf"),
                     "--apply"]) == 2
    assert "nothing to keep" in capsys.readouterr().err
    assert (tmp_path / "models" / "a").is_dir()
