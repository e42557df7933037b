"""Background streams as systemd units: the start, adopt, free and stop commands (the start's shell run for real
here with stand-ins for sudo and systemd-run, the unit's script with a stand-in systemctl), how a unit's state and
journal read, the one decision of what a start does, the fact, the waiter's lines and summary, and the operations
both ways."""

from __future__ import annotations

import io
import os
import re
import stat
import subprocess
import time
from pathlib import Path

import pytest
from harness import parse_fact, run_op, with_args

from operations.facts.streams import StreamStates
from operations.remote import stream_wait
from operations.remote.stream_runner import (
    RUNNER,
    adopt_command,
    freeing_command,
    inputs_digest,
    launch_command,
    runner_script,
    script_text,
    stop_command,
    systemd_run_words,
    unit_word,
)
from operations.remote.stream_unit import (
    journal_lines,
    journal_words,
    parse_show,
    show_words,
    stream_action,
    unit_inputs,
    unit_status,
)
from operations.streams import Stream, stream_started, streams_awaited, streams_ended
from operations.util.peer_ssh import RUN_TOKEN, ssh_prefix

RUN = "run00001"

# stand-ins (this machine has no systemd as PID 1): sudo runs its command; systemd-run records its argv and runs
# nothing; systemctl answers `show UNIT -p P --value` from $UNITS/<unit> (lines P=value)
STANDINS = {
    "sudo": '#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"\n',
    "systemd-run": '#!/bin/sh\nfor w in "$@"; do printf "%s\\0" "$w"; done > "$UNITS/systemd-run.argv"\n',
    "systemctl": ('#!/bin/sh\n[ "$1" = show ] || { echo "$@" >> "$UNITS/systemctl.log"; exit 0; }\n'
                  'sed -n "s/^$4=//p" "$UNITS/$2" 2>/dev/null\n'),
}


def standins(tmp_path: Path) -> dict:
    bin_dir, units = tmp_path / "bin", tmp_path / "units"
    bin_dir.mkdir(exist_ok=True)
    units.mkdir(exist_ok=True)
    for name, text in STANDINS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "UNITS": str(units)}


def sh(command: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout, env=env)


def unit(tmp_path: Path, stream: str, **properties: str) -> None:
    (tmp_path / "units" / f"sparkfold-{stream}").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))


# --- the start, for real with stand-ins ---


def test_a_start_writes_the_streams_folder_and_runs_its_unit_as_the_ssh_user(tmp_path):
    env, root = standins(tmp_path), tmp_path / "streams"
    started = sh(launch_command(str(root), "one", "download", "the one work", ("zero",), ["echo working"], run=RUN),
                 env)
    assert started.returncode == 0, started.stderr
    assert started.stdout == "sparkfold: the one work: started in the background (sparkfold-one)\n"
    folder = root / "one"
    assert {f: (folder / f).read_text() for f in ("lane", "label", "after", "run")} == {
        "lane": "download\n", "label": "the one work\n", "after": "zero\n", "run": f"{RUN}\n"}
    assert (folder / "inputs").read_text().strip() == inputs_digest(["echo working"], ("zero",))
    assert "echo working" in (folder / "script").read_text() and float((folder / "queued").read_text()) > 0
    assert oct(folder.stat().st_mode & 0o777) == "0o700" and oct(root.stat().st_mode & 0o777) == "0o700"
    argv = (tmp_path / "units" / "systemd-run.argv").read_text().split("\0")[:-1]
    user, group = sh("id -un").stdout.strip(), sh("id -gn").stdout.strip()
    assert argv[:8] == ["--quiet", "--unit=sparkfold-one", "--description=sparkfold: the one work", f"--uid={user}",
                        f"--gid={group}", "-p", "RemainAfterExit=yes", "-p"]
    assert argv[8:12] == ["KillMode=control-group", "-p", "TimeoutStopSec=30", f"--working-directory={Path.home()}"]
    assert f"PATH={env['PATH']}" in argv and f"SPARKFOLD_INPUTS={(folder / 'inputs').read_text().strip()}" in argv
    assert "--collect" not in argv  # it would unload a finished unit at once, its result with it
    # the runner is a file of the folder, never inline: systemd expands `$NAME` in a unit's command line
    assert argv[-3:] == ["/bin/sh", str(folder / "runner"), str(folder)]
    assert (folder / "runner").read_text() == RUNNER.lstrip() and "$" not in "".join(argv[-3:])


