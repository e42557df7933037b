#!/usr/bin/env python3
# Managed by sparkfold: edits are replaced on the next deploy.
"""sparkfold supervisor (head only, optional): when either rank's container exits, restart the pair in order.

Every few seconds it reads both containers' state (rank 0 here, rank 1 with `ssh <worker> docker inspect`). Once
it has seen both containers (running, or stopped: after a reboot it starts at boot and finds the deploy's pair
stopped), a rank that is not running schedules a restart after a backoff that doubles each time: stop what
still runs, wait (up to MEM_WAIT_S) until MemAvailable on both Sparks reaches `--min-avail-gib` (the memory of the
stopped pair comes back over seconds; memguard may just have killed a rank because something else took it), then
`docker start` rank 1 on the worker, then rank 0 here (the deploy created both containers); with
`--relock-unit`, each Spark's GPU clock lock unit is started first (`sudo -n`: where sudo asks for a password that
fails, is logged, and the unit's timer applies the lock within its period). When the memory does not come back (or
the worker's cannot be read) neither rank is started: the pair stays stopped and that restart counts like one that
did not hold. After `--retries` restarts that did not hold it stops both ranks, logs why and exits 1; its unit
restarts it only when it was killed (Restart=on-abnormal), so a supervisor that gave up never loops. A pair that
stays up for `--stable-s` resets the count. Stdlib only; logs go to stderr.

    supervise.py --container NAME --worker-ssh USER@HOST --retries N --backoff-s S --min-avail-gib GIB
                 [--stop-timeout S] [--relock-unit UNIT]
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace

RUNNING, EXITED, MISSING, UNKNOWN = "running", "exited", "missing", "unknown"
NONE, WAIT, RESTART, GIVE_UP = "none", "wait", "restart", "give_up"
KIB_PER_GIB = 1024 * 1024
MEM_WAIT_S = 60.0  # how long a restart waits for MemAvailable to come back before it leaves the pair stopped
MEM_POLL_S = 2.0


@dataclass(frozen=True)
class State:
    armed: bool = False  # both ranks seen running once: before that there is no pair to keep up
    attempts: int = 0  # restarts since the pair last held for stable_s
    restart_at: float | None = None  # when the pending restart is due
    up_since: float | None = None  # when both were last seen running after being down


@dataclass(frozen=True)
class Decision:
    action: str
    reason: str
    state: State


def decide(rank0: str, rank1: str, state: State, now: float, retries: int, backoff_s: float,
           stable_s: float) -> Decision:
    """One look at both ranks -> what to do. Pure: the caller runs the action and keeps the returned state.
    A RESTART counts as an attempt when it is decided, so a restart that then started nothing (too little memory)
    leaves both ranks down and the next look schedules the next, doubled, attempt or gives up."""
    if rank0 == RUNNING and rank1 == RUNNING:
        if not state.armed:
            return Decision(NONE, "both ranks are running: supervising the pair",
                            replace(state, armed=True, up_since=now))
        up_since = state.up_since if state.up_since is not None else now
        if state.restart_at is not None:
            return Decision(NONE, "both ranks are running again: pending restart cancelled",
                            replace(state, restart_at=None, up_since=up_since))
        if state.attempts and now - up_since >= stable_s:
            return Decision(NONE, f"the pair held for {stable_s:.0f} s: restart count reset",
                            replace(state, attempts=0, up_since=up_since))
        return Decision(NONE, "", replace(state, up_since=up_since))
    if not state.armed:
        if MISSING in (rank0, rank1) or UNKNOWN in (rank0, rank1):
            return Decision(NONE, "", state)  # the deploy has not brought the pair up yet (or a Spark is not read)
        # both containers are there, the deploy's, but not both run: the Spark booted (the supervisor starts at
        # boot, and a reboot stops every rank), or a rank exited while the supervisor was not running
        state = replace(state, armed=True)
    down = ", ".join(f"rank {r} is {s}" for r, s in ((0, rank0), (1, rank1)) if s != RUNNING)
    state = replace(state, up_since=None)
    if state.restart_at is None:
        if state.attempts >= retries:
            return Decision(GIVE_UP, f"{down} after {state.attempts} restart(s): giving up, stopping both ranks",
                            state)
        delay = backoff_s * 2 ** state.attempts
        return Decision(WAIT, f"{down}: restarting the pair in {delay:.0f} s (restart {state.attempts + 1} of "
                              f"{retries})", replace(state, restart_at=now + delay))
    if now < state.restart_at:
        return Decision(WAIT, "", state)
    return Decision(RESTART, f"{down}: restarting rank 1, then rank 0",
                    replace(state, attempts=state.attempts + 1, restart_at=None))


def memory_problem(spark: str, avail_gib: float | None, need_gib: float, error: str = "") -> str:
    """Whether a rank may start on `spark`: "" when MemAvailable (GiB) reaches what a rank needs, else why not and
    the fix. avail_gib None: it could not be read (`error` says why), which never counts as enough. Pure."""
    need = f"a rank needs min_avail_gib = {need_gib:g} GiB"
    if avail_gib is None:
        return (f"cannot read MemAvailable on {spark} ({error or 'no answer'}), {need}; make it readable (ssh from "
                "the head), then run restart.py")
    if avail_gib >= need_gib:
        return ""
    shown = int(avail_gib * 10) / 10  # rounded down: never "only 112.0 GiB" against a need of 112
    return (f"something else holds memory on {spark}: only {shown:.1f} GiB available, {need}; stop it, then run "
            "restart.py")


def parse_mem_available(meminfo: str) -> float | None:
    """MemAvailable in GiB from /proc/meminfo's text; None when it is not there."""
    for line in meminfo.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "MemAvailable:" and fields[1].isdigit():
            return int(fields[1]) / KIB_PER_GIB
    return None


