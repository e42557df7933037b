"""The head's data work as background streams (operations/streams), each started as soon as what it reads is whole:
the Engram tables hashed and copied to the worker while the checkpoint downloads, the kit copied once it is checked,
the token map and the weight files written once the checkpoint and the image are there, rank 1's weight file copied
as soon as it is written, and every copy verified on the worker as it lands.

Each stream is started with the operation that converges the same work here (checksums_written, folder_to_peer, the
weights' operations): their facts decide whether there is work, and the stream runs what they yield. When a stream
it reads starts in the same run, nothing can be read yet and the commands built here run instead: the same work as a
fresh start does it, from the same pieces (hashing_command, peer_copy_commands, the weights' commands), with the
markers written on the Spark once the work is done (operations/remote/folder_marker.py), so the next run's facts find
them current.

A copy runs while the head still hashes the folder, so its list (SHA256SUMS) reaches the worker with the check that
follows both: the "checked" stream copies again (only what changed: the list) and verifies on the worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from shlex import quote

from pyinfra.api import operation
from pyinfra.api.operation import OperationMeta

from operations.build.image_hash import IMAGE_STREAM
from operations.data.copy import (
    MARKER,
    SUMS,
    SUMS_STATE,
    check_command,
    checksums_written,
    folder_to_peer,
    hashing_command,
    peer_copy_commands,
    space_check,
)
from operations.data.hub import checkpoint_plan_args
from operations.data.weights import (
    model_source,
    rank_file_commands,
    rank_file_need,
    rank_file_to_peer,
    rank_file_written,
    rank_folder,
    rank_sums_written,
    source_key,
    token_map_command,
    token_map_written,
)
from operations.facts.done import RankFileWhole, TokenMapWhole
from operations.remote import heredoc_command
from operations.remote.stream_runner import step
from operations.streams import Stream, background
from operations.util.checks import failing_shell
from operations.util.peer_ssh import ssh_prefix


def _text(command) -> str:
    return command if isinstance(command, str) else command.get_raw_value()


def on_worker(target: str, command: str) -> str:
    """`command` run on the worker over the head's ssh (its output comes back into the stream's log)."""
    return f"{ssh_prefix()} {quote(target)} {quote(command)}"


def marker_command(folder: str, marker: str, names: Iterable[str] = (), sums: str = "", glob: str = "",
                   check: bool = False, tail: str = "") -> str:
    """Write `marker` in `folder` as the facts expect it (operations/remote/folder_marker.py): over `names` (or the
    files the shell `glob` names in the folder) for a checksum list's state, over `sums`' entries for a check.
    check: only test whether it is current (exit status). tail: shell after the command, on its line."""
    which = ["--sums", quote(sums)] if sums else ["--names", *(quote(n) for n in names), *([glob] if glob else [])]
    which += ["--check"] if check else []
    return heredoc_command(f"( cd {quote(folder)} && python3 - {quote(folder)} {quote(marker)} {' '.join(which)} )",
                           "folder_marker", tail)


def unless(test: str, note: str, commands: list[str]) -> list[str]:
    """`commands`, skipped with `note` when the shell `test` finds the work done where it runs: a stream started
    again after its run was interrupted redoes only what is not whole. One command (a stream's step), each of
    `commands` a step of its own, so a failing one ends the stream."""
    return [_opened_unless(f"if {test}; then echo {quote(note)}; else", commands)]


def _opened_unless(opening: str, commands: list[str]) -> str:
    """`opening` (`if ...; else`, whose last line may open a heredoc), `commands` as steps, then `fi`."""
    return "\n".join([opening, *(step(c) for c in commands), "fi"])


def _current_marker(folder: str, marker: str, note: str, **which) -> str:
    """The opening line of `unless` for a marker: `if <marker check> <<EOF; then echo note; else`, its script after."""
    return "if " + marker_command(folder, marker, check=True, tail=f"; then echo {quote(note)}; else", **which)


def sums_commands(folder: str, what: str, total: int, names: Iterable[str] = (), glob: str = "", *,
                  every: float) -> list[str]:
    """SHA256SUMS of `names` (or of the files `glob` names) in `folder`, hashed with progress lines, then its state
    (what data/copy.checksums_written writes); nothing when its state is current already."""
    names = sorted(names)
    files = " ".join([*(quote(n) for n in names), *([glob] if glob else [])])
    hashing = hashing_command(f"{what}: hashing for {SUMS}", folder, f"sha256sum -- {files} > {SUMS}.tmp", total,
                              every=every)
    return [_opened_unless(_current_marker(folder, SUMS_STATE, f"{what}: {SUMS} is current", names=names, glob=glob),
                           [_text(hashing), f"cd {quote(folder)} && mv {SUMS}.tmp {SUMS}",
                            marker_command(folder, SUMS_STATE, names, glob=glob)])]


def copy_commands(src: str, target: str, dest: str, what: str, total: int, extra_rsync: tuple = (),
                  label: str = "", *, every: float) -> list[str]:
    """The folder src copied into dest on the worker, resumably, with progress lines (data/copy.peer_copy_commands),
    leaving out the files a hashing writes meanwhile (data/copy.IN_PROGRESS: every copy leaves them out)."""
    return [_text(c) for c in peer_copy_commands(src, target, dest, what, total, extra_rsync, label, every=every)]


def verified_on_worker(target: str, folder: str, sums: str, what: str, total: int, *, every: float) -> list[str]:
    """The worker's folder checked against `sums` as data/copy.folder_verified checks a copy there (a file that
    fails is removed, so the next run copies it again), then its marker; nothing when the marker is current."""
    return unless(on_worker(target, marker_command(folder, MARKER, sums=sums, check=True)),
                  f"{what} on the worker: verified already",
                  [on_worker(target, f"rm -f {quote(folder)}/{SUMS}.tmp"),
                   on_worker(target, _text(check_command(folder, sums, what, total, remove_failed=True,
                                                         every=every))),
                   on_worker(target, marker_command(folder, MARKER, sums=sums))])


def reverified_on_worker(target: str, folder: str, sums: str, what: str, total: int, *,
                         every: float) -> list[str]:
    """verify_data: the worker's copy hashed against `sums` whatever its marker says (a file can rot or be rewritten
    in place and keep its size and mtime, which is all the marker and the copy compare). The marker goes first; a
    file that fails is removed, so the copy after this sends it again and the check after that (verified_on_worker)
    proves the repair; the marker is written again only when every file passed."""
    check = check_command(folder, sums, f"{what} (verify_data)", total, remove_failed=True,
                          fix="the files that differ were removed and are copied again now", every=every)
    return [on_worker(target, f"rm -f {quote(folder)}/{MARKER} {quote(folder)}/{SUMS}.tmp"),
            f"if {on_worker(target, _text(check))}; then {on_worker(target, marker_command(folder, MARKER, sums=sums))}"
            f"; else echo {quote(f'sparkfold: {what} on the worker: repairing what differs')}; fi"]


def reverified_here(folder: str, sums: str, what: str, total: int, *, every: float) -> list[str]:
    """verify_data: a folder on this Spark (the head) hashed against `sums` whatever its marker says; a file that
    fails is removed, so the next run downloads or writes it again, and the run stops saying so."""
    fix = "the files that differ were removed: run the deploy again to download or write them again"
    return [f"rm -f {quote(folder)}/{MARKER}", _text(check_command(folder, sums, what, total, True, fix, every=every)),
            marker_command(folder, MARKER, sums=sums)]


@operation()
def verification_asked(commands: tuple):
    """verify_data's work, whatever the markers say: one run asked for it (the stream starts on a converged pair)."""
    yield from commands