def test_a_dollar_in_a_streams_folder_reaches_the_unit_as_it_is():
    assert unit_word("/home/a$b/streams/x") == "/home/a$$b/streams/x"  # systemd gives the unit /home/a$b/...
    words = systemd_run_words("x", "l", "/home/a$b/s/x", "0123")
    assert words[-2:] == ["'/home/a$$b/s/x/runner'", "'/home/a$$b/s/x'"]


def test_a_start_frees_the_name_first_as_asked(tmp_path):
    env, root = standins(tmp_path), tmp_path / "streams"
    sh(launch_command(str(root), "w", "x", "w", (), ["true"], free="reset-failed", run=RUN), env)
    sh(launch_command(str(root), "w", "x", "w", (), ["true"], free="stop", run=RUN), env)
    sh(launch_command(str(root), "w", "x", "w", (), ["true"], run=RUN), env)
    assert (tmp_path / "units" / "systemctl.log").read_text().splitlines() == [
        "reset-failed sparkfold-w", "stop sparkfold-w"]
    assert freeing_command("w", None) == ""
    with pytest.raises(ValueError, match="stop or reset-failed"):
        freeing_command("w", "kill")


def test_a_start_that_systemd_refuses_fails_and_says_nothing_started(tmp_path):
    env, root = standins(tmp_path), tmp_path / "streams"
    (tmp_path / "bin" / "systemd-run").write_text("#!/bin/sh\necho 'Unit sparkfold-w.service already exists' >&2\n"
                                                  "exit 1\n")
    done = sh(launch_command(str(root), "w", "x", "the w work", (), ["true"], run=RUN), env)
    assert done.returncode == 1 and "started" not in done.stdout and "already exists" in done.stderr


def test_adopting_names_this_run_and_stopping_is_systemctl_stop(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "run").write_text("earlier\n")
    done = sh(adopt_command(str(tmp_path), "w", "the w work", run=RUN))
    assert done.stdout == "sparkfold: the w work: running already (sparkfold-w), followed by this run\n"
    assert (tmp_path / "w" / "run").read_text() == f"{RUN}\n"
    assert stop_command("engram-to-worker") == "sudo -n systemctl stop sparkfold-engram-to-worker"


def test_the_inputs_leave_the_run_token_out():
    mine = inputs_digest([f"ssh -o ControlPath=x-{RUN_TOKEN}-%C w"], ())
    assert mine == inputs_digest(["ssh -o ControlPath=x-<run>-%C w"], ())
    assert inputs_digest(["a"], ()) != inputs_digest(["a"], ("b",)) != inputs_digest(["b"], ("b",))
    assert f"SPARKFOLD_INPUTS={mine}" in systemd_run_words("w", "l", "/d", mine)


def test_the_same_work_at_another_progress_interval_has_the_same_inputs():
    # a run with another progress_every_s adopts the work still going (progress lines are not what it does)
    assert inputs_digest(["python3 - build --every 10 --size-of /x"], ()) == \
        inputs_digest(["python3 - build --every 2 --size-of /x"], ())
    assert inputs_digest(["python3 - build --every 10 --size-of /x"], ()) != \
        inputs_digest(["python3 - build --every 10 --size-of /y"], ())


def test_each_stream_has_its_own_ssh_connection_to_the_worker():
    # journald files a line under the writer's unit: a master shared with the run's foreground or another stream
    # would print this stream's remote output into that one's journal
    command = f"{ssh_prefix()} w 'echo hi'"
    paths = {name: re.findall(r"ControlPath=(\S+)", script_text([command], name)) for name in ("a", "b")}
    run_path = re.findall(r"ControlPath=(\S+)", command)
    assert all(len(p) == 1 for p in paths.values()), paths
    assert len({paths["a"][0], paths["b"][0], run_path[0]}) == 3, paths
    assert all(p[0].endswith("-%C") and len(p[0]) == len(run_path[0]) for p in paths.values())  # no longer
    assert f"ControlPath={paths['a'][0]}" in launch_command("/r", "a", "lane", "l", (), [command])


