"""Facts about files and folders: a small file's text, where a link leads, folder listings and their checks, the API
key file's stat, used and free disk space, and the worker's copy of a folder (read from the head over ssh).

Every command exits 0 and stays cheap: they stat and list, and hash only small files (a SHA256SUMS list).
"""

from __future__ import annotations

import base64
import binascii
import shlex
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from operations.peer_ssh import ssh_prefix
from operations.util import sh

Listing = dict[str, list[int]]  # relative path -> [size, mtime seconds]

_LISTING = "-type f -printf '%P\\t%s\\t%T@\\n'"  # path, size, mtime: what rsync -a keeps


def _parse_listing_line(line: str, files: Listing) -> None:
    parts = line.split("\t")
    if len(parts) == 3 and parts[1].isdigit():
        files[parts[0]] = [int(parts[1]), int(float(parts[2]))]


def _nearest_existing(path: str) -> str:
    # sets $p to the nearest folder that exists: what will be written under `path` lands on its file system
    return f"p={shlex.quote(path)}; while [ ! -e \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname \"$p\"); done; "


def first_line(text: str | None) -> str | None:
    """The first line of a FileText result, stripped (a sidecar, a ref); None stays None."""
    return None if text is None else text.partition("\n")[0].strip()


class FileText(FactBase[str | None]):
    """A small text file's exact content (sidecars, refs, the exports file), or None when it is not a file."""

    def command(self, path: str) -> StringCommand:
        # base64 keeps blank and trailing lines, which pyinfra's line-wise output would lose
        p = QuoteString(path)
        return StringCommand("if [ -f", p, "]; then printf 'present '; base64 -w0", p,
                             "2>/dev/null; echo; else echo absent; fi")

    def process(self, output: list[str]) -> str | None:
        line = output[0] if output else "absent"
        if not line.startswith("present"):
            return None
        try:
            return base64.b64decode(line[len("present"):].strip()).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            return ""


class FileSumDict(TypedDict):
    link: bool  # `path` is a symlink (files.put would replace it, so the put always runs)
    sha1: str | None  # None when unreadable
    mode: int | None  # octal digits as pyinfra writes them (644)
    user: str | None
    group: str | None
    head: str  # the first three lines: where sparkfold's header is


class FileSum(FactBase[FileSumDict | None]):
    """In one round trip, what files.put reads in three (stat, its folder, sha1) and what the owner check reads (the
    first lines); None when `path` is not a file."""

    def command(self, path: str) -> StringCommand:
        p = QuoteString(path)
        return StringCommand("if [ -f", p, "]; then { [ -L", p, "] && echo '#LINK'; };",
                             "echo \"#STAT $(stat -L -c '%a %U %G'", p, "2>/dev/null)\";",
                             "echo \"#SHA1 $(sha1sum <", p, "2>/dev/null | cut -c1-40)\";",
                             "echo \"#HEAD $(head -n 3", p, "2>/dev/null | base64 -w0)\"; fi; true")

    def process(self, output: list[str]) -> FileSumDict | None:
        fields = {line.split(" ", 1)[0]: line.partition(" ")[2].strip() for line in output if line.startswith("#")}
        if "#STAT" not in fields:
            return None
        stat = fields["#STAT"].split()
        sha1 = fields.get("#SHA1", "")
        try:
            head = base64.b64decode(fields.get("#HEAD", "")).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            head = ""
        return {"link": "#LINK" in fields,
                "sha1": sha1 if len(sha1) == 40 and all(c in "0123456789abcdef" for c in sha1) else None,
                "mode": int(stat[0]) if len(stat) == 3 and stat[0].isdigit() else None,
                "user": stat[1] if len(stat) == 3 else None, "group": stat[2] if len(stat) == 3 else None,
                "head": head}


class LinkTarget(FactBase[str | None]):
    """Where a link leads. resolve=False: the link's own target text (`readlink`), None when `path` is not a link.
    resolve=True: the real path with every link resolved (`readlink -e`), None when it or a link target is missing."""

    def command(self, path: str, resolve: bool = False) -> str:
        return f"readlink {'-e ' if resolve else ''}{shlex.quote(path)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        return output[0].strip() or None if output else None


