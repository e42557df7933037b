"""The copy to the worker, measured three ways side by side on the simulated pair (deploy_speed.py's copy section).

The same generated file set, head to worker over rail 0, into the worker's data folder, each way once per round,
split the way link_copy splits it (split_among: at most its CLIENTS, 4, groups of about equal bytes):
- raw TCP: one connection a group, each sending its files back to back with sendfile; the receiver writes them
  out. The ceiling the link and the disks allow.
- sparkfold's copy, as the deploy runs it (operations/data/copy.peer_copy_commands: link_copy's rsync clients, one
  a group, through its transient daemon, then its last pass over everything).
- rsync's daemon alone (no ssh, so no cipher): one `rsync rsync://` client a group, `-a --whole-file`, into a plain
  daemon on the worker's link address. The figure that decided the removal of sparkfold's own file receiver
  (docs/testing.md, "The copy to the worker: streamer or rsync daemon"); sparkfold's copy is this plus its setup
  (ssh, the secret, the daemon's start) and its last pass.

The file set has the shape of what sparkfold copies (a 98 GiB weight file beside the Engram tables' files): one big
file of half the total and six of a twelfth each.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable

from operations.data.copy import peer_copy_commands
from operations.remote.link_copy import split_among
from tests.sim import sim

USER_HOME = "/home/nvidia"
DATA = f"{USER_HOME}/.cache/sparkfold"  # the default data_dir on both simulated Sparks
HEAD_LINK_IP, WORKER_LINK_IP = "192.168.100.1", "192.168.100.2"  # rail 0's ends (tests/sim/sim.py RAILS)
RAW_PORT, RSYNC_PORT = 47011, 47013
SRC = f"{DATA}/bench-copy-files"  # the file set on the head, kept between runs (made again when a size differs)
OLD_SRC = f"{DATA}/bench-copy-src"  # the single file of earlier versions of this benchmark
RSYNC_LISTS = "/tmp/bench-rsync-client"  # on the head: <prefix>-<n>.list, one client's files
RSYNC_PID = f"{USER_HOME}/.cache/bench-rsyncd.pid"  # on the worker


def bench_files(total: int) -> list[tuple[str, int]]:
    """(name, bytes): one big file of half of `total`, six of a twelfth each."""
    return [("big.bin", total // 2)] + [(f"part-{i}.bin", total // 12) for i in range(1, 7)]


def on_head(command: str, check: bool = True) -> float:
    """command run on the head as the ssh user (in a login-less shell, as pyinfra runs it); seconds taken."""
    start = time.monotonic()
    run = sim.exec_in("head", ["env", f"HOME={USER_HOME}", "sh", "-c", command], user="nvidia", timeout=600)
    elapsed = time.monotonic() - start
    if check and run.returncode != 0:
        sys.exit(f"on the head: {command[:200]} failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return elapsed


def fresh_dest(dest: str) -> None:
    # sync: the previous copy's dirty pages are written out first, so no copy pays for another's writeback
    sim.exec_in("worker", f"rm -rf {dest}; mkdir -p {dest}; chown nvidia: {dest}; sync", check=True)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.05)


# raw TCP: the receiver takes one connection per group, each a run of "<name> <size>\n" + bytes; it answers "k" on
# a connection once all its files are written, so the sender's time covers the whole transfer
RAW_RECEIVER = r"""
import os, socket, sys, threading
address, port, dest, ready, connections = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((address, port)); s.listen(8)
open(ready, "w").close()
cut = []

def serve(c):
    f = c.makefile("rb")
    while header := f.readline():
        name, size = header.decode().split()
        left = int(size)
        with open(os.path.join(dest, name), "wb") as out:
            while left:
                chunk = f.read(min(1 << 20, left))
                if not chunk:
                    cut.append(name)
                    return
                out.write(chunk)
                left -= len(chunk)
    c.sendall(b"k")
    c.close()

threads = []
for _ in range(connections):
    threads.append(threading.Thread(target=serve, args=(s.accept()[0],)))
    threads[-1].start()
for t in threads:
    t.join()
sys.exit(f"raw receiver: cut short: {cut}" if cut else 0)
"""
RAW_SENDER = r"""
import json, os, socket, sys, threading
address, port, src, groups = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
failed = []

