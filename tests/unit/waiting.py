"""Waiting in a unit test for what a real process does (a file it writes, a line it logs, a process group that
ends): the state itself, polled with a deadline, never a fixed sleep a loaded machine could outlast."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable


def wait_for(check: Callable[[], object], what: str, timeout: float = 30,
             running: subprocess.Popen | None = None, said: Callable[[], str] = str) -> None:
    """Until check() is true; fail naming `what` after `timeout` seconds, or at once when `running` (the process
    that was to make it true) has ended first. said(): what that process printed, shown with the failure."""
    deadline = time.monotonic() + timeout
    while not check():
        assert running is None or running.poll() is None, f"ended before {what}:\n{said()}"
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}\n{said()}"
        time.sleep(0.02)
