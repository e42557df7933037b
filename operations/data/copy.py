"""Big folders kept whole and checked once: checksum lists, verification markers, head-to-worker copies, symlinks.

Hashing hundreds of GB happens in operations, once: a small state file or marker records the sizes and mtimes (and
the list's own sha256) it was computed for, and the facts compare only those cheap values.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from shlex import quote

from pyinfra import host
from pyinfra.api import StringCommand, operation

from operations.facts.files import DirFiles, DiskFree, FolderCheck, LinkTarget, PeerFolder
from operations.remote import heredoc_command
from operations.remote.link_copy import PARTIAL_DIR
from operations.remote.progress import PRIVATE_DIR_ENV
from operations.remote.progress_command import LiveCommand, progress_command
from operations.util import check_failed
from operations.util.checks import failing_shell, warned
from operations.util.hf_cache import PARTIAL_SUFFIX
from operations.util.listing import listing_digest
from operations.util.peer_ssh import ssh_prefix

MARKER = ".sparkfold-verified"
SUMS = "SHA256SUMS"  # the list a folder's files are checked against
SUMS_STATE = ".sparkfold-sums.state"
# written beside a folder's files while a hashing or a marker is under way, renamed when done: a copy running at the
# same time must not send them (they vanish mid-copy)
IN_PROGRESS = (f"{SUMS}.tmp", f"{SUMS_STATE}.tmp", f"{MARKER}.tmp", f"{SUMS_STATE}.tmp.*", f"{MARKER}.tmp.*")
# never copied to the worker: huggingface_hub's local_dir metadata, the head's own verification, partial downloads,
# the parts of an interrupted copy, files being written
COPY_EXCLUDES = ("/.cache/", MARKER, f"*{PARTIAL_SUFFIX}", f"{PARTIAL_DIR}/", *IN_PROGRESS)
SSH = ssh_prefix()  # the head's ssh to the worker (operations/util/peer_ssh.py)
_KIT_GENERATED = re.compile(r"rope-[^/]*\.f32|vision/gate_bias_vl\.safetensors")


def gib(n) -> str:
    if n is None:
        return "?"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"


def is_bookkeeping(path: str) -> bool:
    """huggingface_hub's local_dir metadata, its partial downloads (a killed download leaves blobs/<etag>.<tmp>
    .incomplete behind in a cache folder, which rsync never copies: see COPY_EXCLUDES), our own markers and an
    interrupted copy's parts: never compared."""
    name = path.rsplit("/", 1)[-1]
    return (path.startswith(".cache/") or name.startswith(".sparkfold-") or name.endswith(PARTIAL_SUFFIX)
            or f"/{PARTIAL_DIR}/" in f"/{path}")


def space_problem(free, need: int, where: str, what: str) -> str | None:
    if free is None or need <= 0 or free >= need:
        return None
    return _space_message(what, gib(need), where, gib(free), gib(need - free))


def _space_message(what: str, need: str, where: str, have: str, short: str) -> str:
    return (f"{what} needs {need} free under {where}, which has {have}: free {short} "
            "there or point data_dir/hf_cache at a larger disk")


# gib() in awk, for a shell that measures free disk where it runs: $1 bytes
_GIB_SH = ("gib() { awk -v n=\"$1\" 'BEGIN { if (n >= 2^30 / 10) printf \"%.1f GiB\", n / 2^30; "
           "else printf \"%.1f MiB\", n / 2^20 }'; }; ")


def space_check(where: str, need: int, what: str) -> str:
    """Shell for work that starts where the run cannot see it (a background stream): the check of space_problem
    ("free disk", its message and fix) on free disk measured as DiskFree measures it when this runs; passes when df
    cannot tell, as space_problem does."""
    if need <= 0:
        return "true"
    marks = ("@HAVE@", "@SHORT@")
    first, rest = failing_shell("free disk", _space_message(what, gib(need), where, *marks)).split(marks[0])
    middle, last = rest.split(marks[1])
    # the fields of df -P as DiskFree reads them: the 4th is the free 1024-blocks
    free_kb = "awk 'NF >= 6 && $4 ~ /^[0-9]+$/ { print $4; exit }'"
    return (f"{_GIB_SH}kb=$( ( {DiskFree().command(where)} ) | {free_kb} ); "
            f"if [ -n \"$kb\" ] && [ $((kb * 1024)) -lt {int(need)} ]; then "
            f"have=$(gib $((kb * 1024))); short=$(gib $(({int(need)} - kb * 1024))); "
            f"{first}'\"$have\"'{middle}'\"$short\"'{last}; fi")