def reverify_stream(s, name: str, what: str, folder: str, sums: str, total: int, after: tuple[str, ...],
                    before: tuple[str, ...] = ()) -> None:
    """verify_data: the head's `folder` re-verified in the background (its own progress lines), after the streams
    that write it when they run in this run; before: commands that write the list first."""
    if not s.verify_data:
        return
    commands = (*before, *reverified_here(folder, sums, what, total, every=s.progress_every_s))
    background(Stream(f"{name}-reverify", "hash", f"{what} re-verified on the head", s.layout.streams, after=after,
                      commands=commands),
               name=f"{what[0].upper()}{what[1:]} re-verified on the head (verify_data)",
               work=[(verification_asked, {"commands": commands})])


def rank_file_stream(image_ref: str, rank: int, folder: str, mount: tuple, model: str, total: int,
                     source: str, *, every: float) -> list[str]:
    """A rank's weight file written as data/weights.rank_file_written writes it: nothing when RankFileWhole finds it
    whole, and the same free disk check before anything is cleared or written. total: the pack's bytes."""
    what = f"rank {rank}'s weight file"
    return unless(RankFileWhole.test(folder, rank, source), f"{what} is current",
                  [space_check(folder, rank_file_need(total), what),
                   *rank_file_commands(image_ref, rank, folder, mount, model, int(total / 2), source, every=every)])


