"""The shape each setting must have for where it is used: a root shell command, a file sparkfold owns, a unit file,
an exports line, a docker argument. Checked before any operation exists; the operations quote every value as well.

Each shape is a predicate and the fix to show. A value that fails names the setting and that fix.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Callable, Iterable
from typing import Any

# Every pattern is used with fullmatch (`$` would let a trailing newline through) and spells its classes in ASCII.

# Characters a path may hold everywhere it goes (exports lines, --mount, unit files): no quotes, commas, colons,
# whitespace, shell or glob characters.
_PATH = re.compile(r"/[A-Za-z0-9._+@/-]*")
# Docker's own pattern for container and volume names.
_DOCKER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+")
# A model id as the API serves it.
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]*")
_REPO_ID = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*")  # org/name, or a bare name
_COMMIT = re.compile(r"[0-9a-f]{40}")
# git's rules for a branch or tag name, narrowed to what needs no quoting
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
# Docker's repository path: components of [a-z0-9] joined by ".", "_", "__" or runs of "-"
_IMAGE_PATH = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*"
_IMAGE_NAME = re.compile(r"([a-z0-9][a-z0-9.-]*(:[0-9]+)?/)?" + _IMAGE_PATH)
_IMAGE_REF = re.compile(r"([A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]+)?/)?" + _IMAGE_PATH +
                        r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?")
_URL = re.compile(r"https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])"  # IPv6 in []
                  r"(:(?P<port>[0-9]{1,5}))?(/[A-Za-z0-9._~%/+-]*)?")
_FILE_IN_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
_BIND = re.compile(r"[A-Za-z0-9:][A-Za-z0-9.:-]*")  # an address or host name; no scope id, no leading -
_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
_MOUNT_OPTION = re.compile(r"[a-z0-9_]+(=[A-Za-z0-9_.]+)?")
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_WORD = re.compile(r"[A-Za-z0-9_.-]+")
# site-file and per-host fields (operations/settings/site.py checks the file with these, the rules the merged host data)
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]*")
LOGIN = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
NETDEV = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}")  # no leading - or . (so never . or ..)
IBDEV = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
IPV4_PREFIX = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}/[0-9]{1,2}")
# A rail's prefix: the subnet it names is routed over the cable. link_prefix_min (16 unless set) may widen the range
# down to LINK_PREFIX_WIDEST, never further (10.0.0.0/8 is the widest private block); below LINK_PREFIX_USUAL the
# link step warns. /31 is the usual point-to-point link (RFC 3021: both its addresses are hosts); /32 holds one.
LINK_PREFIX_WIDEST = 8
LINK_PREFIX_USUAL = 16
LINK_PREFIX_NARROWEST = 31
# user:password@ in a URL, shown as ***@ in every message
_USERINFO = re.compile(r"^(?P<scheme>[^:/?#]*://)?[^/?#]*@")
# the resource names `docker run --ulimit` knows
ULIMITS = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss", "rtprio",
           "rttime", "sigpending", "stack")
NCCL_DEBUG_LEVELS = ("", "VERSION", "WARN", "INFO", "TRACE", "ABORT")
# ports sshd and the NFS server (nfsd, rpcbind) listen on: the API or the rendezvous there would take them over
RESERVED_PORTS = {22: "ssh", 111: "rpcbind (NFS)", 2049: "NFS"}


def clean_path(value: str) -> bool:
    """Absolute, normalised, and free of characters its consumers cannot carry. `//` is refused anywhere: normpath
    keeps a leading `//`, and `//srv/hf` names /srv/hf to the Spark while the text passes checks of where it lies
    (e.g. that state_dir is outside the exported hub)."""
    return (bool(_PATH.fullmatch(value)) and posixpath.normpath(value) == value and "/../" not in value + "/"
            and "//" not in value)


def single_slashes(value: str) -> str:
    """`value` with each run of slashes written as one (the spelling a message suggests)."""
    return re.sub(r"/{2,}", "/", value)


def example_rail(role: str, index: int = 0) -> str:
    """A rail address to show in a fix, the one sparks.example.yaml gives this Spark's rail: the head ends in .1, the
    worker in .2, rail 1 in the next /24."""
    return f"192.168.{100 + index}.{2 if role == 'worker' else 1}/24"


def rail_prefix_problem(address: str, prefix_min: int, example: str = example_rail("head")) -> str | None:
    """Why a rail's `ip/prefix` (IPV4_PREFIX already fits) has a prefix the link must not use, with the fix (showing
    `example`, an address fit for that Spark's rail); None when it is /prefix_min to /LINK_PREFIX_NARROWEST. The site
    file asks with LINK_PREFIX_WIDEST (the widest any link_prefix_min allows), the settings with their
    link_prefix_min: what the site file accepts, the settings can be told to accept, and nothing the site file
    refuses gets through the settings."""
    prefix = int(address.rpartition("/")[2])
    if prefix > LINK_PREFIX_NARROWEST:
        return (f"its /{prefix} prefix holds this one address, leaving none for the other end of the cable: use "
                f"/{LINK_PREFIX_NARROWEST} (a point-to-point pair, RFC 3021) or wider, e.g. {example}")
    if prefix < prefix_min:
        widen = (f", or set link_prefix_min = {prefix} if the link really needs that subnet"
                 if prefix >= LINK_PREFIX_WIDEST else f" (link_prefix_min allows /{LINK_PREFIX_WIDEST} at the widest)")
        return (f"its /{prefix} prefix would route {2 ** (32 - prefix)} addresses over the cable: use /{prefix_min} "
                f"to /{LINK_PREFIX_NARROWEST}, e.g. {example}{widen}")
    return None


def safe_text(value: str) -> bool:
    """One line of printable text: no newline, carriage return, NUL, line separator or other control character."""
    return value.isprintable()


def fits(pattern: re.Pattern[str], value: Any) -> bool:
    """`value` is a string the whole of which `pattern` matches."""
    return isinstance(value, str) and bool(pattern.fullmatch(value))


def shown(value: Any) -> str:
    """`value` as a message may show it: a URL's user:password never appears."""
    return repr(_USERINFO.sub(r"\g<scheme>***@", value)) if isinstance(value, str) else repr(value)


