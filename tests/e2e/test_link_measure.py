"""The link measured before the ranks start (docs/link.md), on the simulated pair: the ib_write_bw stand-in moves real
bytes over each rail's veth; a twin slowed (tc) or its RoCE port down, CmaTotal 0 or a stale /etc/nccl.conf in the
image stops the deploy before any rank starts, naming the cause; an MTU of 1500 at one end is set back by the link
step before the measurement; a healthy link is measured once, not again on a converged run, and again when the MTU
changes.

Each test clears its fault and leaves the pair converged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_deploy import ANSI, DEPLOY, ROOT, chat, container_id, deploy, pair_ids

pytestmark = pytest.mark.e2e

RECORD = "/home/nvidia/.local/state/sparkfold/link-bandwidth.json"
TWIN = "enP2p1s0f0np0"


def record(sim_exec, role: str) -> dict | None:
    out = sim_exec(role, ["cat", RECORD])
    return json.loads(out.stdout) if out.returncode == 0 else None


def forget_measurement(sim_exec) -> None:
    for role in ("head", "worker"):
        assert sim_exec(role, ["rm", "-f", RECORD]).returncode == 0


def output(run) -> str:
    return ANSI.sub("", run.stdout + run.stderr)


@pytest.mark.parametrize("kind, role, cause", [
    ("slow", "head", f"Most likely cause: the twin {TWIN} is slow"),
    ("down", "worker", f"Most likely cause: the twin {TWIN} (roceP2p1s0f0) on the worker is down (RoCE port 1: DOWN"),
])
def test_a_faulty_twin_stops_the_deploy_before_any_rank_starts_naming_it(converged_pair, run_pyinfra, sim_exec,
                                                                          sim, kind, role, cause):
    forget_measurement(sim_exec)  # as on a first run: the link is measured
    before = pair_ids(sim_exec)
    sim.link_fault(kind, TWIN, role)
    try:
        run = run_pyinfra(*DEPLOY, "-y")
    finally:
        sim.link_fault("clear", TWIN, role)
    text = output(run)
    assert run.returncode != 0, text[-4000:]
    assert "link bandwidth: measured enp1s0f0np0" in text and cause in text, text[-4000:]
    assert pair_ids(sim_exec) == before  # no rank was stopped or started
    assert record(sim_exec, "head") is None  # a stopped run records nothing: the next one measures again
    # (that the next run then measures and passes is test_cma_zero_stops_the_deploy_naming_the_kernel's last step)


def test_a_healthy_link_is_measured_once_and_again_when_the_mtu_changes(converged_pair, run_pyinfra, sim_exec):
    forget_measurement(sim_exec)
    dry = run_pyinfra(*DEPLOY, "--dry")
    assert "link: will be measured before the ranks start (nothing is recorded)" in output(dry), output(dry)[-3000:]
    first = deploy(run_pyinfra)
    assert "link measured: enp1s0f0np0" in output(first), output(first)[-3000:]
    head, worker = record(sim_exec, "head"), record(sim_exec, "worker")
    assert head == worker and head["passed"] is True
    assert all(v > 0.2 for v in head["figures"]["alone"].values()), head["figures"]
    again = deploy(run_pyinfra)
    assert "link measured:" not in output(again) and record(sim_exec, "head")["taken"] == head["taken"]
    try:
        changed = deploy(run_pyinfra, "--data", "link_mtu=8000")
        assert "link measured: enp1s0f0np0" in output(changed), output(changed)[-3000:]
        assert record(sim_exec, "head")["inputs"]["head"]["rails"][0]["mtu"] == 8000
    finally:
        deploy(run_pyinfra)  # back to 9000: measured again
    assert record(sim_exec, "head")["inputs"]["head"]["rails"][0]["mtu"] == 9000


def test_cma_zero_stops_the_deploy_naming_the_kernel(converged_pair, run_pyinfra, sim_exec, sim):
    forget_measurement(sim_exec)
    before = pair_ids(sim_exec)
    sim.set_cma("worker", 0)
    try:
        run = run_pyinfra(*DEPLOY, "-y")
    finally:
        sim.set_cma("worker")
    text = output(run)
    assert run.returncode != 0, text[-4000:]
    assert "Most likely cause: CmaTotal is 0 kB in the worker's /proc/meminfo" in text, text[-4000:]
    assert pair_ids(sim_exec) == before and record(sim_exec, "head") is None
    deploy(run_pyinfra)
    assert record(sim_exec, "head")["passed"] is True


def stale_nccl_conf_engine(tmp_path: Path) -> dict[str, str]:
    """A deploy's environment whose engine image carries /etc/nccl.conf (tests/sim/engine/faults/README.md)."""
    context = tmp_path / "engine-nccl-conf"
    shutil.copytree(ROOT / "tests/sim/engine", context)
    (context / "faults" / "nccl-conf").write_text("NCCL_IB_HCA=mlx5_0\n")
    return {"SPARKFOLD_ENGINE_CONTEXT": str(context)}


