"""A reusable operation: one system unit installed from given content, loaded, enabled and active.

daemon-reload runs only when the unit file changed; enable/start only when needed; a restart on content change
only when asked (restart_on_change). Used by the GPU clock lock, memguard and supervision."""

from __future__ import annotations

import hashlib
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation

from operations.facts.systemd import UnitState

UNIT_DIR = "/etc/systemd/system"
ENABLED_STATES = ("enabled", "enabled-runtime", "static", "alias", "indirect", "generated")


def unit_path(unit_name: str, unit_dir: str = UNIT_DIR) -> str:
    return f"{unit_dir.rstrip('/')}/{unit_name}"


@operation()
def unit_installed(unit_name: str, content: str, enabled: bool = True, running: bool = True,
                   restart_on_change: bool = False, unit_dir: str = UNIT_DIR):
    """Install `content` as <unit_dir>/<unit_name> (mode 644), then converge enablement and activity.

    + unit_name: full unit name, e.g. "sparkfold-gpu-clock.service"
    + content: the unit file's text
    + enabled: enable (True) or disable (False) it; None leaves it alone
    + running: start (True) or stop (False) it; None leaves it alone
    + restart_on_change: restart an active unit when its file changed (new ExecStart etc.)
    """
    if "/" in unit_name or "." not in unit_name:
        raise ValueError(f"unit_name must be a unit file name like x.service, got {unit_name!r}")
    path = unit_path(unit_name, unit_dir)
    have = host.get_fact(UnitState, unit=unit_name, path=path)
    want_sha = hashlib.sha256(content.encode()).hexdigest()
    changed = have["sha256"] != want_sha
    if changed:
        yield StringCommand("mkdir", "-p", unit_dir)
        yield FileUploadCommand(StringIO(content), path)
        yield StringCommand("chmod", "644", path)
        yield StringCommand("systemctl", "daemon-reload")

    is_enabled = have["enabled"] in ENABLED_STATES
    # a unit that was static (no [Install]) before this change may have gained one: enable it again
    if enabled is True and (not is_enabled or (changed and have["enabled"] == "static")):
        yield StringCommand("systemctl", "enable", unit_name)
    elif enabled is False and is_enabled and have["enabled"] != "static":
        yield StringCommand("systemctl", "disable", unit_name)

    is_active = have["active"] in ("active", "reloading", "activating")
    if running is True:
        if not is_active:
            yield StringCommand("systemctl", "start", unit_name)
        elif changed and restart_on_change:
            yield StringCommand("systemctl", "restart", unit_name)
    elif running is False and is_active:
        yield StringCommand("systemctl", "stop", unit_name)

    if not changed and (enabled is None or (enabled == is_enabled) or (enabled is False and have["enabled"] == "static")) \
            and (running is None or running == is_active):
        host.noop(f"{unit_name} is installed, {have['enabled'] or 'unknown'} and {have['active'] or 'unknown'}")
