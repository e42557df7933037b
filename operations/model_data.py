"""Everything the ranks load, on the head first and then on the worker.

Head: huggingface_hub at hf_hub_version with the token and variables its downloads need, the checkpoint (HF cache),
the Engram tables and the kit (real files under data_dir), the ABLIT overlay (operations/data/ablit.py), the token
map and both ranks' weight files (operations/data/weights.py).
Worker: Engram, kit, token map and rank 1's weight file copied from the head over the link (rsync run on the head),
then verified on the worker against checksum lists; with worker_weights = "copy" the checkpoint too.
The long work runs in the background, each piece as soon as what it reads is whole (operations/streams,
operations/data/background.py): `model_data` starts it, `model_data_checked` follows once it has all finished.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from io import StringIO
from shlex import quote
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, deploy, operation
from pyinfra.facts.files import Sha256File

from operations.build.image_hash import image_ref
from operations.data import ablit, weights
from operations.data import background as background_data
from operations.data.copy import (
    SUMS,
    folder_placed,
    folder_to_peer,
    folder_verified,
    free_bytes,
    gib,
    space_problem,
)
from operations.data.hub import (
    checkpoint_plan_args,
    hub_change,
    hub_current,
    hub_env_name,
    hub_env_text,
    hub_python,
    hub_versions,
    plan_args,
    token_name,
)
from operations.data.verified_record import data_verified_recorded, record_path
from operations.facts.files import FolderCheck
from operations.facts.model import HfHubPython, HfPlanDict, hf_plan, hf_plans_kept
from operations.remote import heredoc_command
from operations.remote.progress_command import progress_command
from operations.settings import Settings
from operations.streams import Stream, background
from operations.util import check_failed, failing_shell
from operations.util.barrier import both_sparks_reached
from operations.util.commands import source_env_file
from operations.util.fact_reuse import fact_until_change
from operations.util.hf_cache import repo_folder_name

MODEL_TYPE = "deepseek_v41"
FILES_WHOLE = r"[0-9]+ of [0-9]+ files whole"  # in hf_fetch's own progress lines (remote/hf_fetch.report_progress)
BLOB_SUMS = ".sparkfold-SHA256SUMS"  # the checkpoint's LFS blobs, for the worker copy's check
KIT_GENERATED_FIX = ("The kit_repo Hugging Face mirror ships them: check kit_repo/kit_revision. Generating them "
                     "instead needs torch and DeepSeek's original checkpoint (kit/tools/make_rope.py, "
                     "kit/tools/make_bias_vl.py), which sparkfold does not do.")


# ---- operations ----

@operation()
def hf_hub_installed(python: str, version: str, venv: str = "", env_file: str = ""):
    """huggingface_hub `version`, with hf_xet, for the python that runs the downloads: the deploy's venv is made,
    or installed into until it has exactly that version (up or down); a python the user gave (hf_python, venv "")
    is checked, never changed. pip gets the proxies of `env_file`."""
    have = _hub_versions(python)
    hub = hub_versions(have)[0]
    if hub_current(have, version, venv):
        host.noop(hub_change(have, version, venv))
        return
    if not venv:
        problem = (f"{python} has huggingface_hub {hub}, not hf_hub_version {version}" if hub
                   else f"{python} cannot import huggingface_hub")
        yield from check_failed("hf_python", [f"{problem}: run `{python} -m pip install "
                                              f"'huggingface_hub[hf_xet]=={version}'`, or set hf_hub_version to the "
                                              "version it has, or set hf_python to \"\" so the deploy keeps its own "
                                              "venv"])
        return
    if have is None:
        yield (f"python3 -m venv {quote(venv)} || {{ " + failing_shell(
            "hf_python", "python3 -m venv failed: install python3-venv (sudo apt-get install -y python3-venv) or set "
            "hf_python") + "; }")
    # == installs, upgrades or downgrades to exactly this release; hf_xet for the Hub's Xet storage
    yield (f"{source_env_file(env_file)}{quote(python)} -m pip install --quiet --disable-pip-version-check "
           f"{quote(f'huggingface_hub[hf_xet]=={version}')}")


@operation()
def private_file(path: str, content: str, what: str):
    """`content` in a 0600 file (uploaded over SFTP, never on a command line; the plan names `what`, never the
    content); no content: the file is removed, so an old one is not used."""
    have = host.get_fact(Sha256File, path=path)
    if not content:
        if have:
            yield f"rm -f {quote(path)}"
        else:
            host.noop(f"no {what}")
        return
    if have == hashlib.sha256(content.encode()).hexdigest():
        host.noop(f"{what} is current")
        return
    parent = path.rsplit("/", 1)[0]
    yield f"mkdir -p {quote(parent)} && install -m 600 /dev/null {quote(path)}"  # 0600 before the secret lands in it
    yield FileUploadCommand(StringIO(content), path)


def fetch_summary(label: str, plan: Mapping[str, Any], repo: str, revision: str, dest: str) -> str:
    """One line for the plan: what is missing and how much it will transfer."""
    if plan.get("complete"):
        return f"{label}: {repo}@{(plan.get('commit') or revision)[:12]} complete, nothing to fetch"
    if plan.get("error"):
        return f"{label}: fetch {repo}@{revision} into {dest} (size unknown: {plan['error'][:120]})"
    missing = plan.get("missing") or []
    return (f"{label}: fetch {len(missing)} files, {gib(plan.get('missing_bytes') or 0)} of {repo}@"
            f"{(plan.get('commit') or revision)[:12]} into {dest}")


@operation()
def hf_snapshot(python: str, repo: str, revision: str, label: str, cache_dir: str = "", local_dir: str = "",
                include: tuple = (), token_path: str = "", endpoint: str = "", env_file: str = "",
                max_workers: int = 8, has_token: bool = False, require_token: bool = False,
                expect_model_type: str = "", *, every: int):
    """A repo revision downloaded completely (cache_dir: the HF cache's hub folder; local_dir: real files), with a
    progress line every `every` seconds.

    The HfPlan fact answers offline for a complete download, so a converged run neither fetches nor asks the Hub.
    """
    if require_token and not has_token:
        yield from check_failed("HF_TOKEN", [f"{label} is gated: set HF_TOKEN before the deploy. 1) open "
                                             f"https://huggingface.co/{repo} and accept its terms, 2) create a read "
                                             "token at https://huggingface.co/settings/tokens, 3) export "
                                             "HF_TOKEN=<token>"])
        return
    args = {"python": python, "repo": repo, "revision": revision, "cache_dir": cache_dir, "local_dir": local_dir,
            "include": tuple(include), "token_path": token_path, "endpoint": endpoint, "env_file": env_file,
            "max_workers": max_workers}
    plan = hf_plan(host, **args)
    dest = local_dir or cache_dir
    if plan.get("complete") and plan.get("manifest"):
        if expect_model_type and plan.get("model_type") != expect_model_type:
            yield from check_failed(label, [f"{repo}@{(plan.get('commit') or revision)[:12]} has config.json "
                                            f"model_type {plan.get('model_type')!r}, not {expect_model_type!r}: check "
                                            "the repo/revision"])
            return
        host.noop(fetch_summary(label, plan, repo, revision, dest))
        return
    space = space_problem(free_bytes(dest), plan.get("missing_bytes") or 0, dest, label)
    if (yield from check_failed("free disk", [space])):
        return
    # its file count as often as our own lines; max_workers files at once
    words = ["--repo", repo, "--revision", revision, "--every", str(every), "--max-workers", str(max_workers)]
    words += ["--cache-dir", cache_dir] if cache_dir else ["--local-dir", local_dir]
    for pattern in include:
        words += ["--include", pattern]
    if expect_model_type:
        words += ["--expect-model-type", expect_model_type]
    env = [f"HF_TOKEN_PATH={quote(token_path)}"] if has_token else []
    env += [f"HF_ENDPOINT={quote(endpoint)}"] if endpoint else []
    fetch = heredoc_command(f"{source_env_file(env_file)}mkdir -p {quote(dest)} && {' '.join(env)} {quote(python)} - "
                            f"{' '.join(quote(w) for w in words)}", "hf_fetch")
    # the download's own folder: local_dir's real files, or the repo's folder (blobs, partials) in the cache
    yield progress_command(f"{label} download", fetch, size_of=local_dir or f"{cache_dir}/{repo_folder_name(repo)}",
                           total=plan.get("total_bytes") or 0, latest=FILES_WHOLE, every=every)


def _plan(args: dict) -> HfPlanDict:
    return hf_plan(host, **args)


def _hub_versions(python: str):
    """Read once for the plan's line and the operation (nothing runs between them)."""
    return fact_until_change(host, HfHubPython, python=python)


# ---- the deploy ----

@deploy("The model data")
def model_data(s: Settings) -> None:
    """The head's long work started in the background (operations/streams, operations/data/background.py), each
    piece as soon as what it reads is whole; the small steps run here. streams_finished awaits it all, then
    model_data_checked."""
    if s.is_head:
        if s.verify_data:
            logger.info("verify_data: both Sparks' data is re-hashed against its sums in this run (in the "
                        "background); what differs is removed and copied again, or downloaded by the next run")
        _head(s, image_ref(s))


@deploy("The model data")
def model_data_checked(s: Settings) -> None:
    """Once the background work is done: what reads the whole checkpoint (the served snapshot, rank 0's weight
    folder, the ABLIT path), then the worker's copies verified (the streams verify them as they land: these find
    them verified, or verify what a resumed run left)."""
    if s.is_head:
        _head_checked(s, image_ref(s))
    both_sparks_reached(name="Model data: the head's downloads and copies are done", step="the head's part")
    if not s.is_head:
        _worker(s)
    if s.verify_data:  # every verification of this Spark passed (a failure stops the run before this)
        data_verified_recorded(name="Data verified in full: time recorded (verify_data)",
                               path=record_path(s.layout.state_dir))


def _downloads(s) -> dict[str, dict]:
    """Each of the head's downloads, by label: its HfPlan arguments (the same for every operation that asks)."""
    layout = s.layout
    found = {"Engram tables": plan_args(s, s.engram_repo, s.engram_revision, local_dir=layout.engram,
                                        include=s.engram_files),
             "Checkpoint": checkpoint_plan_args(s),
             "Kernel kit": plan_args(s, s.kit_repo, s.kit_revision, local_dir=layout.kit_src, include=["kit/*"])}
    if s.ablit:
        found["ABLIT overlay"] = plan_args(s, s.ablit_repo, s.ablit_revision, local_dir=layout.overlay,
                                           include=[s.ablit_file, ablit.APPLY_SCRIPT])
    return found


def _fetch(s, label, downloads: dict[str, dict]):
    """Plan-time summary for the op's name (the --dry table shows it), and the op's arguments."""
    args = downloads[label]
    name = fetch_summary(label, _plan(args), args["repo"], args["revision"], args["local_dir"] or args["cache_dir"])
    return name, dict(args, label=label, has_token=bool(s.hf_token), every=s.progress_every_s)


def _hub_installed(s) -> None:
    """The token and variables first (pip needs the proxies too), then huggingface_hub at hf_hub_version; the plan
    says what changes: "huggingface_hub 2.3.0 → 2.4.0"."""
    layout, python, venv = s.layout, hub_python(s), "" if s.hf_python else s.layout.venv
    private_file(name=token_name(s.hf_token_source), path=layout.hf_token, content=s.hf_token,
                 what="Hugging Face token file")
    private_file(name=hub_env_name(s.hf_env), path=layout.hf_env, content=hub_env_text(s.hf_env),
                 what="huggingface_hub variables file")
    hf_hub_installed(name=hub_change(_hub_versions(python), s.hf_hub_version, venv), python=python,
                     version=s.hf_hub_version, venv=venv, env_file=layout.hf_env)


def _head(s, image_ref: str) -> None:
    layout, root = s.layout, s.layout.streams
    _hub_installed(s)
    downloads = _downloads(s)
    hf_plans_kept(host, list(downloads.values()))  # a converged run: every plan in one round trip

    # the downloads one after the other, each with the whole of the link to the Hub: the Engram tables first, so
    # their copy to the worker runs while the checkpoint downloads
    name, args = _fetch(s, "Engram tables", downloads)
    engram = background(Stream("engram", "download", "the Engram tables download", root),
                        name=name, work=[(hf_snapshot, args)])
    background_data.engram_streams(s, engram, _plan(_plan_args(args)).get("total_bytes") or 0)
    name, args = _fetch(s, "Checkpoint", downloads)
    checkpoint = background(Stream("checkpoint", "download", "the checkpoint download", root, after=("engram",)),
                            name=name,
                            work=[(hf_snapshot, dict(args, expect_model_type=MODEL_TYPE))])
    plan = _plan(_plan_args(args))

    # the kit is small: here, placed and checked before it is copied
    name, args = _fetch(s, "Kernel kit", downloads)
    hf_snapshot(name=name, **args)
    folder_placed(name="Kit at data_dir/kit", src=f"{layout.kit_src}/kit", dest=layout.kit, what="the kit")
    folder_verified(name="Kit matches its MANIFEST (head)", folder=layout.kit, sums="MANIFEST", what="the kit",
                    generated_fix=KIT_GENERATED_FIX, again=s.verify_data, every=s.progress_every_s)
    background_data.kit_streams(s, _plan(_plan_args(args)).get("total_bytes") or 0)

    if not s.ablit:  # with ABLIT the weight files are made from the overlay, after the checkpoint (_head_checked)
        background_data.weight_streams(s, checkpoint, plan, image_ref)
    # verify_data: the checkpoint's blobs are named by their sha256, so their list (the worker copy's, or written
    # here without hashing when there is none: rewriting it would race that copy) is what they are checked against
    blob_list = (f"[ -e {quote(layout.model_folder)}/{BLOB_SUMS} ] || {{ {blob_sums_command(layout.model_folder)}; }}"
                 if s.worker_weights == "copy" else blob_sums_command(layout.model_folder))
    background_data.reverify_stream(s, "checkpoint", "the checkpoint", layout.model_folder, BLOB_SUMS,
                                    plan.get("total_bytes") or 0, ("checkpoint", "blob-list"), before=(blob_list,))
    if s.worker_weights == "copy":
        # the copy carries the served snapshot's symlink: made here, before it, with the blob list
        repo_dir, dest, served = layout.model_folder, s.worker.layout.model_folder, layout.served_link
        listed = (blob_sums_command(repo_dir),
                  weights.symlink_command(served, weights.SERVED_TEMPLATE.format(commit=plan.get("commit"))))
        blobs = background(
            Stream("blob-list", "hash", "the checkpoint's blob list", root, after=("checkpoint",), commands=listed),
            name="Checkpoint blob list (for the worker copy)",
            upstream=[checkpoint],
            work=[(blob_sums_written, {"repo_dir": repo_dir}),
                  (weights.commit_symlink, {"symlink": served, "plan_args": checkpoint_plan_args(s),
                                            "template": weights.SERVED_TEMPLATE})])
        total = plan.get("total_bytes") or 0
        copied = background(
            Stream("checkpoint-to-worker", "to worker", "the checkpoint to the worker", root, after=("blob-list",),
                   commands=tuple(background_data.copy_commands(repo_dir, s.worker_link_ssh, dest, "the checkpoint",
                                                                total, ("--copy-unsafe-links",),
                                                                every=s.progress_every_s))),
            name="Checkpoint to the worker (copy)", upstream=[checkpoint, blobs],
            work=[(folder_to_peer, {"src": repo_dir, "target": s.worker_link_ssh, "dest": dest,
                                    "what": "the checkpoint", "extra_rsync": ("--copy-unsafe-links",),
                                    "every": s.progress_every_s})])
        background_data.checked_stream(s, "checkpoint", "the checkpoint", repo_dir, dest, BLOB_SUMS, total,
                                       ("checkpoint-to-worker",), [copied], ("--copy-unsafe-links",))


def _plan_args(args: dict) -> dict:
    """The HfPlan arguments within hf_snapshot's (_fetch adds the label, whether there is a token and the progress
    interval)."""
    return {k: v for k, v in args.items() if k not in ("label", "has_token", "every")}


def _head_checked(s, image_ref: str) -> None:
    weights.served_symlink(s)
    if s.ablit:
        name, args = _fetch(s, "ABLIT overlay", _downloads(s))
        hf_snapshot(name=name, require_token=True, **args)
        ablit.deploy_ablit(s, image_ref)
        weights.deploy_weights(s, image_ref)
        folder_to_peer(name="Token map to the worker", src=s.layout.token_map_dir, target=s.worker_link_ssh,
                       dest=s.worker.layout.token_map_dir, what="the token map", every=s.progress_every_s)
        weights.rank1_to_worker(s)
    else:
        weights.rank0_symlink(s)


def _worker(s) -> None:
    layout, every = s.layout, s.progress_every_s
    # every folder here is a copy from the head: a file that fails is removed, and the next run copies it again
    folder_verified(name="Engram tables verified (worker)", folder=layout.engram, sums=SUMS,
                    what="the Engram tables", remove_failed=True, every=every)
    folder_verified(name="Kit matches its MANIFEST (worker)", folder=layout.kit, sums="MANIFEST", what="the kit",
                    generated_fix=KIT_GENERATED_FIX, remove_failed=True, every=every)
    folder_verified(name="Rank 1's weight file verified (worker)", folder=layout.active_rank_link(1),
                    sums=SUMS, what="rank 1's weight file", remove_failed=True,
                    again=s.verify_data and s.ablit, every=every)  # with ABLIT no stream re-verifies it
    if s.worker_weights == "copy":
        folder_verified(name="Checkpoint copy verified (worker)", folder=layout.model_folder, sums=BLOB_SUMS,
                        what="the checkpoint copy", remove_failed=True, every=every)


def blob_sums_command(repo_dir: str) -> str:
    """<repo>/.sparkfold-SHA256SUMS: one line per LFS blob, whose name is its sha256."""
    return (f"cd {quote(repo_dir)} && ls blobs | grep -E '^[0-9a-f]{{64}}$' | sed 's|.*|&  blobs/&|' > {BLOB_SUMS}.tmp "
            f"&& mv {BLOB_SUMS}.tmp {BLOB_SUMS}")


@operation()
def blob_sums_written(repo_dir: str):
    """<repo>/.sparkfold-SHA256SUMS lists the cache's LFS blobs, whose names are their sha256: no hashing here,
    and the worker's `sha256sum -c` proves its copy."""
    check = host.get_fact(FolderCheck, path=repo_dir, sums=BLOB_SUMS, marker=BLOB_SUMS)
    blobs = sorted(p for p in (check.get("files", {}) if check else {})
                   if p.startswith("blobs/") and len(p) == 70 and all(c in "0123456789abcdef" for c in p[6:]))
    if check and blobs and sorted(check["names"]) == blobs:
        host.noop(f"{repo_dir}/{BLOB_SUMS} lists all {len(blobs)} blobs")
        return
    if (yield from check_failed("the checkpoint's blob list", [] if blobs else
                                [f"no blobs in {repo_dir}: the checkpoint download must come first"], settled=False)):
        return
    yield blob_sums_command(repo_dir)