def test_a_stale_nccl_conf_in_the_image_stops_the_deploy_though_the_figures_pass(converged_pair, run_pyinfra,
                                                                                   sim_exec, tmp_path):
    deploy(run_pyinfra)  # measured on this image, or not at all (the image is no input)
    before, last = pair_ids(sim_exec), record(sim_exec, "head")
    env = stale_nccl_conf_engine(tmp_path)
    # a new image, built in this run: its /etc/nccl.conf is read once it is built, and the rails are not measured
    # again while the old pair serves on them
    run = run_pyinfra(*DEPLOY, "-y", env=env)
    text = output(run)
    assert run.returncode != 0, text[-4000:]
    assert "the engine image carries /etc/nccl.conf" in text and "NCCL_IB_HCA=mlx5_0" in text, text[-4000:]
    assert "link_measure = \"warn\"" in text and "link bandwidth: measured" not in text
    assert pair_ids(sim_exec) == before  # the old pair still serves: nothing was stopped or started
    assert record(sim_exec, "head") == last
    # the image is built now: the next run's plan reads it and stops, --dry too
    dry = run_pyinfra(*DEPLOY, "--dry", env=env)
    assert "the engine image carries /etc/nccl.conf" in output(dry), output(dry)[-3000:]
    deploy(run_pyinfra)  # the fault-free context again


def test_mtu_1500_at_one_end_is_set_back_before_the_link_is_measured(converged_pair, run_pyinfra, sim_exec, sim):
    sim.link_fault("mtu1500", TWIN, "worker")
    run = deploy(run_pyinfra)  # the link step sees the drift and applies netplan again: link_mtu on both ends
    text = output(run)
    assert "link bandwidth:" not in text, text[-4000:]
    out = sim_exec("worker", ["cat", f"/sys/class/net/{TWIN}/mtu"]).stdout.strip()
    assert out == "9000", out
    last = record(sim_exec, "head")
    assert last is None or last["inputs"]["worker"]["rails"][1]["mtu"] == 9000


def test_link_check_measures_on_demand_stopping_the_ranks_only_when_told(converged_pair, run_pyinfra, sim_exec):
    before, last = pair_ids(sim_exec), record(sim_exec, "head")
    refused = run_pyinfra("inventory.py", "link_check.py", "-y")
    assert refused.returncode != 0 and "--data link_check_stop=true" in output(refused), output(refused)[-3000:]
    assert pair_ids(sim_exec) == before and record(sim_exec, "head") == last  # nothing stopped, nothing measured
    run = run_pyinfra("inventory.py", "link_check.py", "-y", "--data", "link_check_stop=true")
    assert run.returncode == 0, output(run)[-4000:]
    assert "link measured: enp1s0f0np0" in output(run), output(run)[-3000:]
    now = record(sim_exec, "head")
    assert now is not None and now["passed"] is True and now == record(sim_exec, "worker")
    assert last is None or now["taken"] > last["taken"]  # measured again, whatever was recorded
    assert all(container_id(sim_exec, role) == "" for role in ("head", "worker"))  # both ranks stopped first
    deploy(run_pyinfra)  # the pair back
    assert all(container_id(sim_exec, role) for role in ("head", "worker"))
    assert chat()["choices"][0]["message"]["content"]
