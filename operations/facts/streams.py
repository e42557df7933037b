"""The background streams on a Spark (operations/streams), read in one round trip from their folders."""

from __future__ import annotations

import shlex
from typing import TypedDict

from pyinfra.api import FactBase

from operations.remote.stream_runner import ALIVE, STATE_FILES
from operations.util.session import STAT_FUNCTIONS


class StreamDict(TypedDict):
    run: str  # the run it belongs to
    inputs: str  # digest of its work
    lane: str
    label: str
    after: list[str]  # the streams it waits for
    queued: float | None  # epoch seconds: started, began (its waits over), ended
    began: float | None
    ended: float | None
    rc: int | None  # its exit status once it ended
    alive: bool  # its runner runs


def stream_status(stream: StreamDict) -> str:
    """running, done, failed, or stopped (no exit status and no runner: its run was killed or the Spark rebooted)."""
    if stream["rc"] is not None:
        return "done" if stream["rc"] == 0 else "failed"
    return "running" if stream["alive"] else "stopped"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class StreamStates(FactBase[dict[str, StreamDict]]):
    """{name: StreamDict} of the streams under `root` (Layout.streams); {} when there is none."""

    default = dict

    def command(self, root: str) -> str:
        each = " ".join(STATE_FILES)
        return (STAT_FUNCTIONS + ALIVE + f"cd {shlex.quote(root)} 2>/dev/null || exit 0; for d in */; do "
                "[ -d \"$d\" ] || continue; d=${d%/}; echo \"#STREAM $d\"; "
                f"for f in {each}; do [ -f \"$d/$f\" ] && printf '%s=%s\\n' \"$f\" \"$(tr '\\n' ' ' < \"$d/$f\")\"; "
                "done; if alive \"$PWD/$d\"; then echo alive=1; else echo alive=0; fi; done; true")

    def process(self, output: list[str]) -> dict[str, StreamDict]:
        found: dict[str, StreamDict] = {}
        current: StreamDict | None = None
        for line in output:
            if line.startswith("#STREAM "):
                current = found[line[8:].strip()] = {
                    "run": "", "inputs": "", "lane": "", "label": "", "after": [], "queued": None, "began": None,
                    "ended": None, "rc": None, "alive": False}
                continue
            key, sep, value = line.partition("=")
            if current is None or not sep:
                continue
            value = value.strip()
            if key in ("run", "inputs", "lane", "label"):
                current[key] = value  # type: ignore[literal-required]
            elif key == "after":
                current["after"] = value.split()
            elif key in ("queued", "began", "ended"):
                current[key] = _number(value)  # type: ignore[literal-required]
            elif key == "rc":
                current["rc"] = int(value) if value.lstrip("-").isdigit() else None
            elif key == "alive":
                current["alive"] = value == "1"
        return found
