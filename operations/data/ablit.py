"""ABLIT: the Keys overlay applied on top of the stock pack, into a separate folder.

<data_dir>/ablit/<commit>-<tag>/ (the tag names the overlay revision and file) holds hard links to the stock
snapshot's files plus the shards the overlay's apply script rewrote. The script runs in the engine image on a
hard-linked copy of the stock snapshot and writes a new folder (new files, renames), so no stock blob is ever
written; the stock snapshot and its manifest stay as they were. ABLIT=0 simply serves the stock snapshot again
(nothing to download). <data_dir>/ablit/current -> <commit>-<tag> is what the launch step serves; the packs it no
longer names are removed after the pair step.
"""

from __future__ import annotations

from shlex import quote

from pyinfra import host
from pyinfra.api import operation

from operations.data.copy import free_bytes, space_problem
from operations.data.hub import checkpoint_plan_args
from operations.data.weights import SOURCE, ablit_tag, commit_symlink, need_commit, pack_name, pack_tag, tool_run
from operations.facts.files import FileText, first_line
from operations.facts.model import AblitShards
from operations.remote.progress_command import progress_command
from operations.util import check_failed
from operations.util.hf_cache import MANIFEST_NAME, repo_folder_name

APPLY_SCRIPT = "apply_mia_exl3_wob.py"


@operation()
def ablit_applied(image_ref: str, plan_args: dict, hf_cache: str, overlay: str, ablit_file: str, ablit_root: str,
                  overlay_revision: str, has_token: bool, every: int):
    """<ablit_root>/<commit>-<pack_tag> is the stock pack with the overlay applied, for this overlay revision and
    file. It is never rebuilt in place: another revision gets another folder. every: seconds between progress lines."""
    if not has_token:
        yield from check_failed("HF_TOKEN", ["ablit needs HF_TOKEN with access to the gated overlay: accept its terms "
                                             "on its Hugging Face page, create a read token, export HF_TOKEN=<token> "
                                             "(or set ablit to false)"])
        return
    commit = yield from need_commit(plan_args, "the ABLIT pack")
    if commit is None:
        return
    name = pack_name(commit, pack_tag(overlay_revision, ablit_file))
    dst = f"{ablit_root}/{name}"
    want = f"{commit} {overlay_revision} {ablit_file}"
    if first_line(host.get_fact(FileText, path=f"{dst}/{SOURCE}")) == want:
        host.noop(f"ABLIT pack {dst} is current")
        return
    snapshot = f"{hf_cache}/hub/{repo_folder_name(plan_args['repo'])}/snapshots/{commit}"
    need = sum(host.get_fact(AblitShards, snapshot=snapshot).values())
    space = space_problem(free_bytes(ablit_root), need, ablit_root, "the ABLIT pack")
    if (yield from check_failed("free disk", [space])):
        return
    staged, out = f"{dst}.src", f"{dst}.out"
    inside = f"/ablit/{name}"
    # the script hard-links what it keeps, so its --src and --dst share one mount: --src is a hard-linked copy of
    # the stock snapshot inside ablit_root (no extra space); the script writes only new files and never its --src
    yield (f"rm -rf {quote(staged)} {quote(out)} && mkdir -p {quote(ablit_root)} && "
           f"cp -rLl {quote(snapshot)}/. {quote(staged)}/ && rm -f {quote(staged)}/{MANIFEST_NAME}")
    # minutes on a real checkpoint: the GiB the script has written so far
    yield progress_command("ABLIT overlay: applying", tool_run(
        image_ref, [(ablit_root, "/ablit", False), (overlay, "/overlay", True)], "python3",
        f"/overlay/{APPLY_SCRIPT}", "--src", f"{inside}.src", "--wo-b", f"/overlay/{ablit_file}",
        "--dst", f"{inside}.out"), size_of=out, own_work=True, every=every)
    # files the script did not write into --dst are the unchanged ones: hard links to the stock files
    yield (f"cp -rln {quote(staged)}/. {quote(out)}/ && rm -rf {quote(staged)} {quote(dst)} && "
           f"mv {quote(out)} {quote(dst)} && printf '%s\\n' {quote(want)} > {quote(dst)}/{SOURCE}")


def deploy_ablit(s, image_ref: str) -> None:
    layout = s.layout
    ablit_applied(name="ABLIT pack (overlay applied)", image_ref=image_ref, plan_args=checkpoint_plan_args(s),
                  hf_cache=s.hf_cache, overlay=layout.overlay, ablit_file=s.ablit_file, ablit_root=layout.ablit,
                  overlay_revision=s.ablit_revision, has_token=bool(s.hf_token), every=s.progress_every_s)
    commit_symlink(name="ABLIT served pack symlink", symlink=layout.ablit_current, plan_args=checkpoint_plan_args(s),
                   template=pack_name("{commit}", ablit_tag(s)))
