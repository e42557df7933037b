"""The guarded netplan apply (operations/network/netplan_apply.py): its shell pieces run for real in a temp folder
with a recording `netplan` and `ip` first on PATH, and the confirmation's connection logic with a scripted connector."""

from __future__ import annotations

import os
import subprocess
import types

import pytest
from settings_factory import make_settings

from operations.network import netplan_apply as rb
from operations.settings import validate
from operations.settings.shapes import CONFIRM_WAIT_APPLY_S, MIN_ROLLBACK_S


@pytest.fixture
def spark(tmp_path):
    """A temp netplan folder (one file of the user's, ours absent), an apply folder and fake netplan/ip tools."""
    netplan_dir, bin_dir = tmp_path / "netplan", tmp_path / "bin"
    netplan_dir.mkdir()
    bin_dir.mkdir()
    (netplan_dir / "50-user.yaml").write_text("network: {version: 2}\n")
    log = tmp_path / "netplan.log"
    (bin_dir / "netplan").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexit ${{FAKE_NETPLAN_RC:-0}}\n")
    (bin_dir / "ip").write_text("#!/bin/sh\necho \"2: mgmt0    inet ${FAKE_MGMT_IP:-10.0.0.5}/24 brd x\"\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    return types.SimpleNamespace(dir=netplan_dir, apply=str(tmp_path / "applies" / "20261203-1"), log=log, env=env,
                                 user=str(netplan_dir / "50-user.yaml"), own=str(netplan_dir / "60-own.yaml"))


def sh(spark, command, **env):
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=dict(spark.env, **env),
                          timeout=30)


def snapshot_and_change(spark):
    before = {spark.user: True, spark.own: False}
    assert sh(spark, str(rb.snapshot_command(spark.apply, before, 60))).returncode == 0
    with open(spark.user, "w") as f:
        f.write("network: {version: 2, ethernets: {}}\n")  # a migration rewrote it
    with open(spark.own, "w") as f:
        f.write("ours\n")


def test_revert_puts_the_files_back_and_applies_once(spark):
    snapshot_and_change(spark)
    assert sh(spark, f"sh {spark.apply}/revert.sh").returncode == 0
    assert open(spark.user).read() == "network: {version: 2}\n"
    assert not os.path.exists(spark.own)
    assert spark.log.read_text().split("\n")[:2] == ["generate", "apply"]
    assert os.path.exists(f"{spark.apply}/reverted")
    # the timer firing after a revert already ran (or a confirmation) does nothing
    with open(spark.own, "w") as f:
        f.write("ours again\n")
    assert sh(spark, f"sh {spark.apply}/revert.sh").returncode == 0
    assert os.path.exists(spark.own)


def test_snapshot_folder_is_root_only(spark):
    snapshot_and_change(spark)
    assert os.path.exists(f"{spark.apply}/before/0")  # the user's file (ours did not exist: nothing to copy)
    assert not os.path.exists(f"{spark.apply}/before/1")
    assert os.stat(spark.apply).st_mode & 0o077 == 0  # netplan files can hold Wi-Fi keys: the copies stay root's


def apply_and_confirm(spark, mgmt=("mgmt0", "10.0.0.5"), **env):
    snapshot_and_change(spark)
    assert sh(spark, str(rb.apply_command(spark.apply)), **env).returncode == 0
    return sh(spark, rb.confirm_script(spark.apply, *mgmt), **env)


def test_confirmation_keeps_the_new_files_and_disarms_the_revert(spark):
    done = apply_and_confirm(spark)
    assert done.returncode == 0, done.stderr
    assert os.path.exists(f"{spark.apply}/confirmed")
    sh(spark, f"sh {spark.apply}/revert.sh")  # the timer fires later: it must not undo a confirmed apply
    assert open(spark.own).read() == "ours\n" and not os.path.exists(f"{spark.apply}/reverted")


def test_failed_apply_reverts_at_once(spark):
    done = apply_and_confirm(spark, FAKE_NETPLAN_RC="1")
    assert done.returncode == 1 and done.stderr.strip().endswith(f"{rb.MARK}2")
    assert not os.path.exists(spark.own) and os.path.exists(f"{spark.apply}/reverted")


def test_lost_management_address_reverts_at_once(spark):
    done = apply_and_confirm(spark, FAKE_MGMT_IP="10.9.9.9")
    assert done.stderr.strip().endswith(f"{rb.MARK}3")
    assert open(spark.user).read() == "network: {version: 2}\n" and not os.path.exists(spark.own)


def test_confirmation_after_the_revert_says_so(spark):
    snapshot_and_change(spark)
    sh(spark, str(rb.apply_command(spark.apply)))
    sh(spark, f"sh {spark.apply}/revert.sh")  # the timer won the race
    done = sh(spark, rb.confirm_script(spark.apply, "mgmt0", "10.0.0.5"))
    assert done.returncode == 1 and done.stderr.strip().endswith(f"{rb.MARK}5")


def test_arm_runs_the_revert_after_the_window():
    arm = str(rb.arm_command("/var/lib/sparkfold/netplan-apply/20261203-1", 90))
    assert arm == ("systemd-run --quiet --unit=sparkfold-netplan-revert-20261203-1 --on-active=90s "
                   "/bin/sh /var/lib/sparkfold/netplan-apply/20261203-1/revert.sh")


