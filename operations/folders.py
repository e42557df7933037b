"""The folders sparkfold owns on a Spark, converged like any other state: present, the ssh user's, one mode.

An owner or a mode drifts (after a `chmod 644` on api-key.d every later key write fails with "Permission
denied"): each run reads them (pyinfra's Directory fact) and yields mkdir, chmod or chown only for what differs, so
`--dry` shows it. Modes: 0700 where the code keeps secrets (api-key.d, made under umask 077), else 0755, what mkdir
makes under the usual umask 022: the ssh user writes, the rank containers (root) read.

Not files.directory: a folder that is the ssh user's is made by the ssh user (files.directory run with sudo for its
chown would make missing parents root's), only a chown needs root; a link to a folder (data_dir moved to a larger
disk) is judged by the folder it leads to; a file in the way is the user's, refused, never moved.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.facts.files import Directory

from operations.data.copy import versions_dir
from operations.settings import Settings
from operations.util import check_failed, sh

PRIVATE = "700"  # secrets: api-key.d
SHARED = "755"


def owned_folders(s: Settings) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(path, mode) of the folders this Spark's steps write into, parents first: (those both Sparks have, this
    Spark's own). The state folder, data_dir and the data folders the head's or the worker's steps make; api-key.d
    is the API key step's own (operations/api_key.py). Not the head's kit: a link switched between the versions in
    kit.d."""
    p = s.layout
    both = [p.state_dir, p.data_dir, p.engram, p.token_map_dir, p.rank_cache, p.cache_root, p.logs]
    if s.is_head:
        own = [p.kit_src, versions_dir(p.kit), p.build_root] + ([p.ablit, p.overlay] if s.ablit else [])
    else:
        own = [p.kit]  # the worker's kit is a real folder, copied from the head
    return [(d, SHARED) for d in both], [(d, SHARED) for d in own]


def permission_bits(mode: object) -> str:
    """The rwx bits of pyinfra's mode (its octal digits as an int: 755, 2775), as chmod takes them. A set-group-ID
    or sticky bit is left as it is: chmod 755 keeps a folder's, so comparing it would chmod on every run."""
    return f"{int(str(mode)):03d}"[-3:]


@operation()
def owned_folder(path: str, owner: str, mode: str):
    """`path` is a folder (or a link to one) owned by `owner` with mode `mode`: mkdir by the ssh user when it is
    missing, chmod when the mode differs, chown (root) when the owner does; nothing when all is right.

    + path: absolute path of the folder
    + owner: the user that owns it (the ssh user)
    + mode: its mode in octal digits ("700", "755")
    """
    info = host.get_fact(Directory, path=path)
    if info is False:  # a link, or something that is no folder
        info = host.get_fact(Directory, path=path + "/")  # the trailing slash follows a link
        if not info:
            yield from check_failed("sparkfold's folders", [
                f"{path} exists and is not a folder (nor a link to one): it is left alone; move it away, or point "
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


@deploy("The folders sparkfold owns")
def folders(s: Settings) -> None:
    """The state folder, data_dir and the data folders, before any step writes into them. The folders only one
    Spark has are converged at call sites of their own (pyinfra merges operations by call position)."""
    both, own = owned_folders(s)
    for path, mode in both:
        owned_folder(name=f"{path}: {s.ssh_user}'s, mode {mode}", path=path, owner=s.ssh_user, mode=mode)
    if s.is_head:
        for path, mode in own:
            owned_folder(name=f"{path}: {s.ssh_user}'s, mode {mode} (head)", path=path, owner=s.ssh_user, mode=mode)
    if not s.is_head:
        for path, mode in own:
            owned_folder(name=f"{path}: {s.ssh_user}'s, mode {mode} (worker)", path=path, owner=s.ssh_user,
                         mode=mode)