class FolderEntries(FactBase[list[str]]):
    """The names directly in a folder (dot files included), [] when it is absent."""

    default = list

    def command(self, path: str) -> str:
        return f"ls -1A {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line]


class DirFiles(FactBase[Listing]):
    """{relative path: [size, mtime seconds]} of the regular files under a folder ({} when it is absent)."""

    default = dict

    def command(self, path: str) -> str:
        return f"find -H {shlex.quote(path)} {_LISTING} 2>/dev/null || true"

    def process(self, output: list[str]) -> Listing:
        files: Listing = {}
        for line in output:
            _parse_listing_line(line, files)
        return files


class FolderCheckDict(TypedDict):
    files: Listing
    sums_sha: str | None  # sha256 of the list itself
    names: list[str]  # the list's entry names
    marker: str | None  # the marker file's first 200 bytes


class FolderCheck(FactBase[FolderCheckDict | None]):
    """A folder verified against a sha256sum-format list: its files, the list's own sha256 and entry names, and the
    marker file's content; None when the folder is absent. Hashes only the (small) list itself."""

    def command(self, path: str, sums: str, marker: str) -> str:
        q = shlex.quote
        return (f"cd {q(path)} 2>/dev/null || exit 0; echo '#DIR'; "
                f"echo \"#SUMS $(sha256sum {q(sums)} 2>/dev/null | cut -c1-64)\"; "
                f"echo \"#MARKER $(head -c 200 {q(marker)} 2>/dev/null)\"; "
                f"sed -n 's/^[0-9a-f]\\{{64\\}} [ *]/#NAME /p' {q(sums)} 2>/dev/null; "
                f"find -H . {_LISTING} 2>/dev/null || true")

    def process(self, output: list[str]) -> FolderCheckDict | None:
        if "#DIR" not in output:
            return None
        out: FolderCheckDict = {"files": {}, "sums_sha": None, "names": [], "marker": None}
        for line in output:
            if line.startswith("#SUMS "):
                out["sums_sha"] = line[6:].strip() or None
            elif line.startswith("#MARKER "):
                out["marker"] = line[8:].strip() or None
            elif line.startswith("#NAME "):
                out["names"].append(line[6:].removeprefix("./"))
            elif not line.startswith("#"):
                _parse_listing_line(line, out["files"])
        return out


class PeerFolderDict(TypedDict):
    reachable: bool
    files: Listing
    free: int | None  # bytes free where the folder lives (or will)
    link: str | None  # readlink of `link`


class PeerFolder(FactBase[PeerFolderDict]):
    """Run on the head: the worker's copy of a folder, over ssh on the link (`target` = user@worker-link-ip).
    Unreachable (the link not up yet, during --dry on a fresh pair) is an answer, reachable False, not a failure."""

    @staticmethod
    def default() -> PeerFolderDict:
        return {"reachable": False, "files": {}, "free": None, "link": None}

    def requires_command(self, target: str, path: str, link: str = "") -> str:
        return "ssh"

    def command(self, target: str, path: str, link: str = "") -> str:
        remote = (f"find -H {shlex.quote(path)} {_LISTING} 2>/dev/null; {_nearest_existing(path)}"
                  "echo \"#FREE $(df -PB1 \"$p\" | awk 'NR==2{print $4}')\"; ")
        if link:
            remote += f"echo \"#LINK $(readlink {shlex.quote(link)})\"; "
        remote += "echo '#OK'"
        return (f"{ssh_prefix(connect_timeout=5)} {shlex.quote(target)} "
                f"{shlex.quote(remote)} "
                "2>/dev/null || true")

    def process(self, output: list[str]) -> PeerFolderDict:
        out = self.default()
        out["reachable"] = "#OK" in output
        for line in output:
            if line.startswith("#FREE ") and line[6:].strip().isdigit():
                out["free"] = int(line[6:])
            elif line.startswith("#LINK "):
                out["link"] = line[6:].strip() or None
            elif not line.startswith("#"):
                _parse_listing_line(line, out["files"])
        return out


