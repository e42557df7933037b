"""Progress on the simulated pair: a copy to the worker slowed down on the link reports while it runs, at pyinfra's
default verbosity, in plain lines; a copy interrupted half-way resumes and says how much was already there.

Starts from a converged pair (converged_pair) and leaves one.
"""

from __future__ import annotations

import re
import time

import pytest
from test_deploy import changed_ops, deploy, deploy_killed_at, start_deploy

from tests.sim.sim import PROGRESS_EVERY_S  # the site's progress_every_s: a line this often

ENGRAM = "/home/nvidia/.cache/sparkfold/engram"
PROBE = f"{ENGRAM}/progress-probe.bin"
RAIL0 = "enp1s0f0np0"  # the head's side of rail 0, which the copies to the worker take
# the copy's own lines ("[sim-head]   the Engram tables to the worker: 6 MiB already there of 12 MiB"), not the
# summary's ("background to worker: the Engram tables to the worker: 39 s") nor the check's second pass's
STEP = re.compile(r"^\s*\[sim-head\]\s+the Engram tables to the worker: ")
AMOUNT = re.compile(r"(\d+(?:\.\d+)?) (KiB|MiB|GiB)")  # the runner's units (operations/remote/progress.size)
UNIT_MIB = {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}
PART_OF = re.compile(AMOUNT.pattern + r"(?: already there)? of " + AMOUNT.pattern)  # "6 MiB already there of 12 MiB"

pytestmark = pytest.mark.usefixtures("converged_pair")


def mib(line: str) -> float:
    """The first amount on a progress line, in MiB ("24 KiB already there of 12 MiB": 24 KiB)."""
    m = AMOUNT.search(line)
    assert m, line
    return float(m.group(1)) * UNIT_MIB[m.group(2)]


def short_totals(lines: list[str]) -> list[str]:
    """The Engram tables' lines whose total is smaller than the amount beside it ("24 MiB already there of 19 KiB")."""
    short = []
    for text in lines:
        m = PART_OF.search(text) if "Engram tables" in text else None
        if m and float(m.group(1)) * UNIT_MIB[m.group(2)] > float(m.group(3)) * UNIT_MIB[m.group(4)]:
            short.append(text)
    return short


def slow_link(sim_exec, on: bool):
    if on:  # about 0.5 MB/s, a burst above the 9000-byte MTU (the link ping must pass): 12 MiB take ~25 s
        assert sim_exec("head", f"tc qdisc add dev {RAIL0} root tbf rate 4mbit burst 64kb latency 400ms") \
            .returncode == 0
    else:
        sim_exec("head", f"tc qdisc del dev {RAIL0} root")


def test_a_slow_copy_reports_while_it_runs_and_a_resumed_copy_says_what_was_there(site_file, sim_exec, run_pyinfra):
    # a fresh start: no probe, nor a part of one (an interrupted copy keeps it in .sparkfold-partial/)
    sim_exec("worker", f"rm -rf {ENGRAM}/progress-probe.bin {ENGRAM}/.progress-probe.bin.* {ENGRAM}/.sparkfold-partial")
    assert sim_exec("head", f"head -c 12M /dev/urandom > {PROBE} && chown nvidia: {PROBE}").returncode == 0
    slow_link(sim_exec, True)
    try:
        # 1. a run interrupted part-way through the copy (as a user would, with ^C or a lost terminal), at its third
        # line with an amount: the stream's lines are relayed from its log, so the first two may come together
        # when the relay starts late; the third comes a full tick after the second
        came: list[tuple[float, str]] = []

        def third_amount(line: str) -> bool:
            if STEP.search(line) and " of " in line:
                came.append((time.monotonic(), line.rstrip("\n")))
            return len(came) >= 3

        seen = deploy_killed_at(site_file, third_amount, 600)
        assert came[2][0] - came[1][0] >= PROGRESS_EVERY_S / 2  # they came while the copy ran, not at its end
        assert all("\r" not in text for text in seen)
        first = next(text for text in seen if STEP.search(text))
        before = mib(first) if "already there" in first else 0.0  # the worker's folder before this copy
        reached = mib(came[-1][1])  # what the worker had when the run was killed
        assert reached >= before + 1, (before, came)  # the killed copy had moved data
        # the killed run's copy goes on (a unit of the Spark's, not of the run: the next run would follow it);
        # stop.py stops it with the ranks, its part stays in .sparkfold-partial/
        unit = "sparkfold-engram-to-worker"
        assert sim_exec("head", ["systemctl", "is-active", unit]).stdout.strip() == "active"
        stopped = run_pyinfra("inventory.py", "stop.py", "-y")
        assert stopped.returncode == 0, stopped.stderr[-3000:]
        assert sim_exec("head", ["systemctl", "is-active", unit]).stdout.strip() != "active"
        assert sim_exec("worker", ["test", "-d", f"{ENGRAM}/.sparkfold-partial"]).returncode == 0

        # 2. the next run resumes: its first line says how much was already there, and it ends
        run = start_deploy(site_file)
        assert run.stderr is not None
        lines = [line.rstrip("\n") for line in run.stderr]
        assert run.wait() == 0, "\n".join(lines[-60:])
    finally:
        slow_link(sim_exec, False)
    mine = [text for text in lines if STEP.search(text)]
    assert any("is now LIVE! on port 8888" in text for text in lines), "\n".join(lines[-40:])  # finished the job
    assert "already there" in mine[0], mine
    # the interrupted copy's part was kept (rsync --partial-dir, the stream's part) and the resumed copy starts from
    # it (both figures rounded to whole MiB)
    assert mib(mine[0]) >= reached - 1, (reached, mine[0])
    assert "done in" in mine[-1], mine
    assert short_totals(seen + lines) == []  # no total below what is there
    assert sim_exec("worker", f"test $(stat -c %s {PROBE}) -eq {12 * 1024 * 1024}").returncode == 0  # all of it
    assert sim_exec("worker", ["test", "-e", f"{ENGRAM}/.sparkfold-partial"]).returncode != 0  # the part served
    # back to the pair's own files (the probe is not one of the Engram tables)
    for role in ("head", "worker"):
        sim_exec(role, f"rm -f {PROBE}")
    assert changed_ops(deploy(run_pyinfra)) == {}
