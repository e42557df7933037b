"""The token map and each rank's weight file, written on the head with the engine image's own tools.

Both depend on the checkpoint commit, which only the HfPlan fact knows (offline once the snapshot is complete).
The tools run in throwaway containers without network, as the ssh user, with the Hugging Face cache mounted
read-only (snapshots are symlinks into blobs/, so the whole cache is mounted and the snapshot path passed).
Layout: <data_dir>/token-map/dsv41_token_map.json (+ .commit sidecar);
<data_dir>/rank-cache/<commit>[-ablit-<tag>]/rank<R>/rank<R>of2-<hash>.bin (+ .sparkfold-source sidecar);
<data_dir>/rank-cache/active-rank<R> -> <commit>[-ablit-<tag>]/rank<R> (what the launch step mounts). The tag names
the ABLIT overlay's revision and file, so another overlay writes other folders, never the ones a rank mounts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator
from shlex import quote

from pyinfra import host
from pyinfra.api import StringCommand, operation

from operations.data.copy import checksums_written, folder_to_peer, free_bytes, space_problem
from operations.data.hub import checkpoint_plan_args
from operations.facts.done import SOURCE, RankFileWhole, TokenMapWhole
from operations.facts.files import LinkTarget
from operations.facts.model import RankFolder, hf_plan
from operations.layout import TOKEN_MAP_FILE
from operations.remote.progress_command import progress_command
from operations.util import check_failed
from operations.util.hf_cache import repo_folder_name

TOKEN_MAP = TOKEN_MAP_FILE
TOKEN_MAP_TOOL = "/opt/tensorfold/tools/dsv41-zig/inputs/make_token_map.py"
RANK_TOOL = "tf-dsv41-rank-cache"
PENDING = "<checkpoint commit>"  # stands in for the commit in --dry before the checkpoint exists
_TOOL_HF = "/hf"  # the Hugging Face cache inside the tool containers
_TOOL_ABLIT = "/model"


def need_commit(plan_args: dict, what: str) -> Generator[StringCommand, None, str | None]:
    """`commit = yield from need_commit(...)`; return from the operation when it is None (executing, it failed).
    Planning tolerates a checkpoint not fetched yet (the download step comes first): it shows the commit the Hub
    named, or a placeholder; executing requires the complete snapshot."""
    plan = hf_plan(host, **plan_args)
    if plan.get("complete") and plan.get("commit"):
        return plan["commit"]
    if (yield from check_failed(what, [f"the checkpoint {plan_args['repo']}@{plan_args['revision']} is not complete "
                                       "(its download must succeed first)"], settled=False)):
        return None
    return plan.get("commit") or PENDING


def tool_run(image_ref: str, mounts: list, entrypoint: str, *args: str) -> str:
    """docker run of one of the image's tools: no network, our uid (files stay ours), given mounts. --init: the
    tool is not PID 1, so the TERM that docker run passes on when its stream is stopped ends it (PID 1 ignores a
    signal it has no handler for, and would go on writing into the folder the next run starts over)."""
    words = ["docker run --rm --init --network none --user \"$(id -u):$(id -g)\" -e HOME=/tmp"]
    words += [f"-v {quote(src + ':' + dst + (':ro' if ro else ''))}" for src, dst, ro in mounts]
    words += [f"--entrypoint {quote(entrypoint)}", quote(image_ref), *(quote(a) for a in args)]
    return " ".join(words)


def pack_tag(overlay_revision: str, ablit_file: str) -> str:
    """Names what an ABLIT overlay made (its pack, the weight files from it) by the overlay's revision and file."""
    return hashlib.sha256(f"{overlay_revision} {ablit_file}".encode()).hexdigest()[:8]


def pack_name(commit: str, ablit_tag: str) -> str:
    """The applied ABLIT pack's folder under <data_dir>/ablit (commit may be "{commit}", for a symlink template)."""
    return f"{commit}-{ablit_tag}"


def model_source(hf_cache: str, repo: str, commit: str, ablit_dir: str = "", ablit_tag: str = ""):
    """(mount, path inside the tool container) of the pack the weight files are made from."""
    if ablit_dir:
        return (f"{ablit_dir}/{pack_name(commit, ablit_tag)}", _TOOL_ABLIT, True), _TOOL_ABLIT
    return (hf_cache, _TOOL_HF, True), f"{_TOOL_HF}/hub/{repo_folder_name(repo)}/snapshots/{commit}"


def source_key(commit: str, ablit_tag: str) -> str:
    return f"{commit}-ablit-{ablit_tag}" if ablit_tag else commit


