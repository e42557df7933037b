"""Run a long command on a Spark and print one progress line every --every seconds while it runs.

pyinfra shows a command's output only at the end unless asked (operations/remote/progress_command.LiveCommand asks), and
tools such as rsync redraw one line with carriage returns. This runner keeps the command's own output in a log
(shown when it fails) and prints plain lines of its own: what is done of the total, the rate and the time left
(--size-of a folder, or --probe a command that prints a byte count, e.g. what a hashing has read), the newest
line matching --latest (a build step), or the bytes it relays itself (--relay FROM TO: FROM's stdout into TO's
stdin, e.g. docker save | docker load).
The first line says how much was already there, so a resumed download or copy says so.
--private-dir gives the command and the probe a folder of their own ($SPARKFOLD_PRIVATE_DIR: a fresh name, mode
0700, removed at the end) for what they share, e.g. a pid file: never a name in /tmp that anyone can compute.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

GIB = 1024**3
PRIVATE_DIR_ENV = "SPARKFOLD_PRIVATE_DIR"
STOP_GRACE_S = 25  # a stopped command's group ends within this, or is killed (stream_runner.WORK_STOP_S is longer)


def folder_bytes(path: str) -> int:
    """Bytes of the regular files under `path` (symlinks not followed; 0 when absent)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                file_stat = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, name)):
                total += file_stat.st_size
    return total


def probe_bytes(command: str) -> int | None:
    try:
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60).stdout.split()
        return int(out[0]) if out else None
    except (subprocess.SubprocessError, ValueError, OSError):
        return None


def size(n: float) -> str:
    # KiB below a MiB: a small resumed file must not read "0 MiB already there"
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 1024**2:.0f} MiB" if n >= 1024**2 else f"{n / 1024:.0f} KiB"


def clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min" if seconds >= 3600 else \
        f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def of_total(done: int, total: int) -> int:
    """The total to show beside `done`: none when it is short of what is there (the folder holds more than was
    planned, e.g. a file the plan does not name), as "24 MiB of 19 KiB" would mean nothing. A few bytes over it
    (a folder's own entries) still read "24 MiB of 24 MiB"."""
    return total if done <= total or size(done) == size(total) else 0


def amount_line(label: str, done: int, total: int, start_bytes: int, elapsed: float) -> str:
    """'<label>: 12.3 of 196.0 GiB (6 %), 250 MiB/s, about 12 min left, 3 min 10 s elapsed'."""
    total = of_total(done, total)
    parts = [size(done) + (f" of {size(total)} ({min(100 * done // total, 100)} %)" if total else "")]
    rate = (done - start_bytes) / elapsed if elapsed > 0 else 0
    if rate > 0:
        parts.append(f"{rate / 1024**2:.0f} MiB/s")
        if total > done:
            parts.append(f"about {clock((total - done) / rate)} left")
    parts.append(f"{clock(elapsed)} elapsed")
    return f"{label}: " + ", ".join(parts)


class Gone(Exception):
    """The run that started us is gone (its connection closed): stop the work instead of finishing unseen."""


def say(line: str) -> None:
    try:
        print(line, flush=True)
    except (BrokenPipeError, OSError):
        raise Gone() from None


def _group_runs(proc: subprocess.Popen) -> bool:
    proc.poll()  # reaps the group's leader once it has ended: a zombie is no work
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(*procs: subprocess.Popen | None) -> None:
    """End commands and everything they started (rsync and its ssh, docker save, a tool's `docker run`): TERM to
    each one's process group, then wait until nothing of them runs, KILL after STOP_GRACE_S. Returns only then, so
    a stream stopped for a restart never leaves a tool finishing beside the new one (stream_runner waits for this
    program in turn)."""
    groups = [proc for proc in procs if proc is not None]
    for proc in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while running := [proc for proc in groups if _group_runs(proc)]:
        if time.monotonic() >= deadline:
            for proc in running:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            return
        time.sleep(0.1)


