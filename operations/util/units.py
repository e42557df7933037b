"""The one way sparkfold installs a systemd unit, uploads the script a unit runs, or turns a unit off: files through
files.put (so `--dry --diff` shows them), units through systemd.service. Call these inside a @deploy step."""

from __future__ import annotations

import hashlib
from io import StringIO
from pathlib import Path
from typing import Any

from pyinfra.api import operation
from pyinfra.operations import files, systemd

from ..layout import script_path, unit_path
from .owned import owned_or_absent

REMOTE_SCRIPTS = Path(__file__).resolve().parents[1] / "remote"  # operations/remote/: uploaded to SCRIPT_DIR


def script_sha256(script: str) -> str:
    """sha256 of operations/remote/<script>. A unit that runs the script names it, so a new script changes the unit
    file, which restarts the unit (restart_on_change)."""
    return hashlib.sha256((REMOTE_SCRIPTS / script).read_bytes()).hexdigest()


def script_installed(script: str) -> None:
    """operations/remote/<script> at SCRIPT_DIR/<script>, mode 755."""
    files.put(name=f"script {script_path(script)}", src=str(REMOTE_SCRIPTS / script), dest=script_path(script),
              mode="755")


def unit_file(unit_name: str, text: str) -> Any:
    """UNIT_DIR/<unit_name> holds `text` (mode 644), refused when the path holds a file that is not sparkfold's.
    Returns the put (its .changed drives the daemon-reload). Alone, for a unit another one starts (a timer's)."""
    owned_or_absent(name=f"{unit_path(unit_name)} is sparkfold's or free", path=unit_path(unit_name))
    return files.put(name=f"unit file {unit_path(unit_name)}", src=StringIO(text), dest=unit_path(unit_name),
                     mode="644")


def unit_installed(unit_name: str, text: str, restart_on_change: bool = False) -> None:
    """UNIT_DIR/<unit_name> holds `text` (mode 644) and the unit is enabled and running. daemon-reload runs only when
    the file changed, and then a running unit is restarted only with restart_on_change (a guard picks up its new
    ExecStart)."""
    unit = unit_file(unit_name, text)
    unit_service(name=f"{unit_name} enabled and running", service=unit_name, file_put=unit, running=True,
                 enabled=True, restart_on_change=restart_on_change)


def file_changed(put: Any) -> bool:
    """Whether an earlier operation (a unit file's put) changes its file. Asked inside a later operation: once the
    put ran, its result, with no fact read again (OperationMeta.changed read while the deploy is declared would run
    the put's facts a second time)."""
    return put.did_change() if put.is_complete() else put.will_change


@operation()
def unit_service(service: str, file_put: Any, running: bool, enabled: bool | None = None,
                 restart_on_change: bool = False):
    """systemd.service for a unit whose file `file_put` installs: daemon-reload (and, with restart_on_change, a
    restart) only when that file changed. enabled None: left as it is."""
    changed = file_changed(file_put)
    yield from systemd.service._inner(service=service, running=running, enabled=enabled, daemon_reload=changed,
                                      restarted=restart_on_change and changed)


def unit_off(unit_name: str, **op_args: object) -> None:
    """A unit sparkfold installed earlier is stopped and disabled when present; its file stays."""
    op_args.setdefault("name", f"{unit_name} stopped and disabled (if present)")
    systemd.service(service=unit_name, running=False, enabled=False, **op_args)  # type: ignore[arg-type]
