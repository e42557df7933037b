"""smoke: the quick post-deploy check, and the deploy's own (operations/rank/serving.py). The server is healthy, gives a
real reply that honours a stop string, streams to a proper end, and makes a tool call."""

from __future__ import annotations

import json
from collections.abc import Callable

from operations.validate.client import THINKING_OFF, Client, NoRoute
from operations.validate.result import FAIL, PASS, Result, attempt, combine
from operations.validate.text import GREEDY

STOP = "7"
STOP_PROMPT = "Count from 1 to 10, one number per line, nothing else."
TOOL_PROMPT = "What is the weather in Paris? Use the tool."
TOOL_NAME = "get_weather"
WEATHER = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


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


def broken_text(text: str) -> str | None:
    """What is wrong with a reply's text that no prompt explains (empty, or collapsed into one character), or None."""
    text = text.strip()
    if not text:
        return "empty reply"
    if len(text) > 3 and len(set(text)) == 1:
        return f"one character repeated ({text[:40]!r}): the model collapsed"
    return None


def reply(client: Client) -> Result:
    answer = client.chat([{"role": "user", "content": STOP_PROMPT}], stop=[STOP], max_tokens=64, **GREEDY,
                         **THINKING_OFF)
    problem = broken_text(answer.content)
    if problem:
        return Result("reply", FAIL, f"{problem} (finish_reason {answer.finish_reason})")
    if STOP in answer.content:
        return Result("reply", FAIL, f"the stop string {STOP!r} is in the reply: {answer.content[:80]!r}")
    tokens = answer.usage.get("completion_tokens")
    return Result("reply", PASS, f"{answer.content.strip()[:40]!r} ({tokens} tokens), stopped before {STOP!r} "
                                 f"(finish_reason {answer.finish_reason})")


def streaming(client: Client) -> Result:
    answer = client.chat_stream([{"role": "user", "content": "Say hello in one short sentence."}], max_tokens=64,
                                **GREEDY, **THINKING_OFF)
    problem = broken_text(answer.content)
    if problem:
        return Result("stream", FAIL, f"assembled from the deltas: {problem}")
    if not answer.finish_reason:
        return Result("stream", FAIL, "no finish_reason in the stream")
    if not answer.done:
        return Result("stream", FAIL, "the stream ended without data: [DONE]")
    return Result("stream", PASS, f"{answer.content.strip()[:40]!r}, finish_reason {answer.finish_reason}, [DONE]")


def weather_call_problem(message: dict) -> str | None:
    """None when the message calls TOOL_NAME with a JSON object of arguments, else what is wrong."""
    calls = message.get("tool_calls") or []
    if not calls:
        return f"asked for a tool call and got none (content {str(message.get('content'))[:80]!r})"
    function = calls[0].get("function") or {}
    if function.get("name") != TOOL_NAME:
        return f"asked for {TOOL_NAME} and got a call of {function.get('name')!r}"
    try:
        arguments = json.loads(function.get("arguments") or "")
    except (TypeError, ValueError):
        return f"the tool call's arguments are not JSON text: {function.get('arguments')!r}"
    if not isinstance(arguments, dict):
        return f"the tool call's arguments are not a JSON object: {function.get('arguments')!r}"
    return None


def tool_call(client: Client) -> Result:
    message = client.chat([{"role": "user", "content": TOOL_PROMPT}], tools=[WEATHER], max_tokens=128,
                          temperature=0, **THINKING_OFF).message
    problem = weather_call_problem(message)
    if problem:
        return Result("tool", FAIL, problem)
    function = message["tool_calls"][0]["function"]
    return Result("tool", PASS, f"{function['name']}({function['arguments']})")


PARTS = {"health": health, "reply": reply, "stream": streaming, "tool": tool_call}


def judged(name: str, part: Callable[[Client], Result], client: Client) -> Result:
    """attempt(), and a reply whose choices, message or calls are not the API's objects fails the part: the deploy
    then shows the ranks' logs instead of a traceback."""
    try:
        return attempt(name, part, client)
    except (AttributeError, KeyError, IndexError, TypeError) as e:
        return Result(name, FAIL, f"an answer of the wrong shape ({type(e).__name__}: {e})")


def smoke_parts(client: Client) -> list[Result]:
    """Every part's verdict, in order: the deploy logs each one, the command line combines them."""
    return [judged(name, part, client) for name, part in PARTS.items()]


def check_smoke(client: Client, args) -> Result:
    return combine("smoke", smoke_parts(client))
