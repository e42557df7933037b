"""The pair of ranks: served by deploy.py (restart.py is deploy.py with `restart` on), stopped by stop.py, switched
back by rollback.py.

The step reads `RankInputs` of both Sparks (one round trip each, operations/facts/rank.py) and asks the pure
`pair_plan` (operations/rank/plan.py) what to do, the way pyinfra's docker.container reads its container and diffs
a spec: once per phase (`PairPlans`: before the stop, after the start, after the gate), by the first operation of
the phase that needs it; the others take that plan as data. Both Sparks read the same data and so reach the same
verdict, and both ranks are removed and started again together. The answers are kept only until an operation of
this run changes a Spark (fact_until_change): a phase that follows a stop or a start reads again, while both
Sparks' operations of one phase share one read of each Spark. Each plan also takes whether this run's docker step
restarts Docker on either Spark (operations/docker/daemon.py, from that step's own answers): the restart stops the
rank there, so --dry shows the pair's restart that follows.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gevent
from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.api.host import Host
from pyinfra.context import ctx_config, ctx_host
from pyinfra.facts.files import Directory

from operations.build.image_hash import HASH_LABEL, image_ref
from operations.data.copy import versions_dir
from operations.docker.daemon import docker_restart
from operations.facts.docker import DaemonJson, DockerRuntimeInfo, RankContainer
from operations.facts.network import PortListeners
from operations.facts.rank import PruneInputs, RankInputs, RankInputsDict, StartReady
from operations.facts.systemd import UnitState
from operations.layout import DOCKER_DAEMON_JSON, SUPERVISOR_UNIT, unit_path
from operations.owned.files import file_put
from operations.rank import exposure, serving, switch
from operations.rank.commands import record_command, removal_commands, root_only
from operations.rank.generation import (
    Generation,
    prune_paths,
    prune_plan,
    runs_last_good,
)
from operations.rank.plan import (
    KEEP,
    REFUSED,
    START,
    PairPlan,
    foreign,
    pair_plan,
    retargeted,
    rollback_target,
)
from operations.rank.spec import CHAT_TEMPLATE, ContainerSpec, template_digest
from operations.rank.switch import Api, Side, SwitchInputs, SwitchNotes
from operations.settings import Settings
from operations.settings.context import peer_host
from operations.settings.site import ssh_check
from operations.util import check_failed
from operations.util.checks import op_changed, warned
from operations.util.fact_reuse import fact_until_change

# why: a fact read inside rank_started inherits its _ignore_errors (pyinfra get_fact): a failed read must still fail
_STRICT: dict[str, Any] = {"_ignore_errors": False}

BEFORE_STOP, AFTER_START, AFTER_GATE = "before the stop", "after the start", "after the gate"


def rank_inputs_args(s: Settings, image: str) -> dict[str, Any]:
    """The RankInputs arguments for Spark `s` (what the pair step and status.py read of it, next to where it is
    read): its paths, and the image's capabilities on the head only."""
    layout = s.layout
    return {"container": s.container_name, "link_record": layout.link_record, "served": layout.served_link,
            "kit": layout.kit, "rank_link": layout.active_rank_link(),
            "ablit": layout.ablit_current if s.ablit and s.is_head else "", "image": image if s.is_head else "",
            "capabilities_cache": layout.capabilities_cache if s.is_head else "",
            # the ports its rank listens on: rank 0 the API and the rendezvous; rank 1 only connects
            "ports": (s.port, s.master_port) if s.is_head else (),
            "generations": layout.generations}


def _holders_named(spark: Host, found: RankInputsDict) -> RankInputsDict:
    """A held port's holders named as root (`ss -p` names other users' processes only for root): asked only when a
    port is held, so the composite fact runs as the ssh user."""
    held = [port for port, holders in found["port_holders"].items() if holders]
    if not held:
        return found
    named = {port: fact_until_change(spark, PortListeners, port=port, _sudo=True, **_STRICT)
             or found["port_holders"][port]
             for port in held}
    return {**found, "port_holders": {**found["port_holders"], **named}}


