"""How this machine's ssh logs in to a Spark: the user and port `ssh -G` resolves (~/.ssh/config included) for a
Spark whose site file names none, and pyinfra's error for a Spark that did not answer made to name the one command
that shows why (site.ssh_check).

pyinfra reads ~/.ssh/config as it connects; sparkfold must know the same user before that (the docker group, the
head's ssh to the worker, the home its paths resolve under), so it asks ssh itself rather than assuming root.
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from operations.settings.site import ssh_check

Run = Callable[[Sequence[str]], subprocess.CompletedProcess]


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)


def ssh_config_login(host: str, port: int | None, run: Run = _run) -> tuple[str, int] | str:
    """(user, port) ssh would log in to `host` with (`ssh -G`: ~/.ssh/config, else this machine's user and 22), or
    why ssh could not say. port: the one the site file or --port gives (None: ssh's own)."""
    argv = ["ssh", "-G", *(["-p", str(port)] if port else []), host]
    try:
        done = run(argv)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`{shlex.join(argv)}` could not run ({type(exc).__name__}: {exc})"
    settings = dict(line.partition(" ")[::2] for line in done.stdout.splitlines() if " " in line)
    if done.returncode != 0 or not settings.get("user") or not settings.get("port", "").isdigit():
        said = (done.stderr or "").strip().splitlines()
        return f"`{shlex.join(argv)}` failed (exit {done.returncode}{': ' + said[-1] if said else ''})"
    return settings["user"], int(settings["port"])


class UnansweredHint(logging.Filter):
    """Adds the ssh line that shows why to pyinfra's error for a Spark it could not connect to (pyinfra's Host.connect
    logs it; no hook of pyinfra's runs then that could print it: State.init clears the callback handlers after the
    inventory is loaded)."""

    def __init__(self, commands: Mapping[str, str]):
        super().__init__()
        self.commands = dict(commands)  # pyinfra's host name -> its ssh_check line

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.funcName == "connect" and isinstance(record.msg, str):
            for name, command in self.commands.items():
                if f"[{name}]" in _plain(record.msg) and "`ssh -p" not in record.msg:
                    record.msg += f"\n    sparkfold: `{command}` shows why {name} does not answer"
                    break
        return True


def _plain(text: str) -> str:
    """`text` without the terminal's colour codes pyinfra puts around a host's name."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def hint_unanswered(sparks: Mapping[str, Mapping[str, Any]], logger: logging.Logger | None = None) -> UnansweredHint:
    """Have pyinfra's connection errors for these Sparks (pyinfra's host name -> the host data it connects with)
    name the ssh line to run; replaces the hint an earlier load of the inventory installed."""
    logger = logger or logging.getLogger("pyinfra")
    for old in [f for f in logger.filters if isinstance(f, UnansweredHint)]:
        logger.removeFilter(old)
    hint = UnansweredHint({name: ssh_check(data, name) for name, data in sparks.items()})
    logger.addFilter(hint)
    return hint
