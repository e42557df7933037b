"""The background streams on a Spark (operations/streams), read in one round trip: each one's folder and its
systemd unit's state (operations/remote/stream_unit.py)."""

from __future__ import annotations

import shlex
from typing import TypedDict

from pyinfra.api import FactBase

from operations.remote.stream_runner import STATE_FILES
from operations.remote.stream_unit import SHOW_PROPERTIES, UNIT_PREFIX, exit_status, unit_inputs, unit_status


class StreamDict(TypedDict):
    run: str  # the run that started or adopted it
    inputs: str  # digest of the work its folder was written for
    lane: str
    label: str
    after: list[str]  # the streams it waits for
    queued: float | None  # epoch seconds: started, began (its waits over), ended (its work exited)
    began: float | None
    ended: float | None
    status: str  # its unit's (stream_unit.unit_status): none, running, stopping, done, failed, stopped
    rc: int | None  # its work's exit status once its unit ended (done or failed)
    unit_inputs: str  # digest of the work its unit runs ("" when there is no unit)
    invocation: str  # the unit's InvocationID: its journal


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _stream(fields: dict[str, str], unit: dict[str, str]) -> StreamDict:
    status = unit_status(unit)
    return {"run": fields.get("run", ""), "inputs": fields.get("inputs", ""), "lane": fields.get("lane", ""),
            "label": fields.get("label", ""), "after": fields.get("after", "").split(),
            "queued": _number(fields.get("queued", "")), "began": _number(fields.get("began", "")),
            "ended": _number(fields.get("ended", "")), "status": status,
            "rc": exit_status(unit) if status in ("done", "failed") else None,
            "unit_inputs": unit_inputs(unit) if status != "none" else "", "invocation": unit.get("InvocationID", "")}


class StreamStates(FactBase[dict[str, StreamDict]]):
    """{name: StreamDict} of the streams under `root` (Layout.streams); {} when there is none."""

    default = dict

    def command(self, root: str) -> str:
        each = " ".join(STATE_FILES)
        return (f"cd {shlex.quote(root)} 2>/dev/null || exit 0; for d in */; do "
                "[ -d \"$d\" ] || continue; d=${d%/}; echo \"#STREAM $d\"; "
                f"for f in {each}; do [ -f \"$d/$f\" ] && printf '%s=%s\\n' \"$f\" \"$(tr '\\n' ' ' < \"$d/$f\")\"; "
                f"done; echo '#UNIT'; systemctl show \"{UNIT_PREFIX}$d\" -p {','.join(SHOW_PROPERTIES)}; done; true")

    def process(self, output: list[str]) -> dict[str, StreamDict]:
        found: dict[str, StreamDict] = {}
        raw: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        current: dict[str, str] | None = None
        for line in output:
            if line.startswith("#STREAM "):
                name = line[8:].strip()
                raw[name] = ({}, {})
                current = raw[name][0]
                continue
            if line.startswith("#UNIT") and raw:
                current = raw[list(raw)[-1]][1]
                continue
            key, sep, value = line.partition("=")
            if current is not None and sep:
                current[key.strip()] = value.strip()
        for name, (fields, unit) in raw.items():
            found[name] = _stream(fields, unit)
        return found
