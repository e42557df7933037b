"""One run at a time on each Spark: /var/lib/sparkfold/run.lock (root's, so two users or two state_dir settings
share it), taken by the first operation of a run and released by the last.

The lock records the run id, who runs it (user@controller and its pid), when it started, and a process on that Spark
that lives as long as the run's connection (its pid, its start time and the boot it belongs to: see
_take_command). When that process is gone (the run ended without releasing, was killed, or lost its connection),
or the pid now names another process (a reboot, or a pid reused), the lock is stale: the next run takes it over
with a warning. The head is locked before the worker, so of two runs started together exactly one proceeds.

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
from pyinfra.api import FactBase, StringCommand, deploy, operation

from operations.layout import BOOT_ID, RUN_LOCK
from operations.settings import Settings
from operations.util import check_failed, sh, warned
from operations.util.session import FIND_SESSION, STAT_FUNCTIONS

RUN_ID = uuid.uuid4().hex[:12]  # one per controller process: both Sparks see the same run
HOLDER = f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"
_STAT = STAT_FUNCTIONS  # start_of and stat_field (operations/util/session.py)
# "1" when the lock's recorded process still runs: $o pid, $b boot id, $t start time (an older lock records no
# boot id or start time: its pid alone decides); pid 0 or none is never alive. The one rule: the fact reports its
# verdict, and a take judges the holder with it
_JUDGE = ('alive=0; case "$o" in ""|0|*[!0-9]*) ;; *) if [ -z "$b" ] || [ "$b" = "$(cat ' + BOOT_ID +
          ' 2>/dev/null)" ]; then n=$(start_of "$o"); if [ -n "$n" ] && { [ -z "$t" ] || [ "$t" = "$n" ]; }; then '
          'alive=1; fi; fi;; esac')


def _judged(path: str) -> str:
    """Shell (after _STAT, with the lock at `path` present): its run, pid, boot and start read into $r $o $b $t,
    then $alive set by _JUDGE."""
    field = "sed -n 's/^{}=//p' " + sh(path)
    return (f"r=$({field.format('run')}); o=$({field.format('pid')}); b=$({field.format('boot')}); "
            f"t=$({field.format('start')}); {_JUDGE}")


class RunLock(FactBase[dict[str, str] | None]):
    """The lock file's fields ({"run", "holder", "since", "pid", "boot", "start", "alive": "1"/"0"}), or None when
    there is none. alive is _JUDGE's verdict, read on the Spark: "1" while the process it records still runs."""

    def command(self, path: str) -> StringCommand:
        # echo: a lock without its last newline still ends its last line before the verdict
        return StringCommand(f"{_STAT}if [ -f {sh(path)} ]; then cat {sh(path)}; echo; {_judged(path)}; "
                             "echo \"alive=$alive\"; fi; true")

    def process(self, output: list[str]) -> dict[str, str] | None:
        fields = dict(line.split("=", 1) for line in output if "=" in line)  # the verdict comes last, so it wins
        if "run" not in fields:
            return None
        return dict(fields, alive="1" if fields.get("alive") == "1" else "0")


def _take_command(path: str) -> str:
    """Take the lock (as root) unless another live run holds it. flock serialises two runs that both found the lock
    free or stale, and the holder is read again under it, so only one of them writes.

    The process recorded ($p): the ssh session's own process (sshd, sshd-session on newer OpenSSH, dropbear), which
    lives as long as the run's connection; without one (Tailscale SSH serves each command from its daemon), the
    outermost ancestor of this shell below init (the daemon that took the connection: the lock then lasts until a
    reboot or that daemon's restart, or until this run releases it). Never pid 0. With it its start time and the
    boot id, so a pid reused after a reboot or by another process does not keep the lock."""
    find_session = FIND_SESSION
    held = (f"if [ -f {sh(path)} ]; then {_judged(path)}; "
            f"if [ \"$r\" != {sh(RUN_ID)} ] && [ $alive = 1 ]; then echo 'held by another run' >&2; exit 1; fi; fi")
    write = (f"printf 'run=%s\\nholder=%s\\nsince=%s\\npid=%s\\nboot=%s\\nstart=%s\\n' {sh(RUN_ID)} {sh(HOLDER)} "
             f"{sh(time.strftime('%Y-%m-%dT%H:%M:%S%z'))} \"$p\" \"$(cat {BOOT_ID})\" \"$(start_of $p)\" "
             f"> {sh(path + '.tmp')} && chmod 644 {sh(path + '.tmp')} && mv -f {sh(path + '.tmp')} {sh(path)}")
    return (f"{_STAT}{find_session}; mkdir -p {sh(os.path.dirname(path))} && exec 9>>{sh(path + '.guard')} && "
            f"flock -n 9 || {{ echo 'another run is taking the lock' >&2; exit 1; }}; {held}; {write}")


def holder_problem(path: str, lock: dict[str, str] | None) -> str | None:
    """The refusal while another live run holds the lock."""
    if not lock or lock.get("run") == RUN_ID or lock.get("alive") != "1":
        return None
    return (f"another sparkfold run holds {path}: {lock.get('holder', '?')}, run {lock.get('run')}, since "
            f"{lock.get('since', '?')}. Wait for it to end; if it is gone and this persists, remove {path}")


@operation()
def run_locked(path: str):
    """Take this Spark's run lock (while executing), or refuse because another live run holds it."""
    lock = host.get_fact(RunLock, path=path)
    if (yield from check_failed("one run at a time", [holder_problem(path, lock)])):
        return
    if lock and lock.get("run") == RUN_ID:
        host.noop(f"this run holds {path}")
        return
    if lock is not None and lock.get("alive") != "1":
        warned("one run at a time", f"taking over the stale run lock {path} of {lock.get('holder')} (run "
                                    f"{lock.get('run')}, since {lock.get('since')}): that run is gone")
    # why: the lock is taken through the connection while executing, not as a command a run would count
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
    """Release this run's lock (while executing); a lock of another run is left alone."""
    lock = host.get_fact(RunLock, path=path)
    # why: the lock is removed through the connection while executing, not as a command a run would count
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
