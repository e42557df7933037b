"""Tool calling, the way agents use it: a call whose array argument comes back as a JSON array (plain and streamed),
a tool result answered in text, and tool_choice "required" and "none" honoured."""

from __future__ import annotations

import json
import secrets

from operations.validate.client import THINKING_OFF, Client, HttpError
from operations.validate.result import FAIL, PASS, UNVERIFIED, Result, attempt, combine

ADD_TAGS = {
    "type": "function",
    "function": {
        "name": "add_tags",
        "description": "Add tags to a document.",
        "parameters": {
            "type": "object",
            "properties": {
                "doc_id": {"type": "integer", "description": "The document's id."},
                "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags to add."},
            },
            "required": ["doc_id", "tags"],
        },
    },
}
PROMPT = "Tag document 42 with 'urgent', 'finance' and 'q3' using the tool."


def judge(message: dict) -> str | None:
    """None when the message holds a well-typed add_tags call, else what is wrong."""
    calls = message.get("tool_calls") or []
    if not calls:
        return f"no tool call (content {str(message.get('content'))[:80]!r})"
    function = calls[0].get("function") or {}
    if function.get("name") != "add_tags":
        return f"called {function.get('name')!r}, not add_tags"
    raw = function.get("arguments")
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return f"arguments are not JSON: {raw!r}"
    if not isinstance(arguments, dict):
        return f"arguments are not an object: {raw!r}"
    tags = arguments.get("tags")
    if not isinstance(tags, list):
        return f"tags came back as {type(tags).__name__} {tags!r}, not a JSON array"
    if len(tags) < 3 or not all(isinstance(t, str) for t in tags):
        return f"tags should be at least 3 strings: {tags!r}"
    doc_id = arguments.get("doc_id")
    if isinstance(doc_id, bool) or not isinstance(doc_id, int):
        return f"doc_id came back as {type(doc_id).__name__} {doc_id!r}, not an integer"
    return None


def _ask(client: Client, messages: list[dict], **fields) -> dict:
    return client.chat(messages, tools=[ADD_TAGS], max_tokens=1024, temperature=0, **THINKING_OFF, **fields).message


def plain_call(client: Client) -> Result:
    message = _ask(client, [{"role": "user", "content": PROMPT}], tool_choice="auto")
    problem = judge(message)
    if problem:
        return Result("call", FAIL, problem)
    return Result("call", PASS, f"add_tags {message['tool_calls'][0]['function']['arguments']}")


def streamed_call(client: Client) -> Result:
    reply = client.chat_stream([{"role": "user", "content": PROMPT}], tools=[ADD_TAGS], tool_choice="auto",
                               max_tokens=1024, temperature=0, **THINKING_OFF)
    problem = judge({"tool_calls": reply.tool_calls, "content": reply.content})
    if problem:
        return Result("stream", FAIL, f"assembled from the deltas: {problem}")
    if not reply.done:
        return Result("stream", FAIL, "the stream ended without data: [DONE]")
    return Result("stream", PASS, f"add_tags {reply.tool_calls[0]['function']['arguments']} from the deltas")


def result_turn(client: Client) -> Result:
    """The call goes back with a `role: tool` result holding a code the model cannot guess; it must answer with it."""
    code = f"TAG-{secrets.randbelow(90000) + 10000}"
    arguments = json.dumps({"doc_id": 42, "tags": ["urgent", "finance", "q3"]})
    call = {"id": "call_1", "type": "function", "function": {"name": "add_tags", "arguments": arguments}}
    messages: list[dict] = [
        {"role": "user", "content": PROMPT + " Then tell me the confirmation code the tool returns."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"ok": True, "confirmation": code})},
    ]
    message = _ask(client, messages, tool_choice="auto")
    if message.get("tool_calls"):
        return Result("result", FAIL, "called the tool again instead of answering from its result")
    if code not in (message.get("content") or ""):
        return Result("result", FAIL, f"the answer does not use the result ({code}): "
                                      f"{str(message.get('content'))[:100]!r}")
    return Result("result", PASS, f"answered with {code}")


def _choice(client: Client, name: str, prompt: str, choice: str) -> dict | Result:
    """The reply's message, or an UNCHECKED result when the engine refuses this tool_choice (a 400 naming it)."""
    try:
        return _ask(client, [{"role": "user", "content": prompt}], tool_choice=choice)
    except HttpError as e:
        if e.status == 400 and "tool_choice" in e.body:
            return Result(name, UNVERIFIED, f"the server does not support tool_choice {choice!r}: {e}")
        raise


def choice_required(client: Client) -> Result:
    message = _choice(client, "required", "What is 2 + 2?", "required")
    if isinstance(message, Result):
        return message
    if not message.get("tool_calls"):
        return Result("required", FAIL, f"tool_choice required but no tool call "
                                        f"(content {str(message.get('content'))[:80]!r})")
    return Result("required", PASS, "called a tool for a question that needs none")


def choice_none(client: Client) -> Result:
    message = _choice(client, "none", PROMPT, "none")
    if isinstance(message, Result):
        return message
    if message.get("tool_calls"):
        return Result("none", FAIL, "tool_choice none but the reply calls a tool")
    if not (message.get("content") or "").strip():
        return Result("none", FAIL, "tool_choice none and no text either")
    return Result("none", PASS, "answered in text")


PARTS = {"call": plain_call, "stream": streamed_call, "result": result_turn, "required": choice_required,
         "none": choice_none}


def check_tools(client: Client, args) -> Result:
    return combine("tools", [attempt(name, part, client) for name, part in PARTS.items()])
