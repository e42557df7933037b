"""The agent-facing checks (tools in five parts, needle depth, end-of-turn leaks, smoke, anthropic, prompt-reuse)
against the fake server: right, then wrong in exactly the way each part looks for."""

from __future__ import annotations

import json
import re

import pytest
from validate_fake import serving

from operations.validate.__main__ import main
from operations.validate.client import Client
from operations.validate.result import FAIL, NOT_RUN, PASS, UNVERIFIED
from operations.validate.smoke import broken_text, smoke_parts, weather_call_problem
from operations.validate.text import CONTROL_MARKERS, leaked_markers

KEY = "k" * 64


@pytest.fixture
def server():
    with serving() as httpd:
        yield httpd


def run(server, *checks, extra=()):
    return main(["--base-url", server.url, "--needle-tokens", "3000", "--reuse-tokens", "2000", *extra, *checks])


@pytest.mark.parametrize("check", ["tools", "smoke", "anthropic", "prompt-reuse", "end-of-turn", "needle"])
def test_each_new_check_passes_against_a_good_server(server, check, capsys):
    assert run(server, check) == PASS
    assert capsys.readouterr().out.startswith(f"PASS {check}:")


@pytest.mark.parametrize("fault, status, says", [
    ("tools", FAIL, "call FAIL: tags came back as str"),  # the model's typing: the streamed call has it too
    ("tools-stream-object", FAIL, "stream FAIL: tool call 0: arguments streamed as a JSON dict, not a string"),
    ("no-done", FAIL, "stream FAIL: the stream ended without data: [DONE]"),
    ("tools-result", FAIL, "result FAIL: the answer does not use the result"),
    ("required-ignored", FAIL, "required FAIL: tool_choice required but no tool call"),
    ("none-ignored", FAIL, "none FAIL: tool_choice none but the reply calls a tool"),
    ("tool-choice-400", UNVERIFIED, "required UNCHECKED: the server does not support tool_choice 'required'"),
])
def test_tools_parts_each_catch_their_fault(server, fault, status, says, capsys):
    server.bad = {fault}
    assert run(server, "tools") == status
    out = capsys.readouterr().out
    assert says in out
    wrong_parts = 2 if fault == "tools" else 1
    assert out.count("FAIL") + out.count("UNCHECKED") == 1 + wrong_parts  # the check's label, the parts at fault


def test_tools_result_turn_sends_the_call_and_its_result_back(server):
    run(server, "tools")
    posts = [b for m, _, b in server.requests if m == "POST"]
    turn = next(b for b in posts if any(m["role"] == "tool" for m in b["messages"]))
    assistant, result = turn["messages"][1:]
    assert assistant["tool_calls"][0]["id"] == result["tool_call_id"]
    assert [b["tool_choice"] for b in posts] == ["auto", "auto", "auto", "required", "none"]
    assert posts[1]["stream"] is True


def test_needle_depth_places_the_passphrase(server):
    assert run(server, "needle", extra=["--needle-depth", "0.2"]) == PASS
    prompt = server.requests[-1][2]["messages"][0]["content"]
    assert 0.15 < prompt.index("secret passphrase is") / len(prompt) < 0.25
    assert run(server, "needle", extra=["--needle-depth", "1.5"]) == NOT_RUN


def test_end_of_turn_fails_on_leaked_control_text(server, capsys):
    server.bad = {"eot-leak"}
    assert run(server, "end-of-turn") == FAIL
    assert "control text in 8 of 8 replies: <｜end▁of▁sentence｜>" in capsys.readouterr().out


def test_every_control_marker_is_caught():
    for marker in CONTROL_MARKERS:
        assert leaked_markers(f"fine {marker} text") == [marker]
    assert leaked_markers("plain <b>html</b> and a | pipe") == []


def test_smoke_passes_and_says_what_it_saw(server, capsys):
    assert run(server, "smoke") == PASS
    out = capsys.readouterr().out
    assert "health ok: /health 200" in out
    assert "reply ok: '1\\n2\\n3\\n4\\n5\\n6' (" in out and "stopped before '7' (finish_reason stop)" in out
    assert "stream ok: 'Hellothere,hereyougo.', finish_reason stop, [DONE]" in out  # the fake drops the spaces
    assert 'tool ok: get_weather({"city": "Paris"})' in out
    assert "tool-result ok: 'It is sunny in Paris.' (finish_reason stop)" in out


@pytest.mark.parametrize("fault, failing, says", [
    ("no-health", set(), "health ok: /v1/models 200"),
    ("health-down", {"health"}, "health FAIL: HTTP 503"),
    ("stop-ignored", {"reply"}, "reply FAIL: the stop string '7' is in the reply"),
    ("empty-reply", {"reply", "stream"}, "reply FAIL: empty reply (finish_reason stop)"),
    ("collapsed", {"reply", "stream"}, "stream FAIL: assembled from the deltas: one character repeated ('!!!!"),
    ("no-finish", {"stream"}, "stream FAIL: no finish_reason in the stream"),
    ("no-done", {"stream"}, "stream FAIL: the stream ended without data: [DONE]"),
    ("stream-error", {"stream"}, "stream FAIL: error in the stream"),
    ("no-tool-call", {"tool"}, "tool FAIL: asked for a tool call and got none (content 'It is sunny in Paris.')"),
    ("tool-result-empty", {"tool-result"},
     "tool-result FAIL: the reply to the tool's result has no text (finish_reason stop)"),
    ("tool-result-again", {"tool-result"},
     "tool-result FAIL: answered the tool's result with another tool call, not text (finish_reason tool_calls)"),
    ("wrong-shape", {"reply", "tool", "tool-result"}, "reply FAIL: an answer of the wrong shape (AttributeError: "),
])
def test_smoke_parts_each_catch_their_fault(server, fault, failing, says, capsys):
    server.bad = {fault}
    assert run(server, "smoke") == (FAIL if failing else PASS)
    assert says in capsys.readouterr().out
    assert {part.name for part in smoke_parts(Client(server.url)) if part.status != PASS} == failing


