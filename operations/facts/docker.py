"""Facts about Docker: the rank container, images (here and on the worker) and what the engine
inside says it can do, daemon.json and the live daemon's runtimes, the NVIDIA runtime's tools, the Docker root dir,
running containers' memory, the NFS volume and its users.

Every command exits 0: an absent container, image or volume (or an unreachable worker) is an answer. Facts that
only ask docker declare it with requires_command, so a Spark without docker yet reads as the fact's default.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from operations.facts.host import HostTools
from operations.rank.inputs import RankContainerDict
from operations.util import sh
from operations.util.peer_ssh import ssh_words

DAEMON_JSON = "/etc/docker/daemon.json"


_UNITS = {
    "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}

# One line of JSON with the parts of `docker container inspect` the pair plan decides from.
_CONTAINER_FORMAT = ('{"state":{{json .State}},"labels":{{json .Config.Labels}},"image":{{json .Config.Image}},'
                     '"created":{{json .Created}},"args":{{json .Args}},"env":{{json .Config.Env}}}')
# where a rank is told the ports it listens on: rank 0's serve flag, and the rendezvous port in its environment
_PORT_FLAGS = ("--port",)
_PORT_ENV = ("TF_TP_PORT",)


def listening_ports(args: list[str], env: list[str]) -> list[int]:
    """The ports a rank container was started to listen on, read from its argv and environment."""
    found = []
    for i, arg in enumerate(args):
        flag, has_value, value = arg.partition("=")
        if flag in _PORT_FLAGS:
            found.append(value if has_value else (args[i + 1] if i + 1 < len(args) else ""))
    found += [entry.partition("=")[2] for entry in env if entry.partition("=")[0] in _PORT_ENV]
    return sorted({int(v) for v in found if v.isdigit()})


def parse_size(text: str) -> int | None:
    """docker's human sizes ("1.5GiB", "512MiB", "0B", "3.2kB") -> bytes; None when unreadable."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?i?B)\s*", text, re.IGNORECASE)
    if not match:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


# --- the rank container ------------------------------------------------------------------------------------------

