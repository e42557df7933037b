"""Scripted facts of the pyinfra core operations that sparkfold composes (files.put, systemd.service), and a runner
that also returns what files.put would upload.

remote_file(path, text=None, mode=644): the facts files.put reads for `path` (absent, or holding `text`), and the
  FileSum sparkfold's file_put reads for it.
unit(name, running, enabled): the facts systemd.service reads for one unit, and sparkfold's one-read UnitState.
merged(*facts): fact dicts combined (tables of the same fact merged).
run_put(op, facts, executing=False, **kwargs) -> (commands as strings, {dest: uploaded text}, host).
"""

from __future__ import annotations

import hashlib
import posixpath

from harness import FakeHost, _render, _State, with_args
from pyinfra.api import FileUploadCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from operations.facts.files import FileSum
from operations.facts.systemd import UnitState, UnitStateDict


def merged(*fact_sets: dict) -> dict:
    out: dict = {}
    for facts in fact_sets:
        for cls, value in facts.items():
            if isinstance(value, dict) and "__args__" in value and cls in out:
                out[cls] = with_args({**out[cls]["__args__"], **value["__args__"]})
            else:
                out[cls] = value
    return out


def remote_file(path: str, text: str | None = None, mode: int = 644, dir_exists: bool = True) -> dict:
    folder = posixpath.dirname(path)
    facts = {
        File: with_args({f"path={path}": None if text is None else {"mode": mode, "user": "root", "group": "root"}}),
        Directory: with_args({f"path={path}": None, f"path={folder}": {"mode": 755} if dir_exists else None}),
    }
    if text is not None:
        facts[Sha1File] = with_args({f"path={path}": hashlib.sha1(text.encode()).hexdigest()})
    facts[FileSum] = with_args({f"path={path}": None if text is None else {
        "link": False, "sha1": hashlib.sha1(text.encode()).hexdigest(), "mode": mode, "user": "root",
        "group": "root", "head": "".join(text.splitlines(keepends=True)[:3])}})
    return facts


def unit_state(running: bool, enabled: bool) -> UnitStateDict:
    """UnitState of a unit that runs (or is dead) and is enabled (or disabled), in systemctl's words."""
    return {"enabled": "enabled" if enabled else "disabled", "active": "active" if running else "inactive",
            "sub": "running" if running else "dead", "sha256": None}


def unit(name: str, running: bool, enabled: bool) -> dict:
    key = f"machine=None, services=['{name}'], user_mode=False, user_name=None"
    return {SystemdStatus: with_args({key: {name: running}}), SystemdEnabled: with_args({key: {name: enabled}}),
            UnitState: with_args({f"unit={name}": unit_state(running, enabled)})}


def run_put(op, facts: dict, executing: bool = False, **kwargs) -> tuple[list[str], dict[str, str], FakeHost]:
    host = FakeHost(facts)
    with ctx_state.use(_State(executing)), ctx_host.use(host):
        commands = list(op._inner(**kwargs))
    uploads = {c.dest: c.src.getvalue() if hasattr(c.src, "getvalue") else c.src
               for c in commands if isinstance(c, FileUploadCommand)}
    return [_render(c) for c in commands], uploads, host
