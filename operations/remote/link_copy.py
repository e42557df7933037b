"""Copy a folder from the head into a folder on the worker over the link at the link's speed; run on the head.

rsync over ssh is held to the cipher's rate (a fraction of the link's). The link is a direct cable between the two
Sparks that carries the ranks' unencrypted traffic already, so the data crosses it in the clear (docs/security.md):
for this one copy the worker runs, as the ssh user, an rsync daemon and a file receiver (RECEIVER below), both
bound to the worker's link address, accepting only the address the head's ssh arrives from and a random secret
made for this copy (sent over ssh; rsync's challenge and the receiver's HMAC prove it without sending it). They
live as long as the ssh session that started them: when the copy ends, or the run that started it is gone, the
session ends and so do they.

Files the worker lacks are streamed first, several at once, each straight from the page cache (sendfile) to the
worker: nearly the cable's rate, where rsync's own protocol costs about twice the CPU. A file is written under
PARTIAL_DIR beside its place and moved to its name only once whole. rsync then goes over everything with the same
--partial-dir: what a stream left half-written (an interrupted copy) resumes with rsync's delta from that part,
and symlinks, modes and times are made exact. The worker checks the files against their SHA256SUMS afterwards
(operations/data/copy.folder_verified, which removes a file that fails so that the next run copies it again).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import hmac
import json
import os
import random
import secrets
import shlex
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

MODULE = "sparkfold"
PARTIAL_DIR = ".sparkfold-partial"  # rsync's --partial-dir, relative: a folder of parts in each file's own folder
TRIES = 5  # ports tried (another program may hold one)
REFUSED = 10  # rsync: "error in socket IO", i.e. the daemon is not listening (yet)
STREAMS = 4  # files streamed at once: one stream is held to one core's rate on each end
STREAM_TIMEOUT_S = 60  # a stream that moves nothing this long has lost the worker
CONNECT_TIMEOUT_S = 5  # the receiver is one cable away: no answer means a firewall, and rsync takes over
RSYNC_TIMEOUT_S = 600  # rsync that moves nothing this long (keep-alives included) has lost the worker's daemon

# The worker's receiver: one file per connection, after an HMAC of a fresh nonce with the copy's secret. A file
# the worker already has (any size), or a part of it, is skipped: rsync's delta finishes it. Each path is walked
# beneath the destination one folder at a time through open folders (no symlink followed, even one swapped in
# meanwhile); a file is written under PARTIAL_DIR and moved to its name only once whole.
RECEIVER = r"""
import hashlib, hmac, json, os, secrets, socket, sys, threading, time
address, dest, secret_file, client, port_file, partial = sys.argv[1:7]

def tell_port(text):  # the daemon script waits for this file: the port, or "" when there is none
    with open(port_file + ".tmp", "w") as f:
        f.write(text)
    os.rename(port_file + ".tmp", port_file)

try:
    secret = open(secret_file).read().strip().split(":", 1)[1].encode()
    root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)  # every path is walked from here, never looked up by name
    srv = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    srv.bind((address, 0))  # a port the OS picks: no other program holds it
    srv.listen(16)
except Exception:
    tell_port("")
    raise
tell_port(str(srv.getsockname()[1]))
slots = threading.BoundedSemaphore(8)  # streams at once: the head sends 4
partials = threading.Lock()  # a part is made and moved in place whole, never beside another stream's rmdir

def line(c, deadline, limit=4096):
    out = b""
    while not out.endswith(b"\n"):
        b = c.recv(1)
        if not b or len(out) > limit or time.monotonic() > deadline:
            raise EOFError
        out += b
    return out[:-1].decode()

def parts_of(rel):
    parts = rel.split("/") if isinstance(rel, str) and "\0" not in rel else [""]
    if any(p in ("", ".", "..", partial) for p in parts):  # "" also refuses "/abs" and "a//b"
        raise ValueError(rel)
    return parts

def subfolder(fd, name):
    # made when absent; O_NOFOLLOW: a symlink in a folder's place, even one swapped in just now, is refused
    try:
        os.mkdir(name, 0o700, dir_fd=fd)
    except FileExistsError:
        pass
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)

def present(name, fd):
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False

def receive(c, head):
    parts, size, mtime = parts_of(head["path"]), int(head["size"]), int(head["mtime_ns"])
    fds = [os.dup(root)]
    try:
        for name in parts[:-1]:
            fds.append(subfolder(fds[-1], name))
        folder, name = fds[-1], parts[-1]
        with partials:
            # a file the worker has (any size), or a cut stream's part: rsync's delta finishes it
            if present(name, folder):
                c.sendall(b"skip\n")
                return
            fds.append(subfolder(folder, partial))
            if present(name, fds[-1]):
                c.sendall(b"skip\n")
                return
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fds[-1])
        with os.fdopen(out, "wb") as f:
            c.sendall(b"go\n")
            c.settimeout(60)
            left = size
            while left:
                chunk = c.recv(min(1 << 20, left))
                if not chunk:
                    raise EOFError
                f.write(chunk)
                left -= len(chunk)
            f.flush()
            os.fchmod(f.fileno(), int(head["mode"]) & 0o755)
            os.utime(f.fileno(), ns=(mtime, mtime))
        with partials:  # whole: only now at its name
            if present(name, folder):
                raise FileExistsError(name)
            os.rename(name, name, src_dir_fd=fds[-1], dst_dir_fd=folder)
            try:
                os.rmdir(partial, dir_fd=folder)
            except OSError:
                pass  # another file's part is still there
        c.sendall(b"ok\n")
    finally:
        for fd in fds:
            os.close(fd)

