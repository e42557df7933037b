"""The worker's view of the head's checkpoint through the NFS volume (worker_weights = "nfs"): the facts that list
the served snapshot on each side, the pure comparison, and the refusal before the pair step."""

from __future__ import annotations

import os

import pytest
from harness import FakeHost, parse_fact, refused, run_fact, run_op
from settings_factory import make_pair

from operations import nfs
from operations.facts.nfs import SnapshotView, VolumeSnapshotView, snapshot_view_script
from operations.layout import SERVED_SYMLINK

COMMIT = "a" * 40
FILES = {"config.json": 120, "model-00001-of-00002.safetensors": 4_000_000_000,
         "model-00002-of-00002.safetensors": 3_500_000_000, "tokenizer.json": 9000}
HEAD = {"commit": COMMIT, "files": dict(FILES), "error": ""}
REPO = "/home/nvidia/.cache/huggingface/hub/models--Mia-AiLab--X"
IMAGE = "sparkfold/dsv41-tf:0123456789ab"


def view(commit=COMMIT, error="", **changes):
    files = {**FILES, **changes}
    return {"commit": commit, "files": {k: v for k, v in files.items() if v is not None}, "error": error}


# --- the facts ----------------------------------------------------------------------------------------------------

def hf_repo(root):
    """A Hugging Face cache's repo folder: blobs, a snapshot of links into them, the served link, one broken link."""
    repo = root / "models--Mia-AiLab--X"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / COMMIT
    (snap / "sub").mkdir(parents=True)
    for name, size in (("h1", 12), ("h2", 30)):
        (repo / "blobs" / name).write_bytes(b"x" * size)
    os.symlink("../../blobs/h1", snap / "config.json")
    os.symlink("../../../blobs/h2", snap / "sub" / "shard.safetensors")
    os.symlink("../../blobs/gone", snap / "tokenizer.json")  # its blob is not there: a half-visible file
    os.symlink(f"snapshots/{COMMIT}", repo / SERVED_SYMLINK)
    return repo


def test_snapshot_view_lists_names_and_sizes_through_the_links(tmp_path):
    repo = hf_repo(tmp_path)
    got = run_fact(SnapshotView, repo_folder=str(repo), link=SERVED_SYMLINK)
    assert got == {"commit": COMMIT, "files": {"config.json": 12, "sub/shard.safetensors": 30, "tokenizer.json": -1},
                   "error": ""}


def test_snapshot_view_without_the_folder_or_the_link_is_an_error(tmp_path):
    assert run_fact(SnapshotView, repo_folder=str(tmp_path / "nothing"), link=SERVED_SYMLINK)["error"] == \
        "no folder nothing"
    (tmp_path / "repo").mkdir()
    got = run_fact(SnapshotView, repo_folder=str(tmp_path / "repo"), link=SERVED_SYMLINK)
    assert got == {"commit": "", "files": {}, "error": f"no link {SERVED_SYMLINK}"}


def test_volume_view_runs_the_same_listing_in_a_throwaway_container_of_the_image():
    command = VolumeSnapshotView().command("models--Mia-AiLab--X", SERVED_SYMLINK, volume="sparkfold-hf",
                                           image=IMAGE)
    assert command.startswith("{ docker run --rm --pull never --network none "
                              "--mount type=volume,src=sparkfold-hf,dst=/hub,readonly --entrypoint sh "
                              f"{IMAGE} -c ")
    assert snapshot_view_script("/hub/models--Mia-AiLab--X", SERVED_SYMLINK)[:40] in command
    assert command.endswith('echo "#EXIT $?"; } 2>&1')


def test_volume_view_parses_a_listing_and_a_mount_that_failed():
    ok = parse_fact(VolumeSnapshotView, [f"#COMMIT snapshots/{COMMIT}", "config.json\t120", "#EXIT 0"])
    assert ok == {"commit": COMMIT, "files": {"config.json": 120}, "error": ""}
    failed = parse_fact(VolumeSnapshotView, [
        "docker: Error response from daemon: error while mounting volume: failed to mount local volume: mount "
        ":/home/nvidia/.cache/huggingface/hub:/var/lib/docker/volumes/sparkfold-hf/_data: connection timed out.",
        "#EXIT 125"])
    assert failed["error"].startswith("exit status 125: docker: Error response from daemon: error while mounting")
    assert parse_fact(VolumeSnapshotView, [])["error"] == "not read"  # no docker: pyinfra gives the default


# --- the comparison -----------------------------------------------------------------------------------------------

def test_equal_views_have_no_difference_and_no_problem():
    assert nfs.view_differences(HEAD, view()) == []
    assert nfs.view_problem(HEAD, view(), "sparkfold-hf") is None


def test_each_kind_of_difference_is_named_in_name_order():
    worker = view(**{"config.json": 100, "tokenizer.json": None, "model-00002-of-00002.safetensors": -1,
                     "extra.txt": 5})
    assert nfs.view_differences(HEAD, worker) == [
        "config.json has 100 bytes on the worker but 120 on the head",
        "extra.txt is only on the worker",
        "model-00002-of-00002.safetensors's blob cannot be reached from the worker",
        "tokenizer.json is missing on the worker",
    ]
    assert nfs.view_differences(view(**{"config.json": -1}), view()) == ["config.json's blob is missing on the head"]


