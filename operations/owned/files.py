"""files.put, with one round trip for a file that is already right.

files.put reads three facts every time (the file's stat, its folder, its sha1). A converged run writes nothing, so
FileSum answers all three questions at once, and files.put runs, with its facts, its upload and its `--diff`, only
for a file that differs (content, mode, a symlink in the way).
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator
from pathlib import Path
from typing import IO, Any

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.operations import files
from pyinfra.operations.util.files import ensure_mode_int

from operations.facts.files import FileSum, FileSumDict
from operations.util.checks import check_failed
from operations.util.owned import foreign_file_problem


def _sha1(src: str | IO[Any]) -> str | None:
    """sha1 of a local file or an in-memory StringIO/BytesIO; None for another stream (files.put then decides)."""
    data = Path(src).read_bytes() if isinstance(src, str) else getattr(src, "getvalue", lambda: None)()
    if data is None:
        return None
    return hashlib.sha1(data.encode() if isinstance(data, str) else data).hexdigest()


def already_there(have: FileSumDict | None, src: str | IO[Any], mode: int | str | None) -> bool:
    """Whether files.put(src, mode) would change nothing where FileSum read `have`."""
    want_mode = ensure_mode_int(mode)
    if have is None or have["link"] or have["sha1"] is None or not isinstance(want_mode, int | None):
        return False
    return have["sha1"] == _sha1(src) and (want_mode is None or have["mode"] == want_mode)


def put_changes(src: str | IO[Any], dest: str, mode: int | str | None, have: FileSumDict | None) -> list:
    """Inside an operation: files.put's commands, [] when FileSum read `have` already right (files.put's own facts
    are read only for a file that differs)."""
    return [] if already_there(have, src, mode) else list(files.put._inner(src=src, dest=dest, mode=mode))


def owned_put_changes(src: str | IO[Any], dest: str,
                      mode: int | str | None) -> Generator[StringCommand, None, list | None]:
    """`changes = yield from owned_put_changes(...)` inside an operation: None (after yielding the refusal while
    executing; only a "will fail" line while planning) when `dest` holds a file without sparkfold's header
    (operations/util/owned.py), else put_changes for it."""
    have = host.get_fact(FileSum, path=dest)
    if problem := foreign_file_problem(dest, have["head"] if have else None):
        yield from check_failed("a file sparkfold would write", [problem])  # --dry: "will fail", nothing planned
        return None
    return put_changes(src, dest, mode, have)


@operation()
def file_put(src: str | IO[Any], dest: str, mode: int | str | None = None):
    """files.put(src, dest, mode), one fact when `dest` is already right."""
    if not (changes := put_changes(src, dest, mode, host.get_fact(FileSum, path=dest))):
        host.noop(f"{dest} is up to date")
    yield from changes


@operation()
def owned_file_put(src: str | IO[Any], dest: str, mode: int | str | None = None):
    """file_put for a path sparkfold owns: refused, never overwritten, when `dest` holds a file without sparkfold's
    header."""
    changes = yield from owned_put_changes(src, dest, mode)
    if changes is None:
        return
    if not changes:
        host.noop(f"{dest} is up to date")
    yield from changes
