"""The site file (sparks.yaml): which two Sparks, how to reach them, their CX7 netdevs and addresses."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import yaml

# the shapes of the fields that reach ssh, netplan and sysfs paths: the settings check per-host data with them too
from operations.settings.shapes import (
    HOST_NAME,
    IBDEV,
    IPV4_PREFIX,
    LINK_PREFIX_WIDEST,
    LOGIN,
    NETDEV,
    example_rail,
    fits,
    rail_prefix_problem,
    shown,
)
from operations.settings.sources import suggestion

EXAMPLE = "sparks.example.yaml"
ROLES = ("head", "worker")
_HOST_KEYS = {"ssh", "ssh_user", "ssh_key", "ssh_port", "link", "data", "reach_from_head", "name"}


class SiteError(Exception):
    """The site file is missing, unreadable or malformed; the message names the file and says what to write."""


def site_path(project_root: Path, environ=os.environ) -> Path:
    return Path(environ.get("SPARKFOLD_SITE") or project_root / "sparks.yaml")


def _missing(path: Path, named_by: str | None) -> str:
    if named_by:
        return (f"no site file at {path} ({named_by} names it): copy {EXAMPLE} there and fill in your Sparks' ssh "
                f"targets and CX7 netdevs/addresses, or point {named_by} at your site file (unset, sparks.yaml is "
                "read)")
    return (f"no site file at {path}: copy {EXAMPLE} to sparks.yaml and fill in your Sparks' ssh targets and CX7 "
            "netdevs/addresses (or set SPARKFOLD_SITE to your file)")


def _yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """Where the YAML breaks, as an editor counts (line and column from 1), and what usually fixes it."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{path} line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
    problem = getattr(exc, "problem", None) or str(exc)
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    started = (f" ({context} that starts at line {context_mark.line + 1}, column {context_mark.column + 1})"
               if context and context_mark else "")
    return (f"{where}: not valid YAML: {problem}{started}. Fix the file there: indent with spaces (no tabs), close "
            f"every {{ and [, quote a value holding ': ' or ' #'; {EXAMPLE} shows the shape")


def read_site(path: Path, named_by: str | None = None) -> dict[str, Any]:
    """Parse and check the site file; returns {"head": {...}, "worker": {...}, "data": {...}}. Raises SiteError
    naming every problem of the file at once. named_by: the variable that named the file (SPARKFOLD_SITE), None
    for the default sparks.yaml."""
    site, problems = parse_site(path, named_by)
    if problems:
        raise SiteError(site_heading(path) + ":\n  - " + "\n  - ".join(problems))
    return site


def site_heading(path: Path) -> str:
    return f"the site file {path} needs fixing ({EXAMPLE} shows the shape)"


def parse_site(path: Path, named_by: str | None = None) -> tuple[Any, list[str]]:
    """The parsed site file and every problem of its content (site_problems). Raises SiteError only when there is
    nothing to read: no file, not readable, not YAML."""
    if not path.exists():
        raise SiteError(_missing(path, named_by))
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SiteError(f"cannot read the site file {path}: {getattr(exc, 'strerror', None) or exc}: it must be a "
                        f"readable text file (copy {EXAMPLE})") from None
    try:
        site: Any = yaml.safe_load(text) or {}  # arbitrary YAML until checked below
    except yaml.YAMLError as exc:
        raise SiteError(_yaml_error(path, exc)) from None
    return site, site_problems(site)


def settings_only(site: Any) -> dict[str, Any]:
    """A site file with problems as the settings can still be read from it: the `data:` mappings kept, each Spark's
    ssh and link replaced by the example's, so the settings' rules judge the settings alone (the site file's own
    problems name what is wrong with those)."""
    site = site if isinstance(site, dict) else {}
    kept: dict[str, Any] = {"data": site["data"] if isinstance(site.get("data"), dict) else {}}
    for role in ROLES:
        spark = site.get(role) if isinstance(site.get(role), dict) else {}
        rails = [{"netdev": f"example{rail}", "address": example_rail(role, rail)} for rail in range(2)]
        kept[role] = {"ssh": f"{role}.invalid", "link": rails,
                      "data": spark["data"] if isinstance(spark.get("data"), dict) else {}}
    return kept


def _unknown(keys: set, known: set[str]) -> str:
    """The unknown keys, each with the closest known key when there is one."""
    close = [f"{key}{hint}" for key in sorted(map(str, keys)) if (hint := suggestion(key, known))]
    return f"{sorted(map(str, keys))}" + (f" ({'; '.join(close)})" if close else "")


def site_problems(site: Any) -> list[str]:
    """Every problem of a parsed site file, each naming the key and what to write."""
    if not isinstance(site, dict):
        return ["the top level must be a mapping with keys head, worker and data"]
    problems = []
    unknown = set(site) - {"head", "worker", "data"}
    if unknown:
        problems.append(f"unknown top-level key(s) {_unknown(unknown, {'head', 'worker', 'data'})}; expected head, "
                        "worker, data")
    for role in ROLES:
        spark = site.get(role)
        if isinstance(spark, dict):
            problems += _spark_problems(role, spark)
        else:
            problems.append(f"`{role}:` is missing; it needs at least `ssh:` and `link:`")
    if not isinstance(site.get("data", {}) or {}, dict):
        problems.append("data must be a mapping of settings")
    return problems


