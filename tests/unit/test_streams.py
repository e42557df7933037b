"""Background streams: the launcher and the runner run for real in a local shell (waits, failures, the watchdog that
ends a stream with its run, adoption and restart), their fact, the waiter's lines and summary, and the two
operations both ways."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from harness import parse_fact, run_op, with_args
from waiting import wait_for

from operations.facts.streams import StreamStates, stream_status
from operations.remote import stream_wait
from operations.remote.stream_runner import STOPPED_RC, inputs_digest, launch_command
from operations.streams import Stream, stream_action, stream_started, streams_awaited
from operations.util.peer_ssh import RUN_TOKEN

RUN = "run00001"


def sh(command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)


def launch(root: Path, name: str, commands: list[str], after: tuple[str, ...] = (), run: str = RUN,
           label: str = "") -> subprocess.CompletedProcess:
    return sh(launch_command(str(root), name, "test", label or f"the {name} work", after, commands, run=run))


def state(root: Path, name: str) -> dict:
    return parse_fact(StreamStates, sh(StreamStates().command(root=str(root))).stdout)[name]


def settle(root: Path, *names: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while any(stream_status(state(root, n)) == "running" for n in names):
        assert time.monotonic() < deadline, {n: state(root, n) for n in names}
        time.sleep(0.1)


def read(root: Path, name: str, what: str) -> str:
    return (root / name / what).read_text()


# --- the launcher and the runner, for real ---


def test_a_stream_runs_in_the_background_and_records_how_it_ended(tmp_path):
    root = tmp_path / "streams"
    t0 = time.monotonic()
    started = launch(root, "one", ["echo working", "sleep 4", "echo done"])
    assert started.returncode == 0, started.stderr
    assert time.monotonic() - t0 < 3  # the launcher returns while the work runs
    assert "the one work: started in the background" in started.stdout
    assert stream_status(state(root, "one")) == "running"
    settle(root, "one")
    got = state(root, "one")
    assert got["rc"] == 0 and got["run"] == RUN and got["lane"] == "test" and got["label"] == "the one work"
    assert got["queued"] <= got["began"] <= got["ended"] and got["ended"] - got["began"] >= 4
    assert read(root, "one", "log").splitlines() == ["working", "done"]
    assert oct((root / "one").stat().st_mode & 0o777) == "0o700" and oct(root.stat().st_mode & 0o777) == "0o700"


def test_the_first_failing_command_ends_a_stream(tmp_path):
    root = tmp_path / "streams"
    launch(root, "bad", ["echo before", "false", "echo never"])
    settle(root, "bad")
    assert state(root, "bad")["rc"] == 1 and stream_status(state(root, "bad")) == "failed"
    assert read(root, "bad", "log").splitlines() == ["before"]


def test_a_command_that_fails_ends_a_stream_however_it_is_written(tmp_path):
    """Each command runs as pyinfra runs it (no -e inside, so its own checks speak) and its failure ends the stream:
    under sh -e alone, `a && b` failing on a line that is not the last is passed over."""
    root = tmp_path / "streams"
    launch(root, "list", ["echo before", "cd /nonexistent && echo inside", "echo never"])
    launch(root, "own", ["w=$(false); [ -n \"$w\" ] || { echo 'the worker lacks it: rerun'; exit 4; }", "echo never"])
    launch(root, "doc", ["cat <<'EOF'\nfrom a heredoc\nEOF", "exit 3", "echo never"])
    settle(root, "list", "own", "doc")
    assert state(root, "list")["rc"] == 2 and "never" not in read(root, "list", "log")
    assert state(root, "own")["rc"] == 4 and read(root, "own", "log").splitlines() == ["the worker lacks it: rerun"]
    assert state(root, "doc")["rc"] == 3 and read(root, "doc", "log").splitlines() == ["from a heredoc"]


def test_a_stream_waits_for_the_streams_it_reads(tmp_path):
    root = tmp_path / "streams"
    launch(root, "first", ["sleep 1.5"])
    launch(root, "second", ["echo reading"], after=("first",))
    settle(root, "first", "second")
    first, second = state(root, "first"), state(root, "second")
    assert second["rc"] == 0 and second["began"] >= first["ended"]
    assert "the second work: waits for the first work" in read(root, "second", "log")


def test_a_stream_does_not_start_when_what_it_reads_failed(tmp_path):
    root = tmp_path / "streams"
    launch(root, "first", ["sleep 0.5", "exit 3"])
    launch(root, "second", ["touch ran"], after=("first",))
    settle(root, "first", "second")
    assert state(root, "second")["rc"] == 1 and state(root, "second")["began"] is None
    assert "the second work: not started: the first work did not finish" in read(root, "second", "log")


def test_a_stream_of_another_run_is_not_waited_for(tmp_path):
    root = tmp_path / "streams"
    launch(root, "old", ["sleep 60"], run="otherrun")  # still running when "new" has ended, however slow the machine
    launch(root, "new", ["echo mine"], after=("old",))
    settle(root, "new", timeout=20)
    assert state(root, "new")["rc"] == 0 and stream_status(state(root, "old")) == "running"
    sh(f"kill -TERM -$(cat {root}/old/pid)")


def fake_session(tmp_path: Path, command: str) -> subprocess.Popen:
    """A shell named sshd (what FIND_SESSION stops at) that runs `command`, then lives until it is killed: the run's
    connection."""
    sshd = tmp_path / "sshd"
    shutil.copy("/bin/sh", sshd)
    return subprocess.Popen([str(sshd), "-c", command + "; exec sleep 60"], stdout=subprocess.PIPE, text=True)


def test_a_stream_ends_with_the_run_that_started_it(tmp_path):
    root = tmp_path / "streams"
    session = fake_session(tmp_path, launch_command(str(root), "long", "test", "the long work", (),
                                                   ["echo started", "sleep 60"], run=RUN))
    try:
        assert session.stdout is not None and "started in the background" in session.stdout.readline()
        assert stream_status(state(root, "long")) == "running"
        session.kill()  # the run is gone: its connection closed
        session.wait()
        settle(root, "long", timeout=10)
    finally:
        session.kill()
    got = state(root, "long")
    assert got["rc"] == STOPPED_RC and stream_status(got) == "failed"
    assert "the run that started it is gone" in read(root, "long", "log")
    # its whole process group ends (the runner exits just after it wrote rc), and the work's
    wait_for(lambda: running_in_group(int(read(root, "long", "pid"))) == [], "the runner's group to end", 10)
    wait_for(lambda: running_in_group(int(read(root, "long", "work"))) == [], "the work's group to end", 10)


def running_in_group(pgid: int) -> list[int]:
    """The processes of a process group that still run (zombies left out: nothing here reaps them)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] != "Z":
            found.append(int(entry.name))
    return found


