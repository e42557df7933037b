"""Pure helpers that read a Hugging Face download on disk (standard library only).

Two layouts:
- the cache (HF_HOME/hub): models--org--name/refs/<rev>, snapshots/<commit>/<path> (symlinks into ../../blobs),
  blobs/<etag> and blobs/<etag>.incomplete while a download runs;
- a local_dir download: real files at <dir>/<path>, partial ones under <dir>/.cache/huggingface/download/ (named
  <path>.incomplete by huggingface_hub before 1.0, <folder>/<hash>.<etag>.<tmp>.incomplete by 2.x).

This module is also sent to the head verbatim, in front of operations/remote/hf_plan.py and hf_fetch.py, so it must
stay standard-library only and free of project imports.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re

MANIFEST_NAME = ".sparkfold-complete.json"  # written by hf_fetch after a verified download
PARTIAL_SUFFIX = ".incomplete"  # huggingface_hub's file while it downloads; a killed download leaves it behind
_COMMIT = re.compile(r"[0-9a-f]{40}")
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git blob id or an LFS sha256


def is_commit(revision: str) -> bool:
    return bool(_COMMIT.fullmatch(revision or ""))


def repo_folder_name(repo: str, repo_type: str = "model") -> str:
    """models--org--name, as huggingface_hub names a repo's cache folder."""
    return "--".join([f"{repo_type}s", *repo.split("/")])


def repo_dir(hub_dir: str, repo: str) -> str:
    return os.path.join(hub_dir, repo_folder_name(repo))


def snapshot_dir(hub_dir: str, repo: str, commit: str) -> str:
    return os.path.join(repo_dir(hub_dir, repo), "snapshots", commit)


def resolve_revision(repo_path: str, revision: str) -> str | None:
    """The commit a revision names in this cache folder, offline; None when the cache cannot say."""
    if is_commit(revision):
        return revision if os.path.isdir(os.path.join(repo_path, "snapshots", revision)) else None
    try:
        with open(os.path.join(repo_path, "refs", revision)) as f:
            commit = f.read().strip()
    except OSError:
        return None
    return commit if is_commit(commit) else None


def list_files(root: str, skip_prefixes: tuple = (".cache/", MANIFEST_NAME)) -> dict:
    """{relative path: size} of every file under root, following symlinks; a dangling symlink has size None."""
    out: dict[str, int | None] = {}
    if not os.path.isdir(root):
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for name in filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if any(rel == p or rel.startswith(p) for p in skip_prefixes):
                continue
            try:
                out[rel] = os.stat(full).st_size
            except OSError:
                out[rel] = None
    return out


def incomplete_blobs(repo_path: str) -> dict:
    """{etag: bytes so far} of the cache folder's interrupted downloads (blobs/<etag>[.<tmp>].incomplete)."""
    blobs = os.path.join(repo_path, "blobs")
    out: dict[str, int] = {}
    try:
        names = os.listdir(blobs)
    except OSError:
        return out
    for name in names:
        if name.endswith(PARTIAL_SUFFIX):
            etag = name.split(".", 1)[0]
            try:
                out[etag] = max(out.get(etag, 0), os.stat(os.path.join(blobs, name)).st_size)
            except OSError:
                pass
    return out


def incomplete_local(local_dir: str) -> dict:
    """{key: bytes so far} of a local_dir download's partial files, keyed by <path> or <path>.<etag> (older
    huggingface_hub) and by the etag in the name (2.x: <folder>/<hash>.<etag>.<tmp>.incomplete)."""
    base = os.path.join(local_dir, ".cache", "huggingface", "download")
    out: dict[str, int] = {}
    for dirpath, _dirs, files in os.walk(base):
        for name in files:
            if name.endswith(PARTIAL_SUFFIX):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, base).replace(os.sep, "/")
                # huggingface_hub names them <path>.incomplete or <path>.<etag>.incomplete
                keys = [rel[: -len(PARTIAL_SUFFIX)]] + [w for w in name.split(".") if _ETAG.fullmatch(w)]
                try:
                    size = os.stat(full).st_size
                except OSError:
                    continue
                for key in keys:
                    out[key] = max(out.get(key, 0), size)
    return out


def matches(path: str, patterns) -> bool:
    """huggingface_hub's allow_patterns rule: fnmatch, and a pattern ending in / means everything under it."""
    if not patterns:
        return True
    for pattern in patterns:
        if pattern.endswith("/"):
            pattern += "*"
        if fnmatch.fnmatch(path, pattern):
            return True
    return False


def read_manifest(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, MANIFEST_NAME)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def manifest_record(repo: str, revision: str, commit: str, patterns, files: dict) -> dict:
    return {"repo": repo, "revision": revision, "commit": commit, "patterns": list(patterns or []) or None,
            "files": dict(sorted(files.items()))}


def manifest_covers(manifest: dict | None, repo: str, revision: str, patterns) -> bool:
    """The manifest was written for this repo, this revision (or its commit) and these patterns (or all files)."""
    if not manifest or manifest.get("repo") != repo:
        return False
    if revision not in (manifest.get("revision"), manifest.get("commit")):
        return False
    recorded = manifest.get("patterns")
    return recorded is None or sorted(recorded) == sorted(patterns or [])


def manifest_missing(folder: str, manifest: dict) -> list:
    """[[path, size]] of the manifest's files that are absent or of another size on disk (stat only, no hashing)."""
    missing = []
    for path, size in sorted(manifest["files"].items()):
        try:
            have = os.stat(os.path.join(folder, path)).st_size
        except OSError:
            have = None
        if have != size:
            missing.append([path, size])
    return missing


def write_manifest(folder: str, record: dict) -> str:
    """Write the manifest atomically (temp file + rename) so a crash never leaves a half one."""
    path = os.path.join(folder, MANIFEST_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path

