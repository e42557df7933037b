"""A folder's listing as sparkfold compares it (path, size, whole seconds of mtime: what rsync -a keeps) and the
digest a marker records over it, written once.

The facts read listings with LISTING_FIND; a marker (a checksum list's state, a verification) records
listing_digest of the files it was computed for. This module is also sent to a Spark verbatim, in front of
operations/remote/folder_marker.py, which writes those markers where the work ran (a background stream), so it
stays standard-library only and free of project imports.
"""

from __future__ import annotations

import hashlib

LISTING_FIND = "-type f -printf '%P\\t%s\\t%T@\\n'"  # find's arguments: path, size, mtime per regular file

Listing = dict[str, list[int]]  # relative path -> [size, mtime seconds]


def parse_listing_line(line: str, files: Listing) -> None:
    """Add one LISTING_FIND line to `files` (other lines are left out)."""
    parts = line.split("\t")
    if len(parts) == 3 and parts[1].isdigit():
        files[parts[0]] = [int(parts[1]), int(float(parts[2]))]


def listing_digest(files: dict, names, extra: str = "") -> str:
    """sha256 over `extra` and the (size, mtime) of the named files: what a marker or state file records."""
    lines = [extra] + [f"{n}\t{files.get(n)}" for n in sorted(names)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
