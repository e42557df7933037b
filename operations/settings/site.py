"""The site file (sparks.yaml): which two Sparks, how to reach them, their CX7 netdevs and addresses."""

from __future__ import annotations

import os
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
    fits,
    rail_prefix_problem,
    shown,
)

EXAMPLE = "sparks.example.yaml"
ROLES = ("head", "worker")
_HOST_KEYS = {"ssh", "ssh_user", "ssh_key", "ssh_port", "link", "data", "reach_from_head", "name"}


class SiteError(Exception):
    """The site file is missing or malformed; the message says what to write."""


def site_path(project_root: Path, environ=os.environ) -> Path:
    return Path(environ.get("SPARKFOLD_SITE") or project_root / "sparks.yaml")


def _need(cond: bool, path: Path, message: str) -> None:
    if not cond:
        raise SiteError(f"{path}: {message} (see {EXAMPLE} for the shape)")


def read_site(path: Path) -> dict[str, Any]:
    """Parse and check the site file; returns {"head": {...}, "worker": {...}, "data": {...}}."""
    if not path.exists():
        raise SiteError(
            f"no site file at {path}: copy {EXAMPLE} to sparks.yaml and fill in your Sparks' ssh targets and CX7 "
            "netdevs/addresses (or set SPARKFOLD_SITE to your file)")
    try:
        site: Any = yaml.safe_load(path.read_text()) or {}  # arbitrary YAML until checked below
    except yaml.YAMLError as exc:
        raise SiteError(f"{path} is not valid YAML ({exc}); see {EXAMPLE} for the shape") from None
    _need(isinstance(site, dict), path, "the top level must be a mapping with keys head, worker and data")
    unknown = set(site) - {"head", "worker", "data"}
    _need(not unknown, path, f"unknown top-level key(s) {sorted(unknown)}; expected head, worker, data")
    for role in ROLES:
        spark = site.get(role)
        _need(isinstance(spark, dict), path, f"`{role}:` is missing; it needs at least `ssh:` and `link:`")
        bad = set(spark) - _HOST_KEYS
        _need(not bad, path, f"{role}: unknown key(s) {sorted(bad)}; allowed: {sorted(_HOST_KEYS)}")
        _need(isinstance(spark.get("ssh"), str) and spark["ssh"].strip() != "", path,
              f"{role}.ssh must name the Spark (host name or address this machine reaches it by)")
        link = spark.get("link")
        _need(isinstance(link, list) and len(link) > 0, path,
              f"{role}.link must list the CX7 netdevs, e.g. - {{netdev: enp1s0f0np0, address: 192.168.100.1/24}}")
        for index, rail in enumerate(link):
            _need(isinstance(rail, dict) and {"netdev", "address"} <= set(rail), path,
                  f"{role}.link[{index}] needs netdev and address")
        if "ssh_port" in spark:
            _need(isinstance(spark["ssh_port"], int) and not isinstance(spark["ssh_port"], bool)
                  and 1 <= spark["ssh_port"] <= 65535, path, f"{role}.ssh_port must be a port number (1-65535)")
        for key in ("ssh", "reach_from_head", "name"):
            if spark.get(key) is not None:
                _need(fits(HOST_NAME, spark[key]), path,
                      f"{role}.{key} = {shown(spark[key])} must be a host name or address (letters, digits, . - : "
                      "only)")
        if spark.get("ssh_user") is not None:
            _need(fits(LOGIN, spark["ssh_user"]), path,
                  f"{role}.ssh_user = {shown(spark['ssh_user'])} must be a login name (lower-case letters, "
                  "digits, _ -)")
        if spark.get("ssh_key") is not None:
            key_path = spark["ssh_key"]
            _need(isinstance(key_path, str) and key_path.isprintable() and key_path.strip() == key_path != "", path,
                  f"{role}.ssh_key must be the path of a private key file, e.g. ~/.ssh/id_ed25519")
        for index, rail in enumerate(link):
            _need(fits(NETDEV, rail["netdev"]), path,
                  f"{role}.link[{index}].netdev = {shown(rail['netdev'])} must be an interface name (letters, digits, "
                  "_ . -, at most 15, not starting with - or .; `ip -br link` lists them)")
            _need(fits(IPV4_PREFIX, rail["address"]), path,
                  f"{role}.link[{index}].address = {shown(rail['address'])} must be IPv4 with a prefix, e.g. "
                  "192.168.100.1/24")
            # the settings check the prefix against link_prefix_min, which may come from anywhere: here only what
            # no link_prefix_min allows
            wide = rail_prefix_problem(rail["address"], LINK_PREFIX_WIDEST)
            _need(wide is None, path, f"{role}.link[{index}].address = {shown(rail['address'])}: {wide}")
            if rail.get("ibdev") is not None:
                _need(fits(IBDEV, rail["ibdev"]), path,
                      f"{role}.link[{index}].ibdev = {shown(rail['ibdev'])} must be a RoCE device name "
                      "(`ibdev2netdev`)")
        _need(isinstance(spark.get("data", {}) or {}, dict), path, f"{role}.data must be a mapping of settings")
    _need(isinstance(site.get("data", {}) or {}, dict), path, "data must be a mapping of settings")
    return site


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
