"""ABLIT overlay pack: token refusal, both ways, and a local end-to-end apply that must leave the stock snapshot
byte-for-byte untouched (so ABLIT=0 serves it again without a download)."""

from __future__ import annotations

import os

from harness import refused, run_op, unwrap_progress
from hf_fixture import build_cache, model_files
from test_model_data import settings
from test_weights import local_fact, run_all

from operations.data import ablit
from operations.facts.files import DiskFree, FileText
from operations.facts.model import AblitShards, HfPlan
from operations.rank.plan import served_model_path
from operations.util import hf_cache

COMMIT = "e" * 40
PLAN = {"python": "/v/bin/python", "repo": "Org/M", "revision": "main", "cache_dir": "/h/hub", "local_dir": "",
        "include": (), "token_path": "/s/t", "endpoint": ""}


def kw(**over):
    return dict(dict(image_ref="img", plan_args=PLAN, hf_cache="/h", overlay="/d/ablit-overlay",
                     ablit_file="w.safetensors", ablit_root="/d/ablit", overlay_revision="r1", has_token=True,
                     every=10), **over)


def test_refuses_without_token_before_anything(caplog):
    command, warnings = refused(caplog, ablit.ablit_applied, {}, **kw(has_token=False))  # {}: no fact is read
    assert "sparkfold: HF_TOKEN: ablit needs HF_TOKEN" in command
    assert "spark: will fail: HF_TOKEN: ablit needs HF_TOKEN" in warnings and "export HF_TOKEN=<token>" in warnings


def test_current_pack_is_noop_and_other_overlay_revision_reapplies():
    facts = {HfPlan: {"complete": True, "commit": COMMIT}, FileText: f"{COMMIT} r1 w.safetensors",
             AblitShards: {"s2": 10}, DiskFree: {"free_bytes": 10**9}}
    assert run_op(ablit.ablit_applied, facts, **kw())[0] == []
    cmds, _ = run_op(ablit.ablit_applied, facts, **kw(overlay_revision="r2"))
    assert "--entrypoint python3 img /overlay/apply_mia_exl3_wob.py" in cmds[1]
    assert "-v /d/ablit:/ablit " in cmds[1] and "-v /d/ablit-overlay:/overlay:ro" in cmds[1]
    pack = f"{COMMIT}-{ablit.pack_tag('r2', 'w.safetensors')}"  # a new revision: a new folder beside the served one
    assert pack != f"{COMMIT}-{ablit.pack_tag('r1', 'w.safetensors')}"
    assert f"--src /ablit/{pack}.src --wo-b /overlay/w.safetensors --dst /ablit/{pack}.out" in cmds[1]
    label, _, options = unwrap_progress(cmds[1])  # minutes on a real checkpoint: the GiB written so far
    assert label == "ABLIT overlay: applying" and options[options.index("--size-of") + 1] == f"/d/ablit/{pack}.out"


def test_disk_check_counts_the_rewritten_shards():
    facts = {HfPlan: {"complete": True, "commit": COMMIT}, FileText: None, AblitShards: {"a": 6 * 2**30,
                                                                                         "b": 4 * 2**30},
             DiskFree: {"free_bytes": 2**30}}
    cmds, _ = run_op(ablit.ablit_applied, facts, executing=True, **kw())
    assert len(cmds) == 1 and "needs 10.0 GiB free under /d/ablit" in cmds[0]


def test_apply_end_to_end_keeps_stock_untouched(tmp_path):
    files = model_files()
    hub = tmp_path / "hf" / "hub"
    built = build_cache(hub, "Org/M", files)
    record = hf_cache.manifest_record("Org/M", "main", built["commit"], (), {p: len(d) for p, d in files.items()})
    hf_cache.write_manifest(str(built["snapshot"]), record)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "w.safetensors").write_bytes(b"overlay")
    root = tmp_path / "data" / "ablit"
    args = kw(plan_args=dict(PLAN, cache_dir=str(hub)), hf_cache=str(tmp_path / "hf"), overlay=str(overlay),
              ablit_root=str(root))
    dst = root / f"{built['commit']}-{ablit.pack_tag('r1', 'w.safetensors')}"

    def facts():
        return {HfPlan: {"complete": True, "commit": built["commit"]},
                FileText: local_fact(FileText, path=f"{dst}/.sparkfold-source"),
                AblitShards: local_fact(AblitShards, snapshot=str(built["snapshot"])),
                DiskFree: local_fact(DiskFree, path=str(root))}

    cmds, _ = run_op(ablit.ablit_applied, facts(), executing=True, **args)
    run_all(cmds, tmp_path)

    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    assert (dst / shard2).read_bytes() == b"abliterated shard"
    assert os.stat(dst / shard1).st_ino == os.stat(built["snapshot"] / shard1).st_ino  # a hard link, no copy
    assert not (dst / shard1).is_symlink() and not (dst / hf_cache.MANIFEST_NAME).exists()
    # the stock snapshot is unchanged: same bytes, manifest still complete (ABLIT=0 needs no download)
    assert (built["snapshot"] / shard2).read_bytes() == files[shard2]
    assert hf_cache.manifest_missing(str(built["snapshot"]), hf_cache.read_manifest(str(built["snapshot"]))) == []
    assert sorted(os.listdir(root)) == [dst.name]  # no staging folders left

    cmds, h = run_op(ablit.ablit_applied, facts(), executing=True, **args)
    assert cmds == [], h.noops


def test_ablit_off_serves_stock_again():
    on = served_model_path(settings(ablit=True))
    off = served_model_path(settings(ablit=False))
    assert on[1] == "/model-ablit/current" and off[1].endswith("/hub/models--Org--M/sparkfold-current")