def _read_side(spark: Host, args: dict[str, Any]) -> tuple[RankInputsDict, str]:
    """`spark`'s RankInputs (as the ssh user, its held ports' holders as root) and why this run's docker step
    restarts Docker there ("" when it does not), from that step's own answers (read as root, as that step reads them):
    all kept until an operation changes a Spark, so a converged run asks nothing more, and once the restart has run
    the answer is read again and is ""."""
    daemon = fact_until_change(spark, DaemonJson, path=DOCKER_DAEMON_JSON, _sudo=True, **_STRICT)
    restarts = docker_restart(daemon, fact_until_change(spark, DockerRuntimeInfo, _sudo=True, **_STRICT))
    return _holders_named(spark, fact_until_change(spark, RankInputs, **args, **_STRICT)), restarts


def _read_on(spark: Host, config: Any, args: dict[str, Any]) -> tuple[RankInputsDict, str]:
    with ctx_host.use(spark), ctx_config.use(config):  # a greenlet of its own starts with no pyinfra context
        return _read_side(spark, args)


def _side(side: Settings) -> Side:
    layout = side.layout
    return Side(side.role, side.rank, side.container_name, side.stop_timeout, layout.logs, side.log_keep,
                side.min_avail_gib, side.gpu_clock_mhz, side.nvidia_smi_path, layout.rank_env, layout.generations,
                side.progress_every_s)


def switch_inputs(s: Settings) -> SwitchInputs:
    """What a switch (operations/rank/switch.py) reads of the settings: both ranks' stop and start, the API."""
    return SwitchInputs(sides=(_side(s.head), _side(s.worker)),
                        api=Api(s.api_base_url, s.served_name, bool(s.api_key), s.port),
                        api_url_given=bool(s.api_url), api_key_file=s.layout.api_key,
                        asked=exposure.of_settings(s), wait_timeout=s.wait_timeout, upgrade_gate=s.upgrade_gate,
                        supervise=s.supervise, engine_image=s.engine_image, prebuilt_image=s.prebuilt_image)


@dataclass(eq=False)
class PairPlans:
    """One Spark's pair step: what it serves (the settings, the other Spark, the image and the chat template's
    digest, both Sparks' RankInputs arguments and the switch's inputs, all made once on this machine before the step:
    `of`) and its `PairPlan` of each phase, read from both Sparks by the first operation of the phase that asks and
    handed to the others as data:

    - before the stop: the check, the exact gate's record, the stop, each start's spec, and the switch pair_serving
      judges (a stop and a start change only the containers: the specs, the records and the switch stay as read);
    - after the start: whether rank 1 runs its spec, asked by rank 0's start once rank 1's start has run;
    - after the gate: the generation record and the prune, once the new pair passed its gate.

    pyinfra runs an operation's generator while planning and again while executing, so each pass fills its own
    slots: a plan read while planning is never judged by the executing run."""

    s: Settings
    peer: Host
    image: str
    template: str
    inputs_args: tuple[dict[str, Any], dict[str, Any]]  # RankInputs' arguments: this Spark's, the other Spark's
    switch_inputs: SwitchInputs
    rollback: bool = False  # rollback.py: every phase's plan wants the rollback's target (`rollback_choice`)
    _read: dict[tuple[str, bool], PairPlan] = field(default_factory=dict, repr=False)
    _rollback: dict[bool, RollbackChoice] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, s: Settings, peer: Host, image: str, template: str, rollback: bool = False) -> PairPlans:
        return cls(s, peer, image, template, (rank_inputs_args(s, image), rank_inputs_args(s.the_peer, image)),
                   switch_inputs(s), rollback)

    def plan(self, phase: str) -> PairPlan:
        """The phase's plan (rollback.py's: retargeted at its target, chosen once from the plan before the stop)."""
        read = self._read_plan(phase)
        return retargeted(read, self.rollback_choice().target) if self.rollback else read

    def rollback_choice(self) -> RollbackChoice:
        """rollback.py's target and why it is refused, from the plan before the stop and both Sparks' StartReady:
        each Spark works it out from the same reads, so both reach the same verdict."""
        # why: chosen once per pass (planning, then executing), as the plan it comes from is read once per pass
        key = bool(state.is_executing)
        if key not in self._rollback:
            self._rollback[key] = _rollback_choice(self, self._read_plan(BEFORE_STOP))
        return self._rollback[key]

    def _read_plan(self, phase: str) -> PairPlan:
        """The phase's plan as read: both Sparks' RankInputs, one round trip each and both at once (the peer's in a
        greenlet: they are two connections), and whether Docker restarts on each, then the pure plan."""
        # why: pyinfra runs each operation while planning and again while executing: a planned read is not judged
        key = (phase, bool(state.is_executing))
        if key not in self._read:
            s, (mine_args, theirs_args) = self.s, self.inputs_args
            theirs_read = gevent.spawn(_read_on, self.peer, ctx_config.get(), theirs_args)
            mine = _read_side(host, mine_args)
            theirs = theirs_read.get()
            (head_found, head_docker), (worker_found, worker_docker) = (mine, theirs) if s.is_head else (theirs, mine)
            self._read[key] = pair_plan(s.head, s.worker, head_found, worker_found, image=self.image,
                                        template_digest=self.template, force=bool(s.restart),
                                        docker_restarts=(head_docker, worker_docker))
        return self._read[key]

    def runs_last_good(self, rank: int, phase: str = BEFORE_STOP) -> bool:
        """The pair ran, when `phase` was read, the generation `rank`'s Spark records as the last good one."""
        plan = self.plan(phase)
        return runs_last_good(plan.records[rank], plan.running)


