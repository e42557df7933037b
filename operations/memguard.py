"""Memguard on both Sparks: operations/remote/memguard.py uploaded to SCRIPT_DIR and run by sparkfold-memguard.service
(Type=simple, Restart=always). The unit file carries the script's sha256, so a new script changes the unit and
restarts the guard; nothing restarts it otherwise. With memguard off the unit is stopped and disabled when present
(never deleted)."""

from __future__ import annotations

from pyinfra.api import deploy

from operations.layout import MEMGUARD_UNIT, script_path
from operations.owned.units import script_installed, script_sha256, unit_installed, unit_off
from operations.util.templates import render

SCRIPT = "memguard.py"


def render_unit(container: str, floor_gib: float) -> str:
    return render("sparkfold-memguard.service.j2", container=container, floor_gib=f"{float(floor_gib):g}",
                  script=script_path(SCRIPT), script_sha256=script_sha256(SCRIPT))


@deploy("Memguard")
def memguard(s) -> None:
    """The guard installed and running, or (memguard off) stopped and disabled; every operation needs root."""
    if not s.memguard:
        unit_off(MEMGUARD_UNIT)
        return
    script_installed(SCRIPT)
    unit_installed(MEMGUARD_UNIT, render_unit(s.container_name, s.memguard_gib), restart_on_change=True)
