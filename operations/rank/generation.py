"""Generations: everything one served pair is made of, recorded once it passed the health wait and the smoke test.

A generation is both ranks' container specs, whole (image, argv, environment, mounts: the weight folders, the kit
version, the snapshot, the chat template's digest), so the pair can be started again exactly as it ran, without the
settings that shaped it. Its id is the digest of the two spec hashes. Each Spark keeps the records in
<state_dir>/generations (root's): <id>.json per generation and `last-good`, the id of the last one that served.
Pure: records in, verdicts out; the operations read and write them (operations/ranks.py).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from operations.layout import InContainer
from operations.rank.spec import LABEL_HASH, ContainerSpec

RECORD_KIND = "sparkfold-generation"
LAST_GOOD = "last-good"


def generation_id(spec_hashes: Sequence[str]) -> str:
    """The pair's id: 8 hex of both spec hashes, rank 0 first (a running pair's come from its containers' labels)."""
    return hashlib.sha256(" ".join(spec_hashes).encode()).hexdigest()[:8]


def spec_record(spec: ContainerSpec) -> dict[str, Any]:
    return {**asdict(spec), "mounts": [list(m) for m in spec.mounts]}


def spec_from_record(data: Mapping[str, Any]) -> ContainerSpec:
    return ContainerSpec(name=data["name"], image=data["image"], argv=list(data["argv"]), env=dict(data["env"]),
                         mounts=[(str(m[0]), str(m[1]), bool(m[2])) for m in data["mounts"]],
                         options=list(data["options"]), labels=dict(data.get("labels") or {}),
                         inputs=dict(data.get("inputs") or {}))


@dataclass(frozen=True)
class Generation:
    id: str
    specs: tuple[ContainerSpec, ContainerSpec]  # rank 0, rank 1
    good_at: float = 0.0  # when it passed the health wait and the smoke test (0: not yet)

    def record(self) -> dict[str, Any]:
        return {"kind": RECORD_KIND, "id": self.id, "good_at": self.good_at,
                "specs": [spec_record(spec) for spec in self.specs], "parts": parts(self)}


def generation_of(specs: Sequence[ContainerSpec | None]) -> Generation | None:
    """The generation both wanted specs make, or None while one is not known."""
    if len(specs) != 2 or specs[0] is None or specs[1] is None:
        return None
    return Generation(generation_id([specs[0].spec_hash(), specs[1].spec_hash()]), (specs[0], specs[1]))


def read_record(text: str) -> Generation | None:
    """A record file's generation; None for anything else (a half-written or foreign file is ignored)."""
    try:
        data = json.loads(text)
        if data.get("kind") != RECORD_KIND:
            return None
        specs = tuple(spec_from_record(d) for d in data["specs"])
        if len(specs) != 2 or generation_id([spec.spec_hash() for spec in specs]) != data["id"]:
            return None
        return Generation(data["id"], (specs[0], specs[1]), float(data.get("good_at") or 0))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


# --- what a generation is made of, to say what a switch changes -------------------------------------------------

def _mount(spec: ContainerSpec, target: str) -> str:
    return next((src for src, dst, _ro in spec.mounts if dst == target), "")


def _snapshot(spec: ContainerSpec) -> str:
    """The served snapshot's folder name (the checkpoint commit, or the ABLIT pack)."""
    path = spec.argv[2] if spec.argv[:2] == ["tensorfold-native", "serve"] else (spec.argv[1:2] or [""])[0]
    return posixpath.basename(path.rstrip("/"))


def _settings_digest(spec: ContainerSpec) -> str:
    """Everything else in the spec: the flags, environment and options the settings shape."""
    argv = [a for a in spec.argv if a not in (spec.argv[2:3] if spec.argv[:1] == ["tensorfold-native"] else
                                               spec.argv[1:2])]
    body = {"argv": argv, "env": spec.env, "options": spec.options}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


PART_NAMES = {"image": "image", "model": "model revision", "weights": "weight files", "kit": "kit",
              "template": "chat template", "settings": "settings"}


def parts(generation: Generation) -> dict[str, Any]:
    head, worker = generation.specs
    return {"image": head.image, "model": _snapshot(head),
            "weights": [_mount(head, InContainer.RANK_CACHE), _mount(worker, InContainer.RANK_CACHE)],
            "kit": _mount(head, InContainer.KIT), "template": head.inputs.get("chat_template", ""),
            "settings": [_settings_digest(head), _settings_digest(worker)]}


def changes(old: Generation, new: Generation) -> list[str]:
    """What differs between two generations, in words ("image", "model revision", ...)."""
    before, after = parts(old), parts(new)
    return [PART_NAMES[name] for name in PART_NAMES if before[name] != after[name]]


# --- the records on a Spark ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Records:
    generations: tuple[Generation, ...]  # every readable record, any order
    last_good: str  # the id in `last-good` ("" when none)

    def get(self, gid: str) -> Generation | None:
        return next((g for g in self.generations if g.id == gid), None)

    def good(self) -> list[Generation]:
        """The generations that served, newest first."""
        return sorted((g for g in self.generations if g.good_at), key=lambda g: g.good_at, reverse=True)

    def previous(self, current: str) -> Generation | None:
        """The newest good generation other than `current` (what rollback.py switches to)."""
        return next((g for g in self.good() if g.id != current), None)


def read_records(files: Mapping[str, str], last_good: str) -> Records:
    """Records from {file name: text} of the generations folder and the text of `last-good`."""
    found = [g for name, text in sorted(files.items()) if name.endswith(".json")
             for g in [read_record(text)] if g is not None and name == f"{g.id}.json"]
    return Records(tuple(found), last_good.strip())


