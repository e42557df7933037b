"""The Prometheus text format (version 0.0.4) that the engine serves at /metrics, read minimally: each sample's
name, labels and value, and each family's `# TYPE`. A line that does not parse is left out, not fatal: status.py
and the validator show what they can read.

    name{label="value",...} value [timestamp]
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*(,?)\s*')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_TYPE = re.compile(r"#\s*TYPE\s+([a-zA-Z_:][a-zA-Z0-9_:]*)\s+(\w+)\s*$")
# a histogram's or summary's series beside its family name (Prometheus adds them to the name)
_SERIES_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    value: float = 0.0


@dataclass(frozen=True)
class Exposition:
    samples: list[Sample]
    types: dict[str, str]  # family name -> counter, gauge, histogram, summary or untyped


def _unescape(text: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], text)


def parse_sample(line: str) -> Sample | None:
    """One sample line, or None when it is not one."""
    match = _NAME.match(line)
    if not match:
        return None
    pos, labels = match.end(), {}
    brace = len(line) - len(line[pos:].lstrip(" \t"))  # blanks may stand between the name and its labels
    braces = line[brace:brace + 1] == "{"
    if braces:
        pos = brace + 1
        while line[pos:pos + 1] != "}":
            label = _LABEL.match(line, pos)
            if not label:
                return None
            labels[label.group(1)] = _unescape(label.group(2))
            pos = label.end()
            if not label.group(3) and line[pos:pos + 1] != "}":  # a label without its comma before the next
                return None
        pos += 1
    rest = line[pos:].split()
    # without braces a blank ends the name ("m-1" is no sample)
    if not rest or len(rest) > 2 or (not braces and not line[pos:pos + 1].isspace()):
        return None
    try:
        value = float(rest[0])  # also NaN, +Inf and -Inf, as the format writes them
        if len(rest) == 2:
            int(rest[1])  # the timestamp (milliseconds): checked, not kept
    except ValueError:
        return None
    return Sample(match.group(0), labels, value)


def parse(text: str) -> Exposition:
    samples, types = [], {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            typed = _TYPE.match(line)
            if typed:
                types[typed.group(1)] = typed.group(2)
            continue
        sample = parse_sample(line)
        if sample is not None:
            samples.append(sample)
    return Exposition(samples, types)


def family_type(name: str, types: dict[str, str]) -> str:
    """The TYPE of the family a sample name belongs to ("untyped" when the text does not say)."""
    if name in types:
        return types[name]
    for suffix in _SERIES_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and types.get(base) in ("histogram", "summary"):
            return types[base]
    if name.endswith("_total") and types.get(name.removesuffix("_total")) == "counter":  # OpenMetrics' naming
        return "counter"
    return "untyped"


def totals(exposition: Exposition, names: Iterable[str] | None = None) -> dict[str, float]:
    """Each counter's, gauge's and untyped metric's finite values summed over its label sets, in the order served
    (only `names` when given). Histograms and summaries are left out: their buckets and quantiles do not add up."""
    wanted = set(names) if names is not None else None
    out: dict[str, float] = {}
    for sample in exposition.samples:
        if wanted is not None and sample.name not in wanted:
            continue
        # a NaN or an infinity would make the sum say nothing (and is no JSON number)
        if family_type(sample.name, exposition.types) in ("histogram", "summary") or not math.isfinite(sample.value):
            continue
        out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out
