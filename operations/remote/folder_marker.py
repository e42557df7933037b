"""Write a folder's marker where the work ran: the digest the facts compare, computed on the Spark.

    folder_marker.py FOLDER MARKER --names NAME...     a checksum list's state (data/copy.checksums_written)
    folder_marker.py FOLDER MARKER --sums SUMS         a verification (data/copy.folder_verified)
    ... --check                                         exit 0 when the marker is current, 1 when not (no write)

A background stream (operations/streams) hashes or verifies hundreds of GB after the files it reads have landed,
so the marker cannot be computed from a fact read when the stream started: this script reads the folder's listing
with the facts' own find (operations/util/listing.py, sent in front of it) once the work is done, and writes what
the operation would have written, so the next run's fact finds it current. Exit 1 with a line when the folder or the
list is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same module as below, named so mypy can follow it
    from operations.util.listing import LISTING_FIND, listing_digest, parse_listing_line
if not globals().get("_BUNDLED"):  # run from a checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "util"))
    from listing import LISTING_FIND, listing_digest, parse_listing_line  # type: ignore[no-redef]

_SUMS_LINE = re.compile(r"^[0-9a-f]{64} [ *](.*)$")  # the FolderCheck fact's reading of a sha256sum line


def listing(folder: str) -> dict:
    """The folder's files as the facts list them (find -H . with LISTING_FIND, run in the folder)."""
    out = subprocess.run(["sh", "-c", f"find -H . {LISTING_FIND}"], cwd=folder, capture_output=True, text=True,
                         check=True).stdout
    files: dict = {}
    for line in out.splitlines():
        parse_listing_line(line, files)
    return files


def sums_names(path: str) -> tuple[list[str], str]:
    """(the list's entry names, the list's own sha256)."""
    with open(path, "rb") as f:
        raw = f.read()
    names = []
    for line in raw.decode("utf-8", "replace").splitlines():
        match = _SUMS_LINE.match(line)
        if match:
            names.append(match.group(1).removeprefix("./"))
    return names, hashlib.sha256(raw).hexdigest()


def marker_digest(folder: str, names: list[str] | None = None, sums: str = "") -> str:
    files = listing(folder)
    if sums:
        listed, sums_sha = sums_names(os.path.join(folder, sums))
        return listing_digest(files, listed, sums_sha)
    return listing_digest(files, names or [])


def current(path: str, digest: str, folder: str, names: list[str] | None) -> bool:
    """The marker at `path` records `digest` (and, for a checksum list's state, SHA256SUMS lists `names`)."""
    try:
        with open(path) as f:
            if f.read(200).strip() != digest:
                return False
        return not names or sorted(sums_names(os.path.join(folder, "SHA256SUMS"))[0]) == sorted(names)
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write a folder's marker (the digest of its listing)")
    parser.add_argument("folder")
    parser.add_argument("marker", help="the marker's file name inside the folder")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--names", nargs="+", help="the files a checksum list was written for")
    which.add_argument("--sums", help="the checksum list a verification checked")
    parser.add_argument("--check", action="store_true",
                        help="only say whether the marker is current (with --names: and SHA256SUMS lists them)")
    args = parser.parse_args(argv)
    path = os.path.join(args.folder, args.marker)
    try:
        digest = marker_digest(args.folder, args.names, args.sums or "")
    except (OSError, subprocess.CalledProcessError) as error:
        if args.check:
            return 1
        print(f"sparkfold: cannot write {args.marker} in {args.folder}: {error}", file=sys.stderr)
        return 1
    if args.check:
        return 0 if current(path, digest, args.folder, args.names) else 1
    write_marker(path, digest)
    return 0


def write_marker(path: str, digest: str) -> None:
    """The marker replaced whole through a fresh file beside it: the folder's files came from the head (or a client
    of the worker's copy daemon), so a name there may be a symlink planted to lead elsewhere. mkstemp creates its
    file new (O_EXCL: never through a symlink) and the rename replaces a link at `path` instead of following it."""
    fd, fresh = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp.", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(digest + "\n")
        os.chmod(fresh, 0o644)
        os.replace(fresh, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(fresh)
        raise


if __name__ == "__main__":
    sys.exit(main())
