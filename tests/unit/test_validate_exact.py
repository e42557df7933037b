"""exact record/compare: records of the same fake compare equal; a fake whose one reply drifted compares different,
showing where; records that cannot be compared exit 2."""

from __future__ import annotations

import json

import pytest
from validate_fake import serving

from operations.validate.__main__ import main
from operations.validate.exact import PROMPTS, compare_prompt, first_difference
from operations.validate.result import FAIL, NOT_RUN, PASS


@pytest.fixture
def server():
    with serving() as httpd:
        yield httpd


def record(server, path, *faults) -> dict:
    server.bad = set(faults)
    assert main(["--base-url", server.url, "exact", "record", str(path)]) == PASS
    return json.loads(path.read_text())


def test_the_same_server_compares_the_same(server, tmp_path, capsys):
    a = record(server, tmp_path / "a.json")
    record(server, tmp_path / "b.json")
    assert set(a["prompts"]) == set(PROMPTS)
    assert all("tokens" in p for name, p in a["prompts"].items() if name != "tool")  # a bare call has no content
    assert "add_tags(" in a["prompts"]["tool"]["text"]
    assert all(b.get("temperature") == 0 and b.get("logprobs") for m, _, b in server.requests if m == "POST")
    capsys.readouterr()
    assert main(["exact", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == PASS
    out = capsys.readouterr().out
    assert out.count("  same ") == len(PROMPTS) and "PASS exact:" in out


def test_a_drifted_reply_is_different_and_shows_where(server, tmp_path, capsys):
    record(server, tmp_path / "a.json")
    record(server, tmp_path / "b.json", "exact-drift")
    capsys.readouterr()
    assert main(["exact", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == FAIL
    out = capsys.readouterr().out
    assert "  different code (tokens): first difference at token " in out
    assert "FAIL exact: 1 of 6 prompts differ: code" in out and out.count("  same ") == 5


def test_without_logprobs_the_text_hash_decides(server, tmp_path, capsys):
    a = record(server, tmp_path / "a.json", "no-logprobs")
    asked = [bool(b.get("logprobs")) for m, _, b in server.requests if m == "POST"]
    assert asked == [True, False] + [False] * (len(PROMPTS) - 1)  # refused once, then asked plainly
    assert all("tokens" not in p and len(p["text_sha256"]) == 64 for p in a["prompts"].values())
    record(server, tmp_path / "b.json", "no-logprobs", "exact-drift")
    capsys.readouterr()
    assert main(["exact", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == FAIL
    assert "different code (text_sha256): first difference at character" in capsys.readouterr().out
    # a record with tokens and one without still compare, by what both hold
    record(server, tmp_path / "c.json")
    assert main(["exact", "compare", str(tmp_path / "a.json"), str(tmp_path / "c.json")]) == PASS


def test_the_engines_token_sha_is_preferred(server, tmp_path):
    a = record(server, tmp_path / "a.json", "token-sha")
    assert all(len(p["token_sha"]) == 12 for p in a["prompts"].values())
    assert compare_prompt(a["prompts"]["code"], a["prompts"]["code"]) == ("token_sha", None)


def test_records_that_cannot_be_compared_could_not_run(server, tmp_path, monkeypatch):
    a = record(server, tmp_path / "a.json")
    changed = tmp_path / "changed.json"
    a["prompts"]["code"]["request"] = "0" * 16
    changed.write_text(json.dumps(a))
    other = tmp_path / "other.json"
    other.write_text('{"kind": "sparkfold-bench", "version": 1}')
    for b in (changed, other, tmp_path / "missing.json"):
        assert main(["exact", "compare", str(tmp_path / "a.json"), str(b)]) == NOT_RUN
    assert main(["exact", "compare", str(tmp_path / "a.json")]) == NOT_RUN
    monkeypatch.delenv("API_URL", raising=False)
    assert main(["exact", "record", str(tmp_path / "x.json")]) == NOT_RUN  # no server given


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == (1, 2, 5)
    assert first_difference([1, 2], [1, 2, 3]) == (2, None, 3)
    assert first_difference("abc", "abd") == (2, "c", "d")
