"""Token map and weight-file operations: both ways, partial files, changed commits, and a local end-to-end run of
the yielded commands through a stand-in docker (tests/unit/fake_docker.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from harness import run_fact, run_op, unwrap_progress, with_args
from hf_fixture import build_cache, model_files

from operations.data import weights
from operations.data.copy import SSH
from operations.facts.done import RankFileWhole, TokenMapWhole
from operations.facts.files import DirFiles, DiskFree, LinkTarget
from operations.facts.model import HfPlan, RankFolder

HERE = os.path.dirname(os.path.abspath(__file__))
COMMIT = "b" * 40
PLAN = {"python": "/v/bin/python", "repo": "Org/M", "revision": "main", "cache_dir": "/h/hub", "local_dir": "",
        "include": (), "token_path": "/s/t", "endpoint": ""}


def plan(complete=True, commit=COMMIT, total=2 * 2**30):
    return {"complete": complete, "commit": commit, "total_bytes": total, "manifest": complete}


def rank_kw(**over):
    return dict(dict(image_ref="img:1", rank=0, plan_args=PLAN, hf_cache="/h", rank_cache="/d/rank-cache", every=10),
                **over)


def run_all(commands, tmp_path):
    """Run yielded commands in a shell with the stand-in docker first on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    shim = bindir / "docker"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE}/fake_docker.py \"$@\"\n")
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FAKE_DOCKER_LOG=str(tmp_path / "docker.log"))
    for command in commands:
        subprocess.run(["sh", "-c", command], check=True, env=env, timeout=60)


def local_fact(cls, **kwargs):
    return run_fact(cls, **kwargs)


# ---- token map ----

def test_token_map_current_is_noop():
    facts = {HfPlan: plan(), TokenMapWhole: with_args({f"commit={COMMIT}, out_dir=/d/token-map": True})}
    cmds, h = run_op(weights.token_map_written, facts, image_ref="img", plan_args=PLAN, hf_cache="/h",
                     out_dir="/d/token-map")
    assert cmds == [] and COMMIT[:12] in h.noops[0]


def test_token_map_rewritten_when_commit_changed():
    facts = {HfPlan: plan(), TokenMapWhole: False}  # e.g. made from another commit
    cmds, _ = run_op(weights.token_map_written, facts, image_ref="img", plan_args=PLAN, hf_cache="/h",
                     out_dir="/d/token-map")
    # --init: a stopped stream's TERM reaches the tool (as PID 1 it would ignore it and write on)
    assert "docker run --rm --init --network none" in cmds[0] and "-v /h:/hf:ro" in cmds[0]
    assert f"/hf/hub/models--Org--M/snapshots/{COMMIT} /out/dsv41_token_map.json" in cmds[0]
    assert cmds[0].endswith(f"printf '%s\\n' {COMMIT} > /d/token-map/dsv41_token_map.json.commit")


def test_token_map_plans_before_the_checkpoint_exists_and_refuses_when_executing(caplog):
    facts = {HfPlan: plan(complete=False, commit=None), TokenMapWhole: False}
    with caplog.at_level("WARNING", logger="pyinfra"):
        cmds, _ = run_op(weights.token_map_written, facts, image_ref="img", plan_args=PLAN, hf_cache="/h",
                         out_dir="/d/t")
    assert weights.PENDING in cmds[0] and "docker run" in cmds[0]
    assert "will fail" not in caplog.text  # the download step of the same run comes first
    cmds, _ = run_op(weights.token_map_written, facts, executing=True, image_ref="img", plan_args=PLAN,
                     hf_cache="/h", out_dir="/d/t")
    assert cmds == ["echo 'sparkfold: token map: the checkpoint Org/M@main is not complete (its download must succeed "
                    "first)' >&2; exit 1"]


# ---- rank files ----

