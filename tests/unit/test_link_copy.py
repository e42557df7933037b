"""The head-to-worker copy (operations/remote/link_copy.py) run for real: a transient rsync daemon started through a
stand-in ssh (which runs the worker's part in a local shell of its own session, as sshd would, with SSH_CONNECTION
set), on 127.0.0.1: the files arrive through up to 4 rsync clients at once (each given its share as a NUL-separated
list), symlinks intact, any name, excluded files never sent, an interrupted copy resumed from its part with rsync's
delta, a failing client failing the copy, and nothing of the copy (temporary folder, secret, daemon) outliving it,
however it ends.

Every wait here is on the thing itself (a file a stand-in rsync writes, a session that has ended)."""

from __future__ import annotations

import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_for

from operations.data.copy import COPY_EXCLUDES, SSH, peer_copy_commands
from operations.remote.link_copy import CLIENTS, MODULE, PARTIAL_DIR, split_among, start_daemon

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
    (command,) = peer_copy_commands(str(src), "nvidia@127.0.0.1", str(dest), "the test folder", 0, extra_rsync,
                                    every=10)
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


def leftovers(tmp_path: Path) -> list[str]:
    """What a copy must not leave once its worker sessions have ended: anything in either side's temporary folder,
    a file holding a secret, or a process whose command line names this test's folder (the rsync daemon's
    config)."""
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
    runs the real one: a copy caught at its first rsync client, with the worker's daemon up."""
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
    for i in range(CLIENTS + 2):  # every client has files to send
        (src / f"f{i}").write_bytes(os.urandom(100_000))
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
        wait_for((tmp_path / "rsync-started").exists, "the copy's rsync clients", 60)
        # the run's connection to the head is gone (the progress runner ends its work), or the worker's session is
        os.killpg(run.pid if end == "run killed" else daemon_session(tmp_path), signal.SIGHUP)
        (tmp_path / "hold").unlink()
    out, err = run.communicate(timeout=120)
    wait_for(lambda: not any(alive(pid) for pid in sessions(tmp_path)), "the worker's sessions to end", 60)
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


@pytest.mark.parametrize("client", [["-aK", "--relative"], ["-a", "--relative", "--no-implied-dirs"]])
def test_a_client_cannot_write_through_a_link_it_planted(tmp_path, client):
    """An authenticated client may send links (the copy's must arrive intact), so the daemon refuses the options
    that would make it write through one: a link `escape` -> a folder outside, then `escape/planted`."""
    dest, outside, secret = tmp_path / "dest", tmp_path / "outside", secrets.token_hex(8)
    (tmp_path / "s1").mkdir()
    (tmp_path / "s1" / "escape").symlink_to(outside)
    (tmp_path / "s2" / "escape").mkdir(parents=True)
    (tmp_path / "s2" / "escape" / "planted").write_text("x")
    outside.mkdir()
    for _ in range(5):  # a port this machine already uses: another, as the copy itself does (link_copy.TRIES)
        port = random.randint(20000, 59998)
        daemon, state, _parts = start_daemon(shlex.split(fake_ssh(tmp_path)), "n@127.0.0.1", "127.0.0.1", port,
                                             str(dest), secret)
        if state != "not-listening":
            break
        assert daemon.stdin
        daemon.stdin.close()  # its session ends once the head closes it
        daemon.wait()
    url, env = f"rsync://{MODULE}@127.0.0.1:{port}/{MODULE}/", dict(os.environ, RSYNC_PASSWORD=secret)
    try:
        assert state == "started"
        planted = subprocess.run(["rsync", "-a", f"{tmp_path}/s1/", url], env=env, capture_output=True, text=True)
        assert planted.returncode == 0, planted.stderr  # links are copied as they are
        through = subprocess.run(["rsync", *client, f"{tmp_path}/s2/./escape/planted", url], env=env,
                                 capture_output=True, text=True)
        download = subprocess.run(["rsync", "-a", "--copy-unsafe-links", url, f"{tmp_path}/down/"], env=env,
                                  capture_output=True, text=True)
    finally:
        assert daemon.stdin
        daemon.stdin.close()
        daemon.wait()
    assert through.returncode != 0 and "refuse" in through.stderr, through.stderr
    assert not (outside / "planted").exists()
    assert download.returncode != 0 and not (tmp_path / "down" / "escape").exists()  # nothing read through it


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


