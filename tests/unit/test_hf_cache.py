"""hf_cache helpers, hf_plan offline and hf_fetch, on caches built in tmp dirs (hf_plan against the fake hub:
test_hf_plan.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import SimpleNamespace

from hf_fixture import build_cache, build_local, commit_of, model_files, siblings

from operations.facts.model import HfPlan
from operations.remote import bundle, hf_fetch, hf_plan
from operations.util import hf_cache

REPO = "Org/Tiny-Model"


def args(hub=None, local=None, revision="main", include=()):
    return SimpleNamespace(repo=REPO, revision=revision, cache_dir=str(hub) if hub else None,
                           local_dir=str(local) if local else None, include=list(include))


def record(files, commit, revision="main", include=()):
    return hf_cache.manifest_record(REPO, revision, commit, include, {p: len(d) for p, d in files.items()})


# ---- hf_cache ----

def test_repo_folder_and_revision_resolution(tmp_path):
    files = model_files()
    built = build_cache(tmp_path, REPO, files)
    assert hf_cache.repo_folder_name(REPO) == "models--Org--Tiny-Model"
    assert hf_cache.resolve_revision(str(built["repo_dir"]), "main") == built["commit"]
    assert hf_cache.resolve_revision(str(built["repo_dir"]), built["commit"]) == built["commit"]
    assert hf_cache.resolve_revision(str(built["repo_dir"]), "v2") is None
    assert hf_cache.resolve_revision(str(built["repo_dir"]), "0" * 40) is None


def test_list_files_follows_links_and_flags_dangling(tmp_path):
    files = model_files()
    built = build_cache(tmp_path, REPO, files)
    listed = hf_cache.list_files(str(built["snapshot"]))
    assert listed == {p: len(d) for p, d in files.items()}
    os.remove(built["repo_dir"] / "blobs" / hf_cache_etag("config.json", files))
    assert hf_cache.list_files(str(built["snapshot"]))["config.json"] is None


def hf_cache_etag(path, files):
    from hf_fixture import etag
    return etag(path, files[path])


def test_partials_of_huggingface_hub_2_are_found_by_their_etag(tmp_path):
    """2.x names a local_dir's partial file <hash>.<etag>.<tmp>.incomplete and a cache's <etag>.<tmp>.incomplete:
    the progress lines count their bytes."""
    files = model_files()
    shard = "model-00002-of-00002.safetensors"
    tag = hf_cache_etag(shard, files)
    download = tmp_path / "local" / ".cache" / "huggingface" / "download"
    download.mkdir(parents=True)
    (download / f"Zm9vYmFy.{tag}.0a1b2c3d.incomplete").write_bytes(b"x" * 9)
    assert hf_cache.incomplete_local(str(tmp_path / "local"))[tag] == 9
    args = hf_plan.parse_args(["--repo", REPO, "--local-dir", str(tmp_path / "local")])
    missing, need = hf_fetch.still_to_fetch(args, "c" * 40, [(shard, len(files[shard]), tag)])
    assert missing == [[shard, len(files[shard])]] and need == len(files[shard]) - 9
    built = build_cache(tmp_path / "hub", REPO, files, skip=(shard,))
    (built["repo_dir"] / "blobs" / f"{tag}.0a1b2c3d.incomplete").write_bytes(b"x" * 4)
    assert hf_cache.incomplete_blobs(str(built["repo_dir"])) == {tag: 4}


def test_incomplete_blobs_and_local_partials(tmp_path):
    files = model_files()
    shard = "model-00002-of-00002.safetensors"
    built = build_cache(tmp_path / "hub", REPO, files, partial={shard: 5})
    assert hf_cache.incomplete_blobs(str(built["repo_dir"])) == {hf_cache_etag(shard, files): 5}
    local = build_local(tmp_path / "local", files, partial={shard: 7})
    assert hf_cache.incomplete_local(str(local)) == {shard: 7}


def test_manifest_covers_and_detects_changes(tmp_path):
    files = model_files()
    built = build_cache(tmp_path, REPO, files)
    hf_cache.write_manifest(str(built["snapshot"]), record(files, built["commit"]))
    m = hf_cache.read_manifest(str(built["snapshot"]))
    assert hf_cache.manifest_covers(m, REPO, "main", ())
    assert hf_cache.manifest_covers(m, REPO, built["commit"], ["*.json"])  # all files cover any subset
    assert not hf_cache.manifest_covers(m, REPO, "v2", ())
    assert not hf_cache.manifest_covers(m, "Org/Other", "main", ())
    assert hf_cache.manifest_missing(str(built["snapshot"]), m) == []
    (built["snapshot"] / "tokenizer.json").unlink()
    assert hf_cache.manifest_missing(str(built["snapshot"]), m) == [["tokenizer.json", len(files["tokenizer.json"])]]


def test_matches_allow_patterns():
    assert hf_cache.matches("kit/aot/x.cubin", ["kit/*"])
    assert hf_cache.matches("kit/MANIFEST", ["kit/"])
    assert not hf_cache.matches("README.md", ["kit/*"])
    assert hf_cache.matches("anything", [])


# ---- hf_plan offline, exactly as the fact runs it, with the network forbidden ----

def _no_network_env(tmp_path):
    site = tmp_path / "nonet"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import socket\n"
        "def _refuse(*a, **k):\n    raise OSError('network forbidden in this test')\n"
        "socket.socket.connect = _refuse\nsocket.create_connection = _refuse\nsocket.getaddrinfo = _refuse\n")
    return dict(os.environ, PYTHONPATH=str(site), HF_HUB_OFFLINE="0", HF_HOME=str(tmp_path / "hfhome"))


def run_fact(tmp_path, **kwargs):
    command = HfPlan().command(**kwargs)
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=_no_network_env(tmp_path),
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return HfPlan().process(done.stdout.splitlines())


def test_fact_answers_offline_for_a_complete_snapshot(tmp_path):
    files = model_files()
    built = build_cache(tmp_path / "hub", REPO, files)
    hf_cache.write_manifest(str(built["snapshot"]), record(files, built["commit"]))
    out = run_fact(tmp_path, python=sys.executable, repo=REPO, revision="main", cache_dir=str(tmp_path / "hub"),
                   endpoint="http://127.0.0.1:9")
    assert out["complete"] is True and out["offline"] is True and out["commit"] == built["commit"]
    assert out["missing_bytes"] == 0 and out["model_type"] == "deepseek_v41"


def test_fact_incomplete_snapshot_offline_reports_error_and_exits_0(tmp_path):
    files = model_files()
    built = build_cache(tmp_path / "hub", REPO, files, partial={"model-00001-of-00002.safetensors": 3})
    hf_cache.write_manifest(str(built["snapshot"]), record(files, built["commit"]))
    out = run_fact(tmp_path, python="/nonexistent/python", repo=REPO, revision="main",
                   cache_dir=str(tmp_path / "hub"), endpoint="http://127.0.0.1:9")
    assert out["complete"] is False and out["error"] and out["commit"] == built["commit"]


def test_bundled_fetch_runs_as_sent_and_fails_cleanly_offline(tmp_path):
    from operations.remote import heredoc_command

    head = f"{sys.executable} - --repo {REPO} --revision main --cache-dir {tmp_path}"
    done = subprocess.run(["sh", "-c", heredoc_command(head, "hf_fetch")], capture_output=True, text=True,
                          env=dict(_no_network_env(tmp_path), HF_ENDPOINT="http://127.0.0.1:9"), timeout=60)
    assert done.returncode == 1 and f"sparkfold: cannot list {REPO}@main" in done.stderr, done.stderr


def test_bundle_is_one_valid_script():
    for name in ("hf_plan", "hf_fetch"):
        source = bundle(name)
        compile(source, name, "exec")
        assert source.count("from __future__ import annotations") == 1


# ---- hf_fetch with snapshot_download scripted ----

def _fake_download(hub_dir, files, commit, workers=8):
    def snapshot_download(repo, revision, allow_patterns=None, token=None, endpoint=None, cache_dir=None,
                          local_dir=None, max_workers=None):
        assert revision == commit and local_dir is None and max_workers == workers
        return str(build_cache(hub_dir, repo, files, revision=commit, commit=commit)["snapshot"])
    return snapshot_download


def test_fetch_downloads_writes_ref_and_manifest(tmp_path, monkeypatch):
    import huggingface_hub

    files = model_files()
    commit = commit_of(files)
    monkeypatch.setattr(hf_fetch, "hub_files", lambda repo, rev, pats: (commit, siblings(files)))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _fake_download(tmp_path, files, commit, workers=3))
    rc = hf_fetch.main(["--repo", REPO, "--revision", "main", "--cache-dir", str(tmp_path),
                        "--expect-model-type", "deepseek_v41", "--every", "0.01", "--max-workers", "3"])
    assert rc == 0
    repo_dir = tmp_path / "models--Org--Tiny-Model"
    assert (repo_dir / "refs" / "main").read_text() == commit
    manifest = hf_cache.read_manifest(str(repo_dir / "snapshots" / commit))
    assert manifest["files"] == {p: len(d) for p, d in files.items()} and manifest["commit"] == commit


def test_fetch_refuses_wrong_model_type(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    files = dict(model_files(), **{"config.json": b'{"model_type": "llama"}\n'})
    commit = commit_of(files)
    monkeypatch.setattr(hf_fetch, "hub_files", lambda repo, rev, pats: (commit, siblings(files)))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _fake_download(tmp_path, files, commit))
    rc = hf_fetch.main(["--repo", REPO, "--revision", "main", "--cache-dir", str(tmp_path),
                        "--expect-model-type", "deepseek_v41"])
    assert rc == 1 and "'llama'" in capsys.readouterr().err
    assert hf_cache.read_manifest(str(tmp_path / "models--Org--Tiny-Model" / "snapshots" / commit)) is None


def test_fetch_reports_short_files(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    files = model_files()
    commit = commit_of(files)
    listed = [(p, s + 1 if p == "config.json" else s, e) for p, s, e in siblings(files)]
    monkeypatch.setattr(hf_fetch, "hub_files", lambda repo, rev, pats: (commit, listed))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _fake_download(tmp_path, files, commit))
    rc = hf_fetch.main(["--repo", REPO, "--revision", commit, "--cache-dir", str(tmp_path)])
    assert rc == 1 and "config.json" in capsys.readouterr().err
    assert hf_cache.read_manifest(str(tmp_path / "models--Org--Tiny-Model" / "snapshots" / commit)) is None


def test_fetch_progress_counts_the_files_already_whole(tmp_path, capsys):
    import threading

    from operations.model_data import FILES_WHOLE

    (tmp_path / "a.json").write_bytes(b"abc")  # whole
    (tmp_path / "b.safetensors").write_bytes(b"12")  # short: still coming
    files = [["a.json", 3, "e1"], ["b.safetensors", 5, "e2"], ["c.safetensors", 4, "e3"]]
    args = hf_plan.parse_args(["--repo", REPO, "--local-dir", str(tmp_path)])
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    hf_fetch.report_progress(args, "c" * 40, files, 12, stop, 0.05)
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.endswith(", 1 of 3 files whole") for line in lines), lines
    assert re.search(FILES_WHOLE, lines[-1]).group(0) == "1 of 3 files whole"  # what the runner shows of it


def test_a_commit_is_exactly_40_hex():
    assert hf_cache.is_commit("a" * 40)
    assert not hf_cache.is_commit("a" * 40 + "\n")  # `$` would match before the newline
