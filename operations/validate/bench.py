"""bench: prefill, decode and multi-stream figures from the server's usage counts and our timing, as JSON;
compare: two such records side by side, flagging drops beyond a tolerance."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from operations.validate.client import THINKING_OFF, Client
from operations.validate.context import paragraphs
from operations.validate.result import FAIL, NOT_RUN, PASS, UNVERIFIED, Result

KIND = "sparkfold-bench"
STORY = "Write a long story about a lighthouse keeper and the storm of the century."
# (path in the record, True when higher is better)
FIGURES = [
    (("prefill", "tok_s"), True),
    (("decode", "tok_s"), True),
    (("decode", "ttft_s"), False),
    (("multi", "tok_s_total"), True),
    (("multi", "tok_s_per_stream"), True),
]


class NoUsage(Exception):
    pass


def _decode(client: Client, tokens: int):
    reply = client.chat_stream([{"role": "user", "content": STORY}], max_tokens=tokens, temperature=0, seed=7,
                               ignore_eos=True, **THINKING_OFF)
    completion = reply.usage.get("completion_tokens")
    if not completion:
        raise NoUsage("the streamed reply carried no usage.completion_tokens")
    return reply, completion


def measure(client: Client, prefill_tokens: int, decode_tokens: int, streams: int) -> dict:
    prompt = "\n\n".join(paragraphs(prefill_tokens)) + "\n\nSummarise the text above in one word."
    pre = client.chat([{"role": "user", "content": prompt}], max_tokens=1, temperature=0, **THINKING_OFF)
    prompt_tokens = pre.usage.get("prompt_tokens")
    if not prompt_tokens:
        raise NoUsage("the reply carried no usage.prompt_tokens")

    one, completion = _decode(client, decode_tokens)
    ttft = one.ttft_s if one.ttft_s is not None else one.seconds
    decode_s = max(one.seconds - ttft, 1e-6)

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=streams) as pool:
        runs = list(pool.map(lambda _: _decode(client, decode_tokens), range(streams)))
    wall = max(time.monotonic() - start, 1e-6)
    total = sum(c for _, c in runs)
    return {
        "kind": KIND, "version": 1, "base_url": client.base, "model": client.model,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "prefill": {"prompt_tokens": prompt_tokens, "seconds": round(pre.seconds, 4),
                    "tok_s": round(prompt_tokens / max(pre.seconds, 1e-6), 2)},
        "decode": {"completion_tokens": completion, "ttft_s": round(ttft, 4), "seconds": round(one.seconds, 4),
                   "tok_s": round(max(completion - 1, 1) / decode_s, 2)},
        "multi": {"streams": streams, "completion_tokens": total, "seconds": round(wall, 4),
                  "tok_s_total": round(total / wall, 2), "tok_s_per_stream": round(total / wall / streams, 2)},
    }


def check_bench(client: Client, args) -> Result:
    try:
        record = measure(client, args.prefill_tokens, args.decode_tokens, args.streams)
    except NoUsage as e:
        return Result("bench", UNVERIFIED, f"{e}: figures need the server's token counts")
    text = json.dumps(record, indent=2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)
    return Result("bench", PASS, f"prefill {record['prefill']['tok_s']} tok/s, decode {record['decode']['tok_s']} "
                                 f"tok/s, {args.streams} streams {record['multi']['tok_s_total']} tok/s"
                                 + (f" -> {args.out}" if args.out else ""), record)


def _get(record: dict, path: tuple[str, str]):
    value = (record.get(path[0]) or {}).get(path[1])
    return value if isinstance(value, (int, float)) else None


def compare(a: dict, b: dict, tolerance_pct: float) -> dict:
    """Each figure of A and B with B's change in percent; `worse` lists figures that moved the wrong way by more
    than the tolerance."""
    rows, worse = {}, []
    for path, higher_better in FIGURES:
        va, vb = _get(a, path), _get(b, path)
        name = ".".join(path)
        if va is None or vb is None or va == 0:
            rows[name] = {"a": va, "b": vb, "change_pct": None}
            continue
        change = (vb - va) / va * 100
        rows[name] = {"a": va, "b": vb, "change_pct": round(change, 1)}
        if (change < -tolerance_pct) if higher_better else (change > tolerance_pct):
            worse.append(name)
    return {"figures": rows, "tolerance_pct": tolerance_pct, "worse": worse}


def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    if not isinstance(record, dict) or record.get("kind") != KIND:
        raise ValueError(f"{path} is not a {KIND} record")
    return record


def run_compare(path_a: str, path_b: str, tolerance_pct: float) -> Result:
    try:
        a, b = _load(path_a), _load(path_b)
    except (OSError, ValueError) as e:
        return Result("compare", NOT_RUN, str(e))
    report = compare(a, b, tolerance_pct)
    print(json.dumps(report, indent=2))
    if report["worse"]:
        return Result("compare", FAIL, f"worse than {path_a} by more than {tolerance_pct}%: "
                                       + ", ".join(report["worse"]), report)
    return Result("compare", PASS, f"no figure worse by more than {tolerance_pct}%", report)
