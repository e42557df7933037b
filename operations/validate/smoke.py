"""smoke: the quick post-deploy check, and the deploy's own (operations/rank/serving.py). The server is healthy, gives a
real reply that honours a stop string, streams to a proper end, makes a tool call, and answers the tool's result in
text (the agent loop's second turn)."""

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


def tool_call(client: Client, calls: list[dict] | None = None) -> Result:
    """The call; a good one is added to `calls` for the result turn to answer."""
    message = client.chat([{"role": "user", "content": TOOL_PROMPT}], tools=[WEATHER], max_tokens=128,
                          temperature=0, **THINKING_OFF).message
    problem = weather_call_problem(message)
    if problem:
        return Result("tool", FAIL, problem)
    if calls is not None:
        calls.append(message["tool_calls"][0])
    function = message["tool_calls"][0]["function"]
    return Result("tool", PASS, f"{function['name']}({function['arguments']})")


# The call the result turn answers when the tool part got none of its own (that part fails for it): each part is
# judged on its own, so a server that answers results but makes no call fails `tool` only.
FALLBACK_CALL = {"id": "call_smoke", "type": "function",
                "function": {"name": TOOL_NAME, "arguments": json.dumps({"city": "Paris"})}}
WEATHER_RESULT = {"city": "Paris", "forecast": "sunny", "celsius": 21}


def tool_result(client: Client, calls: list[dict] | None = None) -> Result:
    """The agent loop's second turn: the assistant's call and a `role: tool` result go back; the server must answer
    in text, with no further call."""
    call = (calls or [FALLBACK_CALL])[0]
    call_id = call.get("id") or FALLBACK_CALL["id"]
    messages: list[dict] = [
        {"role": "user", "content": TOOL_PROMPT},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call_id, "type": "function", "function": call["function"]}]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps(WEATHER_RESULT)},
    ]
    answer = client.chat(messages, tools=[WEATHER], max_tokens=128, temperature=0, **THINKING_OFF)
    if answer.message.get("tool_calls"):
        return Result("tool-result", FAIL, "answered the tool's result with another tool call, not text "
                                           f"(finish_reason {answer.finish_reason})")
    problem = broken_text(answer.content)
    if problem == "empty reply":
        return Result("tool-result", FAIL, "the reply to the tool's result has no text "
                                           f"(finish_reason {answer.finish_reason})")
    if problem:
        return Result("tool-result", FAIL, f"the reply to the tool's result: {problem}")
    return Result("tool-result", PASS, f"{answer.content.strip()[:60]!r} (finish_reason {answer.finish_reason})")


PARTS = {"health": health, "reply": reply, "stream": streaming}


def judged(name: str, part: Callable[..., Result], client: Client, *more: object) -> Result:
    """attempt(), and a reply whose choices, message or calls are not the API's objects fails the part: the deploy
    then shows the ranks' logs instead of a traceback."""
    try:
        return attempt(name, part, client, *more)
    except (AttributeError, KeyError, IndexError, TypeError) as e:
        return Result(name, FAIL, f"an answer of the wrong shape ({type(e).__name__}: {e})")


def smoke_parts(client: Client) -> list[Result]:
    """Every part's verdict, in order (health, reply, stream, tool, tool-result): the deploy logs each one, the
    command line combines them."""
    calls: list[dict] = []  # the tool part's call, answered by the tool-result part
    return [*(judged(name, part, client) for name, part in PARTS.items()),
            judged("tool", tool_call, client, calls), judged("tool-result", tool_result, client, calls)]


def check_smoke(client: Client, args) -> Result:
    return combine("smoke", smoke_parts(client))
