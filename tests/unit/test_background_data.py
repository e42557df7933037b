"""The head's data streams (operations/data/background.py): what a fresh start runs, run for real in a local shell
(the worker's side through a stand-in ssh that runs it here), leaves the folders exactly as the converging operations
want them, so the next run's facts find nothing to do; and the markers written on the Spark are the facts' own."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest
from harness import run_fact, run_op, unwrap_progress, with_args
from settings_factory import make_settings

from operations.data import background as bg
from operations.data import copy as data_copy
from operations.data.weights import rank_file_written, token_map_written
from operations.facts.done import RankFileWhole, TokenMapWhole
from operations.facts.files import DiskFree, FolderCheck
from operations.facts.model import HfPlan
from operations.remote.folder_marker import marker_digest
from operations.remote.stream_runner import script_text
from operations.util.listing import listing_digest

STUB_SSH = """#!/bin/sh
# The head's ssh to the worker, standing in: drops the options and the target, runs the command here.
while [ "$1" = "-o" ]; do shift 2; done
shift
exec sh -c "$*"
"""


def run(commands: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(STUB_SSH)
    (bin_dir / "ssh").chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-ec", "\n".join(commands)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def tables(folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in (("m-47.safetensors", 3000), ("m-48.safetensors", 5000)):
        (folder / name).write_bytes(os.urandom(size))
    return ["m-47.safetensors", "m-48.safetensors"]


def folder_check(folder: Path, sums: str, marker: str) -> dict:
    """The FolderCheck fact, read for real from the folder, as an operation under test asks for it."""
    read = run_fact(FolderCheck, path=str(folder), sums=sums, marker=marker)
    return {FolderCheck: with_args({f"marker={marker}, path={folder}, sums={sums}": read})}


def test_the_marker_is_the_digest_the_facts_compare(tmp_path):
    names = tables(tmp_path / "t")
    subprocess.run("sha256sum -- m-47.safetensors ./m-48.safetensors > SHA256SUMS", shell=True, cwd=tmp_path / "t",
                   check=True)
    check = run_fact(FolderCheck, path=str(tmp_path / "t"), sums="SHA256SUMS", marker="m")
    assert marker_digest(str(tmp_path / "t"), sums="SHA256SUMS") == \
        listing_digest(check["files"], check["names"], check["sums_sha"])
    assert marker_digest(str(tmp_path / "t"), names=names) == listing_digest(check["files"], names)


def test_a_fresh_hashing_leaves_the_list_current(tmp_path):
    folder = tmp_path / "engram"
    names = tables(folder)
    run(bg.sums_commands(str(folder), "the Engram tables", 8000, names=names, every=10), tmp_path)
    assert run_op(data_copy.checksums_written, folder_check(folder, "SHA256SUMS", data_copy.SUMS_STATE),
                  folder=str(folder), files=names, every=10)[0] == []
    again = run(bg.sums_commands(str(folder), "the Engram tables", 8000, names=names, every=10), tmp_path)
    assert again.stdout.strip() == "the Engram tables: SHA256SUMS is current"  # a resumed stream hashes nothing
    listed = (folder / "SHA256SUMS").read_text().split()
    assert listed[1::2] == names and listed[0] == hashlib.sha256((folder / names[0]).read_bytes()).hexdigest()


def test_a_fresh_hashing_of_a_weight_file_names_it_by_its_glob(tmp_path):
    folder = tmp_path / "rank1"
    folder.mkdir()
    (folder / "rank1of2-0123abcd.bin").write_bytes(os.urandom(4096))
    run(bg.sums_commands(str(folder), "rank 1's weight file", 4096, glob="rank1of2-*.bin", every=10), tmp_path)
    assert run_op(data_copy.checksums_written, folder_check(folder, "SHA256SUMS", data_copy.SUMS_STATE),
                  folder=str(folder), files=["rank1of2-0123abcd.bin"], every=10)[0] == []


def test_the_check_on_the_worker_leaves_it_verified_and_a_bad_copy_fails(tmp_path):
    folder = tmp_path / "worker" / "engram"
    names = tables(folder)
    subprocess.run(["sh", "-c", f"sha256sum -- {' '.join(names)} > SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS"
                    " && touch SHA256SUMS.tmp"], cwd=folder, check=True)  # a half-sent list from the copy
    done = run(bg.verified_on_worker("nvidia@w", str(folder), "SHA256SUMS", "the Engram tables", 8000,
                                     every=10), tmp_path)
    assert "the Engram tables: checking SHA256SUMS: done in" in done.stdout
    assert not (folder / "SHA256SUMS.tmp").exists()
    assert run_op(data_copy.folder_verified, folder_check(folder, "SHA256SUMS", data_copy.MARKER),
                  folder=str(folder), sums="SHA256SUMS", what="the Engram tables", every=10)[0] == []
    again = run(bg.verified_on_worker("nvidia@w", str(folder), "SHA256SUMS", "the Engram tables", 8000,
                                      every=10), tmp_path)
    assert again.stdout.strip() == "the Engram tables on the worker: verified already"  # a resumed stream
    marker = (folder / data_copy.MARKER).read_text()
    (folder / names[0]).write_bytes(os.urandom(3000))  # a copy gone wrong: other bytes, another mtime
    os.utime(folder / names[0], (1700000000, 1700000000))
    bad = subprocess.run(["sh", "-ec", "\n".join(bg.verified_on_worker("nvidia@w", str(folder), "SHA256SUMS",
                                                                       "the Engram tables", 8000, every=10))],
                         capture_output=True, text=True, env={**os.environ, "PATH": f"{tmp_path / 'bin'}:"
                                                              f"{os.environ['PATH']}"})
    assert bad.returncode != 0 and "does not match SHA256SUMS" in bad.stderr  # the stream runs with sh -e
    assert (folder / data_copy.MARKER).read_text() == marker  # no marker for a copy that failed its check
    assert not (folder / names[0]).exists() and (folder / names[1]).exists()  # the next run copies it again


def planted_links(folder: Path, marker: str, outside: Path) -> None:
    """What a client of the worker's copy daemon could leave in a copied folder: the marker and its old temporary
    name as symlinks to files outside (a folder of the ssh user's, or a root-owned file)."""
    outside.mkdir(exist_ok=True)
    for name in (marker, f"{marker}.tmp"):
        (outside / name).write_text("not sparkfold's\n")
        (folder / name).symlink_to(outside / name)


def assert_marker_written_in_place(folder: Path, marker: str, outside: Path) -> None:
    assert [p.read_text() for p in sorted(outside.iterdir())] == ["not sparkfold's\n"] * 2  # nothing written through
    assert not (folder / marker).is_symlink() and (folder / marker).read_text().strip()


def test_the_worker_s_marker_is_never_written_through_a_planted_link(tmp_path):
    folder, outside = tmp_path / "worker" / "engram", tmp_path / "outside"
    names = tables(folder)
    subprocess.run(["sh", "-c", f"sha256sum -- {' '.join(names)} > SHA256SUMS"], cwd=folder, check=True)
    planted_links(folder, data_copy.MARKER, outside)
    run(bg.verified_on_worker("nvidia@w", str(folder), "SHA256SUMS", "the Engram tables", 8000, every=10), tmp_path)
    assert_marker_written_in_place(folder, data_copy.MARKER, outside)


def test_the_verification_s_marker_is_never_written_through_a_planted_link(tmp_path):
    folder, outside = tmp_path / "worker" / "kit", tmp_path / "outside"
    names = tables(folder)
    subprocess.run(["sh", "-c", f"sha256sum -- {' '.join(names)} > SHA256SUMS"], cwd=folder, check=True)
    planted_links(folder, data_copy.MARKER, outside)
    (commands, _) = run_op(data_copy.folder_verified, folder_check(folder, "SHA256SUMS", data_copy.MARKER),
                           folder=str(folder), sums="SHA256SUMS", what="the kit", every=10)
    run([str(commands[-1])], tmp_path)  # the marker's write (the check before it is tested on its own)
    assert_marker_written_in_place(folder, data_copy.MARKER, outside)


def test_a_step_that_fails_inside_a_list_ends_the_stream(tmp_path):
    """unless's and sums_commands's steps are whole commands of the stream's script: one failing inside a list
    (`cd x && ...`) ends the stream, as it ends a pyinfra operation."""
    script = script_text([*bg.unless("false", "done already", ["cd /nonexistent && true", "echo never"]), "echo after"])
    done = subprocess.run(["sh", "-e", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "never" not in done.stdout and "after" not in done.stdout
    folder = tmp_path / "gone"
    script = script_text([*bg.sums_commands(str(folder), "the tables", 0, names=["a"], every=10), "echo after"])
    done = subprocess.run(["sh", "-e", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "after" not in done.stdout


def test_a_copy_never_sends_a_list_being_written():
    commands = bg.copy_commands("/d/engram", "nvidia@w", "/w/engram", "the Engram tables", 10, every=10)
    assert len(commands) == 1
    assert "--rsync-option=--exclude=SHA256SUMS.tmp" in commands[0]
    assert "--rsync-option=--exclude=.sparkfold-sums.state.tmp" in commands[0]


def test_on_worker_quotes_the_whole_command():
    assert bg.on_worker("nvidia@w", "cd '/a b' && ls").endswith(" nvidia@w 'cd '\"'\"'/a b'\"'\"' && ls'")


# --- the streams declared ---


@pytest.fixture
def declared(monkeypatch):
    seen = {}

    def background(stream, name, upstream=(), work=()):
        seen[stream.name] = {"stream": stream, "name": name, "upstream": list(upstream), "work": list(work)}
        return stream.name

    monkeypatch.setattr(bg, "background", background)
    return seen


def settings(**over):
    return make_settings("head", home="/home/n", **{"model_repo": "Org/M", **over})


def test_the_weight_files_fail_plainly_without_a_commit(declared):
    bg.weight_streams(settings(), "checkpoint", {"commit": None, "total_bytes": None}, "img:1")
    for name in ("token-map", "rank1", "rank0"):
        (command,) = declared[name]["stream"].commands
        assert "named no commit when the run began" in command and command.endswith("exit 1")


def test_the_weight_files_of_a_commit(declared):
    commit = "c" * 40
    bg.weight_streams(settings(), "checkpoint", {"commit": commit, "total_bytes": 2 * 10**9}, "img:1")
    (rank1,) = declared["rank1"]["stream"].commands  # one step: the `if`, each command a step of its own, `fi`
    lines = rank1.splitlines()
    folder = f"/home/n/.cache/sparkfold/rank-cache/{commit}/rank1"
    assert lines[0].startswith("if ") and lines[0].endswith("then echo 'rank 1'\"'\"'s weight file is current'; else")
    assert lines[1] == "( set +e" and "df -P -k" in lines[2] and "sparkfold: free disk: " in lines[2]  # disk first
    assert lines[4:6] == ["( set +e", f"mkdir -p {folder} && rm -f {folder}/rank1of2-*.bin {folder}/.rank1of2.partial "
                          f"{folder}/.sparkfold-source {folder}/SHA256SUMS {folder}/.sparkfold-sums.state"]
    assert lines[-4:] == ["( set +e", f"printf '%s\\n' {commit} > {folder}/.sparkfold-source", ") || exit $?", "fi"]
    copy = declared["rank1-to-worker"]["stream"].commands
    assert copy[-1].endswith(f"'ln -sfn {commit}/rank1 /home/n/.cache/sparkfold/rank-cache/active-rank1'")
    checked = declared["rank1-checked"]["stream"].commands
    assert any("checking SHA256SUMS" in c and f"rank-cache/{commit}/rank1" in c for c in checked)
    op, arguments = declared["rank1-sums"]["work"][0]
    assert op is bg.rank_sums_written and (arguments["rank"], arguments["ablit_tag"]) == (1, "")


def test_the_checked_streams_copy_has_lines_of_its_own(declared):
    # the copy's lines are the copy's: the second pass (the list, and what changed since) says what it sends and
    # names no total, as the folder may hold more than was planned ("24 MiB already there of 19 KiB")
    bg.engram_streams(settings(), "engram", 19 * 1024)
    label, _, options = unwrap_progress(declared["engram-to-worker"]["stream"].commands[0])
    assert label == "the Engram tables to the worker" and options[options.index("--total") + 1] == str(19 * 1024)
    label, _, options = unwrap_progress(declared["engram-checked"]["stream"].commands[0])
    assert label == "the Engram tables: SHA256SUMS to the worker" and "--total" not in options
    assert any("the Engram tables: checking SHA256SUMS" in c for c in declared["engram-checked"]["stream"].commands)


def stand_in(tmp_path, name: str, script: str) -> dict:
    """The environment with a stand-in `name` first on PATH (the stand-ins made before it stay there)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / name).write_text("#!/bin/sh\n" + script)
    (bindir / name).chmod(0o755)
    return dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")


def free_disk(tmp_path, free_bytes: int) -> dict:
    """A stand-in df -P -k that reports `free_bytes` free wherever it is asked."""
    return stand_in(tmp_path, "df", "echo 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
                                    f"echo '/dev/x 999999999 1 {free_bytes // 1024} 1% /'\n")


NO_DOCKER = "echo 'docker: stand-in: not run here' >&2; exit 3\n"  # a stream that writes fails here, visibly
PLAN_ARGS = {"repo": "Org/M", "revision": "main"}


def rank_stream(folder, total=2 * 2**30) -> str:
    (command,) = bg.rank_file_stream("img:1", 1, str(folder), ("/h", "/hf", True), "/hf/m", total, "c1", every=10)
    return command


@pytest.mark.parametrize("files, whole", [
    ({"rank1of2-0123abcd.bin": b"w", ".sparkfold-source": b"c1\n"}, True),  # done
    ({}, False),  # missing
    ({".sparkfold-source": b"c1\n"}, False),  # the sidecar alone
    ({"rank1of2-0123abcd.bin": b"w", ".sparkfold-source": b"c0\n"}, False),  # stale: made from another checkpoint
    ({"rank1of2-0123abcd.bin": b"w", ".rank1of2.partial": b"p", ".sparkfold-source": b"c1\n"}, False),  # interrupted
    ({"rank1of2-0123abcd.bin": b"w", "rank1of2-4567abcd.bin": b"w", ".sparkfold-source": b"c1\n"}, False),
])
def test_the_run_and_the_stream_agree_on_a_whole_weight_file(tmp_path, files, whole):
    folder = tmp_path / "c1" / "rank1"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    fact = run_fact(RankFileWhole, folder=str(folder), rank=1, source="c1")
    commands, _ = run_op(rank_file_written, {HfPlan: {"complete": True, "commit": "c1", "total_bytes": 2**20},
                                             RankFileWhole: fact, DiskFree: {"free_bytes": 2**40}},
                         image_ref="img:1", rank=1, plan_args=PLAN_ARGS, hf_cache="/h", rank_cache=str(tmp_path),
                         every=10)
    assert fact is whole and (commands == []) is whole
    streamed = subprocess.run(["sh", "-c", rank_stream(folder)], capture_output=True, text=True,
                              env=stand_in(tmp_path, "docker", NO_DOCKER))
    assert (streamed.returncode == 0 and "weight file is current" in streamed.stdout) is whole, streamed.stderr


@pytest.mark.parametrize("files, whole", [
    ({"dsv41_token_map.json": "{}", "dsv41_token_map.json.commit": "c1\n"}, True),  # done
    ({}, False),  # missing
    ({"dsv41_token_map.json": "{}", "dsv41_token_map.json.commit": "c0\n"}, False),  # stale: another checkpoint
    ({"dsv41_token_map.json": "{}"}, False),  # interrupted: the sidecar is written last
    ({"dsv41_token_map.json.commit": "c1\n"}, False),
])
def test_the_run_and_the_stream_agree_on_a_whole_token_map(tmp_path, declared, files, whole):
    s = make_settings("head", home=str(tmp_path), model_repo="Org/M")
    out = Path(s.layout.token_map_dir)
    out.mkdir(parents=True)
    for name, text in files.items():
        (out / name).write_text(text)
    fact = run_fact(TokenMapWhole, out_dir=str(out), commit="c1")
    commands, _ = run_op(token_map_written, {HfPlan: {"complete": True, "commit": "c1"}, TokenMapWhole: fact},
                         image_ref="img:1", plan_args=PLAN_ARGS, hf_cache="/h", out_dir=str(out))
    assert fact is whole and (commands == []) is whole
    bg.weight_streams(s, "checkpoint", {"commit": "c1", "total_bytes": 2**20}, "img:1")
    (command,) = declared["token-map"]["stream"].commands
    streamed = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                              env=stand_in(tmp_path, "docker", NO_DOCKER))
    assert (streamed.returncode == 0 and "the token map is current" in streamed.stdout) is whole, streamed.stderr


def test_the_stream_refuses_a_weight_file_on_a_small_disk_as_the_run_does(tmp_path):
    folder = tmp_path / "rc" / "c1" / "rank1"
    folder.mkdir(parents=True)
    (folder / "rank1of2-0123abcd.bin").write_bytes(b"w")  # stale: the check comes before anything is cleared
    (folder / ".sparkfold-source").write_bytes(b"c0\n")
    total, free = 200 * 2**30, 50 * 2**30
    stand_in(tmp_path, "docker", NO_DOCKER)
    streamed = subprocess.run(["sh", "-c", rank_stream(folder, total)], capture_output=True, text=True,
                              env=free_disk(tmp_path, free))
    commands, _ = run_op(rank_file_written, {HfPlan: {"complete": True, "commit": "c1", "total_bytes": total},
                                             RankFileWhole: False, DiskFree: {"free_bytes": free}},
                         executing=True, image_ref="img:1", rank=1, plan_args=PLAN_ARGS, hf_cache="/h",
                         rank_cache=str(tmp_path / "rc"), every=10)
    (refusal,) = commands
    said = subprocess.run(["sh", "-c", refusal], capture_output=True, text=True).stderr
    assert streamed.returncode != 0 and streamed.stderr == said  # the run's own message, naming the fix
    assert "weight file needs 105.0 GiB free" in said and "point data_dir/hf_cache at a larger disk" in said
    assert sorted(os.listdir(folder)) == [".sparkfold-source", "rank1of2-0123abcd.bin"]  # nothing cleared or written


def test_the_stream_writes_a_weight_file_when_the_disk_has_room(tmp_path):
    folder = tmp_path / "rc" / "c1" / "rank1"
    folder.mkdir(parents=True)
    (folder / ".sparkfold-source").write_bytes(b"c0\n")
    stand_in(tmp_path, "docker", NO_DOCKER)
    streamed = subprocess.run(["sh", "-c", rank_stream(folder, 200 * 2**30)], capture_output=True, text=True,
                              env=free_disk(tmp_path, 106 * 2**30))
    assert "free disk" not in streamed.stderr and "stand-in: not run here" in streamed.stderr  # it went on to write
    assert not (folder / ".sparkfold-source").exists()  # the stale folder was cleared first


@pytest.mark.parametrize("need, free", [(105 * 2**30, 50 * 2**30), (90 * 2**20, 30 * 2**20), (2**30, 2**30 - 2**20)])
def test_the_streams_disk_check_says_what_space_problem_says(tmp_path, need, free):
    checked = subprocess.run(["sh", "-c", data_copy.space_check("/d/x", need, "it")], capture_output=True, text=True,
                             env=free_disk(tmp_path, free))
    assert checked.returncode == 1
    assert checked.stderr == f"sparkfold: free disk: {data_copy.space_problem(free, need, '/d/x', 'it')}\n"
    enough = subprocess.run(["sh", "-c", data_copy.space_check("/d/x", free, "it")], env=free_disk(tmp_path, free))
    assert enough.returncode == 0