@operation()
def pair_checked(plans: PairPlans):
    """Refuse before anything is touched: a foreign container with our name (on either Spark), this rank's launch
    problems (inputs, rails, rank 0's flags against the image), too little memory for a rank that is not there, or
    one of its ports held by another process. Reads the plan before the stop."""
    s, plan = plans.s, plans.plan(BEFORE_STOP)
    mine = plan.rank(s.rank)
    if plan.refusals:  # the rest would judge a container that is not ours
        yield from check_failed("the rank containers", plan.refusals)
        return
    if s.is_head:  # what a client that sends no sampling fields inherits, and a setting the image cannot carry
        logger.info(f"{host.name}: {plan.sampling}")
        for warning in plan.sampling_warnings:
            warned("the served sampling", warning)
    # while planning, a missing input (image, link record) may still be made by this run: only its problems count
    if (yield from check_failed("the launch", mine.problems, settled=mine.spec is not None)):
        return
    if (yield from check_failed("memory", mine.memory)):
        return
    if (yield from check_failed("ports", mine.ports)):
        return
    if s.is_head and plan.stale:
        logger.info(f"{host.name}: {plan.switch.line()}")  # --dry says it too: what the run switches, and the way back
    host.noop(f"the {mine.where}'s launch checks pass")


@operation()
def stale_pair_stopped(plans: PairPlans, pause_units: tuple[str, ...] = (), notes: SwitchNotes | None = None):
    """Both Sparks: when the pair is stale (either rank missing, stopped or changed, or a restart is asked for),
    save this rank's log and remove its container, so both ranks start again together. Judges the plan before the
    stop (no operation between the check and here changes a Spark: the exact gate's record only asks the API).

    pause_units: systemd units (the supervisor) stopped first while they run, so they do not restart the old pair
    behind the deploy's back; the deploy starts them again after the health check. notes: the head's, to time how
    long the API is down when a serving pair is replaced."""
    s, plan = plans.s, plans.plan(BEFORE_STOP)
    if not plan.stale:
        host.noop("both ranks run the wanted spec")
        return
    if plan.refusals:  # never planned as a removal: the container is not ours
        yield from check_failed("the rank containers", plan.refusals)
        return
    # said before the first command: --dry stops an operation there
    logger.info(f"{host.name}: the pair restarts: {'; '.join(plan.reasons)}")
    for unit in pause_units:
        if host.get_fact(UnitState, unit=unit, path=unit_path(unit))["active"] in ("active", "activating"):
            yield StringCommand("systemctl", "stop", unit, _sudo=True)
    mine = plan.rank(s.rank)
    if notes is not None and plan.running:
        yield FunctionCommand(_stop_noted, (notes,), {})
    if mine.action == START:
        host.noop("no rank container here to remove")
        return
    yield from switch.rank_stop(plans.switch_inputs.sides[s.rank], mine.container)