def checked_stream(s, name: str, what: str, src: str, dest: str, sums: str, total: int, after: tuple[str, ...],
                   upstream: Iterable[OperationMeta], extra_rsync: tuple = ()) -> OperationMeta:
    """The stream that brings the worker's copy of `src` level with the head's (its list included) and verifies it
    there, once the copy and the list are done; started when either starts in this run. Its copy has lines of its
    own ('<what>: <sums> to the worker: ...'), never the copy's: it sends the list and what changed since, and knows
    no total (the folder may hold more than was planned)."""
    target, every = s.worker_link_ssh, s.progress_every_s
    # verify_data: the worker's copy hashed again first, so that the copy sends what differs
    commands = reverified_on_worker(target, dest, sums, what, total, every=every) if s.verify_data else []
    commands += copy_commands(src, target, dest, what, 0, extra_rsync, label=f"{what}: {sums} to the worker",
                              every=every)
    commands += verified_on_worker(target, dest, sums, what, total, every=every)
    title = f"{what[0].upper()}{what[1:]} " + ("re-verified and repaired on the worker (verify_data)"
                                              if s.verify_data else "verified on the worker (as it lands)")
    return background(Stream(f"{name}-checked", "to worker", f"{what} checked on the worker", s.layout.streams,
                             after=after, commands=tuple(commands)),
                      name=title, upstream=upstream,
                      work=[(verification_asked, {"commands": tuple(commands)})] if s.verify_data else ())


def engram_streams(s, download: OperationMeta, total: int) -> None:
    """The Engram tables, once downloaded: hashed on the head and copied to the worker at the same time, then
    checked there."""
    layout, target, root, what = s.layout, s.worker_link_ssh, s.layout.streams, "the Engram tables"
    files, dest, every = list(s.engram_files), s.worker.layout.engram, s.progress_every_s
    hashed = background(
        Stream("engram-sums", "hash", f"{what}: hashing", root, after=("engram",),
               commands=tuple(sums_commands(layout.engram, what, total, names=files, every=every))),
        name="Engram SHA256SUMS (once)", upstream=[download],
        work=[(checksums_written, {"folder": layout.engram, "files": files, "what": what, "every": every})])
    copied = background(
        Stream("engram-to-worker", "to worker", f"{what} to the worker", root, after=("engram",),
               commands=tuple(copy_commands(layout.engram, target, dest, what, total, every=every))),
        name="Engram tables to the worker", upstream=[download],
        work=[(folder_to_peer, {"src": layout.engram, "target": target, "dest": dest, "what": what,
                                "every": every})])
    checked_stream(s, "engram", what, layout.engram, dest, SUMS, total, ("engram-sums", "engram-to-worker"),
                   [hashed, copied])
    reverify_stream(s, "engram", what, layout.engram, SUMS, total, ("engram", "engram-sums"))


def kit_streams(s, total: int) -> None:
    """The kit, placed and checked on the head before this: copied to the worker, then checked there."""
    layout, target, what = s.layout, s.worker_link_ssh, "the kit"
    copied = background(
        Stream("kit-to-worker", "to worker", f"{what} to the worker", layout.streams),
        name="Kit to the worker",
        work=[(folder_to_peer, {"src": layout.kit, "target": target, "dest": s.worker.layout.kit, "what": what,
                                "every": s.progress_every_s})])
    checked_stream(s, "kit", what, layout.kit, s.worker.layout.kit, "MANIFEST", total, ("kit-to-worker",), [copied])


