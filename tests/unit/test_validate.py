"""operations.validate against a tiny local fake server (http.server on 127.0.0.1) that answers well or badly."""

from __future__ import annotations

import json
import re
import struct
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from operations.validate.__main__ import main
from operations.validate.bench import compare
from operations.validate.image import make_png
from operations.validate.result import FAIL, NOT_RUN, PASS, UNVERIFIED, Result, exit_code
from operations.validate.tools import judge

KEY = "k" * 64
SMALL = ["--long-tokens", "2000", "--needle-tokens", "3000", "--prefill-tokens", "500", "--decode-tokens", "16",
         "--streams", "3"]


def _png_colour(url: str) -> tuple[int, int, int]:
    """The first pixel of a data-URL PNG made by make_png (decoded for real: the fake only says red when it is)."""
    import base64
    data = base64.b64decode(url.split(",", 1)[1])
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        if kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    return tuple(raw[1:4])


class Fake(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self):
        key = self.server.require_key
        return not key or self.headers.get("Authorization") == f"Bearer {key}"

    def do_GET(self):
        self.server.requests.append(("GET", self.path, None))
        if not self._authorised():
            return self._send(401, {"error": {"message": "A valid API key is required"}})
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        self._send(404, {"error": {"message": "unknown path"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(("POST", self.path, body))
        if not self._authorised():
            return self._send(401, {"error": {"message": "A valid API key is required"}})
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": {"message": "unknown path"}})
        bad = self.server.bad
        if "image" in bad and self._images(body):
            return self._send(400, {"error": {"message": "this engine has no vision"}})
        message, finish = self._answer(body, bad)
        prompt_chars = sum(len(self._text(m.get("content"))) for m in body["messages"])
        completion = (body.get("max_tokens", 16) if body.get("ignore_eos")
                      else len(message.get("content") or "") // 4 + 1)
        usage = None if "no-usage" in bad else {"prompt_tokens": prompt_chars // 4, "completion_tokens": completion}
        if "no-finish" in bad:
            finish = None
        if body.get("stream"):
            return self._stream(message, finish, usage, completion if body.get("ignore_eos") else None)
        reply = {"object": "chat.completion", "model": body["model"],
                 "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}]}
        if usage:
            reply["usage"] = usage
        self._send(200, reply)

    @staticmethod
    def _text(content):
        if isinstance(content, str):
            return content
        return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))

    @staticmethod
    def _images(body):
        return [p["image_url"]["url"] for m in body["messages"] if isinstance(m.get("content"), list)
                for p in m["content"] if p.get("type") == "image_url"]

    def _answer(self, body, bad):
        prompt = "\n".join(self._text(m.get("content")) for m in body["messages"])
        thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        finish, message = "stop", {}
        if body.get("tools"):
            tags = "urgent, finance, q3" if "tools" in bad else ["urgent", "finance", "q3"]
            call = {"id": "c1", "type": "function",
                    "function": {"name": "add_tags", "arguments": json.dumps({"doc_id": 42, "tags": tags})}}
            return {"content": None, "tool_calls": [call]}, "tool_calls"
        if self._images(body):
            message["content"] = "Red." if _png_colour(self._images(body)[0]) == (220, 20, 20) else "Blue."
        elif "secret passphrase is" in prompt:
            secret = re.search(r"secret passphrase is (\S+)\.", prompt).group(1)
            message["content"] = "I do not know." if "needle" in bad else secret
        elif "number of the last paragraph" in prompt:
            last = max(int(n) for n in re.findall(r"Paragraph (\d+)\.", prompt))
            message["content"] = "1" if "long" in bad else str(last)
        elif "capital of France" in prompt:
            message["content"] = "" if "text" in bad else "Paris."
        elif prompt.startswith("Write a") and "eot" in bad:
            message["content"], finish = "def f(x):\n    return x * x\n" * 40, "length"
        else:
            message["content"] = "Hello there, here you go."
        if thinking and "thinking-on" not in bad:
            message["reasoning_content"] = "Let me think about it."
        if not thinking and "thinking-off" in bad:
            message["reasoning_content"] = "I thought anyway."
        if thinking and "thinking-leak" in bad:
            message["content"] = "<think>oops</think>" + message["content"]
        return message, finish

    def _stream(self, message, finish, usage, tokens):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        pieces = ["tok "] * tokens if tokens else (message.get("content") or "").split(" ")
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
        chunks += [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if usage:
            chunks.append({"choices": [], "usage": usage})
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    httpd.bad, httpd.require_key, httpd.requests = set(), None, []
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


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
    assert out.count("PASS ") == 7 + 6 and "FAIL tools:" in out


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


def test_unreachable_server_could_not_run(capsys):
    assert main(["--base-url", "http://127.0.0.1:9", "text"]) == NOT_RUN
    assert "NOT RUN text:" in capsys.readouterr().out


def test_missing_base_url_or_unknown_check_could_not_run(server, monkeypatch):
    monkeypatch.delenv("API_URL", raising=False)
    assert main(["text"]) == NOT_RUN
    assert run(server, "nonsense") == NOT_RUN


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


def test_bench_writes_figures_and_compare_flags_a_drop(server, tmp_path, capsys):
    a = tmp_path / "a.json"
    assert run(server, "bench", extra=["--out", str(a)]) == PASS
    record = json.loads(a.read_text())
    assert record["kind"] == "sparkfold-bench"
    assert record["prefill"]["prompt_tokens"] > 400 and record["prefill"]["tok_s"] > 0
    assert record["decode"]["completion_tokens"] == 16 and record["decode"]["tok_s"] > 0
    assert record["multi"]["streams"] == 3 and record["multi"]["completion_tokens"] == 48
    posts = [b for m, _, b in server.requests if m == "POST"]
    assert sum(1 for b in posts if b.get("stream")) == 1 + 3

    assert main(["compare", str(a), str(a)]) == PASS
    slow = dict(record, decode=dict(record["decode"], tok_s=record["decode"]["tok_s"] * 0.5))
    b = tmp_path / "b.json"
    b.write_text(json.dumps(slow))
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == FAIL
    report = json.loads(capsys.readouterr().out.rsplit("\nFAIL", 1)[0])
    assert report["worse"] == ["decode.tok_s"] and report["figures"]["decode.tok_s"]["change_pct"] == -50.0


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
