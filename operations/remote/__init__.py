"""Scripts run on a Spark. The ones facts and steps run once (downloads, plans, the copy, the progress runner) are
sent on stdin (`python3 - ARGS <<EOF`) rather than uploaded, so a fact can run them during --dry on a Spark the
deploy has not touched yet; the ones a unit runs (memguard, the supervisor, the GPU clock lock) are uploaded."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
_PARTS = {"hf_plan": ["hf_cache", "hf_plan"], "hf_fetch": ["hf_cache", "hf_plan", "hf_fetch"],
          "progress": ["progress"], "link_copy": ["link_copy"], "folder_marker": ["listing", "folder_marker"],
          "stream_wait": ["progress", "stream_unit", "stream_wait"]}
_UTIL = ("hf_cache", "listing")  # operations/util modules sent in front of a script
_DELIMITER = "SPARKFOLD_PY_EOF"


def _source(module: str) -> str:
    path = _HERE.parent / "util" / f"{module}.py" if module in _UTIL else _HERE / f"{module}.py"
    lines = path.read_text().splitlines()
    # one `from __future__` at the top of the bundle; a later one would be a SyntaxError
    return "\n".join(line for line in lines if line.strip() != "from __future__ import annotations")


def bundle(script: str) -> str:
    """The script with the modules it imports inlined before it (only the last part's __main__ block runs)."""
    parts = _PARTS[script]
    body = ["from __future__ import annotations", "_BUNDLED = True"]
    for module in parts:
        text = _source(module)
        if module != parts[-1]:
            text = text.split('\nif __name__ == "__main__":')[0]
        body.append(text)
    text = "\n".join(body) + "\n"
    assert _DELIMITER not in text
    return text


def heredoc_command(head: str, script: str, tail: str = "") -> str:
    """`<head> <<'DELIM' <tail>`, then the bundle, then DELIM: head runs a python reading its script from stdin
    (`python3 - ARGS`); tail may add `|| ...` to the same line."""
    return f"{head} <<'{_DELIMITER}'{' ' + tail if tail else ''}\n{bundle(script)}{_DELIMITER}"
