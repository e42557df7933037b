"""What the launch step mounts, resolved when the launch runs: the served snapshot and this rank's weight folder.

The model-data steps point stable links (<repo>/sparkfold-current, <data_dir>/ablit/current,
<data_dir>/rank-cache/active-rank<R>) at the current data. The containers get the links' targets, so a new
snapshot, pack or weight file changes the rank's spec and so recreates the pair.
"""

from __future__ import annotations

import posixpath

from pyinfra import host

from . import ablit
from .context import pair_hosts
from .facts.paths import RealPath
from .launch_spec import HF_MOUNT
from .model_data import served_model_path
from .model_paths import active_rank_link


def _real(h, path: str) -> str | None:
    return h.get_fact(RealPath, path=path)


def model_mount(s) -> tuple[str, str] | None:
    """(host folder or NFS volume mounted at HF_MOUNT, real snapshot path inside the container), None if absent."""
    source, container_path = served_model_path(s)
    if s.ablit and s.is_head:
        # the applied pack holds real files (hard links): its folder is mounted in the cache's place
        folder = _real(host, f"{source}/{ablit.CURRENT}")
        return (source, f"{HF_MOUNT}/{posixpath.relpath(folder, source)}") if folder else None
    relative = posixpath.relpath(container_path, HF_MOUNT)
    if not s.is_head and s.worker_weights == "nfs":
        head, _ = pair_hosts()  # the worker sees the head's cache through the volume
        cache, where = s.head_hf_cache, head
    else:
        cache, where = s.hf_cache, host
    real = _real(where, f"{cache}/{relative}")
    return (source, f"{HF_MOUNT}/{posixpath.relpath(real, cache)}") if real else None


def rank_folder(s) -> str | None:
    """This rank's real weight folder (the active-rank link's target)."""
    return _real(host, active_rank_link(s, s.rank))
