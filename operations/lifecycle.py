"""Deploy-level entry points for the pair: converge it (deploy.py; restart.py is deploy.py with `restart` on)
and stop it (stop.py).

deploy_pair's image_ref, rails, model_mount and capabilities may be values or zero-argument callables; callables
are evaluated inside the operations, so at execute time they see what the earlier steps of the same run made
(the link record, the built image and its capabilities).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pyinfra import host
from pyinfra.operations import files

from . import containers, health
from .context import pair_hosts, settings_for
from .facts.containers import InfinibandDevices
from .flags_check import check_serve_argv
from .launch_spec import host_paths, rail_problems, rank0_argv, rank_spec
from .supervise import UNIT_NAME as SUPERVISOR

# The head's "start rank 0" operation of this run, so deploy_health knows whether the pair was (re)started.
_started_ops: dict[str, object] = {}


def _value(x):
    return x() if callable(x) else x


def _peer(s):
    head, worker = pair_hosts()
    peer = worker if s.is_head else head
    return peer, settings_for(peer)


def _template(s) -> Path:
    return Path(s.project_root) / "model" / "chat_template.jinja"


def _launch_inputs(s, image_ref, rails, model_mount, capabilities, paths, digest):
    """(spec builder, problem lister) for this Spark's rank."""

    def missing():
        r, img, mm = _value(rails), _value(image_ref), _value(model_mount)
        caps = _value(capabilities) if s.is_head else True
        gaps = [what for what, v in (("the link record (rails)", r), ("the engine image", img),
                                     ("the model snapshot", mm), ("the image's capabilities", caps)) if not v]
        return gaps, r, img, mm

    def spec():
        gaps, r, img, mm = missing()
        if gaps or rail_problems(r, s.nccl_rails):
            return None
        caps = _value(capabilities) if s.is_head else None
        # a path may be a callable: resolved now, e.g. a link to the current weight folder read as a fact
        resolved = {key: _value(value) for key, value in paths.items()}
        return rank_spec(s, img, r, mm, caps, has_infiniband=bool(host.get_fact(InfinibandDevices)),
                         paths=resolved, template_digest=digest)

    def problems():
        gaps, r, _img, mm = missing()
        if gaps:
            return [f"rank {s.rank} cannot be launched yet: {', '.join(gaps)} missing; run the whole deploy.py"]
        found = rail_problems(r, s.nccl_rails)
        if s.is_head:
            found += check_serve_argv(rank0_argv(s, mm[1], _value(capabilities)), _value(capabilities))
        return found

    return spec, problems


def deploy_pair(s, image_ref, rails, model_mount, capabilities, paths: dict | None = None):
    """Check, then (only when stale) recreate the pair: both ranks removed, rank 1 started, then rank 0.

    image_ref: the engine image (name:tag) on this Spark. rails: this Spark's link record
    [{"netdev", "ibdev", "address", "gid_index", "mtu"}]. model_mount: (hf cache dir or NFS volume name,
    snapshot path inside the container). capabilities: the image's `capabilities --json` (head; None on the worker).
    paths: overrides of launch_spec.host_paths(s).
    """
    peer, ps = _peer(s)
    p = {**host_paths(s), **(paths or {})}
    peer_record = host_paths(ps)["spec_record"]  # where the peer records its wanted spec (its own state_dir)
    here, there = ("head", "worker") if s.is_head else ("worker", "head")
    digest = ""
    if s.is_head:
        template = _template(s)
        digest = hashlib.sha256(template.read_bytes()).hexdigest() if template.exists() else ""
        files.put(name="Chat template for rank 0", src=str(template), dest=p["chat_template"], mode="644")
    spec, problems = _launch_inputs(s, image_ref, rails, model_mount, capabilities, p, digest)

    containers.launch_checked(
        name="Check the launch (container ownership, rank 0's flags, link record, memory)",
        container_name=s.container_name, peer=peer, spec=spec, problems=problems,
        min_avail_gib=s.min_avail_gib, here=here, there=there)
    containers.spec_recorded(name="Record the wanted rank spec", path=p["spec_record"], spec=spec)
    common = dict(container_name=s.container_name, rank=s.rank, spec=spec, peer=peer, peer_rank=ps.rank,
                  peer_record=peer_record, force=bool(s.restart), stop_timeout=s.stop_timeout, log_dir=p["logs"],
                  log_keep=s.log_keep)
    # the supervisor must not restart the old pair while the deploy replaces it (deploy_supervise restarts it)
    pause = (SUPERVISOR,) if s.is_head and s.supervise else ()
    containers.stale_pair_removed(name="Stop the stale pair (logs saved first)", here=here, there=there,
                                  pause_units=pause, **common)
    if not s.is_head:
        containers.rank_started(name="Start rank 1 (worker)", min_avail_gib=s.min_avail_gib, **common)
    if s.is_head:
        _started_ops[host.name] = containers.rank_started(name="Start rank 0 (head)",
                                                          min_avail_gib=s.min_avail_gib, **common)


def deploy_health(s, paths: dict | None = None):
    """Head: wait for rank 0's API and smoke-test the pair when it was (re)started in this run; else check once.
    Logs the LIVE line either way."""
    if not s.is_head:
        return
    peer, _ps = _peer(s)
    p = {**host_paths(s), **(paths or {})}
    started = _started_ops.get(host.name)
    health.api_serving(
        name="Rank 0's API: wait, smoke test through both ranks, LIVE",
        base_url=s.api_base_url, served_name=s.served_name, port=s.port, container_name=s.container_name,
        worker=peer, api_key_file=p["api_key_file"] if s.api_key else "", wait_timeout=s.wait_timeout,
        started=(lambda: started.did_change()) if started is not None else (lambda: False),
        planned=(lambda: bool(started.will_change)) if started is not None else (lambda: False))


def deploy_stop(s, paths: dict | None = None):
    """stop.py: stop and remove both ranks (logs saved first), rank 0 then rank 1."""
    p = {**host_paths(s), **(paths or {})}
    args = dict(container_name=s.container_name, rank=s.rank, stop_timeout=s.stop_timeout, log_dir=p["logs"],
                log_keep=s.log_keep)
    if s.is_head:
        containers.rank_stopped(name="Stop rank 0 (head; log saved first)", **args)
    if not s.is_head:
        containers.rank_stopped(name="Stop rank 1 (worker; log saved first)", **args)
