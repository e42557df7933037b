"""The state of a systemd unit: whether it is enabled and active, and the hash of its unit file."""

from __future__ import annotations

import shlex
from typing import TypedDict

from pyinfra.api import FactBase


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
