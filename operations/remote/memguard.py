#!/usr/bin/env python3
# Managed by sparkfold: edits are replaced on the next deploy.
"""sparkfold memguard: kill this Spark's rank container before unified memory runs out.

On GB10 the weights live in driver allocations the kernel OOM killer cannot see, so running out of memory wedges
the box instead of failing an allocation. Every 0.5 s this reads MemAvailable; below the floor, and while the rank
container runs, it runs `docker kill <container>` and logs why. It keeps the lowest MemAvailable seen in a state
file. Stdlib only; logs go to stderr (the journal under systemd).

    memguard.py --container NAME --floor-gib GIB [--state-file PATH] [--interval S]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace

KIB_PER_GIB = 1024 * 1024
REARM_MARGIN_GIB = 1.0  # after a kill, memory must climb this far above the floor before the guard re-arms
RETRY_KILL_S = 10.0  # a kill that did not take (container still running, still below) is retried after this
LOW_STEP_GIB = 0.05  # the low-water file is rewritten only when the mark drops by at least this much


@dataclass(frozen=True)
class GuardState:
    armed: bool = True
    last_kill: float | None = None
    low_gib: float | None = None


@dataclass(frozen=True)
class Decision:
    kill: bool
    reason: str  # empty when there is nothing to say
    state: GuardState


def decide(avail_gib: float, floor_gib: float, running: bool | None, state: GuardState, now: float) -> Decision:
    """What to do for one sample. `running` is None when it was not asked (only needed below the floor).

    Kill when below the floor, the container runs, and the guard is armed. After a kill the guard disarms so the
    same low stretch does not kill again every 0.5 s; it re-arms once MemAvailable is back above floor + margin,
    or retries after RETRY_KILL_S if the container is still running (the kill did not take, or it was restarted
    while memory stayed low)."""
    low = avail_gib if state.low_gib is None else min(state.low_gib, avail_gib)
    state = replace(state, low_gib=low)
    if avail_gib >= floor_gib:
        if not state.armed and avail_gib >= floor_gib + REARM_MARGIN_GIB:
            return Decision(False, f"MemAvailable {avail_gib:.2f} GiB is back above {floor_gib + REARM_MARGIN_GIB:.2f}"
                                   " GiB: re-armed", replace(state, armed=True))
        return Decision(False, "", state)
    if not running:
        return Decision(False, "", state)
    overdue = state.last_kill is not None and now - state.last_kill >= RETRY_KILL_S
    if state.armed or overdue:
        why = (f"MemAvailable {avail_gib:.2f} GiB is below the floor of {floor_gib:.2f} GiB while the container runs"
               + ("" if state.armed or state.last_kill is None
                  else f" (still, {now - state.last_kill:.0f} s after the last kill)"))
        return Decision(True, why, replace(state, armed=False, last_kill=now))
    return Decision(False, "", state)


def mem_available_gib(path: str = "/proc/meminfo") -> float:
    with open(path, encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / KIB_PER_GIB
    raise RuntimeError(f"no MemAvailable in {path}")


MANAGED_LABEL = "sparkfold.managed"  # the label sparkfold's rank containers carry (operations/rank/spec.py)


def running_rank(name: str) -> tuple[str | None, bool]:
    """(container id, whether it runs) of `name` when it is sparkfold's rank; (None, False) when absent or stopped.
    A container by that name without the managed label is someone else's: (None, False) and a log line, never a
    kill. The kill goes to the id read here, so a container renamed in between is not hit."""
    fmt = "{{.Id}} {{.State.Running}} {{index .Config.Labels \"" + MANAGED_LABEL + "\"}}"
    result = subprocess.run(["docker", "inspect", "--type", "container", "-f", fmt, name],
                            capture_output=True, text=True, timeout=10)
    parts = result.stdout.split(maxsplit=2)  # a missing label prints "<no value>"
    if result.returncode != 0 or len(parts) != 3 or parts[1] != "true":
        return None, False
    if parts[2].strip() != "1":
        log(f"{name} runs but lacks the label {MANAGED_LABEL}=1: not sparkfold's, left alone")
        return None, False
    return parts[0], True


def log(message: str) -> None:
    print(f"memguard: {message}", file=sys.stderr, flush=True)


def write_low(path: str, low_gib: float) -> None:
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="ascii") as f:
            f.write(f"{low_gib:.2f} {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
    except OSError as e:
        log(f"cannot write {path}: {e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--container", required=True)
    parser.add_argument("--floor-gib", type=float, required=True)
    parser.add_argument("--state-file", default="/var/lib/sparkfold/memguard.low")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--meminfo", default="/proc/meminfo", help=argparse.SUPPRESS)  # for tests
    args = parser.parse_args(argv)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    log(f"watching {args.container}: kill below {args.floor_gib:.2f} GiB MemAvailable, every {args.interval} s")
    state, written = GuardState(), None
    while not stop:
        avail = mem_available_gib(args.meminfo)
        running, target = None, None
        if avail < args.floor_gib:
            try:
                target, running = running_rank(args.container)
            except (OSError, subprocess.SubprocessError) as e:
                log(f"docker inspect {args.container} failed: {e}")
        decision = decide(avail, args.floor_gib, running, state, time.monotonic())
        state = decision.state
        if decision.kill and target:
            log(f"docker kill {args.container}: {decision.reason}")
            result = subprocess.run(["docker", "kill", target], capture_output=True, text=True, timeout=30)
            if result.returncode != 0:
                log(f"docker kill failed: {result.stderr.strip()}")
        elif decision.reason:
            log(decision.reason)
        if state.low_gib is not None and (written is None or state.low_gib <= written - LOW_STEP_GIB):
            write_low(args.state_file, state.low_gib)
            written = state.low_gib
        time.sleep(args.interval)
    log(f"guard ends; lowest MemAvailable {state.low_gib:.2f} GiB" if state.low_gib is not None else "guard ends")
    return 0


if __name__ == "__main__":
    sys.exit(main())
