"""The optional supervisor, running for real on the simulated pair (under systemd, PID 1 there), and the refusal of
--limit for what changes the pair. memguard's kill is tested in test_memory.py (with its footprint left alone).

Starts from a converged pair (converged_pair) and leaves one.
"""

from __future__ import annotations

import pytest
import requests
from test_deploy import API, NAME, changed_ops, chat, deploy, pair_ids, wait_until

SUPERVISOR = "sparkfold-supervise.service"


def journal(sim_exec, role: str, unit: str, latest: bool = False) -> str:
    """What `unit` printed (its journal); latest: since its latest start only."""
    if latest:
        invocation = sim_exec(role, ["systemctl", "show", unit, "-p", "InvocationID", "--value"]).stdout.strip()
        if not invocation:
            return ""
        return sim_exec(role, ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "--no-pager"]).stdout
    return sim_exec(role, ["journalctl", "-u", unit, "-o", "cat", "--no-pager"]).stdout

pytestmark = pytest.mark.usefixtures("converged_pair")


def running(sim_exec, role: str) -> bool:
    out = sim_exec(role, ["docker", "inspect", "-f", "{{.State.Running}}", NAME])
    return out.returncode == 0 and out.stdout.strip() == "true"


def serving() -> bool:
    try:
        return requests.get(f"{API}/v1/models", timeout=3).status_code == 200
    except requests.RequestException:
        return False


def test_supervisor_restarts_the_pair_in_order_and_is_removed_from_service_when_off(run_pyinfra, sim_exec):
    env = {"SPARKFOLD_SUPERVISE": "1", "SPARKFOLD_SUPERVISE_BACKOFF_S": "1"}
    deploy(run_pyinfra, env=env)
    assert sim_exec("head", f"systemctl is-active {SUPERVISOR}").stdout.strip() == "active"
    assert sim_exec("worker", f"test -e /etc/systemd/system/{SUPERVISOR}").returncode != 0  # head only
    before = pair_ids(sim_exec)
    # the supervisor arms once it has seen both ranks running (a look every 5 s): until then an exit is not its to mend
    wait_until(lambda: "supervising the pair" in journal(sim_exec, "head", SUPERVISOR, latest=True), 60,
               "the supervisor to arm")
    assert sim_exec("worker", ["docker", "kill", NAME]).returncode == 0
    wait_until(lambda: running(sim_exec, "worker") and running(sim_exec, "head") and serving(), 90,
               "the supervisor to restart the pair")
    # the same containers were started again (the deploy's, not new ones), so a deploy has nothing to do
    assert [i.split()[0] for i in pair_ids(sim_exec)] == [i.split()[0] for i in before]
    assert changed_ops(deploy(run_pyinfra, env=env)) == {}
    # off again: stopped and disabled, its file kept
    deploy(run_pyinfra)
    assert sim_exec("head", f"systemctl is-active {SUPERVISOR}").stdout.strip() != "active"
    assert sim_exec("head", f"systemctl is-enabled {SUPERVISOR}").stdout.strip() != "enabled"
    assert chat()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("script", ["deploy.py", "stop.py", "restart.py"])
def test_a_limit_to_one_spark_is_refused_for_what_changes_the_pair(run_pyinfra, sim_exec, script):
    before = pair_ids(sim_exec)
    run = run_pyinfra("inventory.py", script, "-y", "--limit", "worker")
    assert run.returncode != 0
    said = run.stderr + run.stdout
    line = f"--limit is not used with {script}: the two Sparks are one server; run it without --limit"
    assert line in said, said[-3000:]
    assert changed_ops(run) == {}
    assert pair_ids(sim_exec) == before and serving()  # nothing stopped or recreated
