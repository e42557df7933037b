"""The head-to-worker copy (operations/remote/link_copy.py) run for real: a transient rsync daemon started through a
stand-in ssh (which runs the worker's part in a local shell, as sshd would, with SSH_CONNECTION set), on 127.0.0.1:
the files arrive, symlinks intact, an interrupted copy resumes from its partial file, and no daemon outlives it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from operations.data.copy import SSH, peer_copy_commands

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync")


def fake_ssh(tmp_path: Path, allowed_from: str = "127.0.0.1") -> str:
    """`ssh [-o X]... TARGET SCRIPT` -> SCRIPT in sh, as the worker's sshd would run it; every call logged."""
    ssh = tmp_path / "ssh"
    ssh.write_text("#!/bin/sh\n"
                   f"echo \"$@\" >> {tmp_path}/ssh.log\n"
                   "while [ \"$1\" = -o ]; do shift 2; done; shift\n"
                   f"SSH_CONNECTION='{allowed_from} 50000 127.0.0.1 22' exec sh -c \"$1\"\n")
    ssh.chmod(0o755)
    return str(ssh)


def copy_script(src: Path, dest: Path, ssh: str) -> str:
    (command,) = peer_copy_commands(str(src), "nvidia@127.0.0.1", str(dest), "the test folder", 0)
    # the progress runner's --probe would ssh too: the stand-in runs it locally
    return command.get_raw_value().replace(SSH, ssh)


def daemons(dest: Path) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in ps if "rsync --daemon" in line and "--port" in line]


def test_a_folder_arrives_whole_with_its_links_and_the_daemon_ends(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "worker" / "dest"
    (src / "blobs").mkdir(parents=True)
    (src / "blobs" / "abc").write_bytes(os.urandom(300_000))
    (src / "model.safetensors").symlink_to("blobs/abc")
    (src / ".cache").mkdir()
    (src / ".cache" / "meta").write_text("not copied")
    before = daemons(dest)
    done = subprocess.run(["sh", "-c", copy_script(src, dest, fake_ssh(tmp_path))], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr + done.stdout
    assert (dest / "blobs" / "abc").read_bytes() == (src / "blobs" / "abc").read_bytes()
    assert os.readlink(dest / "model.safetensors") == "blobs/abc"  # not munged by the daemon
    assert not (dest / ".cache").exists()
    assert "the test folder to the worker: done in" in done.stdout
    assert daemons(dest) == before


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


def test_an_interrupted_copy_resumes_from_its_partial_file(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    data = os.urandom(4_000_000)
    (src / "big.bin").write_bytes(data)
    dest.mkdir()
    (dest / "big.bin").write_bytes(data[:1_000_000])  # what --partial kept of an interrupted copy
    done = subprocess.run(["sh", "-c", copy_script(src, dest, fake_ssh(tmp_path))], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "already there" in done.stdout.splitlines()[0]
    assert (dest / "big.bin").read_bytes() == data


# --- the receiver the worker runs for the streamed files ------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def receiver(tmp_path):
    """RECEIVER on 127.0.0.1 as the worker's daemon script starts it: (port, dest); stopped afterwards."""
    from operations.remote import link_copy

    def start(client: str = "127.0.0.1", secret: str = "s3cret"):
        dest = tmp_path / "worker-dest"
        dest.mkdir(exist_ok=True)
        (tmp_path / "secrets").write_text(f"sparkfold:{secret}\n")
        port_file = tmp_path / "port"
        port_file.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-c", link_copy.RECEIVER, "127.0.0.1", str(free_port()), str(dest),
                                 str(tmp_path / "secrets"), client, str(port_file)])
        started.append(proc)
        for _ in range(100):
            if port_file.exists():
                return int(port_file.read_text()), dest
            time.sleep(0.05)
        raise AssertionError("the receiver did not start")

    started: list[subprocess.Popen] = []
    yield start
    for proc in started:
        proc.kill()
        proc.wait()


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


@pytest.mark.parametrize("rel", ["../escape", "/etc/escape", "a/../../escape", "a//b", "./x", "a\u0000b"])
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


def test_an_interrupted_stream_leaves_a_partial_file_that_rsync_resumes(tmp_path, receiver):
    import hashlib
    import hmac
    import json
    import socket
    port, dest = receiver()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        nonce = sock.recv(100).decode().strip()
        sock.sendall(hmac.new(b"s3cret", nonce.encode(), hashlib.sha256).hexdigest().encode() + b"\n")
        sock.sendall(json.dumps({"path": "big.bin", "size": 4_000_000, "mode": 0o644, "mtime_ns": 0}).encode()
                     + b"\n")
        assert sock.recv(3) == b"go\n"
        sock.sendall(b"x" * 1_000_000)  # then the head is gone
    for _ in range(100):
        if (dest / "big.bin").exists() and (dest / "big.bin").stat().st_size == 1_000_000:
            break
        time.sleep(0.05)
    assert (dest / "big.bin").stat().st_size == 1_000_000  # at its name: the next rsync pass finishes it


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
    for _ in range(100):  # the idle handlers end with their connections and give their slots back
        try:
            if send_file("127.0.0.1", port, "s3cret", "f", str(src)):
                break
        except ConnectionError:
            time.sleep(0.05)
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
    assert link_copy.stream_missing(str(src), "127.0.0.1", free_port(), "s", [], streams=1) is False
    assert len(tried) == 1  # refused: the other five go straight to rsync


def _main(src: Path, dest: Path, ssh: str) -> int:
    from operations.remote import link_copy
    return link_copy.main([str(src), "--target", "nvidia@127.0.0.1", "--dest", str(dest), "--ssh", ssh,
                           "--rsync-option=-a", "--rsync-option=--partial"])


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
    ports = iter([held.getsockname()[1], free_port()])
    monkeypatch.setattr(link_copy.random, "randint", lambda *_: next(ports))
    streamed, real = [], link_copy.send_file
    monkeypatch.setattr(link_copy, "send_file", lambda *a: streamed.append(a[3]) or real(*a))
    try:
        assert _main(src, dest, fake_ssh(tmp_path)) == 0
    finally:
        held.close()
    assert streamed == ["f"] and (dest / "f").read_bytes() == (src / "f").read_bytes()
    sessions = (tmp_path / "ssh.log").read_text().count("rsync --daemon")
    assert sessions == 2  # the held port, then a free one


def test_a_worker_ssh_cannot_reach_ends_the_copy_with_sshs_own_code(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    ssh = tmp_path / "ssh"
    ssh.write_text(f"#!/bin/sh\necho x >> {tmp_path}/ssh.log\necho 'ssh: connect: No route to host' >&2\nexit 255\n")
    ssh.chmod(0o755)
    assert _main(src, tmp_path / "dest", str(ssh)) == 255
    assert len((tmp_path / "ssh.log").read_text().splitlines()) == 1  # not tried again on other ports