@operation()
def rank_started(plans: PairPlans, notes: SwitchNotes | None = None):
    """Start this rank's container unless it runs the wanted spec: mounts checked, memory waited for, the GPU clock
    lock applied again, then `docker run`. Its action and spec are the plan before the stop (the stop removed
    containers only), so --dry shows a rank to recreate with the start it will get. Rank 0 is not started when rank
    1 did not start (its start ran just before; read after it): the pair step judges the switch failed and starts
    the last good pair again (pair_serving). Called with _ignore_errors, so that a start that fails on either Spark
    reaches that judgement instead of ending the run with no rank serving."""
    s = plans.s
    mine = plans.plan(BEFORE_STOP).rank(s.rank)
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
    # why: only an executing run has started rank 1 (while planning there is no start to read after)
    if s.is_head and state.is_executing:
        theirs = plans.plan(AFTER_START).rank(1)
        if not theirs.runs_wanted:  # an unknown spec did not start either
            problem = (f"rank 1 did not start on the worker ({_container_state(theirs.container)}; its error is "
                       "above), so rank 0 is not started")
            if notes is not None:
                notes.start_problem = problem
            yield from check_failed("the switch", [problem])
            return
    yield from switch.rank_start(plans.switch_inputs.sides[s.rank], mine.spec)


def _container_state(container: Mapping[str, Any]) -> str:
    if not container:
        return "no container"
    return f"its container is {container.get('status') or '?'}, exit code {container.get('exit_code')}"


def _stop_noted(state: Any, host: Host, notes: SwitchNotes) -> bool:
    notes.stopped_at = switch.clock()
    return True


def _old_pair_recorded(state: Any, host: Host, inputs: SwitchInputs, notes: SwitchNotes) -> bool:
    notes.replay = switch.replay_record(inputs, host)
    return True  # an old pair that does not answer is said, and the smoke test alone judges the new one


@operation()
def old_pair_replayed(plans: PairPlans, notes: SwitchNotes):
    """Head, upgrade_gate = "exact": before a serving pair is replaced (the plan before the stop says so), its
    replies to the gate's prompts at temperature 0 are recorded here, for the new pair's to be compared with."""
    plan = plans.plan(BEFORE_STOP)
    came_from = plan.switch.came_from
    if any(plan.docker_restarts):  # the restart stops the serving pair first: nothing answers by then
        host.noop("Docker's restart stops the serving pair before the switch: nothing to record for the exact gate")
        return
    if not plan.stale or came_from is None or plan.running != came_from.id:
        host.noop("no serving pair is replaced: nothing to record for the exact gate")
        return
    yield FunctionCommand(_old_pair_recorded, (plans.switch_inputs, notes), {})


def _start_failure(rank0: Any, notes: SwitchNotes) -> str | None:
    """Why the pair's start failed, once rank 0's start ran and failed (rank_started ignores its errors): the reason
    the head noted (rank 1 did not start), or rank 0's own failure; None otherwise."""
    if rank0.is_complete() and not rank0.did_succeed():
        return notes.start_problem or "rank 0 did not start on the head (its error is above)"
    return None


