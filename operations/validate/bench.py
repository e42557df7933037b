"""bench: the recipe's measurements against a running server. A prefill sweep over prompt sizes (counted by the
server's usage.prompt_tokens) and decode at 1-4 concurrent streams on prose and code prompts, at each temperature,
thinking on and off. Prints a progress line per measurement, then the tables; the record is versioned JSON.
compare: two records figure by figure (a table, or JSON with --json), failing when a figure moved the wrong way by
more than a tolerance.

Figures (docs/validate.md, "bench records and compare"):
- prefill tok/s: usage.prompt_tokens over the wall time of a 1-token, non-streamed request;
- decode, per stream: (completion_tokens - 1) over the time after the stream's first delta;
- decode, total: the streams' tokens after their first, over the time from the first first delta to the last end;
- TTFT: the time to a stream's first content or reasoning delta (mean of the streams; the largest is kept too).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TextIO

from operations.validate.client import THINKING_OFF, THINKING_ON, Client, HttpError
from operations.validate.context import CHARS_PER_TOKEN, paragraphs
from operations.validate.result import FAIL, NOT_RUN, PASS, UNVERIFIED, Result
from operations.validate.sse import StreamError

KIND = "sparkfold-bench"
VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: the headline figures only (prefill, decode, multi)

PROMPTS = {
    "prose": "Write a long story about a lighthouse keeper and the storm of the century.",
    "code": "Write a complete Python module implementing a thread-safe LRU cache with expiry, type hints, "
            "docstrings and unit tests.",
}
DEFAULT_PREFILL_SIZES = [4096, 8192, 16384, 32768, 65536, 131072, 262144]
DEFAULT_STREAMS = [1, 2, 3, 4]
DEFAULT_TEMPERATURES = [0.0, 0.7]
DEFAULT_THINKING = [False, True]
# The recipe's reference condition: its published figures are prose, temperature 0, thinking off.
HEADLINE = ("prose", 0.0, False)
SEED = 7

# Headline figures, in every record version: (path in the record, True when higher is better).
FIGURES = [
    (("prefill", "tok_s"), True),
    (("decode", "tok_s"), True),
    (("decode", "ttft_s"), False),
    (("multi", "tok_s_total"), True),
    (("multi", "tok_s_per_stream"), True),
]
# Figures of each decode run and each prefill size (version 2).
DECODE_FIGURES = [("tok_s_total", True), ("tok_s_per_stream", True), ("ttft_s", False)]
PREFILL_FIGURES = [("tok_s", True)]


class NoUsage(Exception):
    """The server's replies lack what a figure is computed from (usage counts, streamed deltas): exit code 3."""


# --- command line ---------------------------------------------------------------------------------------------

