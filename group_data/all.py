# Every sparkfold setting, defined once: name = default  # meaning.
# Override per host in group_data/head.py or group_data/worker.py (or the site file's `data:`),
# for one run with `--data name=value`, or with an environment variable: the recipe's upper-case name
# (CONTEXT=524288) for its settings, SPARKFOLD_<NAME> for any. operations/settings.py validates all of them.
# An empty path ("") means "under the ssh user's home on that Spark" (resolved per host).

# --- serving (the recipe's settings table) ---
context = 1048576  # positions in the pool all streams share (power of two, at most 1048576)
parallel = 4  # requests served at once (1-4 for this engine)
thinking = True  # think first unless a request turns it off
reasoning_effort = ""  # default reasoning effort: "", low, medium, high or xhigh
drafts = True  # use the checkpoint's DSpark draft blocks
eaq_v1_1 = False  # True serves the experimental EAQ v1.1 pack instead of v1
ablit = False  # True applies the Keys overlay (abliterated mode; needs HF_TOKEN with gated access)
api_key = False  # True makes rank 0 require a key (kept in a 0600 file on the head)
host = "0.0.0.0"  # address rank 0's API binds on the head
port = 8888  # port of rank 0's API
served_name = "DeepSeek-V4.1-Flash-1017"  # model id the API serves
min_avail_gib = 112.0  # refuse to start unless this much MemAvailable on each Spark (GiB)
memguard_gib = 2.5  # memguard kills the rank's container below this MemAvailable (GiB)
spill_gib = 0  # spill v2 budget in GiB (0 = off; passed as TF_SPILL_GIB)
kv_shard = 0  # KV sharding (0 = off; passed as TF_DS_KV_SHARD)
pool = 0  # positions in rank 1's pool (0 = same as context; must equal rank 0's context)
max_tokens = 32768  # default reply budget (--max-tokens)
extra_serve_args = []  # extra rank-0 serve arguments, appended after the defaults
engine_env = {}  # extra TENSORFOLD_*/TF_DS_*/TF_FILL_*/TF_SPILL_* variables for both ranks

# --- engine image ---
engine_image = "sparkfold/dsv41-tf"  # local image name; the tag is the content hash
engine_context = "zig"  # build context on this machine (Dockerfile + patches), uploaded to the head
base_image = "nvcr.io/nvidia/pytorch:26.07-py3"  # BASE_IMAGE build argument
zig_version = "0.17.0"  # Zig release the engine needs
zig_sha256 = "9e8d11661d4ae3bd57702a3832781e23ad151dde5798e16a5ccd503f65234ff8"  # sha256 of the aarch64 Zig tarball
zig_url = "https://ziglang.org/download/0.17.0/zig-aarch64-linux-0.17.0.tar.xz"  # where the build fetches Zig
tf_repo = "https://github.com/bertholomus/TensorFold.git"  # engine fork
tf_ref = "fbbc971"  # engine commit on branch deepseek-v41-zig (full 40-hex SHA preferred)
tools_ref = "59402086381a42c74d53053443224eec2790b4c5"  # weight-file/token-map tools (branch deepseek-v41-zig-tp4)
prebuilt_image = ""  # use this published image (name@sha256:digest) instead of building
image_free_gb = 35  # free space the image needs under Docker's root (GB)

# --- checkpoint and data ---
hf_endpoint = ""  # Hugging Face endpoint ("" = the public Hub; a mirror URL otherwise)
hf_python = ""  # python3 on the head that has huggingface_hub ("" = a venv the deploy makes)
model_repo = "Mia-AiLab/DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1-2.9-bpw"  # default pack
model_revision = "main"  # pinned revision of model_repo (a 40-hex commit pins it)
model_repo_v1_1 = "Mia-AiLab/DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1.1-2.9-bpw"  # pack used with eaq_v1_1
model_revision_v1_1 = "main"  # pinned revision of model_repo_v1_1
engram_repo = "deepseek-ai/DeepSeek-V4.1-Flash-1017"  # original checkpoint holding the Engram tables
engram_revision = "main"  # pinned revision of engram_repo
engram_files = [
    "config.json",
    "model.safetensors.index.json",
    "model-00047-of-00048.safetensors",
    "model-00048-of-00048.safetensors",
]  # Engram files to fetch
kit_repo = "bertholomus/DeepSeek-V4.1-Flash-TensorFold-TP2-2xGB10"  # Hugging Face repo whose kit/ dir is the kernel kit
kit_revision = "main"  # pinned revision of kit_repo
ablit_repo = "drowzeys/DeepSeek-V4.1-Flash-Abliterated-Cybersecurity-Unleashed"  # gated Keys overlay repo
ablit_revision = "87bb9850e6f49fd20ad9c8516b7817215cbbf5fc"  # pinned revision of ablit_repo
ablit_file = "mia_exl3_wo_b_l10_35.safetensors"  # overlay tensor file
hf_cache = ""  # Hugging Face cache on each Spark ("" = ~/.cache/huggingface)
data_dir = ""  # kit, Engram tables, token map, weight files, logs ("" = ~/.cache/sparkfold)
state_dir = ""  # API key, link record, run state ("" = ~/.local/state/sparkfold)
disk_need_gb = 310  # free disk this Spark needs for what it holds (head: 505 in group_data/head.py)

