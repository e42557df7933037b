"""Where a Spark's settings come from, merged once, every problem collected (never raised).

Precedence, highest first: `--data` > the environment > the site file > group_data/<role>.py > group_data/all.py.
pyinfra merges the data sources itself (host.data); the environment is put between `--data` and the site file.
Environment names: SPARKFOLD_<NAME> for every setting, the shell recipe's own names for the settings in
RECIPE_ENV (CONTEXT=524288) and huggingface_hub's for the settings in TOOL_ENV (HF_ENDPOINT). Generic names (HOST,
PORT, API_KEY) are not read: shells and users set them for other reasons.

Besides settings, a Spark's Settings carry what this machine gives the head's downloads and the API key: the
Hugging Face token (HF_TOKEN, else the one huggingface_hub's get_token() finds, which `hf auth login` saved),
huggingface_hub's variables of the environment (HUB_ENV: timeouts, Xet, proxies) and the key in api_key_file.
Secrets are read here and never shown: a problem names the variable or the file.
"""

from __future__ import annotations

import ast
import difflib
import functools
import io
import json
import math
import os
import shlex
import tokenize
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from operations.settings.model import PASSTHROUGH_PREFIXES, PROJECT_ROOT, SETTING_NAMES, Rail, Settings
from operations.settings.shapes import shown

ALL_PY = PROJECT_ROOT / "group_data" / "all.py"
# The shell recipe's variables, read under their own names; none of them is a common shell variable.
RECIPE_ENV = frozenset((
    "context", "parallel", "thinking", "reasoning_effort", "drafts", "eaq_v1_1", "ablit", "min_avail_gib",
    "memguard_gib", "spill_gib", "kv_shard", "pool", "served_name",
))
# Settings another tool's variable sets under that tool's name (empty counts as unset, as the tool reads it).
TOOL_ENV = {"hf_endpoint": "HF_ENDPOINT"}
ENV_PREFIX = "SPARKFOLD_"
# huggingface_hub's variables of this machine's environment that the head's downloads get (HF_ENDPOINT is the
# hf_endpoint setting; the token travels in its own file). A proxy URL may hold a password: values are never shown.
HUB_TIMEOUTS = ("HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_ETAG_TIMEOUT")
HUB_SWITCHES = ("HF_XET_HIGH_PERFORMANCE",)
HUB_PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
               "no_proxy")
HUB_ENV = HUB_TIMEOUTS + HUB_SWITCHES + HUB_PROXIES
# the token, in huggingface_hub's order (HUGGING_FACE_HUB_TOKEN is its older name)
TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
SAVED_TOKEN = "the token saved on this machine (hf auth login)"
# SPARKFOLD_* variables that are not settings: the site file's path.
ENV_META = frozenset(("SPARKFOLD_SITE",))
# Keys the site file and group_data/<role>.py put in a host's data besides settings (inventory.py,
# operations/settings/site.py).
HOST_KEYS = frozenset(("role", "rank", "link_rails", "ssh_hostname", "ssh_user", "ssh_port", "ssh_key",
                       "reach_from_head"))

_HINTS = typing.get_type_hints(Settings)


def env_names(name: str) -> tuple[str, ...]:
    """The environment variables that set `name`, in rising precedence."""
    own = f"{ENV_PREFIX}{name.upper()}"
    if name in TOOL_ENV:
        return (TOOL_ENV[name], own)
    return (name.upper(), own) if name in RECIPE_ENV else (own,)


def meanings(path: Path = ALL_PY) -> dict[str, str]:
    """name -> the trailing comment of its line in group_data/all.py (the one-line meaning)."""
    source = path.read_text()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    found: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                found[target.id] = comments.get(node.end_lineno or node.lineno, "")
    return found


@dataclass(frozen=True)
class Layers:
    """One Spark's pyinfra data, by source: pyinfra's host.data is these merged, later ones winning."""

    all: Mapping[str, Any]  # group_data/all.py
    group: Mapping[str, Any]  # group_data/<role>.py
    site: Mapping[str, Any]  # the site file: the Spark's entry and `data:`
    override: Mapping[str, Any]  # pyinfra's --data

    def merged(self) -> dict[str, Any]:
        return {**self.all, **self.group, **self.site, **self.override}

    def source_of(self, name: str) -> str:
        for where, layer in (("--data", self.override), ("the site file", self.site),
                             ("group_data (role file)", self.group), ("group_data/all.py", self.all)):
            if name in layer:
                return where
        return "the default"