def test_new_apply_dirs_are_unique_and_unit_safe():
    names = {rb.new_apply_dir() for _ in range(20)}
    assert len(names) == 20
    assert all(n.rsplit("/", 1)[1].replace("-", "").isalnum() for n in names)


# --- the confirmation over a new connection (on this machine) ------------------------------------------------

class Output:
    def __init__(self, stderr):
        self.stderr_lines = stderr


def fake_host(connects_after: int, ok=True, stderr=()):
    attempts = []

    class Connector:
        def __init__(self, state, host):
            self.client = None

        def connect(self):
            attempts.append(1)
            if len(attempts) <= connects_after:
                raise OSError("Could not connect")

        def run_shell_command(self, command, **kwargs):
            attempts.append(("run", kwargs.get("_sudo"), str(command)))
            return ok, Output(list(stderr))

    return types.SimpleNamespace(name="sim-worker", connector_cls=Connector), attempts


def test_confirm_uses_a_new_connection_and_retries(monkeypatch):
    monkeypatch.setattr(rb.time, "sleep", lambda s: None)
    host, attempts = fake_host(connects_after=2)
    rb.confirm_over_new_connection(None, host, "/x/1", "eth0", "10.0.0.5", 60)
    assert attempts[:2] == [1, 1] and attempts[3][0] == "run" and attempts[3][1] is True
    assert "mkdir /x/1/decided" in attempts[3][2]


def test_confirm_passes_the_runs_sudo_password_on(monkeypatch):
    seen = {}
    host, _ = fake_host(connects_after=0)
    run = host.connector_cls.run_shell_command
    host.connector_cls.run_shell_command = lambda self, command, **kw: seen.update(kw) or run(self, command, **kw)
    planned = types.SimpleNamespace(current_op_global_arguments={"_sudo_password": "pw", "_sudo": True, "_su_user": ""})
    rb.confirm_over_new_connection(None, host, "/x/1", None, None, 60, sudo=rb.sudo_arguments(planned))
    assert seen == {"_sudo": True, "_sudo_password": "pw"}
    # pyinfra prints a callback's arguments: the password must not be among them
    _, tail = rb.guarded_apply("/x/1", {}, 60, None, None, rb.sudo_arguments(planned))
    assert "pw" not in repr(tail[-1]) and "_sudo_password" in repr(tail[-1])


def test_confirm_gives_up_before_the_revert_fires(monkeypatch):
    clock = iter(range(0, 1000, 7))
    monkeypatch.setattr(rb.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(rb.time, "sleep", lambda s: None)
    host, attempts = fake_host(connects_after=10**6)
    with pytest.raises(rb.NetplanNotConfirmed) as err:
        rb.confirm_over_new_connection(None, host, "/x/1", "eth0", "10.0.0.5", 60)
    text = str(err.value)
    assert "no new ssh connection succeeded within 45 s" in text and "puts its previous netplan files back" in text
    assert "Could not connect" in text and "link_rails" in text
    assert 0 < len(attempts) <= 8  # stopped at the deadline (45 s at 7 s per attempt), not at the revert


@pytest.mark.parametrize("code, says", [("2", "netplan apply failed"), ("3", "lost 10.0.0.5"),
                                        ("5", "automatic revert ran")])
def test_confirm_failure_names_what_happened(monkeypatch, code, says):
    host, _ = fake_host(connects_after=0, ok=False, stderr=["something", f"{rb.MARK}{code}"])
    with pytest.raises(rb.NetplanNotConfirmed) as err:
        rb.confirm_over_new_connection(None, host, "/x/1", "eth0", "10.0.0.5", 60)
    assert says in str(err.value) and "/x/1" in str(err.value)


# --- the window and the confirmation's wait (link_rollback_s) ----------------------------------------------------

def test_the_shortest_window_outlasts_the_confirmations_wait_for_the_apply():
    assert MIN_ROLLBACK_S > CONFIRM_WAIT_APPLY_S
    # the margin the confirmation keeps before the revert fires still leaves it time to connect after the wait
    assert MIN_ROLLBACK_S - min(15, max(5, MIN_ROLLBACK_S // 3)) > CONFIRM_WAIT_APPLY_S


@pytest.mark.parametrize("seconds", [30, 60, 89])
def test_a_rollback_window_no_longer_than_the_wait_is_refused_naming_the_minimum(seconds):
    found = [p for p in validate(make_settings("head", link_rollback_s=seconds)) if "link_rollback_s" in p]
    assert found == [f"link_rollback_s = {seconds} is below 90: the confirmation of a netplan apply waits up to 60 s "
                     "for the apply, and the Spark's revert must not fire while it waits; set link_rollback_s to 90 or "
                     "more"], found
    assert (MIN_ROLLBACK_S, CONFIRM_WAIT_APPLY_S) == (90, 60)  # the message's numbers are the constants


@pytest.mark.parametrize("seconds, ok", [(90, True), (120, True), (3600, True), (3601, False)])
def test_rollback_windows_from_the_minimum_to_an_hour_pass(seconds, ok):
    found = [p for p in validate(make_settings("head", link_rollback_s=seconds)) if "link_rollback_s" in p]
    assert (found == []) is ok, found