def runs_last_good(records: Records, container: Mapping[str, Any], rank: int) -> bool:
    """`container` (a rank's inspect) runs rank `rank`'s part of the recorded last good generation (a pair is
    recreated together, so the other rank runs its part too)."""
    last = records.get(records.last_good)
    label = (container.get("labels") or {}).get(LABEL_HASH) if container.get("running") else None
    return bool(last and last.good_at and label == last.specs[rank].spec_hash())


def kept(records: Records, keep: int, also: Sequence[str]) -> set[str]:
    """The ids kept: the newest `keep` good generations, the last good one and `also` (the running one)."""
    ids = {g.id for g in records.good()[:max(keep, 1)]}
    return ids | {records.last_good} - {""} | {gid for gid in also if gid}


@dataclass(frozen=True)
class Switch:
    """A deploy that replaces a serving pair: to the wanted generation (None while a spec is not known: a new image
    not built yet), from the last good one (None on a first deploy, or when the wanted one is the last good one: a
    restart has nothing else to fall back to)."""

    to: Generation | None
    came_from: Generation | None
    changed: tuple[str, ...]
    first: bool  # no generation was ever recorded on this pair

    @property
    def to_name(self) -> str:
        return self.to.id if self.to else "a new one (its id is known once the steps before it have run)"

    def line(self) -> str:
        if self.came_from is not None:
            return (f"generation {self.came_from.id} → {self.to_name}: {', '.join(self.changed) or 'the same parts'}"
                    f"; rollback to {self.came_from.id} if the new pair fails")
        if self.first:
            return (f"generation {self.to_name}: the first on this pair, so there is nothing to roll back to if it "
                    "fails")
        return f"generation {self.to_name} starts again (the last good one: nothing else to roll back to)"


def _partial_changes(previous: Generation, specs: Sequence[ContainerSpec | None], image: str) -> list[str]:
    """What is known to differ while a spec is not known yet: the image, and the parts of the spec that is."""
    known = [spec for spec in specs if spec is not None]
    found = ["image"] if previous.specs[0].image != image else []
    for spec in known:
        rank = int(spec.labels.get("sparkfold.rank", "0"))
        old = previous.specs[rank]
        if _mount(old, InContainer.RANK_CACHE) != _mount(spec, InContainer.RANK_CACHE):
            found.append("weight files")
        if _settings_digest(old) != _settings_digest(spec):
            found.append("settings")
    return list(dict.fromkeys(found))


def switch_of(specs: Sequence[ContainerSpec | None], image: str, records: Records) -> Switch:
    """The switch a recreated pair makes, from the wanted specs (either may be unknown yet) and the records."""
    wanted = generation_of(specs)
    previous = records.get(records.last_good)
    if previous is None:
        return Switch(wanted, None, (), first=True)
    if wanted is not None and previous.id == wanted.id:
        return Switch(wanted, None, (), first=False)
    changed = changes(previous, wanted) if wanted is not None else _partial_changes(previous, specs, image)
    return Switch(wanted, previous, tuple(changed), first=False)


# --- what a switch that passed may remove ------------------------------------------------------------------------

@dataclass(frozen=True)
class Prune:
    """What the generations no longer kept leave behind on one Spark (never what a kept one uses)."""

    records: tuple[str, ...] = ()  # record files (ids) of generations no longer kept
    folders: tuple[str, ...] = ()  # weight folders, kit versions, ABLIT packs
    images: tuple[str, ...] = ()  # engine images sparkfold built

    def __bool__(self) -> bool:
        return bool(self.records or self.folders or self.images)


def _uses(spec: ContainerSpec) -> tuple[set[str], set[str]]:
    """(folders, images) one rank's spec keeps: its weight folder's parent, its kit version, its ABLIT pack."""
    folders = {posixpath.dirname(_mount(spec, InContainer.RANK_CACHE).rstrip("/")), _mount(spec, InContainer.KIT)}
    hf = _mount(spec, InContainer.HF)
    if hf.startswith("/") and spec.argv[:2] == ["tensorfold-native", "serve"]:
        folders.add(posixpath.join(hf, _snapshot(spec)))  # an ABLIT pack is mounted in the cache's place
    return folders - {""}, {spec.image}


def prune_plan(records: Records, keep: int, serving: Generation, rank: int, folders: Mapping[str, Sequence[str]],
               images: Sequence[str], in_use: Sequence[str], protected: Sequence[str] = ()) -> Prune:
    """What to remove on the Spark of `rank` once `serving` passed its gate (recorded or about to be: it counts as
    the newest). folders: {versions folder: its entries} (rank-cache, kit.d, ablit); images: the engine images
    sparkfold built there; in_use: images a container (any) was made from; protected: entry names never removed
    (symlinks such as active-rank0 and `current`)."""
    others = tuple(g for g in records.generations if g.id != serving.id)
    newest = Generation(serving.id, serving.specs, good_at=float("inf"))
    every = Records(others + (newest,), serving.id)  # by then the last good one
    ids = kept(every, keep, [serving.id])
    keep_folders: set[str] = set()
    keep_images: set[str] = set(in_use)
    for generation in every.generations:
        if generation.id in ids:
            used_folders, used_images = _uses(generation.specs[rank])
            keep_folders |= used_folders
            keep_images |= used_images
    old_folders = sorted(posixpath.join(parent, name) for parent, names in folders.items() for name in names
                         if name not in protected and not name.startswith("replaced-")
                         and posixpath.join(parent, name) not in keep_folders)
    return Prune(tuple(sorted(g.id for g in others if g.id not in ids)), tuple(old_folders),
                 tuple(sorted(set(images) - keep_images)))
