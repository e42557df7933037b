"""Build realistic Settings for unit tests from the example site file and group_data, as pyinfra would."""

from __future__ import annotations

import runpy
from pathlib import Path

from operations.settings import Layers, Settings, load, pair
from operations.settings.site import host_entries, read_site

ROOT = Path(__file__).resolve().parents[2]
PEER = {"head": "worker", "worker": "head"}


def group_file(name: str) -> dict:
    """A group_data file's names, executed as pyinfra executes it."""
    ns = runpy.run_path(str(ROOT / "group_data" / f"{name}.py"))
    return {k: v for k, v in ns.items() if not k.startswith("__")}


def layers(role: str = "head", **overrides) -> Layers:
    site = host_entries(read_site(ROOT / "sparks.example.yaml"))[role][1]
    return Layers(all=group_file("all"), group=group_file(role), site=site, override=overrides)


def load_one(role: str = "head", environ: dict | None = None, home: str = "/home/nvidia",
             **overrides) -> tuple[Settings, list[str]]:
    return load(layers(role, **overrides), environ or {}, home)


def make_pair(environ: dict | None = None, head: dict | None = None, worker: dict | None = None,
              home: str = "/home/nvidia") -> tuple[Settings, Settings]:
    hs, _ = load_one("head", environ, home, **(head or {}))
    ws, _ = load_one("worker", environ, home, **(worker or {}))
    return pair(hs, ws)


def make_settings(role: str = "head", environ: dict | None = None, home: str = "/home/nvidia", **overrides) -> Settings:
    """This role's settings with `overrides` (as --data would give them), paired with a default peer."""
    pair = make_pair(environ, **{role: overrides}, home=home)  # type: ignore[arg-type]
    return pair[0] if role == "head" else pair[1]
