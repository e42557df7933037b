"""A run killed in the middle of the pair step (as a lost terminal or ^C-^C would) leaves nothing the next run cannot
finish: the next run ends LIVE and the one after changes nothing (issue 9). The data step's kill is in
test_long_steps.py (a copy killed half-way, then resumed).

Starts from a converged pair (converged_pair) and leaves one.
"""

from __future__ import annotations

import os
import signal

import pytest
from test_deploy import NAME, changed_ops, chat, deploy, pair_ids, start_deploy

PAIR = "The pair of ranks | "

pytestmark = pytest.mark.usefixtures("converged_pair")


def run_until(site_file, op: str) -> list[str]:
    """Start a deploy and SIGKILL its whole process group as soon as `op` starts executing; its stderr so far."""
    run = start_deploy(site_file)
    seen = []
    assert run.stderr is not None
    try:
        for line in run.stderr:
            seen.append(line.rstrip("\n"))
            if "Starting operation:" in line and op in line:
                break
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert any(op in line for line in seen), "\n".join(seen[-40:])
    return seen


@pytest.mark.parametrize("op", ["Start rank 0 (head)", "Rank 0's API: wait, smoke test through both ranks, LIVE"])
def test_a_run_killed_in_the_pair_step_is_finished_by_the_next(run_pyinfra, sim_exec, site_file, op):
    before = pair_ids(sim_exec)
    assert sim_exec("worker", ["docker", "rm", "-f", NAME]).returncode == 0  # drift: the pair must be recreated
    run_until(site_file, PAIR + op)

    run = deploy(run_pyinfra)  # the lock of the killed run is stale: taken over, and the pair is brought back
    assert "is now LIVE! on port 8888" in run.stderr, run.stderr[-4000:]
    head, worker = pair_ids(sim_exec)
    assert head.endswith("true") and worker.endswith("true") and head != before[0]
    assert chat()["choices"][0]["message"]["content"]
    assert changed_ops(deploy(run_pyinfra)) == {}