# work whose step ends at once when told to stop, while a process it started takes a second more (a tool's
# container shutting down after its client left): that process says when it is done
SLOW_TO_STOP = ("( trap 'sleep 1; date +%s.%N > {marker}; exit 0' TERM; while :; do sleep 0.1; done ) & "
                "echo working; while :; do sleep 0.1; done")


def test_a_stopped_stream_records_its_end_only_once_its_work_has_stopped(tmp_path):
    root, marker = tmp_path / "streams", tmp_path / "stopped-at"
    session = fake_session(tmp_path, launch_command(str(root), "slow", "test", "the slow work", (),
                                                   [SLOW_TO_STOP.format(marker=marker)], run=RUN))
    try:
        assert session.stdout is not None and "started in the background" in session.stdout.readline()
        wait_for(lambda: "working" in read(root, "slow", "log"), "the work to start", 10)
        session.kill()  # the run is gone: the watchdog stops the stream
        session.wait()
        settle(root, "slow", timeout=15)
    finally:
        session.kill()
    got = state(root, "slow")
    assert got["rc"] == STOPPED_RC and marker.exists()
    assert float(read(root, "slow", "ended")) >= float(marker.read_text())  # recorded after the work ended
    assert float(read(root, "slow", "ended")) - float(marker.read_text()) < 2  # and not long after
    assert running_in_group(int(read(root, "slow", "work"))) == []


