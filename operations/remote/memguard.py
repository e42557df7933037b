#!/usr/bin/env python3
# Managed by sparkfold: edits are replaced on the next deploy.
"""sparkfold memguard: kill this Spark's rank container before unified memory runs out.

On GB10 the weights live in driver allocations the kernel OOM killer cannot see, so running out of memory wedges
the box instead of failing an allocation. Every 0.5 s this reads MemAvailable. While memory is plentiful it asks
docker every few seconds which container is the rank and finds that container's cgroup v2 folder; below the floor
it kills the rank by writing 1 to that folder's cgroup.kill (Linux 5.14+), so the kill does not wait on dockerd
when the box is short of memory. Without the folder or the file it runs `docker kill`. It logs what it killed and
how, and keeps the lowest MemAvailable seen in a state file. Stdlib only; logs go to stderr (the journal under
systemd).

    memguard.py --container NAME --floor-gib GIB [--state-file PATH] [--interval S]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace

KIB_PER_GIB = 1024 * 1024
REARM_MARGIN_GIB = 1.0  # after a kill, memory must climb this far above the floor before the guard re-arms
RETRY_KILL_S = 10.0  # a kill that did not take (container still running, still below) is retried after this
LOW_STEP_GIB = 0.05  # the low-water file is rewritten only when the mark drops by at least this much
LOOK_EVERY_S = 5.0  # above the floor, docker is asked this often whether the rank was started or recreated
CGROUP_KILL = "cgroup.kill"  # writing 1 SIGKILLs every process of the cgroup (Linux 5.14+)


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


# --- the rank's cgroup --------------------------------------------------------------------------------------

def cgroup_v2_path(proc_cgroup: str) -> str | None:
    """The cgroup v2 path in a /proc/<pid>/cgroup text (its `0::` line; cgroup v1 hierarchies have other lines)."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)  # mountinfo writes " " as \040


def cgroup2_mounts(mountinfo: str) -> list[tuple[str, str]]:
    """(root, mount point) of each cgroup2 mount in a /proc/self/mountinfo text. Both a /proc/<pid>/cgroup path and
    a mount's root are relative to the reader's cgroup namespace, so a path lies under a mount when the mount's
    root is a prefix of it (the root is `/..` style when a container sees its host's tree)."""
    mounts = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and len(fields) >= 5 and right.split()[:1] == ["cgroup2"]:
            mounts.append((_unescape(fields[3]), _unescape(fields[4])))
    return mounts


def cgroup_dirs(path: str, mounts: list[tuple[str, str]]) -> list[str]:
    """Where the cgroup `path` lies in each mount that holds it (pure; the caller checks which one is right)."""
    parts = [p for p in path.split("/") if p]
    dirs = []
    for root, point in mounts:
        root_parts = [p for p in root.split("/") if p]
        rest = parts[len(root_parts):]
        if parts[:len(root_parts)] == root_parts and ".." not in rest:
            dirs.append(os.path.join(point, *rest))
    return dirs


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def find_cgroup(pid: int, proc: str = "/proc") -> str:
    """The cgroup v2 folder of `pid`, checked by its cgroup.procs listing the pid; LookupError says why not."""
    try:
        path = cgroup_v2_path(_read(f"{proc}/{pid}/cgroup"))
        mounts = cgroup2_mounts(_read(f"{proc}/self/mountinfo"))
    except OSError as e:
        raise LookupError(f"cannot read pid {pid}'s cgroup: {e.strerror or e}") from e
    if path is None or not mounts:
        raise LookupError("no cgroup v2 hierarchy here")
    for folder in cgroup_dirs(path, mounts):
        try:
            if str(pid) in _read(os.path.join(folder, "cgroup.procs")).split():
                return folder
        except OSError:
            continue
    raise LookupError(f"no mounted cgroup v2 folder of {path} lists pid {pid}")


def cgroup_runs(cgroup: str) -> bool | None:
    """Whether the cgroup still holds a process (its cgroup.events), read without dockerd; None once it is gone."""
    try:
        return "populated 1" in _read(os.path.join(cgroup, "cgroup.events")).splitlines()
    except OSError:
        return None


def cgroup_kill(cgroup: str) -> str | None:
    """Kill every process of the cgroup through its cgroup.kill: None when written, else why not (the caller then
    asks docker)."""
    path = os.path.join(cgroup, CGROUP_KILL)
    try:
        fd = os.open(path, os.O_WRONLY)  # never O_CREAT: only the kernel's file kills
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
        return None
    except FileNotFoundError:
        if not os.path.isdir(cgroup):
            return f"its cgroup {cgroup} is gone"
        return f"{cgroup} has no {CGROUP_KILL} (Linux before 5.14)"
    except OSError as e:
        return f"writing {path} failed: {e.strerror or e}"


