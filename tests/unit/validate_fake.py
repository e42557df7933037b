"""A fake OpenAI-compatible server on 127.0.0.1 for the operations.validate tests. It answers well; each name in
`server.bad` makes it wrong in exactly one way (the check that looks for that fault must then fail)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import threading
import time
import zlib
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENGINE_TOOL_CHOICE_400 = ('tool_choice "required" or a named function is not supported by this engine yet: '
                          'send "auto"')
MODEL = "fake-model"  # the one id /v1/models lists
SLOW_PREFILL_S = 0.8  # time to first token of a long prompt the fake has not seen before
LONG_PROMPT_CHARS = 6000


def png_colour(url: str) -> tuple[int, int, int]:
    """The first pixel of a data-URL PNG made by make_png (decoded for real: the fake only says red when it is)."""
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
    return (raw[1], raw[2], raw[3])


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
        if not key:
            return True
        if self.path == "/v1/messages" and self.headers.get("x-api-key") == key:
            return True
        return self.headers.get("Authorization") == f"Bearer {key}"

    def do_GET(self):
        self.server.requests.append(("GET", self.path, None))
        bad = self.server.bad
        if self.path == "/health" and "no-health" not in bad:  # open even with keys, like the engine's
            return self._send(503, {"status": "fatal"}) if "health-down" in bad else self._send(200, {"status": "ok"})
        if not self._authorised():
            return self._send(401, {"error": {"message": "A valid API key is required"}})
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        if self.path == "/metrics" and not bad & {"reuse-hidden", "no-metrics"}:
            text = ("# TYPE tensorfold_cached_tokens_total counter\n"
                    f'tensorfold_cached_tokens_total{{model="{MODEL}"}} {self.server.cached_total}\n')
            return self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        self._send(404, {"error": {"message": "unknown path"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(("POST", self.path, body))
        self.server.headers.append(dict(self.headers))
        if not self._authorised():
            return self._send(401, {"error": {"message": "A valid API key is required"}})
        if self.path == "/v1/messages":
            return self._messages(body)
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": {"message": "unknown path"}})
        if body.get("stream") and self.server.raw_stream is not None:
            return self._raw(self.server.raw_stream)
        bad = self.server.bad
        if "image" in bad and self._images(body):
            return self._send(400, {"error": {"message": "this engine has no vision"}})
        if "tool-choice-400" in bad and body.get("tool_choice") == "required":
            return self._send(400, {"error": {"message": ENGINE_TOOL_CHOICE_400}})
        if "no-logprobs" in bad and body.get("logprobs"):
            return self._send(400, {"error": {"message": "logprobs are not supported"}})
        message, finish = self._answer(body, bad)
        prompt_chars = sum(len(self._text(m.get("content"))) for m in body["messages"])
        completion = (body.get("max_tokens", 16) if body.get("ignore_eos")
                      else len(message.get("content") or "") // 4 + 1)
        usage = None if "no-usage" in bad else {"prompt_tokens": prompt_chars // 4, "completion_tokens": completion}
        cached = self._reuse(body, bad)
        if usage and cached is not None and not bad & {"reuse-hidden", "reuse-metrics-only"}:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        if "no-finish" in bad:
            finish = None
        if body.get("stream"):
            slow = prompt_chars > LONG_PROMPT_CHARS and (not cached or "reuse-metrics-only" in bad)
            return self._stream(message, finish, usage, completion if body.get("ignore_eos") else None, slow)
        choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
        if body.get("logprobs"):
            pieces = re.findall(r"\S+|\s+", message.get("content") or "")
            choice["logprobs"] = {"content": [{"token": t, "logprob": 0.0} for t in pieces]}
        reply = {"object": "chat.completion", "model": body["model"], "choices": [choice]}
        if "wrong-shape" in bad:
            reply["choices"] = ["not a choice object"]
        if "token-sha" in bad:  # not a fault: the engine's own reply identity
            reply["tensorfold"] = {"token_sha": hashlib.sha256(json.dumps(message).encode()).hexdigest()[:12]}
        if usage:
            reply["usage"] = usage
        self._send(200, reply)

    def _reuse(self, body, bad):
        """Prompt tokens this request finds cached: a later turn of a conversation whose first turn we saw."""
        first = self._text(body["messages"][0].get("content"))
        if len(first) < LONG_PROMPT_CHARS:
            return None
        seen = first in self.server.seen
        self.server.seen.add(first)
        if len(body["messages"]) == 1 or not seen or "no-reuse" in bad:
            return 0
        self.server.cached_total += len(first) // 4
        return len(first) // 4

    def _messages(self, body):
        bad = self.server.bad
        if "no-anthropic" in bad:
            return self._send(404, {"error": {"message": "unknown path"}})
        reply = {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                 "content": [{"type": "text", "text": "Paris."}], "stop_reason": "end_turn",
                 "usage": {"input_tokens": 12, "output_tokens": 2}}
        if "anthropic-shape" in bad:
            reply["content"] = "Paris."
        if "anthropic-no-stop" in bad:
            del reply["stop_reason"]
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

    @staticmethod
    def _weather(body, bad):
        """The smoke check's tool call (get_weather for Paris), and its answer in text once the result comes back."""
        call = {"id": "w1", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
        if body["messages"][-1].get("role") == "tool":
            forecast = json.loads(body["messages"][-1]["content"])["forecast"]
            if "tool-result-again" in bad:
                return {"content": None, "tool_calls": [call]}
            return {"content": None if "tool-result-empty" in bad else f"It is {forecast} in Paris."}
        if "no-tool-call" in bad:
            return {"content": "It is sunny in Paris."}
        return {"content": None, "tool_calls": [call]}

    def _tools(self, body, bad):
        choice = body.get("tool_choice", "auto")
        if body["tools"][0]["function"]["name"] == "get_weather":
            return self._weather(body, bad)
        results = [m for m in body["messages"] if m.get("role") == "tool"]
        if results:
            code = json.loads(results[-1]["content"])["confirmation"]
            return {"content": "Done." if "tools-result" in bad else f"Tagged. The confirmation code is {code}."}
        asked = "Tag document" in self._text(body["messages"][-1].get("content"))
        if choice == "none" and "none-ignored" not in bad:
            return {"content": "I would tag document 42 with add_tags."}
        if choice == "required" and "required-ignored" in bad:
            return {"content": "4"}
        if not asked and choice != "required":
            return {"content": "4"}
        tags = "urgent, finance, q3" if "tools" in bad else ["urgent", "finance", "q3"]
        call = {"id": "c1", "type": "function",
                "function": {"name": "add_tags", "arguments": json.dumps({"doc_id": 42, "tags": tags})}}
        return {"content": None, "tool_calls": [call]}

    def _answer(self, body, bad):
        prompt = "\n".join(self._text(m.get("content")) for m in body["messages"])
        thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        finish, message = "stop", {}
        if body.get("tools"):
            message = self._tools(body, bad)
            return message, "tool_calls" if message.get("tool_calls") else "stop"
        if self._images(body):
            message["content"] = "Red." if png_colour(self._images(body)[0]) == (220, 20, 20) else "Blue."
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
        elif prompt.startswith("Write a") and "eot-leak" in bad:
            message["content"] = "def f(x):\n    return x * x\n<｜end▁of▁sentence｜>"
        elif prompt.startswith("Count from 1 to 10"):
            message["content"] = "\n".join(str(n) for n in range(1, 11))
        elif "merges two sorted lists" in prompt and "exact-drift" in bad:
            message["content"] = "def merge(a, b):\n    return sorted(a + b)  # drifted\n"
        else:
            message["content"] = "Hello there, here you go."
        if "empty-reply" in bad:
            message["content"] = ""
        if "collapsed" in bad:
            message["content"] = "!" * 16
        for stop in body.get("stop") or []:
            if stop in message["content"] and "stop-ignored" not in bad:
                message["content"] = message["content"][:message["content"].index(stop)]
        if thinking and "thinking-on" not in bad:
            message["reasoning_content"] = "Let me think about it."
        if not thinking and "thinking-off" in bad:
            message["reasoning_content"] = "I thought anyway."
        if thinking and "thinking-leak" in bad:
            message["content"] = "<think>oops</think>" + message["content"]
        return message, finish

    def _raw(self, data: bytes):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        self.close_connection = True

    def _stream(self, message, finish, usage, tokens, slow):
        bad = self.server.bad
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        pieces = ["tok "] * tokens if tokens else (message.get("content") or "").split(" ")
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
        chunks += [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces if p]
        for call in message.get("tool_calls") or []:
            head = {"index": 0, "id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""}}
            chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [head]}}]})
            text = call["function"]["arguments"]
            parts = ([json.loads(text)] if "tools-stream-object" in bad
                     else [text[i:i + 7] for i in range(0, len(text), 7)])
            deltas = [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in parts]
            chunks += [{"choices": [{"index": 0, "delta": d}]} for d in deltas]
        if "stream-error" in bad:
            chunks.insert(2, {"error": {"message": "engine fault", "type": "server_error"}})
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if usage:
            chunks.append({"choices": [], "usage": usage})
        if slow:
            time.sleep(SLOW_PREFILL_S)
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if "no-done" not in bad:
            self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


@contextmanager
def serving(handler=Fake):
    """A running fake on a free port: `.url`, `.bad` (faults), `.require_key`, `.requests`, `.headers`,
    `.raw_stream` (bytes every streamed chat request gets verbatim)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.bad, httpd.require_key, httpd.requests, httpd.headers = set(), None, [], []
    httpd.raw_stream, httpd.seen, httpd.cached_total = None, set(), 0
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
