"""API key: the fact (stat only), the operation both ways, the generation command run for real in a temp dir,
rotation, and the deploy function."""

from __future__ import annotations

import os
import re
import stat
import subprocess

from harness import FakeHost, parse_fact, run_op, with_args
from pyinfra.context import ctx_host
from settings_factory import make_settings

import operations.api_key as ak
from operations.facts.files import ApiKeyFile

PATH = "/home/nvidia/.local/state/sparkfold/api-key.d/key"
LEGACY = "/home/nvidia/.local/state/sparkfold/api-key"


def facts(value):
    return {ApiKeyFile: with_args({f"path={PATH}": value})}


def present(mode="600", owner="nvidia"):
    return {"present": True, "empty": False, "mode": mode, "owner": owner}


MISSING = ApiKeyFile.default()


def test_fact_parses_stat_output_and_never_reads_the_key():
    assert parse_fact(ApiKeyFile, "#FILE 600 nvidia nvidia 65") == present()
    assert parse_fact(ApiKeyFile, "#FILE 644 root root 0") == {"present": False, "empty": True, "mode": "644",
                                                              "owner": "root"}
    assert parse_fact(ApiKeyFile, "#FILE ") == MISSING  # stat could not read it
    assert parse_fact(ApiKeyFile, "") == MISSING
    command = ApiKeyFile().command(PATH)
    assert "stat -L -c" in command and not any(reader in command for reader in ("cat", "<", "base64", "sum", "head"))


def test_fact_command_on_real_files(tmp_path):
    key = tmp_path / "api-key"
    run = lambda: parse_fact(ApiKeyFile, subprocess.run(["sh", "-c", ApiKeyFile().command(str(key))],  # noqa: E731
                                                        capture_output=True, text=True, check=True).stdout)
    assert run() == MISSING
    key.write_text("")
    assert run()["empty"] is True
    key.write_text("abc\n")
    key.chmod(0o640)
    got = run()
    assert got["present"] and got["mode"] == "640" and got["owner"]


def test_converged_key_file_yields_nothing():
    commands, host = run_op(ak.api_key_present, facts(present()), path=PATH, owner="nvidia")
    assert commands == [] and host.noops


def test_missing_key_is_generated_on_the_head_under_umask_077():
    commands, _ = run_op(ak.api_key_present, facts(MISSING), path=PATH, owner="nvidia")
    assert len(commands) == 1
    cmd = commands[0]
    assert cmd.startswith("umask 077 && mkdir -p /home/nvidia/.local/state/sparkfold/api-key.d &&")
    assert "secrets.token_hex(32)" in cmd
    assert f"[ -s {PATH} ] || " in cmd  # never overwrites a key that appeared meanwhile
    assert not re.search(r"[0-9a-f]{64}", cmd)  # no key on the controller's command line


def test_wrong_mode_or_owner_is_fixed_without_a_new_key():
    commands, _ = run_op(ak.api_key_present, facts(present(mode="644")), path=PATH, owner="nvidia")
    assert commands == [f"chmod 600 {PATH}"]
    commands, _ = run_op(ak.api_key_present, facts(present(owner="root")), path=PATH, owner="nvidia")
    assert commands == [f"chown nvidia {PATH}"]


def test_rotation_replaces_the_key_even_when_present():
    commands, _ = run_op(ak.api_key_present, facts(present()), path=PATH, owner="nvidia", rotate=True)
    assert len(commands) == 1 and "token_hex" in commands[0] and f"[ -s {PATH} ] ||" not in commands[0]


def _sh(command):
    subprocess.run(["sh", "-c", command], check=True)


def test_generation_command_for_real(tmp_path):
    path = str(tmp_path / "state" / "api-key")
    commands, _ = run_op(ak.api_key_present, {ApiKeyFile: with_args({f"path={path}": MISSING})}, path=path,
                         owner="x")
    _sh(commands[0])
    key = open(path).read().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not os.path.exists(path + ".new")
    _sh(commands[0])  # run again (stale plan): the key stays
    assert open(path).read().strip() == key

    inode = os.stat(path).st_ino
    rotate, _ = run_op(ak.api_key_present, {ApiKeyFile: with_args({f"path={path}": present(owner="x")})}, path=path,
                       owner="x", rotate=True)
    assert " > " not in rotate[0].split("mv -f")[1]  # the key file itself is never truncated or written in place
    _sh(rotate[0])
    new = open(path).read().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", new) and new != key
    assert os.stat(path).st_ino != inode  # a new file renamed over the old one: readers see the old or the new key
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and not os.path.exists(path + ".new")


