"""The rank containers: checked, recorded, recreated as a pair only when stale, started rank 1 then rank 0.

Each container carries `sparkfold.spec-hash` (the digest of its whole spec). Each Spark records the hash it
should run in a small file, so either Spark can tell whether its peer is current from the peer's facts alone:
both then reach the same "pair is stale" verdict, and both ranks are removed and started again together.

The operations are given this Spark's `Launch` (operations/launch.py) and ask it for the wanted spec themselves, so
at execute time they see what earlier operations of the run (link record, image build, weight files) created.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyinfra import host, logger, state
from pyinfra.api import StringCommand, operation

from .facts.docker import RankContainer, SpecRecord
from .facts.host import MemInfo, mem_available_gib
from .facts.network import PortListeners
from .facts.systemd import UnitState
from .gpu_clock import lock_command
from .launch_spec import LABEL_HASH, LABEL_MANAGED, ContainerSpec
from .layout import unit_path
from .util import MANAGED_HEADER, check_failed, fail_command, sh
from .util.progress import TICK_S, LiveCommand
from .util.run_memo import fact_until_change

if TYPE_CHECKING:
    from .launch import Launch


# --- decisions (pure) -------------------------------------------------------------------------------------------

def pair_verdict(ranks: list[tuple[int, Mapping[str, Any], str | None]], force: bool) -> list[str]:
    """Why the pair must be recreated ([] = leave it running). ranks: (rank, container fact, wanted spec hash or
    None when not known yet). Both Sparks pass the same data and so reach the same verdict."""
    reasons = ["a restart was asked for (restart = true)"] if force else []
    for rank, c, want in sorted(ranks, key=lambda r: r[0]):
        if not c:
            reasons.append(f"rank {rank} has no container")
        elif not c.get("running"):
            reasons.append(f"rank {rank} is not running ({c.get('status', '?')}, exit code {c.get('exit_code')}"
                           f"{', killed by the OOM killer' if c.get('oom_killed') else ''})")
        elif want and (c.get("labels") or {}).get(LABEL_HASH) != want:
            reasons.append(f"rank {rank}'s settings or image changed")
    return reasons


def unmanaged(where: str, name: str, c: Mapping[str, Any]) -> str | None:
    """The refusal for a container that has our name but was not started by sparkfold."""
    if c and (c.get("labels") or {}).get(LABEL_MANAGED) != "1":
        return (f"a container named {name} on the {where} was not started by sparkfold (it lacks the label "
                f"{LABEL_MANAGED}=1), so it is left alone: remove it yourself (docker rm -f {name}) or set "
                "container_name to another name")
    return None


def is_current(c: Mapping[str, Any], spec: ContainerSpec | None) -> bool:
    return bool(c and c.get("running") and spec and (c.get("labels") or {}).get(LABEL_HASH) == spec.spec_hash())


# --- shell commands ---------------------------------------------------------------------------------------------

def save_log_command(name: str, rank: int, log_dir: str, log_keep: int) -> StringCommand:
    """Save the container's log (docker rm deletes it), keeping the newest `log_keep` per rank."""
    d = shlex.quote(log_dir)
    script = (
        f"mkdir -p {d} && ts=$(date +%Y%m%d-%H%M%S) && f={d}/\"$ts\"-rank{rank}.log.gz && i=1 && "
        f"while [ -e \"$f\" ]; do f={d}/\"$ts\"-rank{rank}.$i.log.gz; i=$((i+1)); done && "
        f"docker logs --timestamps {shlex.quote(name)} 2>&1 | gzip > \"$f\" && "
        f"echo \"sparkfold: saved rank {rank}'s log in $f\" && "
        f"ls -1t {d}/*-rank{rank}.log.gz {d}/*-rank{rank}.*.log.gz 2>/dev/null | tail -n +{int(log_keep) + 1} | "
        "while read -r old; do rm -f -- \"$old\"; done"
    )
    return StringCommand("sh", "-c", shlex.quote(script))


def removal_commands(name: str, rank: int, running: bool, stop_timeout: int, log_dir: str, log_keep: int):
    """Stop (politely first), save the log, remove."""
    if running:
        yield StringCommand(sh("docker", "stop", "-t", stop_timeout, name), ">/dev/null")
    yield save_log_command(name, rank, log_dir, log_keep)
    yield StringCommand(sh("docker", "rm", "-f", name), ">/dev/null")


MEMORY_POLL_S = 2  # between two reads of MemAvailable while a rank's memory comes back


