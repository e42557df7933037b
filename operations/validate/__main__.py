"""python -m operations.validate [--base-url URL] [--api-key-file F] [--model ID] CHECK...
python -m operations.validate [bench] compare A.json B.json [--tolerance 10] [--json]
python -m operations.validate [bench] plot A.json [B.json] [-o bench.png]
python -m operations.validate [--base-url URL] exact record FILE | exact compare A.json B.json

The server: --base-url, else OPENAI_BASE_URL, else API_URL (with or without /v1). The key: --api-key-file, else
OPENAI_API_KEY, else API_KEY. When two of them disagree, a note on stderr names the one used."""

from __future__ import annotations

import argparse
import difflib
import sys

from operations.validate import anthropic, bench, context, exact, image, plot, prompt_reuse, smoke, text, tools
from operations.validate.client import Client, CouldNotRun, ServerUnusable, connect
from operations.validate.result import NOT_RUN, Result, attempt, exit_code

CHECKS = {
    "text": text.check_text,
    "thinking-on": text.check_thinking_on,
    "thinking-off": text.check_thinking_off,
    "tools": tools.check_tools,
    "image": image.check_image,
    "long": context.check_long,
    "needle": context.check_needle,
    "end-of-turn": text.check_end_of_turn,
    "smoke": smoke.check_smoke,
    "prompt-reuse": prompt_reuse.check_prompt_reuse,
    "anthropic": anthropic.check_anthropic,
    "bench": bench.check_bench,
}
# `all`: the quick correctness checks. By name only: bench and needle (long), prompt-reuse (timing), anthropic (a
# route many servers lack) and `exact` (a record to keep).
ALL = ["text", "thinking-on", "thinking-off", "tools", "image", "long", "end-of-turn", "smoke"]
COMMANDS = ["compare", "plot", "exact"]  # the words that start a command of their own (bench's two may follow bench)


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(prog="python -m operations.validate", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("checks", nargs="+", metavar="CHECK",
                     help=f"{', '.join(CHECKS)}, all ({', '.join(ALL)}), or: compare A.json B.json, "
                          "plot A.json [B.json], exact record FILE, exact compare A.json B.json")
    cli.add_argument("--base-url", help="server base URL (else OPENAI_BASE_URL, else API_URL)")
    cli.add_argument("--api-key-file", help="file holding the API key (else OPENAI_API_KEY, else API_KEY)")
    cli.add_argument("--model", help="model id (default: the first of /v1/models)")
    cli.add_argument("--timeout", type=float, default=1800, help="seconds per request")
    cli.add_argument("--think-tokens", type=int, default=4096, help="max_tokens of the thinking-on check")
    cli.add_argument("--long-tokens", type=int, default=32000, help="size of the long prompt (approx. tokens)")
    cli.add_argument("--needle-tokens", type=int, default=195000, help="size of the needle context (approx. tokens)")
    cli.add_argument("--needle-depth", type=float, default=0.6,
                     help="needle: where the passphrase sits (0 start, 1 end)")
    cli.add_argument("--reuse-tokens", type=int, default=16000, help="prompt-reuse: first turn size (approx. tokens)")
    cli.add_argument("--repeat", type=int, default=1, help="end-of-turn: times each prompt is asked")
    cli.add_argument("--max-cut", type=int, default=0, help="end-of-turn: replies allowed to hit max_tokens")
    bench.add_arguments(cli)
    return cli


def run_check(name: str, client: Client, args) -> Result:
    return attempt(name, CHECKS[name], client, args)


def _unusable(error: ServerUnusable, results: list[Result]) -> int:
    """A server that cannot be asked: said once (every further check would say the same), and the run stops."""
    print(f"NOT RUN: {error}", file=sys.stderr)
    return exit_code([*results, Result("server", NOT_RUN, str(error))])


def unknown_checks(names: list[str]) -> list[str]:
    """A line per name that is no check (with the closest names), then what there is. A misspelt command first
    (`compar A B`) is the only line about its words."""
    lines = []
    for name in names:
        close = difflib.get_close_matches(name, [*CHECKS, "all", *COMMANDS], n=2, cutoff=0.6)
        lines.append(f"unknown check {name!r}" + (f": did you mean {' or '.join(close)}?" if close else ""))
        if name == names[0] and close and close[0] in COMMANDS:
            break
    return [*lines, f"the checks: {', '.join(CHECKS)}, all; the commands: {', '.join(COMMANDS)}"]


def main(argv: list[str] | None = None) -> int:
    # intermixed: options may come before, between or after the words (`compare --json A B`, `bench --out F`)
    args = parser().parse_intermixed_args(argv)
    if args.checks[:1] == ["bench"] and args.checks[1:2] in (["compare"], ["plot"]):
        args.checks = args.checks[1:]  # `bench compare A B` and `bench plot A` as the docs' bench section reads
    if args.checks[0] == "compare":
        if len(args.checks) != 3:
            print("usage: python -m operations.validate compare A.json B.json [--tolerance 10] [--json]",
                  file=sys.stderr)
            return NOT_RUN
        result = bench.run_compare(args.checks[1], args.checks[2], args.tolerance, args.json)
        print(result.line())
        return result.status
    if args.checks[0] == "plot":
        result = plot.run_plot(args.checks[1:], args.out or "bench.png")
        print(result.line())
        return result.status
    if args.checks[0] == "exact":
        try:
            result = attempt("exact", exact.run, args.checks[1:], args)
        except ServerUnusable as e:
            return _unusable(e, [])
        print(result.line())
        return result.status
    names = [n for c in args.checks for n in (ALL if c == "all" else [c])]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        print("\n".join(unknown_checks(unknown)), file=sys.stderr)
        return NOT_RUN
    try:
        client = connect(args)
    except (CouldNotRun, OSError) as e:
        print(f"NOT RUN: {e}", file=sys.stderr)
        return NOT_RUN
    results: list[Result] = []
    for name in names:
        try:
            results.append(run_check(name, client, args))
        except ServerUnusable as e:
            return _unusable(e, results)
        print(results[-1].line(), flush=True)
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
