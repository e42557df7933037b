"""Copy a folder from the head into a folder on the worker over the link at the link's speed; run on the head.

rsync over ssh is held to the cipher's rate (a fraction of the link's). The link is a direct cable between the two
Sparks that carries the ranks' unencrypted traffic already, so the data crosses it in the clear (docs/security.md):
for this one copy the worker runs, as the ssh user, an rsync daemon bound to its link address that accepts only the
address the head's ssh arrives from and a random secret made for this copy (sent over ssh; rsync's challenge proves
it without sending it). The daemon lives as long as the ssh session that started it: when the copy ends, or the run
that started it is gone, the session ends and so does the daemon.

One rsync client is held to about one core's rate on each end, so the files the worker lacks go first through up to
CLIENTS clients at once, each given a share of about equal bytes (--ignore-existing: what the worker has is left to
the last pass). A file whose part an interrupted copy left under PARTIAL_DIR on the worker (the daemon's start lists
them) resumes with rsync's delta from that part (never at the file's name: only a whole file there can look
complete); every other file goes with --whole-file, which skips the delta machinery a file with no basis does not
need (a third of a copy's time on the simulated pair). One rsync then goes over everything: it finishes a file the
worker has but that differs, and makes symlinks, modes and times exact. The worker checks the files against their
SHA256SUMS afterwards (operations/data/copy.folder_verified, which removes a file that fails so that the next run
copies it again).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import random
import secrets
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor

MODULE = "sparkfold"
PARTIAL_DIR = ".sparkfold-partial"  # rsync's --partial-dir, relative: a folder of parts in each file's own folder
TRIES = 5  # ports tried (another program may hold one)
REFUSED = 10  # rsync: "error in socket IO", i.e. the daemon is not listening (yet)
CLIENTS = 4  # rsync clients at once for the files the worker lacks: one is held to one core's rate on each end
LEFT_TO_LAST = (23, 24)  # rsync: some files not sent (gone, unreadable) / vanished meanwhile; the rest arrived
RSYNC_TIMEOUT_S = 600  # rsync that moves nothing this long (keep-alives included) has lost the worker's daemon
# The daemon keeps the copy's symlinks as they are (munge symlinks = no: a model folder's links must work on the
# worker), so nothing a client sends may make it write or read through one: these options would let a client that
# planted a link (say dir -> /etc) write through it (keep-dirlinks, no-implied-dirs, the receiver-side folders) or
# read through it (`write only` refuses every download). The copy-*links options are the sender's (the head's
# rsync turns the snapshot's links into files with --copy-unsafe-links): they let nothing through a write-only
# daemon, so they stay allowed. sparkfold's clients send none of the refused ones.
REFUSED_OPTIONS = ("keep-dirlinks", "no-implied-dirs", "temp-dir", "backup-dir", "compare-dest", "copy-dest",
                   "link-dest")

# Exit 0 once process PID holds a listening TCP socket on PORT; 1 once it has ended (a zombie too: its shell has
# not waited for it yet) or after a minute. Its own socket, not just the port: another program's listener on it
# would take the rsync client's connection. First it prints `parts <JSON>`: the names (relative to DEST) of the files
# whose part an interrupted copy left under PARTIAL_DIR (those resume with rsync's delta; the rest go whole).
LISTENS = r"""
import json, os, sys, time
pid, port, dest, partial = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
parts = []
for folder, dirs, names in os.walk(dest):
    if os.path.basename(folder) == partial:
        parent = os.path.relpath(os.path.dirname(folder), dest)
        parts += [os.path.normpath(os.path.join(parent, name)) for name in names]
        dirs[:] = []
