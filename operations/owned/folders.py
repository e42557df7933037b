"""One folder sparkfold owns on a Spark, converged like any other state: present, the ssh user's, one mode.

Not files.directory: a folder that is the ssh user's is made by the ssh user (files.directory run with sudo for its
chown would make missing parents root's), only a chown needs root; a symlink to a folder (data_dir moved to a larger
disk) is judged by the folder it leads to; a file in the way is the user's, refused, never moved.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.facts.files import Directory

from operations.util import check_failed, sh

PRIVATE = "700"  # secrets: api-key.d
SHARED = "755"


def permission_bits(mode: object) -> str:
    """The rwx bits of pyinfra's mode (its octal digits as an int: 755, 2775), as chmod takes them. A set-group-ID
    or sticky bit is left as it is: chmod 755 keeps a folder's, so comparing it would chmod on every run."""
    return f"{int(str(mode)):03d}"[-3:]


@operation()
def owned_folder(path: str, owner: str, mode: str):
    """`path` is a folder (or a symlink to one) owned by `owner` with mode `mode`: mkdir by the ssh user when it is
    missing, chmod when the mode differs, chown (root) when the owner does; nothing when all is right.

    + path: absolute path of the folder
    + owner: the user that owns it (the ssh user)
    + mode: its mode in octal digits ("700", "755")
    """
    info = host.get_fact(Directory, path=path)
    if info is False:  # a symlink, or something that is no folder
        info = host.get_fact(Directory, path=path + "/")  # the trailing slash follows a symlink
        if not info:
            yield from check_failed("sparkfold's folders", [
                f"{path} exists and is not a folder (nor a symlink to one): it is left alone; move it away, or point "
                "the setting that names it at another place"])
            return
    if info is None:
        yield StringCommand(f"mkdir -p {sh(path)} && chmod {sh(mode)} {sh(path)}")
        return
    right = True
    if info["user"] != owner:  # someone else's folder (made by root?): only root can give it back
        right = False
        yield StringCommand("chown", sh(owner), sh(path), _sudo=True)
    if permission_bits(info["mode"]) != mode:
        right = False
        yield StringCommand("chmod", sh(mode), sh(path))
    if right:
        host.noop(f"{path} is {owner}'s, mode {mode}")
