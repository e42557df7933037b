"""verify_data on the simulated pair (issue 27, data at rest): a worker file that rots after it was verified, its
size and mtime kept, is trusted by a plain run (the fast path: markers, not hashing) and repaired by one run that
asks for verification; the time of that verification is recorded on each Spark.

Leaves a converged, serving pair.
"""

from __future__ import annotations

import re

from test_copy_repair import DAMAGED, FLIP, sha256, size_and_mtime
from test_deploy import changed_ops, deploy, pair_ids

RECORD = "/home/nvidia/.local/state/sparkfold/data-verified"  # <state_dir>/data-verified, state_dir's default


def record(sim_exec, role: str) -> str:
    out = sim_exec(role, ["cat", RECORD])
    return out.stdout.strip() if out.returncode == 0 else ""


def test_verify_data_repairs_a_worker_file_rotten_in_place_that_a_plain_run_trusts(converged_pair, run_pyinfra,
                                                                                  sim_exec):
    good = sha256(sim_exec, "head", DAMAGED)
    before, recorded = size_and_mtime(sim_exec, "worker", DAMAGED), record(sim_exec, "worker")
    pair = pair_ids(sim_exec)
    assert sim_exec("worker", ["python3", "-c", FLIP, DAMAGED]).returncode == 0
    assert size_and_mtime(sim_exec, "worker", DAMAGED) == before and sha256(sim_exec, "worker", DAMAGED) != good

    # 1. a plain run trusts the markers: no change, the file left as it is, nothing hashed
    run = deploy(run_pyinfra)
    assert changed_ops(run) == {}, changed_ops(run)
    assert sha256(sim_exec, "worker", DAMAGED) != good
    assert "verify_data" not in run.stderr and record(sim_exec, "worker") == recorded

    # 2. one run that asks for verification: hashed again on both Sparks, the file removed and copied again
    run = deploy(run_pyinfra, "--data", "verify_data=true")
    changed = changed_ops(run)
    assert "verify_data: both Sparks' data is re-hashed" in run.stderr, run.stderr[-4000:]
    assert "the Engram tables (verify_data): checking SHA256SUMS" in run.stderr, run.stderr[-4000:]
    assert any("| The Engram tables re-verified and repaired on the worker" in name for name in changed), changed
    assert any("| The checkpoint re-verified on the head" in name for name in changed), changed
    assert sha256(sim_exec, "worker", DAMAGED) == good
    engram = DAMAGED.rsplit("/", 1)[0]
    assert sim_exec("worker", f"cd {engram} && sha256sum -c --quiet SHA256SUMS").returncode == 0
    assert size_and_mtime(sim_exec, "worker", DAMAGED) == before  # the head's file again, its mtime with it
    for role in ("head", "worker"):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record(sim_exec, role)), record(sim_exec, role)
    assert pair_ids(sim_exec) == pair  # what the ranks load is what they started with: no restart

    # 3. converged again
    assert changed_ops(deploy(run_pyinfra)) == {}
