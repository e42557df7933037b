"""The shape each setting must have for where it is used: a root shell command, a file sparkfold owns, a unit file,
an exports line, a docker argument. Checked before any operation exists; the operations quote every value as well.

Each shape is a predicate and the fix to show. A value that fails names the setting and that fix.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Callable
from typing import Any

# Characters a path may hold everywhere it goes (exports lines, --mount, unit files): no quotes, commas, colons,
# whitespace, shell or glob characters.
_PATH = re.compile(r"^/[A-Za-z0-9._+@/-]*$")
# Docker's own pattern for container and volume names.
_DOCKER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
# A model id as the API serves it.
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$")
_REPO_ID = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")  # org/name, or a bare name
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# git's rules for a branch or tag name, narrowed to what needs no quoting
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
# Docker's repository path: components of [a-z0-9] joined by ".", "_", "__" or runs of "-"
_IMAGE_PATH = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*"
_IMAGE_NAME = re.compile(r"^([a-z0-9][a-z0-9.-]*(:[0-9]+)?/)?" + _IMAGE_PATH + "$")
_IMAGE_REF = re.compile(r"^([A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]+)?/)?" + _IMAGE_PATH +
                        r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$")
_URL = re.compile(r"^https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]+)?(/[A-Za-z0-9._~%/+-]*)?$")  # IPv6 in []
_FILE_IN_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
_BIND = re.compile(r"^[A-Za-z0-9:][A-Za-z0-9.:-]*$")  # an address or host name; no scope id, no leading -
_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
_MOUNT_OPTION = re.compile(r"^[a-z0-9_]+(=[A-Za-z0-9_.]+)?$")
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_WORD = re.compile(r"^[A-Za-z0-9_.-]+$")
# the resource names `docker run --ulimit` knows
ULIMITS = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss", "rtprio",
           "rttime", "sigpending", "stack")
NCCL_DEBUG_LEVELS = ("", "VERSION", "WARN", "INFO", "TRACE", "ABORT")
# ports sshd and the NFS server (nfsd, rpcbind) listen on: the API or the rendezvous there would take them over
RESERVED_PORTS = {22: "ssh", 111: "rpcbind (NFS)", 2049: "NFS"}


def clean_path(value: str) -> bool:
    """Absolute, normalised, and free of characters its consumers cannot carry."""
    return bool(_PATH.match(value)) and posixpath.normpath(value) == value and "/../" not in value + "/"


def safe_text(value: str) -> bool:
    """One line of printable text: no newline, carriage return, NUL or other control character."""
    return value.isprintable()


def _relative_file(value: str) -> bool:
    return (isinstance(value, str) and bool(_FILE_IN_REPO.match(value)) and ".." not in value.split("/")
            and "//" not in value)


def _ref(value: str) -> bool:
    return bool(_COMMIT.match(value) or (_REF.match(value) and ".." not in value and "//" not in value
                                         and not value.endswith((".lock", "/", "."))))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


Shape = tuple[Callable[[Any], bool], str]
PATH: Shape = (clean_path, "an absolute path of letters, digits and . _ - + @ / (no quotes, spaces, commas, colons "
                           "or ..)")
_COMMAND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
PROGRAM: Shape = (lambda v: v == "" or clean_path(v) or bool(_COMMAND.match(v)),
                  "empty (the default), a program name on PATH such as python3, or " + PATH[1])
DOCKER_NAME: Shape = (lambda v: bool(_DOCKER_NAME.match(v)), "letters, digits and _ . - (Docker's name rule), "
                                                              "starting with a letter or digit")
REPO: Shape = (lambda v: bool(_REPO_ID.match(v)), "a Hugging Face repo id like org/name")
REVISION: Shape = (_ref, "a 40-hex commit or a branch/tag name (letters, digits, . _ - /)")
URL: Shape = (lambda v: bool(_URL.match(v)), "an http(s) URL like https://host/path")
OPTIONAL_URL: Shape = (lambda v: v == "" or bool(_URL.match(v)), "empty or " + URL[1])

SHAPES: dict[str, Shape] = {
    "hf_cache": PATH, "data_dir": PATH, "state_dir": PATH,
    "link_netplan_file": PATH, "nfs_exports_file": PATH,
    "nvidia_smi_path": PATH, "hf_python": PROGRAM,
    "container_name": DOCKER_NAME, "nfs_volume": DOCKER_NAME,
    "served_name": (lambda v: bool(_MODEL_ID.match(v)), "a model id: letters, digits and . - _ / :"),
    "engine_image": (lambda v: bool(_IMAGE_NAME.match(v)), "a Docker image name (lower case, no tag), e.g. "
                                                            "sparkfold/dsv41-tf"),
    "base_image": (lambda v: bool(_IMAGE_REF.match(v)), "a Docker image reference, e.g. "
                                                         "nvcr.io/nvidia/pytorch:26.07-py3"),
    "engine_context": (lambda v: bool(_FILE_IN_REPO.match(v) or clean_path(v)) and ".." not in v.split("/"),
                       "a folder of this checkout (e.g. zig) or an absolute path"),
    "model_repo": REPO, "model_repo_v1_1": REPO, "engram_repo": REPO, "kit_repo": REPO, "ablit_repo": REPO,
    "model_revision": REVISION, "model_revision_v1_1": REVISION, "engram_revision": REVISION,
    "kit_revision": REVISION, "ablit_revision": REVISION,
    "ablit_file": (_relative_file, "a file name inside the repo (letters, digits, . _ - /, no ..)"),
    "hf_endpoint": OPTIONAL_URL, "api_url": OPTIONAL_URL, "zig_url": URL, "tf_repo": URL,
    "host": (lambda v: bool(_BIND.match(v)), "an address to bind (0.0.0.0, 127.0.0.1, ::, or this Spark's address)"),
    "zig_version": (lambda v: bool(_VERSION.match(v)), "a version like 0.17.0"),
    # addr= is the head's link address, which the deploy adds: another one would mount someone else's export
    "nfs_options": (lambda v: all(_MOUNT_OPTION.match(o) and o.split("=")[0] not in ("addr", "clientaddr")
                                  for o in v.split(",")),
                    "comma-separated mount options like nfsvers=4.2,ro,hard (no spaces, no addr=)"),
    "nccl_debug": (lambda v: v in NCCL_DEBUG_LEVELS, "one of " + ", ".join(repr(x) for x in NCCL_DEBUG_LEVELS)),
    "disk_need_gb": (lambda v: _finite(v) and 0 <= v <= 100_000, "a number of GB from 0 to 100000"),
    "image_free_gb": (lambda v: _finite(v) and 0 <= v <= 10_000, "a number of GB from 0 to 10000"),
    "min_avail_gib": (lambda v: _finite(v) and 1 <= v <= 4096, "a number of GiB from 1 to 4096"),
    "memguard_gib": (_finite, "a finite number of GiB"),
    "gpu_clock_period_s": (lambda v: 10 <= v <= 3600, "a number of seconds from 10 to 3600"),
    "oom_score_adj": (lambda v: -1000 <= v <= 1000, "a whole number from -1000 to 1000"),
    "link_rollback_s": (lambda v: 30 <= v <= 3600, "a number of seconds from 30 to 3600"),
    "spill_gib": (lambda v: 0 <= v <= 4096, "0 (off) or a number of GiB up to 4096"),
    "kv_shard": (lambda v: 0 <= v <= 64, "0 (off) or a shard count up to 64"),
}
# lists: each item's shape
ITEM_SHAPES: dict[str, Shape] = {
    "engram_files": (_relative_file, "file names inside the repo (letters, digits, . _ - /, no ..)"),
    "allowed_arch": (lambda v: isinstance(v, str) and bool(_WORD.match(v)), "machine names like aarch64"),
    "allowed_os": (lambda v: isinstance(v, str) and bool(_WORD.match(v)), "os-release IDs like ubuntu"),
    "extra_serve_args": (lambda v: isinstance(v, str) and safe_text(v) and v != "",
                         "each argument one line of text (no newline or control character)"),
}


def shape_problems(values: dict[str, Any]) -> list[str]:
    """Every setting whose value does not have its shape, with the fix."""
    problems = []
    for name, (fits, fix) in SHAPES.items():
        value = values[name]
        if isinstance(value, str) and not safe_text(value) or not fits(value):
            problems.append(f"{name} = {value!r} must be {fix}")
    for name, (fits, fix) in ITEM_SHAPES.items():
        bad = [item for item in values[name] if not fits(item)]
        if bad:
            problems.append(f"{name}: {', '.join(repr(b) for b in bad)} must be {fix}")
    for name in ("port", "master_port"):
        if values[name] in RESERVED_PORTS:
            problems.append(f"{name} = {values[name]} is the port of {RESERVED_PORTS[values[name]]} on the Sparks: "
                            "choose another port")
    for u in values["docker_ulimits"]:
        if isinstance(u, str) and u.split("=", 1)[0] not in ULIMITS:
            problems.append(f"docker_ulimits: {u!r} names no limit docker knows ({', '.join(ULIMITS)})")
    for key, value in values["engine_env"].items():
        if not _ENV_NAME.match(key) or not safe_text(value):
            problems.append(f"engine_env: {key!r} must be an upper-case variable name with a one-line value")
    return problems