def handle(c):
    try:
        deadline = time.monotonic() + 10  # the handshake, from a head that knows the secret, takes milliseconds
        c.settimeout(10)
        nonce = secrets.token_hex(16)
        c.sendall(nonce.encode() + b"\n")
        if not hmac.compare_digest(line(c, deadline), hmac.new(secret, nonce.encode(), hashlib.sha256).hexdigest()):
            return
        receive(c, json.loads(line(c, deadline)))
    except Exception:
        pass
    finally:
        c.close()
        slots.release()

while True:
    conn, peer = srv.accept()
    if peer[0] != client or not slots.acquire(blocking=False):
        conn.close()
        continue
    threading.Thread(target=handle, args=(conn,), daemon=True).start()
"""

# Exit 0 once process PID holds a listening TCP socket on PORT; 1 once it has ended (a zombie too: its shell has
# not waited for it yet) or after a minute. Its own socket, not just the port: another program's listener on it
# would take the rsync client's connection.
LISTENS = r"""
import os, sys, time
pid, port = sys.argv[1], int(sys.argv[2])
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

# On the worker: the daemon's files in a private temporary folder, the daemon and the receiver in the background,
# then wait for the head to close this session's stdin (the copy's end, or the run's); the first stdin line is the
# secret. Every way out (that end, a failure, a signal) stops both and then removes the folder with the secret.
DAEMON = r"""set -e
umask 077
d= pids=
# `|| true`: under set -e, wait's 143 for the child just killed would end the trap before the rm
trap 'for p in $pids; do kill $p 2>/dev/null || true; done; for p in $pids; do wait $p 2>/dev/null || true; done
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
path = {dest}
read only = no
auth users = {module}
secrets file = $d/secrets
hosts allow = ${{SSH_CONNECTION%% *}}
EOF
rsync --daemon --no-detach --address={address} --port={port} --config="$d/conf" --log-file=/dev/null &
daemon=$!
pids=$daemon
python3 -c {receiver} {address} {dest} "$d/secrets" "${{SSH_CONNECTION%% *}}" "$d/port" {partial} &
receiver=$!
pids="$daemon $receiver"
# "started" only once the daemon listens (a port another program holds ends it: the head then tries another)
if python3 -c {listens} $daemon {port}; then
  # the receiver writes its port, or nothing when it cannot listen (rsync then carries every file); a receiver
  # that died before writing it leaves rsync to carry every file at once
  n=0
  while [ ! -e "$d/port" ] && [ $n -lt 3000 ]; do kill -0 $receiver 2>/dev/null || break; sleep 0.02; n=$((n + 1)); done
  echo "started $(cat "$d/port" 2>/dev/null)"
else
  echo "not-listening"
fi
cat > /dev/null
"""


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def start_daemon(ssh: list[str], target: str, address: str, port: int, dest: str,
                 secret: str) -> tuple[subprocess.Popen, str, int | None]:
    """The worker's rsync daemon on `port` and receiver on a port the OS picks: (their ssh session, "started" /
    "not-listening" / "" when ssh itself failed, the receiver's port or None when it could not listen: rsync then
    carries every file)."""
    script = DAEMON.format(dest=shlex.quote(dest), module=MODULE, address=shlex.quote(address), port=port,
                           listens=shlex.quote(LISTENS), receiver=shlex.quote(RECEIVER),
                           partial=shlex.quote(PARTIAL_DIR))
    proc = subprocess.Popen([*ssh, target, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin and proc.stdout
    try:
        proc.stdin.write(secret + "\n")
        proc.stdin.flush()
    except BrokenPipeError:  # ssh has ended already (it said why): nothing started
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()  # drops the unsent secret (the close's own flush raises again), so the file is closed
        return proc, "", None
    said = proc.stdout.readline().split() or [""]
    return proc, said[0], int(said[1]) if len(said) == 2 and said[1].isdigit() else None


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


def files_to_stream(src: str, patterns: list[str]) -> list[tuple[str, str, int]]:
    """(relative path, full path, size) of src's regular files (symlinks are rsync's), biggest first."""
    found = []
    for folder, _dirs, names in os.walk(src):
        for name in names:
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, src)
            if excluded(rel, patterns) or os.path.islink(full):
                continue
            try:
                file_stat = os.stat(full)
            except OSError:  # gone meanwhile: rsync's pass sees what is there
                continue
            if stat.S_ISREG(file_stat.st_mode):
                found.append((rel, full, file_stat.st_size))
    return sorted(found, key=lambda item: -item[2])


def _line(sock: socket.socket) -> str:
    out = b""
    while not out.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            raise ConnectionError("the worker's receiver closed the stream")
        out += byte
    return out[:-1].decode()


def send_file(address: str, port: int, secret: str, rel: str, full: str) -> bool:
    """One file to the worker's receiver; True when it arrived whole or was there already."""
    file_stat = os.stat(full)
    with socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S) as sock, open(full, "rb") as file:
        sock.settimeout(STREAM_TIMEOUT_S)
        nonce = _line(sock)
        sock.sendall(hmac.new(secret.encode(), nonce.encode(), hashlib.sha256).hexdigest().encode() + b"\n")
        head = {"path": rel, "size": file_stat.st_size, "mode": file_stat.st_mode & 0o777,
                "mtime_ns": file_stat.st_mtime_ns}
        sock.sendall(json.dumps(head).encode() + b"\n")
        answer = _line(sock)
        if answer == "go":
            sock.sendfile(file, 0, file_stat.st_size)
            answer = _line(sock)
        return answer in ("ok", "skip")


