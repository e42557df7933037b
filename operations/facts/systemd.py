"""The state of a systemd unit: whether it is enabled and active, and the hash of its unit file."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TypedDict

from pyinfra.api import FactBase
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

_PROPERTIES = ("UnitFileState", "ActiveState", "SubState")  # read into enabled, active and sub


class UnitStateDict(TypedDict):
    enabled: str  # UnitFileState: "enabled", "static", "disabled", ...; "" when systemd does not know the unit
    active: str  # ActiveState: "active", "inactive", "activating", "failed", ...
    sub: str  # SubState: "running", "waiting" (a timer between runs), "exited", "dead", ...
    sha256: str | None  # hex of the unit file at `path`; None when it is missing or no path was given


class UnitState(FactBase[UnitStateDict]):
    """A unit's enablement and activity in one `systemctl show`, and (given its file's `path`) the sha256 of that
    few-hundred-byte file. It serves the status table (the words) and unit_service (unit_running, unit_enabled:
    pyinfra's judgement of the same words), so an operation starts or enables only what differs. Always exits 0."""

    @staticmethod
    def default() -> UnitStateDict:
        return {"enabled": "", "active": "", "sub": "", "sha256": None}

    def command(self, unit: str, path: str = "") -> str:
        asked = " ".join(f"--property {name}" for name in _PROPERTIES)
        command = f"systemctl show {asked} {shlex.quote(unit)} 2>/dev/null || true"
        if path:
            quoted = shlex.quote(path)
            command += f"; if [ -f {quoted} ]; then echo \"sha256=$(sha256sum {quoted} | cut -d' ' -f1)\"; fi"
        return command

    def process(self, output: list[str]) -> UnitStateDict:
        found = self.default()
        for line in output:
            key, _, value = line.strip().partition("=")
            value = value.strip()
            if key == "UnitFileState":
                found["enabled"] = value
            elif key == "ActiveState":
                found["active"] = value
            elif key == "SubState":
                found["sub"] = value
            elif key == "sha256":
                found["sha256"] = value or None
        return found


def unit_running(state: Mapping[str, object]) -> bool:
    """The unit runs, as pyinfra's SystemdStatus (which systemd.service reads) judges it: a waiting timer runs."""
    return state.get("sub") in SystemdStatus.state_values


def unit_enabled(state: Mapping[str, object]) -> bool:
    """The unit is enabled, as pyinfra's SystemdEnabled judges it: static counts."""
    return state.get("enabled") in SystemdEnabled.state_values
