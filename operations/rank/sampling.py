"""Rank 0's sampling defaults (temperature, top_p, top_k): the serve flags that carry them, passed only when the
image's `capabilities --json` lists the flag, and the plan's line saying what is served.

A request's own values win over these; they are what a client that sends none inherits. "" leaves the engine's
own default. The flag names are the engine's (the recipe's rank 0 serves `--temperature 1.0 --top-p 0.95
--top-k 20`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SAMPLING_FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k"}
ENGINE_DEFAULT = "engine default"


def _served_flags(capabilities: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return ((capabilities or {}).get("serve") or {}).get("flags") or {}


def sampling_args(s: Any, capabilities: Mapping[str, Any] | None) -> list[str]:
    """The sampling flags for rank 0's argv: each setting that is not "" and whose flag the image serves."""
    served = _served_flags(capabilities)
    args: list[str] = []
    for name, flag in SAMPLING_FLAGS.items():
        value = getattr(s, name)
        if value != "" and flag in served:
            args += [flag, value]
    return args


def sampling_line(values: Mapping[str, str]) -> str:
    """"sampling: temperature 1.0, top_p 0.95, top_k 20" from {setting: value served} ("" or absent: the engine's
    default)."""
    if not any(values.get(name) for name in SAMPLING_FLAGS):
        return f"sampling: {ENGINE_DEFAULT} (no sampling flag is passed to rank 0)"
    return "sampling: " + ", ".join(f"{name} {values.get(name) or ENGINE_DEFAULT}" for name in SAMPLING_FLAGS)


def served_sampling(argv: list[str]) -> dict[str, str]:
    """{setting: value} read from rank 0's serve argv (a running container's, or a spec's); "" for a setting whose
    flag is absent (the engine's default). The last occurrence wins, as in the engine's parser."""
    found = dict.fromkeys(SAMPLING_FLAGS, "")
    by_flag = {flag: name for name, flag in SAMPLING_FLAGS.items()}
    for i, word in enumerate(argv):
        flag, eq, inline = word.partition("=")
        if flag in by_flag:
            found[by_flag[flag]] = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return found


def sampling_plan(s: Any, capabilities: Mapping[str, Any] | None) -> tuple[str, list[str]]:
    """(the plan's line of what rank 0 serves, a warning per setting the image cannot carry). Capabilities not
    known yet (the image is built later in this run): the line says what will be asked for, and no warning."""
    if not capabilities:
        wanted = {name: getattr(s, name) for name in SAMPLING_FLAGS}
        return sampling_line(wanted) + " (each passed once the image's capabilities list its flag)", []
    served = _served_flags(capabilities)
    version = capabilities.get("version") or "unknown version"
    warnings = [f"{name} = {getattr(s, name)} is not served: this engine image ({version}) does not list {flag} in "
                f"its capabilities, so rank 0 runs with the engine's default {name}; set {name} = \"\" to accept "
                f"that, or build an image whose engine serves {flag}"
                for name, flag in SAMPLING_FLAGS.items() if getattr(s, name) != "" and flag not in served]
    args = sampling_args(s, capabilities)
    return sampling_line(served_sampling(args)), warnings