def test_excludes_read_like_rsyncs():
    from operations.remote.link_copy import excluded
    patterns = ["/.cache/", ".sparkfold-verified", "*.incomplete"]
    assert excluded(".cache/huggingface/x", patterns) and not excluded("sub/.cache/x", patterns)
    assert excluded("a/b/.sparkfold-verified", patterns) and excluded("blobs/abc.incomplete", patterns)
    assert not excluded("blobs/abc", patterns) and not excluded("incomplete", patterns)
    assert excluded("a/tmp/x", ["tmp/"]) and not excluded("tmp", ["tmp/"])


# --- the clients: each its share of the files the worker lacks ------------------------------------------------

def loads(groups: list[list[str]], sizes: dict[str, int]) -> list[int]:
    return [sum(sizes[name] for name in group) for group in groups]


def test_the_files_are_split_into_at_most_four_groups_of_about_equal_bytes():
    rng = random.Random(7)
    for count in (1, 3, 4, 5, 9, 40):
        sizes = {f"f{i}": rng.randint(0, 10**9) for i in range(count)}
        groups = split_among(list(sizes.items()))
        assert len(groups) == min(count, CLIENTS) and all(groups)
        assert sorted(name for group in groups for name in group) == sorted(sizes)  # every file exactly once
        # biggest first, each to the lightest: no group is heavier than another by more than one file
        assert max(loads(groups, sizes)) - min(loads(groups, sizes)) <= max(sizes.values())
    assert split_among([("a", 5), ("b", 1)]) == [["a"], ["b"]]  # fewer files than clients: fewer clients
    assert len(split_among([(f"empty{i}", 0) for i in range(8)])) == CLIENTS  # empty files spread too
    assert split_among([]) == []


def recording_rsync(tmp_path: Path, failing: str = "", code: int = 23) -> str:
    """A folder for the head's PATH whose rsync records each call under calls/ (its arguments one a line; the list
    it got on stdin, for a client) and runs the real one; a client whose list names `failing` exits `code` at
    once."""
    calls, folder = tmp_path / "calls", tmp_path / "head-bin"
    calls.mkdir()
    folder.mkdir()
    fail = f"if grep -qaF {shlex.quote(failing)} \"$call.list\"; then exit {code}; fi\n" if failing else ""
    (folder / "rsync").write_text(
        "#!/bin/sh\n"
        f"call=$(mktemp {calls}/$(date +%s%N).XXXXXX)\n"  # in the order they started
        "printf '%s\\n' \"$@\" > \"$call.args\"\n"
        "for a; do [ \"$a\" != --files-from=- ] || listed=1; done\n"
        f"[ -n \"$listed\" ] || exec {shutil.which('rsync')} \"$@\"\n"
        "cat > \"$call.list\"\n"
        f"{fail}"
        f"exec {shutil.which('rsync')} \"$@\" < \"$call.list\"\n")
    (folder / "rsync").chmod(0o755)
    return str(folder)


def recorded(tmp_path: Path) -> list[tuple[list[str], list[str] | None]]:
    """Each call of recording_rsync's in the order they started: (its arguments, the names its list held or None
    for the last pass)."""
    found = []
    for args in sorted((tmp_path / "calls").glob("*.args")):
        listed = args.with_suffix(".list")
        names = listed.read_bytes().decode().split("\0") if listed.exists() else None
        found.append((args.read_text().splitlines(), names))
    return found


def _main(src: Path, dest: Path, ssh: str, *options: str) -> int:
    from operations.remote import link_copy
    return link_copy.main([str(src), "--target", "nvidia@127.0.0.1", "--dest", str(dest), "--ssh", ssh,
                           "--rsync-option=-a", f"--rsync-option=--partial-dir={PARTIAL_DIR}",
                           *(f"--rsync-option={o}" for o in options)])


