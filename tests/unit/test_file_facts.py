"""The regular-file fact family (facts/files.RegularFileFact): FileText, FileSum and ApiKeyFile each read the file's
stat and only the parts they ask for, both ways (a file, no file), parsed and run on real files."""

from __future__ import annotations

import base64
import hashlib

import pytest
from harness import parse_fact, run_fact

from operations.facts.files import ApiKeyFile, FileSum, FileText, RegularFileFact

TEXT = "# sparkfold\nline two\n\nlast\n"
B64 = base64.b64encode(TEXT.encode()).decode()
SHA1 = hashlib.sha1(TEXT.encode()).hexdigest()
FAMILY = (FileText, FileSum, ApiKeyFile)


def test_each_fact_of_the_family_parses_a_file():
    stat = "#FILE 640 nvidia adm 29"
    assert parse_fact(FileText, f"{stat}\n#TEXT {B64}") == TEXT
    assert parse_fact(FileSum, f"{stat}\n#LINK\n#SHA1 {SHA1}\n#HEAD {B64}") == {
        "link": True, "sha1": SHA1, "mode": 640, "user": "nvidia", "group": "adm", "head": TEXT}
    assert parse_fact(ApiKeyFile, stat) == {"present": True, "empty": False, "mode": "640", "owner": "nvidia"}


@pytest.mark.parametrize("output", ["", "something else"])
def test_each_fact_of_the_family_reads_no_file_as_its_default(output):
    assert parse_fact(FileText, output) is None
    assert parse_fact(FileSum, output) is None
    assert parse_fact(ApiKeyFile, output) == ApiKeyFile.default() and not ApiKeyFile.default()["present"]


def test_unreadable_parts_are_unknown_not_wrong():
    assert parse_fact(FileText, "#FILE 644 root root 3\n#TEXT !!") == ""
    got = parse_fact(FileSum, "#FILE \n#SHA1 \n#HEAD ")
    assert got == {"link": False, "sha1": None, "mode": None, "user": None, "group": None, "head": ""}


def test_the_family_shares_one_command_and_each_asks_only_its_parts():
    commands = {cls: cls().command(path="/etc/x y") for cls in FAMILY}
    for cls, command in commands.items():
        assert issubclass(cls, RegularFileFact)
        assert command.startswith("if [ -f '/etc/x y' ]; then echo \"#FILE $(stat -L -c '%a %U %G %s' '/etc/x y'")
        assert command.endswith("fi; true")
    assert "base64 -w0 '/etc/x y'" in commands[FileText] and "sha1sum" not in commands[FileText]
    assert "sha1sum" in commands[FileSum] and "head -n 3" in commands[FileSum]
    assert "base64 -w0 '/etc/x y'" not in commands[FileSum]
    assert not any(reader in commands[ApiKeyFile] for reader in ("<", "base64", "head", "sum"))  # the key stays unread


def test_the_family_on_real_files(tmp_path):
    path, link = tmp_path / "file", tmp_path / "link"
    for cls in FAMILY:
        assert run_fact(cls, path=str(path)) == (ApiKeyFile.default() if cls is ApiKeyFile else None)
        assert run_fact(cls, path=str(tmp_path)) == (ApiKeyFile.default() if cls is ApiKeyFile else None)  # a folder
    path.write_text(TEXT)
    path.chmod(0o640)
    link.symlink_to(path)
    assert run_fact(FileText, path=str(path)) == run_fact(FileText, path=str(link)) == TEXT  # blank lines kept
    assert run_fact(FileSum, path=str(link)) == dict(run_fact(FileSum, path=str(path)), link=True)
    assert run_fact(FileSum, path=str(path))["sha1"] == SHA1
    key = run_fact(ApiKeyFile, path=str(path))
    assert key["present"] and key["mode"] == "640" and key["owner"]
    path.write_text("")
    assert run_fact(ApiKeyFile, path=str(path))["empty"] is True and run_fact(FileText, path=str(path)) == ""
