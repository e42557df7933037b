"""A generation record checked before it is started, as a fresh spec is: pure, records in, problems out.

A record is started as it is written (rollback.py, the automatic rollback of a switch that failed): its image, argv,
options and mounts reach `docker run`. Records live in a root-only folder, but the records an older sparkfold kept in
the ssh user's state_dir were moved there as they were, and a record is data, not code: so it may name only what
rank_spec itself makes (docs/security.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from operations.layout import InContainer as C
from operations.rank.generation import Generation
from operations.rank.spec import ENGINE_COMMANDS, RUN_OPTIONS, ContainerSpec

# where rank_spec mounts things in a rank's container; only the per-image cache is writable
MOUNT_TARGETS = (C.HF, f"{C.HF}/hub", C.KIT, C.ENGRAM, C.RANK_CACHE, C.TOKEN_MAP_DIR, C.CACHE, C.API_KEY_DIR,
                 C.CHAT_TEMPLATE)
WRITABLE_TARGETS = (C.CACHE,)
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_VOLUME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a docker volume name (the worker's NFS volume)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _option_problems(spec: ContainerSpec) -> list[str]:
    found, words = [], list(spec.options)
    while words:
        option = words.pop(0)
        if option not in RUN_OPTIONS:
            found.append(f"the docker run option {option!r} is not one sparkfold gives")
            continue
        pattern = RUN_OPTIONS[option]
        if pattern is None:
            continue
        value = words.pop(0) if words else ""
        if not re.fullmatch(pattern, value):
            found.append(f"{option} {value!r} is not a value sparkfold gives")
        elif option == "--name" and value != spec.name:
            found.append(f"--name {value!r} is not the record's container {spec.name!r}")
    return found


def _mount_problems(spec: ContainerSpec) -> list[str]:
    found = []
    for src, dst, read_only in spec.mounts:
        # an engine without --chat-template reads the template inside the snapshot: rank 0's is mounted there
        template_in_snapshot = dst.startswith(f"{C.HF}/") and dst.endswith("/chat_template.jinja") and ".." not in dst
        if dst not in MOUNT_TARGETS and not template_in_snapshot:
            found.append(f"it mounts {src} at {dst}, where no rank mounts anything")
        elif not read_only and dst not in WRITABLE_TARGETS:
            found.append(f"it mounts {src} writable at {dst}")
        if not (src.startswith("/") or _VOLUME.fullmatch(src)) or "," in src:
            found.append(f"its mount source {src!r} is neither a folder nor a volume name")
    return found


def _image_problem(image: str, engine_image: str, prebuilt_image: str) -> str | None:
    if prebuilt_image and image == prebuilt_image:
        return None
    repo, _, tag = image.rpartition(":")
    if repo == engine_image and "/" not in tag and _TAG.fullmatch(tag):
        return None
    allowed = f"{engine_image}:<tag>" + (f" or {prebuilt_image}" if prebuilt_image else "")
    return f"its image {image!r} is not one sparkfold built or pinned ({allowed})"


def _env_problems(spec: ContainerSpec) -> list[str]:
    """An environment the env file cannot carry (a line break would start a variable of its own)."""
    bad = sorted(key for key, value in spec.env.items() if not _ENV_NAME.fullmatch(key) or "\n" in value
                 or "\r" in value)
    return [f"its environment has names or values no env file can hold: {', '.join(bad)}"] if bad else []


def record_problems(generation: Generation, engine_image: str, prebuilt_image: str,
                    container_names: Sequence[str]) -> list[str]:
    """Why `generation`'s record may not be started, one line per problem ([] when it may). engine_image: the
    repository sparkfold tags its builds in; prebuilt_image: the pinned prebuilt one ("" when none);
    container_names: rank 0's and rank 1's container names (the settings')."""
    found = []
    for rank, spec in enumerate(generation.specs):
        said = [f"rank {rank}: {p}" for p in (
            ([f"its container is {spec.name!r}, not {container_names[rank]!r}"]
             if spec.name != container_names[rank] else [])
            + ([f"it runs {spec.argv[:1]!r}, not the engine"] if spec.argv[:1] not in [[c] for c in ENGINE_COMMANDS]
               else [])
            + [p for p in [_image_problem(spec.image, engine_image, prebuilt_image)] if p]
            + _option_problems(spec) + _mount_problems(spec) + _env_problems(spec))]
        found += said
    return found


def record_refusal(generation: Generation, engine_image: str, prebuilt_image: str,
                   container_names: Sequence[str]) -> str | None:
    """One message naming the record and what is wrong with it, or None when it may be started."""
    problems = record_problems(generation, engine_image, prebuilt_image, container_names)
    if not problems:
        return None
    return (f"the record of generation {generation.id} is refused, nothing of it is started: {'; '.join(problems)}"
            " (a record may hold only what sparkfold itself starts: remove it from the generations folder)")
