"""The fake Hugging Face endpoint (tests/sim/fakehub) driven by the real huggingface_hub client.

The server runs as a subprocess on a free 127.0.0.1 port under `python -I -S` (no site-packages: it must need
nothing beyond the standard library), exactly as start.sh runs it in the simulated head.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fakehub_proc import running_fakehub

ROOT = Path(__file__).resolve().parents[2]
FAKEHUB = ROOT / "tests" / "sim" / "fakehub"
_spec = importlib.util.spec_from_file_location("fakehub_repos", FAKEHUB / "repos.py")
repos = sys.modules.setdefault("fakehub_repos", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(repos)

hf = pytest.importorskip("huggingface_hub")
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

CUT_FILE = "model-00001-of-00048.safetensors"  # in the Engram repo; no other test fetches it


def _settings() -> dict:
    """group_data/all.py as a dict (the repo names and Engram file list the deploy will ask for)."""
    ns: dict = {}
    exec(compile((ROOT / "group_data" / "all.py").read_text(), "all.py", "exec"), ns)
    return ns


SETTINGS = _settings()
CATALOG = repos.catalog()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    log = tmp_path_factory.mktemp("fakehub") / "fakehub.log"
    with running_fakehub(log, "--cut-once", f"{repos.ENGRAM}/{CUT_FILE}") as url:
        yield {"url": url, "log": log}


@pytest.fixture(autouse=True)
def _local_only(hub, monkeypatch):
    # As if HF_ENDPOINT had been set before the import: nothing may leave 127.0.0.1 (huggingface_hub also
    # fetches a registry from constants.ENDPOINT on first use).
    monkeypatch.setattr(constants, "ENDPOINT", hub["url"])
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub["url"] + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.delenv("HF_TOKEN", raising=False)


def log_lines(hub) -> list[str]:
    return hub["log"].read_text().splitlines()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def read_safetensors(data: bytes) -> dict:
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    end = 0
    for name, entry in header.items():
        b, e = entry["data_offsets"]
        size = {"BF16": 2, "F16": 2, "F32": 4, "I16": 2, "I32": 4, "F8_E4M3": 1, "F8_E8M0": 1}[entry["dtype"]]
        for dim in entry["shape"]:
            size *= dim
        assert e - b == size, name
        end = max(end, e)
    assert len(data) == 8 + n + end
    return {name: data[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]] for name, e in header.items()}


def served(repo_id: str, path: str) -> bytes:
    return repos.build_repos()[repo_id].files[path].data


def get(url: str, headers: dict | None = None):
    req = urllib.request.Request(url, headers=headers or {}, method="GET")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


# ---------------------------------------------------------------- the repositories themselves


def test_repos_match_settings_and_are_deterministic():
    assert set(CATALOG) == {SETTINGS[k] for k in ("model_repo", "model_repo_v1_1", "engram_repo", "kit_repo",
                                                  "ablit_repo")}
    assert CATALOG[SETTINGS["ablit_repo"]]["commit"] == SETTINGS["ablit_revision"]
    assert CATALOG[SETTINGS["ablit_repo"]]["gated"] and not CATALOG[SETTINGS["model_repo"]]["gated"]
    assert all(len(c["commit"]) == 40 and int(c["commit"], 16) >= 0 for c in CATALOG.values())
    assert len({c["commit"] for c in CATALOG.values()}) == len(CATALOG)
    rebuilt = subprocess.run([sys.executable, "-I", "-S", str(FAKEHUB / "repos.py")], capture_output=True,
                             check=True, text=True).stdout
    assert json.loads(rebuilt) == CATALOG  # a fresh process builds the very same bytes


def test_packs_are_shaped_like_the_real_ones_and_differ():
    for repo_id in (repos.EAQ_V1, repos.EAQ_V1_1):
        config = json.loads(served(repo_id, "config.json"))
        tokenizer = json.loads(served(repo_id, "tokenizer.json"))
        assert config["model_type"] == "deepseek_v41"
        assert config["quantization_config"]["format"] == "exl3-mul1"
        vocab = tokenizer["model"]["vocab"]
        assert 40 <= len(vocab) <= 70 and config["vocab_size"] == len(vocab)
        assert sorted(vocab.values()) == list(range(len(vocab)))
        index = json.loads(served(repo_id, "model.safetensors.index.json"))["weight_map"]
        shards = sorted(set(index.values()))
        assert shards == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
        for shard in shards:
            tensors = read_safetensors(served(repo_id, shard))
            assert sorted(tensors) == sorted(n for n, s in index.items() if s == shard)
            assert 1024 < len(served(repo_id, shard)) < 32768
    v1, v11 = CATALOG[repos.EAQ_V1], CATALOG[repos.EAQ_V1_1]
    assert v1["commit"] != v11["commit"]
    assert v1["sha256"]["model-00002-of-00003.safetensors"] != v11["sha256"]["model-00002-of-00003.safetensors"]
    assert v1["sha256"]["tokenizer.json"] == v11["sha256"]["tokenizer.json"]


def test_engram_compressed_vocab_matches_the_tokenizer():
    tokenizer = json.loads(served(repos.EAQ_V1, "tokenizer.json"))
    config = json.loads(served(repos.EAQ_V1, "config.json"))
    ids = tokenizer["model"]["vocab"]
    cmap = repos.compressed_token_map()
    # case, a leading blank and accents fold together; a partial UTF-8 byte keeps its own id
    assert len({cmap[ids[t]] for t in ("the", "Ġthe", "The", "ĠThe", "THE")}) == 1
    assert cmap[ids["Ã©"]] == cmap[ids["e"]] and cmap[ids["Ġ"]] == cmap[ids["Ċ"]] == cmap[ids["ĠĠ"]]
    assert cmap[ids["Ã"]] not in {cmap[i] for t, i in ids.items() if t != "Ã"}
    assert config["engram_compressed_vocab_size"] == len(set(cmap)) < len(ids)
    assert json.loads(served(repos.ENGRAM, "config.json"))["engram_compressed_vocab_size"] == len(set(cmap))


def test_engram_source_holds_the_tables_in_shards_47_and_48():
    config = json.loads(served(repos.ENGRAM, "config.json"))
    index = json.loads(served(repos.ENGRAM, "model.safetensors.index.json"))["weight_map"]
    for layer, rows, shard in zip(config["engram_layer_ids"], config["engram_num_embeddings"],
                                  ("model-00047-of-00048.safetensors", "model-00048-of-00048.safetensors"),
                                  strict=True):
        data = served(repos.ENGRAM, shard)
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        weight = header[f"model.layers.{layer}.engram.embed.weight"]
        scale = header[f"model.layers.{layer}.engram.embed.scale"]
        assert weight["shape"][0] == scale["shape"][0] == rows
        assert (weight["dtype"], scale["dtype"]) == ("F8_E4M3", "F8_E8M0")
        assert index[f"model.layers.{layer}.engram.embed.weight"] == shard
        read_safetensors(data)
    others = [p for p in CATALOG[repos.ENGRAM]["files"]
              if p.endswith(".safetensors") and p not in SETTINGS["engram_files"]]
    assert len(others) >= 2


def test_kit_manifest_lists_every_other_kit_file():
    files = CATALOG[repos.KIT]["files"]
    kit = {p[len("kit/"):] for p in files if p.startswith("kit/")} - {"MANIFEST"}
    lines = served(repos.KIT, "kit/MANIFEST").decode().splitlines()
    listed = dict(reversed(line.split("  ", 1)) for line in lines)
    assert set(listed) == kit
    for rel, digest in listed.items():
        assert hashlib.sha256(served(repos.KIT, f"kit/{rel}")).hexdigest() == digest
    for needed in ("aot/aot.json", "cubins/linear.cubin", "cubins/linear_grouped.cubin", "cubins/experts.cubin",
                   "cubins/experts_cb.cubin", "engram.json", "rope.json", "rope-plain-cos.f32", "rope-plain-sin.f32",
                   "rope-compressed-cos.f32", "rope-compressed-sin.f32", "vision/torch_fmha_sm120.cubin",
                   "vision/gate_bias_vl.safetensors", "README.md"):
        assert needed in kit
    aot = json.loads(served(repos.KIT, "kit/aot/aot.json"))
    assert {f"aot/{k['cubin']}" for k in aot["kernels"]} == {p for p in kit if p.startswith("aot/cubins/")}
    assert "README.md" in files


# ---------------------------------------------------------------- the real client against the server


def test_model_info_with_files_metadata(hub):
    api = HfApi(endpoint=hub["url"])
    info = api.model_info(repos.EAQ_V1, revision="main", files_metadata=True)
    expected = CATALOG[repos.EAQ_V1]
    assert info.sha == expected["commit"]
    assert {s.rfilename: s.size for s in info.siblings} == expected["files"]
    for s in info.siblings:
        data = served(repos.EAQ_V1, s.rfilename)
        if s.rfilename.endswith(".safetensors"):
            assert s.lfs is not None and s.lfs.sha256 == hashlib.sha256(data).hexdigest() and s.lfs.size == len(data)
        else:
            assert s.lfs is None and s.blob_id == git_blob_sha1(data)
    by_commit = api.model_info(repos.EAQ_V1, revision=expected["commit"])
    assert by_commit.sha == expected["commit"] and by_commit.siblings[0].size is None
    assert api.model_info(repos.EAQ_V1_1).sha == CATALOG[repos.EAQ_V1_1]["commit"]
    assert api.list_repo_refs(repos.KIT).branches[0].target_commit == CATALOG[repos.KIT]["commit"]
    assert api.list_repo_commits(repos.KIT)[0].commit_id == CATALOG[repos.KIT]["commit"]
    top = {(type(e).__name__, e.path) for e in api.list_repo_tree(repos.KIT, path_in_repo="kit")}
    assert ("RepoFolder", "kit/aot") in top and ("RepoFile", "kit/MANIFEST") in top
    assert ("RepoFile", "kit/aot/aot.json") not in top
    paths = api.get_paths_info(repos.KIT, ["kit/MANIFEST", "kit/vision", "kit/nope"])
    assert [(type(e).__name__, e.path) for e in paths] == [("RepoFile", "kit/MANIFEST"), ("RepoFolder", "kit/vision")]
    assert paths[0].size == CATALOG[repos.KIT]["files"]["kit/MANIFEST"]
    assert api.whoami(token="hf_simtoken")["name"] == "sim-user"


def test_snapshot_to_cache_dir_has_the_hub_cache_layout(hub, tmp_path):
    cache = tmp_path / "hub"
    path = snapshot_download(repos.EAQ_V1, revision="main", cache_dir=cache, endpoint=hub["url"], token=False)
    commit = CATALOG[repos.EAQ_V1]["commit"]
    folder = cache / "models--Mia-AiLab--DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1-2.9-bpw"
    assert Path(path) == folder / "snapshots" / commit
    assert (folder / "refs" / "main").read_text() == commit
    for rel, size in CATALOG[repos.EAQ_V1]["files"].items():
        link = folder / "snapshots" / commit / rel
        assert link.is_symlink(), rel
        blob = link.resolve()
        assert blob.parent == (folder / "blobs").resolve()
        data = blob.read_bytes()
        assert len(data) == size and hashlib.sha256(data).hexdigest() == CATALOG[repos.EAQ_V1]["sha256"][rel]
        # blobs are named by the ETag: sha256 for LFS files, the git blob sha1 otherwise
        assert blob.name == (hashlib.sha256(data).hexdigest() if rel.endswith(".safetensors") else git_blob_sha1(data))
    # a second run is served from the cache: no new file GETs
    before = sum(" GET " in line and "/resolve/" in line for line in log_lines(hub))
    assert snapshot_download(repos.EAQ_V1, revision="main", cache_dir=cache, endpoint=hub["url"], token=False) == path
    assert sum(" GET " in line and "/resolve/" in line for line in log_lines(hub)) == before


def test_snapshot_to_local_dir_with_allow_patterns(hub, tmp_path):
    target = tmp_path / "engram"
    wanted = SETTINGS["engram_files"]
    path = snapshot_download(repos.ENGRAM, revision="main", local_dir=target, allow_patterns=wanted,
                             endpoint=hub["url"], token=False)
    assert Path(path) == target.resolve()
    got = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file() and ".cache" not in p.parts)
    assert got == sorted(wanted)
    for rel in wanted:
        assert not (target / rel).is_symlink()
        assert hashlib.sha256((target / rel).read_bytes()).hexdigest() == CATALOG[repos.ENGRAM]["sha256"][rel]
    fetched = [line for line in log_lines(hub) if f"/{repos.ENGRAM}/resolve/" in line]
    assert not any(f"/{name}" in line for line in fetched
                   for name in CATALOG[repos.ENGRAM]["files"] if name not in wanted)


def test_dry_run_plans_from_the_fake_hub_as_from_the_real_one(hub, tmp_path):
    """snapshot_download(dry_run=True), which the planner (operations/remote/hf_plan.py) uses: the revision's tree
    and one HEAD per file not on disk; nothing is fetched, nothing is written to the cache."""
    commit = CATALOG[repos.EAQ_V1]["commit"]
    cache = tmp_path / "hub"
    before = sum(" GET " in line and "/resolve/" in line for line in log_lines(hub))
    planned = snapshot_download(repos.EAQ_V1, revision=commit, cache_dir=cache, endpoint=hub["url"], token=False,
                                dry_run=True)
    assert {i.filename: i.file_size for i in planned} == CATALOG[repos.EAQ_V1]["files"]
    assert all(i.will_download and not i.is_cached and i.commit_hash == commit for i in planned)
    assert sum(" GET " in line and "/resolve/" in line for line in log_lines(hub)) == before  # HEADs only
    assert not cache.exists() or not any(cache.iterdir())
    snapshot_download(repos.EAQ_V1, revision=commit, cache_dir=cache, endpoint=hub["url"], token=False)
    again = snapshot_download(repos.EAQ_V1, revision=commit, cache_dir=cache, endpoint=hub["url"], token=False,
                              dry_run=True)
    assert all(i.is_cached and not i.will_download for i in again)
    # a local_dir with patterns, and a gated repo: its tree is public, its files are not
    wanted = SETTINGS["engram_files"]
    local = snapshot_download(repos.ENGRAM, local_dir=tmp_path / "engram", allow_patterns=wanted,
                              endpoint=hub["url"], dry_run=True)
    assert sorted(i.filename for i in local) == sorted(wanted)
    with pytest.raises(GatedRepoError):
        snapshot_download(repos.ABLIT, revision=SETTINGS["ablit_revision"], cache_dir=cache, endpoint=hub["url"],
                          token=False, allow_patterns=[SETTINGS["ablit_file"]], dry_run=True)
    gated = snapshot_download(repos.ABLIT, revision=SETTINGS["ablit_revision"], cache_dir=cache, endpoint=hub["url"],
                              token="hf_simtoken", allow_patterns=[SETTINGS["ablit_file"]], dry_run=True)
    assert [i.file_size for i in gated] == [CATALOG[repos.ABLIT]["files"][SETTINGS["ablit_file"]]]


def test_kit_folder_and_its_verifier(hub, tmp_path):
    path = snapshot_download(repos.KIT, local_dir=tmp_path / "k", allow_patterns=["kit/*"], endpoint=hub["url"])
    kit = Path(path) / "kit"
    assert not (Path(path) / "README.md").exists() and (kit / "README.md").exists()
    ok = subprocess.run(["bash", str(kit / "tools" / "verify_kit.sh")], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip().endswith("files match MANIFEST"), ok.stdout + ok.stderr
    (kit / "rope.json").write_text("{}")
    (kit / "cubins" / "experts.cubin").unlink()
    bad = subprocess.run(["bash", str(kit / "tools" / "verify_kit.sh")], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "DIFFERS  rope.json" in bad.stdout and "MISSING  cubins/experts.cubin" in bad.stdout


def test_revision_as_commit_sha(hub, tmp_path):
    commit = CATALOG[repos.EAQ_V1_1]["commit"]
    path = hf_hub_download(repos.EAQ_V1_1, "config.json", revision=commit, cache_dir=tmp_path, endpoint=hub["url"])
    assert Path(path).parent.name == commit
    assert json.loads(Path(path).read_text())["quantization_config"]["eaq_version"] == "1.1"
    snap = snapshot_download(repos.EAQ_V1_1, revision=commit, cache_dir=tmp_path, endpoint=hub["url"],
                             allow_patterns=["*.json"])
    assert sorted(p.name for p in Path(snap).iterdir()) == sorted(
        p for p in CATALOG[repos.EAQ_V1_1]["files"] if p.endswith(".json"))


def test_unknown_repo_revision_and_file(hub, tmp_path):
    api = HfApi(endpoint=hub["url"])
    with pytest.raises(RepositoryNotFoundError) as err:
        api.model_info("nobody/nothing")
    assert err.value.response.status_code == 404
    with pytest.raises(RevisionNotFoundError) as err:
        api.model_info(repos.EAQ_V1, revision="f" * 40)
    assert err.value.response.status_code == 404
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(repos.EAQ_V1, "config.json", revision="nope", cache_dir=tmp_path, endpoint=hub["url"])
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("nobody/nothing", cache_dir=tmp_path, endpoint=hub["url"])
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repos.EAQ_V1, "missing.bin", cache_dir=tmp_path, endpoint=hub["url"])


def test_gated_repo_needs_the_token(hub, tmp_path):
    repo, name = repos.ABLIT, SETTINGS["ablit_file"]
    rev = SETTINGS["ablit_revision"]
    api = HfApi(endpoint=hub["url"])
    assert api.model_info(repo, revision=rev).gated == "auto"  # metadata stays public, as on the Hub
    with pytest.raises(GatedRepoError) as err:
        hf_hub_download(repo, name, revision=rev, cache_dir=tmp_path, endpoint=hub["url"], token=False)
    assert err.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as err:
        hf_hub_download(repo, name, revision=rev, cache_dir=tmp_path, endpoint=hub["url"], token="hf_wrongtoken")
    assert err.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as err:
        api.auth_check(repo, token="not-a-token")
    assert err.value.response.status_code == 401
    api.auth_check(repo, token="hf_simtoken")
    path = hf_hub_download(repo, name, revision=rev, cache_dir=tmp_path, endpoint=hub["url"], token="hf_simtoken")
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == CATALOG[repo]["sha256"][name]
    url = f"{hub['url']}/{repo}/resolve/{rev}/{name}"
    assert get(url)[0] == 401
    assert get(url, {"Authorization": "Bearer hf_other"})[0] == 403
    assert get(url, {"Authorization": "Bearer hf_simtoken"})[0] == 200


def test_resolve_headers_and_ranges(hub):
    commit = CATALOG[repos.ENGRAM]["commit"]
    data = served(repos.ENGRAM, "model-00047-of-00048.safetensors")
    url = f"{hub['url']}/{repos.ENGRAM}/resolve/main/model-00047-of-00048.safetensors"
    req = urllib.request.Request(url, method="HEAD")
    with urllib.request.urlopen(req, timeout=5) as r:
        head = {k.lower(): v for k, v in r.headers.items()}
        assert r.read() == b""
    assert head["x-repo-commit"] == commit
    assert head["etag"] == head["x-linked-etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert head["x-linked-size"] == head["content-length"] == str(len(data))
    assert head["accept-ranges"] == "bytes"
    assert not [k for k in head if "xet" in k]
    status, headers, body = get(url, {"Range": "bytes=100-"})
    assert status == 206 and body == data[100:]
    assert headers["Content-Range"] == f"bytes 100-{len(data) - 1}/{len(data)}"
    assert get(url, {"Range": "bytes=0-9"})[2] == data[:10]
    assert get(url, {"Range": "bytes=-5"})[2] == data[-5:]
    assert get(url, {"Range": f"bytes={len(data)}-"})[0] == 416
    text_url = f"{hub['url']}/{repos.ENGRAM}/resolve/main/config.json"
    status, headers, body = get(text_url)
    assert headers["ETag"] == f'"{git_blob_sha1(body)}"' and "X-Linked-Etag" not in headers


def test_interrupted_download_resumes_with_range(hub, tmp_path, monkeypatch):
    # small read chunks, so the client has bytes on disk when the server drops the connection half-way
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 256)
    path = hf_hub_download(repos.ENGRAM, CUT_FILE, cache_dir=tmp_path, endpoint=hub["url"])
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == CATALOG[repos.ENGRAM]["sha256"][CUT_FILE]
    lines = [line for line in log_lines(hub) if CUT_FILE in line and " GET " in line]
    size = CATALOG[repos.ENGRAM]["files"][CUT_FILE]
    assert lines[0].endswith(" cut")
    assert f"range=bytes={size // 2}-" in lines[1] and " 206 " in lines[1]


def test_ablit_apply_script(hub, tmp_path):
    pack = Path(snapshot_download(repos.EAQ_V1, cache_dir=tmp_path / "hub", endpoint=hub["url"]))
    overlay = Path(snapshot_download(repos.ABLIT, revision=SETTINGS["ablit_revision"], local_dir=tmp_path / "ov",
                                     allow_patterns=[SETTINGS["ablit_file"], "apply_mia_exl3_wob.py"],
                                     endpoint=hub["url"], token="hf_simtoken"))
    script = [sys.executable, "-I", "-S", str(overlay / "apply_mia_exl3_wob.py")]
    wo_b = str(overlay / SETTINGS["ablit_file"])
    same = subprocess.run(script + ["--src", str(pack), "--wo-b", wo_b, "--dst", str(pack)], capture_output=True)
    assert same.returncode != 0
    dst = tmp_path / "ablit"
    run = subprocess.run(script + ["--src", str(pack), "--wo-b", wo_b, "--dst", str(dst)], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in dst.iterdir()) == sorted(CATALOG[repos.EAQ_V1]["files"])
    assert os.stat(dst / "config.json").st_ino == os.stat((pack / "config.json").resolve()).st_ino
    overlay_tensors = read_safetensors(Path(wo_b).read_bytes())
    index = json.loads((pack / "model.safetensors.index.json").read_text())["weight_map"]
    changed = 0
    for shard in sorted(set(index.values())):
        stock, applied = read_safetensors((pack / shard).read_bytes()), read_safetensors((dst / shard).read_bytes())
        assert sorted(stock) == sorted(applied)
        for name in stock:
            layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
            if ".attn.wo_b." in name and 10 <= layer <= 35:
                assert applied[name] == overlay_tensors[name] != stock[name]
                changed += 1
            else:
                assert applied[name] == stock[name]
    assert changed == 26 * 4
    # the stock pack is untouched
    assert hashlib.sha256((pack / "model-00002-of-00003.safetensors").read_bytes()).hexdigest() == \
        CATALOG[repos.EAQ_V1]["sha256"]["model-00002-of-00003.safetensors"]


def test_start_script_backgrounds_the_server_once(tmp_path):
    import signal
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, FAKEHUB_PORT=str(port), FAKEHUB_LOG=str(tmp_path / "fakehub.log"),
               FAKEHUB_PIDFILE=str(tmp_path / "fakehub.pid"))
    first = subprocess.run(["sh", str(FAKEHUB / "start.sh")], env=env, capture_output=True, text=True, timeout=20)
    pid = int((tmp_path / "fakehub.pid").read_text())
    try:
        assert first.returncode == 0, first.stderr
        status, _, body = get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200 and json.loads(body)["repos"] == {r: c["commit"] for r, c in CATALOG.items()}
        again = subprocess.run(["sh", str(FAKEHUB / "start.sh")], env=env, capture_output=True, text=True,
                               timeout=20)
        assert again.returncode == 0 and "already serving" in again.stdout
        assert "GET /healthz 200" in (tmp_path / "fakehub.log").read_text()
    finally:
        os.kill(pid, signal.SIGTERM)


# ---------------------------------------------------------------- scaled up and slowed down (tests/bench/first_run.py)

PAD = 3 * 2**20  # each checkpoint shard grows by 3 MiB
RATE = 8 * 2**20  # bytes/s, all connections together


@pytest.fixture(scope="module")
def slow_hub(tmp_path_factory):
    log = tmp_path_factory.mktemp("slowhub") / "fakehub.log"
    with running_fakehub(log, "--pad", f"{repos.EAQ_V1}/model-*.safetensors={PAD}", "--rate", str(RATE)) as url:
        yield url


def test_the_padding_is_given_as_globs_and_bytes():
    spec = importlib.util.spec_from_file_location("fakehub_server", FAKEHUB / "server.py")
    assert spec and spec.loader
    server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(server)
    assert server.parse_pads(["a/b/m-*.safetensors=10", "c/d=2=3"]) == {"a/b/m-*.safetensors": 10, "c/d=2": 3}
    with pytest.raises(SystemExit, match="is not GLOB=BYTES"):
        server.parse_pads(["a/b/m-*.safetensors=ten"])


def test_a_padded_pack_keeps_its_commit_and_stays_valid_safetensors():
    plain = repos.build_repos()
    big = repos.padded(plain, {f"{repos.EAQ_V1}/model-*.safetensors": PAD})[repos.EAQ_V1]
    assert big.commit == plain[repos.EAQ_V1].commit
    for path, f in big.files.items():
        small = plain[repos.EAQ_V1].files[path]
        if not path.endswith(".safetensors"):
            assert f is small
            continue
        data = b"".join(f.read())
        assert len(data) == f.size == len(f.body) + PAD and hashlib.sha256(data).hexdigest() == f.sha256
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        pad = header.pop(repos.PAD_TENSOR)
        assert pad["dtype"] == "U8" and pad["shape"] == [PAD] and 8 + n + pad["data_offsets"][1] == len(data)
        (m,) = struct.unpack("<Q", small.data[:8])
        assert header == json.loads(small.data[8:8 + m])  # the real tensors, where they were
        assert b"".join(f.read(10, 20)) == data[10:20] and b"".join(f.read(f.size - 5)) == data[-5:]


def test_the_hub_client_fetches_a_padded_pack_at_the_server_rate(slow_hub, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "ENDPOINT", slow_hub)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", slow_hub + "/{repo_id}/resolve/{revision}/{filename}")
    big = repos.padded(repos.build_repos(), {f"{repos.EAQ_V1}/model-*.safetensors": PAD})[repos.EAQ_V1]
    t0 = time.perf_counter()
    path = snapshot_download(repos.EAQ_V1, revision="main", cache_dir=tmp_path, endpoint=slow_hub, token=False)
    elapsed = time.perf_counter() - t0
    total = sum(f.size for f in big.files.values())
    assert elapsed >= 0.8 * total / RATE, elapsed  # 8 parallel files share the one rate
    for rel, f in big.files.items():
        data = (Path(path) / rel).read_bytes()
        assert len(data) == f.size and hashlib.sha256(data).hexdigest() == f.sha256, rel
    status, headers, body = get(f"{slow_hub}/{repos.EAQ_V1}/resolve/main/model-00002-of-00003.safetensors",
                                {"Range": f"bytes={big.files['model-00002-of-00003.safetensors'].size - 4}-"})
    assert status == 206 and body == b"".join(big.files["model-00002-of-00003.safetensors"].read())[-4:]


# --------------------------------------------------------------- slow as a real slow server (tests/e2e/test_overlap.py)

CRAWL = 1024  # bytes/s, all connections together: the e2e overlap test's rate


@pytest.fixture(scope="module")
def crawling_hub(tmp_path_factory):
    log = tmp_path_factory.mktemp("crawlhub") / "fakehub.log"
    with running_fakehub(log, "--rate", str(CRAWL)) as url:
        yield url


def _open(url: str, path: str):
    """A GET of `path` on a connection of its own, its status line and headers read; (connection, response,
    seconds to the headers)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    t0 = time.monotonic()
    conn.request("GET", path)
    response = conn.getresponse()
    return conn, response, time.monotonic() - t0