def test_a_restart_starts_the_new_work_only_once_the_old_has_stopped(tmp_path):
    root, marker = tmp_path / "streams", tmp_path / "stopped-at"
    launch(root, "w", [SLOW_TO_STOP.format(marker=marker)], run="earlier1")
    wait_for(lambda: "working" in read(root, "w", "log"), "the work to start", 10)
    restarted = launch(root, "w", ["echo other work"])
    assert "started in the background" in restarted.stdout
    assert marker.exists() and float(read(root, "w", "queued")) >= float(marker.read_text())
    settle(root, "w")
    assert state(root, "w")["rc"] == 0


def test_a_tool_run_through_the_progress_runner_is_waited_for_too(tmp_path):
    """Nearly every stream's work is a progress_command, which runs its tool in a session of its own: stopped, it
    passes the TERM on and waits for the tool's whole group before it exits, so the stream's end comes after the
    tool's."""
    from operations.remote.progress_command import progress_command
    root, marker = tmp_path / "streams", tmp_path / "stopped-at"
    tool = f"trap 'sleep 2; date +%s.%N > {marker}; exit 0' TERM; echo working; while :; do sleep 0.1; done"
    launch(root, "tool", [progress_command("the tool", tool, every=1).get_raw_value()])
    wait_for(lambda: "the tool: " in read(root, "tool", "log"), "the tool's first line", 10)
    time.sleep(0.5)
    sh(f"kill -TERM -$(cat {root}/tool/pid)")
    settle(root, "tool", timeout=15)
    assert marker.exists() and float(read(root, "tool", "ended")) >= float(marker.read_text())


def test_a_stream_that_is_stopping_is_not_adopted_but_waited_for(tmp_path):
    """A run started again while the stream of the run just lost is still stopping (its work ending) does not take
    over a runner about to record 143: it waits for it and starts the work afresh."""
    root, marker = tmp_path / "streams", tmp_path / "stopped-at"
    work = [SLOW_TO_STOP.format(marker=marker)]
    session = fake_session(tmp_path, launch_command(str(root), "s", "test", "the s work", (), work, run="earlier1"))
    try:
        assert session.stdout is not None and "started in the background" in session.stdout.readline()
        wait_for(lambda: "working" in read(root, "s", "log"), "the work to start", 10)
        session.kill()  # the run is lost: its watchdog stops the stream (within its 2 s poll)
        session.wait()
        wait_for((root / "s" / "stopping").exists, "the stream to be stopping", 10)
        again = launch(root, "s", work)  # the same work, by the next run
    finally:
        session.kill()
    assert "running already" not in again.stdout and "started in the background" in again.stdout
    assert float(read(root, "s", "queued")) >= float(marker.read_text())  # after the old work ended
    assert read(root, "s", "run").strip() == RUN
    sh(f"kill -TERM -$(cat {root}/s/pid)")
    settle(root, "s")


def test_work_that_will_not_stop_is_killed_after_the_wait(tmp_path, monkeypatch):
    from operations.remote import stream_runner
    monkeypatch.setattr(stream_runner, "RUNNER", stream_runner.RUNNER.replace(
        f"$i -lt {stream_runner.WORK_STOP_S * 10} ]", "$i -lt 10 ]"))  # a one-second wait, for the test
    root = tmp_path / "streams"
    launch(root, "stubborn", ["trap '' TERM; echo working; while :; do sleep 0.1; done"])
    wait_for(lambda: "working" in read(root, "stubborn", "log"), "the work to start", 10)
    work = int(read(root, "stubborn", "work"))
    sh(f"kill -TERM -$(cat {root}/stubborn/pid)")
    settle(root, "stubborn", timeout=10)
    assert "the stubborn work: killed" in read(root, "stubborn", "log") and state(root, "stubborn")["rc"] == STOPPED_RC
    wait_for(lambda: running_in_group(work) == [], "the killed work to be gone", 10)  # a moment later


