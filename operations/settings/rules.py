"""The rules every Spark's settings must satisfy, each problem naming the setting and the fix.

`validate` checks one Spark, `validate_pair` compares the two, `validate_all` is the one list deploy.py prints
before any operation exists (a problem the two Sparks share is listed once).
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Mapping
from dataclasses import fields

from operations.settings.model import PASSTHROUGH_PREFIXES, Settings
from operations.settings.shapes import (
    CONFIRM_WAIT_APPLY_S,
    HOST_NAME,
    IBDEV,
    IPV4_PREFIX,
    LINK_PREFIX_NARROWEST,
    LINK_PREFIX_USUAL,
    LINK_PREFIX_WIDEST,
    LOGIN,
    MAX_ROLLBACK_S,
    MIN_ROLLBACK_S,
    NETDEV,
    example_rail,
    fits,
    rail_prefix_problem,
    safe_text,
    shape_problems,
    shown,
)
from operations.settings.sources import HUB_SWITCHES, HUB_TIMEOUTS, hub_timeout_unreadable, hub_unimportable

# The engine's window: dsv41's max_position_embeddings.
MAX_CONTEXT = 1_048_576
REASONING_EFFORTS = ("", "low", "medium", "high", "xhigh")
LINK_MEASURE_MODES = ("stop", "warn", "off")
# Settings both ranks must agree on (the pair is one server).
PAIR_SETTINGS = (
    "context", "pool", "parallel", "drafts", "master_port", "gpu_clock_mhz", "link_mtu", "nccl_rails",
    "link_measure", "link_min_gbps", "link_measure_s", "nccl_channels", "engine_image", "engine_context", "base_image",
    "tf_repo", "tf_ref", "tools_ref", "prebuilt_image", "eaq_v1_1", "ablit", "container_name", "model_repo",
    "model_revision", "model_repo_v1_1", "model_revision_v1_1", "kv_shard", "spill_gib", "engine_env",
    "keep_generations", "upgrade_gate", "verify_data",
)

_HEX = re.compile(r"[0-9a-f]+")
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")
_WHOLE = re.compile(r"[0-9]+")
# prebuilt_image: a reference pinned by digest (operations/image.py splits it with the same pattern)
PREBUILT_REFERENCE = re.compile(r"(?P<name>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})")
_ULIMIT = re.compile(r"[a-z]+=-?[0-9]+(:-?[0-9]+)?")
_API_URL = re.compile(r"https?://[^/\s]+(/\S*)?", re.ASCII)
# Flags rank 0's command line gets from sparkfold (rank.spec.rank0_argv) -> the setting that sets each; given
# again in extra_serve_args they would sidestep that setting's checks (reserved ports, the open-API warning).
OWN_SERVE_FLAGS = {
    "--name": "served_name", "--host": "host", "--port": "port", "--master-port": "master_port",
    "--context": "context", "--parallel": "parallel", "--max-tokens": "max_tokens", "--thinking": "thinking",
    "--no-thinking": "thinking", "--reasoning-effort": "reasoning_effort", "--drafts": "drafts",
    "--no-drafts": "drafts", "--api-key": "api_key", "--api-key-file": "api_key", "--temperature": "temperature",
    "--top-p": "top_p", "--top-k": "top_k",
    "--chat-template": "engine_image (the image's kit brings the template)", "--backend": "engine_image (cuda)",
}

# rank 0's sampling defaults: (setting, type of its serve flag's value, the range it must be in, that range in words)
SAMPLING_RULES = (
    ("temperature", float, lambda v: v >= 0, "a number >= 0 (e.g. 1.0; 0 is greedy)"),
    ("top_p", float, lambda v: 0 < v <= 1, "a number above 0 and at most 1 (e.g. 0.95)"),
    ("top_k", int, lambda v: v >= 0, "a whole number >= 0 (e.g. 20)"),
)
UPGRADE_GATES = ("smoke", "exact")
# The folders sparkfold writes below, and the files it owns in a folder a system tool reads (that folder, the suffix).
ROOT_FOLDERS = ("hf_cache", "data_dir", "state_dir")
OWNED_FILES = {"link_netplan_file": ("/etc/netplan", ".yaml"), "nfs_exports_file": ("/etc/exports.d", ".exports")}
# what huggingface_hub reads as a switch (its _is_true takes 1, on, yes, true; the others mean off)
SWITCH_WORDS = ("1", "0", "true", "false", "yes", "no", "on", "off")


def _check_range(problems, s, name, low, high, fix=""):
    value = getattr(s, name)
    if not (low <= value <= high):
        problems.append(f"{name} = {value!r} is outside {low}..{high}{': ' + fix if fix else ''}")


def sampling_problems(s: Settings) -> list[str]:
    """temperature, top_p, top_k: each "" (the engine's default) or a number the engine's serve flag accepts."""
    problems = []
    for name, kind, ok, rule in SAMPLING_RULES:
        text = getattr(s, name)
        if text == "":
            continue
        # plain decimals only: Python would also read "1_0", "1e3" or " 1", which the engine's parser may not
        if not fits(_DECIMAL if kind is float else _WHOLE, text) or not ok(kind(text)):
            problems.append(f"{name} = {shown(getattr(s, name))} must be {rule}, or \"\" to leave the engine's "
                            "default")
    return problems


def validate(s: Settings) -> list[str]:
    """Every problem with one Spark's settings, each naming the setting and the fix."""
    problems: list[str] = []
    if s.context < 4096 or s.context > MAX_CONTEXT or s.context & (s.context - 1):
        problems.append(f"context = {s.context} must be a power of two from 4096 to {MAX_CONTEXT} (e.g. 524288 or "
                        "1048576)")
    if s.pool and s.pool != s.context:
        problems.append(f"pool = {s.pool} must equal context ({s.context}) or be 0: rank 1's pool is rank 0's context")
    _check_range(problems, s, "parallel", 1, 4, "the engine serves at most 4 streams at once")
    _check_range(problems, s, "max_tokens", 1, s.context, "lower max_tokens or raise context")
    if s.reasoning_effort not in REASONING_EFFORTS:
        problems.append(f"reasoning_effort = {s.reasoning_effort!r} must be one of low, medium, high, xhigh (or empty)")
    problems.extend(sampling_problems(s))
    _check_range(problems, s, "port", 1, 65535)
    _check_range(problems, s, "master_port", 1024, 65535)
    if s.port == s.master_port:
        problems.append(f"master_port = {s.master_port} must differ from port: the rendezvous and the API need two "
                        "ports")
    if not s.served_name.strip():
        problems.append("served_name is empty: set the model id the API serves")
    if not 0 < s.memguard_gib < s.min_avail_gib:
        problems.append(f"memguard_gib = {s.memguard_gib} must be above 0 and below min_avail_gib ({s.min_avail_gib})")
    if s.spill_gib < 0 or s.kv_shard < 0:
        problems.append("spill_gib and kv_shard must be 0 (off) or positive")
    try:
        ipaddress.ip_address(s.host)
    except ValueError:
        if not fits(re.compile(r"[A-Za-z0-9.-]+"), s.host):
            problems.append(f"host = {shown(s.host)} is not an address to bind: use 0.0.0.0, 127.0.0.1 or this Spark's "
                            "address")
    for i, arg in enumerate(s.extra_serve_args):
        if not isinstance(arg, str):
            problems.append(f"extra_serve_args: argument {i + 1} is not a string ({type(arg).__name__}): write each "
                            "argument as a string")
    for key in s.engine_env:
        if not key.startswith(PASSTHROUGH_PREFIXES):
            problems.append(f"engine_env: {key} is not an engine variable (TENSORFOLD_*, TF_DS_*, TF_FILL_*, "
                            "TF_SPILL_*)")
    # without a readable timeout huggingface_hub could not be asked for the saved token: that problem is named instead
    if s.ablit and not s.hf_token and not hub_unimportable(s.hf_env):
        problems.append("ablit needs your Hugging Face token: accept the overlay's terms on its model page, create a "
                        "read token, then run with HF_TOKEN=hf_... in the environment or save it on this machine with "
                        "`hf auth login` (or set ablit to false)")
    _check_range(problems, s, "hf_max_workers", 1, 64, "files downloaded at once (huggingface_hub's default is 8)")
    problems.extend(_hub_env_problems(s.hf_env))
    if s.api_key_file and not s.api_key:
        problems.append(f"api_key_file = {shown(s.api_key_file)} is set but api_key is false: set api_key = true to "
                        "require that key, or set api_key_file to \"\"")
    if s.api_key_file and s.rotate_api_key:
        problems.append("rotate_api_key makes a new random key, but api_key_file names your own: put the new key in "
                        "that file instead (the next run sends it to the head), or leave rotate_api_key out")
    if s.worker_weights not in ("nfs", "copy"):
        problems.append(f"worker_weights = {s.worker_weights!r} must be 'nfs' or 'copy'")
    elif s.worker_weights == "nfs" and not s.nfs:
        problems.append("worker_weights = 'nfs' needs nfs = true: set nfs true, or worker_weights 'copy' for a local "
                        "copy")
    if s.prebuilt_image and not PREBUILT_REFERENCE.fullmatch(s.prebuilt_image):
        problems.append(f"prebuilt_image = {shown(s.prebuilt_image)} must be a reference pinned by digest: "
                        "name@sha256:<64 hex>")
    for name, lengths in (("tf_ref", (7, 40)), ("tools_ref", (7, 40)), ("zig_sha256", (64, 64))):
        value = getattr(s, name)
        if not (fits(_HEX, value) and lengths[0] <= len(value) <= lengths[1]):
            problems.append(f"{name} = {shown(value)} must be {lengths[0]}-{lengths[1]} lower-case hex characters")
    problems.extend(shape_problems({f.name: getattr(s, f.name) for f in fields(s)}))
    # files sparkfold owns live directly in the folder their tool reads, never elsewhere on the Spark
    for name, (folder, suffix) in OWNED_FILES.items():
        path = getattr(s, name)
        if posixpath.dirname(path) != folder or not path.endswith(suffix) or path == folder + "/" + suffix:
            problems.append(f"{name} = {path!r} must be a {suffix} file in {folder}/ (directly, e.g. "
                            f"{folder}/60-sparkfold{suffix})")
    problems.extend(_serve_arg_problems(s.extra_serve_args))
    problems.extend(_outside_hub(s))
    if "TENSORFOLD_API_KEY" in s.engine_env:
        problems.append("engine_env: TENSORFOLD_API_KEY is not allowed: set api_key = true instead (the key stays in a "
                        "0600 file; an environment value shows in docker inspect)")
    for ulimit in s.docker_ulimits:
        if not fits(_ULIMIT, ulimit):
            problems.append(f"docker_ulimits: {shown(ulimit)} must look like memlock=-1:-1")
    _check_range(problems, s, "link_mtu", 1280, 9216)
    if s.link_rollback_s < MIN_ROLLBACK_S:
        problems.append(f"link_rollback_s = {s.link_rollback_s} is below {MIN_ROLLBACK_S}: the confirmation of a "
                        f"netplan apply waits up to {CONFIRM_WAIT_APPLY_S} s for the apply, and the Spark's revert "
                        f"must not fire while it waits; set link_rollback_s to {MIN_ROLLBACK_S} or more")
    elif s.link_rollback_s > MAX_ROLLBACK_S:
        problems.append(f"link_rollback_s = {s.link_rollback_s} is above {MAX_ROLLBACK_S}: an apply that cut the Spark "
                        f"off would stay that long; set it from {MIN_ROLLBACK_S} to {MAX_ROLLBACK_S}")
    _check_range(problems, s, "link_prefix_min", LINK_PREFIX_WIDEST, LINK_PREFIX_NARROWEST,
                 f"{LINK_PREFIX_USUAL} unless the link needs a wider subnet (a wider prefix is routed over the cable)")
    if s.link_measure not in LINK_MEASURE_MODES:
        problems.append(f"link_measure = {s.link_measure!r} must be one of {', '.join(LINK_MEASURE_MODES)}: \"stop\" "
                        "(a slow link stops the deploy before the ranks), \"warn\" (it warns and goes on) or \"off\"")
    _check_range(problems, s, "link_min_gbps", 0.001, 120.0, "a rail (one PCIe twin) carries ~100 Gb/s at most; "
                 "docs/link.md gives the figures")
    _check_range(problems, s, "gpu_clock_mhz", 300, 4000)
    _check_range(problems, s, "nccl_rails", 1, 2, "1 uses the first twin only, 2 both")
    _check_range(problems, s, "nccl_channels", 1, 64)
    _check_range(problems, s, "wait_timeout", 10, 86400)
    _check_range(problems, s, "stop_timeout", 1, 3600)
    _check_range(problems, s, "log_keep", 1, 1000)
    _check_range(problems, s, "keep_generations", 1, 100, "1 keeps only the pair that serves: nothing to roll back to")
    if s.upgrade_gate not in UPGRADE_GATES:
        problems.append(f"upgrade_gate = {s.upgrade_gate!r} must be one of {', '.join(UPGRADE_GATES)}: \"smoke\" "
                        "(the smoke test through both ranks) or \"exact\" (also the same replies as the old pair at "
                        "temperature 0)")
    _check_range(problems, s, "log_lines", 1, 100000)
    _check_range(problems, s, "status_watch", 0, 3600, "0 prints the table once")
    _check_range(problems, s, "supervise_retries", 1, 100)
    _check_range(problems, s, "supervise_backoff_s", 1, 3600)
    if not fits(_API_URL, s.api_base_url):
        problems.append(f"api_url = {shown(s.api_url)} must be like http://spark-a.local:8888 (how this machine "
                        "reaches rank 0)")
    problems.extend(_host_problems(s))
    problems.extend(_validate_rails(s))
    return problems


def _hub_env_problems(env: dict[str, str]) -> list[str]:
    """The huggingface_hub variables passed to the head (sources.HUB_ENV): a timeout that is no whole number stops
    huggingface_hub as it is imported, 0 and a word it does not know as a switch it silently replaces with its
    default; each is refused here. A value is never shown (a proxy URL may hold a password)."""
    problems = []
    for name, value in sorted(env.items()):
        if not safe_text(value):
            problems.append(f"{name} (value not shown) must be one line of printable text: set it again")
        elif name in HUB_TIMEOUTS and hub_timeout_unreadable(value):
            problems.append(f"{name} = {value!r} must be a whole number of seconds from 1 to 86400: huggingface_hub "
                            "cannot even start with it (on this machine, which then cannot read your saved token, "
                            "nor on the head)")
        elif name in HUB_TIMEOUTS and not (value.strip().isdigit() and 0 < int(value) <= 86400):
            problems.append(f"{name} = {value!r} must be a whole number of seconds from 1 to 86400 (huggingface_hub "
                            "silently replaces a timeout of 0 with its default)")
        elif name in HUB_SWITCHES and value.strip().lower() not in SWITCH_WORDS:
            problems.append(f"{name} = {value!r} must be 1 or 0 (true/false, yes/no, on/off)")
    return problems


def _serve_arg_problems(args: list) -> list[str]:
    """A flag sparkfold sets itself is refused with the setting that sets it; the API key travels by file, never on
    a command line. Only the flag is named: the value may be a secret."""
    problems = []
    for arg in args:
        flag = arg.split("=", 1)[0] if isinstance(arg, str) else ""
        if flag in ("--api-key", "--api-key-file"):
            problems.append(f"extra_serve_args: {flag} is not allowed: set api_key = true (sparkfold keeps the key in "
                            "a 0600 file on the head and gives rank 0 --api-key-file)")
        elif flag in OWN_SERVE_FLAGS:
            problems.append(f"extra_serve_args: {flag} is not allowed: sparkfold sets it from the "
                            f"{OWN_SERVE_FLAGS[flag]} setting; set that instead")
    return problems


def _normal(path: str) -> str:
    """An absolute path spelled one way: no doubled or trailing slash, no . or .. (normpath alone keeps a leading
    //, which the Spark reads as /)."""
    return "/" + posixpath.normpath(path).strip("/") if path.startswith("/") else posixpath.normpath(path)


def _inside(path: str, folder: str) -> bool:
    """`path` is `folder` or below it, however either is spelled (//x, /x/ and /x are one folder)."""
    path, folder = _normal(path), _normal(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _outside_hub(s: Settings) -> list[str]:
    """The head exports hf_cache/hub to the worker over NFS: the hf token and the API key must stay out of it."""
    paths = placed_paths(s)
    return _hub_problems(paths, paths, resolved=False)


def placed_paths(s: Settings) -> dict[str, str]:
    """name -> path of what the placement rules judge, as the settings spell it: the root folders, `hub` (hf_cache's
    hub folder, which the head exports), each owned file and `<name> folder`, the folder it sits in. The preflight
    asks each Spark where they lead (resolved_path_problems)."""
    paths = {name: getattr(s, name) for name in ROOT_FOLDERS}
    paths["hub"] = s.layout.hub
    for name in OWNED_FILES:
        paths[name] = getattr(s, name)
        paths[f"{name} folder"] = posixpath.dirname(getattr(s, name))
    return paths


def _hub_problems(given: Mapping[str, str], real: Mapping[str, str], resolved: bool = True) -> list[str]:
    """state_dir and data_dir outside the exported hub. given: the paths as the settings spell them (placed_paths);
    real: where they lead on a Spark (resolved), or given itself for the check of the text."""
    hub = _normal(real.get("hub") or given["hub"])
    problems = []
    for name in ("state_dir", "data_dir"):
        if not real.get(name) or not _inside(real[name], hub):
            continue
        if not resolved:
            problems.append(f"{name} = {shown(given[name])} is inside hf_cache's hub folder ({hub}), which the head "
                            f"exports over NFS (its hf token and API key folder would be exported): move {name} "
                            f"outside {hub}, or hf_cache elsewhere")
        else:
            problems.append(f"{name} = {shown(given[name])} resolves to {_normal(real[name])} on this Spark (symlinks "
                            f"followed), inside hf_cache's hub folder {hub}, which the head exports over NFS (its hf "
                            f"token and API key folder would be exported): point {name} at a folder outside {hub}, or "
                            f"hf_cache elsewhere (`realpath -m {given[name]} {given['hub']}` on the Spark shows where "
                            "each leads)")
    return problems


def resolved_path_problems(given: Mapping[str, str], real: Mapping[str, str]) -> list[str]:
    """The placement rules on the paths as a Spark resolves them (`realpath -m`, a fact of the preflight): a symlink
    can lead a folder where the check of the text (validate) cannot see. given: placed_paths; real: the same names ->
    where each leads (a name missing when it could not be resolved: not judged)."""
    problems = _hub_problems(given, real)
    for name in ROOT_FOLDERS:
        if real.get(name) and _normal(real[name]) == "/":
            problems.append(f"{name} = {shown(given[name])} resolves to / on this Spark (symlinks followed): sparkfold "
                            f"writes below {name}, so it must be a folder of its own; point {name} at one "
                            f"(`realpath -m {given[name]}` on the Spark shows where it leads)")
    for name, (folder, _suffix) in OWNED_FILES.items():
        file, its_folder = real.get(name), real.get(f"{name} folder")
        if not (file and its_folder):
            continue
        if _normal(file) != posixpath.join(_normal(its_folder), posixpath.basename(given[name])):
            problems.append(f"{name} = {shown(given[name])} leads to {_normal(file)} on this Spark (a symlink): "
                            f"sparkfold owns that file and writes it in {folder}/ itself, never through a symlink "
                            f"to elsewhere; remove the symlink, or set {name} to a free name in {folder}/")
    return problems


def _host_problems(s: Settings) -> list[str]:
    """The per-host fields from the site file's `data:` or --data: the site file's own patterns."""
    who = f"{s.role or 'this Spark'} ({shown(s.ssh_hostname)})"
    problems = []
    if s.ssh_hostname and not fits(HOST_NAME, s.ssh_hostname):
        problems.append(f"{who}: ssh_hostname must be a host name or address (letters, digits, . - : only)")
    if s.reach_from_head and not fits(HOST_NAME, s.reach_from_head):
        problems.append(f"{who}: reach_from_head = {shown(s.reach_from_head)} must be a host name or address (letters, "
                        "digits, . - : only)")
    if not fits(LOGIN, s.ssh_user):
        problems.append(f"{who}: ssh_user = {shown(s.ssh_user)} must be a login name (lower-case letters, digits, _ -)")
    if not 1 <= s.ssh_port <= 65535:
        problems.append(f"{who}: ssh_port = {s.ssh_port} must be a port number (1-65535)")
    return problems


def _prefix_min(s: Settings) -> int:
    """link_prefix_min within its range (a value outside it is reported on its own)."""
    return min(max(LINK_PREFIX_WIDEST, s.link_prefix_min), LINK_PREFIX_NARROWEST)


def _validate_rails(s: Settings) -> list[str]:
    problems: list[str] = []
    who = s.role or "this Spark"
    peer_rails = s.peer.link_rails if s.peer else ()
    if not s.link_rails:
        return [f"{who} has no link addresses: list its CX7 netdevs and addresses under `link:` in the site file"]
    if len(s.link_rails) > 2:
        problems.append(f"{who}: at most two link rails (the two PCIe twins of the cabled port), not "
                        f"{len(s.link_rails)}")
    if len(s.link_rails) < s.nccl_rails:
        problems.append(f"nccl_rails = {s.nccl_rails} but {who} lists {len(s.link_rails)} link rail(s): add the twin "
                        "or set nccl_rails 1")
    if peer_rails and len(peer_rails) != len(s.link_rails):
        problems.append("the head and the worker list a different number of link rails: address the same twins on both")
    netdevs = [r.get("netdev", "") for r in s.link_rails]
    if len(set(netdevs)) != len(netdevs):
        problems.append(f"{who}: a link netdev is listed twice ({', '.join(netdevs)})")
    for index, rail in enumerate(s.link_rails):
        example = example_rail(s.role, index)  # an address fit for this Spark's rail
        if not fits(NETDEV, rail.get("netdev")):
            problems.append(f"{who} link rail {index}: netdev {shown(rail.get('netdev'))} is not an interface name "
                            "(letters, digits, _ . -, at most 15, not starting with - or .; `ip -br link` lists them)")
        if rail.get("ibdev") is not None and not fits(IBDEV, rail.get("ibdev")):
            problems.append(f"{who} link rail {index}: ibdev {shown(rail.get('ibdev'))} is not a RoCE device name "
                            "(`ibdev2netdev` lists them)")
        if not fits(IPV4_PREFIX, rail.get("address")):
            problems.append(f"{who} link rail {index}: address {shown(rail.get('address'))} must be IPv4 with a "
                            f"prefix, e.g. {example}")
            continue
        try:
            mine = ipaddress.ip_interface(str(rail.get("address", "")))
        except ValueError:
            problems.append(f"{who} link rail {index}: address {rail.get('address')!r} must be IPv4 with a prefix, "
                            f"e.g. {example}")
            continue
        if mine.version != 4 or not mine.ip.is_private or mine.ip.is_loopback or mine.ip.is_link_local:
            problems.append(f"{who} link rail {index}: {mine} must be a private IPv4 address (e.g. {example}), "
                            "not loopback or link-local")
        elif wide := rail_prefix_problem(str(rail.get("address")), _prefix_min(s), example):
            problems.append(f"{who} link rail {index}: {mine}: {wide}")
        elif mine.network.prefixlen < 31 and mine.ip in (mine.network.network_address,
                                                         mine.network.broadcast_address):
            # only a /31's two addresses are both hosts (RFC 3021); in a wider subnet these two are not
            end = "first" if mine.ip == mine.network.network_address else "last"
            problems.append(f"{who} link rail {index}: {mine} is the {end} address of {mine.network}, which is no "
                            "host's (the subnet's own or its broadcast): "
                            f"use one between them, e.g. {example}")
        elif not mine.network.is_private:
            problems.append(f"{who} link rail {index}: {mine}: its subnet {mine.network} reaches beyond the private "
                            "ranges (it would route public addresses over the cable): use a narrower prefix, e.g. /24")
        if index < len(peer_rails):
            try:
                peer = ipaddress.ip_interface(str(peer_rails[index].get("address", "")))
            except ValueError:
                continue
            if peer.ip == mine.ip:
                problems.append(f"link rail {index}: the head and the worker both use {mine.ip}: give each Spark its "
                                "own address")
            elif peer.network != mine.network:
                problems.append(f"link rail {index}: {mine} and the peer's {peer} are not in one subnet: use the same "
                                "subnet on both ends of a rail")
    return problems


def rail_warnings(rails) -> list[str]:
    """The rails (already valid: link_prefix_min allowed them) whose prefix is wider than /LINK_PREFIX_USUAL: the link
    step warns about each while planning."""
    notes = []
    for rail in rails:
        prefix = int(str(rail["address"]).rpartition("/")[2])
        if prefix < LINK_PREFIX_USUAL:
            notes.append(f"link rail {rail['netdev']} has {rail['address']}: its /{prefix} subnet "
                         f"({2 ** (32 - prefix)} addresses) is routed over the cable, allowed by link_prefix_min; "
                         f"/{LINK_PREFIX_USUAL} to /{LINK_PREFIX_NARROWEST} (e.g. /24) keeps other networks off the "
                         "link")
    return notes


def validate_pair(head: Settings, worker: Settings) -> list[str]:
    """Problems that only show when the two Sparks' settings are compared."""
    problems: list[str] = []
    for name in PAIR_SETTINGS:
        head_value, worker_value = getattr(head, name), getattr(worker, name)
        if head_value != worker_value:
            # an engine variable's value may be a secret: name the setting only
            shown_head, shown_worker = (("(not shown)",) * 2 if name == "engine_env"
                                        else (shown(head_value), shown(worker_value)))
            problems.append(f"{name} differs between the head ({shown_head}) and the worker ({shown_worker}): the "
                            "ranks are one server, set it for both (group_data/all.py) instead of per host")
    return problems


def merge_problems(head: list[str], worker: list[str]) -> list[str]:
    """One list: a problem both Sparks have (a value from the environment or all.py) once, the others prefixed."""
    return ([m if m in worker else f"head: {m}" for m in head] + [f"worker: {m}" for m in worker if m not in head])


def validate_all(head: Settings, worker: Settings, head_target: str, worker_target: str,
                 loaded: tuple[list[str], list[str]] = ([], [])) -> list[str]:
    """All problems of a pair: `loaded` (what reading each Spark's settings met), then the rules."""
    problems = merge_problems(loaded[0] + validate(head), loaded[1] + validate(worker))
    problems += validate_pair(head, worker)
    if head_target == worker_target:
        problems.append(f"the head and the worker are the same machine ({head_target}): the site file must name "
                        "two Sparks")
    return problems