def test_rank_file_complete_is_noop():
    whole = with_args({f"folder=/d/rank-cache/{COMMIT}/rank0, rank=0, source={COMMIT}": True})
    cmds, h = run_op(weights.rank_file_written,
                     {HfPlan: plan(), RankFileWhole: whole, DiskFree: {"free_bytes": 10**12}}, **rank_kw())
    assert cmds == [] and "is current" in h.noops[0]


def test_rank_file_redone_after_clearing():
    # not whole (never written, interrupted, a stray second file, another source: test_background_data's cases)
    cmds, _ = run_op(weights.rank_file_written,
                     {HfPlan: plan(), RankFileWhole: False, DiskFree: {"free_bytes": 10**12}}, **rank_kw())
    assert cmds[0].startswith(f"mkdir -p /d/rank-cache/{COMMIT}/rank0 && rm -f ")
    assert "rank0of2-*.bin" in cmds[0] and ".rank0of2.partial" in cmds[0]
    label, write, options = unwrap_progress(cmds[1])  # the folder's size shown while the file is written
    assert "--entrypoint tf-dsv41-rank-cache img:1" in write and write.endswith(" /out 0 2")
    assert label == "rank 0's weight file"
    assert options[options.index("--size-of") + 1] == f"/d/rank-cache/{COMMIT}/rank0"


def test_rank_file_disk_check():
    facts = {HfPlan: plan(total=200 * 2**30), RankFileWhole: False, DiskFree: {"free_bytes": 50 * 2**30}}
    cmds, _ = run_op(weights.rank_file_written, facts, executing=True, **rank_kw(rank=1))
    # a failing command that says why (before, the message itself was yielded and run as a shell command)
    assert len(cmds) == 1 and "weight file needs 105.0 GiB free" in cmds[0] and cmds[0].endswith("exit 1")


def test_rank_file_from_ablit_pack_has_its_own_folder_and_source():
    # the stock file is whole; the overlay's folder is another
    folder = with_args({f"folder=/d/rank-cache/{COMMIT}/rank1, rank=1, source={COMMIT}": True,
                        f"folder=/d/rank-cache/{COMMIT}-ablit-t1/rank1, rank=1, source={COMMIT}-ablit-t1": False,
                        f"folder=/d/rank-cache/{COMMIT}-ablit-t2/rank1, rank=1, source={COMMIT}-ablit-t2": False})
    cmds, _ = run_op(weights.rank_file_written,
                     {HfPlan: plan(), RankFileWhole: folder, DiskFree: {"free_bytes": 10**12}},
                     **rank_kw(rank=1, ablit_dir="/d/ablit", ablit_tag="t1"))
    assert f"/d/rank-cache/{COMMIT}-ablit-t1/rank1" in cmds[0]
    assert f"-v /d/ablit/{COMMIT}-t1:/model:ro" in unwrap_progress(cmds[1])[1] and f"{COMMIT}-ablit-t1" in cmds[2]
    # another overlay revision writes another folder: the one a running rank mounts is never cleared
    other, _ = run_op(weights.rank_file_written,
                      {HfPlan: plan(), RankFileWhole: folder, DiskFree: {"free_bytes": 1e12}},
                      **rank_kw(rank=1, ablit_dir="/d/ablit", ablit_tag="t2"))
    assert f"/d/rank-cache/{COMMIT}-ablit-t2/rank1" in other[0] and "-ablit-t1" not in other[0]
    assert weights.pack_tag("r1", "w.safetensors") != weights.pack_tag("r2", "w.safetensors")


