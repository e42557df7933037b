"""HTTP client for the server's OpenAI-compatible API (requests), with timing."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import requests

from operations.validate.sse import ChatChunks, StreamError

THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
THINKING_ON = {"chat_template_kwargs": {"enable_thinking": True}}


class CouldNotRun(Exception):
    """The server could not be asked (unreachable, refused our key, no such route): exit code 2."""


class NoRoute(CouldNotRun):
    """The server answered 404: it has no such route (a feature it lacks, or the wrong base URL)."""


class HttpError(Exception):
    """The server answered a request with an error status: the check fails."""

    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


@dataclass
class Reply:
    body: dict
    seconds: float

    @property
    def choice(self) -> dict:
        choices = self.body.get("choices") or [{}]
        return choices[0] or {}

    @property
    def message(self) -> dict:
        return self.choice.get("message") or {}

    @property
    def content(self) -> str:
        return self.message.get("content") or ""

    @property
    def reasoning(self) -> str:
        return self.message.get("reasoning_content") or self.message.get("reasoning") or ""

    @property
    def finish_reason(self) -> str | None:
        return self.choice.get("finish_reason")

    @property
    def usage(self) -> dict:
        return self.body.get("usage") or {}


@dataclass
class StreamReply:
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    usage: dict = field(default_factory=dict)
    ttft_s: float | None = None  # first content or reasoning delta
    seconds: float = 0.0
    tool_calls: list[dict] = field(default_factory=list)  # assembled from the deltas, in the message's shape
    done: bool = False  # the stream ended with data: [DONE]


def merge_tool_call(calls: dict[int, dict], delta: dict) -> None:
    """Fold one streamed tool-call delta into the calls so far. `arguments` must come as string pieces of JSON text
    (an object instead is how some servers break OpenAI clients)."""
    index = delta.get("index", 0)
    call = calls.setdefault(index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    if delta.get("id"):
        call["id"] = delta["id"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    pieces = function.get("arguments")
    if pieces is not None and not isinstance(pieces, str):
        raise StreamError(f"tool call {index}: arguments streamed as a JSON {type(pieces).__name__}, not a string: "
                          f"{json.dumps(pieces)[:200]}")
    call["function"]["arguments"] += pieces or ""


@contextmanager
def _broken_stream() -> Iterator[None]:
    """A connection lost in the middle of a stream, or a chunk of the wrong shape, is the server's fault: the check
    fails."""
    try:
        yield
    except requests.RequestException as e:
        raise StreamError(f"the stream broke off: {e.__class__.__name__}: {e}") from None
    except (AttributeError, TypeError) as e:  # a chunk whose choices/delta are not the API's shapes
        raise StreamError(f"a chunk of the wrong shape ({e})") from None


def read_key_file(path: str) -> str:
    """The first key in an engine key file (one a line, `label: key` allowed, # comments)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                return line.rsplit(":", 1)[-1].strip()
    raise CouldNotRun(f"no key in {path}")


class Client:
    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None, timeout: float = 1800):
        self.base = base_url.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.timeout = timeout
        self.api_key = api_key
        self._model = model
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def _request(self, method: str, path: str, stream: bool = False, **kwargs) -> requests.Response:
        try:
            response = self.session.request(method, self.base + path, timeout=self.timeout, stream=stream, **kwargs)
        except requests.RequestException as e:
            raise CouldNotRun(f"{method} {self.base}{path}: {e.__class__.__name__}: {e}") from None
        if response.status_code in (401, 403):
            raise CouldNotRun(f"{path}: HTTP {response.status_code}: the server wants a valid API key "
                              "(--api-key-file FILE or API_KEY)")
        if response.status_code == 404:
            raise NoRoute(f"{path}: HTTP 404: no such route on {self.base}")
        if response.status_code >= 400:
            raise HttpError(response.status_code, response.text)
        return response

    @property
    def model(self) -> str:
        if self._model is None:
            body = self._request("GET", "/v1/models").json()
            ids = [m.get("id") for m in body.get("data") or [] if m.get("id")]
            if not ids:
                raise CouldNotRun("/v1/models lists no model; pass --model")
            self._model = ids[0]
        return self._model

    def get(self, path: str) -> requests.Response:
        return self._request("GET", path)

    def post_json(self, path: str, payload: dict, headers: dict | None = None) -> Reply:
        """POST a JSON body and read a JSON object back (any route: chat, Anthropic Messages)."""
        start = time.monotonic()
        response = self._request("POST", path, json=payload, headers=headers)
        try:
            body = response.json()
        except ValueError:
            raise HttpError(response.status_code, "not JSON: " + response.text) from None
        if not isinstance(body, dict):
            raise HttpError(response.status_code, "not a JSON object: " + response.text)
        return Reply(body, time.monotonic() - start)

    def chat(self, messages: list[dict], **fields: Any) -> Reply:
        return self.post_json("/v1/chat/completions", {"model": self.model, "messages": messages, **fields})

    def chat_stream(self, messages: list[dict], **fields: Any) -> StreamReply:
        payload = {"model": self.model, "messages": messages, "stream": True,
                   "stream_options": {"include_usage": True}, **fields}
        out = StreamReply()
        start = time.monotonic()
        response = self._request("POST", "/v1/chat/completions", stream=True, json=payload)
        chunks = ChatChunks(response.iter_content(chunk_size=None))
        calls: dict[int, dict] = {}
        with response, _broken_stream():
            for chunk in chunks:
                if chunk.get("usage"):
                    out.usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or ""
                    thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
                    if (text or thought) and out.ttft_s is None:
                        out.ttft_s = time.monotonic() - start
                    out.content += text
                    out.reasoning += thought
                    for call in delta.get("tool_calls") or []:
                        merge_tool_call(calls, call)
                    if choice.get("finish_reason"):
                        out.finish_reason = choice["finish_reason"]
        out.tool_calls = [calls[i] for i in sorted(calls)]
        out.done = chunks.done
        out.seconds = time.monotonic() - start
        return out


def api_key_from(args_file: str | None, environ=os.environ) -> str | None:
    if args_file:
        return read_key_file(args_file)
    return environ.get("API_KEY") or None


def connect(args) -> Client:
    """The client the command line asks for (--base-url or API_URL, key file or API_KEY, --model, --timeout)."""
    if not args.base_url:
        raise CouldNotRun("--base-url (or API_URL) is required")
    return Client(args.base_url, api_key_from(args.api_key_file), args.model, args.timeout)
