"""The guarded netplan apply (operations/network/netplan_apply.py): its shell pieces run for real in a temp tree (etc/
and run/netplan, an apply folder) with a recording `netplan` and `ip` first on PATH, a reboot played by emptying the
stage folder and changing the boot the apply ran in, and the confirmation's connection logic with a scripted
connector."""

from __future__ import annotations

import os
import shutil
import subprocess
import types
from pathlib import Path

import gevent
import pytest
from pyinfra.api import FileUploadCommand, FunctionCommand
from settings_factory import make_settings

from operations.facts.network import NetplanState
from operations.network import netplan_apply as rb
from operations.settings import validate
from operations.settings.shapes import CONFIRM_WAIT_APPLY_S, MIN_ROLLBACK_S

USER = "network:\n  version: 2\n  ethernets:\n    enP7s7: {dhcp4: true}\n    enP2p1s0f0np0: {dhcp4: true}\n"
USER_CUT = "# sparkfold moved enP2p1s0f0np0\nnetwork:\n  version: 2\n  ethernets:\n    enP7s7: {dhcp4: true}\n"
CX7 = "network:\n  version: 2\n  ethernets:\n    enp1s0f0np0: {dhcp4: true}\n"
OURS = "# Managed by sparkfold\nnetwork:\n  version: 2\n  ethernets:\n    enp1s0f0np0: {mtu: 9000}\n"


