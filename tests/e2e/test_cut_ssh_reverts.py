"""A netplan apply that cuts a Spark's management path is undone by the Spark itself, the run fails saying so, and
the next run converges (issue 9). A power cycle in the window, before anything decided, boots the files as they
were before the apply, and the next run settles the apply it left (issue 19). The Sparks run the real netplan and
systemd-networkd; the cut comes from a test-only fault armed on the worker (tests/sim/bin/sim-management-fault): the
deploy's real `netplan apply` re-triggers every netdev (a kernel uevent each) and the armed fault drops the management
path on it; the next apply (the revert's) restores it. operations/ knows nothing of it.

Starts from a converged pair (converged_pair) and leaves one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

import pytest
from test_deploy import DEPLOY, addresses, changed_ops, chat, deploy, start_deploy, wait_until

ROLLBACK_S = 90  # the shortest window the settings take (longer than the confirmation's wait for the apply)
ROLLBACK = {"SPARKFOLD_LINK_ROLLBACK_S": str(ROLLBACK_S)}
RAIL, ADDRESS = "enP2p1s0f0np0", "192.168.101.2/24"
NETPLAN = "/etc/netplan/60-sparkfold-cx7.yaml"
RUN_LOCK = "/var/lib/sparkfold/run.lock"
FAULT, CUT = "/run/sim/management-cut.fault", "/run/sim/management-cut"

pytestmark = pytest.mark.usefixtures("converged_pair")


def ssh_answers(sim, role: str) -> bool:
    try:
        return subprocess.run([*sim.ssh_argv(role), "true"], capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def newest_apply(sim_exec) -> str:
    return sim_exec("worker", "ls -1d /var/lib/sparkfold/netplan-apply/* | tail -1").stdout.strip()


def unit_ended(sim_exec, role: str, unit: str) -> dict[str, str] | None:
    """The unit's ActiveState and Result once it is no longer active or activating."""
    out = sim_exec(role, ["systemctl", "show", unit, "-p", "ActiveState,Result"]).stdout
    shown = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return None if shown.get("ActiveState") in ("active", "activating", "deactivating") else shown


def power_cycle(sim, role: str) -> None:
    """A power cut and a boot of the Spark (sim.reboot): every process gone (the transient revert timer, the killed
    run's ssh session its run lock records), /run empty (the staged /run/netplan, the fault's cut), and the network
    up from the files under /etc/netplan (netplan's generator, then systemd-networkd), as a Spark's boot brings it."""
    sim.reboot(role, hard=True)


def test_an_apply_that_cuts_ssh_is_reverted_by_the_spark_and_the_next_run_converges(run_pyinfra, sim_exec, sim):
    # drift that needs an apply on the worker (a hand-edited file and a lost address), and an apply that will cut
    # the controller's ssh to it
    assert sim_exec("worker", f"echo '# edited by hand' >> {NETPLAN}").returncode == 0
    assert sim_exec("worker", f"ip addr del {ADDRESS} dev {RAIL}").returncode == 0
    assert sim_exec("worker", f"touch {FAULT}").returncode == 0
    try:
        run = run_pyinfra(*DEPLOY, "-y", env=ROLLBACK)
    finally:  # a run that stopped before its apply leaves the fault for the next file's deploy otherwise
        sim_exec("worker", f"rm -f {FAULT}")
    assert run.returncode != 0, "a run whose apply cut ssh must fail"
    said = run.stderr
    assert "sim-worker" in said and ("no new ssh connection succeeded" in said
                                     or "automatic revert ran before the confirmation" in said), said[-4000:]
    assert sim_exec("worker", f"test -e {CUT}").returncode == 0 or \
        sim_exec("worker", f"test -e {newest_apply(sim_exec)}/reverted").returncode == 0  # the fault did fire

    # the Spark undoes the apply by itself (ROLLBACK_S after it) and ssh answers again
    folder = newest_apply(sim_exec)
    wait_until(lambda: sim_exec("worker", f"test -e {folder}/reverted").returncode == 0, ROLLBACK_S + 60,
               "the automatic revert")
    assert sim_exec("worker", f"test -e {CUT}").returncode != 0
    assert sim_exec("worker", f"test -e {folder}/confirmed").returncode != 0
    log = sim_exec("worker", f"cat {folder}/revert.log").stdout
    assert "reverting at" in log and "exit 0" in log, log
    assert "# edited by hand" in sim_exec("worker", f"cat {NETPLAN}").stdout  # the file as it was before the apply
    assert addresses(sim_exec, "worker", RAIL) == [ADDRESS]  # and applied again
    wait_until(lambda: ssh_answers(sim, "worker"), 30, "ssh to the worker")
    # the failed run's ssh session on the worker outlives the cut until TCP gives up on it (it had output in
    # flight), and its run lock is rightly held until then: wait for it as the refusal tells a user to
    wait_until(lambda: sim_exec("worker", f"! pid=$(sed -n 's/^pid=//p' {RUN_LOCK} 2>/dev/null) || "
                                          "[ -z \"$pid\" ] || ! kill -0 \"$pid\"").returncode == 0,
               300, "the failed run's session on the worker to end")

    # no fault: the next run applies, confirms over a new connection, and serves; the one after changes nothing
    deploy(run_pyinfra, env=ROLLBACK)
    assert addresses(sim_exec, "worker", RAIL) == [ADDRESS]
    assert "# edited by hand" not in sim_exec("worker", f"cat {NETPLAN}").stdout
    folder = newest_apply(sim_exec)
    assert sim_exec("worker", f"test -e {folder}/confirmed").returncode == 0
    assert chat()["choices"][0]["message"]["content"]
    assert changed_ops(deploy(run_pyinfra)) == {}
    # the window's end, now: what the confirmed apply's timer starts when it fires (its service) does nothing
    revert = f"sparkfold-netplan-revert-{folder.rsplit('/', 1)[1]}.service"
    assert sim_exec("worker", ["systemctl", "start", revert]).returncode == 0
    ended = wait_until(lambda: unit_ended(sim_exec, "worker", revert), 30, "the revert unit to end")
    assert ended == {"ActiveState": "inactive", "Result": "success"}, ended
    assert sim_exec("worker", f"test -e {folder}/reverted").returncode != 0
    assert addresses(sim_exec, "worker", RAIL) == [ADDRESS]