def _list(text: str, item, what: str) -> list:
    try:
        values = [item(w.strip()) for w in text.split(",") if w.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least one {what}")
    return values


def _size(word: str) -> int:
    """4096, 4K or 4k (K = 1024 tokens)."""
    size = int(word[:-1]) * 1024 if word[-1:] in ("K", "k") else int(word)
    if not 16 <= size <= 1_048_576:
        raise ValueError(f"{word} is not a prompt size from 16 to 1024K tokens")
    return size


def _streams(word: str) -> int:
    count = int(word)
    if not 1 <= count <= 16:
        raise ValueError(f"{word} streams: give 1 to 16")
    return count


def _temperature(word: str) -> float:
    temperature = float(word)
    if not 0 <= temperature <= 2:
        raise ValueError(f"temperature {word} is outside 0..2")
    return temperature


def _switch(word: str) -> bool:
    if word.lower() not in ("on", "off"):
        raise ValueError(f"{word}: write on or off")
    return word.lower() == "on"


def _prompt(word: str) -> str:
    if word not in PROMPTS:
        raise ValueError(f"{word}: the prompts are {', '.join(PROMPTS)}")
    return word


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench's and compare's options (python -m operations.validate ... bench | compare A B)."""
    parser.add_argument("--prefill-sizes", "--prefill-tokens", dest="prefill_sizes", metavar="N,N,...",
                        type=lambda t: _list(t, _size, "size"), default=DEFAULT_PREFILL_SIZES,
                        help="bench: prompt sizes of the prefill sweep, in tokens as the server counts them "
                             "(default 4K,8K,16K,32K,64K,128K,256K)")
    parser.add_argument("--decode-tokens", type=int, default=256, help="bench: tokens generated per stream (256)")
    parser.add_argument("--streams", metavar="N,N,...", type=lambda t: _list(t, _streams, "stream count"),
                        default=DEFAULT_STREAMS, help="bench: concurrent streams of the decode runs (default 1,2,3,4)")
    parser.add_argument("--temperatures", metavar="T,T,...", type=lambda t: _list(t, _temperature, "temperature"),
                        default=DEFAULT_TEMPERATURES, help="bench: decode temperatures (default 0,0.7)")
    parser.add_argument("--thinking", metavar="off,on", type=lambda t: _list(t, _switch, "of on/off"),
                        default=DEFAULT_THINKING, help="bench: decode with thinking off and/or on (default off,on)")
    parser.add_argument("--prompts", metavar="prose,code", type=lambda t: _list(t, _prompt, "prompt"),
                        default=list(PROMPTS), help="bench: decode prompts (default prose,code)")
    parser.add_argument("-o", "--out", help="bench: write the JSON record to this file (else it follows the tables on "
                                            "stdout); plot: the PNG (bench.png)")
    parser.add_argument("--tolerance", type=float, default=10.0, help="compare: allowed change in percent (10)")
    parser.add_argument("--json", action="store_true", help="compare: print the comparison as JSON instead of a table")


# --- measuring ------------------------------------------------------------------------------------------------

def _say(progress: TextIO, line: str) -> None:
    print(f"bench: {line}", file=progress, flush=True)


def _condition(prompt: str, temperature: float, thinking: bool) -> str:
    return f"{prompt}, temperature {temperature:g}, thinking {'on' if thinking else 'off'}"


def _prefill_prompt(tokens: int, chars_per_token: float) -> str:
    """About `tokens` tokens at `chars_per_token` characters each. A fresh first line: no prompt shares a prefix
    with another, so no cached prefix shortens a prefill."""
    head, tail = f"Reference {secrets.token_hex(6)}.\n\n", "\n\nSummarise the text above in one word."
    chars = max(1, round(tokens * chars_per_token) - len(head) - len(tail))
    return head + "\n\n".join(paragraphs(chars // CHARS_PER_TOKEN + 1))[:chars] + tail


def _prefill(client: Client, prompt: str) -> dict:
    reply = client.chat([{"role": "user", "content": prompt}], max_tokens=1, temperature=0, **THINKING_OFF)
    prompt_tokens = reply.usage.get("prompt_tokens")
    if not prompt_tokens:
        raise NoUsage("the reply carried no usage.prompt_tokens")
    row: dict[str, Any] = {"prompt_tokens": prompt_tokens, "seconds": round(reply.seconds, 4),
                           "tok_s": round(prompt_tokens / max(reply.seconds, 1e-6), 2)}
    server_prefill = (reply.body.get("tensorfold") or {}).get("prefill_s")
    if isinstance(server_prefill, (int, float)):
        row["server_prefill_s"] = server_prefill
    return row


def _stream(client: Client, prompt: str, tokens: int, temperature: float, thinking: bool) -> dict:
    start = time.monotonic()
    reply = client.chat_stream([{"role": "user", "content": prompt}], max_tokens=tokens, temperature=temperature,
                               seed=SEED, ignore_eos=True, **(THINKING_ON if thinking else THINKING_OFF))
    completion = reply.usage.get("completion_tokens")
    if not completion:
        raise NoUsage("the streamed reply carried no usage.completion_tokens (stream_options.include_usage)")
    if reply.ttft_s is None:
        raise NoUsage("the stream carried no content or reasoning delta: no time to first token")
    return {"start": start, "first": start + reply.ttft_s, "end": start + reply.seconds, "ttft": reply.ttft_s,
            "completion": completion,
            "rate": max(completion - 1, 1) / max(reply.seconds - reply.ttft_s, 1e-6)}


def _decode(client: Client, prompt: str, tokens: int, temperature: float, thinking: bool, streams: int) -> dict:
    with ThreadPoolExecutor(max_workers=streams) as pool:
        runs = list(pool.map(lambda _: _stream(client, prompt, tokens, temperature, thinking), range(streams)))
    after_first = sum(max(r["completion"] - 1, 1) for r in runs)
    window = max(max(r["end"] for r in runs) - min(r["first"] for r in runs), 1e-6)
    ttfts = [r["ttft"] for r in runs]
    return {"completion_tokens": sum(r["completion"] for r in runs),
            "seconds": round(max(r["end"] for r in runs) - min(r["start"] for r in runs), 4),
            "tok_s_total": round(after_first / window, 2),
            "tok_s_per_stream": round(sum(r["rate"] for r in runs) / streams, 2),
            "ttft_s": round(sum(ttfts) / streams, 4), "ttft_max_s": round(max(ttfts), 4)}


def _headlines(record: dict) -> None:
    """The version-1 figures (prefill, decode, multi), from the smallest prefill size and the reference condition:
    one stream for decode, the most streams for multi."""
    sweep = [r for r in record["prefill_sweep"] if "tok_s" in r]
    if sweep:
        first = min(sweep, key=lambda r: r["size"])
        record["prefill"] = {k: first[k] for k in ("prompt_tokens", "seconds", "tok_s")}
    runs = [r for r in record["decode_runs"] if "tok_s_total" in r]
    if not runs:
        return
    conditions = [(r["prompt"], r["temperature"], r["thinking"]) for r in runs]
    condition = HEADLINE if HEADLINE in conditions else conditions[0]
    chosen = [r for r, c in zip(runs, conditions, strict=True) if c == condition]
    one = min(chosen, key=lambda r: r["streams"])
    many = max(chosen, key=lambda r: r["streams"])
    record["decode"] = {"condition": _condition(one["prompt"], one["temperature"], one["thinking"]),
                        "streams": one["streams"], "completion_tokens": one["completion_tokens"],
                        "ttft_s": one["ttft_s"], "seconds": one["seconds"], "tok_s": one["tok_s_total"]}
    record["multi"] = {"streams": many["streams"], "completion_tokens": many["completion_tokens"],
                       "seconds": many["seconds"], "tok_s_total": many["tok_s_total"],
                       "tok_s_per_stream": many["tok_s_per_stream"]}


def _write(path: str, record: dict) -> None:
    """Replace `path` in one step, so an interrupted run leaves the last complete state."""
    tmp = f"{path}.partial"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


def measure(client: Client, args, progress: TextIO | None = None) -> dict:
    """The whole matrix as a record. An HTTP error answer or a broken stream is kept as that measurement's `error`
    and the run goes on; missing usage raises NoUsage; an unreachable server raises CouldNotRun."""
    progress = progress or sys.stderr
    sizes = sorted(args.prefill_sizes)
    conditions = [(p, t, th) for p in args.prompts for t in args.temperatures for th in args.thinking]
    record: dict[str, Any] = {
        "kind": KIND, "version": VERSION, "complete": False, "base_url": client.base, "model": client.model,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {"prefill_sizes": sizes, "decode_tokens": args.decode_tokens, "streams": list(args.streams),
                     "prompts": list(args.prompts), "temperatures": list(args.temperatures),
                     "thinking": list(args.thinking), "seed": SEED},
        "prefill_sweep": [], "decode_runs": [], "errors": [],
    }

    def save() -> None:
        if args.out:
            _write(args.out, record)

    def failed(entry: dict, what: str, error: Exception) -> None:
        entry["error"] = str(error)
        record["errors"].append(f"{what}: {error}")
        _say(progress, f"{what}: FAILED: {error}")
        save()

    _say(progress, f"{client.model} at {client.base}: {len(sizes)} prefill size(s), "
                   f"{len(conditions) * len(args.streams)} decode run(s) of {args.decode_tokens} tokens a stream")
    # The server's tokens per character of the filler text, so each prompt is its size as the server counts it.
    probe = _prefill_prompt(min(sizes), CHARS_PER_TOKEN)
    chars_per_token = len(probe) / _prefill(client, probe)["prompt_tokens"]
    for size in sizes:
        entry: dict[str, Any] = {"size": size}
        record["prefill_sweep"].append(entry)
        try:
            entry.update(_prefill(client, _prefill_prompt(size, chars_per_token)))
        except (HttpError, StreamError) as e:
            failed(entry, f"prefill {size}", e)
            continue
        _say(progress, f"prefill {size}: {entry['prompt_tokens']} prompt tokens in {entry['seconds']:.2f} s, "
                       f"{entry['tok_s']:.1f} tok/s")
        save()

    for prompt, temperature, thinking in conditions:
        for streams in args.streams:
            entry = {"prompt": prompt, "temperature": temperature, "thinking": thinking, "streams": streams}
            record["decode_runs"].append(entry)
            what = f"decode {_condition(prompt, temperature, thinking)}, {streams} stream(s)"
            try:
                # a fresh first line per run: the streams of one run share a prompt, runs do not
                text = f"Request {secrets.token_hex(4)}. {PROMPTS[prompt]}"
                entry.update(_decode(client, text, args.decode_tokens, temperature, thinking, streams))
            except (HttpError, StreamError) as e:
                failed(entry, what, e)
                continue
            _say(progress, f"{what}: {entry['tok_s_total']:.1f} tok/s total, {entry['tok_s_per_stream']:.1f} "
                           f"per stream, TTFT {_ms(entry['ttft_s'])}")
            save()
    record["complete"] = True
    _headlines(record)
    return record


# --- tables ---------------------------------------------------------------------------------------------------

def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def tables(record: dict) -> str:
    """The record as the recipe lays out its figures: a prefill table, then a decode table per condition."""
    out = ["## prefill", "", "| prompt tokens | seconds | tok/s |", "|---:|---:|---:|"]
    for entry in record.get("prefill_sweep") or []:
        if "error" in entry:
            out.append(f"| ({entry['size']:,}) | failed | {entry['error'][:60]} |")
        else:
            out.append(f"| {entry['prompt_tokens']:,} | {entry['seconds']:.2f} | {entry['tok_s']:,.1f} |")
    shown: list[tuple] = []
    for entry in record.get("decode_runs") or []:
        key = (entry["prompt"], entry["temperature"], entry["thinking"])
        if key not in shown:
            shown.append(key)
            out += ["", f"## decode: {_condition(*key)}", "",
                    "| streams | total tok/s | per-stream tok/s | TTFT |", "|---:|---:|---:|---:|"]
        if "error" in entry:
            out.append(f"| {entry['streams']} | failed | | {entry['error'][:60]} |")
        else:
            out.append(f"| {entry['streams']} | {entry['tok_s_total']:.1f} | {entry['tok_s_per_stream']:.1f} | "
                       f"{_ms(entry['ttft_s'])} |")
    return "\n".join(out)


def check_bench(client: Client, args) -> Result:
    try:
        record = measure(client, args)
    except NoUsage as e:
        return Result("bench", UNVERIFIED, f"{e}: figures need the server's token counts and streamed deltas")
    print(tables(record), flush=True)
    if args.out:
        _write(args.out, record)
    else:
        print(json.dumps(record, indent=2), flush=True)
    where = f" -> {args.out}" if args.out else ""
    if record["errors"]:
        return Result("bench", FAIL, f"{len(record['errors'])} measurement(s) failed, first: {record['errors'][0]}"
                                     f"{where}", record)
    decode, multi = record.get("decode") or {}, record.get("multi") or {}
    return Result("bench", PASS, f"prefill {record['prefill']['tok_s']} tok/s at {record['prefill']['prompt_tokens']} "
                                 f"tokens, decode {decode.get('tok_s')} tok/s, {multi.get('streams')} streams "
                                 f"{multi.get('tok_s_total')} tok/s total{where}", record)


# --- compare --------------------------------------------------------------------------------------------------

def _number(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def figures(record: dict) -> dict[str, tuple[float | None, bool]]:
    """Every comparable figure of a record: name -> (value or None, True when higher is better)."""
    out: dict[str, tuple[float | None, bool]] = {}
    for (section, key), higher in FIGURES:
        out[f"{section}.{key}"] = (_number((record.get(section) or {}).get(key)), higher)
    for entry in record.get("prefill_sweep") or []:
        for key, higher in PREFILL_FIGURES:
            out[f"prefill@{entry.get('size')}.{key}"] = (_number(entry.get(key)), higher)
    for entry in record.get("decode_runs") or []:
        run = f"decode@{entry.get('prompt')},t{entry.get('temperature')}," \
              f"thinking-{'on' if entry.get('thinking') else 'off'},x{entry.get('streams')}"
        for key, higher in DECODE_FIGURES:
            out[f"{run}.{key}"] = (_number(entry.get(key)), higher)
    return out


def compare(record_a: dict, record_b: dict, tolerance_pct: float) -> dict:
    """Each figure of A and B with B's change in percent; `worse` lists figures that moved the wrong way by more
    than the tolerance (lower tok/s, higher TTFT). A figure only one record has is listed without a change."""
    figures_a, figures_b = figures(record_a), figures(record_b)
    rows, worse = {}, []
    for name in list(figures_a) + [n for n in figures_b if n not in figures_a]:
        # a figure only one record has: its direction comes from that record, the other's value is None
        higher_better = (figures_a.get(name) or figures_b[name])[1]
        value_a = figures_a.get(name, (None, higher_better))[0]
        value_b = figures_b.get(name, (None, higher_better))[0]
        if value_a is None or value_b is None or value_a == 0:
            rows[name] = {"a": value_a, "b": value_b, "change_pct": None}
            continue
        change = (value_b - value_a) / value_a * 100
        rows[name] = {"a": value_a, "b": value_b, "change_pct": round(change, 1)}
        if (change < -tolerance_pct) if higher_better else (change > tolerance_pct):
            worse.append(name)
    return {"figures": rows, "tolerance_pct": tolerance_pct, "worse": worse}


def load_record(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    if not isinstance(record, dict) or record.get("kind") != KIND:
        raise ValueError(f"{path} is not a {KIND} record")
    if record.get("version") not in READABLE_VERSIONS:
        raise ValueError(f"{path}: record version {record.get('version')!r} is not one this tool reads "
                         f"({', '.join(map(str, READABLE_VERSIONS))})")
    return record


def _value(name: str, value: float | None) -> str:
    if value is None:
        return "—"
    return _ms(value) if name.endswith("ttft_s") else f"{value:,.1f}"


# Markdown's alignment row for a left, right or centred column of width w (plus the cell's two spaces)
_RULES = {"<": lambda w: "-" * (w + 2), ">": lambda w: "-" * (w + 1) + ":", "^": lambda w: ":" + "-" * w + ":"}


def compare_table(report: dict, path_a: str, path_b: str) -> str:
    """The comparison as a Markdown table, padded to read in a terminal: each figure of A and B, B's change, and ✘
    where it moved the wrong way by more than the tolerance."""
    worse = set(report["worse"])
    rows = [["figure", "A", "B", "change", "beyond tolerance"]]
    for name, row in report["figures"].items():
        change = "" if row["change_pct"] is None else f"{row['change_pct']:+.1f}%"
        rows.append([name, _value(name, row["a"]), _value(name, row["b"]), change, "✘" if name in worse else ""])
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    aligns = ["<", ">", ">", ">", "^"]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(f"{c:{a}{w}}" for c, a, w in zip(cells, aligns, widths, strict=True)) + " |"

    rule = "|" + "|".join(_RULES[a](w) for a, w in zip(aligns, widths, strict=True)) + "|"
    head = [f"A: {path_a}", f"B: {path_b}", f"tolerance: {report['tolerance_pct']:g}%", ""]
    return "\n".join([*head, line(rows[0]), rule, *(line(r) for r in rows[1:])])


def run_compare(path_a: str, path_b: str, tolerance_pct: float, as_json: bool = False) -> Result:
    try:
        record_a, record_b = load_record(path_a), load_record(path_b)
    except (OSError, ValueError) as e:
        return Result("compare", NOT_RUN, str(e))
    report = compare(record_a, record_b, tolerance_pct)
    print(json.dumps(report, indent=2) if as_json else compare_table(report, path_a, path_b))
    if report["worse"]:
        return Result("compare", FAIL, f"worse than {path_a} by more than {tolerance_pct:g}%: "
                                       + ", ".join(report["worse"]), report)
    return Result("compare", PASS, f"no figure worse by more than {tolerance_pct:g}%", report)
