"""Each rank's container, built from the settings: one pure function, `rank_spec`.

The argv, environment and mounts follow docs/architecture.md ("The container contract"); the docker run options
follow the recipe (GPU, host network and IPC, RDMA devices, IPC_LOCK, ulimits, OOM score).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from operations.layout import InContainer as C
from operations.rank.flags import PORTED_SETTINGS, engine_reads
from operations.rank.sampling import sampling_args
from operations.settings import PASSTHROUGH_PREFIXES

# Rank 0 reads these switches from its environment, rank 1 takes them as flags: keep the pair in step.
RANK1_SWITCHES = (("TF_DS_GRAPHS", "--graphs"), ("TF_DS_HC_SIDE", "--side"),
                  ("TF_DS_L2_PREFETCH", "--prefetch"), ("TF_DS_ENGRAM_AIO", "--aio"))

# The `docker run` options a rank is started with, and the values each may take (a regular expression; None: a
# flag): rank_spec builds only these, and a recorded spec with any other is refused (operations/rank/record_check.py).
RUN_OPTIONS: dict[str, str | None] = {
    "-d": None, "--name": r"[A-Za-z0-9][A-Za-z0-9_.-]*", "--gpus": "all", "--network": "host", "--ipc": "host",
    "--device": "/dev/infiniband", "--cap-add": "IPC_LOCK", "--ulimit": r"[a-z]+=-?[0-9]+(:-?[0-9]+)?",
    "--oom-score-adj": r"-?[0-9]+",
}
ENGINE_COMMANDS = ("tensorfold-native", "tf-dsv41-lanes")  # argv[0] of rank 0's and rank 1's container

LABEL_MANAGED = "sparkfold.managed"
LABEL_HASH = "sparkfold.spec-hash"
LABEL_RANK = "sparkfold.rank"


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    image: str
    argv: list[str]
    env: dict[str, str]
    mounts: list[tuple[str, str, bool]]  # (host dir or volume name, path in the container, read-only)
    options: list[str]  # docker run option tokens, one token each
    labels: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)  # digests of mounted files whose content matters

    @property
    def rank(self) -> int:
        return int(self.labels.get(LABEL_RANK, "0"))

    def spec_hash(self) -> str:
        """Digest of everything that makes the container what it is (not the labels that carry the digest)."""
        body = {"image": self.image, "argv": self.argv, "env": dict(sorted(self.env.items())),
                "mounts": [list(m) for m in self.mounts], "options": self.options, "inputs": self.inputs}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]

    def all_labels(self) -> dict[str, str]:
        return {**self.labels, LABEL_HASH: self.spec_hash()}

    def run_argv(self, env_file: str = "") -> list[str]:
        """`docker run` as a word list (each word one token). env_file: the file holding the environment
        (env_file_text), so that values that may be secret are not in the argv every user sees in `ps`."""
        words = ["docker", "run", *self.options]
        for key, value in sorted(self.all_labels().items()):
            words += ["--label", f"{key}={value}"]
        if env_file:
            words += ["--env-file", env_file]
        for key, value in sorted(self.env.items()) if not env_file else ():
            words += ["-e", f"{key}={value}"]
        for src, dst, ro in self.mounts:
            kind = "bind" if src.startswith("/") else "volume"
            words += ["--mount", f"type={kind},src={src},dst={dst}" + (",readonly" if ro else "")]
        return words + [self.image, *self.argv]


def env_file_text(spec: ContainerSpec) -> str:
    """The spec's environment as `docker run --env-file` reads it: one NAME=value a line, taken literally."""
    bad = sorted(key for key, value in spec.env.items() if "\n" in key or "\n" in value or "\r" in value)
    if bad:  # the settings refuse these before anything runs; a record that holds one is never started
        raise ValueError(f"the environment of {spec.name} holds a line break in {', '.join(bad)}")
    return "".join(f"{key}={value}\n" for key, value in sorted(spec.env.items()))


def image_key(image_ref: str) -> str:
    """A short name for the image (its tag or digest) for the per-image writable cache."""
    if "@sha256:" in image_ref:
        return "sha256-" + image_ref.split("@sha256:", 1)[1][:16]
    tail = image_ref.rsplit("/", 1)[-1]
    return tail.split(":", 1)[1] if ":" in tail else "latest"