def test_another_snapshot_on_the_worker_is_named():
    older = view(commit="b" * 40)
    assert nfs.view_differences(HEAD, older) == [
        f"the served link leads to snapshot {'b' * 40} on the worker but {COMMIT} on the head"]
    assert "leads to snapshot (nothing) on the worker" in nfs.view_differences(HEAD, view(commit=""))[0]


def test_a_differing_view_is_refused_naming_the_files_and_the_fix():
    problem = nfs.view_problem(HEAD, view(**{"tokenizer.json": None}), "sparkfold-hf")
    assert problem is not None
    assert "through docker volume sparkfold-hf otherwise than the head has it" in problem
    assert "tokenizer.json is missing on the worker" in problem
    assert "run stop.py, then deploy again" in problem and 'worker_weights = "copy"' in problem
    assert "Checking the share by hand" in problem


def test_many_differences_are_cut_short_with_a_count():
    worker = {"commit": COMMIT, "files": {}, "error": ""}
    head = {"commit": COMMIT, "files": {f"f{i:02}": i for i in range(12)}, "error": ""}
    problem = nfs.view_problem(head, worker, "v")
    assert problem is not None and "f07 is missing" in problem and "f08" not in problem and "(and 4 more)" in problem


def test_a_view_that_cannot_be_read_is_a_problem_naming_why():
    mount = nfs.view_problem(HEAD, view(error="exit status 125: mount failed"), "sparkfold-hf")
    assert mount is not None and "could not read the head's checkpoint through docker volume sparkfold-hf" in mount
    assert "(exit status 125: mount failed)" in mount and 'worker_weights = "copy"' in mount
    head = nfs.view_problem(view(error="no link sparkfold-current"), view(), "sparkfold-hf")
    assert head is not None and "the head's served snapshot could not be read (no link sparkfold-current)" in head


# --- the operation and the step -----------------------------------------------------------------------------------

def check(worker_view, head_view=HEAD):
    head = FakeHost({SnapshotView: head_view}, name="head")
    return dict(op=nfs.worker_view_checked, facts={VolumeSnapshotView: worker_view}, head=head, volume="sparkfold-hf",
                image=IMAGE, head_repo_folder=REPO, repo_in_volume="models--Mia-AiLab--X")


def test_the_same_view_passes_in_both_phases():
    for executing in (False, True):
        cmds, host = run_op(**check(view()), executing=executing)
        assert cmds == []
        assert host.noops == [f"the worker sees snapshot {COMMIT} through sparkfold-hf as the head has it"]


def test_a_stale_view_is_refused_before_the_pair_step(caplog):
    command, warnings = refused(caplog, **check(view(**{"model-00001-of-00002.safetensors": 1_000})))
    assert "view of the checkpoint: the worker sees the checkpoint through docker volume sparkfold-hf" in command
    assert "model-00001-of-00002.safetensors has 1000 bytes on the worker but 4000000000 on the head" in command
    assert "will fail: the worker's view of the checkpoint" in warnings


def test_a_view_not_readable_yet_waits_for_the_run_and_fails_it(caplog):
    not_yet = view(error="exit status 125: Unable to find image")
    with caplog.at_level("WARNING", logger="pyinfra"):
        cmds, host = run_op(**check(not_yet))
    assert cmds == [] and "will fail" not in caplog.text  # planning: the image reaches the worker later in this run
    assert host.noops == ["the worker's view of the checkpoint is compared with the head's when the run executes"]
    cmds, _ = run_op(**check(not_yet), executing=True)
    assert len(cmds) == 1 and cmds[0].endswith("exit 1") and "Unable to find image" in cmds[0]


@pytest.mark.parametrize("role, weights, called", [("worker", "nfs", True), ("head", "nfs", False),
                                                   ("worker", "copy", False)])
def test_the_step_checks_on_the_worker_with_nfs_only(monkeypatch, role, weights, called):
    calls = []
    monkeypatch.setattr(nfs, "worker_view_checked", lambda **kw: calls.append(kw))
    head_host = FakeHost({}, name="head")
    monkeypatch.setattr(nfs, "peer_host", lambda s: head_host)
    head, worker = make_pair(**{role: {"worker_weights": weights, "nfs": True}})
    nfs.nfs_view_checked._inner(worker if role == "worker" else head)
    if not called:
        assert calls == []
        return
    assert len(calls) == 1 and calls[0]["head"] is head_host and calls[0]["volume"] == "sparkfold-hf"
    assert calls[0]["head_repo_folder"] == head.layout.model_folder
    assert calls[0]["repo_in_volume"] == "models--Mia-AiLab--DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1-2.9-bpw"
    assert calls[0]["image"].startswith(worker.engine_image + ":")
