"""Wait on a Spark for a run's background streams (operations/streams), relaying their lines, then a summary.

    stream_wait.py ROOT RUN

Each stream runs as a systemd unit (operations/remote/stream_unit.py); its own lines (its progress runner's: one
plain line every progress_every_s, naming the work) are read from the journal of exactly that unit's run (its
invocation id) and printed as they appear, so every stream keeps its own line while they all run. When one fails,
that is said at once and the others go on (what they make is kept); at the end one line per stream gives its time
(and how long it waited for the streams it reads), then each lane's busy time (a lane's streams share one thing: the
link to the Hub, the cable to the worker) and the critical path: the chain of streams, each waiting for the one
before, whose times add up to the most. Neither the busiest lane nor the critical path can be beaten by any
schedule. Exit 1 when a stream failed or was stopped. A waiter that is gone (a cut connection) leaves the streams
running: the next run adopts them. Sent to the Spark after operations/remote/progress.py (its `clock`) and
stream_unit.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same modules as below, named so mypy can follow them
    from operations.remote.progress import clock
    from operations.remote.stream_unit import (
        exit_status,
        journal_lines,
        journal_words,
        parse_show,
        show_words,
        unit_status,
    )
if not globals().get("_BUNDLED"):  # run from a checkout
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from progress import clock  # type: ignore[no-redef]
    from stream_unit import (  # type: ignore[no-redef]
        exit_status,
        journal_lines,
        journal_words,
        parse_show,
        show_words,
        unit_status,
    )

FIELDS = ("run", "lane", "label", "after", "queued", "began", "ended")
Runner = Callable[[list[str]], str]  # argv -> its standard output


def _read(folder: str, name: str) -> str | None:
    try:
        with open(os.path.join(folder, name), errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def as_root(words: list[str]) -> list[str]:
    """The journal of a system unit is root's (and the groups adm, systemd-journal): read through sudo -n unless
    this runs as root."""
    return words if os.geteuid() == 0 else ["sudo", "-n", *words]


def run_words(words: list[str]) -> str:
    return subprocess.run(words, capture_output=True, text=True, errors="replace").stdout


def read_stream(folder: str, unit: dict[str, str]) -> dict:
    """A stream from its folder and its unit's state (parse_show)."""
    raw = {name: _read(folder, name) for name in FIELDS}
    status = unit_status(unit)
    return {"run": raw["run"] or "", "lane": raw["lane"] or "", "label": raw["label"] or os.path.basename(folder),
            "after": (raw["after"] or "").split(), "queued": _number(raw["queued"]), "began": _number(raw["began"]),
            "ended": _number(raw["ended"]), "status": status,
            "rc": exit_status(unit) if status in ("done", "failed") else None,
            "invocation": unit.get("InvocationID", "")}


def streams_of_run(root: str, run: str, runner: Runner = run_words) -> dict[str, dict]:
    """{name: stream} of the streams under root that belong to `run`, in the order they were started (their units
    read in one `systemctl show`)."""
    listed = sorted(os.listdir(root)) if os.path.isdir(root) else []
    names = [n for n in listed if os.path.isdir(os.path.join(root, n)) and _read(os.path.join(root, n), "run") == run]
    units = parse_show(runner(show_words(names)).splitlines()) if names else []
    if len(units) != len(names):  # not one block per unit: each asked on its own, none judged by another's state
        units = [next(iter(parse_show(runner(show_words([n])).splitlines())), {}) for n in names]
    found = {name: read_stream(os.path.join(root, name), unit) for name, unit in zip(names, units, strict=True)}
    return dict(sorted(found.items(), key=lambda item: (item[1]["queued"] or 0, item[0])))


def finished(stream: dict) -> bool:
    return stream["status"] not in ("running", "stopping")


def took(stream: dict) -> float | None:
    if stream["began"] is None or stream["ended"] is None:
        return None
    return max(stream["ended"] - stream["began"], 0.0)


def critical_path(streams: dict[str, dict]) -> tuple[float, list[str]]:
    """(seconds, names): the chain through `after` whose streams' own times (waits left out) add up to the most."""
    best: dict[str, tuple[float, list[str]]] = {}

    def chain(name: str, seen: tuple[str, ...] = ()) -> tuple[float, list[str]]:
        if name not in best:
            stream = streams[name]
            before = [chain(a, seen + (name,)) for a in stream["after"] if a in streams and a not in seen]
            head = max(before, key=lambda c: c[0], default=(0.0, []))
            best[name] = (head[0] + (took(stream) or 0.0), head[1] + [name])
        return best[name]

    ends = [chain(name) for name in streams]
    return max(ends, key=lambda c: c[0], default=(0.0, []))