def cache_dir(s, image_ref: str) -> str:
    return f"{s.layout.cache_root}/{image_key(image_ref)}"


def rail_problems(rails: list[dict], nccl_rails: int) -> list[str]:
    """What keeps these recorded rails from feeding NCCL and the RDMA ring."""
    if len(rails) < nccl_rails:
        return [f"the link record lists {len(rails)} rail(s) but nccl_rails = {nccl_rails}: re-run the link step "
                "or set nccl_rails 1"]
    p = []
    for i, r in enumerate(rails[:nccl_rails]):
        for key in ("netdev", "ibdev", "gid_index"):
            if r.get(key) in (None, ""):
                p.append(f"link rail {i} has no {key} recorded: re-run the link step (it finds the RoCE device and "
                         "its RoCE v2 GID)")
    gids = {str(r.get("gid_index")) for r in rails[:nccl_rails]}
    if len(gids) > 1:
        p.append(f"the rails used have different RoCE v2 GID indexes ({', '.join(sorted(gids))}); NCCL takes one "
                 "NCCL_IB_GID_INDEX: set nccl_rails 1 or fix the GIDs")
    return p


def _link_env(s, rails: list[dict]) -> dict[str, str]:
    used = rails[: s.nccl_rails]
    gid = str(used[0]["gid_index"])
    env = {
        "NCCL_IB_HCA": ",".join(r["ibdev"] for r in used),
        "NCCL_IB_GID_INDEX": gid,
        "NCCL_SOCKET_IFNAME": rails[0]["netdev"],
        "NCCL_MIN_NCHANNELS": str(s.nccl_channels),
        "NCCL_MAX_NCHANNELS": str(s.nccl_channels),
        "TF_RDMA_GID_INDEX": gid,
    }
    if s.nccl_debug:
        env["NCCL_DEBUG"] = s.nccl_debug
    return env


def _engine_env(s, capabilities: dict | None) -> dict[str, str]:
    """The user's engine variables, and each non-zero ported setting as its variable when the image reads it.

    capabilities None: the document is not known yet (no image); the launch check (`check_ported_settings`)
    refuses the pair before a rank starts when the image does not read the variable."""
    env = {k: str(v) for k, v in sorted(s.engine_env.items()) if k.startswith(PASSTHROUGH_PREFIXES)}
    for name, (variable, _feature) in PORTED_SETTINGS.items():
        value = getattr(s, name)
        if value > 0 and (capabilities is None or engine_reads(capabilities, variable)):
            env[variable] = str(value)
    return env


def _chat_template_served(capabilities: dict | None) -> bool:
    flags = ((capabilities or {}).get("serve") or {}).get("flags") or {}
    return "--chat-template" in flags


def rank0_argv(s, snapshot: str, capabilities: dict | None) -> list[str]:
    argv = ["tensorfold-native", "serve", snapshot, "--name", s.served_name, "--host", s.host,
            "--port", str(s.port), "--context", str(s.context), "--parallel", str(s.parallel),
            "--max-tokens", str(s.max_tokens), *sampling_args(s, capabilities),
            "--thinking" if s.thinking else "--no-thinking"]
    if s.reasoning_effort:
        argv += ["--reasoning-effort", s.reasoning_effort]
    if not s.drafts:
        argv.append("--no-drafts")
    if s.api_key:
        argv += ["--api-key-file", C.API_KEY_FILE]
    if _chat_template_served(capabilities):
        argv += ["--chat-template", C.CHAT_TEMPLATE]
    return argv + ["--backend", "cuda", *[str(a) for a in s.extra_serve_args]]


def rank1_argv(s, snapshot: str, rails: list[dict], engine_env: dict[str, str]) -> list[str]:
    argv = ["tf-dsv41-lanes", snapshot, C.RANK_CACHE, "1", "2", s.head_link_ip, str(s.master_port), C.KIT,
            "--engram", C.ENGRAM, "--token-map", C.TOKEN_MAP,
            "--pool", str(s.pool_positions), "--parallel", str(s.parallel)]
    if rails:
        argv += ["--rdma", ",".join(r["ibdev"] for r in rails[: s.nccl_rails])]
    for var, flag in RANK1_SWITCHES:
        argv += [flag, "0" if engine_env.get(var, "1") == "0" else "1"]
    if not s.drafts:
        argv += ["--drafts", "0"]
    return argv


