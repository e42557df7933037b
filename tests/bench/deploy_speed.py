"""The deploy's own speed on the simulated pair (issue 12): a benchmark script, never a test.

    flock /tmp/sparksim.lock .venv/bin/python -m tests.bench.deploy_speed [--runs 3] [--copy-gib 2]

Brings the pair up (fresh unless this checkout brought it up last), converges it, then measures, in turn:
1. a converged `deploy.py -y` against a bare `exec -y -- true`, 2. a converged `deploy.py --dry` against the same
bare run, 3. the copy to the worker three ways over the same link address into the worker's data folder
(tests/bench/copy_speed.py): raw TCP, sparkfold's copy (operations/data/copy.peer_copy_commands: up to 4 rsync
clients, then a last pass) and rsync's daemon alone with up to 4 clients. One line per measure, then one JSON line:
converged_ratio and dry_ratio (deploy time / bare time), copy_ratio (raw time / sparkfold's copy time) and
rsync_daemon_raw_ratio (raw time / rsync daemon time): 1.0 is as fast as raw TCP.
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
from collections.abc import Callable
from pathlib import Path

from tests.bench import copy_speed
from tests.sim import sim

ROOT = Path(__file__).resolve().parents[2]
OWNER = "/run/sim/bench-owner"  # which checkout brought the pair up (a tmpfs file: gone with the pair)


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


def pair_up() -> None:
    mine = sim.exec_in("head", ["cat", OWNER]).stdout.strip() == str(ROOT) if sim.status()["head"]["running"] else False
    sim.up(fresh=not mine)
    sim.exec_in("head", f"echo {shlex.quote(str(ROOT))} > {OWNER}", check=True)


def rotate(name: str, measures: dict[str, Callable[[], float]], runs: int) -> dict[str, float]:
    """Each measure once per round, `runs` rounds (so a slow spell of the VM falls on all of them); the medians."""
    times: dict[str, list[float]] = {label: [] for label in measures}
    for _ in range(runs):
        for label, measure in measures.items():
            times[label].append(measure())
    medians = {label: statistics.median(seconds) for label, seconds in times.items()}
    _say(f"{name}: " + ", ".join(f"{label} median {medians[label]:.2f} s {[round(t, 2) for t in seconds]}"
                                 for label, seconds in times.items()))
    return medians


def alternate(name: str, a, b, runs: int) -> tuple[float, float]:
    medians = rotate(name, {"A": a, "B": b}, runs)
    return medians["A"], medians["B"]


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
        result.update(copy_speed.measure(args.runs, args.copy_gib, rotate))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