def _spark_problems(role: str, spark: dict) -> list[str]:
    problems = []
    bad = set(spark) - _HOST_KEYS
    if bad:
        problems.append(f"{role}: unknown key(s) {_unknown(bad, _HOST_KEYS)}; allowed: {sorted(_HOST_KEYS)}")
    if not (isinstance(spark.get("ssh"), str) and spark["ssh"].strip() != ""):
        problems.append(f"{role}.ssh must name the Spark (host name or address this machine reaches it by)")
    for key in ("ssh", "reach_from_head", "name"):
        if spark.get(key) is not None and (key != "ssh" or isinstance(spark[key], str) and spark[key].strip()):
            if not fits(HOST_NAME, spark[key]):
                problems.append(f"{role}.{key} = {shown(spark[key])} must be a host name or address (letters, "
                                "digits, . - : only)")
    if "ssh_port" in spark and not (isinstance(spark["ssh_port"], int) and not isinstance(spark["ssh_port"], bool)
                                    and 1 <= spark["ssh_port"] <= 65535):
        problems.append(f"{role}.ssh_port must be a port number (1-65535)")
    if spark.get("ssh_user") is not None and not fits(LOGIN, spark["ssh_user"]):
        problems.append(f"{role}.ssh_user = {shown(spark['ssh_user'])} must be a login name (lower-case letters, "
                        "digits, _ -)")
    key_path = spark.get("ssh_key")
    if key_path is not None and not (isinstance(key_path, str) and key_path.isprintable()
                                     and key_path.strip() == key_path != ""):
        problems.append(f"{role}.ssh_key must be the path of a private key file, e.g. ~/.ssh/id_ed25519")
    link = spark.get("link")
    if not (isinstance(link, list) and len(link) > 0):
        problems.append(f"{role}.link must list the CX7 netdevs, e.g. - {{netdev: enp1s0f0np0, address: "
                        f"{example_rail(role)}}}")
        link = []
    for index, rail in enumerate(link):
        if isinstance(rail, dict) and {"netdev", "address"} <= set(rail):
            problems += _rail_problems(f"{role}.link[{index}]", rail, example_rail(role, index))
        else:
            problems.append(f"{role}.link[{index}] needs netdev and address")
    if not isinstance(spark.get("data", {}) or {}, dict):
        problems.append(f"{role}.data must be a mapping of settings")
    return problems


def _rail_problems(where: str, rail: dict, example: str) -> list[str]:
    problems = []
    if not fits(NETDEV, rail["netdev"]):
        problems.append(f"{where}.netdev = {shown(rail['netdev'])} must be an interface name (letters, digits, _ . "
                        "-, at most 15, not starting with - or .; `ip -br link` lists them)")
    if not fits(IPV4_PREFIX, rail["address"]):
        problems.append(f"{where}.address = {shown(rail['address'])} must be IPv4 with a prefix, e.g. {example}")
    # the settings check the prefix against link_prefix_min, which may come from anywhere: here only what no
    # link_prefix_min allows
    elif wide := rail_prefix_problem(rail["address"], LINK_PREFIX_WIDEST, example):
        problems.append(f"{where}.address = {shown(rail['address'])}: {wide}")
    if rail.get("ibdev") is not None and not fits(IBDEV, rail["ibdev"]):
        problems.append(f"{where}.ibdev = {shown(rail['ibdev'])} must be a RoCE device name (`ibdev2netdev`)")
    return problems


def ssh_target(data: Any, name: str) -> str:
    """host:port a Spark is reached at from this machine. data: its host data (a mapping, or pyinfra's host.data);
    name: pyinfra's name for it."""
    return f"{data.get('ssh_hostname', name)}:{data.get('ssh_port', 22)}"


def ssh_check(data: Any, name: str) -> str:
    """The one command that shows why this machine cannot reach a Spark over ssh (ssh prints its own reason).
    data: its host data; name: pyinfra's name for it."""
    login = f"{data.get('ssh_user')}@" if data.get("ssh_user") else ""
    key = ["-i", str(data.get("ssh_key"))] if data.get("ssh_key") else []
    return shlex.join(["ssh", "-p", str(data.get("ssh_port", 22)), *key, f"{login}{data.get('ssh_hostname', name)}",
                       "true"])


def _rails(spark: dict) -> list[dict]:
    return [{"netdev": str(r["netdev"]), "address": str(r["address"]),
             **({"ibdev": r["ibdev"]} if r.get("ibdev") else {})}
            for r in spark["link"]]


def host_entries(site: dict[str, Any]) -> dict[str, tuple[str, dict]]:
    """role -> (pyinfra host name, host data) for inventory.py. Each Spark's data holds only its own values; the
    settings pair the two (operations/settings/context.py)."""
    names = {role: site[role].get("name") or site[role]["ssh"] for role in ROLES}
    if names["head"] == names["worker"]:
        names = {role: f"{site[role]['ssh']}:{site[role].get('ssh_port', 22)}" for role in ROLES}
    entries = {}
    for role in ROLES:
        spark = site[role]
        data: dict[str, Any] = {**(site.get("data") or {}), **(spark.get("data") or {})}
        data.update(ssh_hostname=spark["ssh"], link_rails=_rails(spark))
        if spark.get("reach_from_head"):
            data["reach_from_head"] = spark["reach_from_head"]
        for key in ("ssh_user", "ssh_key", "ssh_port"):
            if spark.get(key) not in (None, ""):
                data[key] = os.path.expanduser(spark[key]) if key == "ssh_key" else spark[key]
        entries[role] = (names[role], data)
    return entries
