"""What a Hugging Face download still needs on the head; print one JSON line; always exit 0.

    hf_plan.py --repo ORG/NAME --revision REV (--cache-dir HUB | --local-dir DIR) [--include PATTERN ...]
               [--max-workers N]
    hf_plan.py --offline '[["--repo", "ORG/NAME", ...], ...]'   (a JSON list of the arguments above, per request)

Output: {"complete": bool, "missing": [[path, size]], "missing_bytes": N, "commit": sha, "total_bytes": N,
"offline": bool, "model_type": str|null, "manifest": bool, "error": str|null}.

- A folder whose .sparkfold-complete.json (written by hf_fetch) covers the request and matches the files on disk is
  answered offline, with the standard library only: a converged run asks neither the Hub nor huggingface_hub.
  --offline answers several requests that way in one python, one line each in order (null for one that needs the
  Hub): a converged run reads every download's plan in one round trip.
- Otherwise huggingface_hub plans it: the revision is resolved to its commit, then snapshot_download(dry_run=True)
  says, file by file, whether a download would fetch it and how large it is (a blob another revision already holds
  is not fetched again; a partial file of a killed download is, since huggingface_hub 2 never resumes one). The dry
  run writes nothing: resolving the commit first keeps it from writing a ref, and a local_dir is planned through a
  scratch copy of its listing and bookkeeping (huggingface_hub's dry run writes locks and metadata into the folder
  it is given).
- Without huggingface_hub (a fresh head, before the deploy installs it) or with one that has no dry run, the answer
  says so, and sizes are unknown until the deploy has installed hf_hub_version.
HF_ENDPOINT, HF_TOKEN / HF_TOKEN_PATH and the variables of the hf-env file (timeouts, proxies) are read by
huggingface_hub itself. Sent to the head as one script after operations/util/hf_cache.py
(operations/remote/__init__.py).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same module as below, named so mypy can follow it
    from operations.util.hf_cache import *
if not globals().get("_BUNDLED"):  # run from a checkout: hf_cache lives in ../util
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "util"))
    from hf_cache import *  # noqa: F401,F403

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # before huggingface_hub is imported


def parse_args(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", default="main")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--cache-dir")
    where.add_argument("--local-dir")
    parser.add_argument("--include", action="append", default=[])
    parser.add_argument("--max-workers", type=int, default=8)
    return parser.parse_args(argv)


def _token():
    """HF_TOKEN, else the file HF_TOKEN_PATH names (the deploy's 0600 copy); None lets huggingface_hub look."""
    token = os.environ.get("HF_TOKEN", "")
    path = os.environ.get("HF_TOKEN_PATH", "")
    if not token and path:
        try:
            with open(path) as f:
                token = f.read().strip()
        except OSError:
            pass
    return token or None


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
    """The answer for a complete, manifest-covered folder, or None when huggingface_hub must be asked."""
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


def unknown(args, error):
    """The answer when the Hub or huggingface_hub cannot say: what is known offline, and why no more."""
    folder, commit = local_folder(args)
    return {"complete": False, "missing": [], "missing_bytes": None, "commit": commit, "total_bytes": None,
            "offline": True, "model_type": model_type(folder) if folder else None, "manifest": False,
            "error": error[:400]}


def shadow_local_dir(local_dir, scratch):
    """A stand-in for `local_dir` that huggingface_hub's dry run may write into: a symlink to each file, and a copy
    of huggingface_hub's bookkeeping (.cache/huggingface: per-file metadata, tree listings); its locks and partial
    files are left out. The dry run then sees what it would see in `local_dir`, and `local_dir` stays untouched."""
    shadow = os.path.join(scratch, "local")
    os.makedirs(shadow)
    if not os.path.isdir(local_dir):
        return shadow
    bookkeeping = os.path.join(local_dir, ".cache", "huggingface")
    if os.path.isdir(bookkeeping):
        shutil.copytree(bookkeeping, os.path.join(shadow, ".cache", "huggingface"), symlinks=True,
                        ignore=shutil.ignore_patterns("*.lock", "*" + PARTIAL_SUFFIX))
    for path in list_files(local_dir):
        link = os.path.join(shadow, path)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.abspath(os.path.join(local_dir, path)), link)
    return shadow


def hub_plan(args):
    """huggingface_hub's own plan of the download (see the module's docstring), as the JSON answer."""
    try:
        from huggingface_hub import HfApi, snapshot_download
        from huggingface_hub import __version__ as hub_version
    except ImportError:
        return unknown(args, "huggingface_hub is not installed on the head yet (the deploy installs hf_hub_version "
                             "before it downloads)")
    if "dry_run" not in inspect.signature(snapshot_download).parameters:
        return unknown(args, f"huggingface_hub {hub_version} on the head cannot plan a download (no dry_run): the "
                             "deploy installs hf_hub_version")
    token, endpoint = _token(), os.environ.get("HF_ENDPOINT") or None
    try:
        # by commit, so that the dry run writes no ref (it records a branch's commit even when it only plans)
        commit = args.revision if is_commit(args.revision) else \
            HfApi(endpoint=endpoint).repo_info(args.repo, revision=args.revision, token=token).sha or ""
        if not commit:
            return unknown(args, f"the Hub named no commit for {args.repo}@{args.revision}")
        with tempfile.TemporaryDirectory(prefix="sparkfold-plan-") as scratch:
            where = ({"local_dir": shadow_local_dir(args.local_dir, scratch)} if args.local_dir
                     else {"cache_dir": args.cache_dir})
            infos = snapshot_download(args.repo, revision=commit, allow_patterns=args.include or None, token=token,
                                      endpoint=endpoint, max_workers=args.max_workers, dry_run=True, **where)
    except Exception as e:  # offline, refused (gated/401), unknown revision: report, never fail the fact
        return unknown(args, f"{type(e).__name__}: {e}")
    folder = args.local_dir or snapshot_dir(args.cache_dir, args.repo, commit)
    # not in place: a download fetches it, or links it from a blob or the cache that already holds it (no bytes)
    missing = [i for i in infos if i.will_download or not os.path.exists(os.path.join(folder, i.filename))]
    manifest = read_manifest(folder) or {}
    return {"complete": not missing and bool(infos),
            "missing": sorted([i.filename, i.file_size] for i in missing),
            "missing_bytes": sum(i.file_size or 0 for i in missing if i.will_download), "commit": commit,
            "total_bytes": sum(i.file_size or 0 for i in infos), "offline": False, "model_type": model_type(folder),
            "manifest": bool(manifest) and manifest.get("commit") == commit
            and manifest_covers(manifest, args.repo, args.revision, args.include),
            "error": None if infos else f"no file of {args.repo}@{args.revision} matches {args.include}"}


def plan(args):
    return offline_plan(args) or hub_plan(args)


def offline_answers(requests):
    """--offline: each request's offline answer (a request: the arguments above), or None where the Hub must be
    asked (or the request is not one: argparse says why on stderr)."""
    answers = []
    for words in requests:
        try:
            answers.append(offline_plan(parse_args(words)))
        except (SystemExit, TypeError, OSError, ValueError):
            answers.append(None)
    return answers


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--offline"]:
        for answer in offline_answers(json.loads(argv[1]) if len(argv) > 1 else []):
            print(json.dumps(answer, sort_keys=True))
        return 0
    args = parse_args(argv)
    print(json.dumps(plan(args), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
