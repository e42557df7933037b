"""Memguard on both Sparks: operations/remote/memguard.py uploaded to /usr/local/lib/sparkfold/ and run by
sparkfold-memguard.service (Type=simple, Restart=always). The unit file carries the script's sha256, so a new
script changes the unit and restarts the guard; nothing restarts it otherwise. With memguard off the unit is
stopped and disabled when present (never deleted)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import jinja2
from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.operations import files

from operations.facts.systemd import UnitState
from operations.systemd_unit import ENABLED_STATES, unit_installed, unit_path
from operations.util import MANAGED_HEADER

UNIT_NAME = "sparkfold-memguard.service"
REMOTE_DIR = "/usr/local/lib/sparkfold"
SCRIPT = "memguard.py"
ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates"
LOCAL_REMOTE = ROOT / "operations" / "remote"


def render_template(name: str, **data) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    return env.get_template(name).render(header=MANAGED_HEADER, **data)


def script_sha256(name: str) -> str:
    return hashlib.sha256((LOCAL_REMOTE / name).read_bytes()).hexdigest()


def render_unit(container: str, floor_gib: float) -> str:
    return render_template("sparkfold-memguard.service.j2", container=container, floor_gib=f"{float(floor_gib):g}",
                           script=f"{REMOTE_DIR}/{SCRIPT}", script_sha256=script_sha256(SCRIPT))


@operation()
def unit_off(unit_name: str):
    """A unit this project installed earlier is stopped and disabled when present; its file stays."""
    have = host.get_fact(UnitState, unit=unit_name, path=unit_path(unit_name))
    commands = []
    if have["active"] in ("active", "reloading", "activating"):
        commands.append(StringCommand("systemctl", "stop", unit_name))
    if have["enabled"] in ENABLED_STATES and have["enabled"] != "static":
        commands.append(StringCommand("systemctl", "disable", unit_name))
    if not commands:
        host.noop(f"{unit_name} is not running or enabled")
    yield from commands


def deploy_memguard(s) -> None:
    if not s.memguard:
        unit_off(name=f"memguard off: {UNIT_NAME} stopped and disabled if present", unit_name=UNIT_NAME, _sudo=True)
        return
    files.put(name=f"memguard script {REMOTE_DIR}/{SCRIPT}", src=str(LOCAL_REMOTE / SCRIPT),
              dest=f"{REMOTE_DIR}/{SCRIPT}", mode="755", create_remote_dir=True, _sudo=True)
    unit_installed(
        name=f"memguard unit {UNIT_NAME} (kill {s.container_name} below {s.memguard_gib} GiB)",
        unit_name=UNIT_NAME,
        content=render_unit(s.container_name, s.memguard_gib),
        enabled=True,
        running=True,
        restart_on_change=True,
        _sudo=True,
    )