# --- worker access to the checkpoint ---
nfs = True  # the head exports its Hugging Face cache read-only to the worker over the link
worker_weights = "nfs"  # how rank 1 reads the checkpoint: "nfs" (the volume) or "copy" (a local copy)
nfs_volume = "sparkfold-hf"  # docker volume name on the worker
nfs_options = "nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600"  # mount options (addr= is added)
nfs_exports_file = "/etc/exports.d/sparkfold.exports"  # export file this project owns on the head

# --- CX7 link ---
link_mtu = 9000  # MTU on every link netdev (both Sparks must match)
link_netplan_file = "/etc/netplan/60-sparkfold-cx7.yaml"  # netplan file this project owns
link_prefix_min = 16  # widest rail prefix accepted, 8-30 (a rail subnet is routed over the cable; below 16 warns)
link_rollback_s = 120  # a netplan apply not confirmed over a new ssh connection within this is undone (90-3600 s)
master_port = 29620  # rank 0's rendezvous port on the head's link address
nccl_channels = 4  # NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS
nccl_rails = 2  # how many rails (PCIe twins) NCCL and the RDMA ring use (1 or 2)
nccl_debug = ""  # NCCL_DEBUG for both ranks when set

# --- host preparation ---
gpu_clock_mhz = 2200  # GPU clock ceiling locked on both Sparks (nvidia-smi -lgc 0,<MHz>)
gpu_clock_period_s = 300  # a timer re-applies the GPU clock lock this often (an idle GPU hides a reset)
docker_install = True  # install docker/nvidia-container-toolkit when missing (apt)
docker_restart_ok = False  # True lets a daemon.json change restart Docker while other containers run (it stops them)

# --- launch and lifecycle ---
container_name = "dsv41-1017-exl3-tf"  # rank container name on both Sparks
docker_ulimits = ["memlock=-1:-1", "stack=67108864:67108864"]  # --ulimit values for both ranks
oom_score_adj = 1000  # the kernel OOM killer picks the server before the desktop
wait_timeout = 1800  # seconds to wait for rank 0's API after a start
stop_timeout = 30  # seconds docker stop waits before killing a rank
log_keep = 10  # saved rank logs kept per Spark
keep_generations = 2  # served pairs (images, weight folders, kit versions) kept on each Spark for a rollback
upgrade_gate = "smoke"  # what a new pair must pass before the old one is let go: "smoke", or "exact" (same replies)
log_lines = 100  # lines of each rank's log logs.py prints (live, or the newest saved log)
status_plan = True  # status.py also counts the operations a deploy would change (runs deploy.py --dry; slower)
api_url = ""  # base URL this machine uses to reach rank 0 ("" = http://<head ssh host>:<port>)
memguard = True  # run the memory watchdog on both Sparks
supervise = False  # install the systemd unit that supervises the pair (backoff, then gives up)
supervise_retries = 3  # restarts the supervisor tries before it gives up
supervise_backoff_s = 60  # first restart delay; doubles on each retry
restart = False  # recreate both ranks even when nothing changed (restart.py sets it)
allowed_arch = ["aarch64"]  # machine types preflight accepts (a DGX Spark is aarch64)
allowed_os = ["ubuntu"]  # /etc/os-release ID (or ID_LIKE) values preflight accepts (DGX OS is Ubuntu based)
nvidia_smi_path = "/usr/bin/nvidia-smi"  # nvidia-smi the clock unit and the live lock run
rotate_api_key = False  # True writes a new API key on the head (for one run: --data rotate_api_key=true)
