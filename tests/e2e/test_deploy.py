"""The real pyinfra CLI against the simulated pair: a fresh --dry, the first run, a converged re-run, drift repaired
one drift at a time, bad input refused before anything changes, stop/start and restart.

The first two tests start from fresh Sparks (marked fresh_pair: the pair a session brings up, so not with
SPARKSIM_REUSE=1 on a deployed pair); conftest.py runs this file before the others. Every other test starts from a
converged pair (converged_pair) and leaves one. Every test reads state back from the Sparks, not only pyinfra's
report.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from operations.gpu_clock import stale_after_s
from operations.layout import GPU_CLOCK_RECORD, GPU_CLOCK_TIMER, GPU_CLOCK_UNIT
from tests.sim.sim import API_PORT, GPU_CLOCK_PERIOD_S, SSH_PORT, deploy_env

API = f"http://127.0.0.1:{API_PORT}"  # the head's 8888, published for this pair (tests/sim/sim.py)
NAME = "dsv41-1017-exl3-tf"
START1 = "The pair of ranks | Start rank 1 (worker)"
START0 = "The pair of ranks | Start rank 0 (head)"
DEPLOY = ("inventory.py", "deploy.py")
ROOT = Path(__file__).resolve().parents[2]
GPU_LOCK = "GPU clock ceiling | locked at 2200 MHz"
GPU_TIMER = f"GPU clock ceiling | {GPU_CLOCK_TIMER} enabled and running"
SMI_STATE = "/var/lib/sim-nvidia/state.json"  # the stand-in GPU's state (tests/sim/standins/nvidia-smi)

pytestmark = pytest.mark.usefixtures("converged_pair")


# --- helpers ------------------------------------------------------------------------------------------------------

def changed_ops(run) -> dict[str, list[str]]:
    """{operation name: [hosts where it changed something]} from a --json result."""
    ops = (run.data or {}).get("results", {}) or {}
    out = {}
    for op in ops.get("operations", []):
        if op.get("success"):
            out[op.get("name") or " | ".join(op.get("names", []))] = sorted(op["success"])
    return out


def totals(run) -> dict:
    return ((run.data or {}).get("results") or {}).get("totals") or {}


def planned_ops(run_pyinfra, *extra, env=None) -> dict[str, list[str]]:
    """{operation name: [hosts it will change]} from `--dry` (which must change nothing)."""
    run = run_pyinfra(*DEPLOY, "--dry", *extra, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    return {op["name"]: sorted(op["hosts_with_change"]) for op in run.data["plan"] if op["hosts_with_change"]}


def deploy(run_pyinfra, *extra, env=None):
    run = run_pyinfra(*DEPLOY, "-y", *extra, env=env)
    assert run.returncode == 0, f"deploy failed:\n{run.stderr[-6000:]}"
    return run


def failing_deploy(run_pyinfra, *extra, env=None):
    run = run_pyinfra(*DEPLOY, "-y", *extra, env=env)
    assert run.returncode != 0, "the deploy should have failed"
    return run


def container_id(sim_exec, role: str) -> str:
    out = sim_exec(role, ["docker", "inspect", "-f", "{{.Id}} {{.State.Running}}", NAME])
    return out.stdout.strip() if out.returncode == 0 else ""


def pair_ids(sim_exec) -> tuple[str, str]:
    return container_id(sim_exec, "head"), container_id(sim_exec, "worker")


def chat(text: str = "Reply with OK.") -> dict:
    r = requests.post(f"{API}/v1/chat/completions", timeout=30, json={
        "model": "DeepSeek-V4.1-Flash-1017", "max_tokens": 32, "temperature": 0,
        "messages": [{"role": "user", "content": text}]})
    r.raise_for_status()
    return r.json()


def started_at(sim_exec, role: str) -> str:
    return sim_exec(role, ["docker", "inspect", "-f", "{{.State.StartedAt}}", NAME]).stdout.strip()


def gpu_locked(sim_exec, role: str):
    """The stand-in GPU's lock as its driver holds it ([min, max] or None): no nvidia-smi query reports it."""
    out = sim_exec(role, f"cat {SMI_STATE} 2>/dev/null").stdout
    return json.loads(out)["locked"] if out.strip() else None


def sm_clock(sim_exec, role: str) -> int:
    return int(sim_exec(role, "nvidia-smi --query-gpu=clocks.sm --format=csv,noheader,nounits").stdout)


def lock_record(sim_exec, role: str) -> dict[str, str]:
    """The GPU clock record's key=value lines (boot, applied, failed)."""
    out = sim_exec(role, ["cat", GPU_CLOCK_RECORD]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line.split(" ", 1)[0])


