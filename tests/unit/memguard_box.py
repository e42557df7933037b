"""A stand-in Spark for memguard's tests: a temp folder for /proc and /sys/fs/cgroup, /proc/meminfo, and a fake
docker whose answer a test changes (tests/unit/test_memguard*.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from waiting import wait_for

from operations.remote import memguard as guard

SYSTEMD_SCOPE = "/system.slice/docker-{id}.scope"  # a Spark: cgroup v2, docker's systemd cgroup driver
SPARK_MOUNTINFO = "30 1 0:26 / {root} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


class Box:
    """A temp folder standing in for /proc and /sys/fs/cgroup, and a fake docker whose answer a test changes."""

    def __init__(self, tmp: Path):
        self.tmp, self.proc, self.cgroot = tmp, tmp / "proc", tmp / "cgroup"
        (self.proc / "self").mkdir(parents=True)
        self.cgroot.mkdir()
        (self.proc / "self" / "mountinfo").write_text(SPARK_MOUNTINFO.format(root=self.cgroot))
        self.bin, self.log, self.answer = tmp / "bin", tmp / "docker.log", tmp / "docker.answer"
        self.bin.mkdir()
        docker = self.bin / "docker"
        # docker inspect prints the format memguard asks for (id, running, pid, label) or fails when there is none
        docker.write_text(f"#!/bin/sh\necho \"$@\" >> {self.log}\n"
                          f"if [ \"$1\" = inspect ]; then cat {self.answer} 2>/dev/null || exit 1; fi\nexit 0\n")
        docker.chmod(0o755)
        self.meminfo, self.low_file = tmp / "meminfo", tmp / "state" / "memguard.low"  # state/: made by the guard
        self.mem(50)

    def mem(self, gib: float) -> None:
        self.meminfo.write_text(f"MemAvailable: {int(gib * 1024 * 1024)} kB\n")

    def cgroup(self, cid: str) -> Path:
        return self.cgroot / SYSTEMD_SCOPE.format(id=cid).lstrip("/")

    def container(self, cid: str, pid: int, label: str = "1", kill_file: bool = True, proc: bool = True) -> Path:
        """docker now answers with this running container; its cgroup exists, with cgroup.kill unless told."""
        self.answer.write_text(f"{cid} true {pid} {label}\n")
        folder = self.cgroup(cid)
        folder.mkdir(parents=True)
        (folder / "cgroup.procs").write_text(f"{pid}\n{pid + 1}\n")
        (folder / "cgroup.events").write_text("populated 1\nfrozen 0\n")
        if kill_file:
            (folder / "cgroup.kill").write_text("")
        if proc:
            (self.proc / str(pid)).mkdir()
            (self.proc / str(pid) / "cgroup").write_text(f"0::{SYSTEMD_SCOPE.format(id=cid)}\n")
        return folder

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def args(self) -> list[str]:
        return ["--container", "rank", "--floor-gib", "2.5", "--interval", "0.5", "--meminfo", str(self.meminfo),
                "--state-file", str(self.low_file), "--proc", str(self.proc)]

    def run_script(self, more_s: float = 0.3) -> tuple[int, str]:
        """The script run for real (its own clock, every 0.05 s) until its first look is over (it has written the low
        file: its TERM handler is in place by then), then `more_s` seconds of further looks: exit code and stderr.
        Waiting for the look, not for a fixed time, keeps a loaded machine from stopping it before it looked."""
        args = self.args()
        args[args.index("--interval") + 1] = "0.05"
        self.low_file.unlink(missing_ok=True)
        said = self.tmp / "memguard.stderr"
        with open(said, "w") as sink:
            proc = subprocess.Popen([sys.executable, guard.__file__, *args], stderr=sink,
                                    env=dict(os.environ, PATH=f"{self.bin}:{os.environ['PATH']}"))
        try:
            wait_for(self.low_file.exists, "memguard's first look", running=proc, said=said.read_text)
            time.sleep(more_s)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, said.read_text()