def kit_generated(name: str) -> bool:
    return bool(_KIT_GENERATED.fullmatch(name))


def marker_written(name: str, digest: str) -> str:
    """Shell, run in the folder: `name` holds `digest`. The folder's files came over the cable (or from a client of
    the worker's copy daemon), so `name` may be a planted symlink: the digest goes into a fresh file (mktemp never
    opens an existing name) renamed over `name` (mv -T replaces a link, even one to a folder, instead of following
    it); the same as operations/remote/folder_marker.write_marker."""
    return (f"t=$(mktemp ./{name}.tmp.XXXXXX) && printf '%s\\n' {quote(digest)} > \"$t\" && chmod 644 \"$t\" && "
            f"mv -fT \"$t\" {name}")


def hashing_command(label: str, folder: str, hashing: str, total: int, complaint: str = "", *,
                    every: float, on_failure: str = "") -> StringCommand:
    """`hashing` (one sha256sum command, with its redirections) run in `folder` with a progress line every `every`
    seconds: the bytes it has read so far (its /proc/<pid>/io rchar) of `total`, the rate and the time left; when it
    fails, the shell commands `on_failure` (in `folder`), then `complaint` on stderr. Hashing hundreds of GB takes
    minutes. The pid file lives in the progress runner's private folder (a fresh name, mode 0700): a name in /tmp
    anyone can compute would let a planted symlink there be written through, or block the check."""
    pid_file = f'"${{{PRIVATE_DIR_ENV}:?}}/hashing.pid"'
    failed = "; ".join(part for part in (on_failure, complaint and f"echo {quote(complaint)} >&2") if part)
    # exec keeps the inner shell's pid, which it wrote down, for sha256sum
    command = (f"cd {quote(folder)} && sh -c {quote(f'echo $$ > {pid_file} && exec {hashing}')}; rc=$?; "
               + (f"[ $rc = 0 ] || {{ {failed}; }}; " if failed else "") + "exit $rc")
    probe = f"awk '/^rchar:/ {{print $2}}' /proc/$(cat {pid_file} 2>/dev/null)/io 2>/dev/null"
    return progress_command(label, command, probe=probe, total=total, own_work=True, every=every, private_dir=True)


@operation()
def checksums_written(folder: str, files: list, sums: str = SUMS, what: str = "the files", *, every: int):
    """Write <folder>/<sums> (sha256sum format) for `files` once; redo only when their sizes/mtimes changed.
    every: seconds between the hashing's progress lines."""
    check = host.get_fact(FolderCheck, path=folder, sums=sums, marker=SUMS_STATE)
    have = check.get("files", {}) if check else {}
    digest = listing_digest(have, files)
    if check and check["sums_sha"] and check["marker"] == digest and sorted(check["names"]) == sorted(files):
        host.noop(f"{folder}/{sums} is current")
        return
    absent = [f for f in files if f not in have]
    absent_problem = f"cannot write {folder}/{sums}: {', '.join(absent[:3])} missing (the download failed?)"
    if (yield from check_failed("checksums", [absent_problem] if absent else [], settled=False)):
        return
    total = sum(have[f][0] for f in files if f in have)  # planned before a download: what is there
    yield hashing_command(f"{what}: hashing for {sums}", folder,
                          f"sha256sum -- {' '.join(quote(f) for f in sorted(files))} > {quote(sums)}.tmp", total,
                          every=every)
    yield f"cd {quote(folder)} && mv {quote(sums)}.tmp {quote(sums)} && {marker_written(SUMS_STATE, digest)}"


# sha256sum -c's "NAME: FAILED" lines in $checked (a missing file's say "FAILED open or read"): each such regular
# file inside the folder, reached through no symlink, is removed. The list crossed the cable like the files, so a
# name that leads anywhere else is left alone.
_REMOVE_FAILED = ('sed -n "s/: FAILED$//p" "$checked" | while IFS= read -r f; do '
                  '[ "$(realpath -e -- "$f" 2>/dev/null)" = "$(pwd -P)/$f" ] && [ -f "$f" ] && rm -f -- "$f" '
                  '&& echo "sparkfold: removed $f (it does not match)"; done')