def lane_busy(streams: dict[str, dict]) -> dict[str, float]:
    """{lane: seconds at least one of its streams ran} (the union of their own times), busiest first: a lane's
    streams share what it stands for (the link to the Hub, the cable to the worker), so no schedule is shorter."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for stream in streams.values():
        if took(stream) is not None:
            spans.setdefault(stream["lane"] or "work", []).append((stream["began"], stream["ended"]))
    busy = {}
    for lane, pieces in spans.items():
        total, reach = 0.0, None
        for start, end in sorted(pieces):
            if reach is None or start > reach:
                total, reach = total + end - start, end
            elif end > reach:
                total, reach = total + end - reach, end
        busy[lane] = total
    return dict(sorted(busy.items(), key=lambda item: -item[1]))


def summary_lines(streams: dict[str, dict]) -> list[str]:
    """One line per stream (its time, its wait, how it ended), then the wall time and the critical path."""
    lines = []
    for stream in streams.values():
        own = took(stream)
        text = f"{stream['label']}: " + (clock(own) if own is not None else "did not start")
        if stream["began"] is not None and stream["queued"] is not None and stream["began"] - stream["queued"] >= 1:
            text += f" (after waiting {clock(stream['began'] - stream['queued'])})"
        if stream["rc"] not in (0, None):
            text += f", failed (exit {stream['rc']})"
        elif stream["rc"] is None:
            text += ", stopped"
        lines.append(f"background {stream['lane'] or 'work'}: {text}")
    starts = [s["queued"] for s in streams.values() if s["queued"] is not None]
    ends = [s["ended"] for s in streams.values() if s["ended"] is not None]
    seconds, names = critical_path(streams)
    if starts and ends and names:
        lanes = ", ".join(f"{lane} {clock(busy)}" for lane, busy in lane_busy(streams).items())
        lines.append(f"background lanes, busy: {lanes}")
        path = " → ".join(f"{streams[n]['label']} ({clock(took(streams[n]) or 0)})" for n in names)
        count = f"{len(streams)} stream{'s' if len(streams) != 1 else ''}"
        lines.append(f"background work: {count} in {clock(max(ends) - min(starts))}; "
                     f"critical path {clock(seconds)}: {path}")
    return lines


class Relay:
    """The new lines each stream's unit printed, read from the journal of that run of it (its invocation id), after
    the cursor of the last read."""

    def __init__(self, runner: Runner | None = None) -> None:
        self.runner = runner or (lambda words: run_words(as_root(words)))
        self.cursors: dict[str, str] = {}

    def new_lines(self, invocation: str) -> list[str]:
        if not invocation:
            return []
        lines, cursor = journal_lines(self.runner(journal_words(invocation, self.cursors.get(invocation))))
        if cursor:
            self.cursors[invocation] = cursor
        return lines


def wait(root: str, run: str, poll: float = 1.0, out=None, runner: Runner = run_words,
         relay: Relay | None = None) -> int:
    out = out or sys.stdout
    relay, reported = relay or Relay(), set()

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    while True:
        streams = streams_of_run(root, run, runner)
        for name, stream in streams.items():
            for line in relay.new_lines(stream["invocation"]):  # after its state: an ended one's last lines too
                say(line)
            if finished(stream) and stream["rc"] != 0 and name not in reported:
                reported.add(name)
                how = f"failed (exit {stream['rc']})" if stream["rc"] is not None else "stopped"
                say(f"sparkfold: {stream['label']} {how}; the other background work goes on")
        if all(finished(s) for s in streams.values()):
            break
        time.sleep(poll)
    time.sleep(poll)  # the journal may take in a unit's last lines just after systemd saw it end
    for stream in streams.values():
        for line in relay.new_lines(stream["invocation"]):
            say(line)
    for line in summary_lines(streams):
        say(line)
    failed = [s["label"] for s in streams.values() if s["rc"] != 0]
    if failed:
        print(f"sparkfold: background work did not finish: {', '.join(failed)} (the lines above say why); what is "
              "whole is kept, and the next run resumes the rest", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="wait for a run's background streams, relaying their lines")
    parser.add_argument("root")
    parser.add_argument("run")
    parser.add_argument("--poll", type=float, default=1.0)
    args = parser.parse_args(argv)
    try:
        return wait(args.root, args.run, args.poll)
    except BrokenPipeError:  # the run that waits is gone: its streams go on, and the next run adopts them
        return 1


if __name__ == "__main__":
    sys.exit(main())
