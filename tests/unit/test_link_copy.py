"""The head-to-worker copy (operations/remote/link_copy.py) run for real: a transient rsync daemon started through a
stand-in ssh (which runs the worker's part in a local shell, as sshd would, with SSH_CONNECTION set), on 127.0.0.1:
the files arrive, symlinks intact, an interrupted copy resumes from its partial file, and no daemon outlives it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from operations.data_copy import SSH, peer_copy_commands

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
