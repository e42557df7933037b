"""Supervision: the pure decision (arming, backoff doubling, cancel on recovery, give-up, stable reset), the memory
judgement before a restart, the script against a fake docker and ssh, and the deploy (nothing unless supervise, head
only)."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

from waiting import wait_for

import operations.supervise as sv
from operations.remote import supervise as script
from operations.remote.supervise import EXITED, GIVE_UP, MISSING, NONE, RESTART, RUNNING, UNKNOWN, WAIT, State, decide

OPTS = dict(retries=3, backoff_s=60, stable_s=600)


def step(rank0, rank1, state, now):
    return decide(rank0, rank1, state, now, **OPTS)


def armed(now=0):
    return step(RUNNING, RUNNING, State(), now).state


def test_nothing_happens_before_the_pair_was_seen():
    for r0, r1 in ((MISSING, MISSING), (MISSING, EXITED), (RUNNING, MISSING), (UNKNOWN, RUNNING), (EXITED, UNKNOWN)):
        d = step(r0, r1, State(), 100)
        assert d.action == NONE and not d.state.armed
    d = step(RUNNING, RUNNING, State(), 100)
    assert d.action == NONE and d.state.armed and "supervising" in d.reason


def test_after_a_boot_the_deploys_pair_found_stopped_is_restarted():
    """The supervisor starts at boot and a reboot stopped every rank: both containers are there, not running."""
    for r0, r1 in ((EXITED, EXITED), (EXITED, RUNNING), (RUNNING, EXITED)):
        d = step(r0, r1, State(), 100)
        assert d.action == WAIT and d.state.armed and "restarting the pair in 60 s (restart 1 of 3)" in d.reason
        assert step(r0, r1, d.state, 160).action == RESTART


def test_an_exit_waits_the_backoff_then_restarts():
    d = step(RUNNING, EXITED, armed(), 1000)
    assert d.action == WAIT and "rank 1 is exited" in d.reason and "in 60 s (restart 1 of 3)" in d.reason
    assert d.state.restart_at == 1060
    d = step(RUNNING, EXITED, d.state, 1059)
    assert d.action == WAIT and d.reason == ""
    d = step(EXITED, EXITED, d.state, 1060)
    assert d.action == RESTART and d.state.attempts == 1 and d.state.restart_at is None
    assert "rank 0 is exited, rank 1 is exited" in d.reason


def test_backoff_doubles_and_it_gives_up_after_the_retries():
    state, now, delays = armed(), 0, []
    for _ in range(3):
        d = step(EXITED, RUNNING, state, now)
        assert d.action == WAIT
        delays.append(d.state.restart_at - now)
        now = d.state.restart_at
        d = step(EXITED, RUNNING, d.state, now)
        assert d.action == RESTART
        state = d.state
    assert delays == [60, 120, 240]
    d = step(EXITED, RUNNING, state, now + 5)
    assert d.action == GIVE_UP and "after 3 restart(s): giving up" in d.reason


def test_recovery_before_the_restart_cancels_it():
    d = step(UNKNOWN, RUNNING, armed(), 10)  # e.g. a docker hiccup
    assert d.action == WAIT
    d = step(RUNNING, RUNNING, d.state, 20)
    assert d.action == NONE and d.state.restart_at is None and "cancelled" in d.reason
    assert step(RUNNING, RUNNING, d.state, 21).action == NONE


def test_a_pair_that_holds_resets_the_count_and_a_short_run_does_not():
    state = State(armed=True, attempts=2)
    d = step(RUNNING, RUNNING, state, 1000)
    assert d.state.attempts == 2 and d.state.up_since == 1000
    d = step(RUNNING, RUNNING, d.state, 1599)
    assert d.state.attempts == 2
    d = step(RUNNING, RUNNING, d.state, 1600)
    assert d.state.attempts == 0 and "reset" in d.reason
    # a crash before stable_s keeps the count: the next delay is the doubled one
    short = step(RUNNING, RUNNING, State(armed=True, attempts=2), 0).state
    d = step(RUNNING, EXITED, short, 100)
    assert d.state.restart_at == 100 + 240


def test_zero_retries_gives_up_at_the_first_exit():
    d = decide(RUNNING, MISSING, armed(), 5, retries=0, backoff_s=60, stable_s=600)
    assert d.action == GIVE_UP


# --- the script against a fake docker (rank 0) and ssh (rank 1) ------------------------------------------------

def _meminfo(avail_gib):
    return f"MemTotal:       125000000 kB\nMemFree:         1000000 kB\nMemAvailable: {int(avail_gib * 1024 ** 2)} kB\n"


def _fakes(tmp_path, rank0, rank1, worker_gib=120):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    meminfo = tmp_path / "worker-meminfo"
    meminfo.write_text(_meminfo(worker_gib))
    for rank, name in ((rank0, "docker"), (rank1, "ssh"), ("", "sudo")):
        # ssh gets "opts... worker 'docker inspect ...'" as one remote command; both log what they were asked
        body = (f"#!/bin/sh\necho \"{name} $*\" >> {log}\n"
                f"case \"$*\" in *inspect*) echo {rank};; *'cat /proc/meminfo'*) cat {meminfo};; esac\nexit 0\n")
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return bin_dir, log


def test_script_arms_restarts_in_order_then_gives_up(tmp_path):
    bin_dir, log = _fakes(tmp_path, "running", "running")
    head_meminfo = tmp_path / "head-meminfo"
    head_meminfo.write_text(_meminfo(118))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    argv = [sys.executable, script.__file__, "--container", "rank-c", "--worker-ssh", "nvidia@192.168.100.2",
            "--retries", "2", "--backoff-s", "0.05", "--interval", "0.02", "--stop-timeout", "7",
            "--min-avail-gib", "112", "--relock-unit", "lock.service", "--meminfo", str(head_meminfo)]
    said = tmp_path / "supervise.stderr"
    with open(said, "w") as sink:
        proc = subprocess.Popen(argv, env=env, stderr=sink)
    try:
        # armed first (a loaded machine may take a while to start it): until then an exit is not its to mend
        wait_for(lambda: "supervising the pair" in said.read_text(), "the supervisor to arm", running=proc,
                 said=said.read_text)
        # rank 1 dies for good (the fake replaced whole: a look never finds it half written)
        (bin_dir / "ssh.new").write_text((bin_dir / "ssh").read_text().replace("echo running", "echo exited"))
        (bin_dir / "ssh.new").chmod(0o755)
        os.replace(bin_dir / "ssh.new", bin_dir / "ssh")
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:  # never left running: it would go on calling ssh
            proc.kill()
            proc.wait()
    stderr = said.read_text()
    assert proc.returncode == 1
    assert "both ranks are running: supervising the pair" in stderr
    assert "rank 1 is exited: restarting the pair in 0 s (restart 1 of 2)" in stderr
    assert "112 GiB MemAvailable needed to start" in stderr and "waiting" not in stderr
    assert "giving up, stopping both ranks" in stderr
    calls = [c for c in log.read_text().splitlines() if "inspect" not in c]
    one_restart = [
        "docker stop -t 7 rank-c",
        "ssh -o BatchMode=yes -o ConnectTimeout=10 nvidia@192.168.100.2 docker stop -t 7 rank-c",
        "ssh -o BatchMode=yes -o ConnectTimeout=10 nvidia@192.168.100.2 cat /proc/meminfo",  # enough: no wait
        "ssh -o BatchMode=yes -o ConnectTimeout=10 nvidia@192.168.100.2 sudo -n systemctl start lock.service",
        "ssh -o BatchMode=yes -o ConnectTimeout=10 nvidia@192.168.100.2 docker start rank-c",
        "sudo -n systemctl start lock.service",  # each Spark's GPU clock lock, right before its rank starts
        "docker start rank-c",
    ]
    assert calls == one_restart * 2 + one_restart[:2]  # two restarts (rank 1 first), then both stopped


# --- the memory a rank needs before the supervisor starts it again -----------------------------------------------

WORKER = "the worker (nvidia@w)"


def test_memory_problem_lets_a_rank_start_only_with_enough_memory():
    assert script.memory_problem(WORKER, 112.0, 112.0) == ""
    assert script.memory_problem("the head", 119.6, 112.0) == ""
    short = script.memory_problem(WORKER, 40.04, 112.0)
    assert short == ("something else holds memory on the worker (nvidia@w): only 40.0 GiB available, a rank needs "
                     "min_avail_gib = 112 GiB; stop it, then run restart.py")
    head = script.memory_problem("the head", 111.99, 112.0)
    assert head.startswith("something else holds memory on the head: only 111.9 GiB")  # short: never shown as 112
    unread = script.memory_problem(WORKER, None, 112.0, "ssh: connect to host w port 22: Connection timed out")
    assert unread.startswith("cannot read MemAvailable on the worker (nvidia@w) (ssh: connect to host w port 22: ")
    assert "a rank needs min_avail_gib = 112 GiB" in unread and "restart.py" in unread
    assert script.memory_problem(WORKER, None, 0.0) != ""  # unreadable is never enough, whatever the need


def test_parse_mem_available():
    assert script.parse_mem_available(_meminfo(112.5)) == 112.5
    assert script.parse_mem_available("MemTotal: 1 kB\n") is None
    assert script.parse_mem_available("") is None


class Clock:
    """time for the script: sleep advances it; a run that goes on far too long fails instead of hanging."""

    def __init__(self, limit=100_000.0):
        self.now, self.sleeps, self.limit = 0.0, [], limit

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds
        assert self.now < self.limit, "the supervisor did not stop"


class Sparks:
    """docker on both Sparks (stop and start change a rank's state) and the worker's meminfo over ssh: its
    MemAvailable from `worker_gib`, one figure per read, the last repeated; None: ssh fails. Every call recorded."""

    def __init__(self, worker_gib, dies_at=None):
        self.worker_gib, self.dies_at, self.calls = list(worker_gib), dies_at, []
        self.state = {0: "running", 1: "running"}
        self.clock = None

    def run(self, rank, *args, program="docker"):
        self.calls.append((rank, program, *args))
        if program == "cat":
            gib = self.worker_gib.pop(0) if len(self.worker_gib) > 1 else self.worker_gib[0]
            if gib is None:
                return subprocess.CompletedProcess([], 255, "", "ssh: connect to host w port 22: Connection timed out")
            return subprocess.CompletedProcess([], 0, _meminfo(gib), "")
        if program == "docker" and args[0] == "inspect":
            if self.dies_at is not None and self.clock.now >= self.dies_at:
                self.state[1], self.dies_at = "exited", None  # rank 1 dies once
            return subprocess.CompletedProcess([], 0, self.state[rank] + "\n", "")
        if program == "docker" and args[0] in ("stop", "start"):
            self.state[rank] = "exited" if args[0] == "stop" else "running"
        return subprocess.CompletedProcess([], 0, "", "")

    def actions(self):
        return [(rank, args[0]) for rank, program, *args in self.calls if program == "docker" and args[0] != "inspect"]


def _pair(tmp_path, monkeypatch, worker_gib, head_gib=120.0):
    head = tmp_path / "meminfo"
    head.write_text(_meminfo(head_gib))
    sparks, clock = Sparks(worker_gib), Clock()
    sparks.clock = clock
    monkeypatch.setattr(script, "time", clock)
    pair = script.Pair("rank-c", "nvidia@w", 7, min_avail_gib=112.0, meminfo=str(head))
    monkeypatch.setattr(pair, "_run", sparks.run)
    return pair, sparks, clock


def test_restart_with_enough_memory_starts_rank_1_then_rank_0(tmp_path, monkeypatch, capsys):
    pair, sparks, clock = _pair(tmp_path, monkeypatch, [120.0])
    assert pair.restart() is True
    assert sparks.actions() == [(0, "stop"), (1, "stop"), (1, "start"), (0, "start")]
    stop_at = sparks.calls.index((1, "docker", "stop", "-t", "7", "rank-c"))
    assert sparks.calls.index((1, "cat", "/proc/meminfo")) == stop_at + 1  # read after the stop, before a start
    assert clock.sleeps == [] and capsys.readouterr().err == ""


def test_restart_waits_for_memory_that_comes_back(tmp_path, monkeypatch, capsys):
    pair, sparks, clock = _pair(tmp_path, monkeypatch, [30.0, None, 90.0, 113.0])  # the stopped rank's memory returns
    assert pair.restart() is True
    assert sparks.actions() == [(0, "stop"), (1, "stop"), (1, "start"), (0, "start")]
    assert clock.sleeps == [2.0, 2.0, 2.0]
    err = capsys.readouterr().err
    assert "waiting up to 60 s for it to come back" in err and "not starting" not in err


def test_restart_leaves_the_pair_stopped_when_memory_never_comes_back(tmp_path, monkeypatch, capsys):
    pair, sparks, clock = _pair(tmp_path, monkeypatch, [40.0])
    assert pair.restart() is False
    assert sparks.actions() == [(0, "stop"), (1, "stop")]  # nothing started, no GPU lock asked for
    assert 60 <= clock.now <= 62 and sum(1 for c in sparks.calls if c[1] == "cat") == 31  # bounded: every 2 s
    lines = [line for line in capsys.readouterr().err.splitlines() if "not starting" in line]
    assert lines == ["supervise: not starting the pair (it stays stopped) after waiting 60 s: something else holds "
                     "memory on the worker (nvidia@w): only 40.0 GiB available, a rank needs min_avail_gib = 112 GiB; "
                     "stop it, then run restart.py"]


def test_restart_names_each_spark_that_is_short(tmp_path, monkeypatch, capsys):
    pair, sparks, _ = _pair(tmp_path, monkeypatch, [None], head_gib=50.0)  # ssh down, the head's memory held
    assert pair.restart() is False
    assert sparks.actions() == [(0, "stop"), (1, "stop")]
    lines = [line for line in capsys.readouterr().err.splitlines() if "not starting" in line]
    assert len(lines) == 2
    assert "cannot read MemAvailable on the worker (nvidia@w) (ssh: connect to host w port 22" in lines[0]
    assert "something else holds memory on the head: only 50.0 GiB available" in lines[1]


def test_a_restart_refused_for_memory_counts_and_the_supervisor_gives_up(tmp_path, monkeypatch, capsys):
    head = tmp_path / "meminfo"
    head.write_text(_meminfo(120.0))
    sparks, clock = Sparks([40.0], dies_at=100.0), Clock()
    sparks.clock = clock
    monkeypatch.setattr(script, "time", clock)
    monkeypatch.setattr(script.Pair, "_run", lambda self, rank, *a, program="docker": sparks.run(rank, *a,
                                                                                                program=program))
    code = script.main(["--container", "rank-c", "--worker-ssh", "nvidia@w", "--retries", "2", "--backoff-s", "30",
                        "--min-avail-gib", "112", "--meminfo", str(head)])
    assert code == 1
    assert (1, "start") not in sparks.actions() and (0, "start") not in sparks.actions()
    err = capsys.readouterr().err
    assert err.count("not starting the pair") == 2
    # each refused restart was an attempt: the second came after the doubled backoff, then it gave up
    assert "rank 0 is exited, rank 1 is exited: restarting the pair in 60 s (restart 2 of 2)" in err
    assert "after 2 restart(s): giving up, stopping both ranks" in err


# --- the deploy -----------------------------------------------------------------------------------------------

def _settings(**kw):
    base = dict(supervise=True, is_head=True, container_name="rank-c", worker_link_ssh="nvidia@192.168.100.2",
                ssh_user="nvidia", supervise_retries=3, supervise_backoff_s=60, stop_timeout=30, min_avail_gib=112.0)
    return SimpleNamespace(**{**base, **kw})


def _record(monkeypatch):
    calls = []
    monkeypatch.setattr(sv, "script_installed", lambda script: calls.append(("put", script)))
    monkeypatch.setattr(sv, "unit_installed", lambda *a, **kw: calls.append(("unit", a, kw)))
    monkeypatch.setattr(sv, "unit_off", lambda unit: calls.append(("off", unit)))
    return calls


def test_unit_content():
    unit = sv.render_unit("rank-c", "nvidia@192.168.100.2", "nvidia", 3, 60, 30, 112.0)
    assert unit.startswith("# Managed by sparkfold")
    assert ("ExecStart=/usr/bin/python3 /usr/local/lib/sparkfold/supervise.py --container rank-c --worker-ssh "
            "nvidia@192.168.100.2 --retries 3 --backoff-s 60 --stop-timeout 30 --min-avail-gib 112 --relock-unit "
            "sparkfold-gpu-clock.service\n") in unit
    assert " --min-avail-gib 100.5 " in sv.render_unit("rank-c", "nvidia@192.168.100.2", "nvidia", 3, 60, 30, 100.5)
    for line in ("Type=simple", "Restart=on-abnormal", "RestartSec=5", "User=nvidia", "WantedBy=multi-user.target"):
        assert f"\n{line}\n" in unit
    assert "Restart=always" not in unit and "Restart=on-failure" not in unit  # a supervisor that gave up stays down
    assert sv.script_sha256("supervise.py") in unit


def test_deploy_installs_on_the_head_only_when_asked(monkeypatch):
    calls = _record(monkeypatch)
    sv.supervision._inner(_settings())
    assert [c[0] for c in calls] == ["put", "unit"]
    assert calls[0][1] == "supervise.py"
    _, (unit_name, content), options = calls[1]
    assert unit_name == "sparkfold-supervise.service"
    assert content == sv.render_unit("rank-c", "nvidia@192.168.100.2", "nvidia", 3, 60, 30, 112.0)
    assert " --min-avail-gib 112 " in content  # the deploy's own min_avail_gib
    assert options == {"restart_on_change": True}

    calls.clear()
    sv.supervision._inner(_settings(is_head=False))
    assert calls == []

    sv.supervision._inner(_settings(supervise=False))
    assert calls == [("off", "sparkfold-supervise.service")]


def test_supervisor_paused_on_the_head_only(monkeypatch):
    calls = _record(monkeypatch)
    sv.supervisor_paused._inner(_settings(supervise=False))
    sv.supervisor_paused._inner(_settings(is_head=False))
    assert calls == [("off", "sparkfold-supervise.service")]


def test_a_refused_relock_is_logged_and_the_start_goes_on(tmp_path, capsys, monkeypatch):
    bin_dir, log = _fakes(tmp_path, "running", "running")
    (bin_dir / "sudo").write_text(f"#!/bin/sh\necho \"sudo $*\" >> {log}\necho 'sudo: a password is required' >&2\n"
                                  "exit 1\n")
    pair = script.Pair("rank-c", "nvidia@w", 7, relock_unit="lock.service")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    pair.relock(0)
    assert "could not start lock.service before rank 0 (sudo: a password is required)" in capsys.readouterr().err
    assert log.read_text().splitlines() == ["sudo -n systemctl start lock.service"]
    script.Pair("rank-c", "nvidia@w", 7).relock(0)  # no unit given: nothing is run
    assert log.read_text().splitlines() == ["sudo -n systemctl start lock.service"]
