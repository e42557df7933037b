"""Download a Hugging Face revision, verify sizes, then write .sparkfold-complete.json.

    hf_fetch.py --repo ORG/NAME --revision REV (--cache-dir HUB | --local-dir DIR) [--include PATTERN ...]
                [--expect-model-type TYPE] [--max-workers N] [--every S]

snapshot_download fetches --max-workers files at once, through hf_xet where the Hub stores a file in Xet (and
HF_XET_HIGH_PERFORMANCE, from the sourced hf-env file, turns its fast mode on); a file it already has is not fetched
again. The token comes from HF_TOKEN or HF_TOKEN_PATH (never an argument), HF_ENDPOINT selects a mirror, and the
timeouts and proxies of the hf-env file are read by huggingface_hub itself. tqdm's carriage-return bars are turned
off; instead one newline-terminated progress line goes to stderr every --every seconds, so pyinfra's -v shows it live.
Exit 1 with a one-line reason on any failure. Sent to the head after hf_cache.py and hf_plan.py.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # before huggingface_hub is imported

if TYPE_CHECKING:  # the same module as below, named so mypy can follow it
    from operations.util.hf_cache import *
if not globals().get("_BUNDLED"):  # run from a checkout
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "util"))
    from hf_cache import *  # noqa: F401,F403
    from hf_plan import _token, model_type, parse_args


def hub_files(repo, revision, patterns):
    """(commit, [(path, size, etag)]) of the revision's files that match the patterns, from the Hub: what the
    download is checked against and its progress counted in."""
    from huggingface_hub import HfApi

    info = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).model_info(
        repo, revision=revision, files_metadata=True, token=_token())
    files = []
    for sibling in info.siblings or []:
        if matches(sibling.rfilename, patterns):
            etag = sibling.lfs.sha256 if sibling.lfs else sibling.blob_id
            files.append((sibling.rfilename, sibling.lfs.size if sibling.lfs else sibling.size, etag))
    return info.sha, files


def still_to_fetch(args, commit, files):
    """([[path, size]] not in place, bytes not yet on disk): stat only, for the progress lines and the final check.
    A file being written counts its partial bytes (huggingface_hub writes <etag>.<tmp>.incomplete beside the blobs,
    or <path>.<tmp>.incomplete under a local_dir's .cache/huggingface/download)."""
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
        keys = (etag,) if blobs else (path, f"{path}.{etag}", etag)
        done = max(partial.get(key, 0) for key in keys)
        need += max((size or 0) - done, 0)
    return missing, need


def fetch_args(argv):
    rest, expect, every = [], None, 30.0
    words = iter(argv)
    for word in words:
        if word == "--expect-model-type":
            expect = next(words)
        elif word == "--every":
            every = float(next(words))
        else:
            rest.append(word)
    return parse_args(rest), expect, every


def _gib(n):
    return f"{(n or 0) / 2**30:.1f} GiB"


def report_progress(args, commit, files, need0, stop, every):
    while not stop.wait(every):
        missing, need = still_to_fetch(args, commit, files)
        done = max(need0 - need, 0)
        pct = 100.0 * done / need0 if need0 else 100.0
        # the runner shows the file count beside its own amounts (model_data.FILES_WHOLE)
        print(f"sparkfold: {args.repo}: {_gib(done)} of {_gib(need0)} fetched ({pct:.0f}%), "
              f"{len(files) - len(missing)} of {len(files)} files whole", file=sys.stderr, flush=True)


def main(argv=None):
    args, expect, every = fetch_args(sys.argv[1:] if argv is None else argv)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        print("sparkfold: this python has no huggingface_hub (pip install huggingface_hub)", file=sys.stderr)
        return 1
    try:
        commit, files = hub_files(args.repo, args.revision, args.include)
    except Exception as e:
        print(f"sparkfold: cannot list {args.repo}@{args.revision}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if not files:
        print(f"sparkfold: no file of {args.repo}@{args.revision} matches {args.include}", file=sys.stderr)
        return 1
    _missing, need0 = still_to_fetch(args, commit, files)
    print(f"sparkfold: fetching {args.repo}@{commit[:12]}: {_gib(need0)} to transfer", file=sys.stderr, flush=True)
    stop = threading.Event()
    watcher = threading.Thread(target=report_progress, args=(args, commit, files, need0, stop, every), daemon=True)
    watcher.start()
    try:
        where = {"local_dir": args.local_dir} if args.local_dir else {"cache_dir": args.cache_dir}
        folder = snapshot_download(args.repo, revision=commit, allow_patterns=args.include or None,
                                   token=_token(), endpoint=os.environ.get("HF_ENDPOINT") or None,
                                   max_workers=args.max_workers, **where)
    except Exception as e:
        print(f"sparkfold: download of {args.repo} stopped ({type(e).__name__}: {e}); re-run to resume",
              file=sys.stderr)
        return 1
    finally:
        stop.set()
    if not args.local_dir:
        # a download by commit writes no ref; keep the asked-for name resolvable offline
        refs = os.path.join(repo_dir(args.cache_dir, args.repo), "refs", args.revision)
        if not is_commit(args.revision):
            os.makedirs(os.path.dirname(refs), exist_ok=True)
            with open(refs, "w") as f:
                f.write(commit)
    missing, _need = still_to_fetch(args, commit, files)
    if missing:
        print(f"sparkfold: after the download {len(missing)} files are missing or short, e.g. {missing[0][0]}",
              file=sys.stderr)
        return 1
    if expect:
        found = model_type(folder)
        if found != expect:
            print(f"sparkfold: {args.repo}@{commit[:12]} config.json model_type is {found!r}, expected {expect!r}: "
                  "check the repo and revision settings", file=sys.stderr)
            return 1
    write_manifest(folder, manifest_record(args.repo, args.revision, commit, args.include,
                                           {path: size for path, size, _e in files}))
    print(f"sparkfold: {args.repo}@{commit[:12]} complete: {len(files)} files, "
          f"{_gib(sum(size or 0 for _p, size, _e in files))}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