def _first_bytes(response) -> tuple[bytes, float]:
    t0 = time.monotonic()
    return response.read1(64), time.monotonic() - t0


def test_a_slow_hub_answers_every_connection_at_once_and_trickles_each_body(crawling_hub):
    # huggingface_hub opens up to hf_max_workers connections at once, and reads each with a 10 s timeout
    # (HF_HUB_DOWNLOAD_TIMEOUT): a slow server must answer a new one while another is mid-body, and send each some
    # bytes every few seconds, not one file's time of silence and then all of it
    files = repos.build_repos()[repos.ENGRAM].files
    base = f"/{repos.ENGRAM}/resolve/main/"
    big, small = "model-00048-of-00048.safetensors", "model-00047-of-00048.safetensors"
    first, a, a_headers = _open(crawling_hub, base + big)
    second = None
    try:
        assert a.status == 200 and int(a.headers["Content-Length"]) == files[big].size and a_headers < 2
        got, wait = _first_bytes(a)
        assert got and wait < 3, wait  # before: the whole file's time at the rate (over 10 s) before its first byte
        assert len(got) < files[big].size  # mid-body
        second, b, b_headers = _open(crawling_hub, base + small)
        assert b.status == 200 and b_headers < 2, b_headers  # a second connection answered promptly
        got_b, wait_b = _first_bytes(b)
        assert got_b and wait_b < 3, wait_b  # and its body flows beside the first one's
        more, wait = _first_bytes(a)
        assert more and wait < 3, wait  # the first one goes on
        assert (got + more) == files[big].data[:len(got) + len(more)]
    finally:
        first.close()
        if second is not None:
            second.close()
