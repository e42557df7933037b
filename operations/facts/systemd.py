"""The state of a systemd unit: whether it is enabled and active, and the hash of its unit file."""

from __future__ import annotations

import shlex
from typing import TypedDict

from pyinfra.api import FactBase
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus


class UnitStateDict(TypedDict):
    enabled: str  # `systemctl is-enabled`'s word, "" when systemd does not know the unit
    active: str  # `systemctl is-active`'s word
    sha256: str | None  # hex of the unit file at `path`; None when it is missing or no path was given


class UnitState(FactBase[UnitStateDict]):
    """A unit's enablement and activity, and (given its file's `path`) the sha256 of that few-hundred-byte file, so
    an operation rewrites, reloads, enables or starts only what differs. Always exits 0."""

    @staticmethod
    def default() -> UnitStateDict:
        return {"enabled": "", "active": "", "sha256": None}

    def command(self, unit: str, path: str = "") -> str:
        u = shlex.quote(unit)
        command = (f"echo \"enabled=$(systemctl is-enabled {u} 2>/dev/null)\"; "
                   f"echo \"active=$(systemctl is-active {u} 2>/dev/null)\"")
        if path:
            p = shlex.quote(path)
            command += f"; if [ -f {p} ]; then echo \"sha256=$(sha256sum {p} | cut -d' ' -f1)\"; fi"
        return command

    def process(self, output: list[str]) -> UnitStateDict:
        found = self.default()
        for line in output:
            key, _, value = line.strip().partition("=")
            word = value.split()[0] if value.split() else ""  # is-enabled/is-active print one word
            if key == "enabled":
                found["enabled"] = word
            elif key == "active":
                found["active"] = word
            elif key == "sha256":
                found["sha256"] = word or None
        return found


class ServiceStateDict(TypedDict):
    running: bool  # as pyinfra's SystemdStatus judges it (a waiting timer runs)
    enabled: bool  # as pyinfra's SystemdEnabled judges it (static counts)


class ServiceState(FactBase[ServiceStateDict]):
    """What systemd.service reads in two facts, in one `systemctl show`: whether the unit runs and is enabled, judged
    by the same words pyinfra's facts use. An unknown unit is neither."""

    def requires_command(self, *args, **kwargs) -> str:
        return "systemctl"

    @staticmethod
    def default() -> ServiceStateDict:
        return {"running": False, "enabled": False}

    def command(self, unit: str) -> str:
        return f"systemctl show --property SubState --property UnitFileState {shlex.quote(unit)}"

    def process(self, output: list[str]) -> ServiceStateDict:
        found = self.default()
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == SystemdStatus.state_key:
                found["running"] = value in SystemdStatus.state_values
            elif key == SystemdEnabled.state_key:
                found["enabled"] = value in SystemdEnabled.state_values
        return found
