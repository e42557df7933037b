"""A netplan apply that cuts a Spark's management path is undone by the Spark itself, the run fails saying so, and
the next run converges (issue 9). The cut comes from the stand-in netplan's test-only fault hook
(tests/sim/standins/netplan): operations/ knows nothing of it.

Runs after test_deploy.py and test_guards.py (file order); on its own it deploys the pair first.
"""

from __future__ import annotations

import subprocess
import time

from test_deploy import DEPLOY, addresses, changed_ops, chat, deploy, wait_until

ROLLBACK_S = 90  # the shortest window the settings take (longer than the confirmation's wait for the apply)
ROLLBACK = {"SPARKFOLD_LINK_ROLLBACK_S": str(ROLLBACK_S)}
RAIL, ADDRESS = "enP2p1s0f0np0", "192.168.101.2/24"
NETPLAN = "/etc/netplan/60-sparkfold-cx7.yaml"


def ssh_answers(sim, role: str) -> bool:
    try:
        return subprocess.run([*sim.ssh_argv(role), "true"], capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def newest_apply(sim_exec) -> str:
    return sim_exec("worker", "ls -1d /var/lib/sparkfold/netplan-apply/* | tail -1").stdout.strip()


def test_an_apply_that_cuts_ssh_is_reverted_by_the_spark_and_the_next_run_converges(run_pyinfra, sim_exec, sim):
    deploy(run_pyinfra)  # converged and serving (a no-op after the files before this one)
    # drift that needs an apply on the worker (a hand-edited file and a lost address), and an apply that will cut
    # the controller's ssh to it
    assert sim_exec("worker", f"echo '# edited by hand' >> {NETPLAN}").returncode == 0
    assert sim_exec("worker", f"ip addr del {ADDRESS} dev {RAIL}").returncode == 0
    assert sim_exec("worker", "echo cut-management > /run/sim-netplan.fault").returncode == 0
    try:
        run = run_pyinfra(*DEPLOY, "-y", env=ROLLBACK)
    finally:  # a run that stopped before its apply leaves the fault for the next file's deploy otherwise
        sim_exec("worker", "rm -f /run/sim-netplan.fault")
    assert run.returncode != 0, "a run whose apply cut ssh must fail"
    said = run.stderr
    assert "sim-worker" in said and ("no new ssh connection succeeded" in said
                                     or "automatic revert ran before the confirmation" in said), said[-4000:]
    assert sim_exec("worker", "test -e /run/sim-netplan.cut").returncode == 0 or \
        sim_exec("worker", f"test -e {newest_apply(sim_exec)}/reverted").returncode == 0  # the fault did fire

    # the Spark undoes the apply by itself (ROLLBACK_S after it) and ssh answers again
    folder = newest_apply(sim_exec)
    wait_until(lambda: sim_exec("worker", f"test -e {folder}/reverted").returncode == 0, ROLLBACK_S + 60,
               "the automatic revert")
    assert sim_exec("worker", "test -e /run/sim-netplan.cut").returncode != 0
    assert sim_exec("worker", f"test -e {folder}/confirmed").returncode != 0
    log = sim_exec("worker", f"cat {folder}/revert.log").stdout
    assert "reverting at" in log and "exit 0" in log, log
    assert "# edited by hand" in sim_exec("worker", f"cat {NETPLAN}").stdout  # the file as it was before the apply
    assert addresses(sim_exec, "worker", RAIL) == [ADDRESS]  # and applied again
    wait_until(lambda: ssh_answers(sim, "worker"), 30, "ssh to the worker")

    # no fault: the next run applies, confirms over a new connection, and serves; the one after changes nothing
    deploy(run_pyinfra, env=ROLLBACK)
    assert addresses(sim_exec, "worker", RAIL) == [ADDRESS]
    assert "# edited by hand" not in sim_exec("worker", f"cat {NETPLAN}").stdout
    folder = newest_apply(sim_exec)
    assert sim_exec("worker", f"test -e {folder}/confirmed").returncode == 0
    assert chat()["choices"][0]["message"]["content"]
    assert changed_ops(deploy(run_pyinfra)) == {}
    time.sleep(ROLLBACK_S + 2)  # past the window: the confirmed apply's timer fired and did nothing
    assert sim_exec("worker", f"test -e {folder}/reverted").returncode != 0
    assert addresses(sim_exec, "worker", RAIL) == [ADDRESS]
