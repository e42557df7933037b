"""The pair's plan: one pure function from the settings and both Sparks' rank inputs to what happens to each rank.

No host, no state, no I/O: the rank operations read `RankInputs` of both Sparks (operations/facts/rank.py) and ask
`pair_plan` what to do, so both Sparks reach the same verdict from the same data, and a test can call it with
plain dicts. The pair is recreated together: when either rank is missing, stopped or runs another spec, or will be
stopped by this run (Docker restarts on its Spark), or a restart is asked for, both are removed and started again,
rank 1 first.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from operations.layout import ABLIT_CURRENT, InContainer
from operations.rank.flags import check_ported_settings, check_serve_argv
from operations.rank.generation import (
    Generation,
    Records,
    Switch,
    generation_id,
    generation_of,
    read_records,
    switch_of,
)
from operations.rank.inputs import RankInputsDict
from operations.rank.sampling import sampling_plan
from operations.rank.spec import LABEL_HASH, LABEL_MANAGED, ContainerSpec, rail_problems, rank0_argv, rank_spec
from operations.settings import Settings

GIB = 1024**3

KEEP = "keep"  # runs the wanted spec: left alone
RECREATE = "recreate"  # removed (log saved first), then started again
START = "start"  # no container here: started
REFUSED = "refused"  # a container with our name that sparkfold did not start: never touched


@dataclass(frozen=True)
class RankPlan:
    rank: int
    where: str  # "head" or "worker"
    spec: ContainerSpec | None  # None while an input is missing (an earlier step of the run makes it)
    action: str  # KEEP, RECREATE, START or REFUSED
    container: Mapping[str, Any]  # what runs there now ({} for none)
    problems: tuple[str, ...] = ()  # why it cannot be launched (inputs, rails, rank 0's flags)
    memory: tuple[str, ...] = ()  # too little memory for it on its Spark
    ports: tuple[str, ...] = ()  # a port it listens on, held by another process

    @property
    def running(self) -> bool:
        return bool(self.container.get("running"))

    @property
    def runs_wanted(self) -> bool:
        """Its container runs the wanted spec (whatever the action: a restart asked for recreates it anyway)."""
        return (self.running and self.spec is not None
                and (self.container.get("labels") or {}).get(LABEL_HASH) == self.spec.spec_hash())


@dataclass(frozen=True)
class PairPlan:
    ranks: tuple[RankPlan, RankPlan]  # rank 0 (head), rank 1 (worker)
    reasons: tuple[str, ...]  # why the pair is recreated; () when both ranks are kept
    refusals: tuple[str, ...]  # containers with our name that sparkfold did not start (on either Spark)
    wanted: Generation | None = None  # the generation both wanted specs make (None while one is not known)
    running: str = ""  # the id of the generation both containers run ("" unless both run sparkfold's specs)
    records: tuple[Records, Records] = (Records((), ""), Records((), ""))  # each Spark's generation records

    image: str = ""  # the image both ranks should run
    docker_restarts: tuple[str, str] = ("", "")  # why this run restarts Docker on the head, the worker ("": not)
    sampling: str = ""  # what rank 0 serves as its sampling defaults (the plan's line)
    sampling_warnings: tuple[str, ...] = ()  # a sampling setting the image cannot carry

    @property
    def switch(self) -> Switch:
        """From the last good generation to the wanted one: what a recreated pair changes, and its way back."""
        return switch_of([rank.spec for rank in self.ranks], self.image, self.records[0])

    def rank(self, rank: int) -> RankPlan:
        return self.ranks[rank]

    @property
    def settled(self) -> bool:
        """Both specs are known: the problems are final (else an earlier step of this run may still make an input)."""
        return all(r.spec is not None for r in self.ranks)

    @property
    def stale(self) -> bool:
        return bool(self.reasons)


# --- each Spark's side ------------------------------------------------------------------------------------------

def served_model_path(s: Settings) -> tuple[str, str]:
    """(host folder or docker volume to mount, model path inside the container) for this Spark's rank.

    Stock: the Hugging Face cache (the NFS volume on a worker with worker_weights = "nfs") mounted at
    /root/.cache/huggingface; the path is the repo folder's served-snapshot symlink. ABLIT on the head: the applied
    pack's folder (<data_dir>/ablit). Rank 1 keeps the stock snapshot (config and tokenizer): its weights, with the
    overlay applied, come from its own weight file."""
    if s.ablit and s.is_head:
        return s.layout.ablit, f"{InContainer.ABLIT}/{ABLIT_CURRENT}"
    source = s.nfs_volume if (not s.is_head and s.worker_weights == "nfs") else s.hf_cache
    return source, s.layout.relative_to_cache(s.layout.served_link)


def model_mount(s: Settings, mine: RankInputsDict, head: RankInputsDict) -> tuple[str, str] | None:
    """(what is mounted at InContainer.HF, the real snapshot path inside the container), or None while the served
    symlink leads nowhere. The worker with worker_weights = "nfs" sees the head's cache through the volume."""
    source, _link_path = served_model_path(s)
    if s.ablit and s.is_head:
        # the applied pack holds real files (hard links): its folder is mounted in the cache's place, by its real
        # parent (with data_dir behind a symlink, the spelled folder and the pack's real one differ)
        folder = mine.get("ablit")
        return (posixpath.dirname(folder), f"{InContainer.HF}/{posixpath.basename(folder)}") if folder else None
    if not s.is_head and s.worker_weights == "nfs":
        cache, real = s.head.hf_cache, head.get("served")
    else:
        cache, real = s.hf_cache, mine.get("served")
    return (source, f"{InContainer.HF}/{posixpath.relpath(real, cache)}") if real else None


