"""Docker with the NVIDIA container runtime as the runtime containers use: packages when missing (apt, only with
docker_install), /etc/docker/daemon.json merged (every other key kept), docker restarted exactly when the file
changed or the running daemon does not use it yet, and the ssh user in group docker."""

from __future__ import annotations

import copy
import json
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation

from operations.facts.docker_daemon import (
    DAEMON_JSON, ContainerRuntimeTools, DaemonJson, DockerRuntimeInfo, UserGroups,
)
from operations.util import fail_command, sh

NVIDIA_RUNTIME = {"path": "nvidia-container-runtime", "runtimeArgs": []}
RESTART_WAIT_S = 60  # dockerd can take a while to come back with many containers

PACKAGES = {  # missing tool -> the apt package that provides it
    "docker": "docker.io",
    "nvidia-container-runtime": "nvidia-container-toolkit",
}


def merged_daemon_config(current: dict) -> dict:
    """`current` with runtimes.nvidia and default-runtime set; every other key (and other runtimes) kept."""
    merged = copy.deepcopy(current)
    runtimes = merged.get("runtimes")
    if not isinstance(runtimes, dict):
        runtimes = {}
    runtimes["nvidia"] = dict(NVIDIA_RUNTIME)
    merged["runtimes"] = runtimes
    merged["default-runtime"] = "nvidia"
    return merged


def render_daemon_json(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"


def _wait_for_default_runtime(runtime: str) -> StringCommand:
    """After a restart: wait until the daemon answers and uses `runtime`, else fail naming the log to read."""
    message = (f"sparkfold: docker did not come back using the {runtime} runtime within {RESTART_WAIT_S} s; "
               "read journalctl -u docker (a bad daemon.json or a missing nvidia-container-runtime)")
    return StringCommand(
        f"i=0; while [ $i -lt {RESTART_WAIT_S} ]; do "
        f"[ \"$(docker info --format '{{{{.DefaultRuntime}}}}' 2>/dev/null)\" = {sh(runtime)} ] && exit 0; "
        f"i=$((i+1)); sleep 1; done; echo {sh(message)} >&2; exit 1"
    )


@operation()
def runtime_installed(install: bool = True):
    """Install docker.io / nvidia-container-toolkit when their commands are missing (only when `install`)."""
    tools = host.get_fact(ContainerRuntimeTools)
    missing = [pkg for tool, pkg in PACKAGES.items() if not tools.get(tool)]
    if not missing:
        host.noop("docker and the NVIDIA container runtime are installed")
        return
    if not install:
        yield fail_command(
            f"missing: {', '.join(missing)}. Fix: apt-get install {' '.join(missing)} (nvidia-container-toolkit "
            f"comes from NVIDIA's apt repository, present on DGX OS), or set docker_install = True")
        return
    yield StringCommand(
        "export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq "
        + sh(*missing)
        + " || { echo "
        + sh(f"sparkfold: apt could not install {' '.join(missing)}; nvidia-container-toolkit needs NVIDIA's "
             "container toolkit apt repository (present on DGX OS)")
        + " >&2; exit 1; }"
    )


@operation()
def daemon_uses_nvidia(path: str = DAEMON_JSON):
    """daemon.json has runtimes.nvidia and default-runtime nvidia (merged); the daemon runs with it.
    Writes and restarts in one go only when the parsed file differs; restarts alone when the file is right but the
    running daemon still uses another default runtime (edited without a restart)."""
    current = host.get_fact(DaemonJson, path=path)
    if current["config"] is None:
        yield fail_command(
            f"{path} is not valid JSON ({current['error']}); sparkfold will not overwrite it. "
            f"Fix: repair it (python3 -m json.tool {path} shows where), then re-run")
        return
    wanted = merged_daemon_config(current["config"])
    file_changes = wanted != current["config"]
    live = host.get_fact(DockerRuntimeInfo)
    daemon_stale = not live["reachable"] or live["default_runtime"] != "nvidia"
    if not file_changes and not daemon_stale:
        host.noop("docker uses the nvidia runtime")
        return
    if file_changes:
        directory = path.rsplit("/", 1)[0] or "/"
        yield StringCommand("mkdir", "-p", directory)
        if current["exists"]:
            # the user's file is merged, not owned: keep the last pre-sparkfold version next to it
            yield StringCommand(f"cp -p {sh(path)} {sh(path + '.sparkfold-backup')}")
        yield FileUploadCommand(StringIO(render_daemon_json(wanted)), path)
        yield StringCommand("chmod", "644", path)
    yield StringCommand("systemctl", "restart", "docker")
    yield _wait_for_default_runtime("nvidia")


@operation()
def user_in_group(user: str, group: str = "docker"):
    """`user` is a member of `group` (usermod -aG; takes effect on the user's next login)."""
    groups = host.get_fact(UserGroups, user=user)
    if groups is None:
        yield fail_command(f"user {user} does not exist on this Spark; check ssh_user in the site file")
        return
    if group in groups:
        host.noop(f"{user} is in group {group}")
        return
    yield StringCommand("usermod", "-aG", group, user)


def deploy_docker_runtime(s) -> None:
    runtime_installed(name="Docker and the NVIDIA container runtime installed", install=s.docker_install, _sudo=True)
    daemon_uses_nvidia(name="Docker uses the nvidia runtime by default", _sudo=True)
    user_in_group(name=f"{s.ssh_user} in group docker", user=s.ssh_user, group="docker", _sudo=True)