@operation()
def folder_verified(folder: str, sums: str, what: str, generated_fix: str = "", remove_failed: bool = False,
                    again: bool = False, *, every: int):
    """`sha256sum -c --quiet <sums>` in the folder, once per content: the marker records the list's sha256 and the
    files' sizes/mtimes, so the next run re-hashes only after a copy or download changed something.
    generated_fix: when set, files matching the kit's generated names (rope-*.f32, vision/gate_bias_vl) that are
    missing get this explanation instead of a plain "missing".
    remove_failed: for the worker's copies: a file that fails is removed, so that the next run's copy sends it again
    (the copy and this marker compare sizes and mtimes only, which a damaged file can keep).
    again: verify_data's run: hashed whatever the marker says (a file can rot and keep its size and mtime).
    every: seconds between the hashing's progress lines."""
    check = host.get_fact(FolderCheck, path=folder, sums=sums, marker=MARKER)
    if not check or not check["sums_sha"]:
        if not (yield from check_failed(what, [f"no {sums} in {folder}"], settled=False)):
            yield f"# will verify {what} in {folder} against {sums}"
        return
    expected = listing_digest(check["files"], check["names"], check["sums_sha"])
    if check["marker"] == expected and not again:
        host.noop(f"{what} verified against {sums}")
        return
    missing = [n for n in check["names"] if n not in check["files"]]
    if missing:
        if generated_fix and all(kit_generated(n) for n in missing):
            problem = f"only the generated files are missing ({', '.join(missing)}). {generated_fix}"
        else:
            problem = f"{len(missing)} files of {sums} are missing in {folder}, e.g. {', '.join(missing[:3])}"
        if (yield from check_failed(what, [problem], settled=False)):
            return
    listed = set(check["names"])
    total = sum(size for name, (size, _mtime) in check["files"].items() if name in listed)
    yield check_command(folder, sums, what, total, remove_failed, every=every)
    yield f"cd {quote(folder)} && {marker_written(MARKER, expected)}"


def check_command(folder: str, sums: str, what: str, total: int, remove_failed: bool = False,
                  fix: str = "", *, every: float) -> StringCommand:
    """`sha256sum -c --quiet <sums>` in the folder with progress lines; remove_failed: a file that fails is removed
    (folder_verified's); fix: what the failure's line tells the user to do, when not to re-run the deploy."""
    complaint = (f"sparkfold: {what} in {folder} does not match {sums} (the lines above name the files): "
                 "re-run the deploy to copy or download them again")
    hashing, on_failure = f"sha256sum -c --quiet {quote(sums)}", ""
    if remove_failed:
        checked = f'"${{{PRIVATE_DIR_ENV}:?}}/checked"'
        hashing += f" > {checked}"
        on_failure = f"cat {checked}; checked={checked}; {_REMOVE_FAILED}"
        complaint = (f"sparkfold: {what} in {folder} does not match {sums}: the files that differ were removed "
                     "(the lines above name them); re-run the deploy to copy them again")
    if fix:
        complaint = f"sparkfold: {what} in {folder} does not match {sums} (the lines above name the files): {fix}"
    return hashing_command(f"{what}: checking {sums}", folder, hashing, total, complaint, every=every,
                           on_failure=on_failure)


@operation()
def folder_to_peer(src: str, target: str, dest: str, what: str, symlink: str = "", symlink_target: str = "",
                   extra_rsync: tuple = (), *, every: int):
    """rsync a folder from this host (the head) to the worker over the link, resumable; only when the worker's
    files differ in size or mtime. symlink/symlink_target: a symlink on the worker (ln -sfn symlink_target symlink)
    kept in step. every: seconds between the copy's progress lines."""
    head = {name: v for name, v in host.get_fact(DirFiles, path=src).items() if not is_bookkeeping(name)}
    peer = host.get_fact(PeerFolder, target=target, path=dest, link=symlink)
    differing = {name: v for name, v in head.items() if peer["files"].get(name) != v}
    symlink_ok = not symlink or peer["link"] == symlink_target
    if head and not differing and symlink_ok:
        host.noop(f"{what} on the worker matches the head ({len(head)} files)")
        return
    problems: list[str | None]
    if not head:
        problems = [f"nothing to copy, {src} is empty on the head"]
    elif not peer["reachable"]:
        problems = [f"cannot reach {target} with `{SSH}`: the CX7 link and the head's ssh key for the worker must "
                    "be in place (they are set up earlier in the deploy)"]
    else:
        problems = [space_problem(peer["free"], sum(v[0] for v in differing.values()), f"{target}:{dest}", what)]
    if (yield from check_failed(what, problems, settled=False)):
        return
    if differing or not head:
        yield from peer_copy_commands(src, target, dest, what, sum(v[0] for v in head.values()), extra_rsync,
                                      every=every)
    if symlink and not symlink_ok:
        yield f"{SSH} {quote(target)} {quote(f'ln -sfn {quote(symlink_target)} {quote(symlink)}')}"


