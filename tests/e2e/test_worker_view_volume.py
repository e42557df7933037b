"""The worker's view of the checkpoint through a docker volume (operations/nfs.py, nfs_view_checked), read for real
on the simulated Sparks: the `docker run` the check runs on the worker, the listing it runs on the head.

The simulated kernel has no NFS, so the same small Hugging Face repo folder (blobs, a snapshot of links into them,
the served link) is made on both Sparks, the worker's read through a bind volume; a volume of type nfs shows a mount
that fails. The image is the engine base image the simulation loads into each Spark's Docker (Debian, with find),
so the pair's state is neither needed nor touched.
"""

from __future__ import annotations

from operations import nfs
from operations.facts.nfs import SnapshotView, VolumeSnapshotView
from operations.layout import SERVED_SYMLINK

SCRATCH = "/tmp/sparkfold-view-test"
FOLDER = "models--sparkfold--view-test"
COMMIT = "c" * 40
VOLUME, NFS_VOLUME = "sparkfold-view-test", "sparkfold-view-test-nfs"
IMAGE = "sparkfold-sim/engine-base:bookworm"  # loaded into each simulated Spark's dockerd at start
MAKE_REPO = (f"rm -rf {SCRATCH} && r={SCRATCH}/hub/{FOLDER} && mkdir -p $r/blobs $r/snapshots/{COMMIT}/sub && "
             "head -c 120 /dev/zero > $r/blobs/b1 && head -c 3000 /dev/zero > $r/blobs/b2 && "
             f"ln -s ../../blobs/b1 $r/snapshots/{COMMIT}/config.json && "
             f"ln -s ../../../blobs/b2 $r/snapshots/{COMMIT}/sub/model.safetensors && "
             f"ln -s snapshots/{COMMIT} $r/{SERVED_SYMLINK}")


def fact(sim_exec, role, cls, **args):
    out = sim_exec(role, cls().command(**args), user="nvidia")
    return cls().process(out.stdout.splitlines())


def test_the_worker_view_through_a_volume_matches_the_head_until_a_file_differs(sim_exec):
    for role in ("head", "worker"):
        made = sim_exec(role, MAKE_REPO, user="nvidia")
        assert made.returncode == 0, made.stderr
    volumes = (f"docker volume create --driver local --opt type=none --opt o=bind --opt device={SCRATCH}/hub "
               f"{VOLUME} && docker volume create --driver local --opt type=nfs --opt o=addr=192.168.100.1,ro "
               f"--opt device=:{SCRATCH}/hub {NFS_VOLUME}")
    made = sim_exec("worker", volumes, user="nvidia")
    assert made.returncode == 0, made.stderr
    try:
        head_view = fact(sim_exec, "head", SnapshotView, repo_folder=f"{SCRATCH}/hub/{FOLDER}", link=SERVED_SYMLINK)
        assert head_view == {"commit": COMMIT, "files": {"config.json": 120, "sub/model.safetensors": 3000},
                             "error": ""}
        seen = fact(sim_exec, "worker", VolumeSnapshotView, repo_folder=FOLDER, link=SERVED_SYMLINK, volume=VOLUME,
                    image=IMAGE)
        assert seen == head_view and nfs.view_problem(head_view, seen, VOLUME) is None
        # a blob cut short and one gone on the worker's side: each named
        cut = sim_exec("worker", f"truncate -s 1 {SCRATCH}/hub/{FOLDER}/blobs/b2 && rm {SCRATCH}/hub/{FOLDER}/blobs/b1",
                       user="nvidia")
        assert cut.returncode == 0, cut.stderr
        seen = fact(sim_exec, "worker", VolumeSnapshotView, repo_folder=FOLDER, link=SERVED_SYMLINK, volume=VOLUME,
                    image=IMAGE)
        assert nfs.view_differences(head_view, seen) == [
            "config.json's blob cannot be reached from the worker",
            "sub/model.safetensors has 1 bytes on the worker but 3000 on the head"]
        # a volume that cannot be mounted (no NFS in this kernel): docker's error is the view's
        failed = fact(sim_exec, "worker", VolumeSnapshotView, repo_folder=FOLDER, link=SERVED_SYMLINK,
                      volume=NFS_VOLUME, image=IMAGE)
        assert failed["error"].startswith("exit status "), failed
        problem = nfs.view_problem(head_view, failed, NFS_VOLUME)
        assert problem and f"could not read the head's checkpoint through docker volume {NFS_VOLUME}" in problem
    finally:
        sim_exec("worker", f"docker volume rm -f {VOLUME} {NFS_VOLUME}", user="nvidia")
        for role in ("head", "worker"):
            sim_exec(role, f"rm -rf {SCRATCH}", user="nvidia")