def serve_arg_shown(index: int, arg: Any) -> str:
    """A serve argument as a message may show it: its flag name, never a value (it may be a secret)."""
    if isinstance(arg, str) and arg.startswith("--"):
        return repr(arg.split("=", 1)[0])
    return f"argument {index + 1}"


def _url(value: str) -> bool:
    match = _URL.fullmatch(value)
    return match is not None and (match["port"] is None or 1 <= int(match["port"]) <= 65535)


def _relative_file(value: str) -> bool:
    return (isinstance(value, str) and bool(_FILE_IN_REPO.fullmatch(value)) and ".." not in value.split("/")
            and "//" not in value)


def _ref(value: str) -> bool:
    return bool(_COMMIT.fullmatch(value) or (_REF.fullmatch(value) and ".." not in value and "//" not in value
                                         and not value.endswith((".lock", "/", "."))))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


Shape = tuple[Callable[[Any], bool], str]
PATH: Shape = (clean_path, "an absolute path of letters, digits and . _ - + @ / (single slashes; no quotes, spaces, "
                           "commas, colons or ..)")
_COMMAND = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
PROGRAM: Shape = (lambda v: v == "" or clean_path(v) or bool(_COMMAND.fullmatch(v)),
                  "empty (the default), a program name on PATH such as python3, or " + PATH[1])
DOCKER_NAME: Shape = (lambda v: bool(_DOCKER_NAME.fullmatch(v)), "letters, digits and _ . - (Docker's name rule), "
                                                              "starting with a letter or digit")
REPO: Shape = (lambda v: bool(_REPO_ID.fullmatch(v)), "a Hugging Face repo id like org/name")
REVISION: Shape = (_ref, "a 40-hex commit or a branch/tag name (letters, digits, . _ - /)")
URL: Shape = (_url, "an http(s) URL like https://host/path (port 1-65535, no user:password@)")
OPTIONAL_URL: Shape = (lambda v: v == "" or _url(v), "empty or " + URL[1])
# a root folder sparkfold writes below (and the head exports hf_cache/hub): never / itself
ROOT_PATH: Shape = (lambda v: clean_path(v) and v != "/", PATH[1] + ", not / itself")

