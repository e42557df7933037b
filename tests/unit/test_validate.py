"""operations.validate against a tiny local fake server (http.server on 127.0.0.1) that answers well or badly."""

from __future__ import annotations

import struct
import zlib

import pytest
from validate_fake import png_colour as _png_colour
from validate_fake import serving

from operations.validate.__main__ import main
from operations.validate.bench import compare
from operations.validate.image import make_png
from operations.validate.result import FAIL, NOT_RUN, PASS, UNVERIFIED, Result, exit_code
from operations.validate.tools import judge

KEY = "k" * 64
SMALL = ["--long-tokens", "2000", "--needle-tokens", "3000", "--prefill-tokens", "500", "--decode-tokens", "16",
         "--streams", "3"]


@pytest.fixture
def server():
    with serving() as httpd:
        yield httpd


def run(server, *checks, extra=()):
    return main(["--base-url", server.url, *SMALL, *extra, *checks])


CHECKS_AND_FAULTS = [
    ("text", "text"), ("thinking-on", "thinking-on"), ("thinking-on", "thinking-leak"),
    ("thinking-off", "thinking-off"), ("tools", "tools"), ("image", "image"), ("long", "long"),
    ("needle", "needle"), ("end-of-turn", "eot"),
]


@pytest.mark.parametrize("check", sorted({c for c, _ in CHECKS_AND_FAULTS}))
def test_each_check_passes_against_a_good_server(server, check, capsys):
    assert run(server, check) == PASS
    assert capsys.readouterr().out.startswith(f"PASS {check}:")


@pytest.mark.parametrize("check, fault", CHECKS_AND_FAULTS)
def test_each_check_fails_against_a_bad_server(server, check, fault, capsys):
    server.bad = {fault}
    assert run(server, check) == FAIL
    assert f"FAIL {check}:" in capsys.readouterr().out


def test_all_runs_the_correctness_checks_and_reports_the_worst(server, capsys):
    assert run(server, "all") == PASS
    server.bad = {"tools"}
    assert run(server, "all") == FAIL
    out = capsys.readouterr().out
    assert out.count("PASS ") == 8 + 7 and "FAIL tools:" in out  # ALL gained smoke


def test_requests_carry_thinking_switch_model_and_tool_schema(server):
    run(server, "thinking-off", "tools")
    posts = [b for m, _, b in server.requests if m == "POST"]
    assert posts[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert posts[0]["model"] == "fake-model"
    assert posts[1]["tools"][0]["function"]["parameters"]["properties"]["tags"]["type"] == "array"


def test_model_flag_skips_the_models_route(server):
    assert run(server, "text", extra=["--model", "mine"]) == PASS
    assert [r for r in server.requests if r[0] == "GET"] == []
    assert server.requests[0][2]["model"] == "mine"


def test_missing_base_url_or_unknown_check_could_not_run(server, monkeypatch):
    monkeypatch.delenv("API_URL", raising=False)
    assert main(["text"]) == NOT_RUN
    assert run(server, "nonsense") == NOT_RUN


@pytest.mark.parametrize("argv, lines", [
    (["thinkng-on"], ["unknown check 'thinkng-on': did you mean thinking-on or thinking-off?"]),
    (["text", "smokee", "zzz"], ["unknown check 'smokee': did you mean smoke?", "unknown check 'zzz'"]),
    (["compar", "a.json", "b.json"], ["unknown check 'compar': did you mean compare?"]),  # not one per file
])
def test_an_unknown_check_gets_the_closest_names(server, capsys, argv, lines):
    assert run(server, *argv) == NOT_RUN
    captured = capsys.readouterr()
    assert captured.err.splitlines()[:-1] == lines and captured.out == ""
    assert captured.err.splitlines()[-1].startswith("the checks: text, thinking-on, ")
    assert captured.err.splitlines()[-1].endswith(", all; the commands: compare, plot, exact")
    assert server.requests == []


def test_api_key_from_file_or_environment(server, tmp_path, monkeypatch):
    server.require_key = KEY
    monkeypatch.delenv("API_KEY", raising=False)
    assert run(server, "text") == NOT_RUN  # 401: could not run, not a failed check
    key_file = tmp_path / "api-key"
    key_file.write_text(f"# sparkfold\nmain: {KEY}\n")
    assert run(server, "text", extra=["--api-key-file", str(key_file)]) == PASS
    monkeypatch.setenv("API_KEY", KEY)
    assert run(server, "text") == PASS


def test_end_of_turn_without_finish_reason_is_unverified(server):
    server.bad = {"no-finish"}
    assert run(server, "end-of-turn") == UNVERIFIED


def test_end_of_turn_max_cut_allows_some_cuts(server):
    server.bad = {"eot"}
    assert run(server, "end-of-turn", extra=["--max-cut", "8"]) == PASS


def test_bench_without_usage_is_unverified(server):
    server.bad = {"no-usage"}
    assert run(server, "bench") == UNVERIFIED


def test_compare_of_unreadable_records_could_not_run(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"kind": "other"}')
    assert main(["compare", str(bad), str(tmp_path / "missing.json")]) == NOT_RUN
    assert main(["compare", str(bad)]) == NOT_RUN


def test_compare_directions():
    a = {"decode": {"tok_s": 100, "ttft_s": 0.1}, "prefill": {"tok_s": 2000}}
    b = {"decode": {"tok_s": 95, "ttft_s": 0.2}, "prefill": {"tok_s": 2500}}
    report = compare(a, b, 10)
    assert report["worse"] == ["decode.ttft_s"]  # slower first token is worse; faster prefill is not
    assert report["figures"]["multi.tok_s_total"]["change_pct"] is None


def test_judge_tool_calls():
    def msg(args, name="add_tags"):
        return {"tool_calls": [{"function": {"name": name, "arguments": args}}]}
    assert judge(msg('{"doc_id": 42, "tags": ["a", "b", "c"]}')) is None
    assert judge(msg({"doc_id": 42, "tags": ["a", "b", "c"]})) is None
    assert "JSON array" in judge(msg('{"doc_id": 42, "tags": "a, b, c"}'))
    assert "integer" in judge(msg('{"doc_id": "42", "tags": ["a", "b", "c"]}'))
    assert "not JSON" in judge(msg("{doc_id: 42"))
    assert "not add_tags" in judge(msg("{}", name="tag"))
    assert "no tool call" in judge({"content": "ok"})


def test_make_png_is_a_valid_png_of_the_colour():
    import base64
    png = make_png(4, 3, (1, 2, 3))
    assert struct.unpack(">II", png[16:24]) == (4, 3)
    assert _png_colour("data:," + base64.b64encode(png).decode()) == (1, 2, 3)
    assert len(zlib.decompress(png[png.index(b"IDAT") + 4:png.index(b"IEND") - 8])) == 3 * (1 + 4 * 3)


def test_exit_code_ranks_failure_over_not_run_over_unverified():
    r = lambda s: Result("x", s, "")  # noqa: E731
    assert exit_code([r(PASS), r(PASS)]) == PASS
    assert exit_code([r(PASS), r(UNVERIFIED)]) == UNVERIFIED
    assert exit_code([r(UNVERIFIED), r(NOT_RUN)]) == NOT_RUN
    assert exit_code([r(NOT_RUN), r(FAIL), r(UNVERIFIED)]) == FAIL
    assert exit_code([]) == NOT_RUN
