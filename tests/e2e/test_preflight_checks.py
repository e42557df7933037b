"""The preflight's checks that only a Spark can answer, on the simulated pair: sudo that asks for a password stops
the plan with the sudoers line; a symlink that leads state_dir into the exported hub is refused (the text passed).

Each test puts the Spark back as it found it; nothing is deployed.
"""

from __future__ import annotations

from test_deploy import ANSI, DEPLOY

SUDOERS = "/etc/sudoers.d/nvidia"  # the sim's passwordless sudo (tests/sim/Dockerfile)


def test_sudo_that_asks_for_a_password_stops_the_plan_naming_the_sudoers_line(run_pyinfra, sim_exec):
    # nvidia stays in group sudo, whose rule asks for a password: `sudo -n true` says so
    assert sim_exec("worker", f"mv {SUDOERS} /root/nvidia.sudoers").returncode == 0
    try:
        run = run_pyinfra(*DEPLOY, "--dry")
    finally:
        assert sim_exec("worker", f"mv /root/nvidia.sudoers {SUDOERS}").returncode == 0
    err = ANSI.sub("", run.stderr)
    assert run.returncode != 0, err[-4000:]
    assert ("sim-worker: sudo: nvidia cannot use sudo without a password (`sudo -n true` gave rc 1: sudo: a password "
            "is required); every step after the preflight runs as root through sudo, which must not ask. Fix: on this "
            "Spark, run `sudo visudo -f /etc/sudoers.d/sparkfold`, add the line `nvidia ALL=(ALL) NOPASSWD: ALL` and "
            "save (visudo refuses a broken line, which would stop sudo altogether)") in err, err[-4000:]
    assert "sudo password:" not in err  # pyinfra never got to ask


def test_a_state_dir_that_a_symlink_leads_into_the_exported_hub_is_refused(run_pyinfra, sim_exec):
    hub = "/home/nvidia/.cache/huggingface/hub"
    assert sim_exec("head", f"ln -sfn {hub}/sf-state /srv/sf-state").returncode == 0
    try:
        run = run_pyinfra(*DEPLOY, "--dry", "--data", "state_dir=/srv/sf-state")
    finally:
        assert sim_exec("head", "rm -f /srv/sf-state").returncode == 0
    err = ANSI.sub("", run.stderr)
    assert run.returncode == 0, err[-4000:]  # --dry warns and changes nothing
    assert (f"sim-head: will fail: where the folders lead: state_dir = '/srv/sf-state' resolves to {hub}/sf-state on "
            f"this Spark (symlinks followed), inside hf_cache's hub folder {hub}") in err, err[-4000:]
    assert "sim-worker: will fail: where the folders lead" not in err  # no symlink there
