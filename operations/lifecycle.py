"""The pair of ranks: converged by deploy.py (restart.py is deploy.py with `restart` on) and stopped by stop.py."""

from __future__ import annotations

from typing import Any

from pyinfra.api import deploy

from . import containers, health
from .api_key import open_api_note
from .context import peer_host
from .data_copy import folder_versions_pruned, versions_dir
from .launch import CHAT_TEMPLATE, Launch
from .layout import SUPERVISOR_UNIT
from .settings import Settings
from .util.file_put import file_put


@deploy("The pair of ranks")
def pair(s: Settings) -> None:
    """Check, then (only when stale) recreate the pair: both ranks removed, rank 1 started, then rank 0; then the
    health wait, the smoke test through both ranks and the LIVE line."""
    peer, p = peer_host(s), s.layout
    here, there = ("head", "worker") if s.is_head else ("worker", "head")
    if s.is_head:
        file_put(name="Chat template for rank 0", src=str(s.project_root / CHAT_TEMPLATE), dest=p.chat_template,
                 mode="644")
    launch = Launch(s)
    containers.launch_checked(
        name="Check the launch (container ownership, rank 0's flags, link record, memory)",
        container_name=s.container_name, peer=peer, launch=launch, min_avail_gib=s.min_avail_gib, here=here,
        there=there, ports=(s.port, s.master_port) if s.is_head else ())
    containers.spec_recorded(name="Record the wanted rank spec", path=p.spec_record, launch=launch)
    common: dict[str, Any] = dict(
        container_name=s.container_name, rank=s.rank, launch=launch, peer=peer, peer_rank=s.the_peer.rank,
        peer_record=s.the_peer.layout.spec_record, force=bool(s.restart), stop_timeout=s.stop_timeout,
        log_dir=p.logs, log_keep=s.log_keep)
    lock: dict[str, Any] = dict(gpu_clock_mhz=s.gpu_clock_mhz, nvidia_smi=s.nvidia_smi_path)  # applied at a start
    # the supervisor must not restart the old pair while the deploy replaces it (supervision starts it again)
    pause = (SUPERVISOR_UNIT,) if s.is_head and s.supervise else ()
    containers.stale_pair_removed(name="Stop the stale pair (logs saved first)", here=here, there=there,
                                  pause_units=pause, **common)
    if not s.is_head:
        containers.rank_started(name="Start rank 1 (worker)", min_avail_gib=s.min_avail_gib, **lock, **common)
    if s.is_head:
        rank0 = containers.rank_started(name="Start rank 0 (head)", min_avail_gib=s.min_avail_gib, **lock,
                                         **common)
        health.api_serving(
            name="Rank 0's API: wait, smoke test through both ranks, LIVE",
            base_url=s.api_base_url, served_name=s.served_name, port=s.port, container_name=s.container_name,
            worker=peer, api_key_file=p.api_key if s.api_key else "", wait_timeout=s.wait_timeout,
            started=rank0.did_change, planned=lambda: bool(rank0.will_change), open_note=open_api_note(s))
        # only now: the pair runs on the kit the link names, so the versions before it are nobody's
        folder_versions_pruned(name="Old kit versions removed", link=p.kit, versions=versions_dir(p.kit),
                               what="the kit")
        if s.ablit:
            folder_versions_pruned(name="Old ABLIT packs removed", link=p.ablit_current, versions=p.ablit,
                                   what="the ABLIT pack")


@deploy("Stop both ranks")
def stopped(s: Settings) -> None:
    """stop.py: stop and remove both ranks (logs saved first), rank 0 then rank 1."""
    args: dict[str, Any] = dict(container_name=s.container_name, rank=s.rank, stop_timeout=s.stop_timeout,
                                log_dir=s.layout.logs, log_keep=s.log_keep)
    if s.is_head:
        containers.rank_stopped(name="Stop rank 0 (head; log saved first)", **args)
    if not s.is_head:
        containers.rank_stopped(name="Stop rank 1 (worker; log saved first)", **args)