def log(message: str) -> None:
    print(f"supervise: {message}", file=sys.stderr, flush=True)


class Pair:
    """The two containers: rank 0 through the local docker, rank 1 through ssh to the worker."""

    def __init__(self, container: str, worker_ssh: str, stop_timeout: int, relock_unit: str = "",
                 min_avail_gib: float = 0.0, meminfo: str = "/proc/meminfo"):
        self.container, self.worker_ssh, self.stop_timeout = container, worker_ssh, stop_timeout
        self.relock_unit, self.min_avail_gib, self.meminfo = relock_unit, min_avail_gib, meminfo
        self.mem_wait_s, self.mem_poll_s = MEM_WAIT_S, MEM_POLL_S

    def spark(self, rank: int) -> str:
        return f"the worker ({self.worker_ssh})" if rank == 1 else "the head"

    def _run(self, rank: int, *docker_args: str, program: str = "docker") -> subprocess.CompletedProcess:
        argv = [program, *docker_args]
        if rank == 1:
            argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", self.worker_ssh, shlex.join(argv)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=self.stop_timeout + 60)

    def status(self, rank: int) -> str:
        try:
            result = self._run(rank, "inspect", "-f", "{{.State.Status}}", self.container)
        except (OSError, subprocess.SubprocessError):
            return UNKNOWN
        if result.returncode == 0:
            return RUNNING if result.stdout.strip() in ("running", "restarting") else EXITED
        if rank == 1 and result.returncode == 255:
            return UNKNOWN  # ssh itself failed
        return MISSING if "no such" in result.stderr.lower() else UNKNOWN

    def act(self, rank: int, verb: str) -> None:
        args = ["stop", "-t", str(self.stop_timeout)] if verb == "stop" else [verb]
        try:
            result = self._run(rank, *args, self.container)
        except (OSError, subprocess.SubprocessError) as e:
            log(f"docker {verb} rank {rank}: {e}")
            return
        if result.returncode != 0:
            log(f"docker {verb} rank {rank} failed: {result.stderr.strip()}")

    def relock(self, rank: int) -> None:
        """The GPU clock lock applied again before a start (a reset since the timer's last run would go unlocked)."""
        if not self.relock_unit:
            return
        try:
            result = self._run(rank, "-n", "systemctl", "start", self.relock_unit, program="sudo")
        except (OSError, subprocess.SubprocessError) as e:
            result = subprocess.CompletedProcess([], 1, "", str(e))
        if result.returncode != 0:
            log(f"could not start {self.relock_unit} before rank {rank} ({result.stderr.strip() or 'failed'}); "
                "its timer applies the GPU clock lock within its period")

    def mem_available(self, rank: int) -> tuple[float | None, str]:
        """(MemAvailable in GiB, "") on rank's Spark: here from the file, the worker's with `ssh <worker> cat`;
        (None, why) when it cannot be read."""
        try:
            if rank == 0:
                with open(self.meminfo, encoding="ascii") as f:
                    text = f.read()
            else:
                result = self._run(1, "/proc/meminfo", program="cat")
                if result.returncode != 0:
                    return None, (result.stderr.strip() or f"ssh exited {result.returncode}")
                text = result.stdout
        except (OSError, UnicodeDecodeError, subprocess.SubprocessError) as e:
            return None, str(e)
        avail = parse_mem_available(text)
        return (avail, "") if avail is not None else (None, "no MemAvailable line")

    def memory_problems(self) -> list[str]:
        """Both Sparks looked at once: what stops a start on each ("" entries dropped)."""
        problems = []
        for rank in (1, 0):
            avail, error = self.mem_available(rank)
            problems.append(memory_problem(self.spark(rank), avail, self.min_avail_gib, error))
        return [p for p in problems if p]

    def memory_back(self) -> bool:
        """Wait up to mem_wait_s, polling every mem_poll_s, for both Sparks to have what a rank needs; log each
        Spark still short when the wait ends."""
        deadline = time.monotonic() + self.mem_wait_s
        problems = self.memory_problems()
        if problems:
            log(f"too little MemAvailable to start a rank: waiting up to {self.mem_wait_s:.0f} s for it to come back")
        while problems and time.monotonic() < deadline:
            time.sleep(self.mem_poll_s)
            problems = self.memory_problems()
        for problem in problems:
            log(f"not starting the pair (it stays stopped) after waiting {self.mem_wait_s:.0f} s: {problem}")
        return not problems

    def restart(self) -> bool:
        """Stop what runs, then start rank 1, then rank 0, once both Sparks have the memory a rank needs; False
        (nothing started) when that memory did not come back."""
        for rank in (0, 1):
            self.act(rank, "stop")
        if not self.memory_back():
            return False
        for rank in (1, 0):
            self.relock(rank)
            self.act(rank, "start")
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--container", required=True)
    parser.add_argument("--worker-ssh", required=True)
    parser.add_argument("--retries", type=int, required=True)
    parser.add_argument("--backoff-s", type=float, required=True)
    parser.add_argument("--min-avail-gib", type=float, required=True,
                        help="MemAvailable (GiB) each Spark needs before its rank is started again")
    parser.add_argument("--stop-timeout", type=int, default=30)
    parser.add_argument("--stable-s", type=float, default=600)
    parser.add_argument("--interval", type=float, default=5)
    parser.add_argument("--relock-unit", default="",
                        help="a unit that applies the GPU clock lock, started before a start")
    parser.add_argument("--meminfo", default="/proc/meminfo", help=argparse.SUPPRESS)  # for tests
    args = parser.parse_args(argv)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    pair = Pair(args.container, args.worker_ssh, args.stop_timeout, args.relock_unit, args.min_avail_gib,
                args.meminfo)
    log(f"watching {args.container} here and on {args.worker_ssh} (backoff {args.backoff_s:.0f} s doubling, "
        f"{args.retries} restart(s) at most, {args.min_avail_gib:g} GiB MemAvailable needed to start)")
    state = State()
    while not stop:
        decision = decide(pair.status(0), pair.status(1), state, time.monotonic(), args.retries, args.backoff_s,
                          args.stable_s)
        state = decision.state
        if decision.reason:
            log(decision.reason)
        if decision.action == RESTART:
            pair.restart()  # False (memory short): nothing started, and decide() has already counted this attempt
        elif decision.action == GIVE_UP:
            for rank in (0, 1):
                pair.act(rank, "stop")
            log("both ranks stopped; fix the cause, then run restart.py (this service stays stopped)")
            return 1
        time.sleep(args.interval)
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
