"""Prompt reuse: the second turn of a long conversation must not pay for the first turn's prompt again. Evidence, in
the order trusted: the reply's `usage.prompt_tokens_details.cached_tokens`, the `/metrics` counter of cached prompt
tokens, and a time to first token at most REUSE_TTFT_RATIO of the first turn's."""

from __future__ import annotations

import secrets

from operations.util import prometheus
from operations.validate.client import THINKING_OFF, Client, CouldNotRun, HttpError, StreamReply
from operations.validate.context import paragraphs
from operations.validate.result import FAIL, PASS, UNVERIFIED, Result

REUSE_TTFT_RATIO = 0.5  # without reuse both turns prefill the same tokens and take about as long
METRIC = "tensorfold_cached_tokens_total"


def cached_tokens(usage: dict) -> int | None:
    value = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return value if isinstance(value, int) else None


def metric_total(client: Client) -> float | None:
    """The sum of the cached-token counter over its labels; None when the server has no such metric to show us."""
    try:
        text = client.get("/metrics").text
    except (CouldNotRun, HttpError):
        return None
    return prometheus.totals(prometheus.parse(text), [METRIC]).get(METRIC)


def _turn(client: Client, messages: list[dict]) -> StreamReply:
    return client.chat_stream(messages, max_tokens=32, temperature=0, seed=1234, **THINKING_OFF)


def check_prompt_reuse(client: Client, args) -> Result:
    # a new opening line each run, so the first turn cannot itself hit a cache left by an earlier run
    opening = f"Conversation {secrets.token_hex(6)}. Read the text below."
    document = "\n\n".join([opening, *paragraphs(args.reuse_tokens)])
    messages = [{"role": "user", "content": document + "\n\nHow many paragraphs are above? Reply with a number."}]
    first = _turn(client, messages)
    before = metric_total(client)
    messages += [{"role": "assistant", "content": first.content},
                 {"role": "user", "content": "Now reply with the word harbour only."}]
    second = _turn(client, messages)
    after = metric_total(client)

    cached1, cached2 = cached_tokens(first.usage), cached_tokens(second.usage)
    ttft1, ttft2 = first.ttft_s, second.ttft_s
    data = {"cached_tokens": [cached1, cached2], "metric": [before, after], "ttft_s": [ttft1, ttft2],
            "prompt_tokens": second.usage.get("prompt_tokens")}
    timing = (f"TTFT {ttft1:.2f} s then {ttft2:.2f} s" if ttft1 is not None and ttft2 is not None
              else "no time to first token (no content deltas)")
    if cached2 is not None and cached2 > (cached1 or 0):
        return Result("prompt-reuse", PASS, f"turn 2 reused {cached2} of {data['prompt_tokens']} prompt tokens; "
                                            f"{timing}", data)
    if before is not None and after is not None and after > before:
        return Result("prompt-reuse", PASS, f"/metrics {METRIC} rose by {after - before:g}; {timing}", data)
    if ttft1 is not None and ttft2 is not None and ttft2 <= ttft1 * REUSE_TTFT_RATIO:
        return Result("prompt-reuse", PASS, f"{timing}: turn 2 answered {ttft1 / max(ttft2, 1e-6):.1f}x sooner", data)
    if ttft1 is None or ttft2 is None:
        return Result("prompt-reuse", UNVERIFIED, f"{timing}, and no cached-token counter rose", data)
    counters = (f"cached_tokens {cached1} then {cached2}" if cached2 is not None
                else "no usage.prompt_tokens_details.cached_tokens")
    counters += f", {METRIC} {before} then {after}" if before is not None else f", no {METRIC} in /metrics"
    return Result("prompt-reuse", FAIL, f"turn 2 was not reused: {timing} (want at most {REUSE_TTFT_RATIO:.0%}); "
                                        f"{counters}", data)
