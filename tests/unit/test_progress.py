"""The progress runner (operations/remote/progress.py), run for real as a Spark runs it: plain lines while a command
runs, the amount already there first, a failure's own output, the bytes of a relay, and an interrupted run taking
its work down with it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from harness import unwrap_progress

from operations.util.progress import LiveCommand, progress_command


def start(command: LiveCommand) -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", command.get_raw_value()], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def test_lines_arrive_while_the_command_runs_and_say_what_was_there(tmp_path):
    (tmp_path / "old").write_bytes(b"x" * 2 * 1024 * 1024)
    slow = f"for i in 1 2 3 4 5 6; do head -c 1048576 /dev/zero >> {tmp_path}/new; sleep 0.4; done"
    run = start(progress_command("copy", slow, size_of=str(tmp_path), total=8 * 1024 * 1024, every=0.5))
    assert run.stdout is not None
    arrivals = [(time.monotonic(), line.rstrip("\n")) for line in run.stdout]
    assert run.wait() == 0
    lines = [text for _, text in arrivals]
    assert lines[0] == "copy: 2 MiB already there of 8 MiB"
    middle = [text for text in lines[1:-1] if " of 8 MiB (" in text and "elapsed" in text]
    assert len(middle) >= 2 and all("\r" not in text for text in lines)
    assert arrivals[-1][0] - arrivals[1][0] >= 1.0  # spread over the run, not printed at its end
    assert lines[-1].startswith("copy: done in ") and lines[-1].endswith("8 MiB")


def test_a_failure_shows_the_commands_own_output_and_its_status():
    run = start(progress_command("fetch", "echo resolving; echo 'HTTP 403: gated' >&2; exit 3", every=0.5))
    out, err = run.communicate()
    assert run.returncode == 3 and out.splitlines()[0] == "fetch: started" and "done" not in out
    assert "fetch: failed after" in err and "resolving" in err and "HTTP 403: gated" in err


def test_a_relay_counts_the_bytes_it_passes(tmp_path):
    sink = tmp_path / "received"
    run = start(progress_command("ship", relay=("head -c 3000000 /dev/zero", f"cat > {sink}"), total=3000000))
    out, _ = run.communicate()
    assert run.returncode == 0 and sink.stat().st_size == 3000000 and out.splitlines()[-1].endswith("3 MiB")


def test_the_newest_build_step_is_shown():
    build = "for i in 1 2 3; do echo \"Step $i/3 : RUN make\"; printf 'noise\\r'; sleep 0.6; done"
    run = start(progress_command("build", build, latest=r"^Step [0-9]+/[0-9]+", every=0.5))
    out, _ = run.communicate()
    steps = [line for line in out.splitlines() if "Step" in line]
    assert steps and steps[-1].startswith("build: Step 3/3 : RUN make") and run.returncode == 0


def test_an_interrupted_run_takes_its_work_down(tmp_path):
    marker = tmp_path / "finished"
    for interrupt in ("reader gone", "hangup"):
        marker.unlink(missing_ok=True)
        run = start(progress_command("copy", f"sleep 3; touch {marker}", every=0.3))
        assert run.stdout is not None and run.stdout.readline().startswith("copy: started")
        if interrupt == "reader gone":
            run.stdout.close()  # the ssh connection that read it closed
        else:
            os.killpg(run.pid, signal.SIGHUP)  # the session's processes, as a closing terminal would
        deadline = time.monotonic() + 5
        while run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3.5)
        assert not marker.exists(), f"{interrupt}: the command went on after the run was gone"


def test_the_wrapper_names_what_it_runs():
    wrapped = progress_command("kit", "rsync -a a/ b:c/", probe="du -sb c").get_raw_value()
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