def start_deploy(site_file, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    """A deploy running in the background (its own process group, so a test can kill it whole); stderr piped."""
    env = deploy_env({"SPARKFOLD_SITE": str(site_file)})
    run = subprocess.Popen([sys.executable, "-m", "pyinfra", *DEPLOY, "-y"], cwd=ROOT, env=env,
                           stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE, start_new_session=True)
    # newline="": a carriage return stays in its line, where a test can see it (text=True turns it into a newline)
    for name in ("stdout", "stderr"):
        if getattr(run, name) is not None:
            setattr(run, name, io.TextIOWrapper(getattr(run, name), encoding="utf-8", errors="replace", newline=""))
    return run


def deploy_killed_at(site_file, reached, limit_s: float) -> list[str]:
    """A deploy in the background, killed (its whole process group) at the first stderr line `reached` accepts: the
    lines it printed. Past `limit_s` seconds it is killed all the same, so the shared pair is never held forever, and
    the test fails there, naming the limit (a kill at another point would test something else)."""
    run = start_deploy(site_file)
    assert run.stderr is not None
    seen: list[str] = []
    stuck = threading.Timer(limit_s, os.killpg, (run.pid, signal.SIGKILL))
    stuck.start()
    hit = False
    try:
        for line in run.stderr:
            seen.append(line.rstrip("\n"))
            if reached(line):
                hit = True
                break
    finally:
        stuck.cancel()
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    assert hit, f"no line the test waits for within {limit_s:.0f} s; the last lines:\n" + "\n".join(seen[-40:])
    return seen


def spark_time(sim_exec, role: str) -> int:
    return int(sim_exec(role, "date +%s").stdout)


def wait_until(check, timeout: float, what: str):
    """check()'s first true value within `timeout` seconds, or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)
    return found


def memory_back(sim, role: str, timeout: float = 60) -> None:
    """Wait until a stopped rank's memory has come back (the simulated footprint goes away over seconds)."""
    deadline = time.monotonic() + timeout
    while sim.memory_status(role).get("held_gib") != 0:
        assert time.monotonic() < deadline, f"{role}: the rank's memory did not come back: {sim.memory_status(role)}"
        time.sleep(0.5)


def addresses(sim_exec, role: str, netdev: str) -> list[str]:
    out = sim_exec(role, ["ip", "-j", "-4", "addr", "show", "dev", netdev]).stdout
    return [f"{a['local']}/{a['prefixlen']}" for i in json.loads(out or "[]") for a in i.get("addr_info", [])]


# --- 1. fresh pair ------------------------------------------------------------------------------------------------

@pytest.mark.fresh_pair
def test_dry_run_on_a_fresh_pair_plans_every_step_and_changes_nothing(run_pyinfra, sim_exec):
    run = run_pyinfra(*DEPLOY, "--dry")
    assert run.returncode == 0, run.stderr[-4000:]
    planned = {op["name"] for op in run.data["plan"] if op["hosts_with_change"]}
    for step in ("GPU clock ceiling | locked", "CX7 link | netplan file", "The engine image | build",
                 "The model data | Checkpoint: fetch", "The pair of ranks | Start rank 1 (worker)",
                 "The pair of ranks | Start rank 0 (head)"):
        assert any(name.startswith(step) for name in planned), (step, sorted(planned))
    # nothing changed on the Sparks
    assert addresses(sim_exec, "head", "enp1s0f0np0") == []
    assert sim_exec("head", "test -e /etc/netplan/60-sparkfold-cx7.yaml").returncode != 0
    assert pair_ids(sim_exec) == ("", "")
    assert gpu_locked(sim_exec, "worker") is None and gpu_locked(sim_exec, "head") is None
    assert sim_exec("worker", ["test", "-e", GPU_CLOCK_RECORD]).returncode != 0
    # the checkpoint's plan came from huggingface_hub's dry run against the fake hub (its 10 files, at its commit),
    # and planning wrote nothing into the cache (no ref for "main", no lock) nor into data_dir
    fetch = [name for name in planned if name.startswith("The model data | Checkpoint: fetch")]
    assert fetch and "fetch 10 files" in fetch[0] and "@3f1c7a9e52d0 " in fetch[0], fetch
    assert "huggingface_hub 2.4.0 on the head" in " ".join(op["name"] for op in run.data["plan"]), run.data["plan"]
    assert sim_exec("head", "ls -A /home/nvidia/.cache/huggingface/hub /home/nvidia/.cache/sparkfold 2>/dev/null"
                    ).stdout.strip() == ""


# each long step's progress runner prints its first line when it starts and "done in" when it ends, at pyinfra's
# default verbosity (the lines in between come every progress_every_s, 2 s on the sim: test_long_steps.py and
# test_resume.py wait for them)
LONG_STEPS = [r"Checkpoint download", r"Engram tables download", r"Kernel kit download", r"build \S+",
              r"ship \S+ to the worker", r"rank 0's weight file", r"rank 1's weight file",
              r"the Engram tables: hashing for SHA256SUMS", r"rank 1's weight file: hashing for SHA256SUMS",
              r"the Engram tables to the worker", r"the kit to the worker", r"the checkpoint to the worker",
              r"the Engram tables: checking SHA256SUMS", r"rank 1's weight file: checking SHA256SUMS"]


@pytest.mark.fresh_pair
def test_first_run_converges_and_serves_through_both_ranks(run_pyinfra, sim_exec):
    run = deploy(run_pyinfra)
    assert "is now LIVE! on port 8888" in run.stderr
    silent = [step for step in LONG_STEPS if not re.search(rf"\] +{step}: done in ", run.stderr)]
    assert not silent, silent
    assert "\r" not in run.stderr
    head_id, worker_id = pair_ids(sim_exec)
    assert head_id.endswith("true") and worker_id.endswith("true")
    assert addresses(sim_exec, "worker", "enP2p1s0f0np0") == ["192.168.101.2/24"]
    reply = chat()
    assert reply["choices"][0]["message"]["content"].strip()
    assert "rank 1" in json.dumps(reply), reply  # the stand-in's answer carries rank 1's part


def test_second_run_changes_nothing_and_is_fast(run_pyinfra, sim_exec):
    before = pair_ids(sim_exec)
    t0 = time.monotonic()
    run = deploy(run_pyinfra)
    elapsed = time.monotonic() - t0
    assert changed_ops(run) == {}, changed_ops(run)
    assert totals(run).get("success") == 0 and totals(run).get("error") == 0
    assert pair_ids(sim_exec) == before
    assert elapsed < 180, f"a converged run took {elapsed:.0f} s"
    assert "is now LIVE! on port 8888" in run.stderr


# --- 3. drift, one at a time --------------------------------------------------------------------------------------

def test_gpu_lock_reset_on_the_idle_worker_is_put_back_by_the_timer(run_pyinfra, sim_exec):
    # an idle GPU clocks far below the ceiling, locked or not: the reset cannot be seen from clocks.sm
    assert gpu_locked(sim_exec, "worker") == [0, 2200] and sm_clock(sim_exec, "worker") < 2200
    # reset right after one of the timer's runs, and look in the same command: its next run cannot come in between
    last = int(lock_record(sim_exec, "worker")["applied"])
    wait_until(lambda: int(lock_record(sim_exec, "worker").get("applied", 0)) > last, 3 * GPU_CLOCK_PERIOD_S,
               "the timer's next run")
    reset = sim_exec("worker", f"nvidia-smi -rgc >/dev/null && date +%s && cat {SMI_STATE}")
    assert reset.returncode == 0, reset.stderr
    reset_at, state = reset.stdout.split("\n", 1)
    reset_at = int(reset_at)
    assert json.loads(state)["locked"] is None and sm_clock(sim_exec, "worker") < 2200
    # no deploy: the timer applies the lock again within a period and records it
    wait_until(lambda: gpu_locked(sim_exec, "worker") == [0, 2200], 3 * GPU_CLOCK_PERIOD_S, "the timer's lock")
    record = wait_until(lambda: (r := lock_record(sim_exec, "worker")) and int(r.get("applied", 0)) >= reset_at and r,
                        3 * GPU_CLOCK_PERIOD_S, "a record newer than the reset")
    assert "failed" not in record
    # under load it is capped at the ceiling
    assert sim_exec("worker", "nvidia-smi --sim-set busy=true").returncode == 0
    try:
        assert sm_clock(sim_exec, "worker") == 2200
    finally:
        sim_exec("worker", "nvidia-smi --sim-set busy=false")
    assert planned_ops(run_pyinfra) == {}  # nothing left for a deploy to do


def timer_stopped(sim_exec, role: str) -> None:
    """The GPU clock timer stopped, and the run of its service it may have started just before ended (stopping a
    timer leaves that run going: it would lock, or record, after the test changed the GPU)."""
    assert sim_exec(role, ["systemctl", "stop", GPU_CLOCK_TIMER]).returncode == 0
    wait_until(lambda: sim_exec(role, ["systemctl", "show", "-p", "ActiveState", "--value", GPU_CLOCK_UNIT])
               .stdout.strip() not in ("activating", "deactivating"), 60, f"the last run of {GPU_CLOCK_UNIT} to end")


def test_gpu_lock_stale_with_the_timer_stopped_is_reported_and_repaired_alone(run_pyinfra, sim_exec):
    before = pair_ids(sim_exec)
    timer_stopped(sim_exec, "worker")
    assert sim_exec("worker", "nvidia-smi -rgc").returncode == 0
    # 40 minutes without the timer: the record ages past two periods
    aged = spark_time(sim_exec, "worker") - 2400
    assert aged < spark_time(sim_exec, "worker") - stale_after_s(GPU_CLOCK_PERIOD_S)
    assert sim_exec("worker", ["sed", "-i", f"s/^applied=.*/applied={aged}/", GPU_CLOCK_RECORD]).returncode == 0
    drift = {GPU_LOCK: ["sim-worker"], GPU_TIMER: ["sim-worker"]}
    dry = run_pyinfra(*DEPLOY, "--dry")
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert {op["name"]: sorted(op["hosts_with_change"]) for op in dry.data["plan"] if op["hosts_with_change"]} == drift
    assert f"sim-worker: GPU clock: last applied 40 min ago, more than 2 timer periods of {GPU_CLOCK_PERIOD_S} s: " \
           f"{GPU_CLOCK_TIMER} is not running" in ANSI.sub("", dry.stderr)
    assert gpu_locked(sim_exec, "worker") is None  # --dry changed nothing
    run = deploy(run_pyinfra)
    assert changed_ops(run) == drift, changed_ops(run)
    assert gpu_locked(sim_exec, "worker") == [0, 2200]
    assert sim_exec("worker", ["systemctl", "is-active", GPU_CLOCK_TIMER]).stdout.strip() == "active"
    assert int(lock_record(sim_exec, "worker")["applied"]) > aged + 2000
    assert pair_ids(sim_exec) == before


def test_gpu_lock_failed_application_is_reported_and_repaired(run_pyinfra, sim_exec):
    before = pair_ids(sim_exec)
    assert sim_exec("worker", "nvidia-smi --sim-set fail_lgc=3").returncode == 0  # the driver refuses -lgc
    try:
        record = wait_until(lambda: "failed" in (r := lock_record(sim_exec, "worker")) and r,
                            3 * GPU_CLOCK_PERIOD_S, "the timer's failed application recorded")
        assert "-lgc 0,2200 failed" in record["failed"]
        dry = run_pyinfra(*DEPLOY, "--dry")
        assert dry.returncode == 0, dry.stderr[-4000:]
        planned = {op["name"]: sorted(op["hosts_with_change"]) for op in dry.data["plan"] if op["hosts_with_change"]}
        assert planned == {GPU_LOCK: ["sim-worker"]}, planned
        assert "sim-worker: GPU clock: the last application failed" in ANSI.sub("", dry.stderr)
        # the cause fixed while the timer is off, so only the deploy can repair it
        timer_stopped(sim_exec, "worker")
    finally:
        sim_exec("worker", "nvidia-smi --sim-set fail_lgc=0")
    assert "failed" in lock_record(sim_exec, "worker")
    run = deploy(run_pyinfra)
    assert changed_ops(run) == {GPU_LOCK: ["sim-worker"], GPU_TIMER: ["sim-worker"]}, changed_ops(run)
    assert "failed" not in lock_record(sim_exec, "worker") and gpu_locked(sim_exec, "worker") == [0, 2200]
    assert sim_exec("worker", ["systemctl", "is-active", GPU_CLOCK_TIMER]).stdout.strip() == "active"
    assert pair_ids(sim_exec) == before


def test_rank_container_removed_on_the_worker_restarts_both_in_order(run_pyinfra, sim_exec):
    head_before, _ = pair_ids(sim_exec)
    assert sim_exec("worker", ["docker", "rm", "-f", NAME]).returncode == 0
    run = deploy(run_pyinfra)
    changed = changed_ops(run)
    assert START1 in changed and START0 in changed, changed
    head_after, worker_after = pair_ids(sim_exec)
    assert head_after != head_before and head_after.endswith("true") and worker_after.endswith("true")
    assert started_at(sim_exec, "worker") < started_at(sim_exec, "head")
    assert chat()["choices"][0]["message"]["content"]


def test_link_address_removed_is_put_back(run_pyinfra, sim_exec):
    assert sim_exec("head", "ip addr del 192.168.101.1/24 dev enP2p1s0f0np0").returncode == 0
    assert planned_ops(run_pyinfra) == {"CX7 link | netplan file and apply": ["sim-head"]}
    run = deploy(run_pyinfra)
    assert addresses(sim_exec, "head", "enP2p1s0f0np0") == ["192.168.101.1/24"]
    changed = changed_ops(run)
    assert changed and all(hosts == ["sim-head"] for hosts in changed.values()), changed
    assert all(name.startswith("CX7 link | ") for name in changed), changed


ANSI = __import__("re").compile(r"\x1b\[[0-9;]*m")


def test_hand_edited_netplan_file_shows_its_diff_and_nothing_else(run_pyinfra, sim_exec):
    path = "/etc/netplan/60-sparkfold-cx7.yaml"
    before, ids = sim_exec("worker", ["cat", path]).stdout, pair_ids(sim_exec)
    assert sim_exec("worker", f"echo '# edited by hand' >> {path}").returncode == 0
    run = run_pyinfra(*DEPLOY, "--dry", "--diff")
    assert run.returncode == 0, run.stderr[-4000:]
    planned = {op["name"]: sorted(op["hosts_with_change"]) for op in run.data["plan"] if op["hosts_with_change"]}
    assert len(planned) == 1 and list(planned.values()) == [["sim-worker"]], planned
    assert "netplan" in next(iter(planned)).lower(), planned
    err = ANSI.sub("", run.stderr)
    assert path in err and any(line.strip() == "- # edited by hand" for line in err.splitlines()), err[-3000:]
    assert sim_exec("worker", ["cat", path]).stdout.endswith("# edited by hand\n")  # --dry changed nothing
    changed = changed_ops(deploy(run_pyinfra))
    assert changed and all(hosts == ["sim-worker"] for hosts in changed.values()), changed
    assert sim_exec("worker", ["cat", path]).stdout == before and pair_ids(sim_exec) == ids


DAEMON_JSON = "/etc/docker/daemon.json"
DOCKER_STEP = "Docker with the NVIDIA runtime | docker uses the nvidia runtime by default"
STALE_STOP = "The pair of ranks | Stop the stale pair (logs saved first)"
# default-runtime dropped by hand, and a key of the user's added (the merge keeps it)
DAEMON_DRIFT = ("import json, sys; p = sys.argv[1]; c = json.load(open(p)); c.pop('default-runtime'); "
                "c['max-concurrent-downloads'] = 3; open(p, 'w').write(json.dumps(c, indent=2) + '\\n')")


def test_daemon_json_drift_on_the_worker_shows_its_diff_and_the_pairs_restart(run_pyinfra, sim_exec):
    """Issue 19: a repair that restarts Docker on the worker stops rank 1. --dry --diff shows daemon.json's diff and
    the pair's restart that follows it; the run restarts Docker, then the pair, and the API is live again."""
    before, ids = sim_exec("worker", ["cat", DAEMON_JSON]).stdout, pair_ids(sim_exec)
    assert sim_exec("worker", ["python3", "-c", DAEMON_DRIFT, DAEMON_JSON]).returncode == 0
    drifted = sim_exec("worker", ["cat", DAEMON_JSON]).stdout
    run = run_pyinfra(*DEPLOY, "--dry", "--diff")
    assert run.returncode == 0, run.stderr[-4000:]
    planned = {op["name"]: sorted(op["hosts_with_change"]) for op in run.data["plan"] if op["hosts_with_change"]}
    assert planned.get(DOCKER_STEP) == ["sim-worker"], planned
    # not shown as unchanged: both ranks are removed and started again
    assert planned.get(STALE_STOP) == ["sim-head", "sim-worker"], planned
    assert planned.get(START1) == ["sim-worker"] and planned.get(START0) == ["sim-head"], planned
    err = ANSI.sub("", run.stderr)
    assert f"Will modify {DAEMON_JSON}" in err, err[-3000:]
    assert any(line.strip() == '+   "default-runtime": "nvidia"' for line in err.splitlines()), err[-3000:]
    assert "rank 1 restarts: Docker restarts on the worker (daemon.json changes)" in err, err[-3000:]
    assert sim_exec("worker", ["cat", DAEMON_JSON]).stdout == drifted and pair_ids(sim_exec) == ids  # --dry: nothing

    run = deploy(run_pyinfra)
    changed = changed_ops(run)
    assert changed.get(DOCKER_STEP) == ["sim-worker"] and START1 in changed and START0 in changed, changed
    repaired = json.loads(sim_exec("worker", ["cat", DAEMON_JSON]).stdout)
    assert repaired["default-runtime"] == "nvidia" and repaired["max-concurrent-downloads"] == 3  # the user's key kept
    info = sim_exec("worker", ["docker", "info", "--format", "{{.DefaultRuntime}}"]).stdout.strip()
    assert info == "nvidia"
    head_after, worker_after = pair_ids(sim_exec)
    assert head_after != ids[0] and worker_after != ids[1], (ids, head_after, worker_after)
    assert head_after.endswith("true") and worker_after.endswith("true")
    assert started_at(sim_exec, "worker") < started_at(sim_exec, "head")
    assert chat()["choices"][0]["message"]["content"]
    assert changed_ops(deploy(run_pyinfra)) == {}  # converged again
    # the file as it was (the same settings once parsed: nothing to restart), the backup gone
    restore = sim_exec("worker", f"printf '%s' {shlex.quote(before)} > {DAEMON_JSON} && "
                                 f"rm -f {DAEMON_JSON}.sparkfold-backup")
    assert restore.returncode == 0


def group_data_dir(tmp_path, role: str, text: str):
    d = tmp_path / "group_data"
    d.mkdir(exist_ok=True)
    (d / f"{role}.py").write_text(text)
    return str(d)


def test_per_host_setting_in_group_data_changes_only_that_spark(run_pyinfra, sim_exec, tmp_path):
    before = pair_ids(sim_exec)
    extra = group_data_dir(tmp_path, "worker", "memguard_gib = 3.0\n")
    run = deploy(run_pyinfra, "--group-data", extra)
    changed = changed_ops(run)
    assert changed and all(hosts == ["sim-worker"] and name.startswith("Memguard | ")
                           for name, hosts in changed.items()), changed
    assert "--floor-gib 3" in sim_exec("worker", "cat /etc/systemd/system/sparkfold-memguard.service").stdout
    assert "--floor-gib 2.5" in sim_exec("head", "cat /etc/systemd/system/sparkfold-memguard.service").stdout
    assert pair_ids(sim_exec) == before  # memguard is not part of a rank's spec
    deploy(run_pyinfra)  # back to the defaults


def test_per_host_rank_setting_recreates_the_pair_in_order(run_pyinfra, sim_exec, tmp_path):
    head_before, worker_before = pair_ids(sim_exec)
    extra = group_data_dir(tmp_path, "worker", 'nccl_debug = "INFO"\n')
    run = deploy(run_pyinfra, "--group-data", extra)
    assert START1 in changed_ops(run) and START0 in changed_ops(run)
    head_after, worker_after = pair_ids(sim_exec)
    assert head_after != head_before and worker_after != worker_before  # the pair restarts together
    assert started_at(sim_exec, "worker") < started_at(sim_exec, "head")
    env = sim_exec("worker", ["docker", "inspect", "-f", "{{json .Config.Env}}", NAME]).stdout
    assert "NCCL_DEBUG=INFO" in env
    assert "NCCL_DEBUG" not in sim_exec("head", ["docker", "inspect", "-f", "{{json .Config.Env}}", NAME]).stdout
    # a re-run with the same group data changes nothing
    assert changed_ops(deploy(run_pyinfra, "--group-data", extra)) == {}
    deploy(run_pyinfra)


def test_nfs_volume_options_changed_is_recreated_with_the_intended_options(run_pyinfra, sim_exec):
    inspect = ["docker", "volume", "inspect", "-f", "{{json .Options}}", "sparkfold-hf"]
    want = json.loads(sim_exec("worker", inspect).stdout)
    labels = sim_exec("worker", ["docker", "volume", "inspect", "-f", "{{json .Labels}}", "sparkfold-hf"]).stdout
    assert sim_exec("worker", ["docker", "volume", "rm", "sparkfold-hf"]).returncode == 0
    label_args = [a for k, v in json.loads(labels).items() for a in ("--label", f"{k}={v}")]
    assert sim_exec("worker", ["docker", "volume", "create", *label_args, "--driver", "local", "--opt", "type=nfs",
                               "--opt", "o=addr=192.168.100.1,ro", "--opt", f"device={want['device']}",
                               "sparkfold-hf"]).returncode == 0
    run = deploy(run_pyinfra)
    assert json.loads(sim_exec("worker", inspect).stdout) == want
    assert list(changed_ops(run)) == [
        "NFS share of the head's Hugging Face cache | docker volume of the head's cache"], changed_ops(run)


# --- 4. bad input: refused before anything changes ----------------------------------------------------------------

def test_unreachable_worker_stops_before_anything_changes(run_pyinfra, sim_exec, site_file, tmp_path):
    before = pair_ids(sim_exec)
    bad = tmp_path / "sparks.yaml"
    bad.write_text(site_file.read_text().replace(f"ssh_port: {SSH_PORT['worker']}", "ssh_port: 2299"))
    run = run_pyinfra(*DEPLOY, "-y", env={"SPARKFOLD_SITE": str(bad)})
    assert run.returncode != 0
    assert "sim-worker" in run.stderr and ("Could not connect" in run.stderr or "failed" in run.stderr.lower())
    assert changed_ops(run) == {}
    assert pair_ids(sim_exec) == before


def test_too_little_memory_is_refused_with_the_numbers(run_pyinfra, sim_exec, sim):
    # a running rank holds its memory, so the floor guards a (re)start: take rank 1 away first
    head_before, _ = pair_ids(sim_exec)
    assert sim_exec("worker", ["docker", "rm", "-f", NAME]).returncode == 0
    memory_back(sim, "worker")
    sim.set_memavail("worker", 40)
    try:
        run = failing_deploy(run_pyinfra)
    finally:
        sim.set_memavail("worker", 118)
    assert "MemAvailable" in run.stderr and "112" in run.stderr, run.stderr[-3000:]
    assert changed_ops(run) == {}
    # nothing was started or removed (rank 0 itself exits when its peer goes away, as the engine does)
    head_after, worker_after = pair_ids(sim_exec)
    assert head_after.split()[0] == head_before.split()[0] and worker_after == ""
    deploy(run_pyinfra)
    assert all(i.endswith("true") for i in pair_ids(sim_exec))


def test_dry_with_too_little_memory_says_why_a_run_would_stop_and_changes_nothing(run_pyinfra, sim_exec, sim):
    assert sim_exec("worker", ["docker", "rm", "-f", NAME]).returncode == 0  # rank stopped: the floor applies
    # rank 0 ends with its peer and gives its memory back too: only the worker may be short
    memory_back(sim, "worker")
    memory_back(sim, "head")
    sim.set_memavail("worker", 40)
    try:
        run = run_pyinfra(*DEPLOY, "--dry")
    finally:
        sim.set_memavail("worker", 118)
    assert run.returncode == 0, run.stderr[-4000:]
    warnings = [line for line in ANSI.sub("", run.stderr).splitlines() if "will fail: memory" in line]
    assert warnings and all("sim-worker" in w for w in warnings), run.stderr[-3000:]
    assert any("40.0 GiB" in w and "112" in w and "min_avail_gib" in w for w in warnings), warnings
    assert container_id(sim_exec, "worker") == ""  # nothing was started
    deploy(run_pyinfra)
    assert all(i.endswith("true") for i in pair_ids(sim_exec))


def test_a_port_another_process_holds_is_refused_naming_it(run_pyinfra, sim_exec):
    assert run_pyinfra("inventory.py", "stop.py", "-y").returncode == 0
    assert sim_exec("head", "setsid python3 -m http.server 8888 >/dev/null 2>&1 </dev/null & sleep 1").returncode == 0
    try:
        run = failing_deploy(run_pyinfra)
        assert "port 8888 is held by python3 (pid " in run.stderr, run.stderr[-3000:]
        assert pair_ids(sim_exec) == ("", "")  # neither rank was started
    finally:
        sim_exec("head", "pkill -f 'http.server 8888'")
    deploy(run_pyinfra)
    assert all(i.endswith("true") for i in pair_ids(sim_exec))


def test_two_sparks_with_the_same_link_address_are_refused(run_pyinfra, sim_exec, site_file, tmp_path):
    before = pair_ids(sim_exec)
    bad = tmp_path / "sparks.yaml"
    bad.write_text(site_file.read_text().replace("address: 192.168.100.2/24", "address: 192.168.100.1/24"))
    run = run_pyinfra(*DEPLOY, "-y", env={"SPARKFOLD_SITE": str(bad)})
    assert run.returncode != 0
    assert "both use 192.168.100.1" in run.stderr, run.stderr[-3000:]
    assert pair_ids(sim_exec) == before


def test_a_rail_on_the_management_network_is_refused_before_any_network_change(run_pyinfra, sim_exec, site_file,
                                                                              tmp_path):
    before, netplan = pair_ids(sim_exec), sim_exec("head", "cat /etc/netplan/60-sparkfold-cx7.yaml").stdout
    bad = tmp_path / "sparks.yaml"
    bad.write_text(site_file.read_text().replace("netdev: enP2p1s0f0np0, address: 192.168.101.1/24",
                                                 "netdev: eth0, address: 192.168.101.1/24", 1))
    run = run_pyinfra(*DEPLOY, "-y", env={"SPARKFOLD_SITE": str(bad)})
    assert run.returncode != 0
    assert "eth0 carries this Spark's default route" in run.stderr, run.stderr[-3000:]
    assert sim_exec("head", "cat /etc/netplan/60-sparkfold-cx7.yaml").stdout == netplan
    assert "192.168.101.1" not in sim_exec("head", "ip -br addr show dev eth0").stdout
    assert changed_ops(run) == {} and pair_ids(sim_exec) == before


def test_unknown_extra_serve_flag_is_refused_before_the_pair_is_touched(run_pyinfra, sim_exec):
    before = pair_ids(sim_exec)
    run = failing_deploy(run_pyinfra, env={"SPARKFOLD_EXTRA_SERVE_ARGS": "--no-such-flag 3"})
    assert "--no-such-flag" in run.stderr, run.stderr[-3000:]
    assert changed_ops(run) == {}, changed_ops(run)
    assert pair_ids(sim_exec) == before
    assert chat()["choices"][0]["message"]["content"]


HF_ENV_FILE = "/home/nvidia/.local/state/sparkfold/hf-env"
HF_ENV_OP = "The model data | huggingface_hub variables for the head's downloads"


def test_hub_variables_reach_the_head_in_a_private_file_and_their_values_never_print(run_pyinfra, sim_exec):
    """HF_HUB_DOWNLOAD_TIMEOUT and the proxy variables of this machine go to the head's downloads in a 0600 file;
    the plan names them, even -vvv never shows a value (a proxy URL may hold a password); without them the file
    goes."""
    env = {"HF_HUB_DOWNLOAD_TIMEOUT": "45", "HTTPS_PROXY": "http://sim:s3cret@proxy.invalid:3128",
           "NO_PROXY": "127.0.0.1,localhost"}
    run = deploy(run_pyinfra, "-vvv", env=env)
    assert changed_ops(run) == {f"{HF_ENV_OP} (0600 file): HF_HUB_DOWNLOAD_TIMEOUT, HTTPS_PROXY, NO_PROXY":
                                ["sim-head"]}, changed_ops(run)
    assert "s3cret" not in run.stderr + run.stdout
    assert sim_exec("head", ["stat", "-c", "%a %U", HF_ENV_FILE]).stdout.split() == ["600", "nvidia"]
    seen = sim_exec("head", f". {HF_ENV_FILE}; echo \"$HF_HUB_DOWNLOAD_TIMEOUT $HTTPS_PROXY $NO_PROXY\"").stdout
    assert seen.split() == ["45", "http://sim:s3cret@proxy.invalid:3128", "127.0.0.1,localhost"]
    assert changed_ops(deploy(run_pyinfra, env=env)) == {}  # converged with them
    run = deploy(run_pyinfra)
    assert list(changed_ops(run)) == [f"{HF_ENV_OP}: none set on this machine"]
    assert sim_exec("head", ["test", "-e", HF_ENV_FILE]).returncode != 0


def test_a_hf_hub_version_the_given_python_lacks_is_refused_before_any_change(run_pyinfra, sim_exec):
    """The simulated head's hf_python (python3) has the pin; another pin is refused, with the fix, by --dry and by
    a run, which changes nothing (sparkfold never installs into a python it did not make)."""
    dry = run_pyinfra(*DEPLOY, "--dry", "--data", "hf_hub_version=9.9.9")
    assert "will fail: hf_python: python3 has huggingface_hub 2.4.0, not hf_hub_version 9.9.9" in dry.stderr, \
        dry.stderr[-3000:]
    run = failing_deploy(run_pyinfra, "--data", "hf_hub_version=9.9.9")
    assert "pip install 'huggingface_hub[hf_xet]==9.9.9'" in run.stderr and changed_ops(run) == {}
    assert sim_exec("head", "python3 -c 'import huggingface_hub as h; print(h.__version__)'").stdout.strip() == "2.4.0"


def test_ablit_without_a_token_is_refused_before_any_download(run_pyinfra, sim_exec):
    run = failing_deploy(run_pyinfra, env={"ABLIT": "1", "HF_TOKEN": ""})
    assert "HF_TOKEN" in run.stderr and "ablit" in run.stderr, run.stderr[-3000:]
    assert changed_ops(run) == {}
    assert sim_exec("head", "ls /home/nvidia/.cache/sparkfold/ablit 2>/dev/null").stdout.strip() == ""


# --- 5. stop, start, restart --------------------------------------------------------------------------------------

def test_stop_then_deploy_again(run_pyinfra, sim_exec):
    run = run_pyinfra("inventory.py", "stop.py", "-y")
    assert run.returncode == 0, run.stderr[-4000:]
    assert pair_ids(sim_exec) == ("", "")
    logs = sim_exec("head", "ls /home/nvidia/.cache/sparkfold/logs").stdout
    assert "rank0.log.gz" in logs
    assert "rank1.log.gz" in sim_exec("worker", "ls /home/nvidia/.cache/sparkfold/logs").stdout
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{API}/v1/models", timeout=5)
    run = deploy(run_pyinfra)
    assert "is now LIVE!" in run.stderr
    assert all(i.endswith("true") for i in pair_ids(sim_exec))


def test_restart_recreates_both_in_order_even_when_nothing_changed(run_pyinfra, sim_exec):
    before = pair_ids(sim_exec)
    run = run_pyinfra("inventory.py", "restart.py", "-y")
    assert run.returncode == 0, run.stderr[-4000:]
    after = pair_ids(sim_exec)
    assert after[0] != before[0] and after[1] != before[1]
    assert started_at(sim_exec, "worker") < started_at(sim_exec, "head")
    assert chat()["choices"][0]["message"]["content"]
    assert changed_ops(deploy(run_pyinfra)) == {}


# --- 6. one run at a time -----------------------------------------------------------------------------------------

def test_two_deploys_started_together_one_converges_the_other_refuses(site_file, sim_exec, run_pyinfra):
    assert sim_exec("worker", ["docker", "rm", "-f", NAME]).returncode == 0  # give the runs something to do
    runs = [start_deploy(site_file) for _ in range(2)]
    # both read at once: a run whose pipe is not read blocks once it fills, and would hold the lock for ever
    with ThreadPoolExecutor(2) as pool:
        said = list(pool.map(lambda r: r.stderr.read(), runs))
    results = [(r.wait(timeout=60), err) for r, err in zip(runs, said, strict=True)]
    codes = sorted(code for code, _ in results)
    assert codes[0] == 0 and codes[1] != 0, [(c, e[-2000:]) for c, e in results]
    loser = next(err for code, err in results if code != 0)
    assert "another sparkfold run holds" in loser and "run.lock" in loser, loser[-3000:]
    assert all(i.endswith("true") for i in pair_ids(sim_exec))  # the winner restarted the pair
    assert sim_exec("head", "test -e /var/lib/sparkfold/run.lock").returncode != 0  # released
    assert changed_ops(deploy(run_pyinfra)) == {}  # nothing was left half-done


def test_a_stale_lock_is_taken_over_with_a_warning(run_pyinfra, sim_exec):
    lock = "/var/lib/sparkfold/run.lock"
    stale = "run=deadbeef0000\nholder=ann@gone (pid 1)\nsince=2026-01-01T00:00:00+0000\npid=999999\n"
    assert sim_exec("worker", f"mkdir -p /var/lib/sparkfold && printf '{stale}' > {lock}").returncode == 0
    run = deploy(run_pyinfra)
    assert "taking over the stale run lock" in run.stderr and "ann@gone" in run.stderr, run.stderr[-3000:]
    assert changed_ops(run) == {}
    assert sim_exec("worker", f"test -e {lock}").returncode != 0
