"""Facts about files and folders: one regular file (its text, its sum and header, the API key file's stat: one
family, RegularFileFact), where a symlink leads, folder listings and their checks, used and free disk space, and the
worker's copy of a folder (read from the head over ssh).

Every command exits 0 and stays cheap: they stat and list, and hash only small files (a SHA256SUMS list).
"""

from __future__ import annotations

import base64
import binascii
import shlex
from typing import ClassVar, TypedDict, TypeVar

from pyinfra.api import FactBase

from operations.util import sh
from operations.util.listing import LISTING_FIND as _LISTING
from operations.util.listing import Listing
from operations.util.listing import parse_listing_line as _parse_listing_line
from operations.util.peer_ssh import ssh_prefix

T = TypeVar("T")


def _nearest_existing(path: str) -> str:
    # sets $p to the nearest folder that exists: what will be written under `path` lands on its file system
    return f"p={shlex.quote(path)}; while [ ! -e \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname \"$p\"); done; "


def first_line(text: str | None) -> str | None:
    """The first line of a FileText result, stripped (a sidecar, a ref); None stays None."""
    return None if text is None else text.partition("\n")[0].strip()


# What a RegularFileFact may read of the file besides its stat, each printed as one '#TAG value' line ({path}: the
# quoted path).
_FILE_PARTS = {
    "link": "[ -L {path} ] && echo '#LINK';",  # is it a symlink: files.put replaces one, so the caller must know
    "sha1": "echo \"#SHA1 $(sha1sum < {path} 2>/dev/null | cut -c1-40)\";",
    "head": "echo \"#HEAD $(head -n 3 {path} 2>/dev/null | base64 -w0)\";",  # where sparkfold's header is
    "text": "echo \"#TEXT $(base64 -w0 {path} 2>/dev/null)\";",  # base64 keeps blank and trailing lines
    "sha256": "echo \"#SHA256 $(sha256sum < {path} 2>/dev/null | cut -c1-64)\";",
}


class FileStat(TypedDict):
    mode: str  # octal digits, e.g. "644"
    user: str
    group: str
    size: int


class RegularFileFact(FactBase[T]):
    """The family of facts about one regular file at `path` (symlinks followed), each one round trip: its stat and the
    `parts` (of _FILE_PARTS) a subclass asks for, which `found` turns into the subclass's answer; default() when
    `path` is not a regular file. Like pyinfra's File family, the subclasses differ only in what they read."""

    parts: ClassVar[tuple[str, ...]] = ()

    def command(self, path: str) -> str:
        quoted = sh(path)
        asked = " ".join(_FILE_PARTS[part].format(path=quoted) for part in self.parts)
        return (f"if [ -f {quoted} ]; then echo \"#FILE $(stat -L -c '%a %U %G %s' {quoted} 2>/dev/null)\"; "
                f"{asked} fi; true")

    def process(self, output: list[str]) -> T:
        fields = {line.partition(" ")[0]: line.partition(" ")[2].strip() for line in output if line.startswith("#")}
        if "#FILE" not in fields:
            return self.default()
        words = fields["#FILE"].split()
        stat: FileStat | None = None
        if len(words) == 4 and words[0].isdigit() and words[3].isdigit():
            stat = {"mode": words[0], "user": words[1], "group": words[2], "size": int(words[3])}
        return self.found(stat, fields)

    def found(self, stat: FileStat | None, fields: dict[str, str]) -> T:
        """The answer for a regular file: `stat` None when unreadable, `fields` the '#TAG' lines' values."""
        raise NotImplementedError


def _base64_text(encoded: str) -> str:
    try:
        return base64.b64decode(encoded).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""


class FileText(RegularFileFact[str | None]):
    """A small text file's exact content (sidecars, refs, the exports file), or None when it is not a file."""

    parts = ("text",)

    def found(self, stat: FileStat | None, fields: dict[str, str]) -> str | None:
        return _base64_text(fields.get("#TEXT", ""))


class FileSumDict(TypedDict):
    link: bool  # `path` is a symlink (files.put would replace it, so the put always runs)
    sha1: str | None  # None when unreadable
    mode: int | None  # octal digits as pyinfra writes them (644)
    user: str | None
    group: str | None
    head: str  # the first three lines: where sparkfold's header is


