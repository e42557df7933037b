"""The pair of ranks: served by deploy.py (restart.py is deploy.py with `restart` on), stopped by stop.py.

Each operation reads `RankInputs` of both Sparks (one round trip each, operations/facts/rank.py) and asks the pure
`pair_plan` (operations/rank/plan.py) what to do, the way pyinfra's docker.container reads its container and diffs
a spec. Reading afresh in each operation is what lets the executing run see what the earlier operations of the
same run made (the link record, the image, the weight files); both Sparks read the same data and so reach the same
verdict, and both ranks are removed and started again together.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host, logger
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.api.host import Host

from operations.build.image_hash import image_ref
from operations.data.copy import folder_versions_pruned, versions_dir
from operations.facts.docker import RankContainer
from operations.facts.rank import RankInputs
from operations.facts.systemd import UnitState
from operations.layout import SUPERVISOR_UNIT, unit_path
from operations.owned.files import file_put
from operations.rank import serving
from operations.rank.commands import removal_commands, start_commands
from operations.rank.plan import KEEP, REFUSED, START, PairPlan, foreign, pair_plan, rank_inputs_args
from operations.rank.spec import CHAT_TEMPLATE, template_digest
from operations.settings import Settings
from operations.settings.context import peer_host
from operations.util import check_failed


def read_pair_plan(s: Settings, peer: Host, image: str, template: str) -> PairPlan:
    """Both Sparks' RankInputs (root: `ss` names other users' processes only for root), then the pure plan."""
    mine = host.get_fact(RankInputs, _sudo=True, **rank_inputs_args(s, image))
    theirs = peer.get_fact(RankInputs, _sudo=True, **rank_inputs_args(s.the_peer, image))
    head_found, worker_found = (mine, theirs) if s.is_head else (theirs, mine)
    return pair_plan(s.head, s.worker, head_found, worker_found, image=image, template_digest=template,
                     force=bool(s.restart))


@operation()
def pair_checked(s: Settings, peer: Host, image: str, template: str):
    """Refuse before anything is touched: a foreign container with our name (on either Spark), this rank's launch
    problems (inputs, rails, rank 0's flags against the image), too little memory for a rank that is not there, or
    one of its ports held by another process."""
    plan = read_pair_plan(s, peer, image, template)
    mine = plan.rank(s.rank)
    if plan.refusals:  # the rest would judge a container that is not ours
        yield from check_failed("the rank containers", plan.refusals)
        return
    # while planning, a missing input (image, link record) may still be made by this run: only its problems count
    if (yield from check_failed("the launch", mine.problems, settled=mine.spec is not None)):
        return
    if (yield from check_failed("memory", mine.memory)):
        return
    if (yield from check_failed("ports", mine.ports)):
        return
    host.noop(f"the {mine.where}'s launch checks pass")


@operation()
def stale_pair_stopped(s: Settings, peer: Host, image: str, template: str, pause_units: tuple[str, ...] = ()):
    """Both Sparks: when the pair is stale (either rank missing, stopped or changed, or a restart is asked for),
    save this rank's log and remove its container, so both ranks start again together.

    pause_units: systemd units (the supervisor) stopped first while they run, so they do not restart the old pair
    behind the deploy's back; the deploy starts them again after the health check."""
    plan = read_pair_plan(s, peer, image, template)
    if not plan.stale:
        host.noop("both ranks run the wanted spec")
        return
    if plan.refusals:  # never planned as a removal: the container is not ours
        yield from check_failed("the rank containers", plan.refusals)
        return
    for unit in pause_units:
        if host.get_fact(UnitState, unit=unit, path=unit_path(unit))["active"] in ("active", "activating"):
            yield StringCommand("systemctl", "stop", unit, _sudo=True)
    mine = plan.rank(s.rank)
    logger.info(f"{host.name}: the pair restarts: {'; '.join(plan.reasons)}")
    if mine.action == START:
        host.noop("no rank container here to remove")
        return
    yield from removal_commands(s.container_name, s.rank, mine.running, s.stop_timeout, s.layout.logs, s.log_keep)


@operation()
def rank_started(s: Settings, peer: Host, image: str, template: str):
    """Start this rank's container unless it runs the wanted spec: mounts checked, memory waited for, the GPU clock
    lock applied again, then `docker run`. Planned before the stale pair is stopped, a rank to recreate is shown
    with the start it will get."""
    plan = read_pair_plan(s, peer, image, template)
    mine = plan.rank(s.rank)
    if mine.action in (KEEP, REFUSED):
        host.noop(f"rank {s.rank} runs the wanted spec" if mine.action == KEEP else f"rank {s.rank} is not ours")
        return
    if mine.spec is None:
        unknown = [f"rank {s.rank}'s container spec is not known ({'; '.join(mine.problems)})"]
        if (yield from check_failed("the launch", unknown, settled=False)):
            return
        # planning: the earlier steps of this run make the missing inputs
        yield StringCommand("docker", "run", "...", f"(rank {s.rank}; its spec is complete once the steps before "
                            "it have run)")
        return
    yield from start_commands(mine.spec, s.min_avail_gib, s.gpu_clock_mhz, s.nvidia_smi_path)


@deploy("The pair of ranks")
def ranks_serving(s: Settings) -> None:
    """Check, then (only when stale) recreate the pair: both ranks removed, rank 1 started, then rank 0; then the
    health wait, the smoke test through both ranks and the LIVE line."""
    peer, layout = peer_host(s), s.layout
    if s.is_head:
        file_put(name="Chat template for rank 0", src=str(s.project_root / CHAT_TEMPLATE), dest=layout.chat_template,
                 mode="644")
    # the controller's inputs, read once: the content-addressed image and the template rank 0 serves
    pair: dict[str, Any] = dict(s=s, peer=peer, image=image_ref(s), template=template_digest(s))
    pair_checked(name="Check the launch (container ownership, rank 0's flags, link record, memory, ports)", **pair)
    # the supervisor must not restart the old pair while the deploy replaces it (supervision starts it again)
    pause = (SUPERVISOR_UNIT,) if s.is_head and s.supervise else ()
    stale_pair_stopped(name="Stop the stale pair (logs saved first)", pause_units=pause, **pair)
    if not s.is_head:
        rank_started(name="Start rank 1 (worker)", **pair)
    if s.is_head:
        rank0 = rank_started(name="Start rank 0 (head)", **pair)
        serving.api_serving(
            name="Rank 0's API: wait, smoke test through both ranks, LIVE",
            base_url=s.api_base_url, served_name=s.served_name, port=s.port, container_name=s.container_name,
            worker=peer, api_key_file=layout.api_key if s.api_key else "", wait_timeout=s.wait_timeout,
            started=rank0.did_change, planned=lambda: bool(rank0.will_change), open_note=serving.open_api_note(s))
        # only now: the pair runs on the kit the symlink names, so the versions before it are nobody's
        folder_versions_pruned(name="Old kit versions removed", link=layout.kit, versions=versions_dir(layout.kit),
                               what="the kit")
        if s.ablit:
            folder_versions_pruned(name="Old ABLIT packs removed", link=layout.ablit_current, versions=layout.ablit,
                                   what="the ABLIT pack")


@operation()
def rank_stopped(container_name: str, rank: int, stop_timeout: int, log_dir: str, log_keep: int):
    """Stop and remove this Spark's rank (log saved first), then show what still holds the GPU."""
    mine = host.get_fact(RankContainer, container=container_name)
    if not mine:
        host.noop(f"no container named {container_name} here: rank {rank} is stopped")
        return
    refusal = foreign("this Spark", container_name, mine)
    if refusal:  # never planned as a removal: the container is not ours
        yield from check_failed("the rank container", [refusal])
        return
    yield from removal_commands(container_name, rank, bool(mine.get("running")), stop_timeout, log_dir, log_keep)
    # docker rm -f returns once the rank's processes are gone, which frees their GPU memory; show what is left.
    yield StringCommand("if command -v nvidia-smi >/dev/null 2>&1; then echo 'sparkfold: GPU processes left:';"
                        " nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader || true; fi")


@deploy("Stop both ranks")
def ranks_stopped(s: Settings) -> None:
    """stop.py: stop and remove both ranks (logs saved first), rank 0 then rank 1."""
    args: dict[str, Any] = dict(container_name=s.container_name, rank=s.rank, stop_timeout=s.stop_timeout,
                                log_dir=s.layout.logs, log_keep=s.log_keep)
    if s.is_head:
        rank_stopped(name="Stop rank 0 (head; log saved first)", **args)
    if not s.is_head:
        rank_stopped(name="Stop rank 1 (worker; log saved first)", **args)