def test_the_clients_share_what_the_worker_lacks_then_one_rsync_adds_the_links(tmp_path, monkeypatch):
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "blobs").mkdir(parents=True)
    for i in range(6):
        (src / "blobs" / f"b{i}").write_bytes(os.urandom(100_000 * (i + 1)))
    (src / "model.safetensors").symlink_to("blobs/b5")
    (src / ".cache").mkdir()
    (src / ".cache" / "meta").write_text("the hub's metadata")
    (src / "x.incomplete").write_text("a download in progress")
    (src / "SHA256SUMS.tmp").write_text("a hashing in progress")
    ssh = fake_ssh(tmp_path)  # the worker's PATH: the real rsync for the daemon
    monkeypatch.setenv("PATH", f"{recording_rsync(tmp_path)}:{os.environ['PATH']}")
    excludes = [f"--exclude={e}" for e in COPY_EXCLUDES]
    assert _main(src, dest, ssh, *excludes) == 0
    calls = recorded(tmp_path)
    clients = [(args, names) for args, names in calls if names is not None]
    assert len(clients) == CLIENTS and len(calls) == CLIENTS + 1  # then the last pass, over everything
    for args, names in clients:
        assert names[-1] == "" and all(names[:-1])  # each name ends with a NUL, none is empty
        assert {"--files-from=-", "--from0", "--ignore-existing", *excludes} <= set(args)
        assert "--whole-file" in args  # no part of it on the worker: no delta machinery
    assert sorted(n for _, names in clients for n in names if n) == [f"blobs/b{i}" for i in range(6)]
    last = calls[-1][0]
    assert "--ignore-existing" not in last and "--whole-file" not in last and set(excludes) <= set(last)
    for i in range(6):
        assert (dest / "blobs" / f"b{i}").read_bytes() == (src / "blobs" / f"b{i}").read_bytes()
    assert os.readlink(dest / "model.safetensors") == "blobs/b5"  # the link, by the last pass
    assert not (dest / ".cache").exists() and not (dest / "x.incomplete").exists()
    assert not (dest / "SHA256SUMS.tmp").exists()  # renamed on the head while a copy may run


def test_any_file_name_arrives(tmp_path, monkeypatch):
    src, dest = tmp_path / "src", tmp_path / "dest"
    names = ["a name with spaces.bin", "new\nline", "tab\there", " leading", "-dash", "back\\slash", "star*[?]",
             "sub dir/in\nside"]
    for name in names:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(name.encode() * 1000)
    ssh = fake_ssh(tmp_path)
    monkeypatch.setenv("PATH", f"{recording_rsync(tmp_path)}:{os.environ['PATH']}")
    assert _main(src, dest, ssh) == 0
    assert sorted(n for _, listed in recorded(tmp_path) if listed for n in listed if n) == sorted(names)
    for name in names:
        assert (dest / name).read_bytes() == name.encode() * 1000


def test_any_destination_path_is_the_daemons_folder(tmp_path):
    """The worker's folder reaches the daemon's config as it is: no shell quotes kept, nothing expanded."""
    src, dest = tmp_path / "src", tmp_path / "wor ker" / "d$HOME'x`id`"
    src.mkdir()
    (src / "a").write_bytes(os.urandom(1000))
    assert _main(src, dest, fake_ssh(tmp_path)) == 0
    assert (dest / "a").read_bytes() == (src / "a").read_bytes()
    for odd in ("new\nline", "%HOME%"):  # what the daemon's config cannot hold as it is
        assert _main(src, tmp_path / odd, fake_ssh(tmp_path)) == 2 and not (tmp_path / odd).exists()


def test_a_failing_client_fails_the_copy_once_every_client_has_ended(tmp_path, monkeypatch):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    for name in ("a", "b", "c"):
        (src / name).write_bytes(os.urandom(2_000_000))
    (src / "bad").write_bytes(b"x")  # the smallest: a group of its own
    ssh = fake_ssh(tmp_path)
    monkeypatch.setenv("PATH", f"{recording_rsync(tmp_path, failing='bad', code=12)}:{os.environ['PATH']}")
    assert _main(src, dest, ssh) == 12  # a broken stream: the last pass would meet it again
    for name in ("a", "b", "c"):  # the others went on to the end
        assert (dest / name).read_bytes() == (src / name).read_bytes()
    assert not (dest / "bad").exists()
    assert all(names is not None for _, names in recorded(tmp_path))  # no last pass


