"""A background stream's systemd unit as data: its name, how its state reads, what its journal printed, and what a
run does with it (pure; no host, no I/O; sent to the Spark in front of stream_wait.py).

A stream runs as the transient service `sparkfold-<stream>` (operations/remote/stream_runner.py), with
RemainAfterExit=yes so that a finished one keeps its Result and ExecMainStatus (`active`/`exited` when it
succeeded, `failed` when it did not) until the next start of its name frees it. A unit that was stopped, or never
started, or gone with a reboot (transient units live in /run) reads `LoadState=not-found`.
"""

from __future__ import annotations

import re

UNIT_PREFIX = "sparkfold-"
SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus", "InvocationID", "Environment")
INPUTS_VARIABLE = "SPARKFOLD_INPUTS"  # the digest of a stream's work, in its unit's environment
CURSOR_MARK = "-- cursor: "  # journalctl --show-cursor's last line
_INPUTS = re.compile(r"(?:^|\s)\"?" + INPUTS_VARIABLE + r"=([0-9A-Za-z]+)")


def unit_name(stream: str) -> str:
    return f"{UNIT_PREFIX}{stream}"


def parse_show(lines: list[str]) -> list[dict[str, str]]:
    """`systemctl show UNIT... -p ...` output: one {property: value} per unit, in the order asked (systemd separates
    them with a blank line)."""
    units: list[dict[str, str]] = [{}]
    for line in lines:
        if not line.strip():
            if units[-1]:
                units.append({})
            continue
        key, sep, value = line.partition("=")
        if sep:
            units[-1][key.strip()] = value.strip()
    return [u for u in units if u]


def unit_status(unit: dict[str, str] | None) -> str:
    """none (no such unit: never started, stopped, or gone with a reboot), running (activating, or its process runs),
    stopping (deactivating: its work ending), done (exited with status 0), failed, or stopped (loaded, inactive)."""
    if not unit or unit.get("LoadState", "not-found") == "not-found":
        return "none"
    active, sub = unit.get("ActiveState", ""), unit.get("SubState", "")
    if active in ("activating", "reloading") or (active == "active" and sub != "exited"):
        return "running"
    if active == "deactivating":
        return "stopping"
    if active == "failed":
        return "failed"
    if active == "active":  # exited: RemainAfterExit keeps its result
        return "done" if unit.get("Result") == "success" and exit_status(unit) == 0 else "failed"
    return "stopped"


def exit_status(unit: dict[str, str] | None) -> int | None:
    """The work's exit status once its unit has ended (done or failed), None before or when it was stopped."""
    text = (unit or {}).get("ExecMainStatus", "")
    return int(text) if text.lstrip("-").isdigit() else None


def unit_inputs(unit: dict[str, str] | None) -> str:
    """The digest of the work the unit runs (its SPARKFOLD_INPUTS), "" when it has none."""
    found = _INPUTS.search((unit or {}).get("Environment", ""))
    return found.group(1) if found else ""


def stream_action(status: str, inputs: str, unit_inputs: str, ours: bool) -> tuple[str, str | None]:
    """(what starting a stream does, how its name is freed first), from its unit's status (unit_status), the digest
    of the work wanted now and of the work the unit runs, and whether this run started or adopted it already.

    ours: this run's already (nothing). adopt: the same work running from an earlier run (a cut connection, a killed
    run): followed, not restarted. restart: other work running under that name, or work still stopping: stopped
    (`systemctl stop` waits for its control group to end), then the new one starts and resumes what is whole.
    start: after `systemctl stop` of a finished unit (it keeps its name while it keeps its result) or
    `systemctl reset-failed` of a failed one."""
    if ours and inputs == unit_inputs:
        return "ours", None
    if status == "running":
        return ("adopt", None) if inputs == unit_inputs else ("restart", "stop")
    if status in ("stopping", "done", "stopped"):
        return ("restart" if status == "stopping" else "start"), "stop"
    if status == "failed":
        return "start", "reset-failed"
    return "start", None


def journal_lines(output: str) -> tuple[list[str], str | None]:
    """(the lines, the cursor) of `journalctl -o cat --show-cursor` output: carriage returns made newlines, blank
    lines left out; the cursor is None when there was no new entry."""
    lines, cursor = output.split("\n"), None
    while lines and not lines[-1].strip():
        lines.pop()
    if lines and lines[-1].startswith(CURSOR_MARK):
        cursor = lines.pop()[len(CURSOR_MARK):].strip()
    text = "\n".join(lines).replace("\r", "\n")
    return [line for line in text.split("\n") if line.strip()], cursor


def journal_words(invocation: str, cursor: str | None = None) -> list[str]:
    """journalctl's argv for what one run of a unit printed (exactly that run: its invocation id), after `cursor`."""
    words = ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "-q", "--no-pager", "--show-cursor"]
    return words + ([f"--after-cursor={cursor}"] if cursor else [])


def show_words(streams: list[str]) -> list[str]:
    """systemctl's argv for the state of the streams' units (one block each, in this order)."""
    return ["systemctl", "show", *(unit_name(s) for s in streams), "-p", ",".join(SHOW_PROPERTIES)]
