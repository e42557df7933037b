"""Docker with the NVIDIA container runtime as the runtime containers use: packages when missing (apt, only with
docker_install), /etc/docker/daemon.json merged (every other key kept), docker restarted exactly when the file
changed or the running daemon does not use it yet (operations/docker/daemon.py decides, for the rank step too), and
the ssh user in group docker."""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.operations import apt, systemd

from operations.docker.daemon import daemon_change, render_daemon_json
from operations.facts.docker import ContainerRuntimeTools, DaemonJson, DockerRuntimeInfo, RunningContainers
from operations.facts.host import UserGroups
from operations.layout import DOCKER_DAEMON_JSON
from operations.owned.files import put_changes
from operations.util import check_failed, failing_shell, sh, warned
from operations.util.commands import APT_CACHE_S
from operations.util.fact_reuse import fact_until_change

RESTART_WAIT_S = 60  # dockerd can take a while to come back with many containers

PACKAGES = {  # missing tool -> the apt package that provides it
    "docker": "docker.io",
    "nvidia-container-runtime": "nvidia-container-toolkit",
}


def _wait_for_default_runtime(runtime: str) -> StringCommand:
    """After a restart: wait until the daemon answers and uses `runtime`, else fail naming the log to read."""
    failed = failing_shell("a Docker restart", f"docker did not come back using the {runtime} runtime within "
                           f"{RESTART_WAIT_S} s; read journalctl -u docker (a bad daemon.json or a missing "
                           "nvidia-container-runtime)")
    return StringCommand(
        f"i=0; while [ $i -lt {RESTART_WAIT_S} ]; do "
        f"[ \"$(docker info --format '{{{{.DefaultRuntime}}}}' 2>/dev/null)\" = {sh(runtime)} ] && exit 0; "
        f"i=$((i+1)); sleep 1; done; {failed}"
    )


@operation()
def runtime_installed(install: bool = True):
    """Install docker.io / nvidia-container-toolkit (apt.packages) for the commands that are missing, only when
    `install`. Custom: it asks for the commands, not the packages, so a Docker from docker-ce counts as present."""
    tools = host.get_fact(ContainerRuntimeTools)
    missing = [pkg for tool, pkg in PACKAGES.items() if not tools.get(tool)]
    if not missing:
        host.noop("docker and the NVIDIA container runtime are installed")
        return
    if not install:
        yield from check_failed("the container runtime", [
            f"missing: {', '.join(missing)}. Fix: apt-get install {' '.join(missing)} (nvidia-container-toolkit "
            f"comes from NVIDIA's apt repository, present on DGX OS), or set docker_install = True"])
        return
    yield from apt.packages._inner(packages=missing, update=True, cache_time=APT_CACHE_S)


def restart_problem(running: dict[str, bool], restart_ok: bool) -> str | None:
    """The refusal of a Docker restart that would stop containers sparkfold does not own, unless allowed."""
    others = sorted(name for name, ours in running.items() if not ours)
    if not others or restart_ok:
        return None
    return (f"daemon.json needs a Docker restart, which would stop these containers that are not sparkfold's: "
            f"{', '.join(others)}. Fix: stop them yourself at a good moment, or set docker_restart_ok = true "
            "(SPARKFOLD_DOCKER_RESTART_OK=1 for one run) to let the deploy restart Docker anyway")


@operation()
def daemon_uses_nvidia(path: str = DOCKER_DAEMON_JSON, restart_ok: bool = False):
    """daemon.json has runtimes.nvidia and default-runtime nvidia (merged); the daemon runs with it.
    Custom: the file is merged with the user's keys (core would replace it), backed up, and docker is restarted
    only when the parsed file differs or the running daemon still uses another default runtime."""
    # both kept for the rank step, which asks the same question (its ranks stop with the restart)
    current = fact_until_change(host, DaemonJson, path=path)
    live = fact_until_change(host, DockerRuntimeInfo)  # the preflight read it already
    change = daemon_change(current, live)
    if change is None:
        yield from check_failed("daemon.json", [
            f"{path} is not valid JSON ({current['error']}); sparkfold will not overwrite it. "
            f"Fix: repair it (python3 -m json.tool {path} shows where), then re-run"])
        return
    if not change.restart:
        host.noop("docker uses the nvidia runtime")
        return
    running = host.get_fact(RunningContainers) if live["reachable"] else {}
    if running:
        warned("a Docker restart", f"restarting Docker for the nvidia runtime stops: {', '.join(sorted(running))}")
    if (yield from check_failed("a Docker restart", [restart_problem(running, restart_ok)])):
        return
    if change.file_changes:
        # listed before the backup is yielded: --dry stops at an operation's first command, and files.put prints
        # its --diff only when it is reached (no FileSum asked: the parsed file already differs)
        writes = put_changes(StringIO(render_daemon_json(change.wanted)), path, "644", None)
        if current["exists"]:
            # the user's file is merged, not owned: the version before this merge is kept next to it
            yield StringCommand(f"cp -p {sh(path)} {sh(path + '.sparkfold-backup')}")
        yield from writes
    yield from systemd.service._inner(service="docker.service", running=True, restarted=True)
    yield _wait_for_default_runtime("nvidia")


@operation()
def user_in_group(user: str, group: str):
    """`user` is a member of `group` (usermod -aG; its other groups kept). Custom: server.user answers the same
    question from a fact that runs lastlog for every account, ten times the cost of `id` on every run."""
    groups = host.get_fact(UserGroups, user=user)
    if groups is None:
        yield from check_failed("ssh_user", [f"there is no user {user} on this Spark (ssh_user names who runs the "
                                             "ranks)"])
        return
    if group in groups:
        host.noop(f"{user} is in group {group}")
        return
    yield StringCommand(sh("usermod", "-a", "-G", group, user))


@deploy("Docker with the NVIDIA runtime")
def docker_runtime(s) -> None:
    """Every operation needs root."""
    runtime_installed(name="docker and the NVIDIA container runtime installed", install=s.docker_install)
    daemon_uses_nvidia(name="docker uses the nvidia runtime by default", restart_ok=s.docker_restart_ok)
    # takes effect on the user's next login (pyinfra's next connection)
    user_in_group(name=f"{s.ssh_user} in group docker", user=s.ssh_user, group="docker")
