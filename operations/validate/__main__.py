"""python -m operations.validate --base-url URL [--api-key-file F] [--model ID] CHECK...
python -m operations.validate compare A.json B.json"""

from __future__ import annotations

import argparse
import os
import sys

from operations.validate import bench, context, image, text, tools
from operations.validate.client import Client, CouldNotRun, HttpError, api_key_from
from operations.validate.result import FAIL, NOT_RUN, Result, exit_code

CHECKS = {
    "text": text.check_text,
    "thinking-on": text.check_thinking_on,
    "thinking-off": text.check_thinking_off,
    "tools": tools.check_tools,
    "image": image.check_image,
    "long": context.check_long,
    "needle": context.check_needle,
    "end-of-turn": text.check_end_of_turn,
    "bench": bench.check_bench,
}
# `all`: the correctness checks (bench and needle take long; ask for them by name)
ALL = ["text", "thinking-on", "thinking-off", "tools", "image", "long", "end-of-turn"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m operations.validate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checks", nargs="+", metavar="CHECK",
                   help=f"{', '.join(CHECKS)}, all ({', '.join(ALL)}), or: compare A.json B.json")
    p.add_argument("--base-url", default=os.environ.get("API_URL"), help="server base URL (or API_URL)")
    p.add_argument("--api-key-file", help="file holding the API key (else the API_KEY variable)")
    p.add_argument("--model", help="model id (default: the first of /v1/models)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per request")
    p.add_argument("--think-tokens", type=int, default=4096, help="max_tokens of the thinking-on check")
    p.add_argument("--long-tokens", type=int, default=32000, help="size of the long prompt (approx. tokens)")
    p.add_argument("--needle-tokens", type=int, default=195000, help="size of the needle context (approx. tokens)")
    p.add_argument("--repeat", type=int, default=1, help="end-of-turn: times each prompt is asked")
    p.add_argument("--max-cut", type=int, default=0, help="end-of-turn: replies allowed to hit max_tokens")
    p.add_argument("--prefill-tokens", type=int, default=4096, help="bench: prompt size (approx. tokens)")
    p.add_argument("--decode-tokens", type=int, default=256, help="bench: tokens generated per stream")
    p.add_argument("--streams", type=int, default=4, help="bench: concurrent streams")
    p.add_argument("--out", help="bench: write the JSON record here (else stdout)")
    p.add_argument("--tolerance", type=float, default=10.0, help="compare: allowed drop in percent")
    return p


def run_check(name: str, client: Client, args) -> Result:
    try:
        return CHECKS[name](client, args)
    except CouldNotRun as e:
        return Result(name, NOT_RUN, str(e))
    except HttpError as e:
        return Result(name, FAIL, str(e))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.checks[0] == "compare":
        if len(args.checks) != 3:
            print("usage: python -m operations.validate compare A.json B.json", file=sys.stderr)
            return NOT_RUN
        result = bench.run_compare(args.checks[1], args.checks[2], args.tolerance)
        print(result.line())
        return result.status
    names = [n for c in args.checks for n in (ALL if c == "all" else [c])]
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not args.base_url:
        print(f"unknown check(s): {', '.join(unknown)}" if unknown else "--base-url (or API_URL) is required",
              file=sys.stderr)
        return NOT_RUN
    try:
        client = Client(args.base_url, api_key_from(args.api_key_file), args.model, args.timeout)
    except (CouldNotRun, OSError) as e:
        print(f"NOT RUN: {e}", file=sys.stderr)
        return NOT_RUN
    results = []
    for name in names:
        result = run_check(name, client, args)
        print(result.line(), flush=True)
        results.append(result)
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