@operation()
def pair_serving(plans: PairPlans, rank0: Any, notes: SwitchNotes):
    """Head: after a (re)start, the new pair's health wait, smoke test and optional exact gate, and the LIVE line
    with the API's downtime; when it fails, the last good generation started again (operations/rank/switch.py).
    A pair that runs but was never judged (no record says it passed) is judged the same way. Otherwise one quick
    check of the API and the LIVE line. Asking the API is this machine's request, not
    a fact: while planning, only executing can say whether it answers (hence the one is_executing branch).
    A start that failed on either Spark (rank_started ignores its errors) is judged failed at once, without the
    health wait: the last good pair is started again. The switch judged, and whether the pair ran the last good
    generation, are the plan before the stop's: the starts since changed containers only (and rank0 says whether
    one ran)."""
    s, worker, checked, inputs = plans.s, plans.peer, plans.plan(BEFORE_STOP), plans.switch_inputs
    failed = _start_failure(rank0, notes)
    if failed is not None:
        yield FunctionCommand(switch.new_pair_served, (worker, inputs, checked.switch, notes, failed), {})
        return
    if op_changed(rank0) or not plans.runs_last_good(0):
        # started now, or running but never judged (a run cut short after the start, an older sparkfold): judged
        # like any new pair before it may become the last good one
        yield FunctionCommand(switch.new_pair_served, (worker, inputs, checked.switch, notes), {})
        return
    if not state.is_executing:  # why: asking the API is this machine's request, not a fact: only a run asks it
        host.noop("the pair is not restarted: one quick API check at execute time")
        return
    key = serving.read_api_key(host, s.layout.api_key) if s.api_key else ""
    down = serving.ranks_down(host, worker, s.container_name)
    problem = down or serving.models_listed(s.api_base_url, s.served_name, key)
    if problem is None:
        for line in switch.live(inputs, inputs.api, inputs.asked):
            logger.info(line)
        host.noop(f"{s.served_name} serves at {s.api_base_url}/v1")
        return
    if down:
        message = f"{down}: run deploy.py again to restart the pair"
        yield FunctionCommand(switch.failed_with_logs, (worker, s.container_name, message), {})
        return
    logger.info(f"{host.name}: {problem}; waiting for rank 0 (it may still be loading)")
    yield FunctionCommand(switch.new_pair_served, (worker, inputs, checked.switch, notes), {})


def records_moved_command(legacy: str, folder: str) -> StringCommand:
    """The records an older sparkfold kept in `legacy` (the ssh user's folder) copied into the root-only `folder`
    (none over one there already, never a symlink: `cp -P` copies a link as a link, which the fact never reads),
    then `legacy` removed. They were writable by the ssh user, so they are as trusted as any record: checked before
    a start (operations/rank/record_check.py)."""
    old, d = shlex.quote(legacy), shlex.quote(folder)
    return StringCommand("sh", "-c", shlex.quote(
        f"{root_only(d)} && "
        f"for f in {old}/*.json {old}/last-good; do [ -f \"$f\" ] && [ ! -L \"$f\" ] && "
        f"[ ! -e {d}/\"${{f##*/}}\" ] || continue; cp -P -- \"$f\" {d}/ && chmod 600 {d}/\"${{f##*/}}\"; done && "
        f"rm -rf -- {old}"), _sudo=True)


@operation()
def generation_records_moved(legacy: str, folder: str):
    """Once: the records moved out of the ssh user's state_dir into the root-only folder (layout.GENERATIONS_DIR)."""
    if not host.get_fact(Directory, path=legacy):
        host.noop(f"no generation records left in {legacy}")
        return
    yield records_moved_command(legacy, folder)


