"""Text checks: a plain answer, thinking on and off, end of turn on short prompts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from operations.validate.client import THINKING_OFF, THINKING_ON, Client
from operations.validate.result import FAIL, PASS, UNVERIFIED, Result

GREEDY = {"temperature": 0, "seed": 1234}
# Template and special-token text that must never reach a reply: DeepSeek's own (model/chat_template.jinja), then the
# ChatML and Llama end markers a wrongly configured engine or template lets through.
CONTROL_MARKERS = (
    "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜deepseek_image｜>",
    "｜DSML｜", "<think>", "</think>", "<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|eot_id|>",
)


def leaked_markers(text: str) -> list[str]:
    return [m for m in CONTROL_MARKERS if m in text]


def check_text(client: Client, args) -> Result:
    reply = client.chat([{"role": "user", "content": "What is the capital of France? Answer with one word."}],
                        max_tokens=64, **GREEDY, **THINKING_OFF)
    if "paris" in reply.content.lower():
        return Result("text", PASS, f"{reply.content.strip()[:60]!r} in {reply.seconds:.2f} s")
    return Result("text", FAIL, f"expected Paris, got {reply.content[:120]!r} (finish_reason {reply.finish_reason})")


def check_thinking_on(client: Client, args) -> Result:
    reply = client.chat([{"role": "user", "content": "Is 221 a prime number? Answer yes or no, then one line why."}],
                        max_tokens=args.think_tokens, **GREEDY, **THINKING_ON)
    if not reply.reasoning.strip():
        return Result("thinking-on", FAIL, "no reasoning_content with enable_thinking=true")
    if not reply.content.strip():
        hint = " (raise --think-tokens: max_tokens counts the reasoning too)" if reply.finish_reason == "length" else ""
        return Result("thinking-on", FAIL, f"reasoning but no answer in content{hint}")
    if "<think>" in reply.content or "</think>" in reply.content:
        return Result("thinking-on", FAIL, "think tags leaked into content")
    return Result("thinking-on", PASS,
                  f"{len(reply.reasoning)} chars of reasoning, then {reply.content.strip()[:40]!r}")


def check_thinking_off(client: Client, args) -> Result:
    reply = client.chat([{"role": "user", "content": "Say hello in one short sentence."}],
                        max_tokens=128, **GREEDY, **THINKING_OFF)
    if reply.reasoning.strip():
        return Result("thinking-off", FAIL, f"reasoning_content present with enable_thinking=false: "
                                            f"{reply.reasoning[:80]!r}")
    if "<think>" in reply.content or "</think>" in reply.content:
        return Result("thinking-off", FAIL, "think tags in content with enable_thinking=false")
    if not reply.content.strip():
        return Result("thinking-off", FAIL, "empty content")
    return Result("thinking-off", PASS, f"{reply.content.strip()[:60]!r}")


EOT_PROMPTS = [
    "Write a Python function that returns the square of a number.",
    "Write a bash one-liner that counts the lines of every .txt file in a folder.",
    "Write a JavaScript function that reverses a string.",
    "Write a SQL query that lists the ten newest rows of a table named orders.",
    "Write a Python function that checks whether a word is a palindrome.",
    "Write a C function that returns the larger of two integers.",
    "Write a Python list comprehension that keeps the even numbers of a list.",
    "Write a Go function that sums a slice of ints.",
]


def check_end_of_turn(client: Client, args) -> Result:
    def ask(prompt):
        return client.chat([{"role": "user", "content": prompt}], max_tokens=1024, **GREEDY, **THINKING_OFF)

    prompts = EOT_PROMPTS * args.repeat
    with ThreadPoolExecutor(max_workers=min(4, len(prompts))) as pool:
        replies = list(pool.map(ask, prompts))
    reasons = [r.finish_reason for r in replies]
    cut = reasons.count("length")
    stopped = reasons.count("stop")
    leaks = [leaked_markers(r.content) for r in replies]
    leaked = sorted({m for found in leaks for m in found})
    data = {"prompts": len(prompts), "stop": stopped, "length": cut, "leaked": leaked}
    problems = []
    if cut > args.max_cut:
        problems.append(f"{cut} of {len(prompts)} replies ran into max_tokens "
                        f"(finish_reason length; at most {args.max_cut} allowed)")
    if leaked:
        problems.append(f"control text in {sum(map(bool, leaks))} of {len(prompts)} replies: {', '.join(leaked)}")
    if problems:
        return Result("end-of-turn", FAIL, "; ".join(problems), data)
    if stopped + cut < len(prompts):
        return Result("end-of-turn", UNVERIFIED,
                      f"finish_reason missing or unexpected: {sorted(set(map(str, reasons)))}", data)
    return Result("end-of-turn", PASS, f"{stopped} of {len(prompts)} ended their turn (finish_reason stop), "
                                       "no control text in content", data)