def rank_spec(s, image_ref: str, rails: list[dict], model_mount: tuple[str, str], capabilities: dict | None,
              *, rank_folder: str, has_infiniband: bool = True, template_digest: str = "",
              kit_folder: str = "") -> ContainerSpec:
    """This Spark's rank container.

    rails: the link step's record for this Spark, rail 0 first: [{"netdev", "ibdev", "address", "gid_index", "mtu"}].
    model_mount: (host dir or docker volume holding the Hugging Face cache, snapshot path inside the container).
    capabilities: the image's `capabilities --json` document (decides how the chat template is given and which
        ported settings reach either rank); None while it is not known.
    rank_folder: this rank's weight folder (the target of its active-rank link).
    kit_folder: the kit's real folder (the target of data_dir/kit, a new one per kit version, so a new kit
        recreates the pair); data_dir/kit when empty.
    has_infiniband: /dev/infiniband exists on this Spark.
    template_digest: sha256 of the chat template file, so a new template recreates rank 0.
    """
    p = s.layout
    source, snapshot = model_mount
    engine_env = _engine_env(s, capabilities)
    env = {"HF_HUB_OFFLINE": "1", "TENSORFOLD_NO_UPDATE_CHECK": "1", "TF_DS_REPLAY_FLOOR": "1",
           **_link_env(s, rails)}
    # the worker's NFS volume holds only the head's hub/ folder (docker volume names never start with /)
    hf_target = C.HF if source.startswith("/") else f"{C.HF}/hub"
    mounts = [(source, hf_target, True), (kit_folder or p.kit, C.KIT, True), (p.engram, C.ENGRAM, True),
              (rank_folder, C.RANK_CACHE, True), (p.token_map_dir, C.TOKEN_MAP_DIR, True),
              (cache_dir(s, image_ref), C.CACHE, False)]
    inputs = {}
    if s.rank == 0:
        env.update({
            "TF_TP_WORLD": "2", "TF_TP_MASTER": s.head_link_ip, "TF_TP_PORT": str(s.master_port),
            "TF_DS_RANK_CACHE": C.RANK_CACHE, "TF_DS_KIT": C.KIT, "TENSORFOLD_CUDA_KERNELS": f"{C.KIT}/aot",
            "TF_DS_ENGRAM": C.ENGRAM, "TF_DS_TOKEN_MAP": C.TOKEN_MAP,
            "TF_RDMA_DEVICES": ",".join(r["ibdev"] for r in rails[: s.nccl_rails]),
            "TF_DS_GRAPHS": "1", "TF_DS_HC_SIDE": "1", "TF_DS_L2_PREFETCH": "1", "TF_DS_ENGRAM_AIO": "1",
        })
        argv = rank0_argv(s, snapshot, capabilities)
        if s.api_key:
            mounts.append((p.api_key_dir, C.API_KEY_DIR, True))
        # An engine without --chat-template reads <snapshot>/chat_template.jinja: put ours there.
        target = C.CHAT_TEMPLATE if _chat_template_served(capabilities) else f"{snapshot}/chat_template.jinja"
        mounts.append((p.chat_template, target, True))
        if template_digest:
            inputs["chat_template"] = template_digest
    else:
        argv = rank1_argv(s, snapshot, rails, engine_env)
    env.update(engine_env)  # the user's variables win over our defaults

    options = ["-d", "--name", s.container_name, "--gpus", "all", "--network", "host", "--ipc", "host"]
    if has_infiniband:
        options += ["--device", "/dev/infiniband"]
    options += ["--cap-add", "IPC_LOCK"]
    for u in s.docker_ulimits:
        options += ["--ulimit", str(u)]
    options += ["--oom-score-adj", str(s.oom_score_adj)]
    labels = {LABEL_MANAGED: "1", LABEL_RANK: str(s.rank)}
    return ContainerSpec(s.container_name, image_ref, argv, env, mounts, options, labels, inputs)


CHAT_TEMPLATE = "model/chat_template.jinja"  # in this checkout; rank 0 serves it


def template_digest(s) -> str:
    """sha256 of the chat template this checkout serves ("" when absent), so a new template recreates rank 0."""
    template = s.project_root / CHAT_TEMPLATE
    return hashlib.sha256(template.read_bytes()).hexdigest() if template.exists() else ""