@pytest.fixture
def spark(tmp_path):
    """etc/netplan with a file of the user's (mode 640) whose stanza moves out, a file of only our netdev that moves
    aside, ours absent; run/netplan empty; fake netplan/ip tools. changes: what one apply does to them."""
    etc, run, bin_dir = tmp_path / "etc" / "netplan", tmp_path / "run" / "netplan", tmp_path / "bin"
    for folder in (etc, run, bin_dir):
        folder.mkdir(parents=True)
    (etc / "50-user.yaml").write_text(USER)
    (etc / "50-user.yaml").chmod(0o640)
    (etc / "40-cx7.yaml").write_text(CX7)
    log = tmp_path / "netplan.log"
    (bin_dir / "netplan").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexit ${{FAKE_NETPLAN_RC:-0}}\n")
    (bin_dir / "ip").write_text("#!/bin/sh\necho \"2: mgmt0    inet ${FAKE_MGMT_IP:-10.0.0.5}/24 brd x\"\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    user, cx7, own = str(etc / "50-user.yaml"), str(etc / "40-cx7.yaml"), str(etc / "60-own.yaml")
    changes = [{"path": user, "text": USER_CUT, "mode": "640", "backup": True},
               {"path": cx7, "text": None, "mode": "644", "backup": True},
               {"path": own, "text": OURS, "mode": "600", "backup": False}]
    return types.SimpleNamespace(etc=etc, run=run, stage=str(run), applies=tmp_path / "applies", log=log, env=env,
                                 apply=str(tmp_path / "applies" / "20261203-101010-abc123"), user=user, cx7=cx7,
                                 own=own, changes=changes)


def sh(spark, command, **env):
    return subprocess.run(["sh", "-c", str(command)], capture_output=True, text=True, env=dict(spark.env, **env),
                          timeout=30)


def run_commands(spark, commands, **env):
    """Commands as pyinfra runs them on the Spark: shell text through sh, an upload written to its path."""
    for command in commands:
        if isinstance(command, FileUploadCommand):
            with open(command.dest, "w") as f:
                f.write(command.src.getvalue())
            continue
        done = sh(spark, command, **env)
        assert done.returncode == 0, (str(command), done.stderr)


def staged_and_applied(spark, **env):
    """Prepare, stage and apply, as guarded_apply orders them (the revert armed by systemd-run on a Spark is run by
    hand here, the confirmation by confirm())."""
    commands = rb.guarded_apply(spark.apply, spark.changes, 60, "mgmt0", "10.0.0.5", stage_dir=spark.stage)
    shown = [str(c) for c in commands]
    arm, apply = str(rb.arm_command(spark.apply, 60)), str(rb.apply_command(spark.apply))
    assert shown.index(arm) < shown.index(apply) == len(shown) - 2 and isinstance(commands[-1], FunctionCommand)
    staging = [c for c in shown if c.startswith(f"mkdir -p {spark.stage}")]
    assert staging == ([shown[shown.index(arm) + 1]] if spark.changes else [])  # armed before anything is staged
    run_commands(spark, commands[:shown.index(arm)] + commands[shown.index(arm) + 1:-2])
    assert sh(spark, apply, **env).returncode == 0
    wait = sh(spark, f"i=0; while [ ! -e {spark.apply}/applied ] && [ $i -lt 100 ]; do i=$((i+1)); sleep 0.1; done")
    assert wait.returncode == 0


def confirm(spark, mgmt=("mgmt0", "10.0.0.5"), **env):
    return sh(spark, rb.confirm_script(spark.apply, *mgmt), **env)


def reboot(spark):
    """What a power cycle does to an apply: the tmpfs stage folder is empty and the boot id is another one."""
    shutil.rmtree(spark.run)
    spark.run.mkdir()
    with open(f"{spark.apply}/boot", "w") as f:
        f.write("an-earlier-boot\n")


def text(path):
    return open(path).read() if os.path.exists(path) else None


def etc_as_before(spark):
    return text(spark.user) == USER and text(spark.cx7) == CX7 and text(spark.own) is None and \
        sorted(os.listdir(spark.etc)) == ["40-cx7.yaml", "50-user.yaml"]


# --- until it is confirmed, an apply lives under /run/netplan only ----------------------------------------------

def test_an_unconfirmed_apply_is_staged_and_leaves_etc_netplan_as_it_was(spark):
    staged_and_applied(spark)
    assert etc_as_before(spark)  # a power cycle now boots these
    assert {name: text(spark.run / name) for name in os.listdir(spark.run)} == {
        "50-user.yaml": USER_CUT, "60-own.yaml": OURS, "40-cx7.yaml": rb.shadow_text(spark.changes[1])}
    assert all(os.stat(spark.run / name).st_mode & 0o777 == 0o600 for name in os.listdir(spark.run))
    assert spark.log.read_text().split("\n")[:2] == ["generate", "apply"]
    assert os.stat(spark.apply).st_mode & 0o077 == 0  # the staged texts can hold Wi-Fi keys: the folder stays root's


def test_a_power_cycle_in_the_window_boots_the_old_files_and_the_next_run_records_the_revert(spark):
    staged_and_applied(spark)
    reboot(spark)
    assert etc_as_before(spark) and os.listdir(spark.run) == []  # what netplan reads at boot: the old config
    fact = NetplanState()
    listing = subprocess.run(["sh", "-c", fact.command(str(spark.etc), spark.stage, str(spark.applies))
                              .get_raw_value()], capture_output=True, text=True, check=True).stdout.splitlines()
    assert fact.process(listing)["undecided"] == {spark.apply: "pending"}  # the next run sees it ...
    spark.log.write_text("")
    assert sh(spark, rb.settle_command(spark.apply, "pending")).returncode == 0  # ... and settles it
    assert spark.log.read_text() == ""  # the network already runs the old files: no apply
    assert os.path.exists(f"{spark.apply}/reverted") and etc_as_before(spark)
    assert "did not run in this boot" in text(f"{spark.apply}/revert.log")
    listing = subprocess.run(["sh", "-c", fact.command(str(spark.etc), spark.stage, str(spark.applies))
                              .get_raw_value()], capture_output=True, text=True, check=True).stdout.splitlines()
    assert fact.process(listing)["undecided"] == {}
    assert confirm(spark).stderr.strip().endswith(f"{rb.MARK}5")  # a late confirmation keeps nothing


def test_revert_drops_the_staged_files_and_applies_the_old_ones_once(spark):
    staged_and_applied(spark)
    spark.log.write_text("")
    assert sh(spark, f"sh {spark.apply}/revert.sh").returncode == 0
    assert etc_as_before(spark) and os.listdir(spark.run) == []
    assert spark.log.read_text().split("\n")[:2] == ["generate", "apply"]
    log = text(f"{spark.apply}/revert.log")
    assert "reverting at" in log and "exit 0" in log
    # the timer firing after a revert already ran (or a confirmation) does nothing
    spark.log.write_text("")
    assert sh(spark, f"sh {spark.apply}/revert.sh").returncode == 0 and spark.log.read_text() == ""


def test_a_revert_cut_short_is_finished_by_the_next_one(spark):
    staged_and_applied(spark)
    os.symlink("revert", f"{spark.apply}/decided")  # claimed, then killed before it removed anything
    assert sh(spark, rb.settle_command(spark.apply, "revert")).returncode == 0
    assert os.listdir(spark.run) == [] and os.path.exists(f"{spark.apply}/reverted")


def test_an_apply_that_never_ran_is_undone_without_an_apply(spark):
    commands = rb.guarded_apply(spark.apply, spark.changes, 60, None, None, stage_dir=spark.stage)
    run_commands(spark, [c for c in commands[:-2] if not str(c).startswith("systemd-run ")])  # killed before apply
    spark.log.write_text("")
    assert sh(spark, f"sh {spark.apply}/revert.sh").returncode == 0
    assert os.listdir(spark.run) == [] and spark.log.read_text() == "" and etc_as_before(spark)


# --- the confirmation writes /etc/netplan --------------------------------------------------------------------

def promoted(spark):
    backup = rb.backup_path(spark.user, spark.apply)
    assert backup.endswith("50-user.yaml.sparkfold-backup-20261203-101010")
    assert text(spark.user) == USER_CUT and os.stat(spark.user).st_mode & 0o777 == 0o640  # its mode kept
    assert text(backup) == USER and os.stat(backup).st_mode & 0o777 == 0o640
    assert text(spark.cx7) is None and text(rb.backup_path(spark.cx7, spark.apply)) == CX7  # moved aside whole
    assert text(spark.own) == OURS and os.stat(spark.own).st_mode & 0o777 == 0o600
    assert sorted(os.listdir(spark.etc)) == sorted(["50-user.yaml", "60-own.yaml", os.path.basename(backup),
                                                    "40-cx7.yaml.sparkfold-backup-20261203-101010"])
    assert os.listdir(spark.run) == []
    return True


def test_confirmation_writes_the_files_to_etc_netplan_and_disarms_the_revert(spark):
    staged_and_applied(spark)
    done = confirm(spark)
    assert done.returncode == 0, done.stderr
    assert promoted(spark) and os.path.exists(f"{spark.apply}/confirmed")
    assert os.readlink(f"{spark.apply}/decided") == "confirm"
    sh(spark, f"sh {spark.apply}/revert.sh")  # the timer fires later: it must not undo a confirmed apply
    assert promoted(spark) and not os.path.exists(f"{spark.apply}/reverted")
    reboot(spark)
    assert promoted(spark)  # and a reboot keeps it


def test_a_confirmation_run_again_keeps_the_apply_with_one_backup(spark):
    staged_and_applied(spark)
    assert confirm(spark).returncode == 0 and promoted(spark)
    again = confirm(spark)
    assert again.returncode == 0, again.stderr
    assert promoted(spark) and not os.path.exists(f"{spark.apply}/reverted")


@pytest.mark.parametrize("cut", range(1, 7))
def test_a_promotion_cut_short_is_finished_by_the_next_run_with_one_backup(spark, cut):
    staged_and_applied(spark)
    os.symlink("confirm", f"{spark.apply}/decided")
    lines = text(f"{spark.apply}/promote.sh").splitlines()
    body = [n for n, line in enumerate(lines) if line.startswith(("[ ! -e", "install", "mv"))]
    assert len(body) == 6  # a backup, a text written (install, mv), a file moved aside, our file written
    partial = "\n".join(lines[:body[0]] + lines[body[0]:body[cut - 1] + 1]) + "\n"  # killed after `cut` steps
    assert sh(spark, partial).returncode == 0
    assert sh(spark, rb.settle_command(spark.apply, "confirm")).returncode == 0
    assert promoted(spark) and os.path.exists(f"{spark.apply}/confirmed")
    assert sh(spark, rb.settle_command(spark.apply, "confirm")).returncode == 0 and promoted(spark)  # no-op now


def test_promotion_refuses_an_apply_that_was_not_confirmed(spark):
    staged_and_applied(spark)
    done = sh(spark, f"sh {spark.apply}/promote.sh")
    assert done.returncode == 1 and "is not confirmed" in done.stderr and etc_as_before(spark)


def test_a_confirmation_that_cannot_write_etc_netplan_says_so(spark):
    staged_and_applied(spark)
    os.unlink(f"{spark.apply}/new/2")  # our file's text is gone: install fails
    done = confirm(spark)
    assert done.returncode == 1 and done.stderr.strip().endswith(f"{rb.MARK}6")
    assert os.readlink(f"{spark.apply}/decided") == "confirm" and not os.path.exists(f"{spark.apply}/confirmed")


def staged_not_applied(spark):
    commands = rb.guarded_apply(spark.apply, spark.changes, 60, "mgmt0", "10.0.0.5", stage_dir=spark.stage)
    run_commands(spark, [c for c in commands[:-2] if not str(c).startswith("systemd-run ")])


def test_the_apply_check_changes_nothing_and_says_when_the_apply_finished(spark, monkeypatch):
    monkeypatch.setattr(rb, "APPLIED_POLL_S", 1)
    staged_not_applied(spark)
    before = sorted(os.listdir(spark.apply)), sorted(os.listdir(spark.run))
    waited = sh(spark, rb.applied_check(spark.apply))
    assert waited.returncode == 0 and waited.stdout == "" and (sorted(os.listdir(spark.apply)),
                                                               sorted(os.listdir(spark.run))) == before
    assert sh(spark, rb.apply_command(spark.apply)).returncode == 0
    seen = sh(spark, rb.applied_check(spark.apply))  # the detached apply finishes while it waits
    assert seen.returncode == 0 and seen.stdout == f"{rb.SEEN}0\n" and etc_as_before(spark)
    assert not os.path.lexists(f"{spark.apply}/decided")


def test_the_claim_refuses_an_apply_that_has_not_finished(spark):
    staged_not_applied(spark)
    done = confirm(spark)
    assert done.returncode == 1 and "has not finished" in done.stderr and rb.MARK not in done.stderr
    assert not os.path.lexists(f"{spark.apply}/decided") and etc_as_before(spark)


def test_the_apply_check_giving_up_reverts_an_apply_that_never_finished(spark, monkeypatch):
    monkeypatch.setattr(rb, "APPLIED_POLL_S", 0)
    staged_not_applied(spark)
    done = sh(spark, rb.applied_check(spark.apply, give_up=True))
    assert done.returncode == 1 and done.stderr.strip().endswith(f"{rb.MARK}4")
    assert f"did not finish within {CONFIRM_WAIT_APPLY_S} s" in done.stderr
    assert os.readlink(f"{spark.apply}/decided") == "revert" and os.path.exists(f"{spark.apply}/reverted")
    assert os.listdir(spark.run) == [] and etc_as_before(spark)


def test_failed_apply_reverts_at_once(spark):
    staged_and_applied(spark, FAKE_NETPLAN_RC="1")
    done = confirm(spark, FAKE_NETPLAN_RC="1")
    assert done.returncode == 1 and done.stderr.strip().endswith(f"{rb.MARK}2")
    assert etc_as_before(spark) and os.listdir(spark.run) == [] and os.path.exists(f"{spark.apply}/reverted")


def test_lost_management_address_reverts_at_once(spark):
    staged_and_applied(spark)
    done = confirm(spark, FAKE_MGMT_IP="10.9.9.9")
    assert done.stderr.strip().endswith(f"{rb.MARK}3")
    assert etc_as_before(spark) and os.listdir(spark.run) == []


def test_confirmation_after_the_revert_says_so(spark):
    staged_and_applied(spark)
    sh(spark, f"sh {spark.apply}/revert.sh")  # the timer won the race
    done = confirm(spark)
    assert done.returncode == 1 and done.stderr.strip().endswith(f"{rb.MARK}5") and etc_as_before(spark)


def test_a_drift_apply_changes_no_file_and_its_revert_applies_again(spark):
    spark.changes = []  # the files are right, an address was removed by hand
    staged_and_applied(spark)
    assert etc_as_before(spark) and os.listdir(spark.run) == []
    assert confirm(spark).returncode == 0 and os.path.exists(f"{spark.apply}/confirmed") and etc_as_before(spark)


# --- what netplan reads: the real tool (the simulated Sparks run it too) -----------------------------------------

REAL_NETPLAN = shutil.which("netplan")


def networkd_of_real_netplan(root: Path) -> str:
    """The networkd files Debian's `netplan generate --root-dir` writes for root/{lib,etc,run}/netplan, joined."""
    shutil.rmtree(root / "run" / "systemd", ignore_errors=True)
    done = subprocess.run([str(REAL_NETPLAN), "generate", "--root-dir", str(root)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    folder = root / "run" / "systemd" / "network"
    return "".join(p.read_text() for p in sorted(folder.glob("*.network"))) if folder.exists() else ""


@pytest.mark.skipif(REAL_NETPLAN is None, reason="needs netplan (Debian's netplan.io)")
def test_real_netplan_reads_the_staged_files_over_etc_netplan_and_etc_alone_after_a_reboot(spark, tmp_path):
    before = networkd_of_real_netplan(tmp_path)
    assert "Name=enP2p1s0f0np0" in before and "Name=enp1s0f0np0" in before and "DHCP=ipv4" in before
    staged_and_applied(spark)
    during = networkd_of_real_netplan(tmp_path)
    assert "Name=enP7s7" in during and "Name=enP2p1s0f0np0" not in during  # the cut file shadows the user's
    netdev = during[during.index("Name=enp1s0f0np0"):]
    assert "DHCP" not in netdev.split("[Match]")[0]  # the file moved aside is hidden by its empty shadow
    reboot(spark)
    assert networkd_of_real_netplan(tmp_path) == before


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
    def __init__(self, stdout=(), stderr=()):
        self.stdout_lines, self.stderr_lines = list(stdout), list(stderr)


class SparkOverSsh:
    """A Spark as this machine sees it, on a fake clock (time.monotonic and time.sleep read and move `now`): its
    apply finishes at applied_at; `refuse` connections fail; hangs[kind] commands of that kind ("check" or "claim")
    never answer (pyinfra's _timeout ends them; without one the test fails instead of hanging). Each connector
    records when it connected and what it ran; seen_at is when a reply first said the apply finished."""

    def __init__(self, monkeypatch, applied_at=0.0, refuse=0, hangs=None, ok=True, stderr=()):
        self.now, self.applied_at, self.refuse, self.hangs = 0.0, applied_at, refuse, dict(hangs or {})
        self.ok, self.stderr, self.seen_at = ok, list(stderr), None
        self.attempts, self.runs, self.closed = [], [], []
        monkeypatch.setattr(rb.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(rb.time, "sleep", self.wait)

    def wait(self, s):
        self.now += s

    def host(self):
        remote = self

        class Client:
            def close(self):
                remote.closed.append(self)

        class Connector:
            def __init__(self, state, host):
                self.client, self.connected_at = None, None

            def connect(self):
                remote.now += 0.1
                remote.attempts.append(remote.now)
                if remote.refuse > 0:
                    remote.refuse -= 1
                    raise OSError("Could not connect")
                self.client, self.connected_at = Client(), remote.now

            def run_shell_command(self, command, **kwargs):
                text = str(command)
                kind = "claim" if "ln -s confirm" in text else "check"
                remote.runs.append((kind, self.connected_at, kwargs, text))
                if remote.hangs.get(kind, 0) > 0:
                    remote.hangs[kind] -= 1
                    assert kwargs.get("_timeout"), "a call with no time limit: it would wait forever"
                    remote.now += kwargs["_timeout"]
                    raise TimeoutError()
                if kind == "claim":
                    return remote.ok, Output(stderr=remote.stderr)
                remote.now += min(rb.APPLIED_POLL_S, max(0.2, remote.applied_at - remote.now))  # waits on the Spark
                if remote.now < remote.applied_at:
                    if "revert.sh" in text:  # the apply hung: applied_check reverts it
                        return False, Output(stderr=["netplan apply did not finish", f"{rb.MARK}4"])
                    return True, Output()
                remote.seen_at = remote.seen_at or remote.now
                return True, Output(stdout=[f"{rb.SEEN}0"])

        return types.SimpleNamespace(name="sim-worker", connector_cls=Connector)

    def claims(self):
        return [run for run in self.runs if run[0] == "claim"]


def test_the_claim_goes_only_over_a_connection_opened_after_the_apply_was_seen_finished(monkeypatch):
    # the incident: a connection made before the apply cut the management path claimed, and proved nothing
    remote = SparkOverSsh(monkeypatch, applied_at=12.0)
    rb.confirm_over_new_connection(None, remote.host(), "/x/1", "eth0", "10.0.0.5", 90)
    assert remote.seen_at is not None, "no side-effect-free check saw the apply finish before the claim"
    claims = remote.claims()
    assert len(claims) == 1 and claims[0][1] > remote.seen_at  # its TCP and authentication came after the answer
    checks = [run for run in remote.runs if run[0] == "check"]
    assert len(checks) >= 2 and all("ln -s" not in run[3] and "promote" not in run[3] for run in checks)
    assert all(run[1] < claims[0][1] for run in checks)  # the polling connections are other ones, all closed
    assert len(remote.closed) == len(remote.runs)
    assert "ln -s confirm /x/1/decided" in claims[0][3] and "sh /x/1/promote.sh" in claims[0][3]
    assert claims[0][2]["_sudo"] is True


def test_confirm_retries_new_connections_until_one_connects(monkeypatch):
    remote = SparkOverSsh(monkeypatch, refuse=2)
    rb.confirm_over_new_connection(None, remote.host(), "/x/1", "eth0", "10.0.0.5", 90)
    assert len(remote.attempts) == 4 and [run[0] for run in remote.runs] == ["check", "claim"]


def test_a_claim_whose_reply_never_comes_times_out_and_a_fresh_connection_confirms(monkeypatch):
    remote = SparkOverSsh(monkeypatch, hangs={"claim": 1})
    rb.confirm_over_new_connection(None, remote.host(), "/x/1", "eth0", "10.0.0.5", 90)
    first, second = remote.claims()
    assert second[1] > first[1]  # another connection, opened after the first gave up
    assert all(0 < run[2]["_timeout"] <= rb.REPLY_S for run in remote.runs)
    assert len(remote.closed) == 3  # the timed-out connection was closed too


def test_a_check_whose_reply_never_comes_times_out_and_the_next_connection_goes_on(monkeypatch):
    remote = SparkOverSsh(monkeypatch, hangs={"check": 1})
    rb.confirm_over_new_connection(None, remote.host(), "/x/1", None, None, 90)
    assert [run[0] for run in remote.runs] == ["check", "check", "claim"]


def test_a_connection_stuck_before_pyinfras_time_limit_is_given_up_too(monkeypatch):
    # paramiko waits for authentication, the channel and the exit status outside pyinfra's _timeout
    monkeypatch.setattr(rb, "SETUP_S", 0.05, raising=False)
    monkeypatch.setattr(rb, "REPLY_S", 0.05, raising=False)
    monkeypatch.setattr(rb.time, "sleep", lambda s: None)
    interrupted, runs = [], []

    class Connector:
        def __init__(self, state, host):
            self.client = None

        def connect(self):
            pass

        def run_shell_command(self, command, **kwargs):
            runs.append(str(command))
            if len(runs) == 1:  # a channel that never opens
                try:
                    gevent.sleep(5)
                except gevent.Timeout:
                    interrupted.append(1)
                    raise
                raise AssertionError("nothing ended a connection stuck for 5 s")
            return True, Output(stdout=[f"{rb.SEEN}0"])

    rb.confirm_over_new_connection(None, types.SimpleNamespace(name="w", connector_cls=Connector), "/x/1", None,
                                   None, 90)
    assert interrupted == [1] and len(runs) == 3 and "ln -s confirm" in runs[2]


def test_confirm_passes_the_runs_sudo_password_on(monkeypatch):
    remote = SparkOverSsh(monkeypatch)
    planned = types.SimpleNamespace(current_op_global_arguments={"_sudo_password": "pw", "_sudo": True, "_su_user": ""})
    rb.confirm_over_new_connection(None, remote.host(), "/x/1", None, None, 90, sudo=rb.sudo_arguments(planned))
    assert [run[2] for run in remote.runs] == [{"_sudo": True, "_sudo_password": "pw", "_timeout": rb.REPLY_S}] * 2
    # pyinfra prints a callback's arguments: the password must not be among them
    commands = rb.guarded_apply("/x/1", [], 60, None, None, rb.sudo_arguments(planned))
    assert "pw" not in repr(commands[-1]) and "_sudo_password" in repr(commands[-1])


def test_confirm_gives_up_before_the_revert_fires(monkeypatch):
    remote = SparkOverSsh(monkeypatch, refuse=10**6)
    host = remote.host()
    refused = host.connector_cls.connect

    def slow_connect(self):  # each refused attempt takes 5 s (then 2 s of pause)
        remote.now += 4.9
        refused(self)

    host.connector_cls.connect = slow_connect
    with pytest.raises(rb.NetplanNotConfirmed) as err:
        rb.confirm_over_new_connection(None, host, "/x/1", "eth0", "10.0.0.5", 60)
    text = str(err.value)
    assert "no new ssh connection succeeded within 45 s" in text and "puts its previous netplan files back" in text
    assert "Could not connect" in text and "link_rails" in text and "was sent" not in text
    assert len(remote.attempts) == 7 and remote.now < 60  # stopped at the deadline (45 s), not at the revert


def test_connections_that_never_answer_end_at_the_deadline(monkeypatch):
    # established, then every packet dropped: each attempt ends at its time limit, the run at the deadline
    remote = SparkOverSsh(monkeypatch, hangs={"check": 10**6, "claim": 10**6})
    with pytest.raises(rb.NetplanNotConfirmed) as err:
        rb.confirm_over_new_connection(None, remote.host(), "/x/1", "eth0", "10.0.0.5", 90)
    text = str(err.value)
    assert "no new ssh connection succeeded within 75 s" in text and f"no reply within {rb.REPLY_S} s" in text
    assert remote.claims() == [] and all(at < 75 for at in remote.attempts) and len(remote.attempts) == 4


def test_a_claim_sent_but_never_answered_is_said_when_the_deadline_comes(monkeypatch):
    remote = SparkOverSsh(monkeypatch, hangs={"claim": 10**6})
    with pytest.raises(rb.NetplanNotConfirmed) as err:
        rb.confirm_over_new_connection(None, remote.host(), "/x/1", "eth0", "10.0.0.5", 90)
    assert "answer never came" in str(err.value) and "readlink /x/1/decided" in str(err.value)


def test_an_apply_that_never_finishes_is_reverted_after_the_wait(monkeypatch):
    remote = SparkOverSsh(monkeypatch, applied_at=10**6)
    with pytest.raises(rb.NetplanNotConfirmed) as err:
        rb.confirm_over_new_connection(None, remote.host(), "/x/1", "eth0", "10.0.0.5", 90)
    assert f"did not finish within {CONFIRM_WAIT_APPLY_S} s" in str(err.value) and remote.claims() == []
    gave_up = [run for run in remote.runs if "revert.sh" in run[3]]
    assert len(gave_up) == 1 and remote.runs[-1] == gave_up[0] and remote.now >= CONFIRM_WAIT_APPLY_S


@pytest.mark.parametrize("code, says", [("2", "netplan apply failed"), ("3", "lost 10.0.0.5"),
                                        ("5", "automatic revert ran"), ("6", "could not all be written")])
def test_confirm_failure_names_what_happened(monkeypatch, code, says):
    remote = SparkOverSsh(monkeypatch, ok=False, stderr=["something", f"{rb.MARK}{code}"])
    with pytest.raises(rb.NetplanNotConfirmed) as err:
        rb.confirm_over_new_connection(None, remote.host(), "/x/1", "eth0", "10.0.0.5", 90)
    assert says in str(err.value) and "/x/1" in str(err.value)


def test_an_unconfirmed_apply_fails_its_spark_with_the_reason_and_no_traceback(monkeypatch, caplog):
    # the guarded apply's FunctionCommand: a raise there is pyinfra's "Unexpected error in Python callback" and a
    # traceback; the Spark fails with the one run-time failure line instead
    from harness import FakeHost
    from pyinfra.context import ctx_host
    remote = SparkOverSsh(monkeypatch, ok=False, stderr=["something", f"{rb.MARK}2"])
    with ctx_host.use(FakeHost({}, name="w")), caplog.at_level("ERROR", logger="pyinfra"):
        assert rb.netplan_confirmed(None, remote.host(), "/x/1", "eth0", "10.0.0.5", 90) is False
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "sparkfold: netplan apply: " in said[0] and "netplan apply failed" in said[0], said


# --- the window and the confirmation's wait (link_rollback_s) ----------------------------------------------------

def test_the_shortest_window_outlasts_the_confirmations_wait_for_the_apply():
    assert MIN_ROLLBACK_S > CONFIRM_WAIT_APPLY_S
    # the margin the confirmation keeps before the revert fires still leaves it time to connect after the wait
    # (the last check waits APPLIED_POLL_S on the Spark)
    assert MIN_ROLLBACK_S - min(15, max(5, MIN_ROLLBACK_S // 3)) > CONFIRM_WAIT_APPLY_S + rb.APPLIED_POLL_S


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
