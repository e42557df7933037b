"""Server-sent events read as the HTML standard says, and the OpenAI stream framing on top of them.

Why our own: requests' iter_lines splits text on every Unicode line break, so a JSON chunk holding U+2028, U+2029 or
U+0085 came apart. Here only CR, LF and CRLF end a line, `data:` lines join with LF, and an error in the stream is an
error, never a quiet end."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

DONE = "[DONE]"
_LINE_END = re.compile(rb"\r\n|\r|\n")


class StreamError(Exception):
    """The stream carried an error event or broke the framing: the check fails."""


@dataclass(frozen=True)
class Event:
    data: str
    type: str = "message"
    id: str = ""


def lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The stream's lines, split on CRLF, LF or CR only; a CRLF cut between two chunks ends one line, not two.
    A last line without its end is dropped: the standard discards an unfinished event."""
    pending = b""
    skip_lf = False  # the previous chunk ended in CR: an LF opening this one belongs to it
    first = True
    for chunk in chunks:
        if not chunk:
            continue
        if skip_lf and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        skip_lf = False
        buffer, start = pending + chunk, 0
        for end in _LINE_END.finditer(buffer):
            line = buffer[start:end.start()].decode("utf-8", "replace")
            if first:
                line, first = line.removeprefix("\ufeff"), False
            start = end.end()
            skip_lf = end.group() == b"\r" and start == len(buffer)
            yield line
        pending = buffer[start:]


def events(stream_lines: Iterable[str]) -> Iterator[Event]:
    """Events dispatched at each blank line: `data` lines joined with LF, `event` names the type, `:` comments and
    unknown fields ignored, an event without data not dispatched."""
    data: list[str] = []
    kind, last_id = "", ""
    for line in stream_lines:
        if not line:
            if data:
                yield Event("\n".join(data), kind or "message", last_id)
            data, kind = [], ""
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            kind = value
        elif name == "id" and "\0" not in value:
            last_id = value


class ChatChunks:
    """The JSON chunks of an OpenAI-style stream, up to `data: [DONE]` (`done` then turns true). An `error` event
    or a chunk with a top-level "error" raises StreamError, as does data that is not a JSON object."""

    def __init__(self, chunks: Iterable[bytes]):
        self._events = events(lines(chunks))
        self.done = False

    def __iter__(self) -> Iterator[dict]:
        for event in self._events:
            if event.data.strip() == DONE:
                self.done = True
                return
            if event.type == "error":
                raise StreamError(f"error event in the stream: {event.data[:300]}")
            try:
                chunk = json.loads(event.data)
            except ValueError:
                raise StreamError(f"a stream event is not JSON: {event.data[:200]!r}") from None
            if not isinstance(chunk, dict):
                raise StreamError(f"a stream event is not a JSON object: {event.data[:200]!r}")
            if chunk.get("error"):
                raise StreamError(f"error in the stream: {json.dumps(chunk['error'])[:300]}")
            yield chunk