@operation()
def token_map_written(image_ref: str, plan_args: dict, hf_cache: str, out_dir: str):
    """dsv41_token_map.json from the checkpoint's tokenizer; rewritten only when the checkpoint commit changed
    (TokenMapWhole: the same test the background stream runs)."""
    commit = yield from need_commit(plan_args, "token map")
    if commit is None:
        return
    if host.get_fact(TokenMapWhole, out_dir=out_dir, commit=commit):
        host.noop(f"token map is current for {commit[:12]}")
        return
    yield token_map_command(image_ref, hf_cache, plan_args["repo"], commit, out_dir)


def token_map_command(image_ref: str, hf_cache: str, repo: str, commit: str, out_dir: str) -> str:
    """Write the token map of `commit`'s tokenizer into out_dir, its sidecar naming the commit last."""
    sidecar = f"{out_dir}/{TOKEN_MAP}.commit"
    mount, model = model_source(hf_cache, repo, commit)
    return (f"mkdir -p {quote(out_dir)} && rm -f {quote(sidecar)} && "
            + tool_run(image_ref, [mount, (out_dir, "/out", False)], "python3", TOKEN_MAP_TOOL, model,
                       f"/out/{TOKEN_MAP}")
            + f" && printf '%s\\n' {quote(commit)} > {quote(sidecar)}")


def rank_folder(rank_cache: str, commit: str, rank: int, ablit_tag: str) -> str:
    return f"{rank_cache}/{source_key(commit, ablit_tag)}/rank{rank}"


@operation()
def rank_file_written(image_ref: str, rank: int, plan_args: dict, hf_cache: str, rank_cache: str,
                      ablit_dir: str = "", ablit_tag: str = "", *, every: int):
    """rank<R>of2-<hash>.bin in its own folder, made from the stock pack or (ablit_dir) the applied overlay pack,
    with a progress line every `every` seconds.

    Complete and current = RankFileWhole (the same test the background stream runs): exactly one rank<R>of2-*.bin,
    no .rank<R>of2.partial, and the sidecar names the source. Anything else (an interrupted run's .partial, a stray
    second file) is cleared and the tool runs again: it refuses a folder that already holds a file for its rank.
    """
    commit = yield from need_commit(plan_args, f"rank {rank}'s weight file")
    if commit is None:
        return
    tag = ablit_tag if ablit_dir else ""
    folder = rank_folder(rank_cache, commit, rank, tag)
    want = source_key(commit, tag)
    if host.get_fact(RankFileWhole, folder=folder, rank=rank, source=want):
        host.noop(f"rank {rank}'s weight file in {folder} is current")
        return
    total = hf_plan(host, **plan_args).get("total_bytes") or 0
    space = space_problem(free_bytes(folder), rank_file_need(total), folder, f"rank {rank}'s weight file")
    if (yield from check_failed("free disk", [space])):
        return
    mount, model = model_source(hf_cache, plan_args["repo"], commit, ablit_dir, tag)
    yield from rank_file_commands(image_ref, rank, folder, mount, model, int(total / 2), want, every=every)


def rank_file_need(total: int) -> int:
    """The free disk a rank's weight file needs: about half the pack (`total` bytes), with a margin."""
    return int(total / 2 * 1.05)


def rank_file_commands(image_ref: str, rank: int, folder: str, mount: tuple, model: str, size: int,
                       source: str, *, every: float) -> list[str]:
    """Write rank<R>of2-*.bin (about `size` bytes) into `folder` from `model`, then its sidecar naming `source`."""
    # a partial or stray file from an interrupted run: clear the folder of this rank's files, then write again
    clear = (f"mkdir -p {quote(folder)} && rm -f {quote(folder)}/rank{rank}of2-*.bin "
             f"{quote(folder)}/.rank{rank}of2.partial "
             f"{quote(folder)}/{SOURCE} {quote(folder)}/SHA256SUMS {quote(folder)}/.sparkfold-sums.state")
    write = tool_run(image_ref, [mount, (folder, "/out", False)], RANK_TOOL, model, "/out", str(rank), "2")
    return [clear,
            progress_command(f"rank {rank}'s weight file", write, size_of=folder, total=size,
                             every=every).get_raw_value(),
            f"printf '%s\\n' {quote(source)} > {quote(folder)}/{SOURCE}"]


@operation()
def commit_symlink(symlink: str, plan_args: dict, template: str):
    """A symlink we own pointing at a commit-named folder: template.format(commit=...), relative to the symlink."""
    commit = yield from need_commit(plan_args, symlink)
    if commit is None:
        return
    target = template.format(commit=commit)
    if host.get_fact(LinkTarget, path=symlink) == target:
        host.noop(f"{symlink} -> {target}")
        return
    yield symlink_command(symlink, target)