def stream_missing(src: str, address: str, port: int, secret: str, patterns: list[str],
                   streams: int = STREAMS) -> bool:
    """Every file the worker lacks, streamed; False when one did not arrive (rsync then carries it). The first
    failure stops the rest: a receiver that cannot be reached is not asked again for every file."""
    files = files_to_stream(src, patterns)
    failed = threading.Event()

    def one(item: tuple[str, str, int]) -> bool:
        if failed.is_set():
            return False
        try:
            if send_file(address, port, secret, item[0], item[1]):
                return True
        except (OSError, ValueError) as e:
            print(f"sparkfold: streaming {item[0]} stopped ({e}); rsync carries the rest", file=sys.stderr)
        failed.set()
        return False

    if not files:
        return True
    with ThreadPoolExecutor(max(1, min(streams, len(files)))) as pool:
        return all(list(pool.map(one, files)))


def rsync(src: str, url: str, secret: str, options: list[str]) -> int:
    """One rsync into the daemon's module; retried while the daemon is still binding its port (briefly)."""
    env = dict(os.environ, RSYNC_PASSWORD=secret)
    rc, deadline = REFUSED, time.monotonic() + 3
    while rc == REFUSED and time.monotonic() < deadline:
        rc = subprocess.run(["rsync", f"--timeout={RSYNC_TIMEOUT_S}", *options, src.rstrip("/") + "/", url],
                            env=env).returncode
        if rc == REFUSED:
            time.sleep(0.1)
    return rc


def copy(src: str, address: str, port: int, secret: str, options: list[str], stream_port: int | None = None) -> int:
    """Files the worker lacks go whole: streamed (stream_port) or else by rsync -W (its delta search costs ~3 times
    the time on a fast link); then the rest with rsync's delta: a file an interrupted copy left half-written
    resumes from what is there."""
    url = f"rsync://{MODULE}@{url_host(address)}:{port}/{MODULE}/"
    patterns = [o.split("=", 1)[1] for o in options if o.startswith("--exclude=")]
    try:
        streamed = stream_port is not None and stream_missing(src, address, stream_port, secret, patterns)
    except Exception as e:  # the stream is only the fast way: rsync alone still copies everything
        print(f"sparkfold: streaming stopped ({type(e).__name__}: {e}); rsync carries the files", file=sys.stderr)
        streamed = False
    if not streamed:
        rc = rsync(src, url, secret, [*options, "--whole-file", "--ignore-existing"])
        if rc:
            return rc
    return rsync(src, url, secret, options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="copy SRC into DEST on the worker through a transient rsync daemon")
    parser.add_argument("src")
    parser.add_argument("--target", required=True, help="user@address of the worker on the link (ssh)")
    parser.add_argument("--dest", required=True)
    parser.add_argument("--ssh", default="ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new")
    parser.add_argument("--rsync-option", action="append", default=[], dest="options")
    args = parser.parse_args(argv)
    address = args.target.rsplit("@", 1)[-1]
    rc = 1
    for _ in range(TRIES):
        secret, port = secrets.token_hex(24), random.randint(20000, 59998)  # docs/security.md
        daemon, state, stream_port = start_daemon(shlex.split(args.ssh), args.target, address, port, args.dest,
                                                  secret)
        try:
            rc = copy(args.src, address, port, secret, args.options, stream_port) if state == "started" else REFUSED
        finally:
            if daemon.stdin:
                daemon.stdin.close()  # the session ends, and the daemon with it
            daemon.wait()
        if not state:  # ssh itself failed (it said why)
            return daemon.returncode or 255
        if rc != REFUSED:  # copied, or failed for good
            break
        print(f"sparkfold: the worker's rsync daemon did not listen on port {port}; trying another",
              file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
