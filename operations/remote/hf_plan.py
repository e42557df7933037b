"""Compare a local Hugging Face download with a revision's file list; print one JSON line; always exit 0.

    hf_plan.py --repo ORG/NAME --revision REV (--cache-dir HUB | --local-dir DIR) [--include PATTERN ...]

Output: {"complete": bool, "missing": [[path, size]], "missing_bytes": N, "commit": sha, "total_bytes": N,
"offline": bool, "model_type": str|null, "manifest": bool, "error": str|null}.
A folder whose .sparkfold-complete.json (written by hf_fetch) covers the request and matches the files on disk is
answered offline. Otherwise the Hub is asked (HfApi, or its REST API when huggingface_hub is absent), honouring
HF_ENDPOINT, HF_TOKEN and HF_TOKEN_PATH. missing_bytes counts only what a download still transfers: a blob another
revision already holds costs nothing, and an interrupted .incomplete file only its remainder.
Sent to the head as one script after operations/util/hf_cache.py (see operations/remote/__init__.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same module as below, named so mypy can follow it
    from operations.util.hf_cache import *
if not globals().get("_BUNDLED"):  # run from a checkout: hf_cache lives in ../util
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "util"))
    from hf_cache import *  # noqa: F401,F403


def parse_args(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", default="main")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--cache-dir")
    where.add_argument("--local-dir")
    parser.add_argument("--include", action="append", default=[])
    return parser.parse_args(argv)


def _token():
    token = os.environ.get("HF_TOKEN", "")
    path = os.environ.get("HF_TOKEN_PATH", "")
    if not token and path:
        try:
            with open(path) as f:
                token = f.read().strip()
        except OSError:
            pass
    return token or None


def hub_files(repo, revision, patterns):
    """(commit, [(path, size, etag)]) of the revision's files that match the patterns, from the Hub."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        return _hub_files_rest(repo, revision, patterns)
    info = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).model_info(
        repo, revision=revision, files_metadata=True, token=_token())
    files = []
    for sibling in info.siblings or []:
        if matches(sibling.rfilename, patterns):
            etag = sibling.lfs.sha256 if sibling.lfs else sibling.blob_id
            files.append((sibling.rfilename, sibling.lfs.size if sibling.lfs else sibling.size, etag))
    return info.sha, files


def _hub_files_rest(repo, revision, patterns):
    import urllib.parse
    import urllib.request

    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/api/models/{repo}/revision/{urllib.parse.quote(revision, safe='')}?blobs=true"
    req = urllib.request.Request(url)
    token = _token()
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=30) as response:
        info = json.load(response)
    files = []
    for sibling in info.get("siblings") or []:
        if matches(sibling["rfilename"], patterns):
            lfs = sibling.get("lfs")
            files.append((sibling["rfilename"], lfs["size"] if lfs else sibling.get("size"),
                          lfs["sha256"] if lfs else sibling.get("blobId")))
    return info["sha"], files


def local_folder(args):
    """(folder holding the files, commit known offline or None)."""
    if args.local_dir:
        manifest = read_manifest(args.local_dir)
        return args.local_dir, (manifest or {}).get("commit")
    repo_folder = repo_dir(args.cache_dir, args.repo)
    commit = resolve_revision(repo_folder, args.revision)
    return (os.path.join(repo_folder, "snapshots", commit) if commit else None), commit


def model_type(folder):
    try:
        with open(os.path.join(folder, "config.json")) as f:
            return json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def offline_plan(args):
    """The answer for a complete, manifest-covered folder, or None when the Hub must be asked."""
    folder, commit = local_folder(args)
    if not folder:
        return None
    manifest = read_manifest(folder)
    if (not manifest or not manifest_covers(manifest, args.repo, args.revision, args.include)
            or manifest_missing(folder, manifest)):
        return None
    return {"complete": True, "missing": [], "missing_bytes": 0, "commit": manifest["commit"],
            "total_bytes": sum(manifest["files"].values()), "offline": True, "model_type": model_type(folder),
            "manifest": True, "error": None}


def still_to_fetch(args, commit, files):
    """([[path, size]] not in place, bytes a download still transfers)."""
    missing, need = [], 0
    if args.local_dir:
        folder, partial, blobs = args.local_dir, incomplete_local(args.local_dir), None
    else:
        repo_folder = repo_dir(args.cache_dir, args.repo)
        folder, partial = os.path.join(repo_folder, "snapshots", commit), incomplete_blobs(repo_folder)
        blobs = os.path.join(repo_folder, "blobs")
    for path, size, etag in files:
        try:
            if os.stat(os.path.join(folder, path)).st_size == size:
                continue
        except OSError:
            pass
        missing.append([path, size])
        if blobs and etag:
            try:
                if os.stat(os.path.join(blobs, etag)).st_size == size:
                    continue  # another revision holds this blob: only the symlink is missing
            except OSError:
                pass
        done = partial.get(etag, 0) if blobs else max(partial.get(path, 0), partial.get(f"{path}.{etag}", 0))
        need += max((size or 0) - done, 0)
    return missing, need


def plan(args):
    answer = offline_plan(args)
    if answer:
        return answer
    folder, local_commit = local_folder(args)
    try:
        commit, files = hub_files(args.repo, args.revision, args.include)
    except Exception as e:  # offline, refused (gated/401), unknown revision: report, never fail the fact
        return {"complete": False, "missing": [], "missing_bytes": None, "commit": local_commit, "total_bytes": None,
                "offline": True, "model_type": model_type(folder) if folder else None, "manifest": False,
                "error": f"{type(e).__name__}: {e}"[:400]}
    missing, need = still_to_fetch(args, commit, files)
    folder = args.local_dir or snapshot_dir(args.cache_dir, args.repo, commit)
    return {"complete": not missing and bool(files), "missing": missing, "missing_bytes": need, "commit": commit,
            "total_bytes": sum(f[1] or 0 for f in files), "offline": False, "model_type": model_type(folder),
            "manifest": read_manifest(folder) is not None,
            "error": None if files else f"no file of {args.repo}@{args.revision} matches {args.include}"}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    print(json.dumps(plan(args), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
