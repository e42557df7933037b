"""HTTP client for the server's OpenAI-compatible API (requests), with timing."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import ssl
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import urlsplit

import requests

from operations.validate.sse import ChatChunks, StreamError

THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
THINKING_ON = {"chat_template_kwargs": {"enable_thinking": True}}
# Where the server and its key may come from after the options, first found wins: the OpenAI SDK's variables (what
# docs/clients.md exports and every OpenAI client reads, so the advice "export OPENAI_API_KEY" always takes effect;
# OPENAI_BASE_URL ends in /v1, which the client takes off), then the older names of docs/measurements.md.
URL_VARIABLES = ("OPENAI_BASE_URL", "API_URL")
KEY_VARIABLES = ("OPENAI_API_KEY", "API_KEY")
KEY_ON_HEAD = "~/.local/state/sparkfold/api-key.d/key"
STATUS_COMMAND = "`pyinfra inventory.py status.py -y`"


class CouldNotRun(Exception):
    """The server could not be asked (unreachable, refused our key, no such route): exit code 2."""


class ServerUnusable(CouldNotRun):
    """Nothing can be asked of the server (no answer, or it refuses our key): every check would say the same, so the
    run stops with this one line."""


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
    """The first key in an engine key file (one a line, `label: key` allowed, # comments); CouldNotRun naming
    --api-key-file when the file is missing, unreadable or holds no key."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    return line.rsplit(":", 1)[-1].strip()
    except FileNotFoundError:
        raise CouldNotRun(f"--api-key-file {path}: no such file (copy {KEY_ON_HEAD} from the head)") from None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not text"
        raise CouldNotRun(f"--api-key-file {path}: cannot read it ({reason})") from None
    raise CouldNotRun(f"--api-key-file {path}: no key in the file (copy {KEY_ON_HEAD} from the head)")


class Client:
    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None, timeout: float = 1800,
                 key_source: str | None = None):
        self.base = base_url.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.timeout = timeout
        self.api_key = api_key
        self.key_source = key_source if api_key else None  # where the key came from, for the line when it is refused
        self._model = model
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def _request(self, method: str, path: str, stream: bool = False, **kwargs) -> requests.Response:
        try:
            response = self.session.request(method, self.base + path, timeout=self.timeout, stream=stream, **kwargs)
        except requests.RequestException as e:
            raise request_failure(e, self.base, f"{method} {path}", self.timeout) from None
        if response.status_code in (401, 403):
            raise ServerUnusable(key_refused(self.base, response.status_code, self.key_source))
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


def _causes(error: BaseException) -> Iterator[BaseException]:
    """The error and everything it wraps: requests wraps urllib3's MaxRetryError, whose `reason` wraps the socket's."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        cause = todo.pop(0)
        if cause is None or id(cause) in seen:
            continue
        seen.add(id(cause))
        yield cause
        todo += [cause.__cause__, cause.__context__, getattr(cause, "reason", None)]
        todo += [a for a in cause.args if isinstance(a, BaseException)]


def no_answer_reason(error: BaseException) -> str:
    """Why a connection failed, in a few words (the socket's reason, not urllib3's retry story)."""
    for cause in _causes(error):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return "host name not found"
        if isinstance(cause, (TimeoutError, requests.ConnectTimeout)):
            return "no connection within the timeout"
        if isinstance(cause, ssl.SSLError):
            return f"TLS failed: {cause.reason or cause.__class__.__name__}"
        if isinstance(cause, OSError) and cause.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return os.strerror(cause.errno).lower()
        if isinstance(cause, ConnectionResetError):
            return "connection reset"
    return error.__class__.__name__


def request_failure(error: requests.RequestException, base: str, what: str, timeout: float) -> CouldNotRun:
    """One line for a request that got no HTTP answer: a server that is not there stops the run and names the fix;
    a reply slower than --timeout is that check's NOT RUN."""
    if isinstance(error, requests.ReadTimeout):
        return CouldNotRun(f"{what}: no reply from {base} within {timeout:g} s (--timeout)")
    if isinstance(error, requests.ConnectionError):
        reason = no_answer_reason(error)
        if reason.startswith("TLS failed") and base.startswith("https://"):
            return ServerUnusable(f"no answer from {base} ({reason}): the pair serves plain http; use "
                                  f"http://{base[len('https://'):]}")
        return ServerUnusable(f"no answer from {base} ({reason}): is the pair up? {STATUS_COMMAND}")
    return CouldNotRun(f"{what} at {base}: {error.__class__.__name__}: {str(error).splitlines()[0][:200]}")


