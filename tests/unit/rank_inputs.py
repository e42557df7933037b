"""Rank inputs for tests: what RankInputs would read on a Spark whose steps have all run (and helpers to spoil it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import with_args

from operations.docker.daemon import NVIDIA_RUNTIME, merged_daemon_config
from operations.facts.docker import DaemonJson, DockerRuntimeInfo
from operations.facts.rank import RankInputs
from operations.layout import DOCKER_DAEMON_JSON
from operations.rank.spec import LABEL_HASH

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "sparkfold/dsv41-tf:abc"
TEMPLATE = "digest-of-the-template"
RAILS = [{"netdev": "enp1s0f0np0", "ibdev": "rocep1s0f0", "address": "192.168.100.1/24", "gid_index": 3, "mtu": 9000},
         {"netdev": "enP2p1s0f0np0", "ibdev": "roceP2p1s0f0", "address": "192.168.101.1/24", "gid_index": 3,
          "mtu": 9000}]
# the stand-in engine's document: the flags and variables the simulated image serves
CAPS = json.loads(subprocess.run([sys.executable, str(ROOT / "tests/sim/engine/bin/tensorfold-native"), "capabilities",
                                  "--json"], capture_output=True, text=True, check=True).stdout)
GIB = 1024**3


def container(spec_hash: str | None = None, running: bool = True, managed: bool = True, status: str | None = None,
              exit_code: int = 0, oom: bool = False, ports: tuple[int, ...] = (8888, 29500)) -> dict:
    labels = {"sparkfold.managed": "1"} if managed else {}
    if spec_hash:
        labels[LABEL_HASH] = spec_hash
    return {"exists": True, "running": running, "status": status or ("running" if running else "exited"),
            "exit_code": exit_code, "oom_killed": oom, "labels": labels, "image": IMAGE, "created": "",
            "ports": list(ports)}


def found(s, container_: dict | None = None, *, linked: bool = True, rails: list | None = RAILS,
          caps: dict | None = None, mem_gib: float = 200.0, holders: dict | None = None,
          infiniband: bool = True, generations: dict | None = None) -> dict:
    """RankInputs of Spark `s` after a complete bring-up (its symlinks lead to commit abc), with `container_`."""
    p = s.layout
    return {
        "container": container_ or {},
        "link_record": {"rails": rails} if rails else None,
        "served": f"{p.model_folder}/snapshots/abc" if linked else None,
        "kit": f"{p.kit}.d/0123abcd" if linked else None,
        "rank_folder": f"{p.rank_cache}/abc/rank{s.rank}" if linked else None,
        "ablit": f"{p.ablit}/abc-overlay" if linked and s.ablit and s.is_head else None,
        "infiniband": infiniband,
        "capabilities": (CAPS if caps is None else caps) if s.is_head else {},
        "port_holders": holders or {},
        "mem_available": int(mem_gib * GIB),
        "generations": generations or {"files": {}, "last_good": ""},
    }


DOCKER_LIVE = {"reachable": True, "default_runtime": "nvidia", "runtimes": ["nvidia", "runc"],
               "root_dir": "/var/lib/docker"}
DAEMON_OK = {"exists": True, "config": merged_daemon_config({}), "error": None}
# default-runtime dropped by hand: the docker step writes the file and restarts Docker
DAEMON_DRIFTED = {"exists": True, "config": {"runtimes": {"nvidia": NVIDIA_RUNTIME}}, "error": None}


def docker_facts(daemon_json: dict = DAEMON_OK, live: dict = DOCKER_LIVE) -> dict:
    """What the docker step reads on a Spark, which the rank step asks too (converged: no Docker restart)."""
    return {DaemonJson: with_args({f"path={DOCKER_DAEMON_JSON}": daemon_json}), DockerRuntimeInfo: live}


def pair_plans(s, peer, image: str = IMAGE, template: str = TEMPLATE, rollback: bool = False):
    """The pair step's handoff of Spark `s` (operations/ranks.py), no phase read yet; rollback: rollback.py's."""
    from operations.ranks import PairPlans
    return PairPlans.of(s, peer, image, template, rollback)


def rank_facts(inputs: dict, more: dict | None = None) -> dict:
    """A test host's facts for the rank step: its RankInputs, converged docker facts, and `more`."""
    return {**docker_facts(), RankInputs: inputs, **(more or {})}