def test_rank_files_end_to_end_then_converged(tmp_path):
    built = build_cache(tmp_path / "hf" / "hub", "Org/M", model_files())
    plan_args = dict(PLAN, cache_dir=str(tmp_path / "hf" / "hub"))
    p = plan(commit=built["commit"])
    rank_cache = tmp_path / "data" / "rank-cache"
    kw = rank_kw(plan_args=plan_args, hf_cache=str(tmp_path / "hf"), rank_cache=str(rank_cache))
    folder = rank_cache / built["commit"] / "rank0"

    def facts():
        return {HfPlan: p, RankFileWhole: local_fact(RankFileWhole, folder=str(folder), rank=0, source=built["commit"]),
                DiskFree: local_fact(DiskFree, path=str(folder))}

    folder.mkdir(parents=True)
    (folder / ".rank0of2.partial").write_bytes(b"half")  # an interrupted run
    cmds, _ = run_op(weights.rank_file_written, facts(), executing=True, **kw)
    run_all(cmds, tmp_path)
    names = sorted(os.listdir(folder))
    assert len([n for n in names if n.startswith("rank0of2-") and n.endswith(".bin")]) == 1
    assert ".rank0of2.partial" not in names
    cmds, h = run_op(weights.rank_file_written, facts(), executing=True, **kw)
    assert cmds == [], h.noops


# ---- links, checksums, copy to the worker ----

def test_commit_symlink_both_ways():
    facts = {HfPlan: plan(), LinkTarget: f"snapshots/{COMMIT}"}
    assert run_op(weights.commit_symlink, facts, symlink="/h/hub/models--Org--M/sparkfold-current", plan_args=PLAN,
                  template="snapshots/{commit}")[0] == []
    facts[LinkTarget] = "snapshots/" + "c" * 40  # the revision moved
    cmds, _ = run_op(weights.commit_symlink, facts, symlink="/h/hub/models--Org--M/sparkfold-current", plan_args=PLAN,
                     template="snapshots/{commit}")
    link = "/h/hub/models--Org--M/sparkfold-current"
    assert cmds == [f"mkdir -p /h/hub/models--Org--M && ln -sfn snapshots/{COMMIT} {link}.new-link && "
                    f"mv -T {link}.new-link {link}"]  # renamed over the old link: never a moment without one


def test_commit_symlink_switch_for_real(tmp_path):
    link = tmp_path / "current"
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    link.symlink_to("old")
    cmds, _ = run_op(weights.commit_symlink, {HfPlan: plan(), LinkTarget: "old"}, symlink=str(link), plan_args=PLAN,
                     template="new")
    subprocess.run(["sh", "-c", cmds[0]], check=True)
    assert os.readlink(link) == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["current", "new", "old"]


def test_rank_sums_written_for_the_rank_file():
    from operations.facts.files import FolderCheck

    folder = {"bins": {1: ["rank1of2-abc.bin"]}, "partial": [], "source": COMMIT}
    cmds, _ = run_op(weights.rank_sums_written, {HfPlan: plan(), RankFolder: folder, FolderCheck: None},
                     plan_args=PLAN, rank_cache="/d/rc", rank=1, ablit_tag="", every=10)
    label, hashing, _options = unwrap_progress(cmds[0])
    assert label == "rank 1's weight file: hashing for SHA256SUMS" and hashing.startswith(f"cd /d/rc/{COMMIT}/rank1 ")
    assert "exec sha256sum -- rank1of2-abc.bin > SHA256SUMS.tmp" in hashing


def test_rank_file_to_peer_targets_same_layout_and_link():
    from operations.facts.files import PeerFolder

    facts = {HfPlan: plan(), DirFiles: {"rank1of2-abc.bin": [10, 1], "SHA256SUMS": [80, 1]},
             PeerFolder: {"reachable": True, "files": {}, "free": 10**9, "link": None}}
    cmds, _ = run_op(weights.rank_file_to_peer, facts, executing=True, plan_args=PLAN, rank_cache="/d/rc", rank=1,
                     ablit_tag="", target="n@w", peer_rank_cache="/w/rc", every=10)
    assert f"python3 - /d/rc/{COMMIT}/rank1 --target n@w --dest /w/rc/{COMMIT}/rank1 " in cmds[0]
    assert cmds[1] == (f"{SSH} n@w "
                       f"'ln -sfn {COMMIT}/rank1 /w/rc/active-rank1'")
