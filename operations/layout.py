"""Where everything lives on a Spark, written once: operations, the rank specs, preflight, the docs and the tests
read their paths here.

`Layout` holds one Spark's roots (its Hugging Face cache, data_dir and state_dir, resolved against that Spark's
home) and derives every path below them. System-wide paths sparkfold owns and the paths inside the rank
containers are constants.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from operations.util.hf_cache import (
    repo_folder_name,  # hf_cache.py also runs on the head on its own: the name lives there
)

# --- system-wide paths sparkfold owns (root) ---
UNIT_DIR = "/etc/systemd/system"
SCRIPT_DIR = "/usr/local/lib/sparkfold"  # memguard and the supervisor, uploaded from operations/remote/
SYSTEM_STATE_DIR = "/var/lib/sparkfold"
GPU_CLOCK_RECORD = f"{SYSTEM_STATE_DIR}/gpu-clock.record"  # the last -lgc: boot id, time, driver's answer or failure
GPU_CLOCK_SCRIPT = "gpu_clock_lock.sh"  # operations/remote/ -> SCRIPT_DIR: the one way the lock is applied
# The served pairs' records (operations/rank/generation.py): root's, 0700, each record 0600. Not under state_dir:
# that folder is the ssh user's, who could rename a root-owned folder inside it away and put one of their own in its
# place; /var/lib/sparkfold and everything above it is root's.
GENERATIONS_DIR = f"{SYSTEM_STATE_DIR}/generations"
RUN_LOCK = f"{SYSTEM_STATE_DIR}/run.lock"  # one per Spark, whoever runs the deploy and whatever their state_dir
DOCKER_DAEMON_JSON = "/etc/docker/daemon.json"
NETPLAN_APPLY_DIR = f"{SYSTEM_STATE_DIR}/netplan-apply"  # one folder per apply: its new files, revert and promote
NETPLAN_STAGE_DIR = "/run/netplan"  # an apply's files until it is confirmed: tmpfs, so a reboot boots /etc/netplan's
BOOT_ID = "/proc/sys/kernel/random/boot_id"

# --- unit names ---
GPU_CLOCK_UNIT = "sparkfold-gpu-clock.service"
GPU_CLOCK_TIMER = "sparkfold-gpu-clock.timer"  # starts GPU_CLOCK_UNIT at boot and every gpu_clock_period_s
MEMGUARD_UNIT = "sparkfold-memguard.service"
SUPERVISOR_UNIT = "sparkfold-supervise.service"
NETPLAN_REVERT_UNIT = "sparkfold-netplan-revert"  # transient timer per apply: <this>-<apply folder name>

# --- names inside a Hugging Face cache repo folder and data_dir ---
SERVED_SYMLINK = "sparkfold-current"  # <repo folder>/sparkfold-current -> snapshots/<commit>: the served snapshot
ABLIT_CURRENT = "current"  # <data_dir>/ablit/current -> <commit>: the applied ABLIT pack
TOKEN_MAP_FILE = "dsv41_token_map.json"


class InContainer:
    """Paths inside the rank containers (fixed by the container contract in docs/architecture.md)."""

    HF = "/root/.cache/huggingface"
    ABLIT = "/model-ablit"
    KIT = "/kit"
    ENGRAM = "/engram"
    RANK_CACHE = "/rank-cache"
    TOKEN_MAP_DIR = "/token-map"
    TOKEN_MAP = f"/token-map/{TOKEN_MAP_FILE}"
    CACHE = "/cache"
    API_KEY_DIR = "/etc/sparkfold/api-key.d"
    API_KEY_FILE = f"{API_KEY_DIR}/key"
    CHAT_TEMPLATE = "/etc/sparkfold/chat_template.jinja"


def unit_path(unit_name: str) -> str:
    return f"{UNIT_DIR}/{unit_name}"


def script_path(script: str) -> str:
    return f"{SCRIPT_DIR}/{script}"


@dataclass(frozen=True)
class Layout:
    """One Spark's folders and files. hf_cache, data_dir and state_dir are absolute (settings resolve them)."""

    hf_cache: str
    data_dir: str
    state_dir: str
    rank: int
    model_repo: str  # the repo this Spark serves (the EAQ v1 or v1.1 pack)

    # --- the Hugging Face cache (the head exports hub/ to the worker) ---
    @property
    def hub(self) -> str:
        return f"{self.hf_cache}/hub"

    def repo_folder(self, repo_id: str) -> str:
        return f"{self.hub}/{repo_folder_name(repo_id)}"

    @property
    def model_folder(self) -> str:
        return self.repo_folder(self.model_repo)

    @property
    def served_link(self) -> str:
        """The served snapshot's symlink (<repo folder>/sparkfold-current -> snapshots/<commit>)."""
        return f"{self.model_folder}/{SERVED_SYMLINK}"

    # --- data_dir: kit, Engram tables, token map, weight files, logs ---
    @property
    def engram(self) -> str:
        return f"{self.data_dir}/engram"

    @property
    def kit_src(self) -> str:
        return f"{self.data_dir}/kit-src"

    @property
    def kit(self) -> str:
        return f"{self.data_dir}/kit"

    @property
    def token_map_dir(self) -> str:
        return f"{self.data_dir}/token-map"

    @property
    def token_map(self) -> str:
        return f"{self.token_map_dir}/{TOKEN_MAP_FILE}"

    @property
    def rank_cache(self) -> str:
        return f"{self.data_dir}/rank-cache"

    def active_rank_link(self, rank: int | None = None) -> str:
        """The folder the launch step mounts as /rank-cache (a symlink to the current weight folder of that rank)."""
        return f"{self.rank_cache}/active-rank{self.rank if rank is None else rank}"

    @property
    def ablit(self) -> str:
        return f"{self.data_dir}/ablit"

    @property
    def ablit_current(self) -> str:
        return f"{self.ablit}/{ABLIT_CURRENT}"

    @property
    def overlay(self) -> str:
        return f"{self.data_dir}/ablit-overlay"

    @property
    def cache_root(self) -> str:
        """Per-image writable caches of the ranks (/cache)."""
        return f"{self.data_dir}/cache"

    @property
    def logs(self) -> str:
        return f"{self.data_dir}/logs"

    @property
    def chat_template(self) -> str:
        return f"{self.data_dir}/chat_template.jinja"

    @property
    def build_root(self) -> str:
        return f"{self.data_dir}/build"

    def build_dir(self, digest: str) -> str:
        return f"{self.build_root}/{digest}"

    # --- state_dir: keys, records, the download venv ---
    @property
    def rank_env(self) -> str:
        """The ssh user's 0700 folder where a rank's environment waits for `docker run --env-file` (removed once
        read: Docker keeps it in the container)."""
        return f"{self.state_dir}/rank-env"

    @property
    def venv(self) -> str:
        return f"{self.state_dir}/venv"

    @property
    def hf_token(self) -> str:
        return f"{self.state_dir}/hf-token"

    @property
    def hf_env(self) -> str:
        """huggingface_hub's variables from this machine (proxies may hold a password): 0600, sourced by the scripts
        that reach the Hub."""
        return f"{self.state_dir}/hf-env"

    @property
    def api_key_dir(self) -> str:
        """The folder rank 0 mounts: a key replaced by rename inside it reaches the running engine (a mounted
        file would keep the old inode)."""
        return f"{self.state_dir}/api-key.d"

    @property
    def api_key(self) -> str:
        return f"{self.api_key_dir}/key"

    @property
    def legacy_api_key(self) -> str:
        """Where sparkfold 0.1 kept the key: moved into api_key_dir, so the key users have stays valid."""
        return f"{self.state_dir}/api-key"

    @property
    def link_record(self) -> str:
        return f"{self.state_dir}/link.json"

    @property
    def link_bandwidth(self) -> str:  # the last link measurement and its inputs (operations/link_measure.py)
        return f"{self.state_dir}/link-bandwidth.json"

    @property
    def generations(self) -> str:
        """The served pairs' records (root's, GENERATIONS_DIR): <id>.json each, last-good and seq."""
        return GENERATIONS_DIR

    @property
    def legacy_generations(self) -> str:
        """Where sparkfold kept the records before (the ssh user's folder): moved into GENERATIONS_DIR once."""
        return f"{self.state_dir}/generations"

    @property
    def capabilities_cache(self) -> str:
        """The engines' `capabilities --json` documents, one file per image id (facts/docker.capabilities_cache_file):
        written by image.engine_capabilities_checked, read by facts/docker.EngineCapabilities."""
        return f"{self.state_dir}/capabilities"

    @property
    def nccl_conf_cache(self) -> str:
        """Each engine image's /etc/nccl.conf (or that it has none), one file per image id beside the capabilities
        cache (facts/network.nccl_conf_cache_file): written by link_measure, read by facts/network.ImageNcclConf."""
        return f"{self.state_dir}/nccl-conf"

    @property
    def streams(self) -> str:
        """The background streams' state, one folder each (operations/streams): the ssh user's, mode 0700."""
        return f"{self.state_dir}/streams"

    def relative_to_cache(self, path: str) -> str:
        """`path` (inside hf_cache) as the container sees it under InContainer.HF."""
        return f"{InContainer.HF}/{posixpath.relpath(path, self.hf_cache)}"
