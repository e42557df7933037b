"""verify_data (issue 27, data at rest): a file that rots in place keeps its size and mtime, so the markers and the
copies never see it; a run with verify_data on hashes every verified folder again (markers ignored), removes what
differs, copies it again, and records when each Spark's data was last verified. Run for real in a local shell, the
worker's side through test_background_data's stand-in ssh."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from harness import run_op
from settings_factory import load_one, make_pair, make_settings
from test_background_data import folder_check, run, tables

from operations.data import background as bg
from operations.data import copy as data_copy
from operations.data import verified_record
from operations.settings.rules import validate_pair

WHAT = "the Engram tables"


def rot_in_place(path: Path) -> None:
    """One byte flipped, the size and the mtime kept: what neither a marker nor rsync's quick check can see."""
    times = os.stat(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))


def verified_copy(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """The head's folder with its list, and the worker's copy of it verified (its marker current)."""
    head, worker = tmp_path / "head" / "engram", tmp_path / "worker" / "engram"
    names = tables(head)
    subprocess.run(["sh", "-c", f"sha256sum -- {' '.join(names)} > SHA256SUMS"], cwd=head, check=True)
    worker.parent.mkdir(parents=True)
    subprocess.run(["cp", "-a", str(head), str(worker)], check=True)
    run(bg.verified_on_worker("nvidia@w", str(worker), "SHA256SUMS", WHAT, 8000, every=10), tmp_path)
    return head, worker, names


def copy_back(head: Path, worker: Path) -> str:
    """The copy's part, standing in for rsync's quick check: what is missing on the worker is sent."""
    return f"cd {head} && for f in *; do [ -e {worker}/$f ] || cp -p $f {worker}/$f; done"


def test_without_verify_data_a_file_rotten_in_place_is_trusted(tmp_path):
    """The fast path, as it was: the marker is current for the rotten file, so nothing hashes it."""
    _head, worker, names = verified_copy(tmp_path)
    rot_in_place(worker / names[0])
    done = run(bg.verified_on_worker("nvidia@w", str(worker), "SHA256SUMS", WHAT, 8000, every=10), tmp_path)
    assert done.stdout.strip() == f"{WHAT} on the worker: verified already"
    assert run_op(data_copy.folder_verified, folder_check(worker, "SHA256SUMS", data_copy.MARKER),
                  folder=str(worker), sums="SHA256SUMS", what=WHAT, every=10)[0] == []


def test_verify_data_removes_a_rotten_file_on_the_worker_and_the_copy_repairs_it(tmp_path):
    head, worker, names = verified_copy(tmp_path)
    good = (head / names[0]).read_bytes()
    rot_in_place(worker / names[0])
    commands = [*bg.reverified_on_worker("nvidia@w", str(worker), "SHA256SUMS", WHAT, 8000, every=10),
                copy_back(head, worker),
                *bg.verified_on_worker("nvidia@w", str(worker), "SHA256SUMS", WHAT, 8000, every=10)]
    done = run(commands, tmp_path)
    assert f"removed {names[0]} (it does not match)" in done.stdout + done.stderr
    assert f"sparkfold: {WHAT} on the worker: repairing what differs" in done.stdout
    assert f"{WHAT}: checking SHA256SUMS: done in" in done.stdout  # the check after the copy proved the repair
    assert (worker / names[0]).read_bytes() == good
    assert run_op(data_copy.folder_verified, folder_check(worker, "SHA256SUMS", data_copy.MARKER),
                  folder=str(worker), sums="SHA256SUMS", what=WHAT, every=10)[0] == []  # the next run finds it verified


def test_verify_data_on_a_sound_copy_hashes_once_and_removes_nothing(tmp_path):
    head, worker, names = verified_copy(tmp_path)
    commands = [*bg.reverified_on_worker("nvidia@w", str(worker), "SHA256SUMS", WHAT, 8000, every=10),
                copy_back(head, worker),
                *bg.verified_on_worker("nvidia@w", str(worker), "SHA256SUMS", WHAT, 8000, every=10)]
    done = run(commands, tmp_path)
    assert "removed" not in done.stdout and "repairing" not in done.stdout
    assert f"{WHAT} (verify_data): checking SHA256SUMS: done in" in done.stdout
    assert done.stdout.count("checking SHA256SUMS: done in") == 1  # the marker it wrote spares the second check
    assert sorted(p.name for p in worker.iterdir() if not p.name.startswith(".")) == sorted([*names, "SHA256SUMS"])


def test_verify_data_on_the_head_removes_a_rotten_file_and_stops_saying_what_to_do(tmp_path):
    head, _worker, names = verified_copy(tmp_path)
    rot_in_place(head / names[1])
    bad = subprocess.run(["sh", "-ec", "\n".join(bg.reverified_here(str(head), "SHA256SUMS", WHAT, 8000, every=10))],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "run the deploy again to download or write them again" in bad.stderr
    assert not (head / names[1]).exists() and (head / names[0]).exists()
    assert not (head / data_copy.MARKER).exists()


def captured_streams(monkeypatch, **settings) -> dict[str, dict]:
    """The streams the head's Engram part declares, by name, with background's arguments."""
    found: dict[str, dict] = {}
    monkeypatch.setattr(bg, "background", lambda stream, **kw: found.setdefault(stream.name, {"stream": stream, **kw}))
    bg.engram_streams(make_settings("head", **settings), download=None, total=8000)  # type: ignore[arg-type]
    return found


def test_the_checked_stream_ignores_the_markers_only_with_verify_data(monkeypatch):
    plain = captured_streams(monkeypatch)
    assert "engram-reverify" not in plain
    assert plain["engram-checked"].get("work") == ()  # started only when its copy or list changes
    assert "verify_data" not in plain["engram-checked"]["name"]
    asked = captured_streams(monkeypatch, verify_data=True)
    (op, args), = asked["engram-checked"]["work"]
    assert op is bg.verification_asked and args["commands"] == asked["engram-checked"]["stream"].commands
    first = args["commands"][0]
    assert re.search(rf"rm -f \S+/engram/{re.escape(data_copy.MARKER)} ", first)  # the marker is not trusted
    assert list(run_op(bg.verification_asked, {}, commands=args["commands"])[0]) == list(args["commands"])
    (op, args), = asked["engram-reverify"]["work"]  # the head's own copy, hashed again too
    assert args["commands"][0].startswith("rm -f ") and "sha256sum -c" in args["commands"][1]


def test_folder_verified_hashes_again_whatever_the_marker_says(tmp_path):
    _head, worker, _names = verified_copy(tmp_path)
    facts = folder_check(worker, "SHA256SUMS", data_copy.MARKER)
    assert run_op(data_copy.folder_verified, facts, folder=str(worker), sums="SHA256SUMS", what=WHAT, every=10)[0] == []
    again = run_op(data_copy.folder_verified, facts, folder=str(worker), sums="SHA256SUMS", what=WHAT, again=True,
                   every=10)[0]
    assert len(again) == 2 and "sha256sum -c --quiet" in again[0]


def test_the_record_holds_the_time_and_status_words_it(tmp_path):
    path = str(tmp_path / verified_record.RECORD)
    subprocess.run(["sh", "-ec", verified_record.record_command(path)], check=True)
    at = verified_record.verified_at(Path(path).read_text())
    assert at and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", at)
    assert verified_record.verified_note(Path(path).read_text()) == \
        f"data last verified in full {at} (again: --data verify_data=true)"
    assert verified_record.verified_note(None).startswith("data never verified in full")
    assert verified_record.verified_note("garbage\n").startswith("data never verified in full")


def test_verify_data_is_off_unless_one_run_asks_and_the_pair_must_agree():
    assert load_one("head")[0].verify_data is False
    assert load_one("head", {"SPARKFOLD_VERIFY_DATA": "1"})[0].verify_data is True
    assert load_one("head", verify_data=True)[0].verify_data is True  # --data verify_data=true
    problems = validate_pair(*make_pair(head={"verify_data": True}))
    assert any("verify_data" in p for p in problems), problems