class RankContainer(FactBase[RankContainerDict]):
    """The container named `container` as the pair plan decides from it (state, labels, image), or {} when there is
    none (or no docker yet)."""

    @staticmethod
    def default() -> RankContainerDict:
        return {}

    def requires_command(self, container: str) -> str:
        return "docker"

    def command(self, container: str) -> StringCommand:
        return StringCommand("docker", "container", "inspect", "--format", QuoteString(_CONTAINER_FORMAT),
                             QuoteString(container), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> RankContainerDict:
        for line in output:
            line = line.strip()
            if not line.startswith("{"):
                continue
            data = json.loads(line)
            state = data.get("state") or {}
            return {
                "exists": True,
                "running": bool(state.get("Running")),
                "status": state.get("Status", ""),
                "exit_code": int(state.get("ExitCode") or 0),
                "oom_killed": bool(state.get("OOMKilled")),
                "labels": data.get("labels") or {},
                "image": data.get("image", ""),
                "created": data.get("created", ""),
                "started_at": state.get("StartedAt", ""),
                "finished_at": state.get("FinishedAt", ""),
                "ports": listening_ports(data.get("args") or [], data.get("env") or []),
                "args": [str(arg) for arg in data.get("args") or []],
            }
        return {}


# --- images and the engine inside --------------------------------------------------------------------------------

class ImageDict(TypedDict, total=False):
    id: str
    labels: dict[str, str]
    layers: list[str]
    repo_digests: list[str]
    repo_tags: list[str]
    size: int


def summarize_inspect(output: list[str]) -> ImageDict:
    """`docker image inspect` JSON → {id, labels, layers, repo_digests, repo_tags, size}; {} if absent/unreadable."""
    try:
        data = json.loads("\n".join(output))
    except ValueError:
        return {}
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return {}
    image = data[0]
    config = image.get("Config") or {}
    return {
        "id": image.get("Id") or "",
        "labels": config.get("Labels") or {},
        "layers": list((image.get("RootFS") or {}).get("Layers") or []),
        "repo_digests": list(image.get("RepoDigests") or []),
        "repo_tags": list(image.get("RepoTags") or []),
        "size": int(image.get("Size") or 0),
    }


class DockerImageInfo(FactBase[ImageDict]):
    """The image Docker holds under `image` (tag, id or name@digest) on this host, summarised; {} when absent."""

    @staticmethod
    def default() -> ImageDict:
        return {}

    def requires_command(self, image: str) -> str:
        return "docker"

    def command(self, image: str) -> str:
        return f"docker image inspect {sh(image)} 2>/dev/null || true"

    def process(self, output: list[str]) -> ImageDict:
        return summarize_inspect(output)


class PeerDockerImageInfo(FactBase[ImageDict]):
    """The same summary for the worker's Docker, read from the head over ssh (`target` = user@worker-link-ip);
    {} when the worker has no such image or cannot be reached yet (e.g. before the link is up in --dry)."""

    @staticmethod
    def default() -> ImageDict:
        return {}

    def requires_command(self, target: str, image: str) -> str:
        return "ssh"

    def command(self, target: str, image: str) -> str:
        remote = sh("docker", "image", "inspect", image)
        return f"{sh(*ssh_words(), target, remote)} 2>/dev/null || true"

    def process(self, output: list[str]) -> ImageDict:
        return summarize_inspect(output)


def parse_capabilities(output: list[str]) -> dict[str, Any]:
    """The `capabilities --json` document (one JSON object) as a dict; {} when no line parses as an object."""
    for line in output:
        line = line.strip()
        if not line.startswith("{"):
            continue  # anything the image prints before the document
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    try:  # a pretty-printed document spans lines
        doc = json.loads("\n".join(output))
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


class CapabilitiesDict(TypedDict):
    image_id: str  # Docker's id of the image read ("sha256:..."); "" when there is no such image
    document: dict[str, Any]  # the parsed document; {} when none was read whole
    cached: bool  # read from the cache file, not from a container


def kept_file(cache_dir: str, image_id: str, suffix: str) -> str:
    """Where what image `image_id` says is kept: `<cache_dir>/<id without "sha256:"><suffix>` (image_id_or_kept's
    shell names the same file, `${id#*:}`)."""
    return f"{cache_dir}/{image_id.split(':', 1)[-1]}{suffix}"


def keep_command(cache_dir: str, image_id: str, suffix: str, text: str) -> str:
    """The command that keeps `text` (and a newline) as kept_file: written aside, then renamed, so a reader never
    sees half of it."""
    path = sh(kept_file(cache_dir, image_id, suffix))
    return f"mkdir -p {sh(cache_dir)} && printf '%s\\n' {sh(text)} > {path}.$$ && mv -f {path}.$$ {path}"


def capabilities_cache_file(cache_dir: str, image_id: str) -> str:
    """Where the document of image `image_id` is kept, one JSON line."""
    return kept_file(cache_dir, image_id, ".json")


def image_id_or_kept(image: str, cache_dir: str, suffix: str, whole: str, missing_fails: bool) -> str:
    """The start of a fact's shell that reads something of `image` once per image id: `#ID <id>`, then the file kept
    for that id (`<cache_dir>/<id without "sha256:"><suffix>`) when its text matches the case pattern `whole`
    (`#CACHED`, the text, and the shell ends), else `#IMAGE`: the caller's command that reads the image follows. No
    such image: the shell fails (missing_fails) or prints nothing."""
    cached = ""
    if cache_dir:
        cached = (f"c=$(cat {sh(cache_dir)}/\"${{id#*:}}\"{suffix} 2>/dev/null); "
                  f"case \"$c\" in {whole}) echo '#CACHED'; printf '%s\\n' \"$c\"; exit 0;; esac; ")
    inspect = f"docker image inspect -f '{{{{.Id}}}}' {sh(image)}"
    found = f"id=$({inspect}) || exit 1" if missing_fails else f"id=$({inspect} 2>/dev/null) || exit 0"
    return f"{found}; echo \"#ID $id\"; {cached}echo '#IMAGE'; "


def split_kept(output: list[str]) -> tuple[str, bool, list[str]]:
    """image_id_or_kept's output: (the image id or "", whether the text came from the kept file, the text's lines)."""
    lines, image_id, cached = list(output), "", False
    if lines and lines[0].startswith("#ID "):
        image_id = lines.pop(0)[len("#ID "):].strip()
    if lines and lines[0].strip() in ("#CACHED", "#IMAGE"):
        cached = lines.pop(0).strip() == "#CACHED"
    return image_id, cached, lines


class EngineCapabilities(FactBase[CapabilitiesDict]):
    """`tensorfold-native capabilities --json` from inside `image` (no network, no GPU needed), parsed, with the
    image's id; the document {} when the image is absent, so a plan on a fresh pair still works.

    cache_dir: the document is read from capabilities_cache_file when that holds one whole (`{...}`), so a converged
    run reads a small file instead of starting a container (~2 s); `cached` says which. The id names the image's
    content: a rebuilt or re-pulled image has a new id and is read afresh. This fact only reads (it also runs under
    --dry and in status.py): image.engine_capabilities_checked writes the file.
    """

    @staticmethod
    def default() -> CapabilitiesDict:
        return {"image_id": "", "document": {}, "cached": False}

    def requires_command(self, image: str, cache_dir: str = "") -> str:
        return "docker"

    def command(self, image: str, cache_dir: str = "") -> str:
        # whole: a document written aside and renamed starts with { and ends with }
        run = f"docker run --rm --network none --entrypoint tensorfold-native {sh(image)} capabilities --json"
        kept = image_id_or_kept(image, cache_dir, ".json", "'{'*'}'", missing_fails=False)
        return kept + f"{run} 2>/dev/null || true"

    def process(self, output: list[str]) -> CapabilitiesDict:
        found = self.default()
        found["image_id"], found["cached"], lines = split_kept(output)
        found["document"] = parse_capabilities(lines)
        found["cached"] = found["cached"] and bool(found["document"])
        return found


# --- the daemon and the NVIDIA runtime ---------------------------------------------------------------------------

class DaemonJsonDict(TypedDict):
    exists: bool
    config: dict[str, Any] | None  # None when the file is not a JSON object
    error: str | None  # the parser's complaint


class DaemonJson(FactBase[DaemonJsonDict]):
    """daemon.json parsed. A missing or empty file is config {} (dockerd's defaults); malformed JSON gives config
    None and the parser's error, so the operation can refuse to touch the file."""

    @staticmethod
    def default() -> DaemonJsonDict:
        return {"exists": False, "config": {}, "error": None}

    def command(self, path: str = DAEMON_JSON) -> str:
        quoted = shlex.quote(path)
        return f"if [ -e {quoted} ]; then echo '##EXISTS##'; cat {quoted} 2>&1 || true; else echo '##ABSENT##'; fi"

    def process(self, output: list[str]) -> DaemonJsonDict:
        if not output or output[0].strip() != "##EXISTS##":
            return self.default()
        text = "\n".join(output[1:]).strip()
        if not text:
            return {"exists": True, "config": {}, "error": None}
        try:
            config = json.loads(text)
        except ValueError as e:
            return {"exists": True, "config": None, "error": str(e)}
        if not isinstance(config, dict):
            return {"exists": True, "config": None, "error": "the top level is not a JSON object"}
        return {"exists": True, "config": config, "error": None}


class DockerRuntimeDict(TypedDict):
    reachable: bool
    default_runtime: str
    runtimes: list[str]  # sorted names
    root_dir: str  # where images and containers are kept (DockerRootDir)


class DockerRuntimeInfo(FactBase[DockerRuntimeDict]):
    """The running daemon's runtimes and root directory, from `docker info`; reachable False when docker is missing
    or the daemon does not answer."""

    @staticmethod
    def default() -> DockerRuntimeDict:
        return {"reachable": False, "default_runtime": "", "runtimes": [], "root_dir": ""}

    def requires_command(self) -> str:
        return "docker"

    def command(self) -> str:
        # the runtimes' JSON last: it may hold any character but a newline
        return ("if out=$(docker info --format '{{.DefaultRuntime}}|{{.DockerRootDir}}|{{json .Runtimes}}' "
                "2>/dev/null); then echo \"info=$out\"; else echo '##UNREACHABLE##'; fi")

    def process(self, output: list[str]) -> DockerRuntimeDict:
        for line in output:
            if line.startswith("info="):
                default, _, rest = line[len("info="):].partition("|")
                root, _, runtimes = rest.partition("|")
                try:
                    names = sorted(json.loads(runtimes or "{}"))
                except ValueError:
                    names = []
                return {"reachable": True, "default_runtime": default.strip(), "runtimes": names,
                        "root_dir": root.strip() if root.strip().startswith("/") else ""}
        return self.default()


class ContainerRuntimeTools(HostTools):
    """{tool: bool} for docker, dockerd and the NVIDIA container runtime's tools on the PATH."""

    TOOLS = ("docker", "dockerd", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-ctk")


class ContainerMemoryDict(TypedDict):
    name: str
    used_bytes: int | None
    usage: str  # docker's raw "used / limit" text


class DockerMemoryUseDict(TypedDict):
    ok: bool  # False when docker is missing or its daemon unreachable (e.g. the user is not in group docker)
    containers: list[ContainerMemoryDict]


class DockerMemoryUse(FactBase[DockerMemoryUseDict]):
    """Running containers and their memory use from `docker stats --no-stream`: who holds the memory."""

    @staticmethod
    def default() -> DockerMemoryUseDict:
        return {"ok": False, "containers": []}

    def requires_command(self) -> str:
        return "docker"

    def command(self) -> str:
        return ("out=$(docker stats --no-stream --format '{{.Name}}\t{{.MemUsage}}' 2>/dev/null) "
                "&& { echo '##DOCKER_STATS##'; printf '%s\\n' \"$out\"; } || echo '##DOCKER_UNREACHABLE##'")

    def process(self, output: list[str]) -> DockerMemoryUseDict:
        if not output or output[0].strip() != "##DOCKER_STATS##":
            return self.default()
        containers: list[ContainerMemoryDict] = []
        for line in output[1:]:
            if not line.strip():
                continue
            name, _, usage = line.partition("\t")
            used = usage.split("/", 1)[0]
            containers.append({"name": name.strip(), "used_bytes": parse_size(used), "usage": usage.strip()})
        return {"ok": True, "containers": containers}


# --- volumes -----------------------------------------------------------------------------------------------------

class DockerVolumeInfo(FactBase[dict[str, Any] | None]):
    """`docker volume inspect <name>`'s object (Driver, Options, Labels, ...), or None when absent."""

    def requires_command(self, volume: str) -> str:
        return "docker"

    def command(self, volume: str) -> StringCommand:
        return StringCommand("docker volume inspect", QuoteString(volume), "2>/dev/null || echo '[]'")

    def process(self, output: list[str]) -> dict[str, Any] | None:
        try:
            data = json.loads("".join(output))
        except ValueError:
            return None
        return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else None


class VolumeContainers(FactBase[list[str]]):
    """Names of the containers (running or not) that use a docker volume."""

    default = list

    def requires_command(self, volume: str) -> str:
        return "docker"

    def command(self, volume: str) -> StringCommand:
        return StringCommand("docker ps -a --filter", QuoteString(f"volume={volume}"),
                             "--format '{{.Names}}' 2>/dev/null || true")

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


class RunningContainers(FactBase[dict[str, bool]]):
    """The running containers: {name: True when it carries sparkfold's managed label}."""

    default = dict

    def requires_command(self) -> str:
        return "docker"

    def command(self) -> str:
        return "docker ps --format '{{.Names}} {{.Label \"sparkfold.managed\"}}' 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, bool]:
        found = {}
        for line in output:
            name, _, label = line.strip().partition(" ")
            if name:
                found[name] = label.strip() == "1"
        return found


# --- the rank's log ----------------------------------------------------------------------------------------------

class RankLogTailDict(TypedDict):
    source: str  # "live" (running), "stopped" (a container that exited), "saved" (<log_dir>), "none"
    path: str | None  # the saved log read
    lines: list[str]


class RankLogTail(FactBase[RankLogTailDict]):
    """The newest `lines` lines of this Spark's rank log: `docker logs --timestamps` while the container exists, else
    the newest saved <log_dir>/*-rank<R>*.log.gz (containers.save_log_command writes them). Reads only."""

    @staticmethod
    def default() -> RankLogTailDict:
        return {"source": "none", "path": None, "lines": []}

    def command(self, container: str, log_dir: str, rank: int, lines: int) -> str:
        saved = f'"$d"/*-rank{int(rank)}.log.gz "$d"/*-rank{int(rank)}.*.log.gz'
        return (f"n={int(lines)}; c={sh(container)}; d={sh(log_dir)}; "
                "if command -v docker >/dev/null 2>&1 && "
                "r=$(docker container inspect --format '{{.State.Running}}' \"$c\" 2>/dev/null); then "
                "if [ \"$r\" = true ]; then echo '#LIVE'; else echo '#STOPPED'; fi; "
                "docker logs --tail \"$n\" --timestamps \"$c\" 2>&1; "
                f"else f=$(ls -1t {saved} 2>/dev/null | head -n 1); "
                "if [ -n \"$f\" ]; then echo \"#SAVED $f\"; gzip -dc \"$f\" 2>/dev/null | tail -n \"$n\"; "
                "else echo '#NONE'; fi; fi; true")

    def process(self, output: list[str]) -> RankLogTailDict:
        if not output:
            return self.default()
        first, rest = output[0].strip(), list(output[1:])
        if first == "#LIVE":
            return {"source": "live", "path": None, "lines": rest}
        if first == "#STOPPED":
            return {"source": "stopped", "path": None, "lines": rest}
        if first.startswith("#SAVED "):
            return {"source": "saved", "path": first[len("#SAVED "):], "lines": rest}
        return self.default()

