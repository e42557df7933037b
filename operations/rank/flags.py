"""Check rank 0's serve argv, and the settings that need a ported engine feature, against the image's
`capabilities --json` before anything is stopped.

The document lists the flags the image serves (`serve.flags`: flag -> {} or {"values": [...]}) but not whether a
flag takes a value, so the kinds come from the table below (the engine's serve flag table). It lists the
environment variables the engine reads in `env` (a list of names): a setting that works only through such a
variable is allowed when the image lists it there.
"""

from __future__ import annotations

SWITCH = "switch"
VALUE = "value"

FLAG_KINDS = {
    **{f: SWITCH for f in (
        "--metrics-open", "--dashboard", "--thinking", "--no-thinking", "--loop-guard", "--no-drafts",
        "--prompt-cache-over-cap", "--no-update-check", "--vision", "--vision-urls", "--learn",
        "--prefill-fp8", "--no-prefill-fp8",
    )},
    **{f: VALUE for f in (
        "--host", "--port", "--name", "--alias", "--api-key", "--api-key-file", "--context", "--speed-up",
        "--max-tokens", "--temperature", "--top-p", "--top-k", "--min-p", "--reasoning-effort",
        "--thinking-budget", "--keep-warm", "--compact-at", "--compact-keep", "--compact-memory",
        "--prompt-cache-gib", "--snapshot-dir", "--max-snapshots", "--parallel", "--backend", "--device",
        "--segments", "--learn-dir", "--learn-gib", "--learn-min-free-gib", "--tp", "--rank", "--master",
        "--master-port", "--policy", "--mtp-drafts", "--mtp-confidence", "--checkpoint-slots",
        "--vision-max-images", "--vision-image-tokens", "--vision-video-tokens", "--drafter", "--drafter-bits",
        "--chat-template", "--kv-dtype", "--precision", "--spill-gib",
    )},
}

# Flags sparkfold adds itself, and the setting that controls each (for the fix in the message).
SETTING_OF_FLAG = {
    "--reasoning-effort": "set reasoning_effort to \"\" (the template's default)",
    "--no-drafts": "set drafts = true",
    "--thinking": "set thinking = false",
    "--no-thinking": "set thinking = true",
    "--api-key-file": "set api_key = false, or build an image whose engine serves --api-key-file",
}

FAMILY = "deepseek_v41"
FORMAT = "exl3-mul1"

# Settings that only a patched engine honours (the recipe's spill v2 and KV sharding ports, which this project does
# not carry): setting -> (the variable both ranks are given, what it turns on). Passed only when the image lists the
# variable in `capabilities["env"]`; otherwise a non-zero value is refused before launch.
PORTED_SETTINGS = {
    "spill_gib": ("TF_SPILL_GIB", "spill v2"),
    "kv_shard": ("TF_DS_KV_SHARD", "KV sharding"),
}


def _fix(flag: str) -> str:
    return SETTING_OF_FLAG.get(flag, f"remove {flag} from extra_serve_args")


def check_serve_argv(argv: list[str], capabilities: dict | None) -> list[str]:
    """Every problem of rank 0's argv (`tensorfold-native serve MODEL flags...`) for this image; [] when fine."""
    if not capabilities:
        return ["the engine image gave no capabilities document (tensorfold-native capabilities --json): "
                "rebuild the image (the engine step) and run again"]
    problems: list[str] = []
    version = capabilities.get("version") or "unknown version"
    formats = (capabilities.get("families") or {}).get(FAMILY) or []
    if FORMAT not in formats:
        problems.append(f"the engine image ({version}) does not serve {FAMILY} checkpoints in {FORMAT} "
                        f"(families: {sorted(capabilities.get('families') or {})}): build the engine from tf_repo "
                        "at tf_ref (the DeepSeek-V4.1 fork)")
    served = (capabilities.get("serve") or {}).get("flags") or {}

    words = list(argv)
    if words[:1] == ["tensorfold-native"]:
        words = words[1:]
    if words[:1] != ["serve"]:
        return problems + [f"rank 0's command must be `tensorfold-native serve MODEL ...`, not {argv[:2]}"]
    words = words[1:]
    positionals: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("--"):
            positionals.append(word)
            continue
        flag, eq, inline = word.partition("=")
        if flag not in served:
            problems.append(f"{flag} is not served by this engine image ({version}): {_fix(flag)}")
            # Skip a value that clearly belongs to it, so one bad flag gives one message.
            if not eq and FLAG_KINDS.get(flag) == VALUE and i < len(words):
                i += 1
            continue
        kind = FLAG_KINDS.get(flag) or (VALUE if "values" in served[flag] else None)
        if kind is None:  # served, but not in our table: a value follows unless the next word is a flag
            kind = VALUE if (eq or (i < len(words) and not words[i].startswith("--"))) else SWITCH
        if kind == SWITCH:
            if eq:
                problems.append(f"{flag} is a switch and takes no value ({word}): write {flag} alone")
            continue
        if eq:
            value = inline
        elif i < len(words) and not words[i].startswith("--"):
            value = words[i]
            i += 1
        else:
            problems.append(f"{flag} expects a value: give it one in extra_serve_args (e.g. {flag} VALUE)")
            continue
        allowed = served[flag].get("values")
        if allowed is not None and value not in [str(v) for v in allowed]:
            problems.append(f"{flag} {value!r} is not one this engine image accepts ({', '.join(map(str, allowed))}): "
                            f"use one of them ({_fix(flag)} otherwise)")
    if len(positionals) != 1:
        extra = positionals[1:] if positionals else []
        problems.append("rank 0's command needs exactly one model path" +
                        (f"; unexpected argument(s) {extra}: remove them from extra_serve_args" if extra else ""))
    return problems


def engine_reads(capabilities: dict | None, variable: str) -> bool:
    """The image lists `variable` among the environment variables its engine reads (`capabilities["env"]`)."""
    listed = (capabilities or {}).get("env") or []
    return isinstance(listed, list) and variable in listed


def check_ported_settings(s, capabilities: dict | None) -> list[str]:
    """Every non-zero setting of PORTED_SETTINGS that this image does not advertise; [] when fine (or when there is
    no document: check_serve_argv reports that)."""
    if not capabilities:
        return []
    version = capabilities.get("version") or "unknown version"
    problems = []
    for name, (variable, feature) in PORTED_SETTINGS.items():
        value = getattr(s, name)
        if value and not engine_reads(capabilities, variable):
            problems.append(f"{name} = {value} asks for {feature}, but this engine image ({version}) does not read "
                            f"{variable} (not in its capabilities env): set {name} = 0, or build an image whose "
                            f"engine carries the {feature} patches and lists {variable}")
    return problems