def memory_wait_command(rank: int, min_avail_gib: float, tries: int = 30, failure: str = "") -> StringCommand:
    """Fail unless MemAvailable reaches min_avail_gib within about a minute (memory comes back after a stop).
    failure: the message on timeout (default: rank `rank` needs ...)."""
    need_kib = int(min_avail_gib * 1024 * 1024)
    said = (f"echo {shlex.quote(failure)} >&2" if failure else
            f"echo \"sparkfold: rank {rank} needs min_avail_gib = {min_avail_gib:g} GiB of MemAvailable on this "
            "Spark but only $((${a:-0}/1048576)) GiB is available: stop what else uses memory here, or lower "
            "min_avail_gib\" >&2")
    # a line every TICK_S while it waits (LiveCommand: shown as it comes, at pyinfra's default verbosity)
    per_line = max(TICK_S // MEMORY_POLL_S, 1)
    script = (
        f"i=0; while :; do a=$(awk '/^MemAvailable:/ {{print $2}}' /proc/meminfo); [ \"${{a:-0}}\" -ge {need_kib} ] "
        f"&& break; i=$((i+1)); if [ $i -ge {tries} ]; then {said}; exit 1; fi; "
        f"[ $((i % {per_line})) = 0 ] && echo \"rank {rank}: waiting for memory: $((${{a:-0}}/1048576)) of "
        f"{min_avail_gib:g} GiB available ($((i*{MEMORY_POLL_S})) s)\"; sleep {MEMORY_POLL_S}; done"
    )
    return LiveCommand("sh", "-c", shlex.quote(script))


def start_commands(spec: ContainerSpec, min_avail_gib: float, gpu_clock_mhz: int, nvidia_smi: str):
    """Mounts checked, memory waited for, the GPU clock lock applied again (a reset since the last timer run would
    let this rank run unlocked for up to a period), then `docker run`."""
    binds = [(src, ro) for src, _dst, ro in spec.mounts if src.startswith("/")]
    writable = [src for src, ro in binds if not ro]
    if writable:
        yield StringCommand(sh("mkdir", "-p", *writable))
    for src, ro in binds:
        if ro:
            msg = f"sparkfold: rank {spec.rank} mounts {src}, which is missing: run deploy.py to prepare it"
            yield StringCommand("test", "-e", shlex.quote(src), "||", "{", "echo", shlex.quote(msg), ">&2;",
                                "exit", "1;", "}")
    yield memory_wait_command(spec.rank, min_avail_gib)
    yield lock_command(gpu_clock_mhz, nvidia_smi, _sudo=True)
    yield StringCommand(sh(*spec.run_argv()))


# --- operations -------------------------------------------------------------------------------------------------

@operation()
def launch_checked(container_name: str, peer, launch: Launch, min_avail_gib: float, here: str, there: str,
                   ports: tuple[int, ...] = ()):
    """Refuse before anything is touched: a foreign container with our name (here or on the peer), launch problems
    (rank 0's flags against the image, the link record), and, for a rank that is not running, too little memory or
    one of `ports` (the API's, the rendezvous') held by another process (a port our running rank uses is its own)."""
    mine = fact_until_change(host, RankContainer, container=container_name)
    theirs = fact_until_change(peer, RankContainer, container=container_name)
    refusals = [m for m in (unmanaged(here, container_name, mine), unmanaged(there, container_name, theirs)) if m]
    if refusals:
        yield from check_failed("the rank containers", refusals)
        return
    # while planning, a missing input (image, link record) may still be made by this run: only its problems count
    settled = launch.spec() is not None
    if (yield from check_failed("the launch", launch.problems(), settled=settled)):
        return
    memory = []
    if not (mine and mine.get("running")):
        avail = mem_available_gib(host.get_fact(MemInfo))
        if avail is not None and avail < min_avail_gib:
            memory.append(f"only {avail:.1f} GiB of memory is available on the {here} but a rank needs "
                          f"min_avail_gib = {min_avail_gib:g} GiB: stop what else uses memory there, or lower "
                          "min_avail_gib")
    if (yield from check_failed("memory", memory)):
        return
    held = []
    # a port our running rank was started on is its own (it goes when the pair is recreated); a changed port or
    # master_port is checked even while the old rank runs
    own = set(mine.get("ports") or []) if mine and mine.get("running") else set()
    for port in (p for p in ports if p not in own):
        holders = host.get_fact(PortListeners, port=port, _sudo=True)  # root: ss names other users' processes
        if holders:
            held.append(f"port {port} is held by {', '.join(holders)} on the {here}, so the rank could "
                        f"not listen there: stop it (`sudo ss -ltnp 'sport = :{port}'` names it) or choose another "
                        "port (port / master_port)")
    if (yield from check_failed("ports", held)):
        return
    host.noop(f"the {here}'s launch checks pass")


@operation()
def spec_recorded(path: str, launch: Launch):
    """Record the spec hash this Spark's rank should run (read by the peer to judge the pair)."""
    resolved = launch.spec()
    if resolved is None:
        if state.is_executing:
            yield fail_command("this rank's container spec is not known (link record or engine image missing): "
                               "run the whole deploy.py")
        return
    want = resolved.spec_hash()
    if fact_until_change(host, SpecRecord, path=path) == want:
        host.noop(f"{path} already records {want}")
        return
    body = f"{MANAGED_HEADER}\nspec-hash={want}\n"
    directory = path.rsplit("/", 1)[0] or "/"
    yield StringCommand(sh("mkdir", "-p", directory), "&&", "printf", "%s", shlex.quote(body), ">", shlex.quote(path))


def _pair_reasons(container_name, rank, launch: Launch, peer, peer_rank, peer_record, force):
    mine = fact_until_change(host, RankContainer, container=container_name)
    theirs = fact_until_change(peer, RankContainer, container=container_name)
    resolved = launch.spec()
    want = resolved.spec_hash() if resolved is not None else None
    peer_want = fact_until_change(peer, SpecRecord, path=peer_record)
    reasons = pair_verdict([(rank, mine, want), (peer_rank, theirs, peer_want)], force)
    return mine, theirs, resolved, reasons


@operation()
def stale_pair_removed(container_name: str, rank: int, launch: Launch, peer, peer_rank: int, peer_record: str,
                       force: bool, stop_timeout: int, log_dir: str, log_keep: int, here: str, there: str,
                       pause_units: tuple = ()):
    """Both Sparks: when the pair is stale (either rank missing, stopped or changed, or a restart is asked for),
    save this rank's log and remove its container, so both ranks start again together.

    pause_units: systemd units (the supervisor) stopped first while they run, so they do not restart the old pair
    behind the deploy's back; the deploy starts them again after the health check."""
    mine, theirs, _resolved, reasons = _pair_reasons(container_name, rank, launch, peer, peer_rank, peer_record,
                                                     force)
    if not reasons:
        host.noop("both ranks run the wanted spec")
        return
    for unit in pause_units:
        if host.get_fact(UnitState, unit=unit, path=unit_path(unit))["active"] in ("active", "activating"):
            yield StringCommand("systemctl", "stop", unit, _sudo=True)
    if not mine:
        host.noop(f"the pair restarts ({'; '.join(reasons)}); no rank container here to remove")
        return
    refusals = [m for m in (unmanaged(here, container_name, mine), unmanaged(there, container_name, theirs)) if m]
    if refusals:  # never planned as a removal: the container is not ours
        yield from check_failed("the rank containers", refusals)
        return
    logger.info(f"{host.name}: recreating the pair: {'; '.join(reasons)}")
    yield from removal_commands(container_name, rank, bool(mine.get("running")), stop_timeout, log_dir, log_keep)


@operation()
def rank_started(container_name: str, rank: int, launch: Launch, peer, peer_rank: int, peer_record: str, force: bool,
                 min_avail_gib: float, stop_timeout: int, log_dir: str, log_keep: int, gpu_clock_mhz: int,
                 nvidia_smi: str):
    """Start this rank's container unless it already runs the wanted spec (the GPU clock lock applied first)."""
    if not state.is_executing:
        # Planning: the removal above has not happened yet, so predict from the pair's verdict.
        mine, _theirs, resolved, reasons = _pair_reasons(container_name, rank, launch, peer, peer_rank, peer_record,
                                                         force)
        if not reasons and (resolved is None or is_current(mine, resolved)):
            host.noop(f"rank {rank} runs the wanted spec")
            return
        if resolved is None:
            yield StringCommand("docker", "run", "...", f"(rank {rank}; its spec is complete at execute time)")
            return
        yield from start_commands(resolved, min_avail_gib, gpu_clock_mhz, nvidia_smi)
        return
    mine = fact_until_change(host, RankContainer, container=container_name)
    resolved = launch.spec()
    if resolved is None:
        yield fail_command(f"rank {rank}'s container spec is not known (link record or engine image missing): "
                           "run the whole deploy.py")
        return
    if is_current(mine, resolved):
        host.noop(f"rank {rank} runs the wanted spec")
        return
    if mine:  # left over (the pair step removes stale ranks; this covers one changed in between)
        refusal = unmanaged("this Spark", container_name, mine)
        if refusal:
            yield fail_command(refusal)
            return
        yield from removal_commands(container_name, rank, bool(mine.get("running")), stop_timeout, log_dir,
                                    log_keep)
    yield from start_commands(resolved, min_avail_gib, gpu_clock_mhz, nvidia_smi)


@operation()
def rank_stopped(container_name: str, rank: int, stop_timeout: int, log_dir: str, log_keep: int):
    """Stop and remove this Spark's rank (log saved first), then show what still holds the GPU."""
    mine = host.get_fact(RankContainer, container=container_name)
    if not mine:
        host.noop(f"no container named {container_name} here: rank {rank} is stopped")
        return
    refusal = unmanaged("this Spark", container_name, mine)
    if refusal:
        yield fail_command(refusal)
        return
    yield from removal_commands(container_name, rank, bool(mine.get("running")), stop_timeout, log_dir, log_keep)
    # docker rm -f returns once the rank's processes are gone, which frees their GPU memory; show what is left.
    yield StringCommand("if command -v nvidia-smi >/dev/null 2>&1; then echo 'sparkfold: GPU processes left:';"
                        " nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader || true; fi")
