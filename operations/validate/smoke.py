"""smoke: the quick post-deploy check. The server is healthy, honours a stop string, and streams to a proper end."""

from __future__ import annotations

from operations.validate.client import THINKING_OFF, Client, NoRoute
from operations.validate.result import FAIL, PASS, Result, attempt, combine
from operations.validate.text import GREEDY

STOP = "7"
STOP_PROMPT = "Count from 1 to 10, one number per line, nothing else."


def health(client: Client) -> Result:
    """/health (open even with keys), else /v1/models for servers without it."""
    for path in ("/health", "/v1/models"):
        try:
            response = client.get(path)
        except NoRoute:
            continue
        try:
            status = response.json().get("status", "ok") if path == "/health" else "ok"
        except (ValueError, AttributeError):
            status = "ok"  # a 200 that is not a JSON object still says the server is up
        if status != "ok":
            return Result("health", FAIL, f"{path} says status {status!r}")
        return Result("health", PASS, f"{path} {response.status_code}")
    return Result("health", FAIL, "neither /health nor /v1/models exists")


def stop_string(client: Client) -> Result:
    reply = client.chat([{"role": "user", "content": STOP_PROMPT}], stop=[STOP], max_tokens=64, **GREEDY,
                        **THINKING_OFF)
    if STOP in reply.content:
        return Result("stop", FAIL, f"the stop string {STOP!r} is in the reply: {reply.content[:80]!r}")
    if not reply.content.strip():
        return Result("stop", FAIL, f"empty reply (finish_reason {reply.finish_reason})")
    return Result("stop", PASS, f"stopped before {STOP!r} (finish_reason {reply.finish_reason})")


def streaming(client: Client) -> Result:
    reply = client.chat_stream([{"role": "user", "content": "Say hello in one short sentence."}], max_tokens=64,
                               **GREEDY, **THINKING_OFF)
    if not reply.content.strip():
        return Result("stream", FAIL, "no content in the deltas")
    if not reply.finish_reason:
        return Result("stream", FAIL, "no finish_reason in the stream")
    if not reply.done:
        return Result("stream", FAIL, "the stream ended without data: [DONE]")
    return Result("stream", PASS, f"{len(reply.content)} chars, finish_reason {reply.finish_reason}, [DONE]")


PARTS = {"health": health, "stop": stop_string, "stream": streaming}


def check_smoke(client: Client, args) -> Result:
    return combine("smoke", [attempt(name, part, client) for name, part in PARTS.items()])
