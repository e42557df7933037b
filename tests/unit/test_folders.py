"""The folders sparkfold owns: the operation both ways (on real folders through pyinfra's Directory fact), a chown
only as root, a symlink to a folder followed, a file in the way refused; which folders each Spark converges, and the
API key's folder in its own step."""

from __future__ import annotations

import getpass
import os
import stat
import subprocess

from harness import FakeHost, _State, run_fact, run_op, with_args
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import Directory
from settings_factory import make_settings

from operations import folders
from operations.owned import folders as owned

ME = getpass.getuser()


def facts(*entries):
    return {Directory: with_args({f"path={path}": value for path, value in entries})}


def converge(path: str, mode: str) -> list[str]:
    """The commands for a real folder, read with the real fact, then run."""
    info = run_fact(Directory, path=path)
    commands, _ = run_op(owned.owned_folder, facts((path, info)), path=path, owner=ME, mode=mode)
    for command in commands:
        subprocess.run(["sh", "-c", command], check=True)
    return commands


def test_a_folder_chmod_644_gets_its_mode_back_and_a_right_one_is_left_alone(tmp_path):
    keys = tmp_path / "api-key.d"
    keys.mkdir(mode=0o700)
    keys.chmod(0o644)  # what broke every later key write
    assert converge(str(keys), "700") == [f"chmod 700 {keys}"]
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    info = run_fact(Directory, path=str(keys))
    commands, host = run_op(owned.owned_folder, facts((str(keys), info)), path=str(keys), owner=ME, mode="700")
    assert commands == [] and host.noops == [f"{keys} is {ME}'s, mode 700"]


def test_a_missing_folder_is_made_with_its_mode_whatever_the_umask(tmp_path):
    data = tmp_path / "data" / "engram"
    old = os.umask(0o077)
    try:
        assert converge(str(data), "755") == [f"mkdir -p {data} && chmod 755 {data}"]
    finally:
        os.umask(old)
    assert data.is_dir() and stat.S_IMODE(data.stat().st_mode) == 0o755
    assert converge(str(data), "755") == []


def test_another_owner_is_given_back_by_root_only():
    info = {"user": "root", "group": "root", "mode": 755}
    host = FakeHost(facts(("/d", info)))
    with ctx_state.use(_State(False)), ctx_host.use(host):
        commands = list(owned.owned_folder._inner(path="/d", owner="nvidia", mode="700"))
    assert [c.get_raw_value() for c in commands] == ["chown nvidia /d", "chmod 700 /d"]
    assert commands[0].connector_arguments.get("_sudo") is True and not commands[1].connector_arguments.get("_sudo")


def test_a_set_group_id_bit_is_kept_and_not_chmoded_every_run():
    info = {"user": "nvidia", "group": "team", "mode": 2755}
    commands, host = run_op(owned.owned_folder, facts(("/d", info)), path="/d", owner="nvidia", mode="755")
    assert commands == [] and host.noops


def test_a_link_to_a_folder_is_judged_by_the_folder_and_a_file_is_refused(tmp_path, caplog):
    big = tmp_path / "big-disk"
    big.mkdir(mode=0o700)
    data = tmp_path / "sparkfold"
    data.symlink_to(big)  # data_dir moved to a larger disk
    assert run_fact(Directory, path=str(data)) is False
    entries = facts((str(data), False), (f"{data}/", run_fact(Directory, path=f"{data}/")))
    commands, _ = run_op(owned.owned_folder, entries, path=str(data), owner=ME, mode="755")
    assert commands == [f"chmod 755 {data}"]
    subprocess.run(["sh", "-c", commands[0]], check=True)
    assert data.is_symlink() and stat.S_IMODE(big.stat().st_mode) == 0o755
    file = tmp_path / "state"
    file.write_text("someone's notes\n")
    entries = facts((str(file), False), (f"{file}/", run_fact(Directory, path=f"{file}/")))
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert run_op(owned.owned_folder, entries, path=str(file), owner=ME, mode="755")[0] == []
    assert f"will fail: sparkfold's folders: {file} exists and is not a folder" in caplog.text
    commands, _ = run_op(owned.owned_folder, entries, executing=True, path=str(file), owner=ME, mode="755")
    assert len(commands) == 1 and "exit 1" in commands[0] and "rm " not in commands[0] and "mv " not in commands[0]
    assert file.read_text() == "someone's notes\n"


def test_each_spark_converges_its_state_and_data_folders():
    head = make_settings("head", home="/home/n")
    both, own = folders.owned_folders(head)
    p = head.layout
    assert both == [(p.state_dir, "755"), (p.data_dir, "755"), (p.engram, "755"), (p.token_map_dir, "755"),
                    (p.rank_cache, "755"), (p.cache_root, "755"), (p.logs, "755")]
    assert [d for d, _ in own] == [p.kit_src, f"{p.kit}.d", f"{p.data_dir}/build"] + (
        [p.ablit, p.overlay] if head.ablit else [])
    assert p.kit not in [d for d, _ in both + own]  # the head's kit is a link sparkfold switches
    worker = make_settings("worker", home="/home/n")
    assert folders.owned_folders(worker)[1] == [(worker.layout.kit, "755")]


def test_the_deploy_step_calls_the_operation_once_per_folder(monkeypatch):
    calls = []
    monkeypatch.setattr(folders, "owned_folder", lambda **kw: calls.append(kw))
    s = make_settings("worker", home="/home/n")
    folders.folders._inner(s)
    both, own = folders.owned_folders(s)
    assert [(c["path"], c["mode"], c["owner"]) for c in calls] == [(d, m, s.ssh_user) for d, m in both + own]


def test_the_api_key_step_converges_its_folder_first(monkeypatch):
    import operations.api_key as ak

    calls = []
    monkeypatch.setattr(ak, "owned_folder", lambda **kw: calls.append(("folder", kw)))
    monkeypatch.setattr(ak, "api_key_present", lambda **kw: calls.append(("key", kw)))
    s = make_settings("head", api_key=True)
    ak.api_key._inner(s)
    assert [c[0] for c in calls] == ["folder", "key"]
    assert {k: calls[0][1][k] for k in ("path", "owner", "mode")} == {
        "path": s.layout.api_key_dir, "owner": s.ssh_user, "mode": "700"}
