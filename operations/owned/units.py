"""The one way sparkfold installs a systemd unit, uploads the script a unit runs, or turns a unit off: files through
files.put (so `--dry --diff` shows them; operations/owned/files.py), units through systemd.service. Call these
inside a @deploy step."""

from __future__ import annotations

import hashlib
from io import StringIO
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import systemd

from operations.facts.systemd import UnitState, unit_enabled, unit_running
from operations.layout import script_path, unit_path
from operations.owned.files import file_put, owned_file_put
from operations.util.checks import op_changed
from operations.util.fact_reuse import fact_until_change

REMOTE_SCRIPTS = Path(__file__).resolve().parents[1] / "remote"  # operations/remote/: uploaded to SCRIPT_DIR


def script_sha256(script: str) -> str:
    """sha256 of operations/remote/<script>. A unit that runs the script names it, so a new script changes the unit
    file, which restarts the unit (restart_on_change)."""
    return hashlib.sha256((REMOTE_SCRIPTS / script).read_bytes()).hexdigest()


def script_installed(script: str) -> None:
    """operations/remote/<script> at SCRIPT_DIR/<script>, mode 755."""
    file_put(name=f"script {script_path(script)}", src=str(REMOTE_SCRIPTS / script), dest=script_path(script),
             mode="755")


def unit_file(unit_name: str, text: str) -> Any:
    """UNIT_DIR/<unit_name> holds `text` (mode 644), refused when the path holds a file that is not sparkfold's.
    Returns the put (its .changed drives the daemon-reload). Alone, for a unit another one starts (a timer's)."""
    return owned_file_put(name=f"unit file {unit_path(unit_name)}", src=StringIO(text), dest=unit_path(unit_name),
                          mode="644")


def unit_installed(unit_name: str, text: str, restart_on_change: bool = False) -> None:
    """UNIT_DIR/<unit_name> holds `text` (mode 644) and the unit is enabled and running. daemon-reload runs only when
    the file changed, and then a running unit is restarted only with restart_on_change (a guard picks up its new
    ExecStart)."""
    unit = unit_file(unit_name, text)
    unit_service(name=f"{unit_name} enabled and running", service=unit_name, file_put=unit, running=True,
                 enabled=True, restart_on_change=restart_on_change)


@operation()
def unit_service(service: str, file_put: Any, running: bool, enabled: bool | None = None,
                 restart_on_change: bool = False):
    """systemd.service for a unit (whose file `file_put` installs, None when sparkfold writes no file): daemon-reload
    (and, with restart_on_change, a restart) only when that file changed. enabled None: left as it is. One
    `systemctl show` when nothing is to be done, where systemd.service reads two facts."""
    changed = file_put is not None and op_changed(file_put)
    unit = fact_until_change(host, UnitState, unit=service)
    if not changed and unit_running(unit) == running and enabled in (None, unit_enabled(unit)):
        host.noop(f"{service} is {'running' if running else 'stopped'}"
                  + ("" if enabled is None else f" and {'enabled' if enabled else 'disabled'}"))
        return
    yield from systemd.service._inner(service=service, running=running, enabled=enabled, daemon_reload=changed,
                                      restarted=restart_on_change and changed)


def unit_off(unit_name: str, **op_args: object) -> None:
    """A unit sparkfold installed earlier is stopped and disabled when present; its file stays."""
    op_args.setdefault("name", f"{unit_name} stopped and disabled (if present)")
    unit_service(service=unit_name, file_put=None, running=False, enabled=False, **op_args)  # type: ignore[arg-type]