def test_rotation_is_atomic_for_a_reader(tmp_path):
    """A reader polling the file while keys rotate sees a whole key every time (the engine closes its authenticated
    routes on an empty or partial file)."""
    path = str(tmp_path / "api-key.d" / "key")
    rotate, _ = run_op(ak.api_key_present, {ApiKeyFile: with_args({f"path={path}": MISSING})}, path=path, owner="x",
                       rotate=True)
    _sh(rotate[0])
    reader = subprocess.Popen(["sh", "-c", f"for i in $(seq 800); do cat {path}; echo .; done"],
                              stdout=subprocess.PIPE, text=True)
    for _ in range(15):
        _sh(rotate[0])
    seen = reader.communicate(timeout=60)[0].split(".\n")[:-1]
    assert len(seen) == 800
    assert all(re.fullmatch(r"[0-9a-f]{64}\n", key) for key in seen), [k for k in seen if len(k) != 65][:3]


def test_a_key_in_the_old_place_is_moved_into_the_mounted_folder(tmp_path):
    legacy, path = str(tmp_path / "api-key"), str(tmp_path / "api-key.d" / "key")
    with open(legacy, "w") as f:
        f.write("a" * 64 + "\n")
    os.chmod(legacy, 0o600)
    table = {f"path={path}": MISSING, f"path={legacy}": present(owner="x")}
    commands, _ = run_op(ak.api_key_present, {ApiKeyFile: with_args(table)}, path=path, owner="x", legacy=legacy)
    assert len(commands) == 1 and "mv -n" in commands[0] and "token_hex" not in commands[0]
    _sh(commands[0])
    assert open(path).read() == "a" * 64 + "\n" and not os.path.exists(legacy)
    # converged: the new place holds it, the old one is not looked at again
    commands, _ = run_op(ak.api_key_present, {ApiKeyFile: with_args({f"path={path}": present(owner="x")})},
                         path=path, owner="x", legacy=legacy)
    assert commands == []


def test_path_and_live_hint_never_show_the_key():
    s = make_settings("head", api_key=True)
    assert ak.api_key_path(s) == PATH
    assert PATH in ak.live_hint(s)
    assert "open" in ak.live_hint(make_settings("head", api_key=False))


def test_deploy_only_on_the_head_with_api_key(monkeypatch):
    calls = []
    monkeypatch.setattr(ak, "api_key_present", lambda **kw: calls.append(kw))
    monkeypatch.setattr(ak, "owned_folders", lambda **kw: None)  # the key's folder: tests/unit/test_folders.py
    with ctx_host.use(FakeHost({})):  # the open API's warning names the Spark
        ak.api_key._inner(make_settings("head", api_key=True))
        assert calls == [{"name": f"API key present in {PATH} (head only)", "path": PATH, "owner": "nvidia",
                          "rotate": False, "legacy": LEGACY}]
        calls.clear()
        ak.api_key._inner(make_settings("head", api_key=True, rotate_api_key=True))
        assert calls[0]["rotate"] is True
        calls.clear()
        ak.api_key._inner(make_settings("head", api_key=False))
        ak.api_key._inner(make_settings("worker", api_key=True))
        assert calls == []


def test_an_open_api_is_said_plainly_with_the_fix(caplog):
    from operations.rank import serving as health
    open_head = make_settings("head")  # the recipe's default: 0.0.0.0, no key
    note = health.open_api_note(open_head)
    assert "no key and listens on 0.0.0.0:8888" in note and "SPARKFOLD_API_KEY=1" in note
    assert health.open_api_note(make_settings("head", api_key=True)) == ""
    assert health.open_api_note(make_settings("head", host="127.0.0.1")) == ""
    assert any(note in line for line in health.live_lines("M", 8888, "http://x:8888", "", note))
    calls = []
    with caplog.at_level("WARNING", logger="pyinfra"), ctx_host.use(FakeHost({}, name="spark-1")):
        from unittest import mock
        with mock.patch.object(ak, "api_key_present", lambda **kw: calls.append(kw)):
            ak.api_key._inner(open_head)
    assert f"spark-1: warning: API key: {note}" in caplog.text and calls == []
