"""The head's live NFS export table (the export file itself is read with files.FileText), and the served snapshot as
each side of the share sees it (the head in its cache, the worker through the NFS volume)."""

from __future__ import annotations

import posixpath
import shlex
from typing import TypedDict

from pyinfra.api import FactBase

from operations.facts.files import _nearest_existing


def _unescape(path: str) -> str:
    # exportfs prints unusual characters in paths as octal escapes (a space is \040)
    out, i = "", 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1:i + 4].isdigit() and len(path[i + 1:i + 4]) == 3:
            out += chr(int(path[i + 1:i + 4], 8))
            i += 4
        else:
            out += path[i]
            i += 1
    return out


class ExportDict(TypedDict):
    path: str
    client: str
    options: list[str]


class ExportTable(FactBase[list[ExportDict]]):
    """The live export table from `exportfs -v`, one entry per path and client: what the head serves now.

    exportfs prints `<path>\\t<client>(<opts>)`, or the path alone with the client on the next line
    (indented) when the path is long.
    """

    default = list

    def requires_command(self) -> str:
        return "exportfs"

    def command(self) -> str:
        return "exportfs -v 2>/dev/null || true"

    def process(self, output: list[str]) -> list[ExportDict]:
        table: list[ExportDict] = []
        path = None
        for line in output:
            if not line.strip():
                continue
            if not line[0].isspace():
                words = line.split(None, 1)
                path = _unescape(words[0])
                rest = words[1] if len(words) > 1 else ""
            else:
                rest = line
            rest = rest.strip()
            if path is None or not rest:
                continue
            client, _, opts = rest.partition("(")
            table.append({"path": path, "client": client.strip(),
                          "options": [o for o in opts.rstrip(")").split(",") if o]})
        return table


class SameFilesystem(FactBase[bool | None]):
    """Whether `path` and `other` lie on one file system: the device number (`stat -L -c %d`) of each, or of its
    nearest existing folder (what is made under it later lands there); None when either cannot be read."""

    def command(self, path: str, other: str) -> str:
        device = 'echo "{}=$(stat -L -c %d "$p" 2>/dev/null)"; '
        return _nearest_existing(path) + device.format("path") + _nearest_existing(other) + device.format("other")

    def process(self, output: list[str]) -> bool | None:
        devices = dict(line.strip().partition("=")[::2] for line in output if "=" in line)
        path, other = devices.get("path", ""), devices.get("other", "")
        return path == other if path.isdigit() and other.isdigit() else None


class SnapshotViewDict(TypedDict):
    commit: str  # the folder the served link leads to (snapshots/<commit>), "" when it leads nowhere
    files: dict[str, int]  # name relative to the snapshot -> size in bytes (-1: a link whose blob cannot be reached)
    error: str  # why the view could not be read ("" when it was)


def snapshot_view_script(repo_folder: str, link: str) -> str:
    """Shell printing where `link` (in `repo_folder`) leads as `#COMMIT <target>`, then `name<TAB>size` for each file
    of that snapshot, links followed (a broken one -1), or `#ERROR <why>`."""
    folder, name = shlex.quote(repo_folder), shlex.quote(link)
    return (f"cd {folder} 2>/dev/null || {{ echo '#ERROR no folder {posixpath.basename(repo_folder)}'; exit 0; }}; "
            f"t=$(readlink {name}) || {{ echo '#ERROR no link {link}'; exit 0; }}; echo \"#COMMIT $t\"; "
            f"find -L {name}/ -mindepth 1 \\( -type f -printf '%P\\t%s\\n' \\) -o \\( -type l -printf '%P\\t-1\\n' \\)"
            " 2>/dev/null; true")


class SnapshotView(FactBase[SnapshotViewDict]):
    """The served snapshot of the repo folder `repo_folder` as this Spark sees it in its own file system: where its
    link `link` leads and each file's name and size."""

    @staticmethod
    def default() -> SnapshotViewDict:
        return {"commit": "", "files": {}, "error": "not read"}

    def command(self, repo_folder: str, link: str) -> str:
        return snapshot_view_script(repo_folder, link)

    def process(self, output: list[str]) -> SnapshotViewDict:
        view: SnapshotViewDict = {"commit": "", "files": {}, "error": ""}
        other, status = [], "0"
        for line in output:
            mark, _, rest = line.partition(" ")
            name, tab, size = line.rpartition("\t")
            if mark == "#COMMIT":
                view["commit"] = posixpath.basename(rest.strip().rstrip("/"))
            elif mark == "#ERROR":
                view["error"] = rest.strip()
            elif mark == "#EXIT":
                status = rest.strip()
            elif tab and (size.isdigit() or size == "-1"):
                view["files"][name] = int(size)
            elif line.strip():
                other.append(line.strip())
        if status != "0" and not view["error"]:
            view["error"] = f"exit status {status}: {' '.join(other[-3:]) or 'no message'}"
        return view


VIEW_MOUNT = "/hub"  # where the view's throwaway container mounts the volume


class VolumeSnapshotView(SnapshotView):
    """The same view through docker volume `volume` (the head's hub/ over NFS), mounted read-only in a throwaway
    container of `image` as rank 1 mounts it; `repo_folder` is relative to the volume's root. A mount that fails, or
    an image not here yet, is the error (the image is never pulled)."""

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self, repo_folder: str, link: str, volume: str = "", image: str = "") -> str:
        script = snapshot_view_script(posixpath.join(VIEW_MOUNT, repo_folder), link)
        run = (f"docker run --rm --pull never --network none --mount "
               f"{shlex.quote(f'type=volume,src={volume},dst={VIEW_MOUNT},readonly')} --entrypoint sh "
               f"{shlex.quote(image)} -c {shlex.quote(script)}")
        return f"{{ {run}; echo \"#EXIT $?\"; }} 2>&1"
