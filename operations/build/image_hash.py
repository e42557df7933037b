"""The engine image's content hash (pure: local files and values in, 12 hex out).

The hash covers exactly what can change the image: every file Docker receives as the build context (relative path
and bytes, sorted by path; `.dockerignore` exclusions honoured) and the build arguments (engine refs, base image,
Zig pin). File mtimes, modes and anything outside the context do not count, so only a real edit rebuilds.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path

HASH_LENGTH = 12
HASH_LABEL = "sparkfold.image-hash"  # on every image sparkfold builds: its content hash
# Docker always sends these two, whatever .dockerignore says.
_ALWAYS_SENT = {"Dockerfile", ".dockerignore"}


def build_args(s) -> dict[str, str]:
    """The hashed build arguments, from Settings (IMAGE_HASH is added at build time, never hashed)."""
    return {
        "BASE_IMAGE": str(s.base_image),
        "ZIG_VERSION": str(s.zig_version),
        "ZIG_URL": str(s.zig_url),
        "ZIG_SHA256": str(s.zig_sha256),
        "TF_REPO": str(s.tf_repo),
        "TF_REF": str(s.tf_ref),
        "TOOLS_REF": str(s.tools_ref),
    }


def _pattern_regex(pattern: str) -> re.Pattern:
    # The subset of Docker's .dockerignore syntax the project needs: `*`, `?`, `**`; a match on a directory
    # also matches everything under it. Character classes are taken literally.
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"(?:/.*)?\Z")


def _ignore_rules(context: Path) -> list[tuple[bool, re.Pattern]]:
    path = context / ".dockerignore"
    if not path.is_file():
        return []
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:].strip() if negate else line
        line = line.strip("/")
        if line.startswith("./"):
            line = line[2:]
        if line:
            rules.append((negate, _pattern_regex(line)))
    return rules


def _ignored(rel: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    ignored = False
    for negate, regex in rules:  # the last matching rule wins, as in Docker
        if regex.match(rel):
            ignored = not negate
    return ignored


def context_files(context: str | Path) -> list[str]:
    """Relative POSIX paths of the files Docker sends from `context`, sorted."""
    root = Path(context)
    if not root.is_dir():
        raise FileNotFoundError(f"engine build context {root} is not a directory")
    rules = _ignore_rules(root)
    files = []
    for path in root.rglob("*"):
        if path.is_dir():
            continue
        rel = path.relative_to(root).as_posix()
        if rel in _ALWAYS_SENT or not _ignored(rel, rules):
            files.append(rel)
    return sorted(files)


def image_hash(context: str | Path, args: Mapping[str, str]) -> str:
    """First 12 hex of sha256 over the context's files (path + bytes) and the build arguments."""
    root = Path(context)
    digest = hashlib.sha256()

    def field(tag: bytes, *parts: bytes) -> None:
        # Length-prefixed fields: no two different inputs can produce the same byte stream.
        digest.update(tag)
        for part in parts:
            digest.update(str(len(part)).encode() + b":" + part)

    for rel in context_files(root):
        field(b"F", rel.encode(), (root / rel).read_bytes())
    for name in sorted(args):
        field(b"A", name.encode(), str(args[name]).encode())
    return digest.hexdigest()[:HASH_LENGTH]


def computed_hash(s) -> str:
    """This checkout's image hash for Settings `s` (its build context and build arguments)."""
    return image_hash(s.engine_context_path, build_args(s))


def image_ref(s) -> str:
    """The image both ranks run: the prebuilt reference, or `<engine_image>:<content hash>`."""
    if s.prebuilt_image:
        return s.prebuilt_image
    return f"{s.engine_image}:{computed_hash(s)}"


# The background stream that makes image_ref on a Spark (the build on the head, or the prebuilt pull): what the
# weight files, made with the image's tools, wait for (operations/streams).
IMAGE_STREAM = "image"