class Relay:
    """FROM's stdout copied into TO's stdin, counting the bytes."""

    def __init__(self, source: str, sink: str):
        self.bytes = 0
        self.src = subprocess.Popen(["sh", "-c", source], stdout=subprocess.PIPE, start_new_session=True)
        self.dst = subprocess.Popen(["sh", "-c", sink], stdin=subprocess.PIPE, start_new_session=True)
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        assert self.src.stdout and self.dst.stdin
        try:
            while chunk := self.src.stdout.read(1 << 20):
                self.dst.stdin.write(chunk)
                self.bytes += len(chunk)
            self.dst.stdin.close()
        except OSError:  # TO ended early (docker load failed, ssh refused): FROM must not wait on a full pipe
            stop_group(self.src)

    def stop(self) -> None:
        stop_group(self.src, self.dst)

    def poll(self) -> int | None:
        if self.thread.is_alive() or self.dst.poll() is None or self.src.poll() is None:
            return None
        return self.dst.returncode or self.src.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run a long command, printing a progress line every --every seconds")
    parser.add_argument("label")
    parser.add_argument("command", nargs="?", default="", help="the shell command to run (not with --relay)")
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--size-of", help="a folder whose size is the progress")
    parser.add_argument("--probe", help="a shell command printing the bytes done")
    parser.add_argument("--total", type=int, default=0, help="bytes when done")
    parser.add_argument("--own-work", action="store_true",
                        help="the probe counts the command's own work (bytes it has read): nothing was there before it")
    parser.add_argument("--latest", help="a regex: show the newest output line that matches (beside an amount: "
                                         "only the matched text, e.g. a file count)")
    parser.add_argument("--relay", nargs=2, metavar=("FROM", "TO"))
    parser.add_argument("--private-dir", action="store_true",
                        help=f"a fresh folder only this user can enter, named in ${PRIVATE_DIR_ENV} for the command "
                             "and the probe; removed at the end")
    args = parser.parse_args(argv)
    # mkdtemp: a random name, made with mkdir (so never an existing folder or symlink), mode 0700
    private = tempfile.mkdtemp(prefix="sparkfold-private-") if args.private_dir else None
    if private:
        os.environ[PRIVATE_DIR_ENV] = private  # inherited by the command and every probe
    try:
        return run(args)
    finally:
        if private:
            shutil.rmtree(private, ignore_errors=True)


def run(args: argparse.Namespace) -> int:

    # what was there is measured before the command starts, so none of its own first writes count as "there"
    first = None if args.own_work or args.relay else measure_there(args)
    log = tempfile.NamedTemporaryFile("w+", prefix="sparkfold-progress-", delete=False)
    relay = Relay(*args.relay) if args.relay else None
    proc = None if relay else subprocess.Popen(["sh", "-c", args.command], stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)

    def stop(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop at a time: a second TERM does not cut the wait
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if relay:
            relay.stop()
        stop_group(proc)
        sys.exit(1)

    # a run that is interrupted (its connection closed: SIGHUP, or a print that finds no reader) takes its work
    # down with it, so a later run never races a copy or a download left running unseen
    signal.signal(signal.SIGHUP, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        return watch(args, relay, proc, log.name, first)
    except Gone:
        stop()
    finally:  # an interrupted run too: stop's exit passes here
        os.unlink(log.name)
    return 1


def wait_a_little(last: subprocess.Popen | None, seconds: float) -> None:
    """Up to `seconds`, ended early by the end of `last` (the command, or a relay's sink): a finished step costs no
    extra half second."""
    if last is None or last.poll() is not None:
        time.sleep(0.05)  # it ended: the relay's copy thread or source is a moment behind
        return
    try:
        last.wait(seconds)
    except subprocess.TimeoutExpired:
        pass


def measure_there(args: argparse.Namespace) -> int | None:
    if args.size_of:
        return folder_bytes(args.size_of)
    return probe_bytes(args.probe) if args.probe else None


def watch(args: argparse.Namespace, relay: Relay | None, proc: subprocess.Popen | None, log_name: str,
          first: int | None) -> int:
    """Print the progress lines until the command ends (`first`: the bytes there before it started); its exit
    status."""

    def measure() -> int | None:
        return relay.bytes if relay is not None else measure_there(args)

    start, pattern, latest = time.monotonic(), re.compile(args.latest) if args.latest else None, ""
    measuring = bool(relay or args.size_of or args.probe)
    start_bytes = first or 0
    if first:
        total = of_total(first, args.total)
        say(f"{args.label}: {size(first)} already there" + (f" of {size(total)}" if total else ""))
    else:
        say(f"{args.label}: started")
    next_line = start + args.every
    while True:
        rc = relay.poll() if relay else proc.poll() if proc else 0
        if rc is not None:
            break
        wait_a_little(relay.dst if relay else proc, 0.5)
        now = time.monotonic()
        if now < next_line:
            continue
        next_line = now + args.every
        if pattern:
            with open(log_name, errors="replace") as f:
                for line in f.read().replace("\r", "\n").splitlines():
                    if pattern.search(line):
                        latest = line.strip()
        if pattern and not measuring:
            say(f"{args.label}: {latest or 'starting'} ({clock(now - start)} elapsed)")
            continue
        done = measure()
        text = f"{args.label}: {clock(now - start)} elapsed" if done is None else \
            amount_line(args.label, done, args.total, start_bytes, now - start)
        found = pattern.search(latest) if pattern and latest else None
        say(text + (f", {found.group(0)}" if found else ""))  # beside an amount, only what the pattern matched
    elapsed = time.monotonic() - start
    with open(log_name, errors="replace") as f:
        tail = f.read().replace("\r", "\n").splitlines()[-30:]
    if rc != 0:
        print(f"{args.label}: failed after {clock(elapsed)}; its last output:", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr)
        return rc
    # a probe over ssh would cost the run one more round trip: a command that succeeded has all of --total there,
    # and what was there before (more than the total when the folder holds more than was planned)
    done = max(args.total, first or 0) if args.probe and args.total else measure()
    say(f"{args.label}: done in {clock(elapsed)}" + (f", {size(done)}" if done else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