class DiskFreeDict(TypedDict):
    measured: str | None  # the nearest existing folder df was asked about
    device: str  # the file system
    mount: str  # its mount point
    free_bytes: int


class DiskFree(FactBase[DiskFreeDict | None]):
    """Free space for `path`, measured at its nearest existing folder (the path may not exist yet); None when df
    could not read it."""

    def command(self, path: str) -> str:
        return _nearest_existing(path) + "echo \"measured=$p\"; df -P -k \"$p\" 2>/dev/null | tail -n +2 || true"

    def process(self, output: list[str]) -> DiskFreeDict | None:
        measured = None
        for line in output:
            if line.startswith("measured="):
                measured = line[len("measured="):].strip()
                continue
            fields = line.split()
            # POSIX df -P: Filesystem 1024-blocks Used Available Capacity Mounted-on (mount may hold spaces)
            if len(fields) >= 6 and fields[3].isdigit():
                return {"measured": measured, "device": fields[0], "mount": " ".join(fields[5:]),
                        "free_bytes": int(fields[3]) * 1024}
        return None


class PathUsage(FactBase[int]):
    """Bytes already held under `path` (`du -skx`, 0 when it does not exist). Use it on the few folders this project
    fills (the model's cache folder, data_dir); it walks metadata only, no file is read."""

    default = int

    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return f"if [ -e {q} ]; then du -skx {q} 2>/dev/null | tail -n 1 || true; else echo '0 -'; fi"

    def process(self, output: list[str]) -> int:
        for line in reversed(output):
            first = line.split(None, 1)[0] if line.strip() else ""
            if first.isdigit():
                return int(first) * 1024
        return 0


class DiskSpaceDict(TypedDict):
    free: list[DiskFreeDict | None]  # DiskFree of each of `paths`, in order
    held: int  # PathUsage summed over `held`


class DiskSpace(FactBase[DiskSpaceDict]):
    """DiskFree of each of `paths` and the bytes `held` already hold, in one round trip (the preflight's
    question, asked about several folders)."""

    @staticmethod
    def default() -> DiskSpaceDict:
        return {"free": [], "held": 0}

    def command(self, paths: tuple[str, ...], held: tuple[str, ...] = ()) -> str:
        parts = [f"echo '#FREE'; ( {DiskFree().command(p)} )" for p in paths]
        parts += [f"echo '#HELD'; ( {PathUsage().command(p)} )" for p in held]
        return "; ".join(parts) or "true"

    def process(self, output: list[str]) -> DiskSpaceDict:
        sections: list[tuple[str, list[str]]] = []
        for line in output:
            if line in ("#FREE", "#HELD"):
                sections.append((line, []))
            elif sections:
                sections[-1][1].append(line)
        return {"free": [DiskFree().process(lines) for kind, lines in sections if kind == "#FREE"],
                "held": sum(PathUsage().process(lines) for kind, lines in sections if kind == "#HELD")}


class ApiKeyFileDict(TypedDict):
    present: bool  # exists and is not empty
    empty: bool
    mode: str | None  # octal, e.g. "600"
    owner: str | None


class ApiKeyFile(FactBase[ApiKeyFileDict]):
    """Whether the API key file exists, with its mode and owner: stat only, the key is never read."""

    @staticmethod
    def default() -> ApiKeyFileDict:
        return {"present": False, "empty": False, "mode": None, "owner": None}

    def command(self, path: str) -> str:
        p = sh(path)
        return (f"if [ -s {p} ]; then echo \"key $(stat -c '%a %U' {p})\"; "
                f"elif [ -e {p} ]; then echo \"empty $(stat -c '%a %U' {p})\"; else echo missing; fi")

    def process(self, output: list[str]) -> ApiKeyFileDict:
        words = " ".join(output).split()
        if words and words[0] in ("key", "empty") and len(words) >= 3:
            return {"present": words[0] == "key", "empty": words[0] == "empty", "mode": words[1], "owner": words[2]}
        return self.default()