def send(names):
    try:
        c = socket.create_connection((address, port))
        for name in names:
            with open(os.path.join(src, name), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                c.sendall(f"{name} {size}\n".encode())
                c.sendfile(f, 0, size)
        c.shutdown(socket.SHUT_WR)
        if c.recv(1) != b"k":
            failed.append(names)
    except OSError as e:
        failed.append(f"{names}: {e}")

threads = [threading.Thread(target=send, args=(g,)) for g in groups]
for t in threads:
    t.start()
for t in threads:
    t.join()
sys.exit(f"raw sender: {failed}" if failed else 0)
"""


def raw_copy(groups: list[list[str]], dest: str) -> float:
    ready = f"/tmp/bench-raw-ready-{RAW_PORT}"
    fresh_dest(dest)
    sim.exec_in("worker", f"rm -f {ready}", check=True)
    receiver = subprocess.Popen(["docker", "exec", "-u", "nvidia", sim.CONTAINER["worker"], "python3", "-c",
                                 RAW_RECEIVER, WORKER_LINK_IP, str(RAW_PORT), dest, ready, str(len(groups))])
    wait_until(lambda: sim.exec_in("worker", ["test", "-e", ready]).returncode == 0, "the raw receiver")
    seconds = on_head(f"python3 -c {shlex.quote(RAW_SENDER)} {WORKER_LINK_IP} {RAW_PORT} {SRC} "
                      f"{shlex.quote(json.dumps(groups))}")
    if receiver.wait(timeout=60) != 0:
        sys.exit("the raw receiver failed")
    return seconds


def sparkfold_copy(dest: str, total: int) -> float:
    sim.exec_in("worker", f"rm -rf {dest}; sync", check=True)  # link_copy makes the folder itself
    commands = peer_copy_commands(SRC, f"nvidia@{WORKER_LINK_IP}", dest, "the benchmark files", total,
                                  every=10)  # progress_every_s's default
    return on_head(" && ".join(c if isinstance(c, str) else c.get_raw_value() for c in commands))


class RsyncDaemon:
    """A plain rsync daemon on the worker's link address, as the ssh user, module `bench` at `dest`, open to the
    head's link address only; no ssh, no secret (its challenge costs one round trip a client)."""

    def __init__(self, dest: str):
        self.dest = dest

    def __enter__(self) -> RsyncDaemon:
        conf = f"{USER_HOME}/.cache/bench-rsyncd.conf"
        text = (f"use chroot = no\nmunge symlinks = no\n[bench]\npath = {self.dest}\nread only = no\n"
                f"hosts allow = {HEAD_LINK_IP}\n")
        sim.exec_in("worker", f"printf %s {shlex.quote(text)} > {conf}", user="nvidia", check=True)
        fresh_dest(self.dest)
        start = (f"echo $$ > {RSYNC_PID}; exec rsync --daemon --no-detach --address={WORKER_LINK_IP} "
                 f"--port={RSYNC_PORT} --config={conf} --log-file=/dev/null")
        self.proc = subprocess.Popen(["docker", "exec", "-u", "nvidia", sim.CONTAINER["worker"], "sh", "-c", start])
        wait_until(self.answers, "the rsync daemon")
        return self

    @staticmethod
    def answers() -> bool:
        """The head's rsync gets the daemon's module list."""
        return sim.exec_in("head", ["rsync", f"rsync://{WORKER_LINK_IP}:{RSYNC_PORT}/"],
                           user="nvidia").returncode == 0

    def __exit__(self, *_: object) -> None:
        sim.exec_in("worker", f"kill $(cat {RSYNC_PID}) 2>/dev/null; rm -f {RSYNC_PID}")
        self.proc.wait(timeout=30)


def rsync_daemon_copy(groups: list[list[str]], dest: str) -> float:
    fresh_dest(dest)
    clients = " ".join(f"rsync -a --whole-file --files-from={RSYNC_LISTS}-{n}.list ./ "
                       f"rsync://{WORKER_LINK_IP}:{RSYNC_PORT}/bench/ & pids=\"$pids $!\";" for n in range(len(groups)))
    return on_head(f"cd {SRC} && pids=; {clients} rc=0; for p in $pids; do wait $p || rc=1; done; exit $rc")


def measure(runs: int, copy_gib: float, rotate) -> dict:
    """The three copies, `runs` rounds rotated by `rotate(name, {label: measure}, runs)` (medians back); the JSON
    figures."""
    files = bench_files(int(copy_gib * 2**30))
    groups = split_among(files)
    sizes = " ".join(f"{name}:{size}" for name, size in files)
    on_head(f"rm -rf {OLD_SRC} && mkdir -p {SRC} && cd {SRC} && for f in {sizes}; do n=${{f%:*}}; s=${{f#*:}}; "
            "[ \"$(stat -c %s $n 2>/dev/null)\" = $s ] || head -c $s /dev/urandom > $n; done; "
            + "; ".join(f"printf '%s\\n' {' '.join(names)} > {RSYNC_LISTS}-{n}.list" for n, names in enumerate(groups)))
    total = sum(size for _, size in files)
    with RsyncDaemon(f"{DATA}/bench-rsync"):
        medians = rotate(f"copy of {copy_gib:g} GiB in {len(files)} files, {len(groups)} at once", {
            "raw TCP": lambda: raw_copy(groups, f"{DATA}/bench-raw"),
            "sparkfold": lambda: sparkfold_copy(f"{DATA}/bench-copy", total),
            "rsync daemon": lambda: rsync_daemon_copy(groups, f"{DATA}/bench-rsync"),
        }, runs)
    sim.exec_in("worker", f"rm -rf {DATA}/bench-copy {DATA}/bench-raw {DATA}/bench-rsync")
    on_head(f"rm -f {RSYNC_LISTS}-*.list")
    raw, ours, daemon = medians["raw TCP"], medians["sparkfold"], medians["rsync daemon"]
    return {"copy_ratio": round(raw / ours, 2), "rsync_daemon_raw_ratio": round(raw / daemon, 2),
            "copy_s": round(ours, 2), "raw_s": round(raw, 2), "rsync_daemon_s": round(daemon, 2),
            "copy_mb_s": round(total / ours / 1e6), "raw_mb_s": round(total / raw / 1e6),
            "rsync_daemon_mb_s": round(total / daemon / 1e6)}
