"""When each Spark's data was last verified in full: <state_dir>/data-verified, one UTC time.

A converged run trusts the markers (sizes and mtimes), so a file that rots in place is found only by a run with
verify_data on, which re-hashes everything against its sums (operations/data/background.py). Such a run writes the
record at its end on each Spark whose verifications all passed (a failed one stops the run before it), and status.py
shows it.
"""

from __future__ import annotations

import re
from shlex import quote

from pyinfra.api import operation

RECORD = "data-verified"
_UTC = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
ASK = "--data verify_data=true"


def record_path(state_dir: str) -> str:
    return f"{state_dir}/{RECORD}"


def record_command(path: str) -> str:
    """The time now, written by rename (a reader never sees half a line)."""
    return f"date -u +%Y-%m-%dT%H:%M:%SZ > {quote(path)}.tmp && mv {quote(path)}.tmp {quote(path)}"


@operation()
def data_verified_recorded(path: str):
    """verify_data's run, once every verification of this Spark passed: the time, for status.py."""
    yield record_command(path)


def verified_at(text: str | None) -> str | None:
    """The record's time (2026-05-01T10:00:00Z), None when there is none or it is not one."""
    line = (text or "").strip()
    return line if _UTC.fullmatch(line) else None


def verified_note(text: str | None) -> str:
    """status.py's words for the record's content (FileText of record_path): when the data was last verified."""
    at = verified_at(text)
    if at:
        return f"data last verified in full {at} (again: {ASK})"
    return f"data never verified in full by sparkfold (to verify it: {ASK})"
