"""status_watch = N: status.py's table read and shown again every N seconds until Ctrl-C."""

from __future__ import annotations

import time
from collections.abc import Callable

from operations.tools.status_render import Report

CLEAR = "\x1b[H\x1b[2J"  # cursor home, then clear the screen: on a terminal each refresh replaces the last


def watch_frame(text: str, terminal: bool, as_json: bool) -> str:
    """One refresh as printed: on a terminal it replaces the last one; in a file or a pipe it follows it (a JSON
    document a line)."""
    if as_json:
        return text
    return CLEAR + text if terminal else text + "\n"



def watch(read: Callable[[Report | None], Report], show: Callable[[Report], None], every_s: float,
          sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
          frames: int | None = None) -> None:
    """Read and show the table every `every_s` seconds, counted from the start of one read to the next, until
    interrupted (pyinfra ends the run on Ctrl-C); `frames` stops after that many."""
    report: Report | None = None
    shown = 0
    while frames is None or shown < frames:
        started = clock()
        report = read(report)
        show(report)
        shown += 1
        if frames is None or shown < frames:
            sleep(max(0.0, every_s - (clock() - started)))

