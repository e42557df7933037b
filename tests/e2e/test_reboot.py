"""Reboots of a serving Spark (issue 26), on the simulated pair booted by systemd: `sim.reboot` stops every unit and
process, empties /run and /tmp, gives a new boot id, puts the stand-in GPU's clock back to its default and plugs the
link in again; then systemd boots it. What docs/operations.md ("After a reboot") promises is checked here: the GPU
lock back by the timer at boot, memguard running, and the ranks either brought back by the supervisor (on), rank 1
first, or named by status.py and restarted by the next deploy, which changes nothing else (off). memguard and the
supervisor killed are started again by systemd as their units say.

Starts from a converged pair (converged_pair) and leaves one.
"""

from __future__ import annotations

import json

import pytest
from test_deploy import (
    GPU_CLOCK_RECORD,
    NAME,
    changed_ops,
    chat,
    deploy,
    gpu_locked,
    lock_record,
    started_at,
    wait_until,
)
from test_guards import serving

pytestmark = pytest.mark.usefixtures("converged_pair")

SUPERVISOR = "sparkfold-supervise.service"
MEMGUARD = "sparkfold-memguard.service"
SUPERVISED = {"SPARKFOLD_SUPERVISE": "1", "SPARKFOLD_SUPERVISE_BACKOFF_S": "1"}
RANK_STEP = "The pair of ranks | "


def boot_id(sim_exec, role: str) -> str:
    return sim_exec(role, ["cat", "/proc/sys/kernel/random/boot_id"]).stdout.strip()


def state(sim_exec, role: str) -> str:
    out = sim_exec(role, ["docker", "inspect", "-f", "{{.State.Status}}", NAME])
    return out.stdout.strip() if out.returncode == 0 else "missing"


def unit(sim_exec, role: str, name: str) -> dict[str, str]:
    out = sim_exec(role, ["systemctl", "show", name, "-p", "ActiveState,MainPID,NRestarts,Result"]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def locked_since_boot(sim_exec, role: str, mhz: int = 2200) -> bool:
    """The GPU clock lock applied in this boot (the timer at boot: the record names this boot) and held."""
    record = lock_record(sim_exec, role)
    return record.get("boot") == boot_id(sim_exec, role) and gpu_locked(sim_exec, role) == [0, mhz]


def rebooted(sim, sim_exec, role: str, hard: bool = False) -> None:
    """`role` rebooted: a new boot id, systemd as PID 1 again, and the GPU clock put back to its default in this
    boot (sim-gpu-reset.service: the stand-in keeps its state on disk, a real GPU does not)."""
    before = boot_id(sim_exec, role)
    sim.reboot(role, hard=hard)
    assert boot_id(sim_exec, role) not in ("", before)
    assert sim_exec(role, "cat /proc/1/comm").stdout.strip() == "systemd"
    assert unit(sim_exec, role, "sim-gpu-reset.service")["Result"] == "success"


def test_the_worker_reboots_without_the_supervisor(run_pyinfra, sim_exec, sim):
    assert serving()
    rebooted(sim, sim_exec, "worker")
    assert state(sim_exec, "worker") == "exited"  # the reboot stopped rank 1; nothing starts it again
    # what systemd starts at boot: memguard at once, the GPU lock from the timer (OnBootSec)
    assert unit(sim_exec, "worker", MEMGUARD)["ActiveState"] == "active"
    wait_until(lambda: locked_since_boot(sim_exec, "worker"), 120, "the GPU clock timer to lock the worker at boot")
    assert sim_exec("worker", ["test", "-e", GPU_CLOCK_RECORD]).returncode == 0

    # status.py names it
    run = run_pyinfra("inventory.py", "status.py", "--json")
    doc = json.loads(run.stdout)
    assert run.returncode == 1 and doc["serving"] is False, run.stdout[-3000:]
    rank1 = next(r for r in doc["rows"] if (r["spark"], r["item"]) == ("worker", "rank 1"))
    assert rank1["state"] == "exited" and rank1["ok"] is False, rank1

    # the next deploy restarts the ranks and changes nothing else
    run = deploy(run_pyinfra)
    changed = changed_ops(run)
    assert changed and all(name.startswith(RANK_STEP) for name in changed), changed
    assert "is now LIVE!" in run.stderr and chat()["choices"][0]["message"]["content"]
    assert changed_ops(deploy(run_pyinfra)) == {}


def test_with_the_supervisor_each_spark_s_reboot_brings_the_pair_back_in_order(run_pyinfra, sim_exec, sim):
    deploy(run_pyinfra, env=SUPERVISED)
    try:
        for role in ("head", "worker"):
            assert unit(sim_exec, "head", SUPERVISOR)["ActiveState"] == "active"
            rebooted(sim, sim_exec, role)
            # the supervisor (started at boot on the head, or still running there) brings the pair back
            wait_until(lambda: state(sim_exec, "head") == state(sim_exec, "worker") == "running" and serving(), 180,
                       f"the supervisor to bring the pair back after the {role}'s reboot")
            assert started_at(sim_exec, "worker") < started_at(sim_exec, "head"), "rank 1 starts first"
            assert chat()["choices"][0]["message"]["content"]
            wait_until(lambda r=role: locked_since_boot(sim_exec, r), 120, f"the {role}'s GPU lock at boot")
            assert unit(sim_exec, role, MEMGUARD)["ActiveState"] == "active"
        assert changed_ops(deploy(run_pyinfra, env=SUPERVISED)) == {}  # the pair it brought back is the deploy's
    finally:
        deploy(run_pyinfra)  # supervision off again, as the next test expects


@pytest.mark.parametrize(("role", "name", "env"), [("worker", MEMGUARD, {}), ("head", SUPERVISOR, SUPERVISED)])
def test_memguard_and_the_supervisor_killed_are_started_again_by_systemd(run_pyinfra, sim_exec, role, name, env):
    if env:
        deploy(run_pyinfra, env=env)
    try:
        before = unit(sim_exec, role, name)
        assert before["ActiveState"] == "active" and before["MainPID"] != "0", before
        assert sim_exec(role, ["kill", "-9", before["MainPID"]]).returncode == 0
        wait_until(lambda: (now := unit(sim_exec, role, name))["ActiveState"] == "active"
                   and now["MainPID"] not in ("0", before["MainPID"]), 60, f"systemd to start {name} again")
        assert int(unit(sim_exec, role, name)["NRestarts"]) == int(before["NRestarts"]) + 1
        assert serving()
    finally:
        if env:
            deploy(run_pyinfra)
