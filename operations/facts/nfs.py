"""The head's live NFS export table (the export file itself is read with files.FileText)."""

from __future__ import annotations

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
