"""The run lock: its fact, the refusal while another live run holds it, take-over of a stale one, and the take and
release commands run for real in a shell."""

from __future__ import annotations

import os
import subprocess

import pytest
from harness import FakeHost, parse_fact, run_op, with_args
from pyinfra.context import ctx_host, ctx_state
from waiting import wait_for

from operations import run_lock as rl

PATH = "/home/nvidia/.local/state/sparkfold/run.lock"
OTHER = {"run": "0123456789ab", "holder": "ann@laptop (pid 7)", "since": "2026-12-03T08:00:00+0000", "pid": "4242"}


def sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def test_fact_reads_the_fields_and_whether_the_session_lives(tmp_path):
    lock = tmp_path / "run.lock"
    assert rl.RunLock().process(sh(rl.RunLock().command(path=str(lock)).get_raw_value()).stdout.splitlines()) is None
    lock.write_text("run=abc\nholder=me@here (pid 1)\nsince=now\npid=999999999\n")
    got = rl.RunLock().process(sh(rl.RunLock().command(path=str(lock)).get_raw_value()).stdout.splitlines())
    assert got == {"run": "abc", "holder": "me@here (pid 1)", "since": "now", "pid": "999999999", "alive": "0"}
    lock.write_text("run=abc\npid=1\n")  # pid 1 always exists
    assert parse_fact(rl.RunLock, sh(rl.RunLock().command(path=str(lock)).get_raw_value()).stdout,
                      path=str(lock))["alive"] == "1"


BOOT = open("/proc/sys/kernel/random/boot_id").read().strip()


