"""Settings for the hosts of this run: loaded once per host, the pair validated together."""

from __future__ import annotations

import os

from pyinfra import host as current_host
from pyinfra import inventory
from pyinfra.facts.server import Home

from .settings import Settings, load, validate_all

_cache: dict[str, Settings] = {}


def settings_for(h) -> Settings:
    """The Settings of one pyinfra host (its home directory is read once, as a fact)."""
    if h.name not in _cache:
        home = h.get_fact(Home) or f"/home/{h.data.get('ssh_user') or 'root'}"
        _cache[h.name] = load(h.data.dict(), os.environ, home)
    return _cache[h.name]


def pair_hosts():
    """(head host, worker host) of the inventory."""
    return inventory.get_group("head")[0], inventory.get_group("worker")[0]


def current_settings() -> tuple[Settings, list[str]]:
    """This host's Settings and every problem of the pair's settings."""
    head, worker = pair_hosts()
    hs, ws = settings_for(head), settings_for(worker)
    problems = validate_all(hs, ws, _target(head), _target(worker))
    mine, peer = (hs, ws) if current_host.name == head.name else (ws, hs)
    # each Spark's own paths may differ (another user or home): give each side the other's too
    return mine.replace(peer_hf_cache=peer.hf_cache, peer_data_dir=peer.data_dir, peer_state_dir=peer.state_dir,
                        head_hf_cache=hs.hf_cache), problems


def _target(h) -> str:
    return f"{h.data.get('ssh_hostname', h.name)}:{h.data.get('ssh_port', 22)}"
