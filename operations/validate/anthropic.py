"""The Anthropic Messages route (POST /v1/messages), which Claude-style clients use: a proper Messages reply with
content blocks and a stop_reason. Such clients send the key as `x-api-key`, so that is how it is sent here."""

from __future__ import annotations

from operations.validate.client import Client, NoRoute
from operations.validate.result import FAIL, NOT_RUN, PASS, Result

VERSION = "2023-06-01"
STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"}
QUESTION = "What is the capital of France? Answer with one word."


def headers(client: Client) -> dict:
    """Messages headers: the version, and the key as x-api-key in place of the session's Bearer header."""
    out: dict = {"anthropic-version": VERSION}
    if client.api_key:
        out.update({"x-api-key": client.api_key, "Authorization": None})  # None drops the session's header
    return out


def judge(body: dict) -> str | None:
    """None for a Messages reply that answers the question, else what is wrong with it."""
    if body.get("type") != "message" or body.get("role") != "assistant":
        return f"not a Messages reply (type {body.get('type')!r}, role {body.get('role')!r})"
    blocks = body.get("content")
    if not isinstance(blocks, list) or not all(isinstance(b, dict) and b.get("type") for b in blocks):
        return f"content is not a list of typed blocks: {str(blocks)[:120]!r}"
    if body.get("stop_reason") not in STOP_REASONS:
        return f"stop_reason {body.get('stop_reason')!r} is not one of {', '.join(sorted(STOP_REASONS))}"
    text = "".join(b.get("text") or "" for b in blocks if b["type"] == "text")
    if "paris" not in text.lower():
        return f"expected Paris in the text blocks, got {text[:120]!r} (stop_reason {body['stop_reason']})"
    return None


def check_anthropic(client: Client, args) -> Result:
    payload = {"model": client.model, "max_tokens": 1024, "temperature": 0, "thinking": {"type": "disabled"},
               "messages": [{"role": "user", "content": QUESTION}]}
    try:
        reply = client.post_json("/v1/messages", payload, headers=headers(client))
    except NoRoute:
        return Result("anthropic", NOT_RUN, "the server has no Anthropic Messages route (POST /v1/messages: 404)")
    problem = judge(reply.body)
    if problem:
        return Result("anthropic", FAIL, problem)
    kinds = ", ".join(b["type"] for b in reply.body["content"])
    return Result("anthropic", PASS, f"blocks [{kinds}], stop_reason {reply.body['stop_reason']}, "
                                     f"in {reply.seconds:.2f} s")
