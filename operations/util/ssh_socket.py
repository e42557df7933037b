"""pyinfra's ssh connection, tuned for many short commands.

paramiko leaves Nagle's algorithm on. pyinfra runs each command in a new channel, and closing one channel then
opening the next are two small writes: the second waits for the first's ACK, which the Spark delays by up to 40 ms.
That wait was most of every command's cost (49 ms of a 54 ms `true` on the simulated pair, 4 ms without it).
SSH writes whole packets, so sending each at once costs nothing in throughput.
"""

from __future__ import annotations

import socket
from typing import Any


def send_without_delay(spark: Any) -> bool:
    """Turn Nagle off on the ssh socket of `spark` (a pyinfra Host); False when it has none (another connector, or
    ssh over a ProxyCommand)."""
    client = getattr(spark.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return True