def test_smoke_sends_a_stop_string_a_stream_and_the_weather_tool(server):
    run(server, "smoke")
    posts = [b for m, _, b in server.requests if m == "POST"]
    assert [b.get("stop") for b in posts] == [["7"], None, None, None]
    assert [bool(b.get("stream")) for b in posts] == [False, True, False, False]
    assert posts[2]["tools"][0]["function"]["name"] == "get_weather"
    assert ("GET", "/health", None) in server.requests


def test_smoke_sends_the_tool_result_back_for_the_call_it_got(server):
    """The result turn: the user's question, the assistant's own call (its id and arguments), and a `role: tool`
    result answering that id, with the tools still offered."""
    run(server, "smoke")
    turn = [b for m, _, b in server.requests if m == "POST"][3]
    user, assistant, result = turn["messages"]
    assert user == {"role": "user", "content": "What is the weather in Paris? Use the tool."}
    assert assistant["role"] == "assistant" and assistant["tool_calls"] == [
        {"id": "w1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert result["role"] == "tool" and result["tool_call_id"] == "w1"
    assert json.loads(result["content"])["forecast"] == "sunny"
    assert turn["tools"][0]["function"]["name"] == "get_weather" and "tool_choice" not in turn


def test_smoke_answers_a_result_even_when_no_call_came(server):
    """A server that makes no call still gets the result turn (a fixed call), so each part fails on its own."""
    server.bad = {"no-tool-call"}
    parts = {p.name: p for p in smoke_parts(Client(server.url))}
    assert parts["tool"].status == FAIL and parts["tool-result"].status == PASS
    turn = [b for m, _, b in server.requests if m == "POST"][3]
    assert turn["messages"][2]["tool_call_id"] == turn["messages"][1]["tool_calls"][0]["id"] == "call_smoke"


@pytest.mark.parametrize("text, problem", [
    ("", "empty reply"),
    (" \n ", "empty reply"),
    ("!!!!!!!!", "one character repeated ('!!!!!!!!'): the model collapsed"),
    ("OK", None),
    ("...", None),  # three characters may be an answer
    ("1\n2\n3", None),
])
def test_broken_text(text, problem):
    assert broken_text(text) == problem


def weather(arguments, name="get_weather"):
    return {"tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


@pytest.mark.parametrize("message, problem", [
    ({"content": "sunny"}, "asked for a tool call and got none (content 'sunny')"),
    (weather('{"city": "Paris"}', name="add_tags"), "asked for get_weather and got a call of 'add_tags'"),
    (weather("city=Paris"), "the tool call's arguments are not JSON text: 'city=Paris'"),
    (weather({"city": "Paris"}), "the tool call's arguments are not JSON text: {'city': 'Paris'}"),
    (weather('["Paris"]'), "the tool call's arguments are not a JSON object: '[\"Paris\"]'"),
    (weather('{"city": "Paris"}'), None),
])
def test_weather_call_problem(message, problem):
    assert weather_call_problem(message) == problem


@pytest.mark.parametrize("fault, status, says", [
    ("no-anthropic", NOT_RUN, "NOT RUN anthropic: the server has no Anthropic Messages route"),
    ("anthropic-shape", FAIL, "content is not a list of typed blocks"),
    ("anthropic-no-stop", FAIL, "stop_reason None"),
])
def test_anthropic_catches_each_fault(server, fault, status, says, capsys):
    server.bad = {fault}
    assert run(server, "anthropic") == status
    assert says in capsys.readouterr().out


def test_anthropic_sends_its_key_as_x_api_key_and_a_version(server, monkeypatch):
    server.require_key = KEY
    monkeypatch.setenv("API_KEY", KEY)
    assert run(server, "anthropic") == PASS
    headers = {k.lower(): v for k, v in server.headers[-1].items()}
    assert headers["x-api-key"] == KEY and "authorization" not in headers
    assert headers["anthropic-version"] == "2023-06-01"
    assert server.requests[-1][2]["messages"][0]["role"] == "user"


@pytest.mark.parametrize("fault, status, says", [
    ("", PASS, r"turn 2 reused 2\d{3} of \d+ prompt tokens"),
    ("reuse-hidden", PASS, r"turn 2 answered [\d.]+x sooner"),
    ("reuse-metrics-only", PASS, r"/metrics tensorfold_cached_tokens_total rose by 2\d{3}"),
    ("no-reuse", FAIL, r"turn 2 was not reused: TTFT [\d.]+ s then [\d.]+ s"),
])
def test_prompt_reuse_takes_any_evidence_and_fails_without(server, fault, status, says, capsys):
    server.bad = {fault}
    assert run(server, "prompt-reuse") == status
    assert re.search(says, capsys.readouterr().out)
    first, second = [b for m, _, b in server.requests if m == "POST"]
    assert second["messages"][0] == first["messages"][0] and len(second["messages"]) == 3
