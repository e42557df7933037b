"""Facts about the rank container and what starting it needs. All exit 0 and are cheap."""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand

# One line of JSON with the parts of `docker container inspect` the lifecycle decides from.
_FORMAT = ('{"state":{{json .State}},"labels":{{json .Config.Labels}},"image":{{json .Config.Image}},'
           '"created":{{json .Created}}}')


class RankContainer(FactBase):
    """{"exists", "running", "status", "exit_code", "oom_killed", "labels", "image", "created"} of the container
    named `container`, or {} when there is none (or no docker yet)."""

    default = dict

    def requires_command(self, container):
        return "docker"

    def command(self, container):
        return StringCommand("docker", "container", "inspect", "--format", QuoteString(_FORMAT),
                             QuoteString(container),
                             "2>/dev/null", "||", "true")

    def process(self, output):
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
            }
        return {}


class SpecRecord(FactBase):
    """The spec hash this Spark's rank should run (written by the lifecycle before the pair decision), or None."""


    def command(self, path):
        return StringCommand("cat", QuoteString(path), "2>/dev/null", "||", "true")

    def process(self, output):
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "spec-hash" and value:
                return value
        return None


class MemAvailableGib(FactBase):
    """MemAvailable of /proc/meminfo in GiB (float), or None if unreadable."""

    command = "awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null || true"

    def process(self, output):
        for line in output:
            if line.strip().isdigit():
                return int(line.strip()) / (1024 * 1024)
        return None


class InfinibandDevices(FactBase):
    """True when /dev/infiniband exists (the RDMA devices a rank container is given)."""

    default = bool
    command = "test -d /dev/infiniband && echo yes || echo no"

    def process(self, output):
        return any(line.strip() == "yes" for line in output)
