"""Facts about the engine image: what Docker holds under a reference, here or on the worker, and what the engine
inside says it can do. All exit 0: an absent image (or an unreachable worker) reads as {}."""

from __future__ import annotations

import json

from pyinfra.api import FactBase

from operations.util import sh

# BatchMode: never prompt. accept-new: the worker's link address is new to the head on a first deploy.
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "StrictHostKeyChecking=accept-new")


def summarize_inspect(output: list[str]) -> dict:
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


class DockerImageInfo(FactBase):
    """The image Docker holds under `image` (tag, id or name@digest) on this host, summarised; {} when absent."""

    default = dict

    def requires_command(self, image) -> str:
        return "docker"

    def command(self, image) -> str:
        # `|| true`: a missing image is an answer, not a failure.
        return f"docker image inspect {sh(image)} 2>/dev/null || true"

    def process(self, output):
        return summarize_inspect(output)


class PeerDockerImageInfo(FactBase):
    """The same summary for the worker's Docker, read from the head over ssh (`target` = user@worker-link-ip);
    {} when the worker has no such image or cannot be reached yet (e.g. before the link is up in --dry)."""

    default = dict

    def requires_command(self, target, image) -> str:
        return "ssh"

    def command(self, target, image) -> str:
        remote = sh("docker", "image", "inspect", image)
        return f"{sh('ssh', *SSH_OPTIONS, target, remote)} 2>/dev/null || true"

    def process(self, output):
        return summarize_inspect(output)


def parse_capabilities(output: list[str]) -> dict:
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


class EngineCapabilities(FactBase):
    """`tensorfold-native capabilities --json` from inside `image` (no network, no GPU needed), parsed.
    {} when the image is absent, so a plan on a fresh pair still works."""

    default = dict

    def requires_command(self, image) -> str:
        return "docker"

    def command(self, image) -> str:
        ref = sh(image)
        run = f"docker run --rm --network none --entrypoint tensorfold-native {ref} capabilities --json"
        return f"if docker image inspect {ref} >/dev/null 2>&1; then {run} 2>/dev/null || true; fi"

    def process(self, output):
        return parse_capabilities(output)
