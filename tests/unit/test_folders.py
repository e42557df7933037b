"""The folders sparkfold owns: the operation both ways (on real folders through pyinfra's Directory fact), a chown
only as root, a symlink to a folder followed, a file in the way refused; which folders each Spark converges, and the
API key's folder in its own step. Cases on scripted facts: tests/operations/owned.folders.owned_folders/."""

from __future__ import annotations

import getpass
import os
import stat
import subprocess

from harness import FakeHost, run_fact, run_op
from settings_factory import make_settings

from operations import folders
from operations.facts.files import FolderStates
from operations.owned import folders as owned

ME = getpass.getuser()


def converge(folders: tuple[tuple[str, str], ...], executing: bool = False) -> tuple[list[str], FakeHost]:
    """The commands for real folders, read with the real fact, then run."""
    states = run_fact(FolderStates, paths=tuple(path for path, _mode in folders))
    commands, host = run_op(owned.owned_folders, {FolderStates: states}, executing=executing, folders=folders, owner=ME)
    for command in commands:
        if "exit 1" not in command:
            subprocess.run(["sh", "-c", command], check=True)
    return commands, host


def test_a_folder_chmod_644_gets_its_mode_back_and_a_right_one_is_left_alone(tmp_path):
    keys = tmp_path / "api-key.d"
    keys.mkdir(mode=0o700)
    keys.chmod(0o644)  # what broke every later key write
    assert converge(((str(keys), "700"),))[0] == [f"chmod 700 {keys}"]
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    commands, host = converge(((str(keys), "700"),))
    assert commands == [] and host.noops == [f"1 folder(s) {ME}'s, with their modes"]


def test_a_missing_folder_is_made_with_its_mode_whatever_the_umask(tmp_path):
    data = tmp_path / "data" / "engram"
    old = os.umask(0o077)
    try:
        assert converge(((str(data), "755"),))[0] == [f"mkdir -p {data} && chmod 755 {data}"]
    finally:
        os.umask(old)
    assert data.is_dir() and stat.S_IMODE(data.stat().st_mode) == 0o755
    assert converge(((str(data), "755"),))[0] == []


def test_several_folders_are_read_in_one_round_trip(tmp_path):
    made = [tmp_path / name for name in ("state", "data", "logs")]
    commands, host = converge(tuple((str(path), "755") for path in made))
    assert len(commands) == 3 and all(path.is_dir() for path in made)
    assert [name for name, _kwargs in host.fact_calls] == ["operations.facts.files.FolderStates"]


def test_a_symlink_to_a_folder_is_judged_by_the_folder_and_a_file_is_refused(tmp_path, caplog):
    big = tmp_path / "big-disk"
    big.mkdir(mode=0o700)
    data = tmp_path / "sparkfold"
    data.symlink_to(big)  # data_dir moved to a larger disk
    assert converge(((str(data), "755"),))[0] == [f"chmod 755 {data}"]
    assert data.is_symlink() and stat.S_IMODE(big.stat().st_mode) == 0o755
    file = tmp_path / "state"
    file.write_text("someone's notes\n")
    missing = tmp_path / "logs"
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert converge(((str(missing), "755"), (str(file), "755")))[0] == []  # nothing made while one is refused
    assert f"will fail: sparkfold's folders: {file} exists and is not a folder" in caplog.text
    commands, _ = converge(((str(file), "755"),), executing=True)
    assert len(commands) == 1 and "exit 1" in commands[0] and "rm " not in commands[0] and "mv " not in commands[0]
    assert file.read_text() == "someone's notes\n" and not missing.exists()


def test_each_spark_converges_its_state_and_data_folders():
    head = make_settings("head", home="/home/n")
    both, own = folders.owned_folders(head)
    layout = head.layout
    assert both == [(layout.state_dir, "755"), (layout.data_dir, "755"), (layout.engram, "755"),
                    (layout.token_map_dir, "755"), (layout.rank_cache, "755"), (layout.cache_root, "755"),
                    (layout.logs, "755")]
    assert [d for d, _ in own] == [layout.kit_src, f"{layout.kit}.d", f"{layout.data_dir}/build"] + (
        [layout.ablit, layout.overlay] if head.ablit else [])
    assert layout.kit not in [d for d, _ in both + own]  # the head's kit is a symlink sparkfold switches
    worker = make_settings("worker", home="/home/n")
    assert folders.owned_folders(worker)[1] == [(worker.layout.kit, "755")]


def test_the_deploy_step_converges_every_folder_in_one_operation(monkeypatch):
    calls = []
    monkeypatch.setattr(folders, "owned_folders_op", lambda **kw: calls.append(kw))
    s = make_settings("worker", home="/home/n")
    folders.folders._inner(s)
    both, own = folders.owned_folders(s)
    assert len(calls) == 1 and calls[0]["folders"] == tuple(both + own) and calls[0]["owner"] == s.ssh_user


def test_the_api_key_step_converges_its_folder_first(monkeypatch):
    import operations.api_key as ak

    calls = []
    monkeypatch.setattr(ak, "owned_folders", lambda **kw: calls.append(("folder", kw)))
    monkeypatch.setattr(ak, "api_key_present", lambda **kw: calls.append(("key", kw)))
    s = make_settings("head", api_key=True)
    ak.api_key._inner(s)
    assert [c[0] for c in calls] == ["folder", "key"]
    assert (calls[0][1]["folders"], calls[0][1]["owner"]) == (((s.layout.api_key_dir, "700"),), s.ssh_user)
