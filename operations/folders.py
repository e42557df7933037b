"""The folders sparkfold owns on a Spark, converged like any other state: present, the ssh user's, one mode.

An owner or a mode drifts (after a `chmod 644` on api-key.d every later key write fails with "Permission
denied"): each run reads them (pyinfra's Directory fact) and yields mkdir, chmod or chown only for what differs, so
`--dry` shows it. Modes: 0700 where the code keeps secrets (api-key.d, made under umask 077), else 0755, what mkdir
makes under the usual umask 022: the ssh user writes, the rank containers (root) read.

The operation that converges them is operations/owned/folders.py's `owned_folders`.
"""

from __future__ import annotations

from pyinfra.api import deploy

from operations.data.copy import versions_dir
from operations.owned.folders import SHARED
from operations.owned.folders import owned_folders as owned_folders_op
from operations.settings import Settings


def owned_folders(s: Settings) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(path, mode) of the folders this Spark's steps write into, parents first: (those both Sparks have, this
    Spark's own). The state folder, data_dir and the data folders the head's or the worker's steps make; api-key.d
    is the API key step's own (operations/api_key.py). Not the head's kit: a symlink switched between the versions in
    kit.d."""
    layout = s.layout
    both = [layout.state_dir, layout.data_dir, layout.engram, layout.token_map_dir, layout.rank_cache,
            layout.cache_root, layout.logs]
    if s.is_head:
        own = [layout.kit_src, versions_dir(layout.kit), layout.build_root]
        own += [layout.ablit, layout.overlay] if s.ablit else []
    else:
        own = [layout.kit]  # the worker's kit is a real folder, copied from the head
    return [(d, SHARED) for d in both], [(d, SHARED) for d in own]


@deploy("The folders sparkfold owns")
def folders(s: Settings) -> None:
    """The state folder, data_dir and the data folders, before any step writes into them: one operation, one fact."""
    both, own = owned_folders(s)
    owned_folders_op(name=f"the state and data folders: {s.ssh_user}'s, with their modes",
                     folders=tuple(both + own), owner=s.ssh_user)
