"""plot: one or two bench records as a PNG of two panels, prefill tok/s against prompt size (log x) and decode tok/s
(total and per stream) against streams, with the recipe's published figures as reference points; B drawn over A.
matplotlib is the optional `plot` extra, imported only here, only when a plot is asked for."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from operations.validate.bench import HEADLINE, load_record
from operations.validate.client import CouldNotRun
from operations.validate.result import NOT_RUN, PASS, Result

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MISSING = "matplotlib is not installed (the optional `plot` extra): pip install -e '.[plot]'"
USAGE = "usage: python -m operations.validate plot A.json [B.json] [-o bench.png]"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# The recipe's published figures (docs/measurements.md): one pair of Sparks, CONTEXT=524288, 4 streams, drafts on;
# decode is prose, temperature 0, thinking off.
RECIPE_PREFILL = {4096: (2100.0, 2150.0), 262144: (2100.0, 2150.0)}  # prompt tokens -> tok/s range, "4K to 256K"
RECIPE_DECODE_TOTAL = {1: 80.7, 4: 154.0}  # streams -> total tok/s (one stream: total = per stream)
STYLES = ({"color": "tab:blue", "linestyle": "-"}, {"color": "tab:orange", "linestyle": "--"})


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise CouldNotRun(MISSING) from None
    return Figure


def _size_label(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens >= 1024 and tokens % 1024 == 0 else f"{tokens:,}"


def prefill_points(record: dict) -> list[tuple[int, float]]:
    """(prompt tokens, tok/s) of each measured prefill size; a version-1 record's one headline figure."""
    sweep = [r for r in record.get("prefill_sweep") or [] if "tok_s" in r]
    if not sweep and "tok_s" in (record.get("prefill") or {}):
        sweep = [record["prefill"]]
    return sorted((int(r["prompt_tokens"]), float(r["tok_s"])) for r in sweep)


def decode_condition(record: dict) -> tuple | None:
    """The condition drawn: the recipe's (prose, temperature 0, thinking off) when measured, else the first run's."""
    conditions = [(r["prompt"], r["temperature"], r["thinking"])
                  for r in record.get("decode_runs") or [] if "tok_s_total" in r]
    if not conditions:
        return None
    return HEADLINE if HEADLINE in conditions else conditions[0]


def decode_points(record: dict, condition: tuple | None) -> list[tuple[int, float, float]]:
    """(streams, total tok/s, per-stream tok/s) of the condition's runs; a version-1 record's decode and multi."""
    runs = [r for r in record.get("decode_runs") or []
            if "tok_s_total" in r and (r["prompt"], r["temperature"], r["thinking"]) == condition]
    if runs:
        return sorted((int(r["streams"]), float(r["tok_s_total"]), float(r["tok_s_per_stream"])) for r in runs)
    points = []
    decode, multi = record.get("decode") or {}, record.get("multi") or {}
    if "tok_s" in decode:
        points.append((int(decode.get("streams", 1)), float(decode["tok_s"]), float(decode["tok_s"])))
    if "tok_s_total" in multi and "tok_s_per_stream" in multi:
        points.append((int(multi["streams"]), float(multi["tok_s_total"]), float(multi["tok_s_per_stream"])))
    return sorted(set(points))


def _condition_text(condition: tuple | None) -> str:
    if condition is None:
        return "the headline figures"
    prompt, temperature, thinking = condition
    return f"{prompt}, temperature {temperature:g}, thinking {'on' if thinking else 'off'}"


def build_figure(records: list[tuple[str, dict]]) -> Figure:
    """The two panels for one record, or two (the second drawn over the first): prefill, then decode."""
    figure = _figure_class()(figsize=(12, 5), layout="constrained")
    prefill, decode = figure.subplots(1, 2)
    condition = decode_condition(records[0][1])
    sizes: set[int] = set(RECIPE_PREFILL)
    for (name, record), style in zip(records, STYLES, strict=False):
        points = prefill_points(record)
        sizes |= {int(r["size"]) for r in record.get("prefill_sweep") or [] if "tok_s" in r} or {x for x, _ in points}
        if points:
            prefill.plot(*zip(*points, strict=True), marker="o", label=name, **style)
        own = condition if decode_condition(record) in (condition, None) else decode_condition(record)
        runs = decode_points(record, own)
        suffix = "" if own == condition else f" ({_condition_text(own)})"
        if runs:
            streams, total, per_stream = zip(*runs, strict=True)
            decode.plot(streams, total, marker="o", label=f"{name} total{suffix}", **style)
            decode.plot(streams, per_stream, marker="s", label=f"{name} per stream{suffix}", alpha=0.6, **style)

    low, high = zip(*RECIPE_PREFILL.values(), strict=True)
    middle = [(lo + hi) / 2 for lo, hi in zip(low, high, strict=True)]
    spread = [(hi - lo) / 2 for lo, hi in zip(low, high, strict=True)]
    prefill.errorbar(list(RECIPE_PREFILL), middle, yerr=spread, fmt="x", color="black", capsize=4,
                     label="recipe (published): ~2,100–2,150 tok/s, 4K to 256K")
    prefill.set_xscale("log", base=2)
    prefill.set_xticks(sorted(sizes), [_size_label(s) for s in sorted(sizes)])
    prefill.minorticks_off()
    prefill.set(title="prefill", xlabel="prompt tokens (log scale)", ylabel="tok/s")

    decode.plot(list(RECIPE_DECODE_TOTAL), list(RECIPE_DECODE_TOTAL.values()), "x", color="black", markersize=9,
                mew=2, label="recipe (published) total: 80.7 at 1 stream, 154.0 at 4")
    decode.set(title=f"decode: {_condition_text(condition)}", xlabel="concurrent streams", ylabel="tok/s")
    decode.xaxis.get_major_locator().set_params(integer=True)
    for axes in (prefill, decode):
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small", loc="best")
    return figure


def run_plot(paths: list[str], out: str) -> Result:
    """`plot A.json [B.json]`: the PNG at `out`."""
    if not 1 <= len(paths) <= 2:
        return Result("plot", NOT_RUN, USAGE)
    try:
        records = [(f"{which}: {os.path.basename(p)}", load_record(p)) for which, p in zip("AB", paths, strict=False)]
    except (OSError, ValueError) as e:
        return Result("plot", NOT_RUN, str(e))
    try:
        figure = build_figure(records)
        figure.savefig(out, format="png", dpi=120)
    except CouldNotRun as e:
        return Result("plot", NOT_RUN, str(e))
    except OSError as e:
        return Result("plot", NOT_RUN, f"cannot write {out}: {e}")
    against = f" against {paths[1]}" if len(paths) == 2 else ""
    return Result("plot", PASS, f"{out}: prefill and decode of {paths[0]}{against}, with the recipe's published "
                                f"figures")