def _missing(s: Settings, mine: RankInputsDict, mount: tuple[str, str] | None) -> list[str]:
    found = {"the link record (rails)": (mine.get("link_record") or {}).get("rails"), "the model snapshot": mount,
             "this rank's weight folder": mine.get("rank_folder")}
    if s.is_head:
        found["the image's capabilities"] = mine.get("capabilities")
    return [name for name, value in found.items() if not value]


def _side(s: Settings, mine: RankInputsDict, head: RankInputsDict, image: str,
          template_digest: str) -> tuple[ContainerSpec | None, list[str]]:
    """This Spark's wanted container (None while an input is missing or the rails cannot feed NCCL) and why it
    cannot be launched."""
    mount = model_mount(s, mine, head)
    gaps = _missing(s, mine, mount)
    if gaps or mount is None:
        return None, [f"rank {s.rank} cannot be launched yet: {', '.join(gaps)} missing; run the whole deploy.py"]
    rails = (mine.get("link_record") or {})["rails"]
    problems = rail_problems(rails, s.nccl_rails)
    caps = head.get("capabilities") or None  # rank 0's document decides the ported settings of both ranks
    if s.is_head:
        problems += check_serve_argv(rank0_argv(s, mount[1], caps), caps)
        problems += check_ported_settings(s, caps)
    if rail_problems(rails, s.nccl_rails):
        return None, problems
    spec = rank_spec(s, image, rails, mount, caps, rank_folder=str(mine.get("rank_folder")),
                     has_infiniband=bool(mine.get("infiniband")), template_digest=template_digest if s.is_head else "",
                     kit_folder=mine.get("kit") or "")
    return spec, problems


# --- the pair ---------------------------------------------------------------------------------------------------

def foreign(where: str, name: str, container: Mapping[str, Any]) -> str | None:
    """The refusal for a container that has our name but was not started by sparkfold."""
    if container and (container.get("labels") or {}).get(LABEL_MANAGED) != "1":
        return (f"a container named {name} on the {where} was not started by sparkfold (it lacks the label "
                f"{LABEL_MANAGED}=1), so it is left alone: remove it yourself (docker rm -f {name}) or set "
                "container_name to another name")
    return None


def pair_verdict(ranks: list[tuple[int, Mapping[str, Any], str | None]], force: bool,
                 stopped: Mapping[int, str] | None = None) -> list[str]:
    """Why the pair must be recreated ([] = leave it running). ranks: (rank, container fact, wanted spec hash or
    None when not known yet); stopped: rank -> what of this run stops it before the pair step (a Docker restart)."""
    reasons = ["a restart was asked for (restart = true)"] if force else []
    stopped = stopped or {}
    for rank, c, want in sorted(ranks, key=lambda r: r[0]):
        if not c:
            reasons.append(f"rank {rank} has no container")
        elif not c.get("running"):
            reasons.append(f"rank {rank} is not running ({c.get('status', '?')}, exit code {c.get('exit_code')}"
                           f"{', killed by the OOM killer' if c.get('oom_killed') else ''})")
        else:
            # running now, but the restart stops it: the pair step finds it stopped and starts the pair again
            if stopped.get(rank):
                reasons.append(f"rank {rank} restarts: {stopped[rank]}")
            if want and (c.get("labels") or {}).get(LABEL_HASH) != want:
                reasons.append(f"rank {rank}'s settings or image changed")
    return reasons


def memory_problem(s: Settings, mine: RankInputsDict, where: str) -> str | None:
    """Too little memory for a rank that is not there yet. A rank container of ours that exists but stopped (a Docker
    restart, a crash) gives its memory back over seconds: the start waits for it (rank/commands.memory_wait) and
    refuses only if it does not come back."""
    if mine.get("container"):
        return None
    avail = mine.get("mem_available")
    if avail is None or avail / GIB >= s.min_avail_gib:
        return None
    return (f"only {avail / GIB:.1f} GiB of memory is available on the {where} but a rank needs min_avail_gib = "
            f"{s.min_avail_gib:g} GiB: stop what else uses memory there, or lower min_avail_gib")


