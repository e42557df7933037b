"""The deploy's own speed on the simulated pair (issue 12): a benchmark script, never a test.

    flock /tmp/sparksim.lock .venv/bin/python -m tests.bench.deploy_speed [--runs 3] [--copy-gib 2]

Brings the pair up (fresh unless this checkout brought it up last), converges it, then measures, alternating A and B:
1. a converged `deploy.py -y` against a bare `exec -y -- true`, 2. a converged `deploy.py --dry` against the same
bare run, 3. sparkfold's head-to-worker copy (operations/data/copy.peer_copy_commands) of a generated file against
a plain TCP socket sender/receiver on the same link address, both into the worker's data folder. One line per
measure, then one JSON line: converged_ratio and dry_ratio (deploy time / bare time), copy_ratio (raw time /
sparkfold time: 1.0 is as fast as raw TCP).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from operations.data.copy import peer_copy_commands
from tests.sim import sim

ROOT = Path(__file__).resolve().parents[2]
OWNER = "/run/sim/bench-owner"  # which checkout brought the pair up (a tmpfs file: gone with the pair)
USER_HOME = "/home/nvidia"
DATA = f"{USER_HOME}/.cache/sparkfold"  # the default data_dir on both simulated Sparks
WORKER_LINK_IP = "192.168.100.2"  # rail 0's worker end (tests/sim/sim.py RAILS)
RAW_PORT = 47011


def _say(line: str) -> None:
    print(line, flush=True)


def pyinfra_seconds(*args: str) -> float:
    env = dict(os.environ, SPARKFOLD_SITE=str(sim.site_path()), PYINFRA_PROGRESS="off")
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pyinfra", "inventory.py", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    elapsed = time.monotonic() - start
    if run.returncode != 0:
        sys.exit(f"pyinfra {' '.join(args)} failed ({run.returncode}):\n{run.stderr[-4000:]}")
    return elapsed


def on_head(command: str, check: bool = True) -> float:
    """command run on the head as the ssh user (in a login-less shell, as pyinfra runs it); seconds taken."""
    start = time.monotonic()
    run = sim.exec_in("head", ["env", f"HOME={USER_HOME}", "sh", "-c", command], user="nvidia", timeout=600)
    elapsed = time.monotonic() - start
    if check and run.returncode != 0:
        sys.exit(f"on the head: {command[:200]} failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return elapsed


def pair_up() -> None:
    mine = sim.exec_in("head", ["cat", OWNER]).stdout.strip() == str(ROOT) if sim.status()["head"]["running"] else False
    sim.up(fresh=not mine)
    sim.exec_in("head", f"echo {shlex.quote(str(ROOT))} > {OWNER}", check=True)


def alternate(name: str, a, b, runs: int) -> tuple[float, float]:
    times_a, times_b = [], []
    for _ in range(runs):
        times_a.append(a())
        times_b.append(b())
    med_a, med_b = statistics.median(times_a), statistics.median(times_b)
    _say(f"{name}: A median {med_a:.2f} s {[round(t, 2) for t in times_a]}, "
         f"B median {med_b:.2f} s {[round(t, 2) for t in times_b]}")
    return med_a, med_b


# the raw baseline: one TCP stream, sendfile on the head, written out on the worker; the receiver answers once the
# file is closed, so the sender's time covers the whole transfer
RECEIVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1); open(sys.argv[4], "w").close(); c, _ = s.accept()
with open(sys.argv[3], "wb") as f:
    while chunk := c.recv(1 << 20):
        f.write(chunk)
c.sendall(b"k"); c.close()
"""
SENDER = """
import os, socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
with open(sys.argv[3], "rb") as f:
    c.sendfile(f)
c.shutdown(socket.SHUT_WR); assert c.recv(1) == b"k"
"""


def raw_copy(src_file: str, dest_dir: str) -> float:
    ready = f"/tmp/bench-raw-ready-{RAW_PORT}"
    # sync: the previous copy's dirty pages are written out first, so neither copy pays for the other's writeback
    sim.exec_in("worker", f"rm -rf {dest_dir} {ready}; mkdir -p {dest_dir}; chown nvidia: {dest_dir}; sync",
                check=True)
    receiver = subprocess.Popen(["docker", "exec", "-u", "nvidia", sim.CONTAINER["worker"], "python3", "-c", RECEIVER,
                                 WORKER_LINK_IP, str(RAW_PORT), f"{dest_dir}/blob.bin", ready])
    while sim.exec_in("worker", ["test", "-e", ready]).returncode != 0:
        time.sleep(0.05)
    time.sleep(0.1)  # listen() follows the ready file
    seconds = on_head(f"python3 -c {shlex.quote(SENDER)} {WORKER_LINK_IP} {RAW_PORT} {shlex.quote(src_file)}")
    if receiver.wait(timeout=60) != 0:
        sys.exit("the raw receiver failed")
    return seconds


def sparkfold_copy(src_dir: str, dest_dir: str, total: int) -> float:
    sim.exec_in("worker", f"rm -rf {dest_dir}; sync", check=True)  # as raw_copy: no writeback left over
    commands = peer_copy_commands(src_dir, f"nvidia@{WORKER_LINK_IP}", dest_dir, "the benchmark file", total)
    script = " && ".join(c if isinstance(c, str) else c.get_raw_value() for c in commands)
    return on_head(script)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--copy-gib", type=float, default=2.0)
    p.add_argument("--skip", choices=("deploy", "copy"), action="append", default=[])
    args = p.parse_args(argv)

    pair_up()
    _say(f"converging the pair: {pyinfra_seconds('deploy.py', '-y'):.1f} s")
    result: dict = {}

    def bare() -> float:
        return pyinfra_seconds("exec", "-y", "--", "true")

    if "deploy" not in args.skip:
        _say(f"second converged run (warm-up): {pyinfra_seconds('deploy.py', '-y'):.1f} s")
        deploy, bare_a = alternate("converged deploy (A) vs bare exec (B)",
                                   lambda: pyinfra_seconds("deploy.py", "-y"), bare, args.runs)
        dry, bare_b = alternate("converged --dry (A) vs bare exec (B)",
                                lambda: pyinfra_seconds("deploy.py", "--dry"), bare, args.runs)
        result.update(converged_ratio=round(deploy / bare_a, 2), dry_ratio=round(dry / bare_b, 2),
                      deploy_s=round(deploy, 2), dry_s=round(dry, 2), bare_s=round((bare_a + bare_b) / 2, 2))

    if "copy" not in args.skip:
        size = int(args.copy_gib * 2**30)
        src = f"{DATA}/bench-copy-src"
        on_head(f"mkdir -p {src} && {{ [ \"$(stat -c %s {src}/blob.bin 2>/dev/null)\" = {size} ] || "
                f"head -c {size} /dev/urandom > {src}/blob.bin; }}")
        sparkfold, raw = alternate(f"sparkfold copy of {args.copy_gib:g} GiB (A) vs raw TCP (B)",
                                   lambda: sparkfold_copy(src, f"{DATA}/bench-copy", size),
                                   lambda: raw_copy(f"{src}/blob.bin", f"{DATA}/bench-raw"), args.runs)
        sim.exec_in("worker", f"rm -rf {DATA}/bench-copy {DATA}/bench-raw")
        result.update(copy_ratio=round(raw / sparkfold, 2), copy_s=round(sparkfold, 2), raw_s=round(raw, 2),
                      copy_mb_s=round(size / sparkfold / 1e6), raw_mb_s=round(size / raw / 1e6))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