class FileSum(RegularFileFact[FileSumDict | None]):
    """In one round trip, what files.put reads in three (stat, its folder, sha1) and what the owner check reads (the
    first lines); None when `path` is not a file."""

    parts = ("link", "sha1", "head")

    def found(self, stat: FileStat | None, fields: dict[str, str]) -> FileSumDict | None:
        sha1 = fields.get("#SHA1", "")
        return {"link": "#LINK" in fields,
                "sha1": sha1 if len(sha1) == 40 and all(c in "0123456789abcdef" for c in sha1) else None,
                "mode": int(stat["mode"]) if stat else None,
                "user": stat["user"] if stat else None, "group": stat["group"] if stat else None,
                "head": _base64_text(fields.get("#HEAD", ""))}


class ApiKeyFileDict(TypedDict):
    present: bool  # exists and is not empty
    empty: bool
    mode: str | None  # octal, e.g. "600"
    owner: str | None


class ApiKeyFile(RegularFileFact[ApiKeyFileDict]):
    """Whether the API key file exists, with its mode and owner: stat only (no parts), the key is never read."""

    @staticmethod
    def default() -> ApiKeyFileDict:
        return {"present": False, "empty": False, "mode": None, "owner": None}

    def found(self, stat: FileStat | None, fields: dict[str, str]) -> ApiKeyFileDict:
        if stat is None:
            return self.default()  # unreadable: as if missing (the new key's write is guarded by `[ -s ]`)
        return {"present": stat["size"] > 0, "empty": stat["size"] == 0, "mode": stat["mode"], "owner": stat["user"]}


class ApiKeyFileSumDict(ApiKeyFileDict):
    sha256: str | None  # of the file's bytes; None when missing or unreadable


class ApiKeyFileSum(RegularFileFact[ApiKeyFileSumDict]):
    """ApiKeyFile and the file's sha256, for a key the user brings (api_key_file): whether the head holds that key,
    without the key leaving the file."""

    parts = ("sha256",)

    @staticmethod
    def default() -> ApiKeyFileSumDict:
        return {"present": False, "empty": False, "mode": None, "owner": None, "sha256": None}

    def found(self, stat: FileStat | None, fields: dict[str, str]) -> ApiKeyFileSumDict:
        digest = fields.get("#SHA256", "")
        base = ApiKeyFile().found(stat, fields)
        return {**base, "sha256": digest if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
                else None}


