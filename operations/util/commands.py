"""Shell commands: quoting, and a command that fails the host with a message."""

from __future__ import annotations

import shlex

from pyinfra.api import StringCommand

APT_CACHE_S = 3600  # an apt index younger than this is fresh enough to install from
MANAGED_HEADER = "# Managed by sparkfold: edits are replaced on the next deploy."


def fail_command(message: str) -> StringCommand:
    """A command that prints `message` on stderr and fails this host (and so, with FAIL_PERCENT 0, the run)."""
    return StringCommand(f"echo {shlex.quote('sparkfold: ' + message)} >&2; exit 1")


def sh(*words: object) -> str:
    """Join words into one shell command line, each quoted."""
    return " ".join(shlex.quote(str(w)) for w in words)


def source_env_file(path: str) -> str:
    """Shell text (ending in `; `) that exports the variables of `path` when it is readable: secrets a command needs
    (a proxy with a password) reach it without appearing on its command line. "" without a path."""
    return f"[ ! -r {shlex.quote(path)} ] || . {shlex.quote(path)}; " if path else ""
