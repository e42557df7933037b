"""API key: the fact (stat only), the generation command run for real in a temp dir, rotation, the deploy function,
and your own key (api_key_file): read and checked on this machine, uploaded, never shown. The operation on scripted
facts, both ways: tests/operations/api_key.api_key_present/."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
from harness import FakeHost, _State, parse_fact, run_fact, run_op, with_args
from pyinfra.api import FileUploadCommand
from pyinfra.context import ctx_host, ctx_state
from settings_factory import load_one, make_settings

import operations.api_key as ak
from operations.facts.files import ApiKeyFile, ApiKeyFileSum
from operations.settings import sources, validate

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
                          "rotate": False, "legacy": LEGACY, "key": ""}]
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


# ---- your own key: api_key_file ----

OWN = "my-own-key_0123456789abcdef"


def own_facts(value):
    return {ApiKeyFileSum: with_args({f"path={PATH}": value})}


def holding(key: str | None, mode="600", owner="nvidia"):
    digest = hashlib.sha256((key + "\n").encode()).hexdigest() if key is not None else None
    return {**present(mode, owner), "sha256": digest}


def raw_commands(op, facts, **kwargs):
    """The operation's commands as objects (run_op renders them to text): uploads keep their content."""
    with ctx_state.use(_State(False)), ctx_host.use(FakeHost(facts)):
        return list(op._inner(**kwargs))


def run_for_real(commands):
    """Each command as the Spark would run it: shell text through sh, an upload written where it goes."""
    for command in commands:
        if isinstance(command, FileUploadCommand):
            with open(command.dest, "w") as f:
                f.write(command.src.getvalue())
        else:
            _sh(command.get_raw_value())


def test_the_sum_fact_reads_the_digest_and_never_the_key(tmp_path):
    key = tmp_path / "key"
    key.write_text(OWN + "\n")
    key.chmod(0o600)
    got = run_fact(ApiKeyFileSum, path=str(key))
    assert got["sha256"] == hashlib.sha256((OWN + "\n").encode()).hexdigest()
    assert got["present"] and got["mode"] == "600"
    assert run_fact(ApiKeyFileSum, path=str(tmp_path / "none")) == ApiKeyFileSum.default()
    command = ApiKeyFileSum().command(str(key))
    assert "sha256sum <" in command and "cat " not in command and "base64" not in command


def test_your_key_for_real_and_then_converged(tmp_path):
    path = str(tmp_path / "api-key.d" / "key")
    first = raw_commands(ak.api_key_present, {ApiKeyFileSum: with_args({f"path={path}": ApiKeyFileSum.default()})},
                         path=path, owner="x", key=OWN)
    run_for_real(first)
    assert open(path).read() == OWN + "\n" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not os.path.exists(path + ".new")
    now = run_fact(ApiKeyFileSum, path=path)
    again = raw_commands(ak.api_key_present, {ApiKeyFileSum: with_args({f"path={path}": now})}, path=path,
                         owner=now["owner"], key=OWN)
    assert again == []
    # a new key in the file: one rename, the old inode replaced (a reader sees the old key or the new one)
    inode = os.stat(path).st_ino
    run_for_real(raw_commands(ak.api_key_present, {ApiKeyFileSum: with_args({f"path={path}": now})}, path=path,
                              owner=now["owner"], key=OWN + "-2"))
    assert open(path).read() == OWN + "-2\n" and os.stat(path).st_ino != inode