def start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat, counted after the name in parentheses."""
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19]


@pytest.fixture
def processes():
    """A live process and the pid of one that has ended (its start time, when it lived, too)."""
    live, ended = subprocess.Popen(["sleep", "30"]), subprocess.Popen(["sleep", "30"])
    ended_start = start_time(ended.pid)
    ended.kill()
    ended.wait()
    yield live, ended.pid, ended_start
    live.kill()
    live.wait()


# (case, the lock's fields from the pid, start time and boot of the live process and of the ended one, alive)
LIVENESS = [
    ("alive", lambda p, s, d, ds: f"pid={p}\nboot={BOOT}\nstart={s}\n", True),
    ("dead pid", lambda p, s, d, ds: f"pid={d}\nboot={BOOT}\nstart={ds}\n", False),
    ("other boot", lambda p, s, d, ds: f"pid={p}\nboot=another-boot\nstart={s}\n", False),  # rebooted since
    ("reused pid", lambda p, s, d, ds: f"pid={p}\nboot={BOOT}\nstart={int(s) + 1}\n", False),  # another start
    ("pid 0", lambda p, s, d, ds: f"pid=0\nboot={BOOT}\n", False),  # an older take wrote it: never alive
    ("no pid", lambda p, s, d, ds: f"pid=\nboot={BOOT}\nstart={s}\n", False),
    ("older lock", lambda p, s, d, ds: f"pid={p}\n", True),  # no boot id or start time: the pid alone decides
    ("older lock, dead", lambda p, s, d, ds: f"pid={d}\n", False),
]


@pytest.mark.parametrize("case, fields, alive", LIVENESS, ids=[c[0] for c in LIVENESS])
def test_one_rule_judges_a_lock_for_the_fact_and_for_a_take(tmp_path, processes, case, fields, alive):
    live, dead, dead_start = processes
    lock = tmp_path / "run.lock"
    text = "run=0123456789ab\n" + fields(live.pid, start_time(live.pid), dead, dead_start)
    lock.write_text(text)
    fact = rl.RunLock().process(sh(rl.RunLock().command(path=str(lock)).get_raw_value()).stdout.splitlines())
    assert fact is not None and fact["alive"] == ("1" if alive else "0")
    taken = sh(rl._take_command(str(lock)))  # the take refuses exactly the holders the fact calls alive
    assert (taken.returncode != 0 and "held by another run" in taken.stderr) is alive, taken.stderr
    assert (f"run={rl.RUN_ID}" in lock.read_text()) is not alive


def test_a_verdict_inside_the_lock_file_is_not_believed(tmp_path):
    lock = tmp_path / "run.lock"
    lock.write_text("run=abc\nalive=1\npid=999999999")  # and no last newline: the verdict still ends the output
    got = rl.RunLock().process(sh(rl.RunLock().command(path=str(lock)).get_raw_value()).stdout.splitlines())
    assert got is not None and got["alive"] == "0"


def test_take_records_a_real_process_its_start_time_and_the_boot(tmp_path):
    lock = str(tmp_path / "run.lock")
    taken = sh(rl._take_command(lock))
    assert taken.returncode == 0, taken.stderr
    fields = dict(line.split("=", 1) for line in open(lock).read().splitlines())
    pid = int(fields["pid"])
    assert pid > 1 and fields["boot"] == BOOT and fields["start"] == start_time(pid)  # never pid 0


def test_take_records_the_ssh_sessions_process_when_there_is_one(tmp_path):
    lock = str(tmp_path / "run.lock")
    (tmp_path / "take.sh").write_text(rl._take_command(lock))
    shell = subprocess.run(["sh", "-c", "command -v sh"], capture_output=True, text=True).stdout.strip()
    for name in ("sshd-session", "dropbear"):  # a shell under a process named like the session's
        os.symlink(shell, tmp_path / name)
        session = subprocess.run([str(tmp_path / name), "-c", f"sh {tmp_path}/take.sh & echo $$; wait"],
                                 capture_output=True, text=True)
        assert f"pid={session.stdout.strip()}\n" in open(lock).read(), name


def test_take_refuses_a_live_holder_and_replaces_a_stale_one(tmp_path):
    lock = str(tmp_path / "state" / "run.lock")
    assert sh(rl._take_command(lock)).returncode == 0
    first = open(lock).read()
    assert f"run={rl.RUN_ID}\n" in first and f"holder={rl.HOLDER}\n" in first and "pid=" in first
    assert sh(rl._take_command(lock)).returncode == 0  # this run again: still its own
    open(lock, "w").write("run=0123456789ab\npid=1\n")  # another run whose session lives (pid 1 always does)
    taken = sh(rl._take_command(lock))
    assert taken.returncode != 0 and "held by another run" in taken.stderr and "run=0123456789ab" in open(lock).read()
    open(lock, "w").write("run=0123456789ab\npid=999999999\n")  # its session is gone: stale
    assert sh(rl._take_command(lock)).returncode == 0 and f"run={rl.RUN_ID}" in open(lock).read()


def test_two_takers_at_once_cannot_both_write(tmp_path):
    lock = str(tmp_path / "run.lock")
    hold, ready = tmp_path / "hold", tmp_path / "ready"
    hold.touch()
    # another run mid-take: it holds the guard until the test lets go (no fixed time a loaded machine could outlast)
    guard = subprocess.Popen(["sh", "-c", f"exec 9>>{lock}.guard; flock 9; touch {ready}; "
                                          f"while [ -e {hold} ]; do sleep 0.05; done"])
    try:
        wait_for(ready.exists, "the other taker to hold the guard", running=guard)
        taken = sh(rl._take_command(lock))
    finally:
        hold.unlink()
        guard.wait(timeout=30)
    assert taken.returncode != 0 and "another run is taking the lock" in taken.stderr
    assert not (tmp_path / "run.lock").exists()


class ShellHost(FakeHost):
    """A FakeHost whose connection runs commands in a local shell (the lock is taken through it)."""

    def __init__(self, facts, lock_path):
        super().__init__(facts)
        self.commands: list[str] = []

    def run_shell_command(self, command, **arguments):
        self.commands.append(command.get_raw_value())
        result = sh(command.get_raw_value())
        return result.returncode == 0, type("Out", (), {"stderr": result.stderr})()


def locked_run(tmp_path, lock, executing):
    path = str(tmp_path / "run.lock")
    facts = {rl.RunLock: with_args({f"path={path}": lock})}
    host = ShellHost(facts, path)
    state = type("S", (), {"is_executing": executing, "config": type("C", (), {"DIFF": False})()})()
    with ctx_state.use(state), ctx_host.use(host):
        commands = list(rl.run_locked._inner(path=path))
    return commands, host, path


def test_a_live_lock_of_another_run_is_refused_naming_the_holder(tmp_path, caplog):
    commands, host, _ = locked_run(tmp_path, dict(OTHER, alive="1"), executing=True)
    assert len(commands) == 1 and "exit 1" in commands[0].get_raw_value() and host.commands == []
    assert "another sparkfold run holds" in commands[0].get_raw_value() and "ann@laptop (pid 7)" in \
        commands[0].get_raw_value()
    with caplog.at_level("WARNING", logger="pyinfra"):
        commands, host, _ = locked_run(tmp_path, dict(OTHER, alive="1"), executing=False)
    assert commands == [] and "will fail: one run at a time" in caplog.text


def test_a_free_or_stale_lock_is_taken_while_executing_only_and_reports_no_change(tmp_path, caplog):
    commands, host, path = locked_run(tmp_path, None, executing=False)
    assert commands == [] and host.commands == []  # --dry takes nothing
    commands, host, path = locked_run(tmp_path, None, executing=True)
    assert commands == [] and f"run={rl.RUN_ID}" in open(path).read()  # taken, and no change counted
    with caplog.at_level("WARNING", logger="pyinfra"):
        commands, host, path = locked_run(tmp_path, dict(OTHER, alive="0"), executing=True)
    assert commands == [] and "taking over the stale run lock" in caplog.text and "flock -n 9" in host.commands[0]


def test_release_removes_only_this_runs_lock(tmp_path):
    path = str(tmp_path / "run.lock")
    for lock, removed in ((dict(OTHER, run=rl.RUN_ID, alive="1"), True), (dict(OTHER, alive="1"), False)):
        open(path, "w").write("x\n")
        host = ShellHost({rl.RunLock: with_args({f"path={path}": lock})}, path)
        state = type("S", (), {"is_executing": True})()
        with ctx_state.use(state), ctx_host.use(host):
            assert list(rl.run_unlocked._inner(path=path)) == []
        assert (not (tmp_path / "run.lock").exists()) is removed
    assert run_op(rl.run_unlocked, {rl.RunLock: with_args({f"path={path}": None})}, path=path)[0] == []