SHAPES: dict[str, Shape] = {
    "hf_cache": ROOT_PATH, "data_dir": ROOT_PATH, "state_dir": ROOT_PATH,
    "link_netplan_file": PATH, "nfs_exports_file": PATH,
    "nvidia_smi_path": PATH, "hf_python": PROGRAM,
    "container_name": DOCKER_NAME, "nfs_volume": DOCKER_NAME,
    "served_name": (lambda v: bool(_MODEL_ID.fullmatch(v)), "a model id: letters, digits and . - _ / :"),
    "engine_image": (lambda v: bool(_IMAGE_NAME.fullmatch(v)), "a Docker image name (lower case, no tag), e.g. "
                                                            "sparkfold/dsv41-tf"),
    "base_image": (lambda v: bool(_IMAGE_REF.fullmatch(v)), "a Docker image reference, e.g. "
                                                         "nvcr.io/nvidia/pytorch:26.07-py3"),
    "engine_context": (lambda v: bool(_FILE_IN_REPO.fullmatch(v) or clean_path(v)) and ".." not in v.split("/")
                       and "//" not in v, "a folder of this checkout (e.g. zig) or an absolute path (single slashes)"),
    "model_repo": REPO, "model_repo_v1_1": REPO, "engram_repo": REPO, "kit_repo": REPO, "ablit_repo": REPO,
    "model_revision": REVISION, "model_revision_v1_1": REVISION, "engram_revision": REVISION,
    "kit_revision": REVISION, "ablit_revision": REVISION,
    "ablit_file": (_relative_file, "a file name inside the repo (letters, digits, . _ - /, no ..)"),
    "hf_endpoint": OPTIONAL_URL, "api_url": OPTIONAL_URL, "zig_url": URL, "tf_repo": URL,
    "host": (lambda v: bool(_BIND.fullmatch(v)), "an address to bind (0.0.0.0, 127.0.0.1, ::, or this Spark's "
                                                  "address)"),
    "zig_version": (lambda v: bool(_VERSION.fullmatch(v)), "a version like 0.17.0"),
    "hf_hub_version": (lambda v: bool(_VERSION.fullmatch(v)), "an exact release like 2.4.0 (huggingface_hub==2.4.0)"),
    # addr= is the head's link address, which the deploy adds: another one would mount someone else's export
    "nfs_options": (lambda v: all(_MOUNT_OPTION.fullmatch(o) and o.split("=")[0] not in ("addr", "clientaddr")
                                  for o in v.split(",")),
                    "comma-separated mount options like nfsvers=4.2,ro,hard (no spaces, no addr=)"),
    "nccl_debug": (lambda v: v in NCCL_DEBUG_LEVELS, "one of " + ", ".join(repr(x) for x in NCCL_DEBUG_LEVELS)),
    "disk_need_gb": (lambda v: _finite(v) and 0 <= v <= 100_000, "a number of GB from 0 to 100000"),
    "image_free_gb": (lambda v: _finite(v) and 0 <= v <= 10_000, "a number of GB from 0 to 10000"),
    "min_avail_gib": (lambda v: _finite(v) and 1 <= v <= 4096, "a number of GiB from 1 to 4096"),
    "memguard_gib": (_finite, "a finite number of GiB"),
    "gpu_clock_period_s": (lambda v: 10 <= v <= 3600, "a number of seconds from 10 to 3600"),
    "progress_every_s": (lambda v: 1 <= v <= 600, "a whole number of seconds from 1 to 600"),
    "link_measure_s": (lambda v: 1 <= v <= 60, "a whole number of seconds from 1 to 60"),
    "oom_score_adj": (lambda v: -1000 <= v <= 1000, "a whole number from -1000 to 1000"),
    "spill_gib": (lambda v: 0 <= v <= 4096, "0 (off) or a number of GiB up to 4096"),
    "kv_shard": (lambda v: 0 <= v <= 64, "0 (off) or a shard count up to 64"),
}
# lists: each item's shape
ITEM_SHAPES: dict[str, Shape] = {
    "engram_files": (_relative_file, "file names inside the repo (letters, digits, . _ - /, no ..)"),
    "allowed_arch": (lambda v: isinstance(v, str) and bool(_WORD.fullmatch(v)), "machine names like aarch64"),
    "allowed_os": (lambda v: isinstance(v, str) and bool(_WORD.fullmatch(v)), "os-release IDs like ubuntu"),
    "extra_serve_args": (lambda v: isinstance(v, str) and safe_text(v) and v != "",
                         "each argument one line of text (no newline or control character)"),
}