class LinkTarget(FactBase[str | None]):
    """Where a symlink leads. resolve=False: the symlink's own target text (`readlink`), None when `path` is not a
    symlink. resolve=True: the real path with every symlink resolved (`readlink -e`), None when it or a symlink's
    target is missing."""

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
        return (f"cd {shlex.quote(path)} 2>/dev/null || exit 0; echo '#DIR'; "
                f"echo \"#SUMS $(sha256sum {shlex.quote(sums)} 2>/dev/null | cut -c1-64)\"; "
                f"echo \"#MARKER $(head -c 200 {shlex.quote(marker)} 2>/dev/null)\"; "
                f"sed -n 's/^[0-9a-f]\\{{64\\}} [ *]/#NAME /p' {shlex.quote(sums)} 2>/dev/null; "
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
    link: str | None  # readlink of the symlink `link` (None when not asked, absent or no symlink)


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
        quoted = shlex.quote(path)
        return f"if [ -e {quoted} ]; then du -skx {quoted} 2>/dev/null | tail -n 1 || true; else echo '0 -'; fi"

    def process(self, output: list[str]) -> int:
        for line in reversed(output):
            first = line.split(None, 1)[0] if line.strip() else ""
            if first.isdigit():
                return int(first) * 1024
        return 0


class ResolvedPaths(FactBase[dict[str, str]]):
    """{path: where it leads} for each of `paths`, every symlink followed (`realpath -m`: a part that does not exist
    yet is taken as it is written, so a folder not made yet resolves through its parents). Read as the ssh user; a
    path that cannot be resolved is left out. Paths hold no tab or newline (the settings refuse them)."""

    default = dict

    def command(self, paths: tuple[str, ...] = ()) -> str:
        each = ("for p in \"$@\"; do if r=$(realpath -m -- \"$p\" 2>/dev/null); then "
                "printf '%s\\t%s\\n' \"$p\" \"$r\"; fi; done")
        return f"sh -c {shlex.quote(each)} sh {' '.join(shlex.quote(p) for p in paths)}"

    def process(self, output: list[str]) -> dict[str, str]:
        found = {}
        for line in output:
            path, tab, real = line.partition("\t")
            if tab and real.startswith("/"):
                found[path] = real
        return found


class DiskSpaceDict(TypedDict):
    free: list[DiskFreeDict | None]  # DiskFree of each of `paths`, in order
    held: int  # PathUsage summed over `held`
    real: dict[str, str]  # ResolvedPaths of `resolve`


class DiskSpace(FactBase[DiskSpaceDict]):
    """DiskFree of each of `paths`, the bytes `held` already hold and where each of `resolve` leads (ResolvedPaths),
    in one round trip: the preflight's questions about the folders, asked of each Spark once (paths_placed and
    disk_free share the answer)."""

    @staticmethod
    def default() -> DiskSpaceDict:
        return {"free": [], "held": 0, "real": {}}

    def command(self, paths: tuple[str, ...], held: tuple[str, ...] = (), resolve: tuple[str, ...] = ()) -> str:
        parts = [f"echo '#FREE'; ( {DiskFree().command(p)} )" for p in paths]
        parts += [f"echo '#HELD'; ( {PathUsage().command(p)} )" for p in held]
        parts += [f"echo '#REAL'; {ResolvedPaths().command(resolve)}"] if resolve else []
        return "; ".join(parts) or "true"

    def process(self, output: list[str]) -> DiskSpaceDict:
        sections: list[tuple[str, list[str]]] = []
        for line in output:
            if line in ("#FREE", "#HELD", "#REAL"):
                sections.append((line, []))
            elif sections:
                sections[-1][1].append(line)
        def each(tag: str) -> list[list[str]]:
            return [lines for kind, lines in sections if kind == tag]
        return {"free": [DiskFree().process(lines) for lines in each("#FREE")],
                "held": sum(PathUsage().process(lines) for lines in each("#HELD")),
                "real": ResolvedPaths().process([line for lines in each("#REAL") for line in lines])}


class FolderSizes(FactBase[dict[str, int]]):
    """{path: bytes on disk} of each folder in `paths` that exists (`du -sb`, links not followed)."""

    default = dict

    def command(self, paths: tuple[str, ...] = ()) -> str:
        return f"du -sb {' '.join(shlex.quote(p) for p in paths)} 2>/dev/null; true" if paths else "true"

    def process(self, output: list[str]) -> dict[str, int]:
        sizes = {}
        for line in output:
            size, _, path = line.partition("\t")
            if size.isdigit() and path:
                sizes[path] = int(size)
        return sizes


class FolderStateDict(TypedDict):
    kind: str  # "folder" (or a symlink to one), "other" (a file, a dangling symlink...), "missing"
    user: str
    mode: str  # the permission digits, as stat prints them (755, 2775)


class FolderStates(FactBase[dict[str, FolderStateDict]]):
    """{path: kind, owner and mode} of each of `paths` in one round trip; a symlink to a folder is judged by the
    folder (data_dir moved to a larger disk). Paths hold no spaces (the settings refuse them)."""

    default = dict

    def command(self, paths: tuple[str, ...] = ()) -> str:
        each = ("for p in \"$@\"; do if [ -d \"$p\" ]; then "
                "printf '#FOLDER %s %s\\n' \"$(stat -L -c '%U %a' \"$p\")\" \"$p\"; "
                "elif [ -e \"$p\" ] || [ -L \"$p\" ]; then echo \"#OTHER - - $p\"; "
                "else echo \"#MISSING - - $p\"; fi; done")
        return f"sh -c {shlex.quote(each)} sh {' '.join(shlex.quote(p) for p in paths)}"

    def process(self, output: list[str]) -> dict[str, FolderStateDict]:
        found: dict[str, FolderStateDict] = {}
        for line in output:
            words = line.strip().split(" ", 3)
            if len(words) == 4 and words[0] in ("#FOLDER", "#OTHER", "#MISSING"):
                kind = {"#FOLDER": "folder", "#OTHER": "other"}.get(words[0], "missing")
                found[words[3]] = {"kind": kind, "user": words[1], "mode": words[2]}
        return found
