#!/usr/bin/env python3
# Managed by sparkfold: edits are replaced on the next deploy.
"""sparkfold supervisor (head only, optional): when either rank's container exits, restart the pair in order.

Every few seconds it reads both containers' state (rank 0 here, rank 1 with `ssh <worker> docker inspect`). Once
it has seen both running, an exit of either schedules a restart after a backoff that doubles each time: stop what
still runs, `docker start` rank 1 on the worker, then rank 0 here (the deploy created both containers); with
`--relock-unit`, each Spark's GPU clock lock unit is started first (`sudo -n`: where sudo asks for a password that
fails, is logged, and the unit's timer applies the lock within its period). After
`--retries` restarts that did not hold it stops both ranks, logs why and exits 1; its unit has Restart=no, so it
never loops. A pair that stays up for `--stable-s` resets the count. Stdlib only; logs go to stderr.

    supervise.py --container NAME --worker-ssh USER@HOST --retries N --backoff-s S [--stop-timeout S]
                 [--relock-unit UNIT]
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
    """One look at both ranks -> what to do. Pure: the caller runs the action and keeps the returned state."""
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
        return Decision(NONE, "", state)  # the deploy has not brought the pair up yet
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


def log(message: str) -> None:
    print(f"supervise: {message}", file=sys.stderr, flush=True)


class Pair:
    """The two containers: rank 0 through the local docker, rank 1 through ssh to the worker."""

    def __init__(self, container: str, worker_ssh: str, stop_timeout: int, relock_unit: str = ""):
        self.container, self.worker_ssh, self.stop_timeout = container, worker_ssh, stop_timeout
        self.relock_unit = relock_unit

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

    def restart(self) -> None:
        for rank in (0, 1):
            self.act(rank, "stop")
        for rank in (1, 0):
            self.relock(rank)
            self.act(rank, "start")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--container", required=True)
    p.add_argument("--worker-ssh", required=True)
    p.add_argument("--retries", type=int, required=True)
    p.add_argument("--backoff-s", type=float, required=True)
    p.add_argument("--stop-timeout", type=int, default=30)
    p.add_argument("--stable-s", type=float, default=600)
    p.add_argument("--interval", type=float, default=5)
    p.add_argument("--relock-unit", default="", help="a unit that applies the GPU clock lock, started before a start")
    args = p.parse_args(argv)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    pair = Pair(args.container, args.worker_ssh, args.stop_timeout, args.relock_unit)
    log(f"watching {args.container} here and on {args.worker_ssh} (backoff {args.backoff_s:.0f} s doubling, "
        f"{args.retries} restart(s) at most)")
    state = State()
    while not stop:
        decision = decide(pair.status(0), pair.status(1), state, time.monotonic(), args.retries, args.backoff_s,
                          args.stable_s)
        state = decision.state
        if decision.reason:
            log(decision.reason)
        if decision.action == RESTART:
            pair.restart()
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
