"""The download planner (operations/remote/hf_plan.py) as the HfPlan fact runs it on the head, against the fake hub
(tests/sim/fakehub) with the real huggingface_hub: huggingface_hub's dry run plans, nothing is written while
planning, a complete download is answered offline, and what the head's environment gives reaches huggingface_hub."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakehub_proc import FAKEHUB, running_fakehub

from operations.facts.model import HfPlan, HfPlansOffline, hf_plans_kept, plan_words
from operations.facts.model import hf_plan as kept_plan
from operations.remote import hf_plan
from operations.util import hf_cache

_spec = importlib.util.spec_from_file_location("fakehub_repos", FAKEHUB / "repos.py")
repos = sys.modules.setdefault("fakehub_repos", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(repos)
CATALOG = repos.catalog()
CHECKPOINT = repos.EAQ_V1
COMMIT = CATALOG[CHECKPOINT]["commit"]
SIZES = CATALOG[CHECKPOINT]["files"]
ENGRAM_FILES = ["config.json", "model-00047-of-00048.safetensors"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    log = tmp_path_factory.mktemp("fakehub") / "fakehub.log"
    with running_fakehub(log) as url:
        yield {"url": url, "log": log}


def requests_since(hub, mark: int) -> list[str]:
    return hub["log"].read_text().splitlines()[mark:]


def mark(hub) -> int:
    return len(hub["log"].read_text().splitlines())


def head_env(tmp_path: Path, **extra) -> dict:
    """The environment of a fresh ssh session on the head: its own HF_HOME, no token, no proxy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING")) and "proxy" not in k.lower()}
    return dict(env, HF_HOME=str(tmp_path / "head-home"), **extra)


def plan(hub, tmp_path, *, python=sys.executable, env=None, **args) -> dict:
    """The HfPlan fact's command run in a shell, as pyinfra runs it on the head."""
    args = {"python": python, "repo": CHECKPOINT, "revision": "main", "endpoint": hub["url"], **args}
    done = subprocess.run(["sh", "-c", HfPlan().command(**args)], capture_output=True, text=True, timeout=120,
                          env=head_env(tmp_path, **(env or {})))
    assert done.returncode == 0, done.stderr
    return HfPlan().process(done.stdout.splitlines())


