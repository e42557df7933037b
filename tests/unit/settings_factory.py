"""Build realistic Settings for unit tests from the example site file and group_data."""

from __future__ import annotations

import runpy
from pathlib import Path

from operations.settings import Settings, load
from operations.site import host_entries, read_site

ROOT = Path(__file__).resolve().parents[2]


def group_data(role: str) -> dict:
    data = {}
    for name in ("all", role):
        ns = runpy.run_path(str(ROOT / "group_data" / f"{name}.py"))
        data.update({k: v for k, v in ns.items() if not k.startswith("__")})
    return data


def host_data(role: str = "head", **overrides) -> dict:
    entries = host_entries(read_site(ROOT / "sparks.example.yaml"))
    data = group_data(role)
    data.update(entries[role][1])
    data.update(overrides)
    return data


def make_settings(role: str = "head", environ: dict | None = None, home: str = "/home/nvidia", **overrides) -> Settings:
    return load(host_data(role, **overrides), environ or {}, home)


def make_pair(environ: dict | None = None, head: dict | None = None, worker: dict | None = None):
    return (make_settings("head", environ, **(head or {})), make_settings("worker", environ, **(worker or {})))
