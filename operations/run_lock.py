"""One run at a time on each Spark: /var/lib/sparkfold/run.lock (root's, so two users or two state_dir settings
share it), taken by the first operation of a run and released by the last.

The lock records the run id, who runs it (user@controller and its pid), when it started, and the pid of the ssh
session the run holds open on that Spark. When that session is gone (the run ended without releasing, was killed, or
lost its connection), the lock is stale: the next run takes it over with a warning. The head is locked before the
worker, so of two runs started together exactly one proceeds.

Taking and releasing the lock is bookkeeping, not a change to the Spark: the operations run it through the
connection while executing and yield nothing, so a converged run still reports no changes.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
import uuid

from pyinfra import host, state
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation

from .layout import RUN_LOCK
from .settings import Settings
from .util import check_failed, sh, warned

RUN_ID = uuid.uuid4().hex[:12]  # one per controller process: both Sparks see the same run
HOLDER = f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"


class RunLock(FactBase[dict[str, str] | None]):
    """The lock file's fields ({"run", "holder", "since", "pid", "alive": "1"/"0"}), or None when there is none.
    alive is "1" while the ssh session that took it still exists (pid 0: not known, counted as alive)."""

    def command(self, path: str) -> StringCommand:
        p = QuoteString(path)
        return StringCommand(
            "if [ -f", p, "]; then cat", p, "; pid=$(sed -n 's/^pid=//p'", p, ");",
            'if [ "${pid:-0}" = 0 ] || [ -d "/proc/$pid" ]; then echo alive=1; else echo alive=0; fi; fi; true')

    def process(self, output: list[str]) -> dict[str, str] | None:
        fields = dict(line.split("=", 1) for line in output if "=" in line)
        return fields if "run" in fields else None


def _take_command(path: str) -> str:
    """Take the lock (as root) unless another live run holds it. flock serialises two runs that both found the lock
    free or stale, and the holder is read again under it, so only one of them writes."""
    # the ssh session process (sshd, or sshd-session on newer OpenSSH) lives as long as this run's connection
    find_session = ('p=$$; while [ "$p" -gt 1 ]; do case "$(cat /proc/$p/comm 2>/dev/null)" in '
                    'sshd|sshd-session) break;; esac; p=$(awk \'{print $4}\' /proc/$p/stat 2>/dev/null || echo 1); '
                    'done; [ "$p" -gt 1 ] || p=0')
    held = (f"if [ -f {sh(path)} ]; then r=$(sed -n 's/^run=//p' {sh(path)}); o=$(sed -n 's/^pid=//p' {sh(path)}); "
            f"if [ \"$r\" != {sh(RUN_ID)} ] && {{ [ \"${{o:-0}}\" = 0 ] || [ -d \"/proc/$o\" ]; }}; then "
            "echo 'held by another run' >&2; exit 1; fi; fi")
    write = (f"printf 'run=%s\\nholder=%s\\nsince=%s\\npid=%s\\n' {sh(RUN_ID)} {sh(HOLDER)} "
             f"{sh(time.strftime('%Y-%m-%dT%H:%M:%S%z'))} \"$p\" > {sh(path + '.tmp')} && "
             f"chmod 644 {sh(path + '.tmp')} && mv -f {sh(path + '.tmp')} {sh(path)}")
    return (f"{find_session}; mkdir -p {sh(os.path.dirname(path))} && exec 9>>{sh(path + '.guard')} && "
            f"flock -n 9 || {{ echo 'another run is taking the lock' >&2; exit 1; }}; {held}; {write}")


def holder_problem(path: str, lock: dict[str, str] | None) -> str | None:
    """The refusal while another live run holds the lock."""
    if not lock or lock.get("run") == RUN_ID or lock.get("alive") != "1":
        return None
    return (f"another sparkfold run holds {path}: {lock.get('holder', '?')}, run {lock.get('run')}, since "
            f"{lock.get('since', '?')}. Wait for it to end; if it is gone and this persists, remove {path}")


@operation()
def run_locked(path: str):
    """Take this Spark's run lock (while executing), or refuse because another live run holds it.
    Its is_executing branch stays: the lock is taken through the connection, not as a command a run would count."""
    lock = host.get_fact(RunLock, path=path)
    if (yield from check_failed("one run at a time", [holder_problem(path, lock)])):
        return
    if lock and lock.get("run") == RUN_ID:
        host.noop(f"this run holds {path}")
        return
    if lock is not None and lock.get("alive") != "1":
        warned("one run at a time", f"taking over the stale run lock {path} of {lock.get('holder')} (run "
                                    f"{lock.get('run')}, since {lock.get('since')}): that run is gone")
    if state.is_executing:
        ok, output = host.run_shell_command(StringCommand(_take_command(path)), _sudo=True)
        if not ok:  # another run took it between the read and the write
            again = host.get_fact(RunLock, path=path)
            yield from check_failed("one run at a time", [holder_problem(path, again) or
                                                          f"could not take {path}: {output.stderr}"])
            return
    host.noop(f"{path} taken for run {RUN_ID}")


@operation()
def run_unlocked(path: str):
    """Release this run's lock (while executing); a lock of another run is left alone.
    Its is_executing branch stays: the lock is removed through the connection, not as a command a run would count."""
    lock = host.get_fact(RunLock, path=path)
    if state.is_executing and lock and lock.get("run") == RUN_ID:
        host.run_shell_command(StringCommand(f"rm -f {sh(path)}"), _sudo=True)
    host.noop(f"{path} released")
    if False:  # an operation is a generator; this one changes nothing pyinfra should count
        yield


@deploy("One run at a time")
def locked(s: Settings) -> None:
    """The head's lock first, then the worker's: a second run refuses on the head and touches nothing."""
    if s.is_head:
        run_locked(name="the head's run lock", path=RUN_LOCK)
    if not s.is_head:
        run_locked(name="the worker's run lock", path=RUN_LOCK)


@deploy("Run lock released")
def unlocked(s: Settings) -> None:
    run_unlocked(name="this run's lock released", path=RUN_LOCK)