@operation()
def generations_kept(plans: PairPlans, started: Any = None):
    """Once a new pair passed its gate: its generation recorded on this Spark as the last good one, then what no
    kept generation uses removed (keep_generations of them and the serving one): weight folders, kit versions, ABLIT
    packs, the engine images sparkfold built, old records. Only then: a run that switched nothing (or rolled back)
    removes nothing. Never a folder moved aside (replaced-*), a symlink, an image a container uses, or an image
    sparkfold did not build. Nothing started since the check: the plan before the stop judges; else the plan after
    the gate."""
    s = plans.s
    if plans.rollback and plans.rollback_choice().target is None:  # refused: rollback_checked says why
        host.noop("no rollback: nothing to record")
        return
    if started is not None and not op_changed(started) and plans.runs_last_good(s.rank):
        host.noop("this rank runs the last good generation")  # nothing started since the check: asked nothing
        return
    if plans.runs_last_good(s.rank, AFTER_GATE):
        host.noop("this rank runs the last good generation")
        return
    plan = plans.plan(AFTER_GATE)
    wanted = plan.wanted
    if wanted is None:
        unknown = ["the serving pair's specs are not known (" + "; ".join(plan.rank(s.rank).problems) + ")"]
        if (yield from check_failed("the generation record", unknown, settled=False)):
            return
        yield StringCommand("echo", "...", "(the generation is recorded once the pair serves)")
        return
    records = plan.records[s.rank]
    recorded = records.get(wanted.id)
    if recorded is not None and recorded.good_at and records.last_good == wanted.id:
        host.noop(f"generation {wanted.id} is the last good one")  # pruned when it became so
        return
    yield record_command(s.layout.generations, Generation(wanted.id, wanted.specs, good_at=time.time()))
    if plans.rollback:  # rollback.py removes nothing: the generation it left stays, to switch back to
        return
    layout = s.layout
    kinds = {"weights": layout.rank_cache, **({"kit": versions_dir(layout.kit)} if s.is_head else {}),
             **({"ablit": layout.ablit} if s.is_head and s.ablit else {})}
    found = host.get_fact(PruneInputs, label=HASH_LABEL, folders=tuple(kinds.values()),
                          paths=prune_paths(records, wanted, s.rank))
    listed = {kind: (entry["real"], entry["names"]) for kind, folder in kinds.items()
              for entry in [found["folders"].get(folder) or {"real": "", "names": []}]}
    prune = prune_plan(records, s.keep_generations, wanted, s.rank, listed, found["images"], found["in_use"],
                       real=found["real"])
    if prune.refused:
        warned("the prune of old generations", prune.refused)
        return
    if not prune:
        return
    logger.info(f"{host.name}: generations no longer kept (keep_generations = {s.keep_generations}): "
                f"{', '.join(prune.records) or 'no records'}; removing what they alone used")
    if prune.folders:
        yield StringCommand("rm", "-rf", "--", *[shlex.quote(f) for f in prune.folders])
    if prune.images:
        yield StringCommand("docker", "image", "rm", *[shlex.quote(i) for i in prune.images], ">/dev/null")
    if prune.records:
        files = [shlex.quote(f"{layout.generations}/{gid}.json") for gid in prune.records]
        yield StringCommand("rm", "-f", "--", *files, _sudo=True)


def pair_plans(s: Settings, rollback: bool = False) -> PairPlans:
    """The pair step's handoff of this Spark, made where the step is called (deploy.py, rollback.py): the controller's
    inputs, read once (the other Spark, the content-addressed image, the template rank 0 serves)."""
    return PairPlans.of(s, peer_host(s), image_ref(s), template_digest(s), rollback)


@deploy("The pair of ranks")
def ranks_serving(plans: PairPlans) -> None:
    """Check, then (only when stale) switch the pair: the old one recorded for the exact gate, both ranks removed,
    rank 1 started, then rank 0; then the health wait, the smoke test through both ranks (and the exact gate) and
    the LIVE line, or the last good generation back; then the serving generation recorded and old ones pruned.
    plans: pair_plans of this Spark's settings."""
    s = plans.s
    layout = s.layout
    if s.is_head:
        file_put(name="Chat template for rank 0", src=str(s.project_root / CHAT_TEMPLATE), dest=layout.chat_template,
                 mode="644")
    notes = SwitchNotes()  # the head's operations of the switch tell each other when the old pair stopped, its record
    generation_records_moved(name="Generation records in the root-only folder", legacy=layout.legacy_generations,
                             folder=layout.generations)
    pair_checked(name="Check the launch (container ownership, rank 0's flags, link record, memory, ports)",
                 plans=plans)
    if s.is_head and s.upgrade_gate == "exact":
        old_pair_replayed(name="Exact gate: the serving pair's replies recorded", plans=plans, notes=notes)
    # the supervisor must not restart the old pair while the deploy replaces it (supervision starts it again)
    pause = (SUPERVISOR_UNIT,) if s.is_head and s.supervise else ()
    stale_pair_stopped(name="Stop the stale pair (logs saved first)", plans=plans, pause_units=pause,
                       notes=notes if s.is_head else None)
    # why _ignore_errors: a failed start is pair_serving's to judge (the last good pair again); FAIL_PERCENT 0 would
    # end the run there, with no rank serving
    if not s.is_head:
        started = rank_started(name="Start rank 1 (worker)", plans=plans, _ignore_errors=True)
    if s.is_head:
        started = rank_started(name="Start rank 0 (head)", plans=plans, notes=notes, _ignore_errors=True)
        pair_serving(name="Rank 0's API: wait, smoke test through both ranks, LIVE (or roll back)", plans=plans,
                     rank0=started, notes=notes)
    generations_kept(name="The serving generation recorded; old generations pruned", plans=plans, started=started)