def test_the_same_work_running_is_adopted_and_other_work_restarts_it(tmp_path):
    root = tmp_path / "streams"
    launch(root, "w", ["sleep 30"], run="earlier1")
    pid = read(root, "w", "pid")
    adopted = launch(root, "w", ["sleep 30"])
    assert "running already, followed by this run" in adopted.stdout
    assert read(root, "w", "pid") == pid and read(root, "w", "run").strip() == RUN  # the same runner, now ours
    restarted = launch(root, "w", ["echo other work"])
    assert "started in the background" in restarted.stdout
    settle(root, "w")
    assert read(root, "w", "pid") != pid and state(root, "w")["rc"] == 0
    assert sh(f"kill -0 {pid.strip()}").returncode != 0  # the old runner was stopped


def test_a_stream_that_cannot_be_followed_fails_its_start(tmp_path):
    """Adopting writes the stream's watch and run; when that fails, the start fails (the stream stays the earlier
    run's, which the waiter would never see)."""
    root = tmp_path / "streams"
    launch(root, "w", ["sleep 30"], run="earlier1")
    try:
        (root / "w" / "watch.tmp").mkdir()  # no file can be written there, not even by root
        adopted = launch(root, "w", ["sleep 30"])
        assert adopted.returncode != 0 and "this run cannot follow it" in adopted.stderr
        assert read(root, "w", "run").strip() == "earlier1"
    finally:
        sh(f"kill -TERM -$(cat {root}/w/pid)")


def test_the_inputs_leave_the_run_token_out():
    mine = inputs_digest([f"ssh -o ControlPath=x-{RUN_TOKEN}-%C w"], ())
    assert mine == inputs_digest(["ssh -o ControlPath=x-<run>-%C w"], ())
    assert inputs_digest(["a"], ()) != inputs_digest(["a"], ("b",)) != inputs_digest(["b"], ("b",))


# --- the fact ---


def test_the_fact_reads_every_stream_and_none_when_there_is_no_folder(tmp_path):
    assert sh(StreamStates().command(root=str(tmp_path / "none"))).stdout == ""
    assert parse_fact(StreamStates, "") == {}
    got = parse_fact(StreamStates, "#STREAM a\nrun=r1 \nafter=x y \nqueued=10.5 \nrc=0 \nalive=0\n#STREAM b\nalive=1\n")
    assert got["a"]["after"] == ["x", "y"] and got["a"]["queued"] == 10.5 and got["a"]["rc"] == 0
    assert stream_status(got["a"]) == "done" and stream_status(got["b"]) == "running"
    assert stream_status(dict(got["b"], alive=False)) == "stopped"


# --- the waiter ---


def stream_folder(root: Path, name: str, log: str = "", **fields) -> None:
    """A stream's folder as its runner leaves it (no runner: it has ended, or it is judged stopped)."""
    folder = root / name
    folder.mkdir(parents=True)
    for key, value in {"run": RUN, "lane": "download", "label": name, "after": "", **fields}.items():
        (folder / key).write_text(f"{value}\n")
    (folder / "log").write_text(log)


