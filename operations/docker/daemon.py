"""daemon.json as sparkfold wants it, and whether this run restarts dockerd: one pure decision from two facts.

The docker step (operations/docker_runtime.py) writes the file and restarts Docker from it; the rank step asks it
too, because that restart stops the rank on that Spark (rank containers have no restart policy), so the pair's plan
must say the ranks start again. Only daemon_uses_nvidia restarts dockerd: runtime_installed adds docker.io only
where the `docker` command is missing (no rank can run or be seen there) and nvidia-container-toolkit, whose install
leaves a running daemon alone.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from operations.facts.docker import DaemonJsonDict, DockerRuntimeDict

NVIDIA_RUNTIME = {"path": "nvidia-container-runtime", "runtimeArgs": []}


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


@dataclass(frozen=True)
class DaemonChange:
    wanted: dict[str, Any]  # daemon.json as the docker step leaves it
    file_changes: bool  # the file is written (compared parsed: the user's formatting alone is not rewritten)
    restart: str  # why dockerd restarts, "" when it does not


def daemon_change(current: DaemonJsonDict, live: DockerRuntimeDict) -> DaemonChange | None:
    """What the docker step does with daemon.json (`current`, the DaemonJson fact) and the running daemon (`live`,
    DockerRuntimeInfo). None when the file is not JSON: the step refuses it and restarts nothing."""
    if current["config"] is None:
        return None
    wanted = merged_daemon_config(current["config"])
    file_changes = wanted != current["config"]
    if file_changes:
        why = "daemon.json changes"
    elif not live["reachable"]:
        why = "Docker does not answer"
    elif live["default_runtime"] != "nvidia":
        why = f"its default runtime is {live['default_runtime'] or 'unknown'}, not nvidia"
    else:
        why = ""
    return DaemonChange(wanted, file_changes, why)


def docker_restart(current: DaemonJsonDict, live: DockerRuntimeDict) -> str:
    """Why this run restarts dockerd on the Spark these facts were read on, "" when it does not."""
    change = daemon_change(current, live)
    return change.restart if change else ""