def start_ready_problem(where: str, spec: ContainerSpec, ready: Mapping[str, Any]) -> str | None:
    """Why a recorded rank cannot start on this Spark again (its image or a folder it mounts is gone), or None."""
    gone = ([f"the image {spec.image}"] if not ready.get("image") else []) + list(ready.get("missing") or [])
    return f"on the {where}: {', '.join(gone)} (removed since it served)" if gone else None


@dataclass(frozen=True)
class RollbackChoice:
    """rollback.py's verdict: the generation it starts again, or the check that refuses it (nothing stops then)."""

    target: Generation | None
    came_from: str  # the generation serving now, as its line says it ("(none)")
    check: str = ""
    problems: tuple[str, ...] = ()


def _rollback_choice(plans: PairPlans, plan: PairPlan) -> RollbackChoice:
    """The newest good generation other than the one serving, refused when there is none, when a container with our
    name is not ours, when its record fails its check, when it is more open than the settings ask (without
    rollback_open), or when its image or a folder it mounts is gone on either Spark (StartReady, read on both)."""
    s = plans.s
    came_from = plan.running or "(none)"
    if plan.refusals:
        return RollbackChoice(None, came_from, "the rank containers", plan.refusals)
    target = rollback_target(plan)
    if target is None:
        return RollbackChoice(None, came_from, "rollback", (
            f"no earlier generation that served is recorded in {s.layout.generations} (only "
            f"{plan.running or 'none'}): nothing to roll back to",))
    check = f"rollback to generation {target.id}"
    refused = switch.refusal_of(plans.switch_inputs, target)
    if refused:
        return RollbackChoice(None, came_from, check, (refused,))
    opened = exposure.more_open(exposure.of_argv(target.specs[0].argv), plans.switch_inputs.asked)
    if opened and not s.rollback_open:  # a rollback must not quietly reopen what the settings closed
        return RollbackChoice(None, came_from, check, (
            f"its API is more open than the settings ask: {'; and '.join(opened)}. To start it all the same, for this "
            "run only: pyinfra inventory.py rollback.py --data rollback_open=true (it stays that open until "
            "the next deploy.py); or run deploy.py, which starts the pair the settings ask for",))
    head, worker = (host, plans.peer) if s.is_head else (plans.peer, host)
    problems = []
    for spark, where, spec in ((head, "head", target.specs[0]), (worker, "worker", target.specs[1])):
        paths = tuple(src for src, _dst, _ro in spec.mounts if src.startswith("/") and _ro)
        ready = spark.get_fact(StartReady, image=spec.image, paths=paths)
        problems.append(start_ready_problem(where, spec, ready))
    found = tuple(p for p in problems if p)
    return RollbackChoice(None, came_from, check, found) if found else RollbackChoice(target, came_from)


@operation()
def rollback_checked(plans: PairPlans):
    """Both Sparks (rollback.py): the previous good generation chosen and checked before anything stops
    (`RollbackChoice`; said by --dry too, and then no switch is planned on either Spark). Each Spark fixes its choice
    here, from reads made before any stop; the head says a refusal (and fails the run), the worker only notes it."""
    choice = plans.rollback_choice()
    if choice.target is None:
        if plans.s.is_head:
            yield from check_failed(choice.check, choice.problems)
        else:
            host.noop(f"{choice.check}: refused (the head says why)")
        return
    if plans.s.is_head:
        logger.info(f"{host.name}: rollback: generation {choice.came_from} → {choice.target.id}")
    host.noop(f"generation {choice.target.id} can start again on both Sparks")


