"""logs.py: the newest lines of each rank's log, read from this machine through both Sparks' connections.

A rank whose container exists shows `docker logs --tail N --timestamps`; a rank without one shows the newest log
saved when its container was removed (<data_dir>/logs/*-rank<R>*.log.gz). Nothing is changed.
"""

from __future__ import annotations

from typing import Any

from operations.facts.docker import RankLogTail, RankLogTailDict
from operations.settings import Settings


def log_section(rank: int, role: str, host_name: str, container: str, log_dir: str, lines: int,
                tail: RankLogTailDict) -> str:
    """One rank's block: a header naming where the lines come from, then the lines."""
    where = {
        "live": f"live log of {container}",
        "stopped": f"log of the stopped container {container}",
        "saved": f"saved log {tail['path']} (no container {container})",
        "unreachable": "no answer over ssh (pyinfra's message is above)",
    }.get(tail["source"], f"no container {container} and no saved log in {log_dir}")
    header = f"--- rank {rank} ({role} {host_name}): {where}, last {lines} lines ---"
    return "\n".join([header, *tail["lines"]])


def rank_log_text(spark: Any, s: Settings) -> str:
    tail: RankLogTailDict = {"source": "unreachable", "path": "", "lines": []}
    if spark.connected:  # asking a Spark that did not answer would try to connect again
        tail = spark.get_fact(RankLogTail, container=s.container_name, log_dir=s.layout.logs, rank=s.rank,
                              lines=s.log_lines, _ignore_errors=True)
    return log_section(s.rank, s.role, spark.name, s.container_name, s.layout.logs, s.log_lines, tail)