def weight_streams(s, checkpoint: OperationMeta, plan: Mapping, image_ref: str) -> None:
    """The token map and both weight files, written once the checkpoint and the image are there (rank 1's first, so
    its copy starts sooner); rank 1's hashed and copied to the worker at the same time, then checked there; the
    token map copied. The stock pack only: with ABLIT the weight files follow the overlay in the foreground."""
    layout, root, target, worker = s.layout, s.layout.streams, s.worker_link_ssh, s.worker.layout
    every = s.progress_every_s
    plan_args, commit, total = checkpoint_plan_args(s), plan.get("commit") or "", plan.get("total_bytes") or 0
    unknown = [failing_shell("the weight files", f"the checkpoint {plan_args['repo']}@{plan_args['revision']} named "
                             "no commit when the run began (the Hub did not answer?): rerun the deploy")]
    mount, model = model_source(s.hf_cache, plan_args["repo"], commit)
    waits = (IMAGE_STREAM, "checkpoint")

    def weights(rank: int) -> tuple[str, ...]:
        if not commit:
            return tuple(unknown)
        folder = rank_folder(layout.rank_cache, commit, rank, "")
        return tuple(rank_file_stream(image_ref, rank, folder, mount, model, total, source_key(commit, ""),
                                      every=every))

    written = {"image_ref": image_ref, "plan_args": plan_args, "hf_cache": s.hf_cache, "rank_cache": layout.rank_cache,
               "every": every}
    token_map = background(
        Stream("token-map", "weights", "the token map", root, after=waits,
               commands=tuple(unless(TokenMapWhole.test(layout.token_map_dir, commit), "the token map is current",
                                     [token_map_command(image_ref, s.hf_cache, plan_args["repo"], commit,
                                                        layout.token_map_dir)])) if commit else tuple(unknown)),
        name="Token map (image's make_token_map.py)", upstream=[checkpoint],
        work=[(token_map_written, {"image_ref": image_ref, "plan_args": plan_args, "hf_cache": s.hf_cache,
                                   "out_dir": layout.token_map_dir})])
    rank1 = background(Stream("rank1", "weights", "rank 1's weight file", root, after=(*waits, "token-map"),
                              commands=weights(1)),
                       name="Rank 1's weight file", upstream=[checkpoint],
                       work=[(rank_file_written, dict(written, rank=1))])
    folder, peer_folder = (rank_folder(layout.rank_cache, commit, 1, ""), rank_folder(worker.rank_cache, commit, 1, ""))
    hashed = background(
        Stream("rank1-sums", "hash", "rank 1's weight file: hashing", root, after=("rank1",),
               commands=tuple(sums_commands(folder, "rank 1's weight file", int(total / 2), glob="rank1of2-*.bin",
                                            every=every))),
        name="Rank 1's SHA256SUMS (once)", upstream=[rank1],
        work=[(rank_sums_written, {"plan_args": plan_args, "rank_cache": layout.rank_cache, "rank": 1,
                                   "ablit_tag": "", "every": every})])
    background(Stream("rank0", "weights", "rank 0's weight file", root, after=(*waits, "rank1"), commands=weights(0)),
               name="Rank 0's weight file", upstream=[checkpoint],
               work=[(rank_file_written, dict(written, rank=0))])
    symlink = (f"{ssh_prefix()} {quote(target)} "
               + quote(f"ln -sfn {quote(source_key(commit, '') + '/rank1')} {quote(worker.active_rank_link(1))}"))
    copied = background(
        Stream("rank1-to-worker", "to worker", "rank 1's weight file to the worker", root, after=("rank1",),
               commands=tuple(copy_commands(folder, target, peer_folder, "rank 1's weight file", int(total / 2),
                                            every=every)
                              + [symlink])),
        name="Rank 1's weight file to the worker", upstream=[rank1],
        work=[(rank_file_to_peer, {"plan_args": plan_args, "rank_cache": layout.rank_cache, "rank": 1,
                                   "ablit_tag": "", "target": target, "peer_rank_cache": worker.rank_cache,
                                   "every": every})])
    checked_stream(s, "rank1", "rank 1's weight file", folder, peer_folder, SUMS, int(total / 2),
                   ("rank1-sums", "rank1-to-worker"), [hashed, copied])
    reverify_stream(s, "rank1", "rank 1's weight file", folder, SUMS, int(total / 2), ("rank1", "rank1-sums"))
    background(Stream("token-map-to-worker", "to worker", "the token map to the worker", root, after=("token-map",),
                      commands=tuple(copy_commands(layout.token_map_dir, target, worker.token_map_dir,
                                                   "the token map", 0, every=every))),
               name="Token map to the worker", upstream=[token_map],
               work=[(folder_to_peer, {"src": layout.token_map_dir, "target": target, "dest": worker.token_map_dir,
                                       "what": "the token map", "every": every})])
