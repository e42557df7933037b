"""Facts about the host itself: platform, memory, disk, tools, reachability of the peer.

Every command exits 0; a read that finds nothing prints a sentinel the process step understands.
"""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase

# Tools the preflight may ask about (HostTools reports each as present or not).
KNOWN_TOOLS = ("docker", "git", "python3", "rsync", "ssh", "nvidia-smi", "apt-get")

_UNITS = {
    "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def parse_size(text: str) -> int | None:
    """docker's human sizes ("1.5GiB", "512MiB", "0B", "3.2kB") -> bytes; None when unreadable."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?i?B)\s*", text, re.IGNORECASE)
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


class OsRelease(FactBase):
    """{"arch": uname -m, "id": ID, "id_like": [...], "version_id": ..., "pretty_name": ...} from /etc/os-release."""

    command = "echo \"arch=$(uname -m)\"; cat /etc/os-release 2>/dev/null || true"

    @staticmethod
    def default():
        return {"arch": "", "id": "", "id_like": [], "version_id": "", "pretty_name": ""}

    def process(self, output):
        info = self.default()
        for line in output:
            key, sep, value = line.partition("=")
            if not sep:
                continue
            value = value.strip().strip('"').strip("'")
            key = key.strip()
            if key == "arch":
                info["arch"] = value
            elif key == "ID":
                info["id"] = value.lower()
            elif key == "ID_LIKE":
                info["id_like"] = value.lower().split()
            elif key == "VERSION_ID":
                info["version_id"] = value
            elif key == "PRETTY_NAME":
                info["pretty_name"] = value
        return info


class MemInfo(FactBase):
    """/proc/meminfo as {"MemTotal": bytes, "MemAvailable": bytes, ...} (the kernel prints kB = KiB)."""

    command = "cat /proc/meminfo 2>/dev/null || true"
    default = dict

    def process(self, output):
        values = {}
        for line in output:
            m = re.match(r"^(\w+):\s+(\d+)(?:\s+kB)?\s*$", line.strip())
            if m:
                factor = 1024 if line.rstrip().endswith("kB") else 1
                values[m.group(1)] = int(m.group(2)) * factor
        return values


class DockerMemoryUse(FactBase):
    """Running containers and their memory use from `docker stats --no-stream`:
    {"ok": bool, "containers": [{"name": str, "used_bytes": int | None, "usage": raw text}]}.
    ok is False when docker is missing or its daemon is unreachable (e.g. the user is not in group docker)."""

    command = (
        "if command -v docker >/dev/null 2>&1; then "
        "out=$(docker stats --no-stream --format '{{.Name}}\t{{.MemUsage}}' 2>/dev/null) "
        "&& { echo '##DOCKER_STATS##'; printf '%s\\n' \"$out\"; } || echo '##DOCKER_UNREACHABLE##'; "
        "else echo '##NO_DOCKER##'; fi"
    )

    @staticmethod
    def default():
        return {"ok": False, "containers": []}

    def process(self, output):
        if not output or output[0].strip() != "##DOCKER_STATS##":
            return self.default()
        containers = []
        for line in output[1:]:
            if not line.strip():
                continue
            name, _, usage = line.partition("\t")
            used = usage.split("/", 1)[0]
            containers.append({"name": name.strip(), "used_bytes": parse_size(used), "usage": usage.strip()})
        return {"ok": True, "containers": containers}


class DiskFree(FactBase):
    """Free space for `path`, measured at its nearest existing parent (the path may not exist yet):
    {"path": requested, "measured": existing parent, "mount": mount point, "device": filesystem,
     "free_bytes": int} or None when df could not read it."""

    def command(self, path):
        return (
            f"p={shlex.quote(path)}; while [ ! -e \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname \"$p\"); done; "
            "echo \"measured=$p\"; df -P -k \"$p\" 2>/dev/null | tail -n +2 || true"
        )

    def process(self, output):
        measured = None
        for line in output:
            if line.startswith("measured="):
                measured = line[len("measured="):].strip()
                continue
            fields = line.split()
            # POSIX df -P: Filesystem 1024-blocks Used Available Capacity Mounted-on (mount may hold spaces)
            if len(fields) >= 6 and fields[3].isdigit():
                return {
                    "measured": measured,
                    "device": fields[0],
                    "mount": " ".join(fields[5:]),
                    "free_bytes": int(fields[3]) * 1024,
                }
        return None


class PathUsage(FactBase):
    """Bytes already held under `path` (`du -skx`, 0 when it does not exist). Use it on the few directories this
    project fills (the model's cache folder, data_dir); it walks metadata only, no file is read."""

    def command(self, path):
        q = shlex.quote(path)
        return f"if [ -e {q} ]; then du -skx {q} 2>/dev/null | tail -n 1 || true; else echo '0 -'; fi"

    default = int

    def process(self, output):
        for line in reversed(output):
            first = line.split(None, 1)[0] if line.strip() else ""
            if first.isdigit():
                return int(first) * 1024
        return 0


class DockerRootDir(FactBase):
    """Docker's root directory from `docker info` ("" when docker is missing or unreachable)."""

    command = (
        "if command -v docker >/dev/null 2>&1; then "
        "docker info --format '{{.DockerRootDir}}' 2>/dev/null || true; fi"
    )
    default = str

    def process(self, output):
        for line in output:
            line = line.strip()
            if line.startswith("/"):
                return line
        return ""


class HostTools(FactBase):
    """{tool: bool} for each of TOOLS: found on the PATH of a login-less shell. Subclasses name other TOOLS."""

    TOOLS = KNOWN_TOOLS

    def command(self):
        return ("for t in " + " ".join(self.TOOLS) + "; do "
                "if command -v \"$t\" >/dev/null 2>&1; then echo \"$t=yes\"; else echo \"$t=no\"; fi; done")

    @staticmethod
    def default():
        return {}

    def process(self, output):
        tools = {}
        for line in output:
            name, sep, value = line.strip().partition("=")
            if sep:
                tools[name] = value == "yes"
        return tools


class SshReachable(FactBase):
    """Can this host ssh to `target` without a prompt? {"ok": bool, "rc": int, "detail": last stderr lines}.
    Runs as the ssh user (its keys), with BatchMode so a missing key fails instead of asking."""

    def command(self, target):
        return (
            f"out=$(ssh -o BatchMode=yes -o ConnectTimeout=10 {shlex.quote(target)} true 2>&1 </dev/null); rc=$?; "
            "echo \"rc=$rc\"; printf '%s\\n' \"$out\" | tail -n 3"
        )

    @staticmethod
    def default():
        return {"ok": False, "rc": None, "detail": "no answer"}

    def process(self, output):
        rc = None
        detail = []
        for line in output:
            if rc is None and line.startswith("rc="):
                value = line[3:].strip()
                rc = int(value) if value.isdigit() else None
            elif line.strip():
                detail.append(line.strip())
        return {"ok": rc == 0, "rc": rc, "detail": " | ".join(detail)}
