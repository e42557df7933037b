"""How the head runs its own commands on the worker (listings, the copies' daemon and probe, the image ship and
check): ssh over the link with one set of options, defined here once.

BatchMode: never prompt. accept-new: the worker's link address is new to the head on a first deploy.
ControlMaster/ControlPersist: a run's ssh commands to the worker share one authenticated connection instead of a
new TCP session and key exchange each (~0.3 s apiece). The shared connection belongs to this run alone (its socket
is named by a token of the run), so a later run, perhaps after the link was re-addressed, never rides an old one;
it ends 20 s after its last use, or when the worker stops answering (ServerAlive). The socket lives in the ssh
user's ~/.ssh (%d: their home; private to them); where it cannot be made, ssh connects directly.
"""

from __future__ import annotations

import secrets
import shlex

RUN_TOKEN = secrets.token_hex(4)  # one per pyinfra process: both hosts of a run share it



def mux_socket_prefix(tag: str = "") -> str:
    """The start of the shared connection's socket path (ControlPath; %C, a 40-character digest of the target,
    follows): this run's, or a background stream's own (tag: 8 characters, as long as the run's token; a stream's
    unit ends its master when it stops). The path stays short: a Unix socket path holds 107 bytes, and ssh adds a
    17-character suffix while it makes the socket."""
    return f"%d/.ssh/sparkfold-{tag or RUN_TOKEN}-"


OPTIONS = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
           "-o", "ControlMaster=auto", "-o", f"ControlPath={mux_socket_prefix()}%C",
           "-o", "ControlPersist=20", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")


def ssh_words(connect_timeout: int = 15) -> list[str]:
    """`ssh` and its options, as argv words (the target and the remote command follow)."""
    return ["ssh", *OPTIONS, "-o", f"ConnectTimeout={int(connect_timeout)}"]


def ssh_prefix(connect_timeout: int = 15) -> str:
    """The same as one shell string (rsync's --ssh, a probe)."""
    return shlex.join(ssh_words(connect_timeout))