def test_a_power_cycle_in_the_window_boots_the_files_from_before_and_the_next_run_settles_it(
        run_pyinfra, sim_exec, sim, site_file, monkeypatch):
    before = newest_apply(sim_exec)
    assert sim_exec("worker", f"echo '# edited by hand' >> {NETPLAN}").returncode == 0
    assert sim_exec("worker", f"ip addr del {ADDRESS} dev {RAIL}").returncode == 0
    assert sim_exec("worker", f"touch {FAULT}").returncode == 0
    monkeypatch.setenv("SPARKFOLD_LINK_ROLLBACK_S", "3600")  # the timer cannot fire: only the power cycle acts
    run = start_deploy(site_file)
    said: list[str] = []
    assert run.stderr is not None
    reader = threading.Thread(target=lambda: said.extend(run.stderr), daemon=True)  # a full pipe would stall it
    reader.start()
    try:
        # the worker's apply ran and cut ssh: the Spark stops answering, the run waits to confirm over ssh
        folder = wait_until(lambda: (f := newest_apply(sim_exec)) != before and
                            sim_exec("worker", f"test -e {f}/applied").returncode == 0 and f, 300, "the apply")
        wait_until(lambda: sim_exec("worker", f"test -e {CUT}").returncode == 0, 30, "the cut")
        assert "# edited by hand" in sim_exec("worker", f"cat {NETPLAN}").stdout  # the new file is staged only
        assert sim_exec("worker", f"test -e /run/netplan/{NETPLAN.rsplit('/', 1)[1]}").returncode == 0
    finally:  # the user gives up on the run and power-cycles the Spark that stopped answering
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    power_cycle(sim, "worker")
    wait_until(lambda: ssh_answers(sim, "worker"), 30, "ssh to the worker")
    # it booted the files from before the apply: the hand edit is there, and the address comes from that file
    assert "# edited by hand" in sim_exec("worker", f"cat {NETPLAN}").stdout
    assert addresses(sim_exec, "worker", RAIL) == [ADDRESS]
    left = sorted(sim_exec("worker", f"ls {folder}").stdout.split())  # nothing decided the apply
    assert left == sorted(["new", "revert.sh", "promote.sh", "boot", "applied", "apply.log"]), left

    # the next run settles the apply the power cycle left (undone, recorded) and applies again; then converged
    run = deploy(run_pyinfra)
    assert "netplan apply an earlier run left" in " ".join(changed_ops(run)), changed_ops(run)
    assert sim_exec("worker", f"readlink {folder}/decided").stdout.strip() == "revert"
    assert sim_exec("worker", f"test -e {folder}/reverted").returncode == 0
    assert "reverting at" in sim_exec("worker", f"cat {folder}/revert.log").stdout
    assert "# edited by hand" not in sim_exec("worker", f"cat {NETPLAN}").stdout
    assert sim_exec("worker", f"test -e {newest_apply(sim_exec)}/confirmed").returncode == 0
    assert sim_exec("worker", "ls -A /run/netplan").stdout.strip() == ""  # the confirmed files left the stage
    assert addresses(sim_exec, "worker", RAIL) == [ADDRESS]
    assert chat()["choices"][0]["message"]["content"]
    assert changed_ops(deploy(run_pyinfra)) == {}
