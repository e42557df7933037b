"""The head-to-worker copy (operations/remote/link_copy.py) run for real: a transient rsync daemon started through a
stand-in ssh (which runs the worker's part in a local shell of its own session, as sshd would, with SSH_CONNECTION
set), on 127.0.0.1: the files arrive, symlinks intact, an interrupted copy resumes from its part, a file is at its
name only once whole, and nothing of the copy (temporary folder, secret, daemon, receiver) outlives it, however
it ends.

Every wait here is on the thing itself (a port file written once the receiver listens, a connection the receiver
closes, a session that has ended); the receiver's ports are the OS's, so a busy machine cannot take them."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from operations.data.copy import SSH, peer_copy_commands
from operations.remote.link_copy import PARTIAL_DIR, RECEIVER

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None or shutil.which("setsid") is None,
                                reason="needs rsync and setsid")

SECRET = re.compile(rb"sparkfold:[0-9a-f]{48}")  # the secrets file's line (link_copy: token_hex(24))


def fake_ssh(tmp_path: Path, allowed_from: str = "127.0.0.1") -> str:
    """`ssh [-o X]... TARGET SCRIPT` -> SCRIPT in sh, as the worker's sshd would run it: in a session of its own (a
    signal to the head's processes does not reach it), with its own temporary folder (worker-tmp) and this test's
    PATH; every call logged in ssh.log, every session's pid in sessions."""
    (tmp_path / "worker-tmp").mkdir(exist_ok=True)
    ssh = tmp_path / "ssh"
    session = f"echo $$ >> {tmp_path}/sessions; exec sh -c \"$0\""
    ssh.write_text("#!/bin/sh\n"
                   f"echo \"$@\" >> {tmp_path}/ssh.log\n"
                   "while [ \"$1\" = -o ]; do shift 2; done; shift\n"
                   f"export TMPDIR={tmp_path}/worker-tmp PATH={shlex.quote(os.environ['PATH'])} "
                   f"SSH_CONNECTION='{allowed_from} 50000 127.0.0.1 22'\n"
                   f"exec setsid -w sh -c {shlex.quote(session)} \"$1\"\n")
    ssh.chmod(0o755)
    return str(ssh)


