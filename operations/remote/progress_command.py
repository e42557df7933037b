"""Progress while a long step runs, at pyinfra's default verbosity.

pyinfra prints a command's output only at -vvv, and only once a line ends. A `LiveCommand` prints each output line
as it arrives, whatever the verbosity; `progress_command` wraps a long shell command in operations/remote/progress.py
so that output is one plain progress line every `every` seconds (never carriage returns): the progress_every_s
setting, passed down by every caller.
"""

from __future__ import annotations

import shlex

from pyinfra.api import StringCommand

from operations.remote import heredoc_command


class LiveCommand(StringCommand):
    """A command whose output lines are shown as they arrive, at any verbosity."""

    def execute(self, state, host, connector_arguments):
        connector_arguments.update(self.connector_arguments)
        return host.run_shell_command(self, print_output=True, print_input=state.print_input, **connector_arguments)


def progress_command(label: str, command: str = "", *, size_of: str = "", probe: str = "", total: int = 0,
                     latest: str = "", relay: tuple[str, str] | None = None, python: str = "python3",
                     every: float, own_work: bool = False, private_dir: bool = False) -> LiveCommand:
    """`command` (or the relay FROM | TO) with a line '<label>: ...' every `every` seconds while it runs.
    own_work: the probe counts the command's own work, so its first reading is no "already there".
    private_dir: the command and the probe share a fresh 0700 folder, $SPARKFOLD_PRIVATE_DIR (removed at the end)."""
    words = [label] + ([command] if command else []) + ["--every", f"{every:g}"]
    if size_of:
        words += ["--size-of", size_of]
    if probe:
        words += ["--probe", probe]
    if total:
        words += ["--total", str(int(total))]
    if latest:
        words += ["--latest", latest]
    if own_work:
        words.append("--own-work")
    if private_dir:
        words.append("--private-dir")
    if relay:
        words += ["--relay", *relay]
    return LiveCommand(heredoc_command(f"{shlex.quote(python)} - {' '.join(shlex.quote(w) for w in words)}",
                                       "progress"))