# --- the rank container ---------------------------------------------------------------------------------------

MANAGED_LABEL = "sparkfold.managed"  # the label sparkfold's rank containers carry (operations/rank/spec.py)


@dataclass(frozen=True)
class Rank:
    """The running container by the rank's name, as docker last showed it."""
    id: str
    pid: int
    managed: bool  # carries sparkfold's label; another container by that name is never killed
    cgroup: str | None = None  # its cgroup v2 folder, found while memory was plentiful; None: killed through docker


def inspect_rank(name: str) -> Rank | None:
    """The running container called `name` (without its cgroup); None when absent or stopped."""
    fmt = "{{.Id}} {{.State.Running}} {{.State.Pid}} {{index .Config.Labels \"" + MANAGED_LABEL + "\"}}"
    result = subprocess.run(["docker", "inspect", "--type", "container", "-f", fmt, name],
                            capture_output=True, text=True, timeout=10)
    parts = result.stdout.split(maxsplit=3)  # a missing label prints "<no value>"
    if result.returncode != 0 or len(parts) != 4 or parts[1] != "true" or not parts[2].isdigit():
        return None
    return Rank(parts[0], int(parts[2]), managed=parts[3].strip() == "1")


def look(name: str, known: Rank | None, proc: str = "/proc") -> Rank | None:
    """The rank container now, its cgroup found once per container (a recreated one has a new id, a restarted one
    a new pid). The kill goes to what is found here, so a container renamed in between is not hit."""
    seen = inspect_rank(name)
    if seen is None:
        return None
    if known is not None and (known.id, known.pid) == (seen.id, seen.pid):
        return known
    short = seen.id[:12]
    if not seen.managed:
        log(f"{name} runs but lacks the label {MANAGED_LABEL}=1: not sparkfold's, left alone")
        return seen
    try:
        cgroup = find_cgroup(seen.pid, proc)
    except LookupError as e:
        log(f"{name} is {short} (pid {seen.pid}); {e}: below the floor it is killed via docker kill")
        return seen
    how = CGROUP_KILL if os.path.exists(os.path.join(cgroup, CGROUP_KILL)) else "docker kill (Linux before 5.14)"
    log(f"{name} is {short} (pid {seen.pid}) in {cgroup}: below the floor it is killed via {how}")
    return replace(seen, cgroup=cgroup)


def kill_rank(name: str, rank: Rank, reason: str, through_docker: bool) -> None:
    """Kill the rank through its cgroup, or through docker when that cannot (or a cgroup kill did not take), and
    log what was killed and how."""
    short = rank.id[:12]
    if through_docker:
        why_not: str | None = "the cgroup kill did not take"
    elif rank.cgroup is None:
        why_not = "its cgroup was not found"
    else:
        why_not = cgroup_kill(rank.cgroup)
    if why_not is None:
        log(f"killed {name} {short} via {CGROUP_KILL} ({rank.cgroup}): {reason}")
        return
    result = subprocess.run(["docker", "kill", rank.id], capture_output=True, text=True, timeout=30)
    if result.returncode == 0:
        log(f"killed {name} {short} via docker kill ({why_not}): {reason}")
    else:
        log(f"docker kill {name} {short} failed ({why_not}): {result.stderr.strip()}; {reason}")


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
    parser.add_argument("--proc", default="/proc", help=argparse.SUPPRESS)  # for tests: pids' cgroups, mountinfo
    args = parser.parse_args(argv)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    log(f"watching {args.container}: kill below {args.floor_gib:.2f} GiB MemAvailable, every {args.interval} s")
    state, written = GuardState(), None
    rank: Rank | None = None
    looked: float | None = None
    last_killed: Rank | None = None
    while not stop:
        avail = mem_available_gib(args.meminfo)
        now = time.monotonic()
        low = avail < args.floor_gib
        # below the floor the rank's cgroup answers; dockerd is asked only when that cannot
        running = cgroup_runs(rank.cgroup) if low and rank is not None and rank.cgroup else None
        if (low and running is None) or (not low and (looked is None or now - looked >= LOOK_EVERY_S)):
            try:
                rank = look(args.container, rank, args.proc)
                running = rank is not None and rank.managed
            except (OSError, subprocess.SubprocessError) as e:
                log(f"docker inspect {args.container} failed: {e}")
            looked = now
        decision = decide(avail, args.floor_gib, running, state, now)
        state = decision.state
        if decision.kill and rank:
            kill_rank(args.container, rank, decision.reason, through_docker=rank == last_killed)
            last_killed = rank
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