def tree(folder: Path) -> dict:
    """Every entry under `folder` with its size and mtime: what "nothing was written" compares."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (p.is_dir(), p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in folder.rglob("*")}


def download(hub, **where) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(endpoint=hub["url"], token=False, **where)


def test_a_fresh_cache_is_planned_by_huggingface_hub_and_nothing_is_written(hub, tmp_path):
    cache = tmp_path / "hub"
    cache.mkdir()
    got = plan(hub, tmp_path, cache_dir=str(cache))
    assert got["error"] is None and got["offline"] is False and got["commit"] == COMMIT
    assert got["complete"] is False and dict(got["missing"]) == SIZES
    assert got["missing_bytes"] == got["total_bytes"] == sum(SIZES.values())
    assert tree(cache) == {}  # no ref for "main", no blob, no lock: planning writes nothing
    assert not any(" GET " in line and "/resolve/" in line for line in requests_since(hub, 0))


def test_a_complete_download_is_complete_then_answered_offline_with_its_manifest(hub, tmp_path):
    cache = tmp_path / "hub"
    snapshot = Path(download(hub, repo_id=CHECKPOINT, cache_dir=cache))
    got = plan(hub, tmp_path, cache_dir=str(cache))
    assert got["complete"] is True and got["missing"] == [] and got["missing_bytes"] == 0
    assert got["manifest"] is False and got["model_type"] == "deepseek_v41"  # not by hf_fetch: it runs once more
    hf_cache.write_manifest(str(snapshot), hf_cache.manifest_record(CHECKPOINT, "main", COMMIT, (), SIZES))
    start = mark(hub)
    offline = plan(hub, tmp_path, cache_dir=str(cache), endpoint="http://127.0.0.1:9")  # no Hub to ask
    assert offline["complete"] and offline["manifest"] and offline["offline"] and offline["commit"] == COMMIT
    assert requests_since(hub, start) == []


def test_a_blob_already_there_costs_nothing_and_a_killed_download_is_fetched_whole(hub, tmp_path):
    """huggingface_hub 2 links a blob it holds without fetching it, and never resumes a partial file a killed
    download left (each download writes its own temp file): the plan counts exactly what a download transfers."""
    cache = tmp_path / "hub"
    snapshot = Path(download(hub, repo_id=CHECKPOINT, cache_dir=cache))
    shard, other = "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"
    (snapshot / shard).unlink()  # the link is gone, its blob is still there
    blob = (snapshot / other).resolve()
    (blob.parent / f"{blob.name}.0a1b2c3d.incomplete").write_bytes(blob.read_bytes()[:SIZES[other] // 2])
    (snapshot / other).unlink()
    blob.unlink()
    got = plan(hub, tmp_path, cache_dir=str(cache))
    assert dict(got["missing"]) == {shard: SIZES[shard], other: SIZES[other]}
    assert got["missing_bytes"] == SIZES[other] and got["complete"] is False


def test_a_local_dir_is_planned_through_a_scratch_copy(hub, tmp_path):
    engram = tmp_path / "engram"
    args = {"repo": repos.ENGRAM, "local_dir": str(engram), "include": tuple(ENGRAM_FILES)}
    fresh = plan(hub, tmp_path, **args)
    assert dict(fresh["missing"]) == {f: CATALOG[repos.ENGRAM]["files"][f] for f in ENGRAM_FILES}
    assert not engram.exists()  # the dry run wrote its locks into the scratch copy, not here
    download(hub, repo_id=repos.ENGRAM, local_dir=engram, allow_patterns=ENGRAM_FILES)
    before = tree(engram)
    done = plan(hub, tmp_path, **args)
    assert done["complete"] is True and done["missing_bytes"] == 0
    assert done["commit"] == CATALOG[repos.ENGRAM]["commit"]
    assert tree(engram) == before  # huggingface_hub's metadata and locks untouched
    (engram / "config.json").write_text("{}")  # changed by hand, later: the metadata no longer vouches for it
    later = (engram / "config.json").stat().st_mtime + 60
    os.utime(engram / "config.json", (later, later))
    changed = plan(hub, tmp_path, **args)
    assert [path for path, _size in changed["missing"]] == ["config.json"] and changed["complete"] is False


def test_a_gated_repo_is_planned_with_the_token_file(hub, tmp_path):
    args = {"repo": repos.ABLIT, "revision": repos.COMMITS[repos.ABLIT], "local_dir": str(tmp_path / "overlay"),
            "include": ("apply_mia_exl3_wob.py",)}
    refused = plan(hub, tmp_path, **args)
    assert refused["complete"] is False and "GatedRepoError" in refused["error"]
    token = tmp_path / "hf-token"
    token.write_text("hf_simtoken")
    allowed = plan(hub, tmp_path, token_path=str(token), **args)
    script = CATALOG[repos.ABLIT]["files"]["apply_mia_exl3_wob.py"]
    assert allowed["error"] is None and allowed["missing_bytes"] == script


def test_an_unknown_revision_is_reported_and_the_fact_still_exits_0(hub, tmp_path):
    got = plan(hub, tmp_path, revision="no-such-branch", cache_dir=str(tmp_path / "hub"))
    assert got["complete"] is False and got["missing_bytes"] is None and "RevisionNotFound" in got["error"]


def test_without_huggingface_hub_the_size_is_unknown_and_says_why(hub, tmp_path):
    bundle = HfPlan().command(python=sys.executable, repo=CHECKPOINT, revision="main", cache_dir=str(tmp_path))
    no_site = bundle.replace(f"PY={sys.executable};", f"PY={sys.executable}; set -- -I -S;").replace(
        '"$PY" -', '"$PY" "$@" -')
    done = subprocess.run(["sh", "-c", no_site], capture_output=True, text=True, env=head_env(tmp_path), timeout=60)
    got = HfPlan().process(done.stdout.splitlines())
    assert got["missing_bytes"] is None and "huggingface_hub is not installed on the head yet" in got["error"]


def test_a_huggingface_hub_without_dry_run_is_named(monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, revision=None, cache_dir=None: "")
    got = hf_plan.plan(hf_plan.parse_args(["--repo", CHECKPOINT, "--cache-dir", str(tmp_path)]))
    assert "cannot plan a download (no dry_run)" in got["error"] and got["missing_bytes"] is None


def test_the_dry_run_gets_the_commit_the_patterns_and_max_workers(monkeypatch, tmp_path):
    import huggingface_hub

    seen = {}

    class Api:
        def __init__(self, endpoint=None):
            seen["endpoint"] = endpoint

        def repo_info(self, repo, revision, token):
            seen["resolved"] = revision
            return type("Info", (), {"sha": COMMIT})()

    def dry_run(repo_id, dry_run=False, **kw):
        seen.update(kw, dry_run=dry_run)
        return []

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", dry_run)
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example")
    got = hf_plan.plan(hf_plan.parse_args(["--repo", CHECKPOINT, "--revision", "main", "--cache-dir", str(tmp_path),
                                           "--include", "*.json", "--max-workers", "3"]))
    assert seen["resolved"] == "main" and seen["revision"] == COMMIT and seen["dry_run"] is True
    assert seen["max_workers"] == 3 and seen["allow_patterns"] == ["*.json"] and seen["cache_dir"] == str(tmp_path)
    assert seen["endpoint"] == "http://mirror.example"
    assert got["error"] == f"no file of {CHECKPOINT}@main matches ['*.json']"


def test_the_sourced_variables_reach_the_planner_and_never_its_command_line(tmp_path):
    """The hf-env file is sourced before the planner starts (huggingface_hub reads its variables at import)."""
    env_file = tmp_path / "hf-env"
    env_file.write_text("export HTTPS_PROXY='http://u:s3cret@proxy:3128'\nexport HF_HUB_DOWNLOAD_TIMEOUT=77\n")
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nenv > {tmp_path}/seen; cat > /dev/null; echo '{{}}'\n")
    fake.chmod(0o755)
    command = HfPlan().command(python=str(fake), repo=CHECKPOINT, revision="main", cache_dir="/h",
                               env_file=str(env_file), max_workers=5)
    assert "s3cret" not in command and "--max-workers 5" in command
    subprocess.run(["sh", "-c", command], check=True, timeout=30, env=head_env(tmp_path))
    seen = (tmp_path / "seen").read_text().splitlines()
    assert "HTTPS_PROXY=http://u:s3cret@proxy:3128" in seen and "HF_HUB_DOWNLOAD_TIMEOUT=77" in seen
    absent = HfPlan().command(python=str(fake), repo=CHECKPOINT, revision="main", cache_dir="/h",
                              env_file=str(tmp_path / "none"))
    assert subprocess.run(["sh", "-c", absent], timeout=30, env=head_env(tmp_path)).returncode == 0
    assert "HTTPS_PROXY" not in (tmp_path / "seen").read_text()


def test_the_answer_is_one_json_line(hub, tmp_path):
    command = HfPlan().command(python=sys.executable, repo=CHECKPOINT, revision=COMMIT, cache_dir=str(tmp_path),
                               endpoint=hub["url"])
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=head_env(tmp_path), timeout=60)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and json.loads(lines[0])["commit"] == COMMIT


def test_offline_batch_answers_each_complete_download_as_its_own_plan_does_and_asks_no_hub(hub, tmp_path):
    """HfPlansOffline: one python answers several downloads, in order; a complete manifest-covered one exactly as
    HfPlan answers it, one that needs the Hub (not downloaded, another revision) with None; no request to the Hub."""
    cache = tmp_path / "hub"
    snapshot = Path(download(hub, repo_id=CHECKPOINT, cache_dir=cache))
    hf_cache.write_manifest(str(snapshot), hf_cache.manifest_record(CHECKPOINT, "main", COMMIT, (), SIZES))
    complete = {"repo": CHECKPOINT, "revision": "main", "cache_dir": str(cache), "local_dir": "", "include": ()}
    elsewhere = dict(complete, cache_dir=str(tmp_path / "empty"))
    other_revision = dict(complete, revision="f" * 40)
    requests = tuple(tuple(plan_words(**r)) for r in (complete, elsewhere, other_revision)) + (("--bogus",),)
    start = mark(hub)
    done = subprocess.run(["sh", "-c", HfPlansOffline().command(requests=requests)], capture_output=True, text=True,
                          timeout=60, env=head_env(tmp_path))
    assert done.returncode == 0, done.stderr
    got = HfPlansOffline().process(done.stdout.splitlines())
    assert got[1:] == [None, None, None]  # the Hub must be asked; and a request that is not one
    assert got[0] == plan(hub, tmp_path, cache_dir=str(cache), endpoint="http://127.0.0.1:9")
    assert got[0]["complete"] and got[0]["manifest"]
    assert requests_since(hub, start) == []


def test_the_batch_keeps_only_complete_plans_and_hf_plan_then_asks_nothing_more():
    from harness import FakeHost, _State
    from pyinfra.context import ctx_state

    base = {"python": "python3", "revision": "main", "cache_dir": "/hf/hub", "local_dir": "", "include": (),
            "token_path": "/s/t", "endpoint": "", "env_file": "/s/e", "max_workers": 8}
    done, needed = dict(base, repo="a/done"), dict(base, repo="b/needed")
    complete = {"complete": True, "manifest": True, "commit": "c" * 40}
    spark = FakeHost({HfPlansOffline: [complete, None], HfPlan: {"complete": False}}, name="head")
    with ctx_state.use(_State(False)):
        hf_plans_kept(spark, [done, needed])
        assert kept_plan(spark, **done) == complete
        assert kept_plan(spark, **needed) == {"complete": False}  # asked on its own (the Hub)
        hf_plans_kept(spark, [done])  # nothing left to batch: not asked again
    asked = [name.rsplit(".", 1)[1] for name, _ in spark.fact_calls]
    assert asked == ["HfPlansOffline", "HfPlan"], asked
    assert spark.fact_calls[0][1]["requests"] == tuple(
        ("--repo", repo, "--revision", "main", "--max-workers", "8", "--cache-dir", "/hf/hub")
        for repo in ("a/done", "b/needed"))


def test_a_batch_answer_of_the_wrong_length_keeps_nothing():
    from harness import FakeHost, _State
    from pyinfra.context import ctx_state

    args = {"python": "python3", "repo": "a/b", "revision": "main", "cache_dir": "/hf/hub", "local_dir": "",
            "include": (), "token_path": "", "endpoint": "", "env_file": "", "max_workers": 8}
    spark = FakeHost({HfPlansOffline: [], HfPlan: {"complete": False}}, name="head")
    with ctx_state.use(_State(False)):
        hf_plans_kept(spark, [args])
        assert kept_plan(spark, **args) == {"complete": False}
    assert HfPlansOffline().process(["not json"]) == []