def test_the_deploy_passes_your_key_and_names_it(monkeypatch, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(OWN + "\n")
    calls = []
    monkeypatch.setattr(ak, "api_key_present", lambda **kw: calls.append(kw))
    monkeypatch.setattr(ak, "owned_folders", lambda **kw: None)
    with ctx_host.use(FakeHost({})):
        ak.api_key._inner(make_settings("head", api_key=True, api_key_file=str(key_file)))
    assert calls[0]["key"] == OWN and calls[0]["name"] == f"API key from api_key_file in {PATH} (head only)"
    assert OWN not in calls[0]["name"]
    calls.clear()
    with ctx_host.use(FakeHost({})):
        ak.api_key._inner(make_settings("head", api_key=True))
    assert calls[0]["key"] == ""  # the generated key stays the default


# ---- api_key_file in the settings ----

def key_problems(path, **overrides):
    s, found = load_one("head", api_key=True, api_key_file=str(path), **overrides)
    return s, found + validate(s)


def test_a_readable_key_file_is_read_on_this_machine(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(f"  {OWN}\n")
    s, found = key_problems(key_file)
    assert found == [] and s.own_api_key == OWN and OWN not in repr(s)
    worker, _ = load_one("worker", api_key=True, api_key_file=str(key_file))
    assert worker.own_api_key == ""  # only the head holds it
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    (home / ".config" / "key").write_text(OWN)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        assert key_problems("~/.config/key")[0].own_api_key == OWN


@pytest.mark.parametrize("make, fragment", [
    (lambda d: d / "absent", "there is no such file on this machine: write your key into it"),
    (lambda d: (d / "empty").write_text("\n\n") and d / "empty", "is empty: write your key into it"),
    (lambda d: d, "is a folder on this machine, not a file"),
    (lambda d: (d / "two").write_text(f"{OWN}\nsecond-line-secret\n") and d / "two", "alone on one line"),
    (lambda d: (d / "sp").write_text(f"{OWN} second-line-secret") and d / "sp", "without spaces"),
    (lambda d: "relative/key", "must be an absolute path on this machine"),
])
def test_an_unusable_key_file_is_named_with_the_fix_before_anything_runs(tmp_path, make, fragment):
    path = make(tmp_path)
    _s, found = key_problems(path)
    assert any(p.startswith(f"api_key_file = '{path}'") and fragment in p for p in found), found
    assert not any("second-line-secret" in p or OWN in p for p in found)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_key_file_is_named(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(OWN)
    key_file.chmod(0)
    assert any("cannot be read by this machine's user" in p for p in key_problems(key_file)[1])


def test_an_unreadable_key_file_is_named_whoever_runs(tmp_path, monkeypatch):
    key_file = tmp_path / "key"
    key_file.write_text(OWN)

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_text", refuse)
    found = sources.api_key_from_file(str(key_file))[1]
    assert found == [f"api_key_file = '{key_file}' cannot be read by this machine's user: give it read access "
                     "(chmod 600 the file as the user who runs the deploy)"]


def test_the_key_file_is_read_once_per_process_and_again_for_another_path(tmp_path, monkeypatch):
    """A run loads the head's settings three times: the file is read once; another path (or `~` under another
    home) is read on its own, and forget_local_reads lets a changed file be read again."""
    key_file, other = tmp_path / "key", tmp_path / "other"
    key_file.write_text(OWN)
    other.write_text(OWN + "-2")
    reads = []
    read_text = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **kw: reads.append(str(self)) or read_text(self, *a, **kw))
    for _ in range(3):
        assert key_problems(key_file)[0].own_api_key == OWN
    assert key_problems(other)[0].own_api_key == OWN + "-2"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert key_problems("~/key")[0].own_api_key == OWN
    assert [r for r in reads if r.startswith(str(tmp_path))] == [str(key_file), str(other), str(key_file)]
    key_file.write_text(OWN + "-3")
    assert key_problems(key_file)[0].own_api_key == OWN  # kept for the process
    sources.forget_local_reads()
    assert key_problems(key_file)[0].own_api_key == OWN + "-3"
    missing = sources.api_key_from_file(str(tmp_path / "absent"))[1]
    missing.append("changed by a caller")
    assert sources.api_key_from_file(str(tmp_path / "absent"))[1] == missing[:1]  # each caller gets its own list


def test_api_key_file_needs_api_key_and_no_rotation(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(OWN)
    found = validate(make_settings("head", api_key=False, api_key_file=str(key_file)))
    assert any("api_key_file" in p and "set api_key = true" in p for p in found), found
    found = validate(make_settings("head", api_key=True, api_key_file=str(key_file), rotate_api_key=True))
    assert any(p.startswith("rotate_api_key makes a new random key") for p in found), found
    assert validate(make_settings("head", api_key=True, api_key_file=str(key_file))) == []
