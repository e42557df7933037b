"""Everything the rank decision reads on one Spark, in one round trip: `RankInputs`.

One shell command prints a section per input (the rank container's inspect, the link record, where the served
snapshot, kit, weight-folder and ABLIT symlinks lead, /dev/infiniband, the engine's capabilities document, who
holds the rank's ports, MemAvailable); each section is parsed by the fact that reads it on its own, so the two
never disagree. The pure pair plan (operations/rank/plan.py) takes this fact of both Sparks.
"""

from __future__ import annotations

import base64
import binascii
import shlex
from typing import Any, TypedDict

from pyinfra.api import FactBase

from operations.facts.docker import EngineCapabilities, RankContainer
from operations.facts.files import LinkTarget
from operations.facts.host import MemInfo
from operations.facts.network import InfinibandDevices, LinkRecord, PortListeners
from operations.rank.inputs import GenerationFilesDict, RankInputsDict  # the shapes, pure for the plan

_MARK = "@@sparkfold-rank-input "


def generation_files_command(folder: str) -> str:
    """Each record as `#FILE name` and its base64 on one line (a record is JSON over many lines), then `#LAST id`
    and the Spark's clock. Read as root (the folder is root's, 0700; the rest of RankInputs runs as the ssh user),
    and never through a symlink."""
    d = shlex.quote(folder)
    script = (f"for f in {d}/*.json; do [ -f \"$f\" ] && [ ! -L \"$f\" ] || continue; echo \"#FILE ${{f##*/}}\"; "
              f"base64 -w0 \"$f\"; echo; done; [ -f {d}/last-good ] && [ ! -L {d}/last-good ] && "
              f"printf '#LAST %s\\n' \"$(head -c 64 {d}/last-good)\"; true")
    q = shlex.quote(script)
    return (f"printf '#NOW %s\\n' \"$(date +%s)\"; if [ \"$(id -u)\" = 0 ]; then sh -c {q}; "
            f"else sudo -n sh -c {q}; fi")


def parse_generation_files(output: list[str]) -> GenerationFilesDict:
    files: dict[str, str] = {}
    last_good, name, now = "", "", 0.0
    for line in output:
        if line.startswith("#FILE "):
            name = line[len("#FILE "):].strip()
        elif line.startswith("#LAST "):
            last_good = line[len("#LAST "):].strip()
        elif line.startswith("#NOW "):
            try:
                now = float(line[len("#NOW "):].strip())
            except ValueError:
                now = 0.0
        elif name:
            try:
                files[name] = base64.b64decode(line.strip(), validate=True).decode("utf-8", "replace")
            except (binascii.Error, ValueError):
                pass  # a record cut short: ignored, as a record that does not parse
            name = ""
    return {"files": files, "last_good": last_good, "now": now}


def _raw(command: Any) -> str:
    return command if isinstance(command, str) else command.get_raw_value()


class RankInputs(FactBase[RankInputsDict]):
    """The rank decision's inputs on this Spark (see the module docstring), read as the ssh user: a held port's
    holder is named by `ss -p` only when it is that user's (the pair step asks again as root when a port is held).
    image="" skips the capabilities (the worker's rank does not read them);
    generations: the folder of the generation records ("" skips them)."""

    def command(self, container: str, link_record: str, served: str, kit: str, rank_link: str, ablit: str = "",
                image: str = "", capabilities_cache: str = "", ports: tuple[int, ...] = (),
                generations: str = "") -> str:
        sections = [
            ("container", f"command -v docker >/dev/null && {{ {_raw(RankContainer().command(container))}; }}"),
            ("link_record", _raw(LinkRecord().command(link_record))),
            ("served", LinkTarget().command(served, resolve=True)),
            ("kit", LinkTarget().command(kit, resolve=True)),
            ("rank_folder", LinkTarget().command(rank_link, resolve=True)),
            ("infiniband", InfinibandDevices().command()),
            ("meminfo", "grep -E '^(MemTotal|MemAvailable):' /proc/meminfo 2>/dev/null"),
        ]
        if ablit:
            sections.append(("ablit", LinkTarget().command(ablit, resolve=True)))
        if image:
            caps = EngineCapabilities().command(image, capabilities_cache)
            sections.append(("capabilities", f"command -v docker >/dev/null && {{ {caps}; }}"))
        if generations:
            sections.append(("generations", generation_files_command(generations)))
        for port in ports:
            sections.append((f"port {int(port)}",
                             f"command -v ss >/dev/null && {{ {_raw(PortListeners().command(port))}; }}"))
        # the marker starts a line of its own even after a file with no newline at its end; each part runs in a
        # subshell, so one that exits early (the capabilities' cache hit) ends only itself
        return "; ".join(f"printf '\\n{_MARK}{name}\\n'; ( {body} )" for name, body in sections) + "; true"

    def process(self, output: list[str]) -> RankInputsDict:
        parts: dict[str, list[str]] = {}
        current: list[str] = []
        for line in output:
            if line.startswith(_MARK):
                current = parts.setdefault(line[len(_MARK):].strip(), [])
            else:
                current.append(line)

        def link(name: str) -> str | None:
            return LinkTarget().process(parts.get(name, []))

        memory = MemInfo().process(parts.get("meminfo", []))
        return {
            "container": RankContainer().process(parts.get("container", [])),
            "link_record": LinkRecord().process(parts.get("link_record", [])),
            "served": link("served"), "kit": link("kit"), "rank_folder": link("rank_folder"), "ablit": link("ablit"),
            "infiniband": InfinibandDevices().process(parts.get("infiniband", [])),
            "capabilities": EngineCapabilities().process(parts.get("capabilities", []))["document"],
            "port_holders": {int(name.split()[1]): PortListeners().process(lines)
                             for name, lines in parts.items() if name.startswith("port ")},
            "mem_available": memory.get("MemAvailable"),
            "generations": parse_generation_files(parts.get("generations", [])),
        }