def versions_dir(dest: str) -> str:
    """Where the versions of a placed folder live: dest is a symlink into it."""
    return f"{dest}.d"


def peer_copy_commands(src: str, target: str, dest: str, what: str, total: int, extra_rsync=(),
                       label: str = "", *, every: float) -> list:
    """The commands that copy the folder src (on the head) into dest on the worker, resumably, with a progress line
    every `every` seconds ('<label>: ...', by default '<what> to the worker: ...'; total 0: none is known): rsync
    through a transient daemon on the worker's link address (operations/remote/link_copy.py: up to 4 clients at once
    for the files the worker lacks, then one pass over everything), unencrypted on the cable at the link's speed (the
    benchmark tests/bench/deploy_speed.py times these)."""
    # a part waits in PARTIAL_DIR, never at the file's name: only a whole file there can look complete
    options = ["-a", f"--partial-dir={PARTIAL_DIR}", *extra_rsync] + [f"--exclude={e}" for e in COPY_EXCLUDES]
    words = [src, "--target", target, "--dest", dest, "--ssh", SSH] + [f"--rsync-option={o}" for o in options]
    # progress: the worker's copy measured over ssh (its size at the start says how much a resume keeps)
    copy = heredoc_command(f"python3 - {shlex.join(words)}", "link_copy")
    return [progress_command(label or f"{what} to the worker", copy,
                             probe=f"{SSH} {quote(target)} {quote(f'du -sb {quote(dest)} 2>/dev/null | cut -f1')}",
                             total=total, every=every)]


REPLACED_PREFIX = "replaced-"  # <dest>.d/replaced-<time>: a real folder found at dest, moved aside (the user's)


@operation()
def folder_placed(src: str, dest: str, what: str):
    """dest is a symlink to a hard-linked copy of src (real files, no extra space) in <dest>.d/<digest of src's
    listing>. A change makes a new version and switches the symlink (rename: atomic); the folder a running rank
    mounts is never emptied or removed in place (the pair step's generations_kept removes old versions after the pair
    step). An older layout's real folder at dest is moved to <dest>.d/replaced-<time>, not deleted, and never
    pruned: the run's output names where it went."""
    have = host.get_fact(DirFiles, path=src)
    placed = {p: v for p, v in host.get_fact(DirFiles, path=dest).items() if p != MARKER}
    is_symlink = host.get_fact(LinkTarget, path=dest) is not None
    if have and have == placed and is_symlink:
        host.noop(f"{what} in place at {dest}")
        return
    if (yield from check_failed(what, [] if have else [f"{src} is empty (the download failed?)"], settled=False)):
        return
    parent, name = posixpath.split(dest)
    versions = posixpath.basename(versions_dir(dest))
    if placed and not is_symlink:
        warned("a folder in the symlink's place", f"{dest} is a folder, not sparkfold's symlink: it is moved to "
               f"{versions_dir(dest)}/{REPLACED_PREFIX}<date-time> and kept there (remove it yourself)")
    # the version's name is computed on the Spark: src may only be downloaded later in this run
    digest = (f"$(cd {quote(src)} && find . -type f -printf '%P %s %T@\\n' | LC_ALL=C sort | sha256sum "
              "| cut -c1-16)")
    aside = f"{quote(versions)}/{REPLACED_PREFIX}$(date +%Y%m%d-%H%M%S)"
    moved = quote(f"sparkfold: {dest} was a folder, not sparkfold's symlink: moved to {parent}/") + '"$r"' + \
        quote(", kept (yours to remove)")
    yield LiveCommand(
        f"cd {quote(parent)} && mkdir -p {quote(versions)} && d={digest} && [ -n \"$d\" ] && "
        f"v={quote(versions)}/$d && "
        f"{{ [ -d \"$v\" ] || {{ rm -rf \"$v.tmp\" && cp -rl {quote(src)} \"$v.tmp\" && mv \"$v.tmp\" \"$v\"; }}; }} "
        f"&& {{ [ -L {quote(name)} ] || [ ! -e {quote(name)} ] || "
        f"{{ r={aside} && {{ [ ! -e \"$r\" ] || r=\"$r-$$\"; }} && "
        f"mv -T {quote(name)} \"$r\" && echo {moved}; }}; }} && "
        f"ln -sfn \"$v\" {quote(name + '.new-link')} && mv -T {quote(name + '.new-link')} {quote(name)}")


def free_bytes(path: str):
    disk = host.get_fact(DiskFree, path=path)
    return disk["free_bytes"] if disk else None
