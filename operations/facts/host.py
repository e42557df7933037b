"""Facts about the host itself: platform, memory, tools and packages, users' groups, ssh reachability of the peer.

Every command exits 0; a read that finds nothing prints a sentinel the process step understands.
"""

from __future__ import annotations

import re
import shlex
from typing import TypedDict

from pyinfra.api import FactBase

# Tools the preflight may ask about (HostTools reports each as present or not).
KNOWN_TOOLS = ("docker", "git", "python3", "rsync", "ssh", "nvidia-smi", "apt-get")

GIB = 1024**3


class OsReleaseDict(TypedDict):
    arch: str  # uname -m
    id: str  # ID, lower case
    id_like: list[str]  # ID_LIKE
    version_id: str
    pretty_name: str


class OsRelease(FactBase[OsReleaseDict]):
    """The architecture and the OS from /etc/os-release: what the preflight accepts or refuses."""

    @staticmethod
    def default() -> OsReleaseDict:
        return {"arch": "", "id": "", "id_like": [], "version_id": "", "pretty_name": ""}

    def command(self) -> str:
        return "echo \"arch=$(uname -m)\"; cat /etc/os-release 2>/dev/null || true"

    def process(self, output: list[str]) -> OsReleaseDict:
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


class MemInfo(FactBase[dict[str, int]]):
    """/proc/meminfo as {"MemTotal": bytes, "MemAvailable": bytes, ...} (the kernel prints kB = KiB); {} when
    unreadable."""

    default = dict

    def command(self) -> str:
        return "cat /proc/meminfo 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, int]:
        values = {}
        for line in output:
            match = re.match(r"^(\w+):\s+(\d+)(?:\s+kB)?\s*$", line.strip())
            if match:
                factor = 1024 if line.rstrip().endswith("kB") else 1
                values[match.group(1)] = int(match.group(2)) * factor
        return values


def mem_available_gib(meminfo: dict[str, int]) -> float | None:
    """MemAvailable of a MemInfo result in GiB, or None when it was not read."""
    avail = meminfo.get("MemAvailable")
    return None if avail is None else avail / GIB


class HostTools(FactBase[dict[str, bool]]):
    """{tool: bool} for each of TOOLS: found on the PATH of a login-less shell. Subclasses name other TOOLS."""

    TOOLS: tuple[str, ...] = KNOWN_TOOLS
    default = dict

    def command(self) -> str:
        return ("for t in " + " ".join(self.TOOLS) + "; do "
                "if command -v \"$t\" >/dev/null 2>&1; then echo \"$t=yes\"; else echo \"$t=no\"; fi; done")

    def process(self, output: list[str]) -> dict[str, bool]:
        tools = {}
        for line in output:
            name, sep, value = line.strip().partition("=")
            if sep:
                tools[name] = value == "yes"
        return tools


class UserGroups(FactBase[list[str] | None]):
    """The groups `user` is in as the system resolves them (`id -nG`: /etc/group, LDAP, ...); None when there is no
    such user."""

    def command(self, user: str) -> str:
        return f"id -nG {shlex.quote(user)} 2>/dev/null || echo '#NOUSER'"

    def process(self, output: list[str]) -> list[str] | None:
        words = " ".join(output).split()
        return None if "#NOUSER" in words else words


class CommandStatusDict(TypedDict):
    ok: bool
    rc: int | None  # the command's exit status
    detail: str  # its last output lines, joined by " | "


class CommandStatus(FactBase[CommandStatusDict]):
    """The family of facts that ask whether one command succeeds here, with its exit status and its last output
    lines (what a message shows). A subclass's command() passes its probe through `asked`."""

    @staticmethod
    def default() -> CommandStatusDict:
        return {"ok": False, "rc": None, "detail": "no answer"}

    @staticmethod
    def asked(probe: str) -> str:
        return f"out=$({probe} 2>&1 </dev/null); rc=$?; echo \"rc=$rc\"; printf '%s\\n' \"$out\" | tail -n 3"

    def process(self, output: list[str]) -> CommandStatusDict:
        rc = None
        detail = []
        for line in output:
            if rc is None and line.startswith("rc="):
                value = line[3:].strip()
                rc = int(value) if value.isdigit() else None
            elif line.strip():
                detail.append(line.strip())
        return {"ok": rc == 0, "rc": rc, "detail": " | ".join(detail)}


class SshReachable(CommandStatus):
    """Can this host ssh to `target` without a prompt? Runs as the ssh user (its keys), with BatchMode so a missing
    key fails instead of asking. No requires_command: a missing ssh is reported in rc/detail (127, not found)."""

    def command(self, target: str) -> str:
        return self.asked(f"ssh -o BatchMode=yes -o ConnectTimeout=10 {shlex.quote(target)} true")


class SudoWithoutPassword(CommandStatus):
    """Does sudo work for the ssh user without a password (`sudo -n true`)? Read without sudo itself: every root step
    needs it, and pyinfra's own sudo would stop to ask for a password. A missing sudo shows as rc 127."""

    def command(self) -> str:
        return self.asked("sudo -n true")