def key_refused(base: str, status: int, key_source: str | None) -> str:
    """The line for a 401/403: which key the server expects, and where ours came from."""
    if key_source is None:
        return (f"{base} wants an API key (HTTP {status}): copy {KEY_ON_HEAD} from the head and pass "
                "--api-key-file FILE, or export OPENAI_API_KEY")
    return (f"{base} refused the API key from {key_source} (HTTP {status}): it expects the one in {KEY_ON_HEAD} "
            "on the head (--api-key-file FILE, or export OPENAI_API_KEY)")


def _ignored(others: list[str], one: str, several: str) -> str:
    """"A holds a different key and is ignored", "A and B hold different keys and are ignored"."""
    if len(others) == 1:
        return f"{others[0]} {one} and is ignored"
    return f"{' and '.join(others)} {several} and are ignored"


def api_key_and_source(args_file: str | None, environ: Mapping[str, str] = os.environ,
                       notes: list[str] | None = None) -> tuple[str | None, str | None]:
    """(the key, where it came from): --api-key-file, else OPENAI_API_KEY, else API_KEY; (None, None) for none.
    When another source holds a different key, a line naming the one used (never a key) goes to `notes`."""
    found = [(f"--api-key-file {args_file}", read_key_file(args_file))] if args_file else []
    found += [(name, environ[name]) for name in KEY_VARIABLES if environ.get(name)]
    if not found:
        return None, None
    (source, key), others = found[0], [name for name, other in found[1:] if other != found[0][1]]
    if others and notes is not None:
        notes.append(f"using the API key from {source}; "
                     + _ignored(others, "holds a different key", "hold different keys"))
    return key, source


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _server(url: str) -> str:
    """A base URL as the client uses it (no trailing / or /v1), to tell whether two sources name the same server."""
    return url.rstrip("/").removesuffix("/v1").rstrip("/")


def base_url_from(given: str | None, environ: Mapping[str, str] = os.environ, notes: list[str] | None = None) -> str:
    """The server's base URL: --base-url, else OPENAI_BASE_URL, else API_URL; with or without /v1. An http or https
    URL with a host, or CouldNotRun saying what is wrong with it in one line. When another source names a different
    server, a line naming the one used goes to `notes`."""
    found = [("--base-url", given)] if given else []
    found += [(name, environ[name]) for name in URL_VARIABLES if environ.get(name)]
    if not found:
        raise CouldNotRun("no server given: --base-url http://<head>:8888, or export OPENAI_BASE_URL="
                          "http://<head>:8888/v1")
    def named(source: str, value: str) -> str:
        return f"{source} {value}" if source == "--base-url" else f"{source}={value}"

    where, url = named(*found[0]), found[0][1]
    others = [named(source, value) for source, value in found[1:] if _server(value) != _server(url)]
    if others and notes is not None:
        notes.append(f"using the server from {where}; "
                     + _ignored(others, "names a different server", "name different servers"))
    scheme = _SCHEME.match(url)
    if not scheme:
        _bad_url(where, "no http:// or https:// at the start")
    if scheme.group(1).lower() not in ("http", "https"):
        _bad_url(where, f"the scheme is {scheme.group(1)}, not http or https")
    parts = urlsplit(url)
    if not parts.hostname:
        _bad_url(where, "no host after the scheme")
    try:
        parts.port  # noqa: B018 (urllib checks the port when it is read)
    except ValueError:
        _bad_url(where, "the port is not a number from 0 to 65535")
    return url


def _bad_url(where: str, problem: str) -> NoReturn:
    raise CouldNotRun(f"{where}: {problem} (e.g. http://<head>:8888)")


def connect(args, say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> Client:
    """The client the command line asks for (base URL and key from the options or the environment, --model,
    --timeout). Sources that disagree get one line each, naming the one used."""
    notes: list[str] = []
    url = base_url_from(args.base_url, notes=notes)
    key, key_source = api_key_and_source(args.api_key_file, notes=notes)
    for note in notes:
        say(f"note: {note}")
    return Client(url, key, args.model, args.timeout, key_source)
