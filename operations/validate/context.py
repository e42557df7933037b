"""Long prompts: a long document whose last paragraph number must be read back, and a passphrase (needle) hidden
at a depth of generated prose (60% unless --needle-depth). Sizes are in approximate tokens (4 characters each)."""

from __future__ import annotations

import secrets

from operations.validate.client import THINKING_OFF, Client, CouldNotRun
from operations.validate.result import FAIL, PASS, Result

CHARS_PER_TOKEN = 4
_SENTENCES = [
    "The harbour lights came on one by one as the fishing boats returned.",
    "A gull argued with the wind above the grey stone pier.",
    "Nets were folded, ropes were coiled, and the market stalls closed early.",
    "Somewhere up the hill a bell rang for the evening service.",
    "The keeper climbed the spiral stairs and trimmed the great lamp.",
]


def paragraphs(tokens: int) -> list[str]:
    """Numbered filler paragraphs adding up to about `tokens` tokens."""
    out, size, number = [], 0, 0
    while size < tokens * CHARS_PER_TOKEN:
        number += 1
        text = f"Paragraph {number}. " + " ".join(_SENTENCES[(number + i) % len(_SENTENCES)] for i in range(4))
        out.append(text)
        size += len(text) + 2
    return out


def _usage_note(reply) -> tuple[str, dict]:
    usage = reply.usage
    data = {"prompt_tokens": usage.get("prompt_tokens"), "seconds": round(reply.seconds, 3)}
    prefill = (reply.body.get("tensorfold") or {}).get("prefill_s")
    if prefill is not None:
        data["prefill_s"] = prefill
    return f"{data['prompt_tokens']} prompt tokens in {reply.seconds:.1f} s", data


def check_long(client: Client, args) -> Result:
    parts = paragraphs(args.long_tokens)
    prompt = "\n\n".join(parts) + "\n\nWhat is the number of the last paragraph above? Reply with the number only."
    reply = client.chat([{"role": "user", "content": prompt}], max_tokens=64, temperature=0, seed=1234,
                        **THINKING_OFF)
    note, data = _usage_note(reply)
    want = str(len(parts))
    if want in reply.content:
        return Result("long", PASS, f"read to paragraph {want}; {note}", data)
    return Result("long", FAIL, f"expected {want}, got {reply.content[:80]!r}; {note}", data)


def needle_prompt(tokens: int, secret: str, depth: float = 0.6) -> str:
    parts = paragraphs(tokens)
    parts.insert(int(len(parts) * depth), f"Remember this: the secret passphrase is {secret}.")
    return ("\n\n".join(parts) + "\n\nWhat is the secret passphrase mentioned in the text above? "
            "Reply with the passphrase only.")


def check_needle(client: Client, args) -> Result:
    secret = f"violet-harbor-{secrets.randbelow(9000) + 1000}"  # new each run: no cached answer can pass
    if not 0 <= args.needle_depth <= 1:
        raise CouldNotRun(f"--needle-depth {args.needle_depth}: give a fraction from 0 (start) to 1 (end)")
    prompt = needle_prompt(args.needle_tokens, secret, args.needle_depth)
    reply = client.chat([{"role": "user", "content": prompt}], max_tokens=2048, temperature=0, seed=1234,
                        **THINKING_OFF)
    note, data = _usage_note(reply)
    where = f"at {args.needle_depth:.0%} depth"
    data["depth"] = args.needle_depth
    if secret in reply.content:
        return Result("needle", PASS, f"found {secret} {where}; {note}", data)
    return Result("needle", FAIL, f"{secret} ({where}) not in {reply.content[:80]!r}; {note}", data)