print("parts " + json.dumps(sorted(parts)), flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            sys.exit(1)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        sys.exit(1)
    owned = set()
    for fd in fds:
        try:
            fd_target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if fd_target.startswith("socket:["):
            owned.add(fd_target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = [row.split() for row in open(table).readlines()[1:]]
        except OSError:
            continue
        if any(int(r[1].rsplit(":", 1)[1], 16) == port and r[3] == "0A" and r[9] in owned for r in rows):
            sys.exit(0)
    time.sleep(0.01)
sys.exit(1)
"""

# On the worker: the daemon's files in a private temporary folder, the daemon in the background, then wait for the
# head to close this session's stdin (the copy's end, or the run's); the first stdin line is the secret. Every way
# out (that end, a failure, a signal) stops the daemon and then removes the folder with the secret.
DAEMON = r"""set -e
umask 077
d= daemon=
# `|| true`: under set -e, wait's 143 for the daemon just killed would end the trap before the rm
trap 'if [ -n "$daemon" ]; then kill $daemon 2>/dev/null || true; wait $daemon 2>/dev/null || true; fi
[ -z "$d" ] || rm -rf "$d"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p {dest}
d=$(mktemp -d)
IFS= read -r secret
printf '{module}:%s\n' "$secret" > "$d/secrets"
# root's daemon would otherwise become nobody; any other user's stays itself (and may not set groups)
[ "$(id -u)" != 0 ] || printf 'uid = root\ngid = root\n' > "$d/conf"
cat >> "$d/conf" <<EOF
use chroot = no
munge symlinks = no
[{module}]
read only = no
write only = yes
refuse options = {refused}
auth users = {module}
secrets file = $d/secrets
hosts allow = ${{SSH_CONNECTION%% *}}
EOF
# the folder as printf's argument: in the heredoc above, the shell would expand what its quotes protect
printf 'path = %s\n' {dest} >> "$d/conf"
rsync --daemon --no-detach --address={address} --port={port} --config="$d/conf" --log-file=/dev/null &
daemon=$!
# "started" only once the daemon listens (a port another program holds ends it: the head then tries another)
if python3 -c {listens} $daemon {port} {dest} {partial}; then echo started; else echo not-listening; fi
cat > /dev/null
"""


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def start_daemon(ssh: list[str], target: str, address: str, port: int, dest: str,
                 secret: str) -> tuple[subprocess.Popen, str, frozenset[str]]:
    """The worker's rsync daemon on `port`: (its ssh session, "started" / "not-listening" / "" when ssh itself
    failed, the files whose part an interrupted copy left on the worker)."""
    script = DAEMON.format(dest=shlex.quote(dest), module=MODULE, address=shlex.quote(address), port=port,
                           listens=shlex.quote(LISTENS), partial=shlex.quote(PARTIAL_DIR),
                           refused=" ".join(REFUSED_OPTIONS))
    proc = subprocess.Popen([*ssh, target, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin and proc.stdout
    try:
        proc.stdin.write(secret + "\n")
        proc.stdin.flush()
    except BrokenPipeError:  # ssh has ended already (it said why): nothing started
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()  # drops the unsent secret (the close's own flush raises again), so the file is closed
        return proc, "", frozenset()
    line = proc.stdout.readline()
    parts: frozenset[str] = frozenset()
    if line.startswith("parts "):
        with contextlib.suppress(ValueError, TypeError):
            parts = frozenset(json.loads(line[len("parts "):]))
        line = proc.stdout.readline()
    return proc, line.strip(), parts


def excluded(rel: str, patterns: list[str]) -> bool:
    """rsync's --exclude for the forms sparkfold gives: "/dir/" (anchored folder), "dir/" (a folder anywhere),
    "name" or "*.glob" (a file name anywhere)."""
    for pattern in patterns:
        anchored, folder, body = pattern.startswith("/"), pattern.endswith("/"), pattern.strip("/")
        parts = rel.split("/")
        if folder:
            hit = parts[0] == body if anchored else body in parts[:-1]
        elif anchored:
            hit = fnmatch.fnmatchcase(rel, body)
        else:
            hit = fnmatch.fnmatchcase(parts[-1], body) if "/" not in body else fnmatch.fnmatchcase(rel, body)
        if hit:
            return True
    return False


def files_to_send(src: str, patterns: list[str]) -> list[tuple[str, int]]:
    """(relative path, size) of src's regular files that no pattern excludes (symlinks are the last pass's),
    biggest first."""
    found = []
    for folder, _dirs, names in os.walk(src):
        for name in names:
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, src)
            if excluded(rel, patterns) or os.path.islink(full):
                continue
            try:
                file_stat = os.stat(full)
            except OSError:  # gone meanwhile: the last pass sees what is there
                continue
            if stat.S_ISREG(file_stat.st_mode):
                found.append((rel, file_stat.st_size))
    return sorted(found, key=lambda item: -item[1])


def split_among(files: list[tuple[str, int]], clients: int = CLIENTS) -> list[list[str]]:
    """The names of (name, size) `files` in at most `clients` groups of about equal bytes: biggest first, each to
    the lightest group (among equals, the one with fewer files)."""
    loads = [0] * min(clients, len(files))
    groups: list[list[str]] = [[] for _ in loads]
    for name, size in sorted(files, key=lambda item: -item[1]):
        lightest = min(range(len(loads)), key=lambda i: (loads[i], len(groups[i])))
        loads[lightest] += size
        groups[lightest].append(name)
    return [group for group in groups if group]


def rsync(src: str, url: str, secret: str, options: list[str], names: list[str] | None = None) -> int:
    """One rsync into the daemon's module, of `names` only when given (NUL-separated on its stdin: any name works);
    retried while the daemon is still binding its port (briefly)."""
    env = dict(os.environ, RSYNC_PASSWORD=secret)
    listed = [] if names is None else ["--files-from=-", "--from0"]
    given = None if names is None else b"".join(os.fsencode(name) + b"\0" for name in names)
    rc, deadline = REFUSED, time.monotonic() + 3
    while rc == REFUSED and time.monotonic() < deadline:
        rc = subprocess.run(["rsync", f"--timeout={RSYNC_TIMEOUT_S}", *options, *listed, src.rstrip("/") + "/", url],
                            input=given, env=env).returncode
        if rc == REFUSED:
            time.sleep(0.1)
    return rc


def client_groups(files: list[tuple[str, int]], parts: AbstractSet[str]) -> list[tuple[list[str], bool]]:
    """(names, whole) per rsync client: the files with a part on the worker resume with rsync's delta, the others go
    whole (--whole-file: the delta machinery costs time on a file that has no basis, a third of a copy measured on
    the simulated pair, tests/bench/deploy_speed.py). Each set split into at most CLIENTS groups of about equal
    bytes."""
    fresh = [f for f in files if f[0] not in parts]
    resumed = [f for f in files if f[0] in parts]
    return [(g, True) for g in split_among(fresh)] + [(g, False) for g in split_among(resumed)]


def copy(src: str, address: str, port: int, secret: str, options: list[str], parts: AbstractSet[str] = frozenset()
         ) -> int:
    """The files the worker lacks by up to CLIENTS rsync clients at once (client_groups: a file with a part on the
    worker by the delta, the rest whole), then one rsync over everything. A client that failed fails the copy with
    its exit status, once every client has ended; one that left files out because they vanished or could not be
    read meanwhile (LEFT_TO_LAST) leaves them to the last pass, which reads the folder again and fails on what still
    fails."""
    url = f"rsync://{MODULE}@{url_host(address)}:{port}/{MODULE}/"
    # an excluded file is never listed: rsync sends a listed name even when an exclude names its folder ("/.cache/")
    patterns = [o.split("=", 1)[1] for o in options if o.startswith("--exclude=")]
    groups = client_groups(files_to_send(src, patterns), parts)
    if groups:
        with ThreadPoolExecutor(min(len(groups), CLIENTS)) as pool:
            codes = list(pool.map(lambda group: rsync(src, url, secret, [*options, "--ignore-existing",
                                                                         *(["--whole-file"] if group[1] else [])],
                                                      group[0]), groups))
        failed = [rc for rc in codes if rc and rc not in LEFT_TO_LAST]
        if failed:
            return failed[0]
    return rsync(src, url, secret, options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="copy SRC into DEST on the worker through a transient rsync daemon")
    parser.add_argument("src")
    parser.add_argument("--target", required=True, help="user@address of the worker on the link (ssh)")
    parser.add_argument("--dest", required=True)
    parser.add_argument("--ssh", default="ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new")
    parser.add_argument("--rsync-option", action="append", default=[], dest="options")
    args = parser.parse_args(argv)
    if "\n" in args.dest or "%" in args.dest:  # one line of the daemon's config, where %VAR% is expanded
        print(f"sparkfold: the worker's folder {args.dest!r} holds a line break or %: the rsync daemon cannot "
              "serve it", file=sys.stderr)
        return 2
    address = args.target.rsplit("@", 1)[-1]
    rc = 1
    for _ in range(TRIES):
        secret, port = secrets.token_hex(24), random.randint(20000, 59998)  # docs/security.md
        daemon, state, parts = start_daemon(shlex.split(args.ssh), args.target, address, port, args.dest, secret)
        try:
            rc = copy(args.src, address, port, secret, args.options, parts) if state == "started" else REFUSED
        finally:
            if daemon.stdin:
                daemon.stdin.close()  # the session ends, and the daemon with it
            daemon.wait()
        if not state:  # ssh itself failed (it said why)
            return daemon.returncode or 255
        if rc != REFUSED:  # copied, or failed for good
            break
        why = "did not listen on" if state != "started" else "stopped answering (the link?) on"
        print(f"sparkfold: the worker's rsync daemon {why} port {port}; trying another", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
