"""This Spark's rank as the settings and the Sparks' current state make it.

The model-data steps point stable links (<repo>/sparkfold-current, <data_dir>/ablit/current,
<data_dir>/rank-cache/active-rank<R>) at the current data, and the link step records the rails. `Launch` reads
those as facts when it is asked (again only after an operation of the run changed something: run_memo), so inside
an operation at execute time it sees what the earlier operations of the same run made. The containers get the
links' targets, so a new snapshot, pack or weight file changes the rank's spec and so recreates the pair.
"""

from __future__ import annotations

import hashlib
import posixpath
from typing import Any

from pyinfra import host

from .context import peer_host
from .facts.files import LinkTarget
from .facts.network import InfinibandDevices, LinkRecord
from .flags_check import check_ported_settings, check_serve_argv
from .image import image_ref, read_capabilities
from .launch_spec import ContainerSpec, rail_problems, rank0_argv, rank_spec
from .layout import InContainer
from .model_data import served_model_path
from .settings import Settings
from .util.run_memo import fact_until_change

CHAT_TEMPLATE = "model/chat_template.jinja"  # in this checkout; rank 0 serves it


def _real(h: Any, path: str) -> str | None:
    return fact_until_change(h, LinkTarget, path=path, resolve=True)


def template_digest(s: Settings) -> str:
    template = s.project_root / CHAT_TEMPLATE
    return hashlib.sha256(template.read_bytes()).hexdigest() if template.exists() else ""


class Launch:
    """What this Spark's rank needs and would be; every method reads the current facts."""

    def __init__(self, s: Settings):
        self.s = s
        self.image = image_ref(s)

    def rails(self) -> list[dict] | None:
        record = fact_until_change(host, LinkRecord, path=self.s.layout.link_record) or {}
        return record.get("rails")

    def model_mount(self) -> tuple[str, str] | None:
        """(host folder or NFS volume mounted at InContainer.HF, real snapshot path inside the container)."""
        s = self.s
        source, container_path = served_model_path(s)
        if s.ablit and s.is_head:
            # the applied pack holds real files (hard links): its folder is mounted in the cache's place
            folder = _real(host, s.layout.ablit_current)
            return (source, f"{InContainer.HF}/{posixpath.relpath(folder, source)}") if folder else None
        relative = posixpath.relpath(container_path, InContainer.HF)
        if not s.is_head and s.worker_weights == "nfs":
            cache, where = s.head.hf_cache, peer_host(s)  # the worker sees the head's cache through the volume
        else:
            cache, where = s.hf_cache, host
        real = _real(where, f"{cache}/{relative}")
        return (source, f"{InContainer.HF}/{posixpath.relpath(real, cache)}") if real else None

    def rank_folder(self) -> str | None:
        """This rank's real weight folder (the active-rank link's target)."""
        return _real(host, self.s.layout.active_rank_link())

    def capabilities(self) -> dict | None:
        return read_capabilities(self.image, self.s.layout.capabilities_cache) if self.s.is_head else None

    def _inputs(self) -> tuple[list[str], dict[str, Any]]:
        found = {"rails": self.rails(), "model": self.model_mount(), "folder": self.rank_folder(),
                 "caps": self.capabilities() if self.s.is_head else True,
                 "infiniband": bool(fact_until_change(host, InfinibandDevices)),
                 "kit": _real(host, self.s.layout.kit) or ""}
        names = {"rails": "the link record (rails)", "model": "the model snapshot", "folder": "this rank's weight "
                 "folder", "caps": "the image's capabilities"}
        return [names[k] for k, v in found.items() if k in names and not v], found

    def spec(self) -> ContainerSpec | None:
        """The rank's container, or None while an input is missing."""
        gaps, found = self._inputs()
        if gaps or rail_problems(found["rails"], self.s.nccl_rails):
            return None
        caps = found["caps"] if self.s.is_head else None
        return rank_spec(self.s, self.image, found["rails"], found["model"], caps, rank_folder=found["folder"],
                         has_infiniband=found["infiniband"],
                         template_digest=template_digest(self.s) if self.s.is_head else "",
                         kit_folder=found["kit"])

    def problems(self) -> list[str]:
        """Why the rank cannot be launched (missing inputs, the rails, rank 0's flags against the image)."""
        gaps, found = self._inputs()
        if gaps:
            return [f"rank {self.s.rank} cannot be launched yet: {', '.join(gaps)} missing; run the whole deploy.py"]
        problems = rail_problems(found["rails"], self.s.nccl_rails)
        if self.s.is_head:
            problems += check_serve_argv(rank0_argv(self.s, found["model"][1], found["caps"]), found["caps"])
            problems += check_ported_settings(self.s, found["caps"])
        return problems
