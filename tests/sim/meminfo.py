"""The simulated Sparks' /proc/meminfo: its text, and the per-Spark memory settings the rank-memory watcher follows.

Stdlib only: sim.py imports it on this machine, `bin/sim-rank-memory` inside each simulated Spark (/opt/sim).
Files (in tests/sim/.work/meminfo, mounted at /var/lib/sim-meminfo in the containers):
  <role>         the text bind-mounted over /proc/meminfo; rewritten in place at a constant length, so a reader
                 never sees it half-written (the bind mount follows the inode, a rename would detach it)
  <role>.json    the settings: base_gib (MemAvailable with no rank running, what set-memavail sets), rank_gib (what
                 a running rank holds), load_s / release_s (how long the footprint takes to build up / go away)
  <role>.status  what the watcher last wrote: base_gib, held_gib, avail_gib, ranks (running rank containers)
"""

from __future__ import annotations

import json
import os

MEM_TOTAL_GIB = 121.0
CMA_TOTAL_KB = 65536  # a plausible contiguous reservation (the kernel's cma= size); `sim.py set-cma ROLE 0`: none
DEFAULTS = {"base_gib": 118.0, "rank_gib": 98.0, "load_s": 8.0, "release_s": 2.0, "cma_total_kb": CMA_TOTAL_KB}
KIB_PER_GIB = 1024 * 1024


def text(total_gib: float, avail_gib: float, cma_total_kb: int = CMA_TOTAL_KB) -> str:
    """The real file's fields (kB = KiB) for a Spark whose MemAvailable is avail_gib and whose kernel reserved
    cma_total_kb of contiguous memory; every line has the same width whatever the figures, so rewrites keep the
    length."""
    kb = lambda gib: int(gib * KIB_PER_GIB)  # noqa: E731
    total, avail = kb(total_gib), kb(avail_gib)
    free = max(avail - kb(1.0), 0)
    used = max(total - avail, 0)
    fields = [
        ("MemTotal", total), ("MemFree", free), ("MemAvailable", avail), ("Buffers", kb(0.1)),
        ("Cached", kb(0.9)), ("SwapCached", 0), ("Active", kb(1.2)), ("Inactive", kb(0.8)),
        ("Active(anon)", kb(0.6)), ("Inactive(anon)", 0), ("Active(file)", kb(0.6)), ("Inactive(file)", kb(0.8)),
        ("Unevictable", 0), ("Mlocked", 0), ("SwapTotal", 0), ("SwapFree", 0), ("Dirty", 0), ("Writeback", 0),
        ("AnonPages", kb(0.6)), ("Mapped", kb(0.2)), ("Shmem", kb(0.05)), ("KReclaimable", kb(0.2)),
        ("Slab", kb(0.4)), ("SReclaimable", kb(0.2)), ("SUnreclaim", kb(0.2)), ("KernelStack", 16384),
        ("PageTables", 32768), ("CommitLimit", total // 2), ("Committed_AS", kb(2.0) + used),
        ("VmallocTotal", 133143592960), ("VmallocUsed", 65536), ("VmallocChunk", 0),
        ("CmaTotal", int(cma_total_kb)), ("CmaFree", int(cma_total_kb)),
        ("HugePages_Total", None), ("HugePages_Free", None), ("Hugepagesize", 2048),
    ]
    out = []
    for name, value in fields:
        # the kernel pads to 8 digits; 12 keeps every figure a Spark can show at one width
        out.append(f"{name + ':':<16}{0:>12}   " if value is None else f"{name + ':':<16}{value:>12} kB")
    return "\n".join(out) + "\n"


def write_in_place(path: str, content: str) -> None:
    """Overwrite path's bytes without truncating first when the length is unchanged (one write, no empty moment)."""
    data = content.encode("ascii")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != len(data):
            os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


def read_json(path: str, default: dict) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return {**default, **json.load(f)}
    except (OSError, ValueError):
        return dict(default)


def write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)  # a fresh checkout has no .work/meminfo yet
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


class Footprint:
    """What the running ranks hold, as a real rank does: its memory builds up over load_s after it starts and goes
    back over release_s after it stops (the driver frees a large allocation over seconds, not at once)."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}  # container id -> when it was first seen running
        self.releasing: list[tuple[float, float]] = []  # (GiB held when it stopped, when)
        self.seen_any = False

    def follow(self, running: set[str], now: float, cfg: dict) -> None:
        """Take the running rank containers' ids at time now (a rank already running at the first look is loaded)."""
        for cid in running - set(self.started):
            self.started[cid] = now if self.seen_any else float("-inf")
        for cid in set(self.started) - running:
            self.releasing.append((self._loaded(self.started.pop(cid), now, cfg), now))
        self.seen_any = True

    def held_gib(self, now: float, cfg: dict) -> float:
        self.releasing = [(gib, t) for gib, t in self.releasing if now - t < float(cfg["release_s"])]
        held = sum(self._loaded(t, now, cfg) for t in self.started.values())
        held += sum(gib * (1 - (now - t) / float(cfg["release_s"])) for gib, t in self.releasing)
        return held

    @staticmethod
    def _loaded(start: float, now: float, cfg: dict) -> float:
        load_s = float(cfg["load_s"])
        share = 1.0 if load_s <= 0 else min(max((now - start) / load_s, 0.0), 1.0)
        return float(cfg["rank_gib"]) * share
