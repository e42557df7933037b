"""The shapes of what the pair plan reads from one Spark, as plain data: `RankInputsDict` and its parts.

They live here, not beside the facts that fill them (operations/facts/rank.py, operations/facts/docker.py), so the
pure plan (plan.py) names them without importing pyinfra; pyproject.toml's import contract keeps it that way.
"""

from __future__ import annotations

from typing import Any, TypedDict


class RankContainerDict(TypedDict, total=False):
    exists: bool
    running: bool
    status: str
    exit_code: int
    oom_killed: bool
    labels: dict[str, str]
    image: str
    created: str
    started_at: str  # State.StartedAt (RFC 3339); docker's zero time when it never started
    finished_at: str  # State.FinishedAt
    ports: list[int]  # what it was started to listen on (listening_ports)
    args: list[str]  # its command line after the entrypoint (status.py reads rank 0's key and --host from it)


class RankInputsDict(TypedDict):
    container: RankContainerDict  # {} when there is no container of that name (or no docker yet)
    link_record: dict[str, Any] | None  # the link step's record of the rails
    served: str | None  # real path of the served-snapshot symlink in this Spark's Hugging Face cache
    kit: str | None  # real path of <data_dir>/kit
    rank_folder: str | None  # real path of this rank's active-rank symlink (its weight folder)
    ablit: str | None  # real path of <data_dir>/ablit/current, when asked for
    infiniband: bool  # /dev/infiniband exists
    capabilities: dict[str, Any]  # the image's `capabilities --json` ({} when no image was given or it is absent)
    port_holders: dict[int, list[str]]  # port -> who listens there ([] free)
    mem_available: int | None  # MemAvailable in bytes
    generations: GenerationFilesDict  # the generation records kept on this Spark


class GenerationFilesDict(TypedDict):
    files: dict[str, str]  # file name -> text, of layout.GENERATIONS_DIR/*.json
    last_good: str  # the text of its last-good ("" when absent)
    now: float  # the Spark's clock when read (0: not known), to refuse a record dated in its future