def suggestion(name: str, known: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f": did you mean {close[0]}?" if close else ""


def unknown_names(layers: Layers, environ: Mapping[str, str]) -> list[str]:
    """Every name that is not a setting, from each source, with the closest known name."""
    known = set(SETTING_NAMES)
    problems = []
    for where, layer, allowed in (("group_data/all.py", layers.all, set()),
                                  ("a group_data role file", layers.group, {"role", "rank"}),
                                  ("the site file's data", layers.site, HOST_KEYS),
                                  ("--data", layers.override, HOST_KEYS)):
        for name in layer:
            if name in known or name in allowed or name.startswith("_") or (name.startswith("ssh_") and
                                                                            where != "group_data/all.py"):
                continue
            problems.append(f"{name} in {where} is not a sparkfold setting{suggestion(name, known)} "
                            "(`python -m operations.settings` lists them)")
    missing = [n for n in SETTING_NAMES if n not in layers.all]
    if missing:
        problems.append(f"group_data/all.py lacks {', '.join(missing)}: restore their defaults from git")
    env_known = {var: name for name in SETTING_NAMES for var in env_names(name)}
    for var in environ:
        if var.startswith(ENV_PREFIX) and var not in env_known and var not in ENV_META:
            close = suggestion(var, list(env_known) + sorted(ENV_META))
            problems.append(f"environment variable {var} is not a sparkfold setting{close}")
    return problems


class _Bad(ValueError):
    """A value that does not fit its setting's type."""


def _switch(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise _Bad("a switch: use true or false (1 or 0)")


def _number(kind: type, value: Any) -> int | float:
    if isinstance(value, bool):
        raise _Bad(f"a {kind.__name__}")
    try:
        number = kind(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise _Bad(f"a {'whole number' if kind is int else 'number'}") from None
    except OverflowError:  # int(inf)
        raise _Bad("a finite whole number") from None
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise _Bad("a whole number")
    if kind is float and not math.isfinite(number):
        raise _Bad("a finite number")
    return number


def _string_list(value: Any) -> list[str]:
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else shlex.split(text)
        except ValueError:
            raise _Bad('a list: write a JSON list (["a", "b"]) or words separated by spaces') from None
    if not isinstance(value, (list, tuple)):
        raise _Bad('a list, e.g. ["a", "b"]')
    return list(value)  # items are checked by the rules (each argument must be a string)


def _string_map(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise _Bad('a mapping: write a JSON object ({"TF_DS_X": "1"})') from None
    if not isinstance(value, Mapping):
        raise _Bad('a mapping, e.g. {"TF_DS_X": "1"}')
    return {str(k): str(v) for k, v in value.items()}


def coerce(name: str, value: Any) -> Any:
    """`value` as the type of setting `name`; raises _Bad naming what it should be."""
    kind = _HINTS[name]
    if kind is bool:
        return _switch(value)
    if kind in (int, float):
        return _number(kind, value)
    if kind is str:
        if value is None:
            return ""
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise _Bad("text")
        return str(value)
    if kind == list[str]:
        return _string_list(value)
    if kind == dict[str, str]:
        return _string_map(value)
    raise TypeError(f"no coercion for {name}: {kind}")


def _fallback(name: str, default: Any) -> Any:
    """all.py's default, or the type's empty value when that is wrong too."""
    try:
        return coerce(name, default)
    except _Bad:
        return _HINTS[name]()


def passthrough_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The engine's variables (PASSTHROUGH_PREFIXES) in this machine's environment: passed to both ranks."""
    return {k: v for k, v in environ.items() if k.startswith(PASSTHROUGH_PREFIXES)}


def passthrough_note(environ: Mapping[str, str]) -> str:
    """The plan's line naming the engine variables taken from this machine's environment (names only: a value may
    be a secret); "" when there are none."""
    names = sorted(passthrough_env(environ))
    return f"engine variables taken from this machine's environment: {', '.join(names)}" if names else ""


def hub_env(environ: Mapping[str, str]) -> dict[str, str]:
    """huggingface_hub's variables (HUB_ENV) set in this machine's environment: passed to the head's downloads. A
    timeout set but empty is kept, for the rules to refuse: huggingface_hub cannot start with it."""
    return {name: environ[name] for name in HUB_ENV if environ.get(name) or name in HUB_TIMEOUTS and name in environ}


def hub_timeout_unreadable(value: str) -> bool:
    """huggingface_hub int()s each timeout as it is imported: a value int() refuses stops its import (here, before
    it can give the saved token, and on the head)."""
    try:
        int(value)
    except ValueError:
        return True
    return False


def hub_unimportable(environ: Mapping[str, str]) -> bool:
    """huggingface_hub cannot be imported with this environment (an unreadable timeout): the saved token is not asked
    for, and the rules name the variable."""
    return any(name in environ and hub_timeout_unreadable(environ[name]) for name in HUB_TIMEOUTS)


# what huggingface_hub's get_token() reads from the environment besides the token file (HF_OIDC_*: a token exchange)
_TOKEN_INPUTS = ("HF_OIDC_RESOURCE", "HF_OIDC_ID_TOKEN", *TOKEN_ENV)


def saved_hf_token() -> str | None:
    """The token huggingface_hub's get_token() finds on this machine (HF_TOKEN, else the file `hf auth login`
    wrote, at HF_TOKEN_PATH or under HF_HOME); None without one, or without huggingface_hub. Asked once per process
    for what it reads (the variables and the file's path): a run loads the settings up to six times."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    return _get_token(tuple(os.environ.get(name) for name in _TOKEN_INPUTS), constants.HF_TOKEN_PATH)


@functools.lru_cache(maxsize=4)
def _get_token(inputs: tuple[str | None, ...], token_path: str) -> str | None:
    # the arguments only key the cache: get_token() reads them itself (a failed exchange raises: not kept)
    from huggingface_hub import get_token
    return get_token()


def forget_local_reads() -> None:
    """Let the next settings load read the saved token and the API key file again (tests that change them)."""
    _get_token.cache_clear()
    _read_api_key.cache_clear()


def hf_token_of(environ: Mapping[str, str],
                saved: Callable[[], str | None] | None) -> tuple[str, str, list[str]]:
    """(token, where it came from, problems): HF_TOKEN of the run (or huggingface_hub's older name), else the one
    `saved` finds (saved_hf_token). Only names are ever reported, never the token."""
    for name in TOKEN_ENV:
        if environ.get(name, "").strip():
            return environ[name], name, []
    if saved is None:
        return "", "", []
    try:
        token = (saved() or "").strip()
    except Exception as exc:  # huggingface_hub raises when a token exchange it was asked for (HF_OIDC_RESOURCE) fails
        return "", "", [f"Hugging Face token: huggingface_hub could not give this machine's token "
                        f"({type(exc).__name__}): run `hf auth login` again, or set HF_TOKEN"]
    return (token, SAVED_TOKEN, []) if token else ("", "", [])


def api_key_from_file(path: str) -> tuple[str, list[str]]:
    """(the key in api_key_file, problems reading it): the file is on this machine; the key is never shown. Read once
    per process for each path as it expands: a run loads the head's settings three times."""
    key, problems = _read_api_key(path, os.path.expanduser(path)) if path else ("", [])
    return key, list(problems)  # a copy: the cache keeps its own


@functools.lru_cache(maxsize=4)
def _read_api_key(path: str, where: str) -> tuple[str, list[str]]:
    name = f"api_key_file = {shown(path)}"
    fix = ("write your key into it, alone on one line, or set api_key_file to \"\" (sparkfold then makes a key on the "
           "head)")
    if not os.path.isabs(where):
        return "", [f"{name} must be an absolute path on this machine (or start with ~/)"]
    try:
        text = Path(where).read_text(encoding="utf-8")
    except FileNotFoundError:
        return "", [f"{name}: there is no such file on this machine: {fix}"]
    except IsADirectoryError:
        return "", [f"{name} is a folder on this machine, not a file: name the file that holds the key"]
    except PermissionError:
        return "", [f"{name} cannot be read by this machine's user: give it read access (chmod 600 the file as the "
                    "user who runs the deploy)"]
    except (OSError, UnicodeDecodeError) as exc:
        return "", [f"{name} cannot be read ({type(exc).__name__}): {fix}"]
    key = text.strip()
    if not key:
        return "", [f"{name} is empty: {fix}"]
    if not (key.isascii() and key.isprintable()) or any(c.isspace() for c in key):
        return "", [f"{name} must hold the key alone on one line, printable ASCII without spaces (what a client sends "
                    "after `Authorization: Bearer `); the key is not shown"]
    return key, []


def _rails(value: Any) -> tuple[Rail, ...]:
    rails = []
    for rail in value or ():
        if isinstance(rail, Mapping):
            ibdev = rail.get("ibdev")
            rails.append(Rail(netdev=str(rail.get("netdev", "")), address=str(rail.get("address", "")),
                              ibdev=str(ibdev) if ibdev else None))
    return tuple(rails)


def load(layers: Layers, environ: Mapping[str, str], home: str,
         saved_token: Callable[[], str | None] | None = None) -> tuple[Settings, list[str]]:
    """One Spark's Settings (without its peer) and every problem met reading them (unknown names, wrong types, the
    API key file).

    A value that does not fit keeps the default, so the rules can still check the rest. `home`: the ssh user's
    home on that Spark (a fact), against which empty path settings resolve. `saved_token`: where the Hugging Face
    token comes from without HF_TOKEN (saved_hf_token on a real run; None reads the environment only).
    """
    data = layers.merged()
    problems = unknown_names(layers, environ)
    values: dict[str, Any] = {}
    for name in SETTING_NAMES:
        value, where = data.get(name), layers.source_of(name)
        for var in env_names(name):
            if var in environ and name not in layers.override and (environ[var] or var != TOOL_ENV.get(name)):
                value, where = environ[var], f"environment variable {var}"
        try:
            values[name] = coerce(name, value)
        except _Bad as bad:
            # a key, a token or a serve argument may be a secret; a URL's user:password is masked
            hidden = "key" in name or "token" in name or name in ("extra_serve_args", "engine_env")
            shown_value = "(hidden)" if hidden else shown(value)
            clash = ""
            if where == f"environment variable {name.upper()}" and name in RECIPE_ENV:
                # the recipe's bare names are common words: another tool may have set it (GNU parallel reads
                # PARALLEL, for one)
                clash = (f"; if {name.upper()} is set for another program, run with `env -u {name.upper()}` or "
                         f"give SPARKFOLD_{name.upper()}, which wins")
            if name == "api_key":  # people give the key itself here: it travels in a file, which they name
                clash = ("; api_key only turns the key on: to use your own key, put it alone in a file on this "
                         "machine and set api_key_file to that file's path (SPARKFOLD_API_KEY_FILE=~/.sparkfold-key), "
                         "with api_key = true")
            problems.append(f"{name} = {shown_value} from {where} is not {bad}{clash}")
            values[name] = _fallback(name, layers.all.get(name))
    engine_env = dict(values["engine_env"])
    engine_env.update(passthrough_env(environ))
    values["engine_env"] = engine_env

    home = home.rstrip("/") or "/root"
    role = str(data.get("role", ""))
    values.update(
        hf_cache=values["hf_cache"] or f"{home}/.cache/huggingface",
        data_dir=values["data_dir"] or f"{home}/.cache/sparkfold",
        state_dir=values["state_dir"] or f"{home}/.local/state/sparkfold",
    )
    try:
        rank = int(data.get("rank", 0 if role == "head" else 1))
    except (TypeError, ValueError):
        problems.append(f"rank = {data.get('rank')!r} in group_data must be 0 (head) or 1 (worker)")
        rank = 0 if role == "head" else 1
    try:
        ssh_port = int(_number(int, 22 if data.get("ssh_port") in (None, "") else data["ssh_port"]))
    except _Bad:
        # the rules check the range; a port that is no number is reported here, where its source is known
        problems.append(f"ssh_port = {shown(data.get('ssh_port'))} for {role or 'this Spark'} from "
                        f"{layers.source_of('ssh_port')} must be a port number (1-65535)")
        ssh_port = 22
    # asked only when huggingface_hub can start: else its ValueError would read as a token problem
    hf_token, hf_token_source, token_problems = hf_token_of(environ, None if hub_unimportable(environ) else saved_token)
    problems += token_problems
    own_api_key = ""
    if role == "head":  # the key goes to the head only
        own_api_key, key_problems = api_key_from_file(values["api_key_file"])
        problems += key_problems
    settings = Settings(
        **values,
        role=role,
        rank=rank,
        link_rails=_rails(data.get("link_rails")),
        ssh_hostname=str(data.get("ssh_hostname", "")),
        ssh_user=str(data.get("ssh_user") or "root"),
        ssh_port=ssh_port,
        reach_from_head=str(data.get("reach_from_head") or ""),
        home=home,
        hf_token=hf_token,
        hf_token_source=hf_token_source,
        hf_env=hub_env(environ),
        own_api_key=own_api_key,
    )
    return settings, problems