def copy_script(src: Path, dest: Path, ssh: str, extra_rsync: tuple = ()) -> str:
    (command,) = peer_copy_commands(str(src), "nvidia@127.0.0.1", str(dest), "the test folder", 0, extra_rsync)
    # the progress runner's --probe would ssh too: the stand-in runs it locally
    return command.get_raw_value().replace(SSH, ssh)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def sessions(tmp_path: Path) -> list[int]:
    path = tmp_path / "sessions"
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def wait_for(done, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def leftovers(tmp_path: Path) -> list[str]:
    """What a copy must not leave once its worker sessions have ended: anything in either side's temporary folder,
    a file holding a secret, or a process whose command line names this test's folder (the rsync daemon's config,
    the receiver's secrets file)."""
    left = [str(p) for side in ("head-tmp", "worker-tmp") for p in (tmp_path / side).iterdir()]
    left += [str(p) for p in tmp_path.rglob("*") if p.is_file() and SECRET.search(p.read_bytes())]
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines()
    return left + [line for line in ps if str(tmp_path) in line]


def test_a_folder_arrives_whole_with_its_links(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "worker" / "dest"
    (src / "blobs").mkdir(parents=True)
    (src / "blobs" / "abc").write_bytes(os.urandom(300_000))
    (src / "model.safetensors").symlink_to("blobs/abc")
    (src / ".cache").mkdir()
    (src / ".cache" / "meta").write_text("not copied")
    done = subprocess.run(["sh", "-c", copy_script(src, dest, fake_ssh(tmp_path))], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr + done.stdout
    assert (dest / "blobs" / "abc").read_bytes() == (src / "blobs" / "abc").read_bytes()
    assert os.readlink(dest / "model.safetensors") == "blobs/abc"  # not munged by the daemon
    assert not (dest / ".cache").exists()
    assert "the test folder to the worker: done in" in done.stdout


def held_rsync(tmp_path: Path) -> str:
    """A folder for the head's PATH whose rsync says it started (rsync-started) and waits while `hold` exists, then
    runs the real one: a copy caught after its streams, with the worker's daemon and receiver up."""
    folder = tmp_path / "head-bin"
    folder.mkdir()
    (folder / "rsync").write_text(f"#!/bin/sh\ntouch {tmp_path}/rsync-started\n"
                                  f"while [ -e {tmp_path}/hold ]; do sleep 0.02; done\n"
                                  f"exec {shutil.which('rsync')} \"$@\"\n")
    (folder / "rsync").chmod(0o755)
    return str(folder)


def daemon_session(tmp_path: Path) -> int:
    """The worker session that runs the daemon (the others measure progress)."""
    (pid,) = [p for p in sessions(tmp_path)
              if alive(p) and b"rsync --daemon" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return pid


@pytest.mark.parametrize("end", ["done", "failed", "run killed", "worker hung up"])
def test_nothing_of_the_copy_is_left_on_either_side(tmp_path, end):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "f").write_bytes(os.urandom(200_000))
    (tmp_path / "head-tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path / "head-tmp"))
    caught = end in ("run killed", "worker hung up")
    if caught:
        env["PATH"] = f"{held_rsync(tmp_path)}:{env['PATH']}"
        (tmp_path / "hold").touch()
    script = copy_script(src, dest, fake_ssh(tmp_path), ("--no-such-option",) if end == "failed" else ())
    run = subprocess.Popen(["sh", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    if caught:
        wait_for((tmp_path / "rsync-started").exists, "the copy's rsync pass")
        # the run's connection to the head is gone (the progress runner ends its work), or the worker's session is
        os.killpg(run.pid if end == "run killed" else daemon_session(tmp_path), signal.SIGHUP)
        (tmp_path / "hold").unlink()
    out, err = run.communicate(timeout=120)
    wait_for(lambda: not any(alive(pid) for pid in sessions(tmp_path)), "the worker's sessions to end")
    if end != "worker hung up":  # after a hang-up the head may start another daemon and finish the copy
        assert (run.returncode == 0) == (end == "done"), out + err
    assert leftovers(tmp_path) == []


def test_a_client_from_another_address_is_refused(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "f").write_text("x")
    ssh = fake_ssh(tmp_path, allowed_from="10.9.9.9")  # the daemon accepts only the address ssh came from
    done = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.argv[0] = 'link_copy'; "
                           "runpy.run_path(sys.argv[1], run_name='__main__')",
                           str(Path(__file__).resolve().parents[2] / "operations/remote/link_copy.py"), str(src),
                           "--target", "nvidia@127.0.0.1", "--dest", str(dest), "--ssh", ssh,
                           "--rsync-option=-a"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and not (dest / "f").exists()


def test_an_interrupted_copy_resumes_from_its_part(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    data = os.urandom(4_000_000)
    (src / "big.bin").write_bytes(data)
    (dest / PARTIAL_DIR).mkdir(parents=True)
    (dest / PARTIAL_DIR / "big.bin").write_bytes(data[:1_000_000])  # what an interrupted copy kept aside
    done = subprocess.run(["sh", "-c", copy_script(src, dest, fake_ssh(tmp_path))], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "already there" in done.stdout.splitlines()[0]
    assert (dest / "big.bin").read_bytes() == data
    assert not (dest / PARTIAL_DIR).exists()  # rsync removes the part once it served


# --- the receiver the worker runs for the streamed files ------------------------------------------------------

@pytest.fixture
def receiver(tmp_path):
    """RECEIVER on 127.0.0.1 as the worker's daemon script starts it: (port, dest); stopped afterwards. `prelude`:
    python run before it, in the same process."""

    def start(client: str = "127.0.0.1", secret: str = "s3cret", prelude: str = "", env: dict | None = None):
        dest = tmp_path / "worker-dest"
        dest.mkdir(exist_ok=True)
        (tmp_path / "secrets").write_text(f"sparkfold:{secret}\n")
        port_file = tmp_path / "port"
        port_file.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-c", prelude + RECEIVER, "127.0.0.1", str(dest),
                                 str(tmp_path / "secrets"), client, str(port_file), PARTIAL_DIR],
                                env=dict(os.environ, **(env or {})))
        started.append(proc)
        wait_for(lambda: port_file.exists() or proc.poll() is not None, "the receiver to listen")
        assert proc.poll() is None, "the receiver did not start"
        return int(port_file.read_text()), dest

    started: list[subprocess.Popen] = []
    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def handshake(port: int, secret: bytes = b"s3cret") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    nonce = b""
    while not nonce.endswith(b"\n"):
        nonce += sock.recv(1)
    sock.sendall(hmac.new(secret, nonce.strip(), hashlib.sha256).hexdigest().encode() + b"\n")
    return sock


def closed_by_the_receiver(sock: socket.socket) -> bytes:
    """What the receiver still says once the head has sent everything, up to its close (when its handler is done)."""
    sock.shutdown(socket.SHUT_WR)
    said = b""
    while chunk := sock.recv(100):
        said += chunk
    sock.close()
    return said


def test_streamed_files_arrive_with_their_mode_and_time(tmp_path, receiver):
    from operations.remote.link_copy import stream_missing
    port, dest = receiver()
    src = tmp_path / "src"
    (src / "blobs").mkdir(parents=True)
    big, small = os.urandom(3_000_000), b"tok"
    (src / "blobs" / "big").write_bytes(big)
    (src / "run.sh").write_bytes(small)
    (src / "run.sh").chmod(0o750)
    (src / "link").symlink_to("blobs/big")  # rsync's to copy: links stay links
    (src / "x.incomplete").write_bytes(b"partial download")
    (src / ".cache").mkdir()
    (src / ".cache" / "meta").write_text("hub metadata")
    assert stream_missing(str(src), "127.0.0.1", port, "s3cret", ["/.cache/", "*.incomplete"])
    assert (dest / "blobs" / "big").read_bytes() == big and (dest / "run.sh").read_bytes() == small
    assert (dest / "run.sh").stat().st_mode & 0o777 == 0o750
    assert (dest / "blobs" / "big").stat().st_mtime_ns == (src / "blobs" / "big").stat().st_mtime_ns
    assert not (dest / "link").exists() and not (dest / "x.incomplete").exists() and not (dest / ".cache").exists()
    assert not (dest / PARTIAL_DIR).exists() and not (dest / "blobs" / PARTIAL_DIR).exists()
    (dest / "run.sh").write_bytes(b"t")  # a file the worker has (any size) is left for rsync's delta
    assert stream_missing(str(src), "127.0.0.1", port, "s3cret", [])
    assert (dest / "run.sh").read_bytes() == b"t"


def test_the_receiver_writes_nothing_without_the_secret_or_from_another_address(tmp_path, receiver):
    from operations.remote.link_copy import send_file
    src = tmp_path / "f"
    src.write_bytes(b"data")
    port, dest = receiver()
    with pytest.raises(ConnectionError):
        send_file("127.0.0.1", port, "wrong", "f", str(src))
    port, dest = receiver(client="10.9.9.9")  # only the address the head's ssh came from
    with pytest.raises(ConnectionError):
        send_file("127.0.0.1", port, "s3cret", "f", str(src))
    assert not (dest / "f").exists()


@pytest.mark.parametrize("rel", ["../escape", "/etc/escape", "a/../../escape", "a//b", "./x", "a\u0000b",
                                 f"{PARTIAL_DIR}/x", f"a/{PARTIAL_DIR}/x"])
def test_the_receiver_keeps_every_path_inside_the_destination(tmp_path, receiver, rel):
    from operations.remote.link_copy import send_file
    src = tmp_path / "f"
    src.write_bytes(b"data")
    port, dest = receiver()
    with pytest.raises(ConnectionError):
        send_file("127.0.0.1", port, "s3cret", rel, str(src))
    assert not (tmp_path / "escape").exists() and list(dest.iterdir()) == []


def test_the_receiver_does_not_follow_a_link_out_of_the_destination(tmp_path, receiver):
    from operations.remote.link_copy import send_file
    src, outside = tmp_path / "f", tmp_path / "outside"
    src.write_bytes(b"data")
    outside.mkdir()
    port, dest = receiver()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(ConnectionError):
        send_file("127.0.0.1", port, "s3cret", "sub/f", str(src))
    assert list(outside.iterdir()) == []


# In the receiver's process: just before the first open a stream makes, the folder PARENT is swapped for a symlink
# to OUTSIDE (a path checked by name before that open would now lead out of the destination).
SWAP_PARENT = """
import os as _os, threading as _threading
_real_open, _swapped = _os.open, []
def _swapping_open(path, *args, **kwargs):
    if _threading.current_thread() is not _threading.main_thread() and not _swapped:
        _swapped.append(path)
        _os.rename(_os.environ["PARENT"], _os.environ["PARENT"] + ".moved")
        _os.symlink(_os.environ["OUTSIDE"], _os.environ["PARENT"])
    return _real_open(path, *args, **kwargs)
_os.open = _swapping_open
"""


def test_a_folder_swapped_for_a_link_during_the_stream_is_not_followed(tmp_path, receiver):
    from operations.remote.link_copy import send_file
    src, outside, dest = tmp_path / "f", tmp_path / "outside", tmp_path / "worker-dest"
    src.write_bytes(b"data")
    outside.mkdir()
    (dest / "sub").mkdir(parents=True)  # a real folder when the stream starts
    port, _ = receiver(prelude=SWAP_PARENT, env={"PARENT": str(dest / "sub"), "OUTSIDE": str(outside)})
    with pytest.raises(ConnectionError):
        send_file("127.0.0.1", port, "s3cret", "sub/f", str(src))
    assert os.readlink(dest / "sub") == str(outside)  # the swap happened
    assert list(outside.iterdir()) == []


def test_a_stream_is_at_its_name_only_once_whole(tmp_path, receiver):
    port, dest = receiver()
    data = os.urandom(2_000_000)
    with handshake(port) as sock:
        sock.sendall(json.dumps({"path": "big.bin", "size": len(data), "mode": 0o644, "mtime_ns": 10**18})
                     .encode() + b"\n")
        assert sock.recv(3) == b"go\n"
        sock.sendall(data[:1_500_000])
        wait_for(lambda: (dest / PARTIAL_DIR / "big.bin").exists(), "the part")
        assert not (dest / "big.bin").exists()  # not whole yet: not at its name
        sock.sendall(data[1_500_000:])
        assert closed_by_the_receiver(sock) == b"ok\n"
    assert (dest / "big.bin").read_bytes() == data and (dest / "big.bin").stat().st_mtime_ns == 10**18
    assert not (dest / PARTIAL_DIR).exists()


def test_an_interrupted_stream_leaves_its_part_aside_for_rsync(tmp_path, receiver):
    port, dest = receiver()
    sock = handshake(port)
    sock.sendall(json.dumps({"path": "big.bin", "size": 4_000_000, "mode": 0o644, "mtime_ns": 0}).encode() + b"\n")
    assert sock.recv(3) == b"go\n"
    sock.sendall(b"x" * 1_000_000)  # then the head is gone
    assert closed_by_the_receiver(sock) == b""
    assert not (dest / "big.bin").exists()  # nothing at its name looks complete
    assert (dest / PARTIAL_DIR / "big.bin").stat().st_size == 1_000_000  # rsync --partial-dir resumes from it
    with handshake(port) as again:  # a later stream leaves the part to rsync
        again.sendall(json.dumps({"path": "big.bin", "size": 4_000_000, "mode": 0o644, "mtime_ns": 0}).encode()
                      + b"\n")
        assert closed_by_the_receiver(again) == b"skip\n"


def test_excludes_read_like_rsyncs():
    from operations.remote.link_copy import excluded
    patterns = ["/.cache/", ".sparkfold-verified", "*.incomplete"]
    assert excluded(".cache/huggingface/x", patterns) and not excluded("sub/.cache/x", patterns)
    assert excluded("a/b/.sparkfold-verified", patterns) and excluded("blobs/abc.incomplete", patterns)
    assert not excluded("blobs/abc", patterns) and not excluded("incomplete", patterns)
    assert excluded("a/tmp/x", ["tmp/"]) and not excluded("tmp", ["tmp/"])


def test_idle_connections_cannot_hold_every_slot_for_long(tmp_path, receiver):
    from operations.remote.link_copy import send_file
    src = tmp_path / "f"
    src.write_bytes(b"data")
    port, dest = receiver()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]  # no secret: they only wait
    extra = socket.create_connection(("127.0.0.1", port))
    extra.settimeout(10)
    assert extra.recv(100) == b""  # every slot taken: closed at once, not queued behind them
    for sock in idle + [extra]:
        sock.close()

    def sent() -> bool:
        try:
            return send_file("127.0.0.1", port, "s3cret", "f", str(src))
        except ConnectionError:  # no slot yet
            return False

    wait_for(sent, "the idle handlers to end with their connections and give their slots back")
    assert (dest / "f").read_bytes() == b"data"


def test_an_unreachable_receiver_is_tried_once_then_rsync_carries_everything(tmp_path, monkeypatch):
    from operations.remote import link_copy
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}").write_bytes(b"x" * (i + 1))
    tried = []
    real = link_copy.send_file
    monkeypatch.setattr(link_copy, "send_file", lambda *a: tried.append(a[3]) or real(*a))
    with socket.socket() as bound:  # bound, never listening: its port refuses, and no other program can take it
        bound.bind(("127.0.0.1", 0))
        assert link_copy.stream_missing(str(src), "127.0.0.1", bound.getsockname()[1], "s", [], streams=1) is False
    assert len(tried) == 1  # refused: the other five go straight to rsync


def _main(src: Path, dest: Path, ssh: str) -> int:
    from operations.remote import link_copy
    return link_copy.main([str(src), "--target", "nvidia@127.0.0.1", "--dest", str(dest), "--ssh", ssh,
                           "--rsync-option=-a", f"--rsync-option=--partial-dir={PARTIAL_DIR}"])


def test_the_copy_streams_what_the_worker_lacks_then_rsync_adds_the_links(tmp_path, monkeypatch):
    from operations.remote import link_copy
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "blobs").mkdir(parents=True)
    (src / "blobs" / "abc").write_bytes(os.urandom(500_000))
    (src / "model.safetensors").symlink_to("blobs/abc")
    streamed, real = [], link_copy.send_file
    monkeypatch.setattr(link_copy, "send_file", lambda *a: streamed.append(a[3]) or real(*a))
    assert _main(src, dest, fake_ssh(tmp_path)) == 0
    assert streamed == ["blobs/abc"]  # the file went by the stream, the link by rsync
    assert (dest / "blobs" / "abc").read_bytes() == (src / "blobs" / "abc").read_bytes()
    assert os.readlink(dest / "model.safetensors") == "blobs/abc"


def test_a_stream_cut_half_way_is_finished_by_rsync(tmp_path, monkeypatch):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    data = os.urandom(2_000_000)
    (src / "big.bin").write_bytes(data)
    real_sendfile = socket.socket.sendfile

    def half_then_gone(self, file, offset=0, count=None):
        real_sendfile(self, file, offset, len(data) // 2)
        raise ConnectionResetError("the cable was pulled")

    monkeypatch.setattr(socket.socket, "sendfile", half_then_gone)
    assert _main(src, dest, fake_ssh(tmp_path)) == 0
    assert (dest / "big.bin").read_bytes() == data  # rsync's delta completed the half the stream left
    assert not (dest / PARTIAL_DIR).exists()


def test_a_file_gone_before_it_is_streamed_is_left_to_rsync(tmp_path):
    from operations.remote.link_copy import files_to_stream
    src = tmp_path / "src"
    src.mkdir()
    (src / "kept").write_bytes(b"12")
    (src / "dangling").symlink_to("nowhere")
    assert files_to_stream(str(src), []) == [("kept", str(src / "kept"), 2)]


def test_a_port_another_program_listens_on_is_left_for_another_before_anything_is_streamed(tmp_path, monkeypatch):
    from operations.remote import link_copy
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "f").write_bytes(os.urandom(100_000))
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()  # it never answers: an rsync client sent here would wait forever
    first, randint = [held.getsockname()[1]], link_copy.random.randint
    monkeypatch.setattr(link_copy.random, "randint", lambda *a: first.pop() if first else randint(*a))
    streamed, real = [], link_copy.send_file
    monkeypatch.setattr(link_copy, "send_file", lambda *a: streamed.append(a[3]) or real(*a))
    try:
        assert _main(src, dest, fake_ssh(tmp_path)) == 0
    finally:
        held.close()
    assert streamed == ["f"] and (dest / "f").read_bytes() == (src / "f").read_bytes()
    started = (tmp_path / "ssh.log").read_text().count("rsync --daemon")
    assert started >= 2  # the held port, then another (one more if a random pick was taken meanwhile)


def test_a_worker_ssh_cannot_reach_ends_the_copy_with_sshs_own_code(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    ssh = tmp_path / "ssh"
    ssh.write_text(f"#!/bin/sh\necho x >> {tmp_path}/ssh.log\necho 'ssh: connect: No route to host' >&2\nexit 255\n")
    ssh.chmod(0o755)
    assert _main(src, tmp_path / "dest", str(ssh)) == 255
    assert len((tmp_path / "ssh.log").read_text().splitlines()) == 1  # not tried again on other ports