@operation()
def rollback_serving(plans: PairPlans, rank0: Any, notes: SwitchNotes):
    """Head (rollback.py): the pair started from the target's record judged where its rank 0 answers (health wait,
    smoke test), the supervisor the stop paused started again, the LIVE line; a failed start fails it at once. Each
    Spark's generations_kept records the target as the last good generation only once this passed."""
    choice = plans.rollback_choice()
    if choice.target is None:
        host.noop("no rollback: nothing was started")
        return
    failed = _start_failure(rank0, notes)
    yield FunctionCommand(switch.rollback_served, (plans.peer, plans.switch_inputs, choice.target, choice.came_from,
                                                   notes, failed), {})


@deploy("Roll back to the previous generation")
def rolled_back(s: Settings) -> None:
    """rollback.py: the previous good generation started again from its record, through deploy.py's own stop and
    start operations (`PairPlans` with rollback=True: every phase's plan wants the target), rank 1 first; judged on
    the head; then recorded on both Sparks as the last good one (nothing is pruned)."""
    plans = pair_plans(s, rollback=True)
    notes = SwitchNotes()
    rollback_checked(name="Rollback: the previous good generation, ready on both Sparks", plans=plans)
    pause = (SUPERVISOR_UNIT,) if s.is_head and s.supervise else ()
    stale_pair_stopped(name="Stop the serving pair (logs saved first)", plans=plans, pause_units=pause,
                       notes=notes if s.is_head else None)
    # why _ignore_errors: a failed start is rollback_serving's to judge (it starts the paused supervisor again)
    if not s.is_head:
        started = rank_started(name="Start rank 1 (worker) from its record", plans=plans, _ignore_errors=True)
    if s.is_head:
        started = rank_started(name="Start rank 0 (head) from its record", plans=plans, notes=notes,
                               _ignore_errors=True)
        rollback_serving(name="Rank 0's API: wait, smoke test through both ranks, LIVE", plans=plans, rank0=started,
                         notes=notes)
    generations_kept(name="The generation rolled back to recorded as the last good one", plans=plans,
                     started=started)


@operation()
def rank_stopped(container_name: str, rank: int, stop_timeout: int, log_dir: str, log_keep: int):
    """Stop and remove this Spark's rank (log saved first), then show what still holds the GPU."""
    mine = host.get_fact(RankContainer, container=container_name)
    if not mine:
        host.noop(f"no container named {container_name} here: rank {rank} is stopped")
        return
    refusal = foreign("head" if rank == 0 else "worker", container_name, mine)  # rank 0 runs on the head
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


def not_stopped(peer_name: str, role: str, rank: int, check: str) -> str:
    """stop.py's line for the Spark it could not reach (`check`: the command that shows why)."""
    return (f"{peer_name} (the {role}) did not answer over ssh, so rank {rank} there was not stopped and still holds "
            f"its memory: `{check}` shows why; run stop.py again once it answers")


@operation()
def peer_rank_stopped(problem: str | None):
    """Fail this Spark's stop (last, once its own rank is stopped and the lock released) when the other Spark did
    not answer: the run then ends non-zero and names what is left running."""
    if (yield from check_failed("stop.py", [problem])):
        return
    host.noop("the other Spark answered: its own run stops its rank")


@deploy("The other Spark's rank")
def peer_rank_reached(s: Settings) -> None:
    """stop.py: pyinfra goes on with the Spark that answers (config.py); this says what it could not stop."""
    peer = peer_host(s)
    problem = None if peer.connected else not_stopped(peer.name, s.the_peer.role or "?", s.the_peer.rank,
                                                      ssh_check(peer.data, peer.name))
    peer_rank_stopped(name="The other Spark's rank stopped too", problem=problem)