# --- the unit's script, for real with a stand-in systemctl ---


def folder(root: Path, name: str, run: str = RUN, after: str = "", commands: str = "echo ran") -> Path:
    d = root / name
    d.mkdir(parents=True)
    for key, value in {"run": run, "label": f"the {name} work", "after": after}.items():
        (d / key).write_text(f"{value}\n")
    (d / "script").write_text(commands + "\n")
    return d


POLL_S = 0.1  # the units script's poll of an upstream here (1 s on a Spark): the waits below are a few polls
FAST_RUNNER = runner_script(POLL_S)


def runner(d: Path, env: dict, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", FAST_RUNNER, "sh", str(d)], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_the_units_script_runs_the_work_and_records_its_times(tmp_path):
    env, root = standins(tmp_path), tmp_path / "streams"
    d = folder(root, "one", commands="echo working\nfalse\necho never")
    done = runner(d, env)
    assert done.returncode == 1 and done.stdout == "working\n"  # sh -e: the first failure ends it
    assert float((d / "began").read_text()) <= float((d / "ended").read_text())


def test_the_units_script_waits_for_a_stream_of_its_run_while_that_ones_unit_runs(tmp_path):
    env, root = standins(tmp_path), tmp_path / "streams"
    folder(root, "first")
    d = folder(root, "second", after="first", commands=f"touch {root}/second/ran")
    unit(tmp_path, "first", ActiveState="active", SubState="running")
    waiting = subprocess.Popen(["sh", "-c", FAST_RUNNER, "sh", str(d)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert waiting.stdout is not None
        assert waiting.stdout.readline() == "the second work: waits for the first work\n"
        assert not (root / "second" / "began").exists()
        unit(tmp_path, "first", ActiveState="active", SubState="exited", Result="success", ExecMainStatus="0")
        assert waiting.wait(timeout=10) == 0 and (d / "ran").exists()
    finally:
        waiting.kill()


@pytest.mark.parametrize("properties", [
    {"ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "ExecMainStatus": "3"},
    {"LoadState": "not-found", "ActiveState": "inactive"},  # stopped: its unit is gone
])
def test_the_units_script_does_not_start_when_a_stream_of_its_run_did_not_finish(tmp_path, properties):
    env, root = standins(tmp_path), tmp_path / "streams"
    folder(root, "first")
    d = folder(root, "second", after="first", commands="echo ran")
    unit(tmp_path, "first", **properties)
    done = runner(d, env)
    assert done.returncode == 1 and not (d / "began").exists()
    assert done.stdout == "sparkfold: the second work: not started: the first work did not finish\n"


def test_a_failed_stream_an_earlier_run_left_is_not_this_runs_failure(tmp_path):
    env, root = standins(tmp_path), tmp_path / "streams"
    folder(root, "old", run="otherrun")
    unit(tmp_path, "old", ActiveState="failed", SubState="failed", Result="exit-code", ExecMainStatus="3")
    done = runner(folder(root, "new", after="old", commands="echo mine"), env, timeout=5)
    assert done.returncode == 0 and done.stdout == "mine\n"


def test_a_running_stream_is_waited_for_while_a_new_run_adopts_the_chain_one_stream_at_a_time(tmp_path):
    # the next run writes its name into the upstream first and into this stream operations later: this stream must
    # still wait for the upstream's work, and not start on its half-made output
    env, root = standins(tmp_path), tmp_path / "streams"
    upstream = folder(root, "first")
    d = folder(root, "second", after="first", commands="echo ran")
    unit(tmp_path, "first", ActiveState="active", SubState="running")
    waiting = subprocess.Popen(["sh", "-c", FAST_RUNNER, "sh", str(d)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert waiting.stdout is not None
        assert waiting.stdout.readline() == "the second work: waits for the first work\n"  # in its wait: adopt now
        (upstream / "run").write_text("nextrun\n")  # adopt_command of the upstream
        time.sleep(10 * POLL_S)
        assert waiting.poll() is None and not (d / "began").exists()
        unit(tmp_path, "first", ActiveState="active", SubState="exited", Result="exit-code", ExecMainStatus="2")
        out, _ = waiting.communicate(timeout=10)
    finally:
        waiting.kill()
    assert waiting.returncode == 1 and not (d / "began").exists()  # the upstream it waited for failed
    assert out.endswith("sparkfold: the second work: not started: the first work did not finish\n"), out


# --- a unit's state and journal ---

SHOW = {
    "not-found": "LoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success\nExecMainStatus=0\n"
                 "InvocationID=\nEnvironment=\n",
    "running": "LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nExecMainStatus=0\n"
               "InvocationID=4f1c\nEnvironment=PATH=/usr/bin SPARKFOLD_INPUTS=abc123\n",
    "exited ok": "LoadState=loaded\nActiveState=active\nSubState=exited\nResult=success\nExecMainStatus=0\n"
                 "InvocationID=4f1d\nEnvironment=SPARKFOLD_INPUTS=abc123\n",
    "exited bad": "LoadState=loaded\nActiveState=active\nSubState=exited\nResult=exit-code\nExecMainStatus=2\n"
                  "InvocationID=4f1e\n",
    "failed": "LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\nExecMainStatus=1\n"
              "InvocationID=4f1f\n",
    "activating": "LoadState=loaded\nActiveState=activating\nSubState=start\nResult=success\nExecMainStatus=0\n",
    "deactivating": "LoadState=loaded\nActiveState=deactivating\nSubState=stop-sigterm\nResult=success\n",
    "inactive": "LoadState=loaded\nActiveState=inactive\nSubState=dead\nResult=success\n",
}


@pytest.mark.parametrize("case, status, rc", [
    ("not-found", "none", 0), ("running", "running", 0), ("exited ok", "done", 0), ("exited bad", "failed", 2),
    ("failed", "failed", 1), ("activating", "running", 0), ("deactivating", "stopping", None),
    ("inactive", "stopped", None),
])
def test_a_units_state_reads_as_the_streams_status(case, status, rc):
    units = parse_show(SHOW[case].splitlines())
    assert len(units) == 1 and unit_status(units[0]) == status
    from operations.remote.stream_unit import exit_status
    assert exit_status(units[0]) == rc
    assert unit_status(None) == "none"


def test_show_reads_one_block_per_unit_and_the_inputs_from_the_environment():
    units = parse_show((SHOW["running"] + "\n" + SHOW["failed"] + "\n").splitlines())
    assert [u["InvocationID"] for u in units] == ["4f1c", "4f1f"]
    assert unit_inputs(units[0]) == "abc123" and unit_inputs(units[1]) == ""
    assert unit_inputs({"Environment": '"PATH=/a b" SPARKFOLD_INPUTS=ff00'}) == "ff00"
    assert show_words(["a", "b"]) == ["systemctl", "show", "sparkfold-a", "sparkfold-b", "-p",
                                      "LoadState,ActiveState,SubState,Result,ExecMainStatus,InvocationID,Environment"]


def test_the_journal_is_read_by_invocation_after_the_last_cursor():
    assert journal_words("4f1c") == ["journalctl", "_SYSTEMD_INVOCATION_ID=4f1c", "-o", "cat", "-q", "--no-pager",
                                     "--show-cursor"]
    assert journal_words("4f1c", "s=1;i=2")[-1] == "--after-cursor=s=1;i=2"
    lines = "a: 10 %\rb: 20 %\n\nlast\n-- cursor: s=1;i=2\n"
    assert journal_lines(lines) == (["a: 10 %", "b: 20 %", "last"], "s=1;i=2")
    assert journal_lines("") == ([], None)


def test_the_relay_asks_for_what_came_after_what_it_printed():
    asked: list[list[str]] = []
    answers = iter(["one\n-- cursor: c1\n", "", "two\n-- cursor: c2\n"])

    def journal(words: list[str]) -> str:
        asked.append(words)
        return next(answers)

    relay = stream_wait.Relay(journal)
    assert relay.new_lines("") == [] and asked == []  # no unit: nothing to read
    assert [relay.new_lines("inv") for _ in range(3)] == [["one"], [], ["two"]]
    assert [w[-1] for w in asked] == ["--show-cursor", "--after-cursor=c1", "--after-cursor=c1"]


# --- the one decision of what a start does ---


@pytest.mark.parametrize("status, inputs, ours, action", [
    ("none", "", False, ("start", None)),  # never started, stopped, or gone with a reboot
    ("running", "i", False, ("adopt", None)),  # a cut connection or a killed run: the same work goes on
    ("running", "j", False, ("restart", "stop")),  # an input changed: the old work stops first
    ("stopping", "i", False, ("restart", "stop")),  # never adopted: waited for, then started afresh
    ("done", "i", False, ("start", "stop")),  # its result keeps the name until it is freed
    ("failed", "i", False, ("start", "reset-failed")),
    ("stopped", "i", False, ("start", "stop")),
    ("running", "i", True, ("ours", None)),  # this run started or adopted it already
    ("done", "i", True, ("ours", None)),
    ("running", "j", True, ("restart", "stop")),  # ours, but other work: not ours any more
])
def test_stream_action(status, inputs, ours, action):
    assert stream_action(status, "i", inputs, ours) == action


# --- the fact ---


def test_the_fact_reads_every_streams_folder_and_unit(tmp_path):
    env = standins(tmp_path)
    assert sh(StreamStates().command(root=str(tmp_path / "none")), env).stdout == ""
    assert parse_fact(StreamStates, "") == {}
    root = tmp_path / "streams"
    d = folder(root, "a", after="x y")
    (d / "queued").write_text("10.5\n")
    unit(tmp_path, "a", ActiveState="failed")
    read = sh(StreamStates().command(root=str(root)), env).stdout
    assert read.startswith("#STREAM a\nrun=run00001 \nlabel=the a work \nafter=x y \nqueued=10.5 \n#UNIT\n"), read
    got = parse_fact(StreamStates, "#STREAM a\nrun=r1 \nafter=x y \nqueued=10.5 \n#UNIT\n" + SHOW["exited bad"]
                     + "#STREAM b\n#UNIT\n" + SHOW["running"] + "#STREAM c\n#UNIT\n" + SHOW["not-found"])
    assert got["a"]["after"] == ["x", "y"] and got["a"]["queued"] == 10.5 and got["a"]["run"] == "r1"
    assert (got["a"]["status"], got["a"]["rc"], got["a"]["invocation"]) == ("failed", 2, "4f1e")
    assert (got["b"]["status"], got["b"]["rc"], got["b"]["unit_inputs"]) == ("running", None, "abc123")
    assert (got["c"]["status"], got["c"]["rc"], got["c"]["began"]) == ("none", None, None)


# --- the waiter ---


class Spark:
    """systemctl show and journalctl as the waiter runs them, answered from plain data."""

    def __init__(self, units: dict[str, str], journals: dict[str, str] | None = None):
        self.units, self.journals = units, journals or {}

    def __call__(self, words: list[str]) -> str:
        if words[0] == "systemctl":
            return "\n".join(self.units.get(w.removeprefix("sparkfold-"), SHOW["not-found"])
                             for w in words[2:-2])
        invocation = words[1].split("=", 1)[1]
        if any(w.startswith("--after-cursor") for w in words):
            return ""
        return self.journals.get(invocation, "") + "-- cursor: end\n"


def stream_folder(root: Path, name: str, **fields) -> None:
    """A stream's folder as its start and its unit's script leave it."""
    d = root / name
    d.mkdir(parents=True)
    for key, value in {"run": RUN, "lane": "download", "label": name, "after": "", **fields}.items():
        (d / key).write_text(f"{value}\n")


def done_unit(invocation: str, status: int = 0) -> str:
    state = "ActiveState=active\nSubState=exited\nResult=success" if status == 0 else \
        "ActiveState=failed\nSubState=failed\nResult=exit-code"
    return f"LoadState=loaded\n{state}\nExecMainStatus={status}\nInvocationID={invocation}\n"


def waited(root: Path, spark: Spark) -> tuple[int, list[str]]:
    out = io.StringIO()
    rc = stream_wait.wait(str(root), RUN, poll=0.01, out=out, runner=spark, relay=stream_wait.Relay(spark))
    return rc, out.getvalue().splitlines()


def test_the_waiter_relays_each_streams_lines_and_ends_with_the_critical_path(tmp_path):
    root = tmp_path / "streams"
    stream_folder(root, "engram", label="the Engram tables download", queued=0, began=0, ended=200)
    stream_folder(root, "checkpoint", label="the checkpoint download", after="engram", queued=1, began=200,
                  ended=410)
    stream_folder(root, "image", lane="build", label="build x", queued=2, began=2, ended=362)
    stream_folder(root, "rank1", lane="weights", label="rank 1's weight file", after="image checkpoint",
                  queued=3, began=410, ended=515)
    stream_folder(root, "other", run="another", queued=0, began=0, ended=9999)  # not this run's
    spark = Spark({n: done_unit(f"i-{n}") for n in ("engram", "checkpoint", "image", "rank1", "other")},
                  {"i-engram": "Engram tables download: started\r\nEngram tables download: done in 3 min 20 s\n",
                   "i-checkpoint": "Checkpoint download: done in 3 min 30 s\n"})
    rc, lines = waited(root, spark)
    assert rc == 0
    assert lines[:2] == ["Engram tables download: started", "Engram tables download: done in 3 min 20 s"]
    assert "background download: the checkpoint download: 3 min 30 s (after waiting 3 min 19 s)" in lines
    assert lines[-1] == ("background work: 4 streams in 8 min 35 s; critical path 8 min 35 s: the Engram tables "
                         "download (3 min 20 s) → the checkpoint download (3 min 30 s) → rank 1's weight file "
                         "(1 min 45 s)")
    assert lines[-2] == "background lanes, busy: download 6 min 50 s, build 6 min 00 s, weights 1 min 45 s"
    assert not any("\r" in line for line in lines)


def test_the_waiter_says_a_failure_at_once_and_a_stopped_stream_and_fails_at_the_end(tmp_path, capsys):
    root = tmp_path / "streams"
    stream_folder(root, "a", queued=0, began=0, ended=5)
    stream_folder(root, "b", queued=0, began=0, ended=9)
    stream_folder(root, "c", queued=0, began=0)  # stopped (stop.py, a reboot): its unit is gone
    spark = Spark({"a": done_unit("i-a", 7), "b": done_unit("i-b")}, {"i-a": "a: failed after 5 s\nboom\n"})
    rc, lines = waited(root, spark)
    assert rc == 1 and lines[:2] == ["a: failed after 5 s", "boom"]
    assert "sparkfold: a failed (exit 7); the other background work goes on" in lines
    assert "sparkfold: c stopped; the other background work goes on" in lines
    assert "background download: a: 5 s, failed (exit 7)" in lines
    assert "background work did not finish: a, c (the lines above say why)" in capsys.readouterr().err


def test_the_waiter_follows_a_unit_until_it_ends(tmp_path, monkeypatch):
    root = tmp_path / "streams"
    stream_folder(root, "slow", queued=0, began=0, ended=2)
    states = iter([SHOW["running"].replace("4f1c", "i-s"), SHOW["running"].replace("4f1c", "i-s")])

    class Slow(Spark):
        def __call__(self, words: list[str]) -> str:
            if words[0] == "systemctl":
                return next(states, done_unit("i-s"))
            return super().__call__(words)

    spark = Slow({}, {"i-s": "one\ntwo\n"})
    rc, lines = waited(root, spark)
    assert rc == 0 and lines[:2] == ["one", "two"] and lines.count("one") == 1  # each line once
    assert re.search(r"background download: slow: 2 s$", "\n".join(lines), re.M), lines


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


def state(status: str, inputs: str, run: str = "earlier") -> dict:
    return {"run": run, "status": status, "unit_inputs": inputs}


def test_a_stream_starts_with_what_its_work_yields_and_not_when_it_is_converged():
    assert started({}, work=[(converge_op([]), {})]) == []  # converged: no stream, no fact read
    commands = started({}, work=[(converge_op(["rsync a b", "echo checked"]), {})])
    steps = "( set +e\nrsync a b\n) || exit $?\n( set +e\necho checked\n) || exit $?\n"  # each a step of its own
    assert len(commands) == 1 and steps in commands[0] and "systemd-run --quiet --unit=sparkfold-engram-to-worker" \
        in commands[0] and "sudo -n systemctl" not in commands[0].split("systemd-run")[0]


def test_a_stream_runs_a_fresh_start_when_what_it_reads_starts_in_this_run():
    commands = started({}, upstream=[Meta(True)], work=[(converge_op([]), {})])
    assert len(commands) == 1 and "\nfresh copy\n" in commands[0]
    assert started({}, upstream=[Meta(False)], work=[(converge_op([]), {})]) == []


def test_what_a_start_does_follows_its_units_state():
    work = [(converge_op(["rsync a b"]), {})]
    inputs = inputs_digest(["rsync a b"], STREAM.after)
    assert started({STREAM.name: state("running", inputs, RUN_TOKEN)}, work=work) == []  # ours already
    adopted = started({STREAM.name: state("running", inputs)}, work=work)
    assert len(adopted) == 1 and "followed by this run" in adopted[0] and "systemd-run" not in adopted[0]
    restarted = started({STREAM.name: state("running", "other")}, work=work)
    assert "sudo -n systemctl stop sparkfold-engram-to-worker && " in restarted[0] and "systemd-run" in restarted[0]
    failed = started({STREAM.name: state("failed", inputs)}, work=work)
    assert "sudo -n systemctl reset-failed sparkfold-engram-to-worker && " in failed[0]
    fresh = started({STREAM.name: state("none", "")}, work=work)
    assert "sudo -n systemctl" not in fresh[0].split("systemd-run")[0]


def test_a_stream_refuses_an_upload():
    from pyinfra.api import FileUploadCommand

    from operations.util.checks import RunStopped
    with pytest.raises(RunStopped, match="upload files before the stream starts"):
        started({}, work=[(converge_op([FileUploadCommand("a", "b")]), {})])


def test_stop_stops_the_running_streams_only():
    facts = {StreamStates: with_args({f"root={ROOT}": {"a": state("running", "i"), "b": state("done", "i"),
                                                        "c": state("stopping", "i"), "d": state("failed", "i")}})}
    commands, _ = run_op(streams_ended, facts, executing=True, root=ROOT)
    assert commands == ["sudo -n systemctl stop sparkfold-a", "sudo -n systemctl stop sparkfold-c"]
    idle = {StreamStates: with_args({f"root={ROOT}": {"b": state("done", "i")}})}
    commands, host = run_op(streams_ended, idle, executing=True, root=ROOT)
    assert commands == [] and host.noops == ["no background stream runs"]


def test_the_wait_runs_only_when_a_stream_was_started():
    commands, host = run_op(streams_awaited, {}, executing=True, root=ROOT, started=(Meta(False), Meta(False)))
    assert commands == [] and host.noops == ["no background work in this run"]
    commands, _ = run_op(streams_awaited, {}, executing=True, root=ROOT, started=(Meta(False), Meta(True)))
    assert len(commands) == 1 and commands[0].startswith(f"python3 - {ROOT} {RUN_TOKEN} <<'SPARKFOLD_PY_EOF'")
    assert "def critical_path" in commands[0] and "def clock" in commands[0] and "def unit_status" in commands[0]


def test_the_bundled_waiter_runs(tmp_path):
    env = standins(tmp_path)
    (tmp_path / "bin" / "systemctl").write_text(f"#!/bin/sh\nprintf '{done_unit('i-a')}'\n")
    (tmp_path / "bin" / "journalctl").write_text("#!/bin/sh\ncase \"$*\" in *after-cursor*) ;; *) "
                                                 "printf 'a: done in 2 s\\n-- cursor: c\\n';; esac\n")
    (tmp_path / "bin" / "journalctl").chmod(stat.S_IRWXU)
    commands, _ = run_op(streams_awaited, {}, executing=True, root=str(tmp_path / "streams"), started=(Meta(True),))
    command = commands[0].replace(RUN_TOKEN, RUN, 1)
    done = sh(command, env)
    assert done.returncode == 0 and done.stdout == "", done.stderr  # no stream of that run under the folder
    stream_folder(tmp_path / "streams", "a", queued=0, began=0, ended=2)
    done = sh(command, env)
    assert done.returncode == 0 and done.stdout.splitlines()[0] == "a: done in 2 s", done.stderr