def symlink_command(symlink: str, target: str) -> str:
    """`symlink` -> `target`: a new symlink renamed over the old one, so a reader (a rank starting) never finds
    none."""
    return (f"mkdir -p {quote(symlink.rsplit('/', 1)[0])} && ln -sfn {quote(target)} {quote(symlink + '.new-link')} "
            f"&& mv -T {quote(symlink + '.new-link')} {quote(symlink)}")


@operation()
def rank_sums_written(plan_args: dict, rank_cache: str, rank: int, ablit_tag: str, every: int):
    """SHA256SUMS of a rank's weight file, once (the worker checks its copy against it)."""
    commit = yield from need_commit(plan_args, f"rank {rank}'s checksum")
    if commit is None:
        return
    folder = rank_folder(rank_cache, commit, rank, ablit_tag)
    bins = host.get_fact(RankFolder, path=folder)["bins"].get(rank, [])
    yield from checksums_written._inner(folder=folder, files=bins[:1] or [f"rank{rank}of2-<hash>.bin"],
                                        what=f"rank {rank}'s weight file", every=every)


@operation()
def rank_file_to_peer(plan_args: dict, rank_cache: str, rank: int, ablit_tag: str, target: str,
                      peer_rank_cache: str, every: int):
    """The rank's folder (weight file + SHA256SUMS) rsynced to the same layout on the worker, and the worker's
    active-rank symlink pointed at it."""
    commit = yield from need_commit(plan_args, f"rank {rank}'s weight file on the worker")
    if commit is None:
        return
    key = source_key(commit, ablit_tag)
    yield from folder_to_peer._inner(src=rank_folder(rank_cache, commit, rank, ablit_tag), target=target,
                                     dest=rank_folder(peer_rank_cache, commit, rank, ablit_tag),
                                     what=f"rank {rank}'s weight file",
                                     symlink=f"{peer_rank_cache}/active-rank{rank}", symlink_target=f"{key}/rank{rank}",
                                     every=every)


def ablit_tag(s) -> str:
    """The tag of the served ABLIT overlay, "" when ABLIT is off."""
    return pack_tag(s.ablit_revision, s.ablit_file) if s.ablit else ""


def deploy_weights(s, image_ref: str) -> None:
    layout, plan_args = s.layout, checkpoint_plan_args(s)
    ablit_dir = layout.ablit if s.ablit else ""
    tag = ablit_tag(s)
    token_map_written(name="Token map (image's make_token_map.py)", image_ref=image_ref, plan_args=plan_args,
                      hf_cache=s.hf_cache, out_dir=layout.token_map_dir)
    rank_file_written(name="Rank 0's weight file", image_ref=image_ref, rank=0, plan_args=plan_args,
                      hf_cache=s.hf_cache, rank_cache=layout.rank_cache, ablit_dir=ablit_dir, ablit_tag=tag,
                      every=s.progress_every_s)
    rank_file_written(name="Rank 1's weight file", image_ref=image_ref, rank=1, plan_args=plan_args,
                      hf_cache=s.hf_cache, rank_cache=layout.rank_cache, ablit_dir=ablit_dir, ablit_tag=tag,
                      every=s.progress_every_s)
    rank0_symlink(s)
    rank_sums_written(name="Rank 1's SHA256SUMS (once)", plan_args=plan_args, rank_cache=layout.rank_cache, rank=1,
                      ablit_tag=tag, every=s.progress_every_s)


def rank0_symlink(s) -> None:
    """<data_dir>/rank-cache/active-rank0 -> rank 0's weight folder of the served checkpoint (and overlay)."""
    commit_symlink(name="Rank 0's active weight folder", symlink=s.layout.active_rank_link(0),
                   plan_args=checkpoint_plan_args(s), template=source_key("{commit}", ablit_tag(s)) + "/rank0")


SERVED_TEMPLATE = "snapshots/{commit}"  # where the served snapshot's symlink leads, relative to it


def served_symlink(s) -> None:
    commit_symlink(name="Served snapshot symlink", symlink=s.layout.served_link,
                   plan_args=checkpoint_plan_args(s), template=SERVED_TEMPLATE)


def rank1_to_worker(s) -> None:
    rank_file_to_peer(name="Rank 1's weight file to the worker", plan_args=checkpoint_plan_args(s),
                      rank_cache=s.layout.rank_cache, rank=1, ablit_tag=ablit_tag(s), target=s.worker_link_ssh,
                      peer_rank_cache=s.worker.layout.rank_cache, every=s.progress_every_s)