@pytest.mark.parametrize("code", [23, 24])
def test_files_a_client_left_out_are_left_to_the_last_pass(tmp_path, monkeypatch, code):
    """A file gone or unreadable meanwhile (23) or vanished (24) is not the copy's failure: the last pass reads the
    folder again, carries what is there, and fails on what still fails."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    for name in ("a", "b", "c", "bad"):
        (src / name).write_bytes(os.urandom(1000))
    ssh = fake_ssh(tmp_path)
    monkeypatch.setenv("PATH", f"{recording_rsync(tmp_path, failing='bad', code=code)}:{os.environ['PATH']}")
    assert _main(src, dest, ssh) == 0
    assert recorded(tmp_path)[-1][1] is None  # the last pass ran
    for name in ("a", "b", "c", "bad"):
        assert (dest / name).read_bytes() == (src / name).read_bytes()


def test_an_interrupted_copy_resumes_from_its_part_with_rsyncs_delta(tmp_path, capfd):
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "sub").mkdir(parents=True)
    data = os.urandom(4_000_000)
    (src / "sub" / "big.bin").write_bytes(data)
    (src / "other").write_bytes(os.urandom(1000))
    (dest / "sub" / PARTIAL_DIR).mkdir(parents=True)
    (dest / "sub" / PARTIAL_DIR / "big.bin").write_bytes(data[:2_000_000])  # half: what an interrupted copy kept
    assert _main(src, dest, fake_ssh(tmp_path), "--stats") == 0
    assert (dest / "sub" / "big.bin").read_bytes() == data
    assert not (dest / "sub" / PARTIAL_DIR).exists()  # rsync removes the part once it served
    # rsync's own count: the part's bytes matched (not sent again), only the rest went as literal data
    matched = [int(n.replace(",", "")) for n in re.findall(r"Matched data: ([\d,]+) bytes", capfd.readouterr().out)]
    assert max(matched) >= 1_900_000


def test_a_file_with_a_part_on_the_worker_resumes_by_the_delta_and_the_rest_go_whole(tmp_path, monkeypatch):
    """The daemon's start lists the parts an interrupted copy left (any folder, any name); their files go to
    clients without --whole-file, every other file to clients with it."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    names = ["sub/big.bin", "odd dir/new\nline", "fresh-a", "fresh-b"]
    for name in names:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(os.urandom(200_000))
    for name in names[:2]:  # what an interrupted copy kept aside
        part = dest / os.path.dirname(name) / PARTIAL_DIR / os.path.basename(name)
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes((src / name).read_bytes()[:100_000])
    monkeypatch.setenv("PATH", f"{recording_rsync(tmp_path)}:{os.environ['PATH']}")
    assert _main(src, dest, fake_ssh(tmp_path)) == 0
    clients = [(args, {n for n in listed if n}) for args, listed in recorded(tmp_path) if listed is not None]
    delta = set().union(*(listed for args, listed in clients if "--whole-file" not in args))
    whole = set().union(*(listed for args, listed in clients if "--whole-file" in args))
    assert delta == set(names[:2]) and whole == set(names[2:])
    for name in names:
        assert (dest / name).read_bytes() == (src / name).read_bytes()


def test_the_client_groups_keep_parts_apart_and_each_set_balanced():
    from operations.remote.link_copy import client_groups
    files = [(f"f{i}", 100 * (i + 1)) for i in range(8)]
    groups = client_groups(files, {"f0", "f7"})
    assert [whole for _, whole in groups] == [True] * CLIENTS + [False, False]
    assert sorted(n for g, whole in groups if not whole for n in g) == ["f0", "f7"]
    assert sorted(n for g, _ in groups for n in g) == sorted(n for n, _ in files)
    assert client_groups(files, set()) == [(g, True) for g in split_among(files)]


def test_a_file_gone_or_not_a_file_is_left_to_the_last_pass(tmp_path):
    from operations.remote.link_copy import files_to_send
    src = tmp_path / "src"
    src.mkdir()
    (src / "kept").write_bytes(b"12")
    (src / "big").write_bytes(b"1234")
    (src / "dangling").symlink_to("nowhere")
    (src / "link").symlink_to("kept")
    assert files_to_send(str(src), []) == [("big", 4), ("kept", 2)]  # biggest first
    assert files_to_send(str(src), ["big"]) == [("kept", 2)]


def test_a_port_another_program_listens_on_is_left_for_another_before_anything_is_sent(tmp_path, monkeypatch):
    from operations.remote import link_copy
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "f").write_bytes(os.urandom(100_000))
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()  # it never answers: an rsync client sent here would wait forever
    port = held.getsockname()[1]
    first, randint = [port], link_copy.random.randint
    monkeypatch.setattr(link_copy.random, "randint", lambda *a: first.pop() if first else randint(*a))
    ssh = fake_ssh(tmp_path)
    monkeypatch.setenv("PATH", f"{recording_rsync(tmp_path)}:{os.environ['PATH']}")
    try:
        assert _main(src, dest, ssh) == 0
    finally:
        held.close()
    assert (dest / "f").read_bytes() == (src / "f").read_bytes()
    assert not any(f":{port}/" in arg for args, _ in recorded(tmp_path) for arg in args)  # no rsync sent there
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
