"""The first run overlapped (issue 21) on the simulated pair: a first deploy from fresh Sparks, its data scaled so
that its proportions match the real sizes and rates, timed against its critical path. A benchmark, never a test.

    flock /tmp/sparksim.lock .venv/bin/python -m tests.bench.first_run [--scale 200] [--speedup 1]
        [--download-mb-s 1000] [--link-mb-s 2000] [--write-mb-s 1000]

How the real first run is scaled (real -> simulated; the real figures are tests/bench/first_run_model.py's):

- sizes / SCALE: the checkpoint (196 GiB) and the Engram tables (203 GB) -> about 1 GB each: the fake hub pads the
  checkpoint's shards and the Engram shards 47 and 48 (FAKEHUB_PAD); each weight file (98 GiB, half the pack) ->
  half the padded pack, written by the stand-in rank tool (its bench-rank-write knob, tests/sim/engine/faults).
- rates / SCALE x SPEEDUP: the download (FAKEHUB_RATE: the fake hub's one rate for all connections, as a link to the
  Hub is shared by the client's parallel files), the cable to the worker (tc tbf on the head's rail 0, which the
  copies and the image ship take), the weight files' write (the knob's rate).
- times / SPEEDUP: the image build (two Zig builds, 6 min: the stand-in image's build sleeps, bench-build-s).
- not scaled: the stand-in image (its size is what it is), hashing (this machine's CPU, faster than its share), and
  the steps before and after the data (preflight, link, launch: a minute or two here, a few minutes on Sparks). The
  simulated pair has no NFS: the worker gets its own copy of the checkpoint (worker_weights = "copy"), so the cable
  carries the checkpoint too, as on Sparks set to copy.

Brings the pair up fresh, scales it, runs `deploy.py -y` (its lines pass through), reads the streams' records on the
head, puts the fake hub and the link back (the pair stays deployed, with the scaled data) and prints, last, one JSON
line: first_run_s (the whole deploy), critical_path_s (the longest of: the chain of waits through the streams, each
with its own time; each lane's busy time: download, weights, build, the copies to the worker; all measured in this
run), overlap_ratio = first_run_s / critical_path_s (target: at most 1.3), streams_s (the first stream's start to
the last one's end), model_streams_s (first_run_model's schedule at this scale), and each stream's and lane's
seconds. Needs root and the simulated pair's prerequisites (tests/sim/README.md).
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from operations.facts.streams import StreamStates
from operations.remote.stream_wait import critical_path, lane_busy, took
from tests.bench import first_run_model as model
from tests.sim import sim

ROOT = Path(__file__).resolve().parents[2]
STREAMS = "/home/nvidia/.local/state/sparkfold/streams"  # the head's Layout.streams (default state_dir)
RAIL0 = sim.RAILS[0][0]  # the head's side of rail 0: the copies and the image ship
ENGINE_COPY = sim.WORK / "bench-engine"
HUB_PID = "/run/fakehub.pid"
WEIGHT_SHARE = 98 * 2**30 / (196 * 2**30)  # a rank's weight file is half the pack


def _say(line: str) -> None:
    print(line, flush=True)


def hub_repos():
    """tests/sim/fakehub/repos.py, as the fake hub builds them (the controller computes the same bytes)."""
    spec = importlib.util.spec_from_file_location("fakehub_repos", sim.SIM_DIR / "fakehub" / "repos.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def pads(scale: float) -> dict[str, int]:
    """FAKEHUB_PAD: each shard of the checkpoint and the Engram shards 47 and 48 (what the deploy fetches of that
    repo) grown so that the downloads are the real ones / scale (the other files are kilobytes)."""
    repos = hub_repos()
    built = repos.build_repos()
    wanted = {(repos.EAQ_V1, "model-0000?-of-00003.safetensors"): model.Sizes().checkpoint / scale,
              (repos.ENGRAM, "model-0004[78]-of-00048.safetensors"): model.Sizes().engram / scale}
    out = {}
    for (repo, pattern), size in wanted.items():
        shards = [f.size for path, f in built[repo].files.items() if fnmatch.fnmatchcase(path, pattern)]
        out[f"{repo}/{pattern}"] = max(int(size / len(shards) - sum(shards) / len(shards)), 0)
    return out


def on(role: str, command: str, check: bool = True, user: str | None = None) -> str:
    done = sim.exec_in(role, command, user=user, timeout=600)
    if check and done.returncode != 0:
        sys.exit(f"on the {role}: {command[:160]} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def hub_restarted(env: str = "") -> None:
    """The fake hub on the head started again with `env` (FAKEHUB_PAD/FAKEHUB_RATE), or plain."""
    on("head", f"kill $(cat {HUB_PID}) 2>/dev/null; for i in $(seq 50); do kill -0 $(cat {HUB_PID}) 2>/dev/null "
               "|| break; sleep 0.1; done; " + f"{env} sh /opt/sim/fakehub/start.sh")


def link_limited(rate: float | None) -> None:
    """tc tbf on the head's rail 0 at `rate` bytes/s (a burst above the 9000-byte MTU, so the link check passes), or
    none."""
    if rate is None:
        on("head", f"tc qdisc del dev {RAIL0} root 2>/dev/null", check=False)
        return
    on("head", f"tc qdisc replace dev {RAIL0} root tbf rate {int(rate * 8)}bit burst 512kb latency 400ms")


def engine_copy(build_s: float, write_rate: float) -> Path:
    """The stand-in engine's build context with the bench's knobs (tests/sim/engine/faults/README.md)."""
    shutil.rmtree(ENGINE_COPY, ignore_errors=True)
    shutil.copytree(sim.SIM_DIR / "engine", ENGINE_COPY)
    (ENGINE_COPY / "faults" / "bench-build-s").write_text(f"{build_s:.0f}\n")
    (ENGINE_COPY / "faults" / "bench-rank-write").write_text(json.dumps({"fraction": WEIGHT_SHARE,
                                                                         "rate": write_rate}))
    return ENGINE_COPY


def deployed(engine: Path) -> tuple[float, list[str]]:
    """`deploy.py -y` from fresh Sparks, its lines passed through: (seconds, lines)."""
    env = dict(os.environ, SPARKFOLD_SITE=str(sim.site_path()), SPARKFOLD_ENGINE_CONTEXT=str(engine),
               PYINFRA_PROGRESS="off")
    start = time.monotonic()
    run = subprocess.Popen([sys.executable, "-m", "pyinfra", "inventory.py", "deploy.py", "-y"], cwd=ROOT, env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert run.stderr is not None
    lines = []
    for line in run.stderr:
        lines.append(line.rstrip("\n"))
        _say(lines[-1])
    elapsed = time.monotonic() - start
    if run.wait() != 0 or not any("is now LIVE! on port 8888" in line for line in lines):
        sys.exit("the first run did not end LIVE (its lines are above)")
    return elapsed, lines


def head_streams() -> dict[str, dict]:
    """The first run's streams on the head, as their fact reads them."""
    found = StreamStates().process(on("head", StreamStates().command(root=STREAMS), user="nvidia").splitlines())
    runs = {s["run"] for s in found.values()}
    if len(runs) != 1:
        sys.exit(f"expected the streams of one run on the fresh head, found runs {sorted(runs)}")
    return found