def test_the_waiter_relays_each_streams_lines_and_ends_with_the_critical_path(tmp_path):
    root = tmp_path / "streams"
    stream_folder(root, "engram", label="the Engram tables download", queued=0, began=0, ended=200, rc=0,
                  log="Engram tables download: started\r\nEngram tables download: done in 3 min 20 s\n")
    stream_folder(root, "checkpoint", label="the checkpoint download", after="engram", queued=1, began=200,
                  ended=410, rc=0, log="Checkpoint download: done in 3 min 30 s\n")
    stream_folder(root, "image", lane="build", label="build x", queued=2, began=2, ended=362, rc=0, log="")
    stream_folder(root, "rank1", lane="weights", label="rank 1's weight file", after="image checkpoint",
                  queued=3, began=410, ended=515, rc=0, log="")
    stream_folder(root, "other", run="another", queued=0, began=0, ended=9999, rc=0)  # not this run's
    out = io.StringIO()
    assert stream_wait.wait(str(root), RUN, poll=0.01, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["Engram tables download: started", "Engram tables download: done in 3 min 20 s"]
    assert "background download: the checkpoint download: 3 min 30 s (after waiting 3 min 19 s)" in lines
    assert lines[-1] == ("background work: 4 streams in 8 min 35 s; critical path 8 min 35 s: the Engram tables "
                         "download (3 min 20 s) → the checkpoint download (3 min 30 s) → rank 1's weight file "
                         "(1 min 45 s)")
    assert lines[-2] == "background lanes, busy: download 6 min 50 s, build 6 min 00 s, weights 1 min 45 s"
    assert not any("\r" in line for line in lines)


def test_the_waiter_says_a_failure_at_once_and_fails_at_the_end(tmp_path, capsys):
    root = tmp_path / "streams"
    stream_folder(root, "a", queued=0, began=0, ended=5, rc=7, log="a: failed after 5 s; its last output:\nboom\n")
    stream_folder(root, "b", queued=0, began=0, ended=9, rc=0)
    out = io.StringIO()
    assert stream_wait.wait(str(root), RUN, poll=0.01, out=out) == 1
    assert "sparkfold: a failed (exit 7); the other background work goes on" in out.getvalue()
    assert "background download: a: 5 s, failed (exit 7)" in out.getvalue()
    assert "background work did not finish: a (the lines above say why)" in capsys.readouterr().err


def test_the_waiter_follows_streams_that_run(tmp_path):
    root = tmp_path / "streams"
    launch(root, "slow", ["echo one", "sleep 1", "echo two"])
    out = io.StringIO()
    assert stream_wait.wait(str(root), RUN, poll=0.05, out=out) == 0
    assert out.getvalue().splitlines()[:2] == ["one", "two"]
    assert re.search(r"background test: the slow work: [1-3] s\n", out.getvalue()), out.getvalue()


def test_a_lane_is_busy_while_any_of_its_streams_runs():
    streams = {"a": {"lane": "to worker", "began": 0, "ended": 10}, "b": {"lane": "to worker", "began": 5, "ended": 12},
               "c": {"lane": "to worker", "began": 20, "ended": 25}, "d": {"lane": "hash", "began": 0, "ended": 3},
               "e": {"lane": "hash", "began": None, "ended": None}}
    assert stream_wait.lane_busy(streams) == {"to worker": 17.0, "hash": 3.0}


def test_the_critical_path_follows_the_waits_not_the_clock():
    streams = {"a": {"began": 0, "ended": 10, "after": [], "queued": 0},
               "b": {"began": 0, "ended": 50, "after": [], "queued": 0},
               "c": {"began": 50, "ended": 60, "after": ["a", "b"], "queued": 0},
               "d": {"began": 10, "ended": 15, "after": ["a"], "queued": 0}}
    assert stream_wait.critical_path(streams) == (60.0, ["b", "c"])
    assert stream_wait.critical_path({}) == (0.0, [])


# --- the operations ---

ROOT = "/home/n/.local/state/sparkfold/streams"
STREAM = Stream("engram-to-worker", "to worker", "the Engram tables to the worker", ROOT, after=("engram",),
                commands=("fresh copy",))


class Meta:
    """An earlier operation's result, as op_changed reads it."""

    def __init__(self, changed: bool):
        self.changed = changed

    def is_complete(self) -> bool:
        return True

    def did_change(self) -> bool:
        return self.changed


def converge_op(yielding: list[str]):
    """A stand-in for the work's operation: what its _inner yields."""
    class Op:
        @staticmethod
        def _inner(**kwargs):
            yield from yielding
    return Op


def started(states: dict, upstream=(), work=()) -> list[str]:
    return run_op(stream_started, {StreamStates: with_args({f"root={ROOT}": states})}, executing=True,
                  stream=STREAM, upstream=tuple(upstream), work=tuple(work))[0]


def test_a_stream_starts_with_what_its_work_yields_and_not_when_it_is_converged():
    assert started({}, work=[(converge_op([]), {})]) == []  # converged: no stream, no fact read
    commands = started({}, work=[(converge_op(["rsync a b", "echo checked"]), {})])
    steps = "( set +e\nrsync a b\n) || exit $?\n( set +e\necho checked\n) || exit $?\n"  # each a step of its own
    assert len(commands) == 1 and steps in commands[0] and "setsid sh -c" in commands[0]


def test_a_stream_runs_a_fresh_start_when_what_it_reads_starts_in_this_run():
    commands = started({}, upstream=[Meta(True)], work=[(converge_op([]), {})])
    assert len(commands) == 1 and "\nfresh copy\n" in commands[0]
    assert started({}, upstream=[Meta(False)], work=[(converge_op([]), {})]) == []


def test_a_stream_this_run_started_already_is_not_started_again():
    inputs = inputs_digest(["rsync a b"], STREAM.after)
    ours = {STREAM.name: {"run": RUN_TOKEN, "inputs": inputs, "rc": None, "alive": True}}
    assert started(ours, work=[(converge_op(["rsync a b"]), {})]) == []
    earlier = {STREAM.name: {"run": "earlier", "inputs": inputs, "rc": None, "alive": True}}
    assert len(started(earlier, work=[(converge_op(["rsync a b"]), {})])) == 1  # adopted by the launcher


@pytest.mark.parametrize("state, action", [
    (None, "start"),
    ({"run": "r0", "inputs": "i", "rc": None, "alive": True}, "adopt"),
    ({"run": "r0", "inputs": "j", "rc": None, "alive": True}, "restart"),
    ({"run": "r1", "inputs": "i", "rc": None, "alive": True}, "ours"),
    ({"run": "r1", "inputs": "i", "rc": 0, "alive": False}, "ours"),
    ({"run": "r0", "inputs": "i", "rc": 0, "alive": False}, "start"),  # done by an earlier run: its facts say again
    ({"run": "r1", "inputs": "i", "rc": None, "alive": False}, "ours"),
])
def test_stream_action(state, action):
    assert stream_action(state, "i", "r1") == action


def test_a_stream_refuses_an_upload():
    from pyinfra.api import FileUploadCommand, OperationError
    with pytest.raises(OperationError, match="upload files before the stream starts"):
        started({}, work=[(converge_op([FileUploadCommand("a", "b")]), {})])


def test_the_wait_runs_only_when_a_stream_was_started():
    commands, host = run_op(streams_awaited, {}, executing=True, root=ROOT, started=(Meta(False), Meta(False)))
    assert commands == [] and host.noops == ["no background work in this run"]
    commands, _ = run_op(streams_awaited, {}, executing=True, root=ROOT, started=(Meta(False), Meta(True)))
    assert len(commands) == 1 and commands[0].startswith(f"python3 - {ROOT} {RUN_TOKEN} <<'SPARKFOLD_PY_EOF'")
    assert "def critical_path" in commands[0] and "def clock" in commands[0]  # the waiter, behind the progress runner


def test_the_bundled_waiter_runs(tmp_path):
    commands, _ = run_op(streams_awaited, {}, executing=True, root=str(tmp_path), started=(Meta(True),))
    done = sh(commands[0].replace(RUN_TOKEN, RUN, 1))
    assert done.returncode == 0 and done.stdout == "", done.stderr  # no stream of that run under the folder
    stream_folder(tmp_path, "a", queued=0, began=0, ended=2, rc=0, log="a: done in 2 s\n")
    done = sh(commands[0].replace(RUN_TOKEN, RUN, 1))
    assert done.returncode == 0 and done.stdout.splitlines()[0] == "a: done in 2 s", done.stderr
