"""Tool calling: a tool with an array parameter must come back with that argument as a JSON array."""

from __future__ import annotations

import json

from operations.validate.client import THINKING_OFF, Client
from operations.validate.result import FAIL, PASS, Result

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
    fn = calls[0].get("function") or {}
    if fn.get("name") != "add_tags":
        return f"called {fn.get('name')!r}, not add_tags"
    raw = fn.get("arguments")
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


def check_tools(client: Client, args) -> Result:
    reply = client.chat([{"role": "user", "content": PROMPT}], tools=[ADD_TAGS], tool_choice="auto",
                        max_tokens=1024, temperature=0, **THINKING_OFF)
    problem = judge(reply.message)
    if problem:
        return Result("tools", FAIL, problem)
    return Result("tools", PASS, f"add_tags {reply.message['tool_calls'][0]['function']['arguments']}")