class VersionsFolderDict(TypedDict):
    real: str  # the folder's real path on the Spark ("" when it does not exist)
    names: list[str]  # the names in it that are not symlinks


class PruneInputsDict(TypedDict):
    images: list[str]  # repo:tag of the engine images sparkfold built here (they carry the build label)
    in_use: list[str]  # the image each container (running or not) was made from
    folders: dict[str, VersionsFolderDict]  # each folder asked for, as given -> where it leads and its entries
    real: dict[str, str]  # each path asked for, as given -> its real path ("" when it does not exist)


def _resolved(tag: str, path: str) -> str:
    """`<tag> <path>`, a tab, and where the path leads with every symlink followed (`readlink -e`: empty if gone)."""
    q = shlex.quote(path)
    return f"printf '%s %s\\t%s\\n' {shlex.quote(tag)} {q} \"$(readlink -e -- {q})\""


class PruneInputs(FactBase[PruneInputsDict]):
    """What a prune of old generations judges on this Spark, in one round trip: sparkfold's engine images (by
    `label`), the images containers use, the real path and entries of each versions folder in `folders` (symlinks
    left out: they are pointers, such as active-rank0 and `current`, never versions), and the real path of each of
    `paths` (the folders recorded generations mount). Resolved here, on the Spark, because a data_dir reached
    through a symlink spells the same folder two ways."""

    @staticmethod
    def default() -> PruneInputsDict:
        return {"images": [], "in_use": [], "folders": {}, "real": {}}

    def command(self, label: str, folders: tuple[str, ...] = (), paths: tuple[str, ...] = ()) -> str:
        docker = (f"docker images --filter {shlex.quote('label=' + label)} --format '#IMAGE {{{{.Repository}}}}:"
                  "{{.Tag}}'; docker ps -a --format '#USED {{.Image}}'")
        listing = "; ".join(f"{_resolved('#FOLDER', folder)}; r=$(readlink -e -- {shlex.quote(folder)}) && "
                            "find \"$r\" -mindepth 1 -maxdepth 1 ! -type l -printf '%f\\n' 2>/dev/null"
                            for folder in folders)
        real = "; ".join(_resolved("#REAL", path) for path in paths)
        return f"{{ command -v docker >/dev/null && {{ {docker}; }}; }} 2>/dev/null; {listing or 'true'}; " \
               f"{real or 'true'}; true"

    def process(self, output: list[str]) -> PruneInputsDict:
        found: PruneInputsDict = {"images": [], "in_use": [], "folders": {}, "real": {}}
        folder = ""
        for line in output:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "#IMAGE" and rest and not rest.endswith(":<none>"):
                found["images"].append(rest)
            elif kind == "#USED" and rest:
                found["in_use"].append(rest)
            elif kind == "#FOLDER":
                folder, _, real = rest.partition("\t")
                found["folders"][folder] = {"real": real, "names": []}
            elif kind == "#REAL":
                path, _, real = rest.partition("\t")
                found["real"][path] = real
                folder = ""
            elif folder and line.strip():
                found["folders"][folder]["names"].append(line.strip())
        return found


class StartReadyDict(TypedDict):
    image: bool  # the image is here
    missing: list[str]  # the folders a start would mount that are not here


class StartReady(FactBase[StartReadyDict]):
    """Whether a recorded rank could start here again without a build or a download: its image and every folder it
    mounts are present."""

    @staticmethod
    def default() -> StartReadyDict:
        return {"image": False, "missing": []}

    def command(self, image: str, paths: tuple[str, ...] = ()) -> str:
        checks = "; ".join(f"[ -e {shlex.quote(p)} ] || echo {shlex.quote('#MISSING ' + p)}" for p in paths)
        return (f"if docker image inspect {shlex.quote(image)} >/dev/null 2>&1; then echo '#IMAGE yes'; "
                f"else echo '#IMAGE no'; fi; {checks or 'true'}")

    def process(self, output: list[str]) -> StartReadyDict:
        return {"image": "#IMAGE yes" in [line.strip() for line in output],
                "missing": [line.strip()[len("#MISSING "):] for line in output if line.startswith("#MISSING ")]}