def modelled(args: argparse.Namespace) -> float:
    """first_run_model's schedule of the streams at the simulated scale (hashing left fast, as here)."""
    sizes = model.Sizes()
    scaled = model.Sizes(checkpoint=sizes.checkpoint / args.scale, engram=sizes.engram / args.scale,
                         weight_file=sizes.weight_file / args.scale, image=sizes.image / args.scale,
                         build_s=sizes.build_s / args.speedup)
    rate = args.speedup / args.scale * 1e6
    rates = model.Rates(download=args.download_mb_s * rate, link=args.link_mb_s * rate, hashing=1e9,
                        write=args.write_mb_s * rate)
    return model.overlapped_s(model.streams(scaled, rates, checkpoint_copy=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=200.0, help="real bytes per simulated byte")
    p.add_argument("--speedup", type=float, default=1.0, help="real seconds per simulated second")
    p.add_argument("--download-mb-s", type=float, default=1000.0, help="the real download rate")
    p.add_argument("--link-mb-s", type=float, default=2000.0, help="the real copy rate to the worker")
    p.add_argument("--write-mb-s", type=float, default=1000.0, help="the real weight files' write rate")
    args = p.parse_args(argv)
    rate = args.speedup / args.scale * 1e6  # a real MB/s, in simulated bytes/s

    sim.up(fresh=True)
    engine = engine_copy(model.Sizes().build_s / args.speedup, args.write_mb_s * rate)
    padding = ",".join(f"{glob}={size}" for glob, size in pads(args.scale).items())
    try:
        hub_restarted(f"FAKEHUB_PAD={shlex.quote(padding)} FAKEHUB_RATE={int(args.download_mb_s * rate)}")
        link_limited(args.link_mb_s * rate)
        first_run_s, _lines = deployed(engine)
        streams = head_streams()
    finally:
        link_limited(None)
        hub_restarted()
    chain_s, chain = critical_path(streams)
    busy = lane_busy(streams)
    critical_path_s = max([chain_s, *busy.values()])
    starts = [s["queued"] for s in streams.values() if s["queued"] is not None]
    ends = [s["ended"] for s in streams.values() if s["ended"] is not None]
    result = {
        "first_run_s": round(first_run_s, 1),
        "critical_path_s": round(critical_path_s, 1),
        "overlap_ratio": round(first_run_s / critical_path_s, 2) if critical_path_s else None,
        "streams_s": round(max(ends) - min(starts), 1) if starts and ends else None,
        "model_streams_s": round(modelled(args), 1),
        "chain_s": round(chain_s, 1), "chain": chain,
        "lanes_s": {lane: round(seconds, 1) for lane, seconds in busy.items()},
        "streams": {name: round(took(s) or 0, 1) for name, s in streams.items()},
        "scale": args.scale, "speedup": args.speedup, "download_mb_s": args.download_mb_s,
        "link_mb_s": args.link_mb_s, "write_mb_s": args.write_mb_s,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
