"""A model of the first run's data step on real Sparks: sequential (each step after the other, as before issue 21)
against overlapped (the background streams of operations/streams, each as soon as what it reads is whole).

    python -m tests.bench.first_run_model          the table of docs/measurements.md

The streams and what each waits for are the deploy's (operations/image.py, operations/model_data.py,
operations/data/background.py); each takes size / rate. Overlapped, the streams sharing a resource take turns (the
downloads share the link to the Hub, the copies the cable, the weight files the writer): a list schedule, each
stream starting as soon as what it waits for has ended and its resource is free. Hashing runs on its own cores.
The critical path is the longest chain of waits, the least any schedule can take. The steps before and after the
data (preflight, link, launch) are the same either way and left out. tests/bench/first_run.py runs the same
streams on the simulated pair, scaled down (SIM_SCALE), and measures them.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9
GiB = 2**30


@dataclass(frozen=True)
class Sizes:
    """The recipe's sizes (docs/measurements.md names the sources)."""

    checkpoint: float = 196 * GiB
    engram: float = 203 * GB
    weight_file: float = 98 * GiB  # each rank's
    image: float = 25 * GB
    build_s: float = 360.0  # the two Zig builds


@dataclass(frozen=True)
class Rates:
    """Bytes per second: download (from the Hub), link (the head's copy to the worker), hashing (sha256sum on one
    core), write (a weight file, reading the checkpoint)."""

    download: float
    link: float = 450e6
    hashing: float = 1.5e9
    write: float = 1.0e9


@dataclass(frozen=True)
class Task:
    name: str  # the stream's name in the deploy
    seconds: float
    resource: str  # "" when it shares nothing
    after: tuple[str, ...] = ()


def streams(sizes: Sizes, rates: Rates, checkpoint_copy: bool = False) -> list[Task]:
    """The data step's streams, in the order the deploy starts them (kit and token map: too small to count)."""
    s, r = sizes, rates
    tasks = [
        Task("image", s.build_s, "build"),
        Task("image-to-worker", s.image / r.link, "cable", ("image",)),
        Task("engram", s.engram / r.download, "hub"),
        Task("engram-sums", s.engram / r.hashing, "", ("engram",)),
        Task("engram-to-worker", s.engram / r.link, "cable", ("engram",)),
        Task("engram-checked", s.engram / r.hashing, "", ("engram-sums", "engram-to-worker")),
        Task("checkpoint", s.checkpoint / r.download, "hub", ("engram",)),
        Task("rank1", s.weight_file / r.write, "writer", ("image", "checkpoint")),
        Task("rank1-sums", s.weight_file / r.hashing, "", ("rank1",)),
        Task("rank0", s.weight_file / r.write, "writer", ("image", "checkpoint", "rank1")),
        Task("rank1-to-worker", s.weight_file / r.link, "cable", ("rank1",)),
        Task("rank1-checked", s.weight_file / r.hashing, "", ("rank1-sums", "rank1-to-worker")),
    ]
    if checkpoint_copy:  # worker_weights = "copy" (the simulated pair's: it has no NFS)
        tasks += [Task("checkpoint-to-worker", s.checkpoint / r.link, "cable", ("checkpoint",)),
                  Task("checkpoint-checked", s.checkpoint / r.hashing, "", ("checkpoint-to-worker",))]
    return tasks


def sequential_s(tasks: list[Task]) -> float:
    """Every step after the other."""
    return sum(t.seconds for t in tasks)


def overlapped_s(tasks: list[Task]) -> float:
    """The list schedule's end: each task, in order of the earliest time it can start (ties: the order given),
    starts once what it waits for has ended and its resource is free."""
    ended: dict[str, float] = {}
    free: dict[str, float] = {}
    pending = list(tasks)
    while pending:
        ready = [(max([ended[a] for a in t.after] + [free.get(t.resource, 0.0) if t.resource else 0.0]), i)
                 for i, t in enumerate(pending) if all(a in ended for a in t.after)]
        if not ready:
            raise ValueError(f"waits that never end: {[t.name for t in pending]}")
        start, i = min(ready)
        task = pending.pop(i)
        ended[task.name] = start + task.seconds
        if task.resource:
            free[task.resource] = ended[task.name]
    return max(ended.values(), default=0.0)


def critical_path_s(tasks: list[Task]) -> float:
    """The longest chain of waits (no resource shared): the least any schedule takes."""
    by_name = {t.name: t for t in tasks}
    longest: dict[str, float] = {}

    def chain(name: str) -> float:
        if name not in longest:
            task = by_name[name]
            longest[name] = task.seconds + max((chain(a) for a in task.after if a in by_name), default=0.0)
        return longest[name]

    return max((chain(t.name) for t in tasks), default=0.0)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"


def table(downloads=(100e6, 500e6, 1e9), links=(450e6, 2e9), sizes: Sizes = Sizes()) -> str:
    """docs/measurements.md's table: for each download rate, sequential against overlapped at each link rate."""
    head = ["download"] + [f"{label} (link {link / 1e6:.0f} MB/s)" for link in links
                           for label in ("sequential", "overlapped")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for download in downloads:
        row = [f"{download / 1e6:.0f} MB/s"]
        for link in links:
            tasks = streams(sizes, Rates(download=download, link=link))
            row += [minutes(sequential_s(tasks)), minutes(overlapped_s(tasks))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
