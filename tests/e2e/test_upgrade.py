"""Generations on the simulated pair: a switch that fails is rolled back, the exact gate, rollback.py, pruning and
an interrupted switch. A faulty engine is made only by its build context (a copy of tests/sim/engine with a fault
file the stand-in reads, tests/sim/engine/faults/README.md), never by a flag of the deploy.

Each test starts from a converged pair (converged_pair) and leaves it converged on the fault-free engine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from test_deploy import (
    DEPLOY,
    changed_ops,
    chat,
    container_id,
    deploy,
    failing_deploy,
    pair_ids,
    start_deploy,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
STATE = "/var/lib/sparkfold/generations"  # layout.GENERATIONS_DIR: root's, 0700
MARKER = "[sim fault replies-differ]"


def faulty_engine(tmp_path: Path, fault: str) -> dict[str, str]:
    """The environment of a deploy whose engine image carries `fault` (a new image: its context differs)."""
    context = tmp_path / f"engine-{fault}"
    shutil.copytree(ROOT / "tests/sim/engine", context)
    (context / "faults" / fault).write_text("on\n")
    return {"SPARKFOLD_ENGINE_CONTEXT": str(context)}


def spec_hashes(sim_exec) -> tuple[str, str]:
    return tuple(sim_exec(role, ["docker", "inspect", "-f", '{{index .Config.Labels "sparkfold.spec-hash"}}',
                                 "dsv41-1017-exl3-tf"]).stdout.strip() for role in ("head", "worker"))


def last_good(sim_exec, role: str = "head") -> str:
    return sim_exec(role, ["cat", f"{STATE}/last-good"]).stdout.strip()


def records(sim_exec, role: str = "head") -> list[str]:
    out = sim_exec(role, f"ls {STATE}").stdout.split()
    return sorted(name[:-5] for name in out if name.endswith(".json"))


def images(sim_exec, role: str) -> list[str]:
    out = sim_exec(role, ["docker", "images", "--filter", "label=sparkfold.image-hash", "--format",
                          "{{.Repository}}:{{.Tag}}"]).stdout
    return sorted(out.split())


pytestmark = pytest.mark.usefixtures("converged_pair")


def test_the_serving_generation_is_recorded_root_owned_on_both_sparks(run_pyinfra, sim_exec):
    gid = last_good(sim_exec)
    assert len(gid) == 8 and last_good(sim_exec, "worker") == gid and gid in records(sim_exec)
    owner = sim_exec("head", ["stat", "-c", "%U %a", STATE, f"{STATE}/{gid}.json"]).stdout.split()
    assert owner == ["root", "700", "root", "600"]
    record = json.loads(sim_exec("head", ["cat", f"{STATE}/{gid}.json"]).stdout)
    assert [spec["labels"]["sparkfold.rank"] for spec in record["specs"]] == ["0", "1"]
    assert changed_ops(deploy(run_pyinfra)) == {}  # recorded once: a second run changes nothing


def test_a_new_engine_that_crashes_while_loading_is_rolled_back(run_pyinfra, sim_exec, tmp_path):
    before, old = spec_hashes(sim_exec), last_good(sim_exec)
    env = faulty_engine(tmp_path, "crash-on-load")
    dry = run_pyinfra(*DEPLOY, "--dry", env=env)
    assert dry.returncode == 0 and f"generation {old} → " in dry.stderr and f"rollback to {old}" in dry.stderr
    run = failing_deploy(run_pyinfra, env=env)
    assert "Traceback" not in run.stderr
    assert "failed: rank" in run.stderr and f"Generation {old} serves again (rolled back)" in run.stderr
    assert "logs are saved in /home/nvidia/.cache/sparkfold/logs on the head" in run.stderr
    assert spec_hashes(sim_exec) == before and last_good(sim_exec) == old  # the old pair, as it was
    assert "Both ranks answered" in chat()["choices"][0]["message"]["content"]
    saved = sim_exec("head", "ls /home/nvidia/.cache/sparkfold/logs").stdout
    assert "-rank0" in saved  # the crashed rank's log, kept for the user
    assert changed_ops(deploy(run_pyinfra)) == {}  # the old settings: nothing to do


def test_a_new_engine_whose_rank_cannot_start_is_rolled_back(run_pyinfra, sim_exec, tmp_path):
    """rank 1's `docker run` fails (the new image lacks its program): rank 0 is not started, and the last good pair
    serves again, instead of the run ending with no rank serving."""
    before, old = spec_hashes(sim_exec), last_good(sim_exec)
    run = failing_deploy(run_pyinfra, env=faulty_engine(tmp_path, "no-rank1-program"))
    assert "Traceback" not in run.stderr
    assert "executable file not found" in run.stderr  # Docker's own error, shown where it happened
    assert "rank 1 did not start on the worker (its container is created" in run.stderr
    assert f"Generation {old} serves again (rolled back)" in run.stderr
    assert spec_hashes(sim_exec) == before and last_good(sim_exec) == old  # the old pair, as it was
    assert "Both ranks answered" in chat()["choices"][0]["message"]["content"]
    assert changed_ops(deploy(run_pyinfra)) == {}  # the old settings: nothing to do


def test_the_exact_gate_refuses_different_replies_and_smoke_accepts_them(run_pyinfra, sim_exec, tmp_path):
    old = last_good(sim_exec)
    env = faulty_engine(tmp_path, "replies-differ")
    run = failing_deploy(run_pyinfra, env={**env, "SPARKFOLD_UPGRADE_GATE": "exact"})
    assert "the exact gate found a difference" in run.stderr and f"Generation {old} serves again" in run.stderr
    assert MARKER not in chat()["choices"][0]["message"]["content"] and last_good(sim_exec) == old
    run = deploy(run_pyinfra, env=env)  # upgrade_gate = "smoke": the replies are not compared
    assert "the API was down" in run.stderr and "is now LIVE!" in run.stderr
    assert MARKER in chat()["choices"][0]["message"]["content"]
    new = last_good(sim_exec)
    assert new != old and {old, new} <= set(records(sim_exec)) and len(images(sim_exec, "worker")) >= 2

    # rollback.py: the previous good generation (the fault-free one) serves again, from its record
    run = run_pyinfra("inventory.py", "rollback.py", "-y")
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"rolled back: generation {new} → {old}" in run.stderr and "is now LIVE!" in run.stderr
    assert MARKER not in chat()["choices"][0]["message"]["content"] and last_good(sim_exec, "worker") == old
    assert changed_ops(deploy(run_pyinfra)) == {}  # the settings ask for the generation that serves


def test_keep_generations_1_keeps_only_what_serves(run_pyinfra, sim_exec, tmp_path):
    env = {**faulty_engine(tmp_path, "replies-differ"), "SPARKFOLD_KEEP_GENERATIONS": "1"}
    deploy(run_pyinfra, env=env)
    serving = last_good(sim_exec)
    assert records(sim_exec) == [serving] and records(sim_exec, "worker") == [serving]
    assert len(images(sim_exec, "head")) == 1 and len(images(sim_exec, "worker")) == 1
    refused = run_pyinfra("inventory.py", "rollback.py", "-y")
    assert refused.returncode != 0 and "nothing to roll back to" in refused.stderr
    deploy(run_pyinfra)  # back to the fault-free engine: built again, as nothing of it was kept
    assert len(records(sim_exec)) == 2  # keep_generations = 2 again: the one before is kept


def test_an_interrupted_switch_converges_on_the_next_run(run_pyinfra, sim_exec, site_file, sim):
    env_before = os.environ.get("SPARKFOLD_CONTEXT")
    os.environ["SPARKFOLD_CONTEXT"] = "524288"  # a changed setting: the pair is switched
    # the old pair's memory comes back slowly, so the run waits a while between the stop and the start (a loaded
    # machine's polls would miss a window of a few seconds); still well within the start's wait of a minute
    sim.set_rank_memory("worker", release_s=15)
    try:
        run = start_deploy(site_file)
        wait_until(lambda: pair_ids(sim_exec) == ("", "") or run.poll() is not None, 600, "the old pair stopped")
        assert run.poll() is None, "the run ended before the old pair was seen stopped"
        os.killpg(run.pid, signal.SIGKILL)  # between the stop and the start
        run.wait(timeout=30)
        assert container_id(sim_exec, "head") == ""
        time.sleep(1)
        deploy(run_pyinfra, env={"SPARKFOLD_CONTEXT": "524288"})
        assert all(i.endswith("true") for i in pair_ids(sim_exec))
        assert "524288" in sim_exec("head", ["docker", "inspect", "-f", "{{json .Args}}",
                                            "dsv41-1017-exl3-tf"]).stdout
    finally:
        sim.set_rank_memory("worker", release_s=sim.RANK_MEMORY["release_s"])
        if env_before is None:
            os.environ.pop("SPARKFOLD_CONTEXT", None)
        else:
            os.environ["SPARKFOLD_CONTEXT"] = env_before
    deploy(run_pyinfra)  # back to the settings the next test starts from


DATA_DIR = "/home/nvidia/.cache/sparkfold"
BIG_DISK = "/srv/big-disk/sparkfold"  # where data_dir "moved", reached through a symlink at its usual path


def rank_mounts(sim_exec, role: str) -> list[str]:
    """The host paths the running rank of `role` mounts (binds only; the NFS volume is a docker volume)."""
    out = sim_exec(role, ["docker", "inspect", "-f", "{{json .Mounts}}", "dsv41-1017-exl3-tf"])
    assert out.returncode == 0, out.stderr
    return [m["Source"] for m in json.loads(out.stdout) if m.get("Type") == "bind"]


def assert_every_mount_exists(sim_exec, when: str) -> None:
    for role in ("head", "worker"):
        mounts = rank_mounts(sim_exec, role)
        assert mounts, f"{when}: no rank runs on the {role}"
        gone = [m for m in mounts if sim_exec(role, ["test", "-e", m]).returncode != 0]
        assert not gone, f"{when}: the {role}'s running rank mounts folders that are gone: {gone}"


def move_data_dir(sim_exec, to_big_disk: bool) -> None:
    """data_dir moved to (or back from) a larger disk on both Sparks, reached through a symlink at its usual path."""
    for role in ("head", "worker"):
        if to_big_disk:
            script = (f"set -e; mkdir -p {BIG_DISK.rsplit('/', 1)[0]}; mv {DATA_DIR} {BIG_DISK}; "
                      f"ln -s {BIG_DISK} {DATA_DIR}; chown -h nvidia:nvidia {DATA_DIR}")
        else:
            script = f"set -e; [ -L {DATA_DIR} ] || exit 0; rm {DATA_DIR}; mv {BIG_DISK} {DATA_DIR}"
        done = sim_exec(role, ["sh", "-c", script])
        assert done.returncode == 0, done.stderr


def test_with_data_dir_behind_a_symlink_a_switch_and_a_rollback_keep_what_serves(run_pyinfra, sim_exec, tmp_path):
    """Issue 27's High finding: with data_dir reached through a symlink, the prune compared the mounts' real paths
    with folders spelled from the settings and removed the serving pair's weight folders and kit versions."""
    move_data_dir(sim_exec, to_big_disk=True)
    try:
        first = deploy(run_pyinfra)  # the mounts' real paths changed: the pair is recreated, then old ones pruned
        assert "is now LIVE!" in first.stderr, first.stderr[-3000:]
        assert all(m.startswith(BIG_DISK) for m in rank_mounts(sim_exec, "worker") if "rank-cache" in m)
        assert_every_mount_exists(sim_exec, "after the first deploy on the moved data_dir")
        before = last_good(sim_exec)

        env = faulty_engine(tmp_path, "replies-differ")  # a new engine: a switch to a new generation
        switched = deploy(run_pyinfra, env=env)
        assert "is now LIVE!" in switched.stderr and last_good(sim_exec) != before, switched.stderr[-3000:]
        assert_every_mount_exists(sim_exec, "after a switch")

        back = run_pyinfra("inventory.py", "rollback.py", "-y")
        assert back.returncode == 0, back.stderr[-4000:]
        assert f"→ {before}" in back.stderr and last_good(sim_exec, "worker") == before
        assert_every_mount_exists(sim_exec, "after rollback.py")
        assert "Both ranks answered" in chat()["choices"][0]["message"]["content"]
        assert changed_ops(deploy(run_pyinfra)) == {}  # the settings ask for the generation that serves
    finally:
        move_data_dir(sim_exec, to_big_disk=False)
    deploy(run_pyinfra)  # data_dir back where the next test expects it
    assert_every_mount_exists(sim_exec, "after data_dir moved back")
