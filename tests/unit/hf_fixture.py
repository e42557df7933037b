"""Build small Hugging Face downloads on local disk, laid out exactly as huggingface_hub lays them out.

cache: <hub>/models--org--name/refs/<revision> (the commit), snapshots/<commit>/<path> as relative symlinks into
../../blobs/<etag>, blobs/<etag>; the etag is the content's sha256 for LFS files (*.safetensors here) and the git
blob sha1 otherwise, as on the Hub.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "model"


def model_files() -> dict:
    """{path: bytes} of the fixture checkpoint (tests/unit/fixtures/model)."""
    return {p.name: p.read_bytes() for p in sorted(FIXTURE.iterdir()) if p.is_file()}


def is_lfs(path: str) -> bool:
    return path.endswith(".safetensors")


def etag(path: str, data: bytes) -> str:
    if is_lfs(path):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def commit_of(files: dict, salt: str = "") -> str:
    h = hashlib.sha1(salt.encode())
    for path in sorted(files):
        h.update(path.encode() + b"\0" + files[path])
    return h.hexdigest()


def siblings(files: dict) -> list:
    """[(path, size, etag)] as hf_plan.hub_files returns them for a revision holding these files."""
    return [(p, len(d), etag(p, d)) for p, d in sorted(files.items())]


def build_cache(hub: Path, repo: str, files: dict, revision: str = "main", commit: str | None = None,
                skip: tuple = (), partial: dict | None = None) -> dict:
    """Write a cache folder; `skip` paths get no blob and no link, `partial` {path: n} leaves n bytes in
    blobs/<etag>.incomplete instead. Returns {"repo_dir", "snapshot", "commit"}."""
    commit = commit or commit_of(files)
    repo_dir = Path(hub) / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    if revision != commit:
        (repo_dir / "refs" / revision).write_text(commit)
    snapshot.mkdir(parents=True, exist_ok=True)
    for path, data in files.items():
        tag = etag(path, data)
        if partial and path in partial:
            (repo_dir / "blobs" / f"{tag}.incomplete").write_bytes(data[: partial[path]])
            continue
        if path in skip:
            continue
        (repo_dir / "blobs" / tag).write_bytes(data)
        link = snapshot / path
        link.parent.mkdir(parents=True, exist_ok=True)
        rel = os.path.relpath(repo_dir / "blobs" / tag, link.parent)
        if not link.is_symlink():
            link.symlink_to(rel)
    return {"repo_dir": repo_dir, "snapshot": snapshot, "commit": commit}


def build_local(folder: Path, files: dict, skip: tuple = (), partial: dict | None = None) -> Path:
    """A local_dir download: real files, partial ones under .cache/huggingface/download/<path>.incomplete."""
    folder = Path(folder)
    for path, data in files.items():
        if partial and path in partial:
            inc = folder / ".cache" / "huggingface" / "download" / f"{path}.incomplete"
            inc.parent.mkdir(parents=True, exist_ok=True)
            inc.write_bytes(data[: partial[path]])
            continue
        if path in skip:
            continue
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return folder
