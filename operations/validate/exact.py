"""exact: the gate for an engine or image change. `record` keeps what the server answers to a fixed prompt set at
temperature 0; `compare` says per prompt whether two records are the same, and where they first differ.

Per prompt the record keeps the strongest identity the server gives: token ids (`choices[0].token_ids`), the tokens of
`logprobs` (asked for; engines that refuse it are asked again without), the engine's `tensorfold.token_sha`, and
always a sha256 of the text (reasoning, content, tool calls) with the text itself, so a difference can be shown."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable

from operations.validate.client import THINKING_OFF, THINKING_ON, Client, HttpError, Reply, connect
from operations.validate.image import data_url, make_png
from operations.validate.result import FAIL, NOT_RUN, PASS, Result
from operations.validate.tools import ADD_TAGS
from operations.validate.tools import PROMPT as TOOL_PROMPT

KIND = "sparkfold-exact"
VERSION = 1
FIXED = {"temperature": 0, "seed": 7, "max_tokens": 400}
_PICTURE = [{"type": "image_url", "image_url": {"url": data_url(make_png(64, 64, (220, 20, 20)))}},
            {"type": "text", "text": "Describe this picture in one sentence."}]
# name -> request fields; changing one makes old records incomparable (compare sees the request hash change)
PROMPTS: dict[str, dict] = {
    "prose": {"messages": [{"role": "user", "content": "Write four sentences about a lighthouse keeper."}],
              **THINKING_OFF},
    "code": {"messages": [{"role": "user", "content": "Write a Python function that merges two sorted lists."}],
             **THINKING_OFF},
    "think": {"messages": [{"role": "user", "content": "How many times does the letter r occur in strawberry?"}],
              **THINKING_ON},
    "no-think": {"messages": [{"role": "user", "content": "How many times does the letter r occur in strawberry?"}],
                 **THINKING_OFF},
    "tool": {"messages": [{"role": "user", "content": TOOL_PROMPT}], "tools": [ADD_TAGS], **THINKING_OFF},
    "image": {"messages": [{"role": "user", "content": _PICTURE}], **THINKING_OFF},
}
# strongest first: compare uses the first one both records hold
BASES = ("token_ids", "token_sha", "tokens", "text_sha256")
USAGE = "usage: python -m operations.validate [--base-url URL] exact record FILE | exact compare A.json B.json"


class Mismatch(Exception):
    """The records cannot be compared (unreadable, another kind, another prompt set)."""


def request_sha(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def reply_text(reply: Reply) -> str:
    calls = [(c.get("function") or {}) for c in reply.message.get("tool_calls") or []]
    return "\n".join([reply.reasoning, reply.content, *(f"{c.get('name')}({c.get('arguments')})" for c in calls)])


def identity(reply: Reply) -> dict:
    """What the record keeps of one reply."""
    text = reply_text(reply)
    out: dict = {"text_sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text,
                 "finish_reason": reply.finish_reason}
    ids = reply.choice.get("token_ids")
    if isinstance(ids, list) and ids:
        out["token_ids"] = ids
    logprobs = (reply.choice.get("logprobs") or {}).get("content")
    if isinstance(logprobs, list) and logprobs:
        out["tokens"] = [t.get("token") for t in logprobs if isinstance(t, dict)]
    sha = (reply.body.get("tensorfold") or {}).get("token_sha")
    if isinstance(sha, str) and sha:
        out["token_sha"] = sha
    return out


def refused(error: HttpError) -> dict:
    """A prompt the server refuses (say, an image on an engine without vision) is recorded as its error text."""
    text = f"error: {error}"
    return {"text_sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text, "finish_reason": None}


def _rest(fields: dict) -> dict:
    return {k: v for k, v in fields.items() if k != "messages"}


def ask(client: Client, fields: dict, logprobs: bool) -> tuple[dict, bool]:
    """One prompt's identity, and whether to keep asking for logprobs (engines such as TensorFold's refuse them)."""
    try:
        extra = {"logprobs": True} if logprobs else {}
        return identity(client.chat(fields["messages"], **_rest(fields), **FIXED, **extra)), logprobs
    except HttpError as e:
        if not (logprobs and e.status == 400):
            return refused(e), logprobs
    return ask(client, fields, False)


def _print(line: str) -> None:
    print(f"  {line}", flush=True)


def record(client: Client, names: Iterable[str] = tuple(PROMPTS), say: Callable[[str], None] = _print) -> dict:
    """The replies to the prompts `names` (all by default; the deploy's exact gate asks a few)."""
    prompts, logprobs = {}, True
    for name in names:
        fields = PROMPTS[name]
        found, logprobs = ask(client, fields, logprobs)
        prompts[name] = {"request": request_sha(fields), **found}
        say(f"{name}: {', '.join(b for b in BASES if b in prompts[name])}")
    return {"kind": KIND, "version": VERSION, "base_url": client.base, "model": client.model,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "fixed": FIXED, "prompts": prompts}


def first_difference(a, b) -> tuple[int, object, object] | None:
    """Index and the two values where two sequences (lists or strings) first differ; a missing value is None."""
    for index in range(max(len(a), len(b))):
        value_a = a[index] if index < len(a) else None
        value_b = b[index] if index < len(b) else None
        if value_a != value_b:
            return index, value_a, value_b
    return None


def compare_prompt(prompt_a: dict, prompt_b: dict) -> tuple[str, str | None]:
    """The basis used, and None when the replies are the same, else where they first differ."""
    basis = next(x for x in BASES if x in prompt_a and x in prompt_b)
    if prompt_a[basis] == prompt_b[basis]:
        return basis, None
    if basis in ("token_ids", "tokens"):
        index, value_a, value_b = first_difference(prompt_a[basis], prompt_b[basis]) or (0, None, None)
        return basis, f"first difference at token {index}: {value_a!r} vs {value_b!r}"
    where = first_difference(prompt_a.get("text", ""), prompt_b.get("text", ""))
    if where is None:
        return basis, (f"{basis} {prompt_a[basis][:12]} vs {prompt_b[basis][:12]} (the texts are equal: the tokens "
                       "differ)")
    index, _, _ = where
    return basis, (f"first difference at character {index}: {prompt_a['text'][index:index + 24]!r} vs "
                   f"{prompt_b['text'][index:index + 24]!r} ({basis} {prompt_a[basis][:12]} vs "
                   f"{prompt_b[basis][:12]})")


def load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise Mismatch(f"{path}: {e}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or data.get("version") != VERSION:
        raise Mismatch(f"{path} is not a {KIND} version {VERSION} record")
    if not isinstance(data.get("prompts"), dict) or not all(
            isinstance(p, dict) and "text_sha256" in p for p in data["prompts"].values()):
        raise Mismatch(f"{path}: no prompts with text_sha256")
    return data


def compare(path_a: str, path_b: str) -> Result:
    try:
        record_a, record_b = load(path_a), load(path_b)
    except Mismatch as e:
        return Result("exact", NOT_RUN, str(e))
    result = compare_records(record_a, record_b)
    if result.status == PASS:
        return Result("exact", PASS, f"{result.detail} in {path_a} and {path_b}")
    return result


def compare_records(record_a: dict, record_b: dict, say: Callable[[str], None] = _print) -> Result:
    """Two records of the same prompt set, prompt by prompt (each difference said where it starts)."""
    try:
        if record_a["prompts"].keys() != record_b["prompts"].keys():
            raise Mismatch(f"other prompt sets: {sorted(record_a['prompts'])} vs {sorted(record_b['prompts'])}")
        changed = [name for name in record_a["prompts"]
                   if record_a["prompts"][name].get("request") != record_b["prompts"][name].get("request")]
        if changed or record_a.get("fixed") != record_b.get("fixed"):
            raise Mismatch(f"the requests differ ({', '.join(changed) or 'fixed fields'}): record both with the "
                           "same sparkfold version")
    except Mismatch as e:
        return Result("exact", NOT_RUN, str(e))
    if record_a.get("model") != record_b.get("model"):
        say(f"note: model {record_a.get('model')!r} vs {record_b.get('model')!r}")
    different = []
    for name in record_a["prompts"]:
        basis, difference = compare_prompt(record_a["prompts"][name], record_b["prompts"][name])
        say(f"{'same' if difference is None else 'different'} {name} ({basis})"
            + (f": {difference}" if difference else ""))
        if difference:
            different.append(name)
    if different:
        return Result("exact", FAIL,
                      f"{len(different)} of {len(record_a['prompts'])} prompts differ: {', '.join(different)}")
    return Result("exact", PASS, f"all {len(record_a['prompts'])} prompts answer the same")


def run(words: list[str], args) -> Result:
    """`record FILE` or `compare A B`: the words after `exact` on the command line."""
    if len(words) == 2 and words[0] == "record":
        body = record(connect(args))
        try:
            with open(words[1], "w", encoding="utf-8") as f:
                f.write(json.dumps(body, indent=2, ensure_ascii=False) + "\n")
        except OSError as e:
            return Result("exact", NOT_RUN, f"cannot write {words[1]}: {e}")
        return Result("exact", PASS, f"recorded {len(body['prompts'])} prompts of {body['model']} to {words[1]}")
    if len(words) == 3 and words[0] == "compare":
        return compare(words[1], words[2])
    return Result("exact", NOT_RUN, USAGE)
