"""operations.validate.sse: the HTML standard's event-stream rules, and the same byte streams read by the official
openai client as the reference (served from a fake on 127.0.0.1; both must agree, and both must refuse an error)."""

from __future__ import annotations

import json

import openai
import pytest
from validate_fake import serving

from operations.validate.client import Client
from operations.validate.sse import ChatChunks, Event, StreamError, events, lines

SEPARATORS = "a\u2028b\u2029c\u0085d"  # Unicode line breaks that are NOT line ends in an event stream


def chunk(delta: dict | None = None, finish: str | None = None) -> dict:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
            "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


def stream(chunks: list[dict], end: str = "\n", done: bool = True) -> bytes:
    body = "".join(f"data: {json.dumps(c, ensure_ascii=False)}{end}{end}" for c in chunks)
    return (body + (f"data: [DONE]{end}{end}" if done else "")).encode()


def text_stream(*pieces: str, end: str = "\n") -> bytes:
    return stream([chunk({"role": "assistant"}), *(chunk({"content": p}) for p in pieces), chunk(finish="stop")],
                  end)


def tool_stream(*pieces) -> bytes:
    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add_tags", "arguments": ""}}
    deltas = [{"tool_calls": [head]}, *({"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in pieces)]
    return stream([*(chunk(d) for d in deltas), chunk(finish="tool_calls")])


ERROR = {"error": {"message": "engine fault", "type": "server_error"}}
AGREED = {
    "lf": text_stream("Hel", "lo"),
    "crlf": text_stream("Hel", "lo", end="\r\n"),
    "cr": text_stream("Hel", "lo", end="\r"),
    "unicode separators": text_stream(SEPARATORS, "!"),
    "data over two lines": b'data: {"choices":\ndata: [{"index": 0, "delta": {"content": "x"}, "finish_reason": '
                           b'"stop"}]}\n\ndata: [DONE]\n\n',
    "comments, id, retry, event": b": keep-alive\n\nid: 7\nretry: 100\nevent: message\n" + text_stream("ok"),
    "data without a space": b'data:{"choices": [{"index": 0, "delta": {"content": "y"}, "finish_reason": "stop"}]}'
                            b"\n\ndata:[DONE]\n\n",
    "tool call": tool_stream('{"doc_id": 4', '2, "tags": ["a"', ', "b", "c"]}'),
}
REFUSED = {
    "error data": stream([chunk({"content": "Hel"}), ERROR, chunk(finish="stop")]),
    "error event": b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'
                   b"event: error\ndata: " + json.dumps(ERROR).encode() + b"\n\ndata: [DONE]\n\n",
}


@pytest.fixture
def server():
    with serving() as httpd:
        yield httpd


def with_openai(url: str) -> tuple[str, str | None, dict]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    content, finish, calls = "", None, {}
    for part in client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                               stream=True):
        for choice in part.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                calls[call.index] = calls.get(call.index, "") + (call.function.arguments or "")
    return content, finish, calls


def with_ours(url: str) -> tuple[str, str | None, dict]:
    reply = Client(url, model="fake-model").chat_stream([{"role": "user", "content": "hi"}])
    assert reply.done
    return reply.content, reply.finish_reason, {i: c["function"]["arguments"] for i, c in enumerate(reply.tool_calls)}


@pytest.mark.parametrize("name", AGREED)
def test_our_parser_reads_what_the_openai_client_reads(server, name):
    server.raw_stream = AGREED[name]
    ours = with_ours(server.url)
    assert ours == with_openai(server.url)
    assert ours[0] or ours[2]  # the stream said something: agreeing on nothing proves nothing


def test_unicode_line_separators_stay_inside_one_chunk(server):
    server.raw_stream = text_stream(SEPARATORS, "!")
    assert with_ours(server.url)[0] == SEPARATORS + "!" == with_openai(server.url)[0]


@pytest.mark.parametrize("name", REFUSED)
def test_an_error_in_the_stream_is_a_failure_for_both(server, name):
    server.raw_stream = REFUSED[name]
    with pytest.raises(openai.APIError):
        with_openai(server.url)
    with pytest.raises(StreamError, match="error"):
        with_ours(server.url)


@pytest.mark.parametrize("bad", [{"choices": "x"}, {"choices": [{"index": 0, "delta": "x"}]},
                                 {"choices": [{"index": 0, "delta": {"tool_calls": [5]}}]}])
def test_a_chunk_of_the_wrong_shape_is_a_failure_not_a_crash(server, bad):
    server.raw_stream = stream([chunk({"content": "Hel"}), bad, chunk(finish="stop")])
    with pytest.raises(StreamError, match="wrong shape"):
        with_ours(server.url)


def test_tool_call_arguments_must_stream_as_a_string(server):
    server.raw_stream = tool_stream({"doc_id": 42, "tags": ["a", "b", "c"]})
    with pytest.raises(StreamError, match="not a string"):
        with_ours(server.url)


def test_lines_end_at_cr_lf_or_crlf_even_split_across_chunks():
    assert list(lines([b"a\r", b"\nb\rc\n", b"d\r\n", b"\r\n"])) == ["a", "b", "c", "d", ""]
    assert list(lines([b"\xef\xbb\xbfdata: x\n"])) == ["data: x"]  # a leading BOM is dropped
    assert list(lines(["x\u2028y\u0085z\n".encode()])) == ["x\u2028y\u0085z"]
    assert list(lines([b"complete\n", b"unfinished"])) == ["complete"]


def test_events_follow_the_standard():
    got = list(events(["data: a", "data:b", ": comment", "event: note", "id: 5", "", "event: lost", "", "data:  c",
                       "", "data", "", "data: unfinished"]))
    assert got == [Event("a\nb", "note", "5"), Event(" c", "message", "5"), Event("", "message", "5")]


def test_done_ends_the_stream_and_bad_data_is_an_error():
    chunks = ChatChunks([b'data: {"n": 1}\n\ndata: [DONE]\n\ndata: {"n": 2}\n\n'])
    assert list(chunks) == [{"n": 1}] and chunks.done
    unfinished = ChatChunks([b'data: {"n": 1}\n\n'])
    assert list(unfinished) == [{"n": 1}] and not unfinished.done
    for bad in (b"data: {not json\n\n", b"data: [1, 2]\n\n", b"event: error\ndata: {}\n\n"):
        with pytest.raises(StreamError):
            list(ChatChunks([bad]))
