"""Preflight on both Sparks, before anything changes: sudo without a password, platform, where the folders lead,
memory, disk, tools, and (on the head) ssh to the worker. Each check yields nothing when it passes (a converged run
stays change-free); a problem follows the one plan-time rule (operations/util/checks.py): a "will fail" warning
during --dry, a failure naming the fix in a run. Sudo is the exception: without it the plan itself cannot be read,
so it stops the run while planning."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gevent
from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.api.host import Host
from pyinfra.context import ctx_config, ctx_host

from operations.facts.docker import DockerMemoryUse, DockerMemoryUseDict, DockerRuntimeInfo, RunningContainers
from operations.facts.files import DiskSpace, DiskSpaceDict
from operations.facts.host import (
    KNOWN_TOOLS,
    CommandStatusDict,
    HostTools,
    MemInfo,
    OsRelease,
    SshReachable,
    SudoWithoutPassword,
)
from operations.rank.commands import memory_wait_command
from operations.settings import Settings, placed_paths, resolved_path_problems
from operations.settings.context import peer_host
from operations.util import RunStopped, check_failed
from operations.util.fact_reuse import fact_once, fact_until_change

GIB = 1024**3
GB = 1000**3
DEFAULT_DOCKER_ROOT = "/var/lib/docker"  # measured when docker is not installed or not reachable yet
MEMORY_WAIT_TRIES = 30  # x rank.commands.MEMORY_POLL_S (1 s): a stopped rank's ~98 GiB comes back within seconds

TOOL_FIX = {
    "docker": "install Docker (apt-get install docker.io) or set docker_install = True",
    "git": "apt-get install git",
    "python3": "apt-get install python3",
    "rsync": "apt-get install rsync",
    "ssh": "apt-get install openssh-client",
}
SUDOERS_FILE = "/etc/sudoers.d/sparkfold"  # where the sudo refusal says to put the ssh user's line


# --- pure helpers (unit-tested directly) -------------------------------------------------------------------------

def sudo_problem(user: str, sudo: CommandStatusDict) -> str:
    """Why the ssh user cannot use sudo without a password, and the sudoers line that fixes it."""
    answer = f"`sudo -n true` gave rc {sudo['rc']}{': ' + sudo['detail'] if sudo['detail'] else ''}"
    line = (f"run `sudo visudo -f {SUDOERS_FILE}`, add the line `{user} ALL=(ALL) NOPASSWD: ALL` and save (visudo "
            "refuses a broken line, which would stop sudo altogether)")
    if sudo["rc"] == 127:
        return (f"sudo is not installed on this Spark ({answer}); every step after the preflight runs as root through "
                f"sudo. Fix: as root, apt-get install sudo; then, as {user}, {line}")
    return (f"{user} cannot use sudo without a password ({answer}); every step after the preflight runs as root "
            f"through sudo, which must not ask. Fix: on this Spark, {line}")


def platform_problem(info: Mapping[str, Any], allowed_arch, allowed_os_ids) -> str | None:
    arch = info.get("arch", "")
    if arch not in allowed_arch:
        return (f"this machine is {arch or 'of unknown architecture'}, not {'/'.join(allowed_arch)}: sparkfold "
                f"targets DGX Spark (aarch64, DGX OS); run it against the Sparks "
                f"(the allowed_arch setting lists what is accepted)")
    ids = [info.get("id", "")] + list(info.get("id_like", []))
    if not any(i in allowed_os_ids for i in ids if i):
        name = info.get("pretty_name") or info.get("id") or "an unknown OS"
        return (f"the OS is {name}, not one of {', '.join(allowed_os_ids)} (ID/ID_LIKE in /etc/os-release): "
                f"sparkfold targets DGX OS (Ubuntu based); reinstall DGX OS or extend the allowed_os setting")
    return None


def memory_problem(meminfo: Mapping[str, int], min_avail_gib: float, docker_use: Mapping[str, Any]) -> str | None:
    avail = meminfo.get("MemAvailable")
    if avail is None:
        return "cannot read MemAvailable from /proc/meminfo; check that /proc is mounted"
    if avail >= min_avail_gib * GIB:
        return None
    total = meminfo.get("MemTotal", 0)
    used = max(total - avail, 0)
    message = (f"only {avail / GIB:.1f} GiB MemAvailable, need {min_avail_gib:g} GiB (min_avail_gib); "
               f"{used / GIB:.1f} GiB of {total / GIB:.1f} GiB is in use")
    if docker_use.get("ok"):
        ranked = sorted(docker_use["containers"], key=lambda c: c["used_bytes"] or 0, reverse=True)
        if ranked:
            listed = ", ".join(f"{c['name']} {(c['used_bytes'] or 0) / GIB:.1f} GiB" for c in ranked[:10])
            message += f"; running containers: {listed}"
        else:
            message += "; no container is running, so other processes hold it"
    else:
        message += "; containers could not be listed (docker missing or unreachable)"
    return message + ". Fix: stop what holds the memory (docker stop NAME, close large programs) or lower min_avail_gib"


def disk_problems(need_gb: float, data: list[dict], held_bytes: int, image_gb: float, docker: dict) -> list[str]:
    """data: DiskFree results for the data paths (hf_cache, data_dir); docker: DiskFree for the Docker root dir.
    The data need (less what is already held there) may spread over the data filesystems; the image need is added
    to it when the Docker root dir shares one of them, else the Docker filesystem must hold it alone."""
    problems = []
    data_fs: dict[str, dict] = {}
    for disk in data:
        data_fs.setdefault(disk["mount"], disk)
    data_free = sum(disk["free_bytes"] for disk in data_fs.values())
    data_need = max(need_gb * GB - held_bytes, 0)
    image_need = image_gb * GB
    where = ", ".join(f"{disk['path']} ({disk['mount']}, {disk['free_bytes'] / GB:.0f} GB free)" for disk in data)
    held = f", {held_bytes / GB:.0f} GB of it already held" if held_bytes else ""
    if docker["mount"] in data_fs:
        if data_free < data_need + image_need:
            problems.append(
                f"not enough disk: {where} share a filesystem with the Docker root dir {docker['path']}; need "
                f"{(data_need + image_need) / GB:.0f} GB "
                f"(disk_need_gb {need_gb:g}{held} + image_free_gb {image_gb:g}), "
                f"have {data_free / GB:.0f} GB. Fix: free space there, or point hf_cache/data_dir at a larger disk")
        return problems
    if data_free < data_need:
        problems.append(
            f"not enough disk for the data: {where}; need {data_need / GB:.0f} GB (disk_need_gb {need_gb:g}{held}), "
            f"have {data_free / GB:.0f} GB. Fix: free space there, or point hf_cache/data_dir at a larger disk")
    if docker["free_bytes"] < image_need:
        problems.append(
            f"not enough disk under the Docker root dir {docker['path']} ({docker['mount']}): need {image_gb:g} GB "
            f"(image_free_gb), have {docker['free_bytes'] / GB:.0f} GB. Fix: docker system prune, or move "
            f"the Docker data-root to a larger disk")
    return problems


# --- operations --------------------------------------------------------------------------------------------------

def _sudo_works(answer: CommandStatusDict) -> bool:
    return answer["ok"]


def _sudo_answer(spark: Host, config: Any) -> CommandStatusDict:
    with ctx_host.use(spark), ctx_config.use(config):  # a greenlet of its own starts with no pyinfra context
        return fact_once(spark, SudoWithoutPassword, _sudo_works, _sudo=False)


@operation()
def sudo_without_password(user: str, peer: Host | None = None, peer_user: str = ""):
    """Stop the run while planning unless sudo works for the ssh user without a password: the root steps read root
    facts while planning, and pyinfra would stop there to ask for a password. The head also asks for the worker
    (`peer`, whose ssh user is `peer_user`): the head's plan reads some of the worker's facts as root (who holds a
    rank's port) before the worker's own plan begins. A working answer is kept for the run, so the worker's own check
    asks no second time. A run given a sudo password (pyinfra's --same-sudo-password) passes."""
    arguments = host.current_op_global_arguments
    given = arguments.get("_sudo_password") if arguments else None
    asking = []
    # the peer's answer is read at the same time (its own connection), so the check costs one round trip
    theirs = gevent.spawn(_sudo_answer, peer, ctx_config.get()) if peer is not None else None
    answers: list[tuple[Any, str, CommandStatusDict]] = [
        (host, user, fact_once(host, SudoWithoutPassword, _sudo_works, _sudo=False))]
    if theirs is not None:
        answers.append((peer, peer_user, theirs.get()))
    for spark, login, sudo in answers:
        if not sudo["ok"] and not given:
            raise RunStopped(f"{spark.name}: sudo: {sudo_problem(login, sudo)}")
        asking += [] if sudo["ok"] else [spark.name]
    host.noop(f"sudo asks {', '.join(asking)} for the password this run was given" if asking
              else f"{user} uses sudo without a password" + (f", and {peer_user} on {peer.name}" if peer else ""))
    if False:  # an operation is a generator; this one only reads
        yield


@operation()
def platform_supported(allowed_arch=("aarch64",), allowed_os_ids=("ubuntu", "dgx")):
    """Fail unless the architecture and the OS (ID or ID_LIKE of /etc/os-release) are allowed."""
    info = host.get_fact(OsRelease)
    problem = platform_problem(info, tuple(allowed_arch), tuple(allowed_os_ids))
    if not (yield from check_failed("the platform", [problem])):
        host.noop("platform is supported")


def counted_meminfo(meminfo: Mapping[str, int], docker_use: Mapping[str, Any], own: list[str]) -> dict[str, int]:
    """MemInfo as a restart would find it once our own rank is stopped: its memory comes back. The rank's weights
    sit in driver allocations `docker stats` does not show, so everything in use that another running container
    does not account for is counted as coming back; the wait after the stop judges the real figure
    (operations/ranks.py)."""
    total = meminfo.get("MemTotal")
    if total is None or meminfo.get("MemAvailable") is None:
        return dict(meminfo)
    others = sum(c["used_bytes"] or 0 for c in docker_use.get("containers", []) if c["name"] not in own)
    return {**meminfo, "MemAvailable": max(total - others, meminfo["MemAvailable"])}


def _folders_answer(placed: Mapping[str, str], data_paths, held_paths, docker_root: str) -> tuple[str, DiskSpaceDict]:
    """(the Docker root dir, the DiskSpace answer): paths_placed's question (where `placed` leads) and disk_free's
    (free disk at the data paths and the Docker root dir, what `held_paths` hold) in one round trip. Both operations
    ask it with the same arguments, and the second takes the first's answer: nothing between them changes a Spark.
    docker_root "" = ask docker (DEFAULT_DOCKER_ROOT when it cannot be asked yet)."""
    # root: docker info as root (the ssh user may not be in group docker yet); the docker step asks the same
    root = docker_root or fact_until_change(host, DockerRuntimeInfo, _sudo=True)["root_dir"] or DEFAULT_DOCKER_ROOT
    return root, fact_until_change(host, DiskSpace, paths=(*data_paths, root), held=tuple(held_paths),
                                   resolve=tuple(sorted(set(placed.values()))))


@operation()
def paths_placed(paths: Mapping[str, str], data_paths=(), held_paths=(), docker_root: str = ""):
    """Fail when a folder or file of the settings (placed_paths) leads, once this Spark follows its symlinks, where
    the settings' rules refuse: state_dir or data_dir inside the exported hub, a root folder at /, an owned file
    through a symlink. The settings judged the text; a symlink such as /srv/hf -> ~/.cache/... only shows here.
    data_paths, held_paths, docker_root: disk_free's, whose answer comes in the same round trip."""
    real = _folders_answer(paths, data_paths, held_paths, docker_root)[1]["real"]
    problems = resolved_path_problems(paths, {name: real[path] for name, path in paths.items() if path in real})
    if not (yield from check_failed("where the folders lead", problems)):
        host.noop("the folders and files lead where the settings say")


@operation()
def memory_available(min_avail_gib: float, own_containers=(), restart: bool = False, *, every: int):
    """Fail unless MemAvailable >= min_avail_gib. While one of `own_containers` (this project's rank) runs, its
    memory stays held unless a restart is asked: then nothing starts here, so there is nothing to check (the launch
    step rechecks before any relaunch); with `restart` its memory is counted as coming back at the stop. every:
    seconds between the lines of the short wait before a refusal."""
    # `docker ps` names the running containers at once; `docker stats` (who holds how much, ~1.5 s) is read only
    # when it is needed: to count our rank's memory on a restart, or to name the holders of too little memory
    running: dict[str, bool] = host.get_fact(RunningContainers)
    ours = sorted(set(running) & set(own_containers))
    if ours and not restart:
        host.noop(f"{', '.join(ours)} is running and holds its memory; it is checked again before any relaunch")
        return
    meminfo = host.get_fact(MemInfo)
    if ours:
        docker_use: DockerMemoryUseDict = host.get_fact(DockerMemoryUse)
        meminfo = counted_meminfo(meminfo, docker_use, ours)
        problem = memory_problem(meminfo, float(min_avail_gib), docker_use)
    else:
        problem = memory_problem(meminfo, float(min_avail_gib), {"ok": False})
        if problem:
            use: DockerMemoryUseDict = host.get_fact(DockerMemoryUse)
            problem = memory_problem(meminfo, float(min_avail_gib), use)
    # ranks that stopped moments ago (a crash, a stop) give their memory back over seconds: a run waits a little
    # before refusing, as the launch does before each start
    wait = None if ours else lambda message: memory_wait_command(0, float(min_avail_gib), tries=MEMORY_WAIT_TRIES,
                                                                 failure=f"sparkfold: {message}", every=every)
    if not (yield from check_failed("memory", [problem], fails_with=wait)):
        host.noop("enough memory available" + (f" once {', '.join(ours)} stops" if ours else ""))


@operation()
def disk_free(need_gb: float, data_paths, image_gb: float, held_paths=(), docker_root: str = "",
              placed: Mapping[str, str] | None = None):
    """Fail unless the data paths have need_gb free (less what `held_paths` already hold) and the Docker root dir has
    image_gb free; the two are summed when they share a filesystem. Missing paths are measured at their nearest
    existing parent. docker_root "" = ask docker (DEFAULT_DOCKER_ROOT when it cannot be asked yet). placed:
    paths_placed's paths, whose answer comes in the same round trip."""
    root, space = _folders_answer(placed or {}, data_paths, held_paths, docker_root)
    unmeasured = [f"cannot measure free disk at {path} (df failed); check the path and the mount"
                  for path, d in zip((*data_paths, root), space["free"], strict=False) if d is None]
    if len(space["free"]) != len(data_paths) + 1:
        unmeasured.append("cannot measure free disk (no answer from df)")
    if unmeasured:
        yield from check_failed("free disk", unmeasured)
        return
    data = [{**d, "path": path} for path, d in zip(data_paths, space["free"], strict=False) if d]
    docker = {**space["free"][-1], "path": root}  # type: ignore[dict-item]
    held = space["held"]
    problems = disk_problems(float(need_gb), data, held, float(image_gb), docker)
    if not (yield from check_failed("free disk", problems)):
        host.noop("enough free disk")


@operation()
def tools_present(required=("docker", "git", "python3", "rsync"), installed_later=()):
    """Fail unless every tool in `required` is on the PATH; tools in `installed_later` may be missing (a later step
    installs them, e.g. docker with docker_install)."""
    unknown = [t for t in required if t not in KNOWN_TOOLS]
    if unknown:
        raise RunStopped(f"tools_present cannot check {unknown}; known: {KNOWN_TOOLS}")
    tools = host.get_fact(HostTools)
    missing = [t for t in required if not tools.get(t) and t not in installed_later]
    fixes = "; ".join(f"{t}: {TOOL_FIX.get(t, 'install it')}" for t in missing)
    if not (yield from check_failed("tools", [f"missing on this Spark: {', '.join(missing)}. Fix: {fixes}"
                                              if missing else ""])):
        host.noop("tools present")


@operation()
def peer_reachable(target: str):
    """Run on the head: fail unless `ssh -o BatchMode=yes -o ConnectTimeout=10 <target> true` succeeds."""
    result = host.get_fact(SshReachable, target=target)
    if result["ok"]:
        host.noop(f"{target} answers over ssh")
        return
    yield from check_failed("ssh to the worker", [
        f"the head cannot ssh to the worker {target} without a prompt (rc {result['rc']}: {result['detail']}). "
        f"Fix: on the head run ssh-keygen (if there is no key), ssh-copy-id {target}, then ssh {target} true once "
        f"to accept its host key"])


# --- deploy entry ------------------------------------------------------------------------------------------------

def _held_paths(s) -> list[str]:
    """What this project already keeps on this Spark: the data folder and its repos' Hugging Face cache folders."""
    repos = [s.active_model_repo, s.engram_repo, s.kit_repo]
    return [s.data_dir] + [s.layout.repo_folder(r) for r in repos if r]


@deploy("Preflight")
def preflight(s: Settings) -> None:
    """Read-only checks on both Sparks: a problem stops the run before anything changes (and shows in --dry)."""
    # first: every root fact read while planning needs it
    sudo_without_password(name="sudo without a password", user=s.ssh_user, peer=peer_host(s) if s.is_head else None,
                          peer_user=s.the_peer.ssh_user)
    platform_supported(
        name="aarch64 and DGX OS",
        allowed_arch=list(s.allowed_arch),
        allowed_os_ids=list(s.allowed_os),
    )
    # paths_placed and disk_free are given each other's folders: they read them in one round trip (_folders_answer)
    placed, data_paths, held_paths = placed_paths(s), [s.hf_cache, s.data_dir], _held_paths(s)
    paths_placed(name="the folders lead where the settings say", paths=placed, data_paths=data_paths,
                 held_paths=held_paths)
    memory_available(
        name=f"{s.min_avail_gib:g} GiB memory available",
        min_avail_gib=s.min_avail_gib,
        own_containers=[s.container_name],
        restart=bool(s.restart),
        every=s.progress_every_s,
    )
    disk_free(
        name="free disk for data and the image",
        need_gb=s.disk_need_gb,
        data_paths=data_paths,
        image_gb=s.image_free_gb,
        held_paths=held_paths,
        placed=placed,
    )
    tools_present(
        name="docker, git, python3, rsync present",
        required=["docker", "git", "python3", "rsync", "ssh"] if s.is_head else ["docker", "git", "python3", "rsync"],
        installed_later=["docker"] if s.docker_install else [],
    )
    if s.is_head:
        peer_reachable(name="the head reaches the worker over ssh", target=s.worker_ssh_from_head)
