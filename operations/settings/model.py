"""The typed, read-only settings of one Spark.

Each user setting is a field here (its type) and a name in group_data/all.py (its default and its one-line
meaning); `sources.load` refuses any name that is in one and not the other. The per-host fields come from the site
file and group_data/<role>.py. Values that depend on both Sparks are properties, computed here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TypedDict

from operations.layout import Layout
from operations.util.net import ip_of

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Variables the engine reads: passed to both ranks from engine_env or from the environment of the run.
PASSTHROUGH_PREFIXES = ("TENSORFOLD_", "TF_DS_", "TF_FILL_", "TF_SPILL_")


class Rail(TypedDict, total=False):
    """One CX7 netdev of the link (a PCIe twin) and the IPv4 address it gets; ibdev when the site file names it."""

    netdev: str
    address: str
    ibdev: str | None


@dataclass(frozen=True)
class Settings:
    # --- serving (the recipe's settings table) ---
    context: int
    parallel: int
    thinking: bool
    reasoning_effort: str
    drafts: bool
    eaq_v1_1: bool
    ablit: bool
    api_key: bool
    api_key_file: str  # a path on this machine ("" = the key is made on the head)
    host: str
    port: int
    served_name: str
    min_avail_gib: float
    memguard_gib: float
    spill_gib: int
    kv_shard: int
    pool: int
    max_tokens: int
    temperature: str  # rank 0's sampling defaults: a number, or "" for the engine's own
    top_p: str
    top_k: str
    extra_serve_args: list[str]
    engine_env: dict[str, str]
    # --- engine image ---
    engine_image: str
    engine_context: str
    base_image: str
    zig_version: str
    zig_sha256: str
    zig_url: str
    tf_repo: str
    tf_ref: str
    tools_ref: str
    prebuilt_image: str
    image_free_gb: int
    # --- checkpoint and data ---
    hf_endpoint: str
    hf_python: str
    hf_hub_version: str
    hf_max_workers: int
    model_repo: str
    model_revision: str
    model_repo_v1_1: str
    model_revision_v1_1: str
    engram_repo: str
    engram_revision: str
    engram_files: list[str]
    kit_repo: str
    kit_revision: str
    ablit_repo: str
    ablit_revision: str
    ablit_file: str
    hf_cache: str  # absolute once loaded ("" in group_data means under the ssh user's home)
    data_dir: str
    state_dir: str
    disk_need_gb: int
    # --- worker access to the checkpoint ---
    nfs: bool
    worker_weights: str
    nfs_volume: str
    nfs_options: str
    nfs_exports_file: str
    # --- CX7 link ---
    link_mtu: int
    link_netplan_file: str
    link_rollback_s: int
    link_prefix_min: int
    link_measure: str
    link_min_gbps: float
    link_measure_s: int
    link_check_stop: bool
    master_port: int
    nccl_channels: int
    nccl_rails: int
    nccl_debug: str
    # --- host preparation ---
    gpu_clock_mhz: int
    gpu_clock_period_s: int
    docker_install: bool
    docker_restart_ok: bool
    # --- launch and lifecycle ---
    container_name: str
    docker_ulimits: list[str]
    oom_score_adj: int
    wait_timeout: int
    stop_timeout: int
    log_keep: int
    keep_generations: int
    upgrade_gate: str
    rollback_open: bool
    log_lines: int
    status_plan: bool
    status_watch: int
    progress_every_s: int
    api_url: str
    memguard: bool
    supervise: bool
    supervise_retries: int
    supervise_backoff_s: int
    restart: bool
    allowed_arch: list[str]
    allowed_os: list[str]
    nvidia_smi_path: str
    rotate_api_key: bool
    verify_data: bool

    # --- per host: group_data/<role>.py and the site file ---
    role: str = ""
    rank: int = 0
    link_rails: tuple[Rail, ...] = ()
    ssh_hostname: str = ""
    ssh_user: str = "root"
    ssh_port: int = 22
    reach_from_head: str = ""  # how the head reaches this Spark over ssh (site file; "" = ssh_hostname)
    home: str = "/root"  # the ssh user's home on this Spark (a fact)
    # the Hugging Face token: HF_TOKEN of the run, else the one huggingface_hub finds on this machine (hf auth login)
    hf_token: str = field(default="", repr=False)
    hf_token_source: str = ""  # where hf_token came from (a name, never the token)
    # huggingface_hub's variables of this machine's environment for the head's downloads (a proxy URL may hold a
    # password: never shown)
    hf_env: dict[str, str] = field(default_factory=dict, repr=False)
    own_api_key: str = field(default="", repr=False)  # the key in api_key_file, read on this machine
    # the other Spark's settings (set by `pair`)
    peer: Settings | None = field(default=None, compare=False, repr=False)

    # --- derived: this Spark ---
    @property
    def is_head(self) -> bool:
        return self.role == "head"

    @property
    def layout(self) -> Layout:
        return Layout(self.hf_cache, self.data_dir, self.state_dir, self.rank, self.active_model_repo)

    @property
    def active_model_repo(self) -> str:
        return self.model_repo_v1_1 if self.eaq_v1_1 else self.model_repo

    @property
    def active_model_revision(self) -> str:
        return self.model_revision_v1_1 if self.eaq_v1_1 else self.model_revision

    @property
    def pool_positions(self) -> int:
        """Rank 1's pool: rank 0's context unless set."""
        return self.pool or self.context

    @property
    def link_ip(self) -> str:
        return ip_of(self.link_rails[0]["address"]) if self.link_rails else ""

    @property
    def project_root(self) -> Path:
        return PROJECT_ROOT

    @property
    def engine_context_path(self) -> Path:
        return (PROJECT_ROOT / self.engine_context).resolve()

    # --- derived: both Sparks ---
    @property
    def the_peer(self) -> Settings:
        """The other Spark's settings (there once `pair` linked the two)."""
        if self.peer is None:
            raise LookupError(f"the settings of {self.role or 'this Spark'} were built without its peer")
        return self.peer

    @property
    def head(self) -> Settings:
        return self if self.is_head else self.the_peer

    @property
    def worker(self) -> Settings:
        return self.the_peer if self.is_head else self

    @property
    def head_link_ip(self) -> str:
        return self.head.link_ip

    @property
    def worker_link_ip(self) -> str:
        return self.worker.link_ip

    @property
    def worker_link_ssh(self) -> str:
        """user@address the head uses to reach the worker over the link (image and data copies)."""
        ip = self.worker_link_ip
        return f"{self.worker.ssh_user}@{ip}" if ip else ""

    @property
    def worker_ssh_from_head(self) -> str:
        """user@host the head uses to reach the worker over ssh before the link is up (preflight)."""
        worker = self.worker
        return f"{worker.ssh_user}@{worker.reach_from_head or worker.ssh_hostname}"

    @property
    def api_base_url(self) -> str:
        """How this machine reaches rank 0's API."""
        ssh_host = self.head.ssh_hostname
        host = f"[{ssh_host}]" if ":" in ssh_host else ssh_host  # an IPv6 address goes in brackets in a URL
        url = self.api_url or f"http://{host}:{self.port}"
        return url.rstrip("/").removesuffix("/v1")

    def replace(self, **changes: object) -> Settings:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Settings(**values)


def pair(head: Settings, worker: Settings) -> tuple[Settings, Settings]:
    """The two Sparks' settings, each with the other as its peer."""
    head, worker = head.replace(), worker.replace()
    object.__setattr__(head, "peer", worker)  # frozen: the two are joined here, once, before anyone reads them
    object.__setattr__(worker, "peer", head)
    return head, worker


PER_HOST = ("role", "rank", "link_rails", "ssh_hostname", "ssh_user", "ssh_port", "reach_from_head", "home",
            "hf_token", "hf_token_source", "hf_env", "own_api_key", "peer")
SETTING_NAMES = tuple(f.name for f in fields(Settings) if f.name not in PER_HOST)
