"""The progress runner (operations/remote/progress.py), run for real as a Spark runs it: plain lines while a command
runs, the amount already there first, a failure's own output, the bytes of a relay, and an interrupted run taking
its work down with it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
from harness import unwrap_progress

from operations.image import BUILD_STEP
from operations.remote.progress_command import LiveCommand, progress_command


def start(command: LiveCommand, raw: bool = False) -> subprocess.Popen:
    """The runner in its own session; raw: bytes, so a carriage return stays visible (text mode turns it into a
    newline)."""
    return subprocess.Popen(["sh", "-c", command.get_raw_value()], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=not raw, start_new_session=True)


def test_lines_arrive_while_the_command_runs_and_say_what_was_there(tmp_path):
    (tmp_path / "old").write_bytes(b"x" * 2 * 1024 * 1024)
    slow = f"for i in 1 2 3 4 5 6; do head -c 1048576 /dev/zero >> {tmp_path}/new; sleep 0.4; done"
    run = start(progress_command("copy", slow, size_of=str(tmp_path), total=8 * 1024 * 1024, every=0.5), raw=True)
    assert run.stdout is not None
    arrivals = [(time.monotonic(), line.decode().rstrip("\n")) for line in run.stdout]
    assert run.wait() == 0
    lines = [text for _, text in arrivals]
    assert lines[0] == "copy: 2 MiB already there of 8 MiB"
    middle = [text for text in lines[1:-1] if " of 8 MiB (" in text and "elapsed" in text]
    assert len(middle) >= 2 and all("\r" not in text for text in lines)
    assert arrivals[-1][0] - arrivals[1][0] >= 1.0  # spread over the run, not printed at its end
    assert lines[-1].startswith("copy: done in ") and lines[-1].endswith("8 MiB")


def test_a_total_short_of_what_is_there_is_not_shown(tmp_path):
    # a folder holding more than was planned (a file the plan does not name): never "3 MiB already there of 1 MiB",
    # nor a last line below what was there
    amount = tmp_path / "bytes"
    amount.write_text(f"{3 * 2**20}\n")
    grow = f"sleep 1.2; echo {4 * 2**20} > {amount}"
    run = start(progress_command("copy", grow, probe=f"cat {amount}", total=2**20, every=0.5))
    out, err = run.communicate()
    lines = out.splitlines()
    assert run.returncode == 0, err
    assert lines[0] == "copy: 3 MiB already there"
    assert len(lines) >= 3 and all(" of " not in line for line in lines), lines
    assert lines[-1].startswith("copy: done in ") and lines[-1].endswith(", 3 MiB"), lines  # at least what was there


def test_a_failure_shows_the_commands_own_output_and_its_status():
    run = start(progress_command("fetch", "echo resolving; echo 'HTTP 403: gated' >&2; exit 3", every=0.5))
    out, err = run.communicate()
    assert run.returncode == 3 and out.splitlines()[0] == "fetch: started" and "done" not in out
    assert "fetch: failed after" in err and "resolving" in err and "HTTP 403: gated" in err


def test_a_relay_counts_the_bytes_it_passes(tmp_path):
    sink = tmp_path / "received"
    run = start(progress_command("ship", relay=("head -c 3000000 /dev/zero", f"cat > {sink}"), total=3000000,
                                 every=10))
    out, _ = run.communicate()
    assert run.returncode == 0 and sink.stat().st_size == 3000000 and out.splitlines()[-1].endswith("3 MiB")


@pytest.mark.parametrize("step", ["Step $i/3 : RUN make", "#$i [$i/3] RUN make"])  # the classic builder, BuildKit
def test_the_newest_build_step_is_shown(step):
    # the build redraws a line with carriage returns; the runner's own lines never carry one
    # step 3 stays the newest for a few of the runner's ticks (a loaded machine's ticks come late)
    build = f"for i in 1 2 3; do echo \"{step}\"; printf 'noise\\r'; sleep 0.6; done; sleep 1.5"
    run = start(progress_command("build", build, latest=BUILD_STEP, every=0.5), raw=True)
    out, _ = run.communicate()
    assert b"\r" not in out and run.returncode == 0
    steps = [line for line in out.decode().split("\n") if "RUN make" in line]
    assert steps and steps[-1].startswith("build: " + step.replace("$i", "3"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a child of a process gone before it lingers as a zombie until reaped: it no longer runs
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_interrupted_run_takes_its_work_down(tmp_path):
    # the work is a minute long and says its pid: gone within seconds of the interrupt, it was taken down (no
    # fixed wait for a command to finish or not)
    marker, pid_file = tmp_path / "finished", tmp_path / "pid"
    for interrupt in ("reader gone", "hangup"):
        marker.unlink(missing_ok=True)
        pid_file.unlink(missing_ok=True)
        run = start(progress_command("copy", f"sleep 60 & echo $! > {pid_file}; wait; touch {marker}", every=0.3))
        assert run.stdout is not None and run.stdout.readline().startswith("copy: started")
        deadline = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline, "the work never started"
            time.sleep(0.02)
        work = int(pid_file.read_text())
        if interrupt == "reader gone":
            run.stdout.close()  # the ssh connection that read it closed
        else:
            os.killpg(run.pid, signal.SIGHUP)  # the session's processes, as a closing terminal would
        deadline = time.monotonic() + 30
        while _alive(work):
            assert time.monotonic() < deadline, f"{interrupt}: the command went on after the run was gone"
            time.sleep(0.05)
        run.wait(timeout=30)
        assert not marker.exists(), f"{interrupt}: the command ran on past its work"


def test_an_interrupted_run_leaves_no_log_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the runner keeps the command's output while it runs
    for interrupt in ("reader gone", "hangup"):
        run = start(progress_command("copy", "sleep 60", every=0.3))
        assert run.stdout is not None and run.stdout.readline().startswith("copy: started")
        assert [p.name.startswith("sparkfold-progress-") for p in tmp_path.iterdir()] == [True]
        if interrupt == "reader gone":
            run.stdout.close()
        else:
            os.killpg(run.pid, signal.SIGHUP)
        deadline = time.monotonic() + 30
        while any(tmp_path.iterdir()):  # the runner's last act: it may outlive the shell that started it
            assert time.monotonic() < deadline, f"{interrupt}: the log was left behind"
            time.sleep(0.05)
        run.wait(timeout=30)


def test_the_wrapper_names_what_it_runs():
    wrapped = progress_command("kit", "rsync -a a/ b:c/", probe="du -sb c", every=10).get_raw_value()
    label, inner, options = unwrap_progress(wrapped)
    assert (label, inner) == ("kit", "rsync -a a/ b:c/") and options[options.index("--probe") + 1] == "du -sb c"


def test_a_relay_whose_receiver_fails_ends_instead_of_hanging():
    run = start(progress_command("ship", relay=("yes", "head -c 10 >/dev/null; exit 5"), every=0.5))
    try:
        out, _ = run.communicate(timeout=20)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode != 0 and "ship: started" in out


def test_sizes_below_a_mib_are_in_kib():
    from operations.remote.progress import size
    assert (size(20 * 1024), size(3 * 1024**2), size(1.5 * 1024**3)) == ("20 KiB", "3 MiB", "1.5 GiB")


def test_a_folders_own_entries_over_the_total_still_read_as_all_of_it():
    from operations.remote.progress import amount_line
    # du counts a folder's own entries: a few KiB over the files' total is still "24 MiB of 24 MiB"
    assert amount_line("copy", 24 * 2**20 + 8192, 24 * 2**20, 0, 10).startswith("copy: 24 MiB of 24 MiB (100 %), ")
    assert amount_line("copy", 24 * 2**20, 19 * 1024, 0, 10).startswith("copy: 24 MiB, ")  # never "of 19 KiB"


SLOW_SHA256SUM = '''#!/usr/bin/env python3
"""sha256sum as a large folder makes it look: it reads in small steps, slowly (its reads are its own, as the
runner's probe expects). Knows `-- FILES` and `-c --quiet LIST`."""
import hashlib, sys, time

def digest(name):
    h = hashlib.sha256()
    with open(name, "rb") as f:
        while chunk := f.read(65536):
            h.update(chunk)
            time.sleep(0.02)
    return h.hexdigest()

args = sys.argv[1:]
if args[0] == "-c":
    bad = [n for d, n in (line.split("  ", 1) for line in open(args[-1]).read().splitlines()) if digest(n) != d]
    for n in bad:
        print(f"{n}: FAILED")
    sys.exit(1 if bad else 0)
for name in args[1:]:
    print(f"{digest(name)}  {name}")
'''


def read_kib(line: str) -> float:
    """The first amount of a progress line ('tables: hashing: 3 MiB of ...'), in KiB."""
    m = re.search(r": ([\d.]+) ([KMG]iB)", line)
    assert m, line
    return float(m.group(1)) * {"KiB": 1, "MiB": 1024, "GiB": 1024**2}[m.group(2)]


def test_hashing_reports_the_bytes_read_and_a_failed_check_says_so(tmp_path, monkeypatch):
    from operations.data.copy import hashing_command

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the runner makes its private folder
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "sha256sum").write_text(SLOW_SHA256SUM)
    (tools / "sha256sum").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a.bin", "b.bin"):
        (data / name).write_bytes(os.urandom(1024 * 1024))
    run = start(hashing_command("tables: hashing", str(data), "sha256sum -- a.bin b.bin > SUMS", 2 * 1024**2,
                                every=0.3), raw=True)
    out, _ = run.communicate()
    lines = out.decode().splitlines()
    assert run.returncode == 0 and lines[0] == "tables: hashing: started"  # nothing "already there"
    # the bytes read so far (the stand-in's own reads of its interpreter count too: past 2 MiB the total is left out)
    middle = [line for line in lines[1:-1] if re.search(r": [\d.]+ [KMG]iB", line)]
    assert middle and all(0 < read_kib(line) for line in middle), lines
    assert all(read_kib(line) <= 2048 for line in middle if " of 2 MiB (" in line), lines
    assert lines[-1].startswith("tables: hashing: done in ") and (data / "SUMS").read_text().count("\n") == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("sparkfold-private-")]  # removed at the end
    # a file that changed: the check fails with the complaint and the failing name
    (data / "b.bin").write_bytes(b"changed")
    run = start(hashing_command("tables: checking", str(data), "sha256sum -c --quiet SUMS", 2 * 1024**2,
                                complaint="tables do not match: copy again", every=0.3))
    out, err = run.communicate()
    assert run.returncode == 1 and "b.bin: FAILED" in err and "tables do not match: copy again" in err


def test_the_hashing_pid_file_is_in_a_private_folder_and_a_planted_link_is_not_followed(tmp_path, monkeypatch):
    """The pid file once had a name in /tmp anyone could compute from the folder: a link planted there was written
    through (as root: any file). Now it lives in the runner's fresh 0700 folder, removed at the end."""
    import hashlib

    from operations.data.copy import hashing_command

    data, private, tools = tmp_path / "data", tmp_path / "tmpdir", tmp_path / "bin"
    for folder in (data, private, tools):
        folder.mkdir()
    (data / "a.bin").write_bytes(b"x" * 4096)
    # sha256sum (exec'd by the shell that wrote its pid down) notes the folder it was given, its mode, the pid file
    seen = tmp_path / "seen"
    real = subprocess.run(["sh", "-c", "command -v sha256sum"], capture_output=True, text=True).stdout.strip()
    (tools / "sha256sum").write_text(f'#!/bin/sh\nd="$SPARKFOLD_PRIVATE_DIR"\n'
                                     f'echo "$d $(stat -c %a "$d") $(cat "$d/hashing.pid") $$" > {seen}\n'
                                     f'exec {real} "$@"\n')
    (tools / "sha256sum").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.setenv("TMPDIR", str(private))  # where the runner makes its folder
    victim = tmp_path / "victim"
    victim.write_text("a file the link points at\n")
    old_name = f"/tmp/sparkfold-hashing-{hashlib.sha256(str(data).encode()).hexdigest()[:16]}.pid"
    command = hashing_command("tables: hashing", str(data), "sha256sum -- a.bin > SUMS", 4096, every=0.2)
    label, inner, options = unwrap_progress(command.get_raw_value())
    assert "/tmp/sparkfold-hashing-" not in inner + " ".join(options) and "--private-dir" in options
    os.symlink(victim, old_name)  # planted by another user, at the name the old code computed
    try:
        run = start(command)
        out, err = run.communicate()
        assert victim.read_text() == "a file the link points at\n" and os.path.islink(old_name)
    finally:
        if os.path.lexists(old_name):
            os.unlink(old_name)
    assert run.returncode == 0, err
    assert (data / "SUMS").read_text().endswith("  a.bin\n")
    folder, mode, written, pid = seen.read_text().split()
    assert folder.startswith(f"{private}/sparkfold-private-") and mode == "700" and written == pid
    assert list(private.iterdir()) == []  # removed at the end


def test_beside_an_amount_only_the_matched_text_of_the_newest_line_is_shown(tmp_path):
    from operations.model_data import FILES_WHOLE

    fetch = ("for i in 1 2 3 4; do head -c 1048576 /dev/zero >> " + str(tmp_path) + "/f$i; "
             "echo \"sparkfold: Org/M: 1 of 4 GiB fetched, $i of 4 files whole\" >&2; sleep 0.4; done")
    run = start(progress_command("download", fetch, size_of=str(tmp_path), total=4 * 1024**2, latest=FILES_WHOLE,
                                 every=0.5), raw=True)
    out, _ = run.communicate()
    lines = out.decode().splitlines()
    middle = [line for line in lines if " of 4 MiB (" in line]
    assert run.returncode == 0 and middle, lines
    assert all(re.search(r"elapsed, [1-4] of 4 files whole$", line) for line in middle), middle


def test_the_wait_between_lines_ends_with_the_command():
    from operations.remote.progress import wait_a_little
    proc = subprocess.Popen(["sleep", "0.3"])
    start = time.monotonic()
    wait_a_little(proc, 60)  # returns when the command ends, not after the minute
    assert proc.poll() == 0 and time.monotonic() - start < 30
    wait_a_little(proc, 60)  # an ended command: no wait at all
    wait_a_little(None, 60)
