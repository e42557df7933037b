"""Copy a folder from the head into a folder on the worker over the link at the link's speed; run on the head.

rsync over ssh is held to the cipher's rate (a fraction of the link's). The link is a direct cable between the two
Sparks that carries the ranks' unencrypted traffic already, so the data crosses it in the clear (docs/security.md):
for this one copy an rsync daemon runs on the worker as the ssh user, bound to the worker's link address, accepting
only the address the head's ssh arrives from and a random secret made for this copy (sent over ssh, checked by
rsync's challenge, never sent as such). It lives as long as the ssh session that started it: when the copy ends,
or the run that started it is gone, the session ends and so does the daemon. rsync's own options keep the copy
resumable (--partial); the worker checks the files against their SHA256SUMS afterwards, as before.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import shlex
import subprocess
import sys
import time

MODULE = "sparkfold"
TRIES = 5  # ports tried (another program may hold one)
REFUSED = 10  # rsync: "error in socket IO", i.e. the daemon is not listening (yet)

# On the worker: the daemon's files in a private temporary folder, the daemon in the background, then wait for the
# head to close this session's stdin (the copy's end, or the run's); the first stdin line is the secret.
DAEMON = r"""set -e
umask 077
mkdir -p {dest}
d=$(mktemp -d)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$d"' EXIT
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
pid=$!
echo started
cat > /dev/null
"""


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def start_daemon(ssh: list[str], target: str, address: str, port: int, dest: str, secret: str) -> subprocess.Popen:
    script = DAEMON.format(dest=shlex.quote(dest), module=MODULE, address=shlex.quote(address), port=port)
    proc = subprocess.Popen([*ssh, target, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin and proc.stdout
    proc.stdin.write(secret + "\n")
    proc.stdin.flush()
    proc.stdout.readline()  # "started" (or "" when ssh failed: the rsync below then reports it)
    return proc


def rsync(src: str, url: str, secret: str, options: list[str]) -> int:
    """One rsync into the daemon's module; retried while the daemon is still binding its port (briefly)."""
    env = dict(os.environ, RSYNC_PASSWORD=secret)
    rc, deadline = REFUSED, time.monotonic() + 3
    while rc == REFUSED and time.monotonic() < deadline:
        rc = subprocess.run(["rsync", *options, src.rstrip("/") + "/", url], env=env).returncode
        if rc == REFUSED:
            time.sleep(0.1)
    return rc


def copy(src: str, address: str, port: int, secret: str, options: list[str]) -> int:
    """Files the worker lacks go whole (-W: rsync's delta search costs ~3 times the time on a fast link), then the
    rest with rsync's delta: a file kept by --partial from an interrupted copy resumes from what is there."""
    url = f"rsync://{MODULE}@{url_host(address)}:{port}/{MODULE}/"
    rc = rsync(src, url, secret, [*options, "--whole-file", "--ignore-existing"])
    return rc if rc else rsync(src, url, secret, options)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="copy SRC into DEST on the worker through a transient rsync daemon")
    p.add_argument("src")
    p.add_argument("--target", required=True, help="user@address of the worker on the link (ssh)")
    p.add_argument("--dest", required=True)
    p.add_argument("--ssh", default="ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new")
    p.add_argument("--rsync-option", action="append", default=[], dest="options")
    args = p.parse_args(argv)
    address = args.target.rsplit("@", 1)[-1]
    rc = 1
    for _ in range(TRIES):
        secret, port = secrets.token_hex(24), random.randint(20000, 59999)
        daemon = start_daemon(shlex.split(args.ssh), args.target, address, port, args.dest, secret)
        try:
            rc = copy(args.src, address, port, secret, args.options)
        finally:
            if daemon.stdin:
                daemon.stdin.close()  # the session ends, and the daemon with it
            daemon.wait()
        if rc != REFUSED or daemon.returncode == 255:  # copied or failed for good; 255: ssh itself failed
            break
    return rc


if __name__ == "__main__":
    sys.exit(main())