def port_problems(s: Settings, mine: RankInputsDict, where: str) -> list[str]:
    """Ports the rank would listen on, held by another process. A port our running rank was started on is its own
    (it goes when the pair is recreated); a changed port or master_port is checked even while the old rank runs."""
    container = mine.get("container") or {}
    own = set(container.get("ports") or []) if container.get("running") else set()
    return [f"port {port} is held by {', '.join(holders)} on the {where}, so the rank could not listen there: stop "
            f"it (`sudo ss -ltnp 'sport = :{port}'` names it) or choose another port (port / master_port)"
            for port, holders in sorted((mine.get("port_holders") or {}).items()) if holders and port not in own]


def pair_plan(head: Settings, worker: Settings, head_found: RankInputsDict, worker_found: RankInputsDict, *,
              image: str, template_digest: str, force: bool,
              docker_restarts: tuple[str, str] = ("", "")) -> PairPlan:
    """The pair's plan from both Sparks' settings and inputs. image: the image both ranks run (image_ref);
    template_digest: sha256 of the chat template rank 0 serves; force: the `restart` setting; docker_restarts: why
    this run's docker step restarts Docker on the head, on the worker ("" where it does not; operations/docker)."""
    sides = ((head, head_found, "head"), (worker, worker_found, "worker"))
    built = [_side(s, mine, head_found, image, template_digest) for s, mine, _where in sides]
    containers = [mine.get("container") or {} for _s, mine, _where in sides]
    refusals = [r for (s, _mine, where), c in zip(sides, containers, strict=True)
                for r in [foreign(where, s.container_name, c)] if r]
    stopped = {rank: f"Docker restarts on the {where} ({why})"
               for rank, ((_s, _mine, where), why) in enumerate(zip(sides, docker_restarts, strict=True)) if why}
    reasons = pair_verdict([(rank, containers[rank], spec.spec_hash() if spec else None)
                            for rank, (spec, _problems) in enumerate(built)], force, stopped)
    ranks = []
    for rank, ((s, mine, where), (spec, problems), container) in enumerate(zip(sides, built, containers,
                                                                                strict=True)):
        if foreign(where, s.container_name, container):
            action = REFUSED
        elif not reasons:
            action = KEEP
        else:
            action = RECREATE if container else START
        memory = memory_problem(s, mine, where)
        ranks.append(RankPlan(rank, where, spec, action, container, tuple(problems), (memory,) if memory else (),
                              tuple(port_problems(s, mine, where))))
    labels = [(c.get("labels") or {}).get(LABEL_HASH) if c.get("running") else None for c in containers]
    running = generation_id([str(label) for label in labels]) if all(labels) else ""
    records = tuple(read_records((found.get("generations") or {}).get("files") or {},
                                 (found.get("generations") or {}).get("last_good") or "",
                                 (found.get("generations") or {}).get("now") or 0.0)
                    for found in (head_found, worker_found))
    sampling, sampling_warnings = sampling_plan(head, head_found.get("capabilities") or None)
    return PairPlan((ranks[0], ranks[1]), tuple(reasons), tuple(refusals),
                    generation_of([spec for spec, _problems in built]), running, (records[0], records[1]), image,
                    docker_restarts, sampling, tuple(sampling_warnings))


# --- rollback.py ------------------------------------------------------------------------------------------------

def rollback_target(plan: PairPlan) -> Generation | None:
    """What rollback.py starts again: the newest good generation other than the one serving (the head's records), or
    the last good one when nothing serves (a failed rollback, a stop); None when no other one served."""
    records, current = plan.records[0], plan.running
    return records.previous(current) if current else (records.get(records.last_good) or records.previous(""))


def retargeted(plan: PairPlan, target: Generation | None) -> PairPlan:
    """rollback.py's plan: `target`'s recorded specs are the wanted ones, so the deploy's own stop and start replace
    the pair with it (both ranks, rank 1 first); the settings' launch checks do not apply to a record. None (no
    target, or one refused): nothing to change, both ranks left as they are."""
    if target is None:
        return replace(plan, ranks=(replace(plan.ranks[0], action=_left(plan.ranks[0])),
                                    replace(plan.ranks[1], action=_left(plan.ranks[1]))), reasons=())
    ranks = tuple(replace(rank, spec=target.specs[rank.rank], problems=(), memory=(), ports=(),
                          action=REFUSED if rank.action == REFUSED else RECREATE if rank.container else START)
                  for rank in plan.ranks)
    served = f"generation {plan.running} serves now" if plan.running else "no generation serves now"
    return replace(plan, ranks=(ranks[0], ranks[1]), wanted=target,
                   reasons=(f"rollback.py starts generation {target.id} again ({served})",))


def _left(rank: RankPlan) -> str:
    return REFUSED if rank.action == REFUSED else KEEP