# values checked elsewhere: the token, the forwarded variables and the own API key are never shown (rules.py checks
# the variables, sources.py the key), link rails have their own rules, the peer is another Spark
_NOT_TEXT = {"hf_token", "hf_env", "own_api_key", "link_rails", "peer"}


def _texts(value: Any) -> Iterable[Any]:
    if isinstance(value, dict):
        return [*value, *value.values()]
    return value if isinstance(value, (list, tuple)) else [value]


def text_problems(values: dict[str, Any]) -> list[str]:
    """Every string setting, list item and mapping entry is one line of printable text (those with a shape are
    checked with it)."""
    problems = []
    for name, value in values.items():
        if name in _NOT_TEXT or name in SHAPES or name in ITEM_SHAPES or name == "engine_env":
            continue
        if any(isinstance(v, str) and not safe_text(v) for v in _texts(value)):
            problems.append(f"{name} = {shown(value)} must be one line of printable text (no newline, carriage "
                            "return or control character)")
    if not safe_text(values.get("hf_token", "")):
        problems.append(f"{values.get('hf_token_source') or 'HF_TOKEN'} (the token, not shown) must be one line of "
                        "printable text: copy the token again")
    return problems


def shape_problems(values: dict[str, Any]) -> list[str]:
    """Every setting whose value does not have its shape, with the fix."""
    problems = text_problems(values)
    for name, (ok, fix) in SHAPES.items():
        value = values[name]
        if not (isinstance(value, str) and not safe_text(value) or not ok(value)):
            continue
        if isinstance(value, str) and safe_text(value) and "//" in value and ok(single_slashes(value)):
            # the one fault is a doubled slash: say so, with the spelling to use
            problems.append(f"{name} = {shown(value)} holds //: write it with single slashes, "
                            f"{shown(single_slashes(value))} (a doubled slash names the same path to the Spark but "
                            "slips past the checks of where it lies)")
        else:
            problems.append(f"{name} = {shown(value)} must be {fix}")
    for name, (ok, fix) in ITEM_SHAPES.items():
        bad = [(i, item) for i, item in enumerate(values[name]) if not ok(item)]
        if bad:
            listed = (serve_arg_shown(i, b) if name == "extra_serve_args" else shown(b) for i, b in bad)
            problems.append(f"{name}: {', '.join(listed)} must be {fix}")
    for name in ("port", "master_port"):
        if values[name] in RESERVED_PORTS:
            problems.append(f"{name} = {values[name]} is the port of {RESERVED_PORTS[values[name]]} on the Sparks: "
                            "choose another port")
    names = [ulimit.split("=", 1)[0] for ulimit in values["docker_ulimits"] if isinstance(ulimit, str)]
    for ulimit in values["docker_ulimits"]:
        if isinstance(ulimit, str) and ulimit.split("=", 1)[0] not in ULIMITS:
            problems.append(f"docker_ulimits: {shown(ulimit)} names no limit docker knows ({', '.join(ULIMITS)})")
    for twice in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"docker_ulimits: {twice} is set twice: keep one {twice}=... entry")
    for key, value in values["engine_env"].items():
        if not fits(_ENV_NAME, key) or not safe_text(value):
            problems.append(f"engine_env: {shown(key)} must be an upper-case variable name with a one-line value")
    return problems

# The guarded netplan apply's timing (operations/network/netplan_apply.py), here so the settings can check against it.
CONFIRM_WAIT_APPLY_S = 60  # netplan apply on a Spark takes seconds; a minute means it hung
CONFIRM_REACH_S = 30  # on top of that wait: opening the new connection, and the margin kept before the revert fires
# The shortest link_rollback_s (the settings refuse less): a shorter window would fire the revert while the
# confirmation still waits for the apply, undoing an apply that was about to be confirmed.
MIN_ROLLBACK_S = CONFIRM_WAIT_APPLY_S + CONFIRM_REACH_S
MAX_ROLLBACK_S = 3600
