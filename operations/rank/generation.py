"""Generations: everything one served pair is made of, recorded once it passed the health wait and the smoke test.

A generation is both ranks' container specs, whole (image, argv, environment, mounts: the weight folders, the kit
version, the snapshot, the chat template's digest), so the pair can be started again exactly as it ran, without the
settings that shaped it. Its id is the digest of the two spec hashes. Each Spark keeps the records in
/var/lib/sparkfold/generations (layout.GENERATIONS_DIR: root's, 0700, records 0600): <id>.json per generation,
`last-good`, the id of the last one that served, and `seq`, the count that orders them (kept on the Spark: two
controllers' clocks may disagree).
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
from operations.rank.spec import ContainerSpec

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
    good_at: float = 0.0  # when it passed the health wait and the smoke test (0: not yet), the controller's clock
    seq: int = 0  # its place among the records of its Spark, counted there when written (0: an older record)

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
        return Generation(data["id"], (specs[0], specs[1]), float(data.get("good_at") or 0), int(data.get("seq") or 0))
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

CLOCK_TOLERANCE_S = 300  # a record dated further than this into its Spark's future is not trusted as good


def _newest_first(generation: Generation) -> tuple[bool, int, float]:
    """The order of the records: by the Spark's own count (seq), the controller's clock (good_at) only among older
    records that have none (two controllers' clocks disagree); one about to be recorded (good_at inf) is newest."""
    return generation.good_at == float("inf"), generation.seq, generation.good_at


@dataclass(frozen=True)
class Records:
    generations: tuple[Generation, ...]  # every readable record, any order
    last_good: str  # the id in `last-good` ("" when none)
    now: float = 0.0  # the Spark's clock when they were read (0: not known, no record is judged future-dated)

    def future_dated(self, generation: Generation) -> bool:
        """Written by a controller whose clock is ahead of this Spark's: not trusted as good (rollback.py would
        otherwise take it for the newest)."""
        return bool(self.now) and generation.good_at != float("inf") and \
            generation.good_at > self.now + CLOCK_TOLERANCE_S

    def get(self, gid: str) -> Generation | None:
        return next((g for g in self.generations if g.id == gid), None)

    def good(self) -> list[Generation]:
        """The generations that served, newest first."""
        return sorted((g for g in self.generations if g.good_at and not self.future_dated(g)), key=_newest_first,
                      reverse=True)

    def previous(self, current: str) -> Generation | None:
        """The newest good generation other than `current` (what rollback.py switches to)."""
        return next((g for g in self.good() if g.id != current), None)


def read_records(files: Mapping[str, str], last_good: str, now: float = 0.0) -> Records:
    """Records from {file name: text} of the generations folder, the text of `last-good` and the Spark's clock."""
    found = [g for name, text in sorted(files.items()) if name.endswith(".json")
             for g in [read_record(text)] if g is not None and name == f"{g.id}.json"]
    return Records(tuple(found), last_good.strip(), now)


def runs_last_good(records: Records, running: str) -> bool:
    """The pair runs (`running`: the generation id both rank containers make, "" when they do not) the generation
    these records name as the last good one. The whole pair, not one rank: a switch that changed only the other
    rank's spec leaves this rank's container as the last good one had it, and its Spark must still record it."""
    last = records.get(records.last_good)
    return bool(running and last and last.good_at and running == last.id)


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
    folders: tuple[str, ...] = ()  # weight folders, kit versions, ABLIT packs (real paths on the Spark)
    images: tuple[str, ...] = ()  # engine images sparkfold built
    refused: str = ""  # why nothing is pruned although something would be ("" when the prune is judged safe)

    def __bool__(self) -> bool:
        return bool(self.records or self.folders or self.images)


# The versions folders a prune lists, by the mount of a rank whose versions they hold.
VERSION_KINDS = {"weights": "weight folder", "kit": "kit version", "ablit": "ABLIT pack"}


def uses(spec: ContainerSpec) -> dict[str, str]:
    """{kind: folder} one rank's spec keeps, as its mounts spell them: its weight folder's parent (the weight
    files' version), its kit version, and its ABLIT pack when it serves one."""
    found = {"weights": posixpath.dirname(_mount(spec, InContainer.RANK_CACHE).rstrip("/")),
             "kit": _mount(spec, InContainer.KIT)}
    hf = _mount(spec, InContainer.HF)
    if hf.startswith("/") and spec.argv[:2] == ["tensorfold-native", "serve"]:
        found["ablit"] = posixpath.join(hf, _snapshot(spec))  # an ABLIT pack is mounted in the cache's place
    return {kind: path for kind, path in found.items() if path}


def prune_paths(records: Records, serving: Generation, rank: int) -> tuple[str, ...]:
    """Every folder a generation recorded here (or the serving one) uses on the Spark of `rank`: the paths the
    prune asks the Spark to resolve, since a mount may be spelled through a symlink the versions folder is not."""
    every = records.generations + (serving,)
    return tuple(sorted({path for g in every for path in uses(g.specs[rank]).values()}))


def _real(path: str, real: Mapping[str, str]) -> str:
    return real.get(path, path)


def prune_plan(records: Records, keep: int, serving: Generation, rank: int,
               folders: Mapping[str, tuple[str, Sequence[str]]], images: Sequence[str], in_use: Sequence[str],
               protected: Sequence[str] = (), real: Mapping[str, str] | None = None) -> Prune:
    """What to remove on the Spark of `rank` once `serving` passed its gate (recorded or about to be: it counts as
    the newest). folders: {kind (VERSION_KINDS): (the versions folder's real path, its entries)}; images: the
    engine images sparkfold built there; in_use: images a container (any) was made from; protected: entry names
    never removed (symlinks such as active-rank0 and `current`); real: {path a spec mounts: its real path on the
    Spark ("" when it is gone)}, so that mounts and entries are compared as the Spark resolves them.

    Safety: when a folder the serving rank mounts is not one of the entries its versions folder lists (a layout
    the prune does not understand), nothing is pruned and `refused` says why."""
    real = real or {}
    others = tuple(g for g in records.generations if g.id != serving.id)
    newest = Generation(serving.id, serving.specs, good_at=float("inf"))
    every = Records(others + (newest,), serving.id)  # by then the last good one
    ids = kept(every, keep, [serving.id])
    candidates = {posixpath.join(parent, name) for parent, names in folders.values() if parent for name in names
                  if name not in protected and not name.startswith("replaced-")}
    # a versions folder that does not exist holds nothing to remove, so it needs no check
    listed = {kind: {posixpath.join(parent, name) for name in names} for kind, (parent, names) in folders.items()
              if parent}
    for kind, path in uses(serving.specs[rank]).items():
        if kind in listed and _real(path, real) not in listed[kind]:
            return Prune(refused=f"the serving rank's {VERSION_KINDS[kind]} {path} (real path "
                                 f"{_real(path, real) or 'none'}) is not among the entries of {folders[kind][0]}, so "
                                 "what is kept cannot be told from what is not: nothing is pruned")
    keep_folders: set[str] = set()
    keep_images: set[str] = set(in_use)
    for generation in every.generations:
        if generation.id in ids:
            keep_folders |= {_real(path, real) for path in uses(generation.specs[rank]).values()}
            keep_images.add(generation.specs[rank].image)
    return Prune(tuple(sorted(g.id for g in others if g.id not in ids)), tuple(sorted(candidates - keep_folders)),
                 tuple(sorted(set(images) - keep_images)))
