"""memguard's kill through the rank's cgroup: the cgroup found from /proc/<pid>/cgroup and mountinfo (pure), the
kill through cgroup.kill or docker, and the guard run with a temp folder standing in for /proc and /sys/fs/cgroup,
a fake docker and a fake clock (so "dockerd is not asked at the floor" is exact, not a matter of timing)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from memguard_box import SYSTEMD_SCOPE, Box

from operations.remote import memguard as guard

ID_A, ID_B = "a" * 64, "b" * 64


# --- resolving the cgroup (pure) ----------------------------------------------------------------------------

def test_the_cgroup_v2_line_is_read_whatever_else_the_file_holds():
    spark = f"0::{SYSTEMD_SCOPE.format(id=ID_A)}\n"
    hybrid = "4:memory:/docker/x\n1:name=systemd:/docker/x\n0::/docker/x\n"  # cgroup v1 with the unified tree
    assert guard.cgroup_v2_path(spark) == f"/system.slice/docker-{ID_A}.scope"
    assert guard.cgroup_v2_path(hybrid) == "/docker/x"
    assert guard.cgroup_v2_path("4:memory:/docker/x\n") is None  # cgroup v1 only: no cgroup.kill anywhere


def test_only_cgroup2_mounts_are_taken_and_their_paths_unescaped():
    text = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
            "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
            "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
            "50 23 0:38 /../.. /my\\040cgroups rw,relatime master:9 - cgroup2 cgroup2 rw\n")
    assert guard.cgroup2_mounts(text) == [("/", "/sys/fs/cgroup/unified"), ("/../..", "/my cgroups")]
    assert guard.cgroup2_mounts("garbage\n") == []


def test_a_cgroup_path_lies_under_the_mount_whose_root_leads_to_it():
    path = f"/system.slice/docker-{ID_A}.scope"
    assert guard.cgroup_dirs(path, [("/", "/sys/fs/cgroup")]) == [f"/sys/fs/cgroup/system.slice/docker-{ID_A}.scope"]
    # a container that sees its host's whole tree: both the path and the mount's root climb out of its namespace
    assert guard.cgroup_dirs("/../../docker/x", [("/../..", "/sys/fs/cgroup")]) == ["/sys/fs/cgroup/docker/x"]
    # a mount that shows only another part of the tree does not hold it, and a path may not climb above a mount
    assert guard.cgroup_dirs("/docker/x", [("/system.slice", "/sys/fs/cgroup")]) == []
    assert guard.cgroup_dirs("/../docker/x", [("/", "/sys/fs/cgroup")]) == []


@pytest.fixture
def box(tmp_path):
    return Box(tmp_path)


def test_the_cgroup_is_the_mounted_folder_that_lists_the_pid(box):
    folder = box.container(ID_A, 4242)
    assert guard.find_cgroup(4242, str(box.proc)) == str(folder)


def test_a_folder_that_does_not_list_the_pid_is_not_taken(box):
    folder = box.container(ID_A, 4242)
    (folder / "cgroup.procs").write_text("17\n")  # another cgroup sits at that path in this mount
    with pytest.raises(LookupError, match="lists pid 4242"):
        guard.find_cgroup(4242, str(box.proc))
    with pytest.raises(LookupError, match="cannot read pid 9"):
        guard.find_cgroup(9, str(box.proc))  # the process is gone
    (box.proc / "self" / "mountinfo").write_text("")
    with pytest.raises(LookupError, match="no cgroup v2"):
        guard.find_cgroup(4242, str(box.proc))


def test_the_cgroup_is_checked_for_processes_without_docker(box):
    folder = box.container(ID_A, 4242)
    assert guard.cgroup_runs(str(folder)) is True
    (folder / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert guard.cgroup_runs(str(folder)) is False
    shutil.rmtree(folder)
    assert guard.cgroup_runs(str(folder)) is None  # gone: only docker can say what runs now


def test_cgroup_kill_writes_1_or_says_why_it_could_not(box):
    folder = box.container(ID_A, 4242)
    assert guard.cgroup_kill(str(folder)) is None
    assert (folder / "cgroup.kill").read_text() == "1"
    (folder / "cgroup.kill").unlink()
    assert guard.cgroup_kill(str(folder)) == f"{folder} has no cgroup.kill (Linux before 5.14)"
    (folder / "cgroup.kill").mkdir()  # a write that fails
    assert guard.cgroup_kill(str(folder)).startswith(f"writing {folder}/cgroup.kill failed: ")
    shutil.rmtree(folder)
    assert guard.cgroup_kill(str(folder)) == f"its cgroup {folder} is gone"


def test_a_container_seen_again_keeps_its_cgroup_and_a_new_one_gets_its_own(box, monkeypatch):
    monkeypatch.setenv("PATH", f"{box.bin}:{os.environ['PATH']}")
    first = guard.look("rank", None, str(box.proc))
    assert first is None  # nothing runs yet
    a = box.container(ID_A, 4242)
    first = guard.look("rank", None, str(box.proc))
    assert first == guard.Rank(ID_A, 4242, True, str(a))
    shutil.rmtree(a)  # were it looked up again, it would not be found
    assert guard.look("rank", first, str(box.proc)) is first
    b = box.container(ID_B, 5151)  # recreated: a new id and pid
    assert guard.look("rank", first, str(box.proc)) == guard.Rank(ID_B, 5151, True, str(b))


# --- the guard, run in this process on a fake clock ------------------------------------------------------------

def run_guard(box: Box, monkeypatch, until: float, at: dict[float, object] | None = None) -> list[str]:
    """Run memguard's main until the fake clock reads `until`, calling at[t]() once the clock reaches t. Returns
    its log lines."""
    clock, handler, lines, pending = [0.0], [], [], dict(at or {})
    monkeypatch.setenv("PATH", f"{box.bin}:{os.environ['PATH']}")
    monkeypatch.setattr(guard.signal, "signal", lambda _sig, h: handler.append(h))
    monkeypatch.setattr(guard, "log", lines.append)

    def sleep(seconds: float) -> None:
        clock[0] += seconds
        for t in sorted(pending):
            if t <= clock[0]:
                pending.pop(t)()
        if clock[0] >= until:
            handler[0](signal.SIGTERM, None)

    # the script's own `time` only: subprocess sleeps too while it waits for the fake docker
    monkeypatch.setattr(guard, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=sleep, strftime=time.strftime))
    assert guard.main(box.args()) == 0
    return lines


def killed(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith(("killed ", "docker kill "))]


def test_at_the_floor_the_rank_is_killed_through_its_cgroup_without_asking_docker(box, monkeypatch):
    folder = box.container(ID_A, 4242)
    lines = run_guard(box, monkeypatch, until=3, at={2: lambda: box.mem(2)})
    assert box.calls() == ["inspect --type container -f {{.Id}} {{.State.Running}} {{.State.Pid}} "
                           "{{index .Config.Labels \"sparkfold.managed\"}} rank"]  # once, at the start
    assert (folder / "cgroup.kill").read_text() == "1"
    assert f"rank is {ID_A[:12]} (pid 4242) in {folder}: below the floor it is killed via cgroup.kill" in lines
    assert killed(lines) == [f"killed rank {ID_A[:12]} via cgroup.kill ({folder}): MemAvailable 2.00 GiB is below "
                             "the floor of 2.50 GiB while the container runs"]


def test_above_the_floor_docker_is_asked_every_few_seconds_and_nothing_is_killed(box, monkeypatch):
    folder = box.container(ID_A, 4242)
    lines = run_guard(box, monkeypatch, until=2 * guard.LOOK_EVERY_S + 1)
    assert len(box.calls()) == 3 and all(c.startswith("inspect ") for c in box.calls())
    assert (folder / "cgroup.kill").read_text() == "" and killed(lines) == []
    assert sum("below the floor it is killed via" in line for line in lines) == 1  # found once, not each look


def test_a_container_recreated_while_memory_is_plentiful_is_found_at_the_next_look(box, monkeypatch):
    old = box.container(ID_A, 4242)
    new: list[Path] = []
    t_low = guard.LOOK_EVERY_S + 1
    lines = run_guard(box, monkeypatch, until=t_low + 1,
                      at={1: lambda: new.append(box.container(ID_B, 5151)), t_low: lambda: box.mem(2)})
    assert (old / "cgroup.kill").read_text() == ""  # the old cgroup still holds processes; it is not the rank now
    assert (new[0] / "cgroup.kill").read_text() == "1"
    assert killed(lines)[0].startswith(f"killed rank {ID_B[:12]} via cgroup.kill ({new[0]}): ")


def test_a_container_recreated_just_before_the_floor_is_asked_of_docker_and_killed_through_its_cgroup(box,
                                                                                                       monkeypatch):
    old = box.container(ID_A, 4242)
    new: list[Path] = []

    def recreated():
        shutil.rmtree(old)  # the old container stopped: its cgroup is removed
        new.append(box.container(ID_B, 5151))

    lines = run_guard(box, monkeypatch, until=3, at={1: recreated, 2: lambda: box.mem(2)})
    assert len(box.calls()) == 2 and not any(" kill " in f" {c} " for c in box.calls())  # start, then at the floor
    assert (new[0] / "cgroup.kill").read_text() == "1"
    assert killed(lines)[0].startswith(f"killed rank {ID_B[:12]} via cgroup.kill ")


def test_without_cgroup_kill_the_rank_is_killed_through_docker(box, monkeypatch):
    folder = box.container(ID_A, 4242, kill_file=False)
    lines = run_guard(box, monkeypatch, until=3, at={2: lambda: box.mem(2)})
    assert box.calls()[-1] == f"kill {ID_A}"  # by the id it inspected, not by name
    assert f"rank is {ID_A[:12]} (pid 4242) in {folder}: below the floor it is killed via docker kill " \
           "(Linux before 5.14)" in lines
    assert killed(lines) == [f"killed rank {ID_A[:12]} via docker kill ({folder} has no cgroup.kill (Linux before "
                             "5.14)): MemAvailable 2.00 GiB is below the floor of 2.50 GiB while the container runs"]


def test_a_rank_whose_cgroup_is_not_found_is_killed_through_docker(box, monkeypatch):
    box.container(ID_A, 4242, proc=False)  # e.g. a pid docker sees in another pid namespace
    lines = run_guard(box, monkeypatch, until=1, at={0.5: lambda: box.mem(2)})
    assert f"rank is {ID_A[:12]} (pid 4242); cannot read pid 4242's cgroup: No such file or directory: below the " \
           "floor it is killed via docker kill" in lines
    assert box.calls()[-1] == f"kill {ID_A}"
    assert killed(lines)[0].startswith(f"killed rank {ID_A[:12]} via docker kill (its cgroup was not found): ")


def test_a_docker_kill_that_fails_is_logged(box, monkeypatch):
    box.container(ID_A, 4242, kill_file=False)
    (box.bin / "docker").write_text(f"#!/bin/sh\n[ \"$1\" = inspect ] && cat {box.answer} && exit 0\n"
                                    "echo 'Cannot kill container: daemon busy' >&2; exit 1\n")
    lines = run_guard(box, monkeypatch, until=1, at={0.5: lambda: box.mem(2)})
    assert killed(lines)[0].startswith(f"docker kill rank {ID_A[:12]} failed ({box.cgroup(ID_A)} has no cgroup.kill "
                                       "(Linux before 5.14)): Cannot kill container: daemon busy; MemAvailable 2.00")


def test_a_cgroup_kill_that_did_not_take_is_retried_through_docker(box, monkeypatch):
    folder = box.container(ID_A, 4242)  # its cgroup.events keeps saying populated: the kill did not take
    box.mem(2)
    lines = run_guard(box, monkeypatch, until=guard.RETRY_KILL_S + 1)
    assert (folder / "cgroup.kill").read_text() == "1"
    assert box.calls()[-1] == f"kill {ID_A}"
    first, retry = killed(lines)
    assert first.startswith(f"killed rank {ID_A[:12]} via cgroup.kill ")
    assert retry.startswith(f"killed rank {ID_A[:12]} via docker kill (the cgroup kill did not take): ")


def test_a_container_that_is_not_sparkfolds_is_logged_once_and_never_killed(box, monkeypatch):
    folder = box.container(ID_A, 4242, label="<no value>")
    box.mem(2)
    lines = run_guard(box, monkeypatch, until=3)
    assert len(box.calls()) == 6 and not any(c.startswith("kill") for c in box.calls())  # asked at every sample
    assert (folder / "cgroup.kill").read_text() == "" and killed(lines) == []
    assert lines.count("rank runs but lacks the label sparkfold.managed=1: not sparkfold's, left alone") == 1


# --- the real kernel ------------------------------------------------------------------------------------------

def test_a_real_cgroup_is_found_and_killed_through_cgroup_kill():
    """This machine's own layout: a child cgroup of this test's, a sleep moved into it, found from /proc and
    killed through cgroup.kill. Skipped only where the kernel or the privileges cannot show it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a cgroup")
    try:
        here = guard.find_cgroup(os.getpid())
    except LookupError as e:
        pytest.skip(f"no cgroup v2 folder for this process: {e}")
    folder = os.path.join(here, f"sparkfold-memguard-test-{os.getpid()}")
    try:
        os.mkdir(folder)
    except OSError as e:
        pytest.skip(f"cannot make a cgroup in {here}: {e}")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        if not os.path.exists(os.path.join(folder, "cgroup.kill")):
            pytest.skip(f"this kernel ({os.uname().release}) has no cgroup.kill")
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
        assert guard.find_cgroup(sleeper.pid) == folder
        assert guard.cgroup_runs(folder) is True
        assert guard.cgroup_kill(folder) is None
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
    finally:
        sleeper.kill()
        sleeper.wait()
        for _ in range(50):  # the cgroup can be removed once the kernel has emptied it
            try:
                os.rmdir(folder)
                break
            except OSError:
                time.sleep(0.1)
    assert not os.path.exists(folder)
