"""One folder sparkfold owns on a Spark, converged like any other state: present, the ssh user's, one mode.

Not files.directory: a folder that is the ssh user's is made by the ssh user (files.directory run with sudo for its
chown would make missing parents root's), only a chown needs root; a symlink to a folder (data_dir moved to a larger
disk) is judged by the folder it leads to; a file in the way is the user's, refused, never moved.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, operation

from operations.facts.files import FolderStates
from operations.util import check_failed, sh

PRIVATE = "700"  # secrets: api-key.d
SHARED = "755"


def permission_bits(mode: object) -> str:
    """The rwx bits of pyinfra's mode (its octal digits as an int: 755, 2775), as chmod takes them. A set-group-ID
    or sticky bit is left as it is: chmod 755 keeps a folder's, so comparing it would chmod on every run."""
    return f"{int(str(mode)):03d}"[-3:]


@operation()
def owned_folders(folders: tuple[tuple[str, str], ...], owner: str):
    """Each (path, mode) of `folders` is a folder (or a symlink to one) owned by `owner` with that mode: mkdir by the
    ssh user when it is missing, chmod when the mode differs, chown (root) when the owner does; nothing when all is
    right. One fact for all of them (FolderStates): a converged run asks once.

    + folders: (absolute path, mode in octal digits such as "700" or "755"), parents first
    + owner: the user that owns them (the ssh user)
    """
    states = host.get_fact(FolderStates, paths=tuple(path for path, _mode in folders))
    others = [path for path, _mode in folders if path in states and states[path]["kind"] == "other"]
    if others:  # nothing is made or changed while a path is not ours to judge
        yield from check_failed("sparkfold's folders", [
            f"{path} exists and is not a folder (nor a symlink to one): it is left alone; move it away, or point the "
            "setting that names it at another place" for path in others])
        return
    right = []
    for path, mode in folders:
        state = states.get(path) or {"kind": "missing", "user": "", "mode": ""}
        if state["kind"] == "missing":
            yield StringCommand(f"mkdir -p {sh(path)} && chmod {sh(mode)} {sh(path)}")
            continue
        if state["user"] != owner:  # someone else's folder (made by root?): only root can give it back
            yield StringCommand("chown", sh(owner), sh(path), _sudo=True)
        if permission_bits(state["mode"]) != mode:
            yield StringCommand("chmod", sh(mode), sh(path))
        elif state["user"] == owner:
            right.append(path)
    if len(right) == len(folders):
        host.noop(f"{len(folders)} folder(s) {owner}'s, with their modes")
