"""The state of one systemd unit: enablement, activity and the sha256 of its unit file (a few hundred bytes)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class UnitState(FactBase):
    """{"enabled": is-enabled text ("" when systemd does not know the unit), "active": is-active text,
    "sha256": hex of the unit file at `path`, or None when the file is missing}. Always exits 0."""

    def command(self, unit, path):
        u, p = shlex.quote(unit), shlex.quote(path)
        return (
            f"echo \"enabled=$(systemctl is-enabled {u} 2>/dev/null)\"; "
            f"echo \"active=$(systemctl is-active {u} 2>/dev/null)\"; "
            f"if [ -f {p} ]; then echo \"sha256=$(sha256sum {p} | cut -d' ' -f1)\"; else echo 'sha256='; fi"
        )

    @staticmethod
    def default():
        return {"enabled": "", "active": "", "sha256": None}

    def process(self, output):
        found = self.default()
        for line in output:
            key, sep, value = line.strip().partition("=")
            if sep and key in found:
                # is-enabled/is-active print one word; keep the first line's word only
                found[key] = value.strip().split()[0] if value.strip() else ("" if key != "sha256" else None)
        return found
