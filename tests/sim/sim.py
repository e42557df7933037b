"""The simulated pair of DGX Sparks: two containers (`head`, `worker`) on this machine's Docker engine.

    python -m tests.sim.sim up [--fresh]     build (cached) and start the pair, or reuse a running one
    python -m tests.sim.sim down             remove the containers, their docker volumes, the link and the network
    python -m tests.sim.sim status           what runs, ready or not, ports, link netdevs
    python -m tests.sim.sim env              print the site file path (SPARKFOLD_SITE=$(... env))
    python -m tests.sim.sim exec ROLE CMD..  run CMD as root in ROLE (--user nvidia for the Spark's user)
    python -m tests.sim.sim ssh ROLE [CMD]   ssh in as nvidia with the test key, like pyinfra does
    python -m tests.sim.sim set-memavail ROLE GIB   lower (or raise) the MemAvailable ROLE shows with no rank running
    python -m tests.sim.sim set-rank-memory ROLE [--gib G] [--load-s S] [--release-s S]   what a running rank holds
    python -m tests.sim.sim reboot ROLE [--hard]   reboot a Spark (--hard: power cut) and wait until it is up again
    python -m tests.sim.sim link-fault slow|down|mtu1500|clear NETDEV [--role R]   slow a twin, its RoCE port down,
        its MTU 1500 (the deploy's link step sets link_mtu again), or clear
    python -m tests.sim.sim set-cma ROLE KB   CmaTotal in ROLE's /proc/meminfo (0: no contiguous memory reserved)

See tests/sim/README.md. Needs root (veth links between the containers' namespaces) and a Docker engine.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from . import meminfo

SIM_DIR = Path(__file__).resolve().parent
ROOT = SIM_DIR.parent.parent
WORK = SIM_DIR / ".work"  # what every pair shares: the images' inputs, the keys, the host keys
KEYS = WORK / "keys"
# Several pairs can run on one machine, each its own containers, volumes, network, ports and files (the end-to-end
# tests run on three at once: tests/conftest.py). SPARKSIM_PAIR numbers them; pair 0 keeps the plain names.
PAIR = int(os.environ.get("SPARKSIM_PAIR", "0") or "0")
PAIR_WORK = WORK if PAIR == 0 else WORK / f"pair{PAIR}"  # this pair's site file, known_hosts and memory files
SITE_FILE = PAIR_WORK / "site.yaml"
KNOWN_HOSTS = PAIR_WORK / "known_hosts"
_NAME = "sparkfold-sim" if PAIR == 0 else f"sparkfold-sim{PAIR}"

ROLES = ("head", "worker")
IMAGE = "sparkfold-sim/host:bookworm"
ENGINE_BASE = "sparkfold-sim/engine-base:bookworm"
NETWORK = f"{_NAME}-mgmt"
# pinned outside Docker's default pools: a pool Docker picks itself can be 192.168.96.0/20, which overlaps the link's
# 192.168.100.0/24 and 192.168.101.0/24 (and the deploy rightly refuses rails that overlap the management network)
NETWORK_SUBNET = f"10.213.{70 + PAIR}.0/24"
CONTAINER = {r: f"{_NAME}-{r}" for r in ROLES}
VOLUME = {r: f"{_NAME}-{r}-docker" for r in ROLES}
SSH_PORT = {"head": int(os.environ.get("SPARKSIM_HEAD_SSH_PORT", str(2221 + 10 * PAIR))),
            "worker": int(os.environ.get("SPARKSIM_WORKER_SSH_PORT", str(2222 + 10 * PAIR)))}
API_PORT = int(os.environ.get("SPARKSIM_API_PORT", str(18888 + PAIR)))  # -> the head's 8888
PROGRESS_EVERY_S = 2  # the site's progress_every_s: a long step's progress line this often
GPU_CLOCK_PERIOD_S = 10  # the site's gpu_clock_period_s: the timer re-applies the GPU clock lock this often
HEAD_API_PORT = 8888
SSH_USER = "nvidia"

# The CX7 port's two PCIe twins, rail 0 first: (netdev, RoCE ibdev, /24 subnet); the head is .1, the worker .2.
RAILS = (("enp1s0f0np0", "rocep1s0f0", "192.168.100"), ("enP2p1s0f0np0", "roceP2p1s0f0", "192.168.101"))
SIM_ROCE = ",".join(f"{ib}:{nd}" for nd, ib, _ in RAILS)
# the RoCE ports and GID tables written again at once (init.d/20-roce-gids.sh follows netlink events, and a port
# marked down is none)
ROCE_SYNC = f"SIM_ROCE_ONCE=1 SIM_ROCE={SIM_ROCE} bash /opt/sim/standins/init.d/20-roce-gids.sh"
HOST_OCTET = {"head": 1, "worker": 2}
LINK_MTU = 1500  # what a fresh Spark has; the deploy sets link_mtu
LINK_MIN_GBPS = 0.2  # the site's link_min_gbps: far below a veth's rate, far above a twin slowed by `link-fault slow`
LINK_FAULTS = ("slow", "down", "mtu1500", "clear")
SLOW_RATE = "20mbit"  # a slowed twin (tc tbf on the head's end: the stand-in's bytes flow head -> worker)

MEM_TOTAL_GIB = meminfo.MEM_TOTAL_GIB
MEM_AVAIL_GIB = meminfo.DEFAULTS["base_gib"]
# What a running rank holds (bin/sim-rank-memory), per pair from the environment at `up`; set-rank-memory changes it.
RANK_MEMORY = {"rank_gib": float(os.environ.get("SPARKSIM_RANK_GIB", meminfo.DEFAULTS["rank_gib"])),
               "load_s": float(os.environ.get("SPARKSIM_RANK_LOAD_S", meminfo.DEFAULTS["load_s"])),
               "release_s": float(os.environ.get("SPARKSIM_RANK_RELEASE_S", meminfo.DEFAULTS["release_s"]))}

# Bump when the container layout changes, so a running pair from an older layout is recreated.
LAYOUT_VERSION = "4"


class SimError(Exception):
    """The pair cannot be brought up; the message says why and what to do."""


def _log(msg: str) -> None:
    print(f"[sim] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], check: bool = True, capture: bool = True, input: str | None = None,
         timeout: float | None = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, text=True, input=input, timeout=timeout,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.PIPE if capture else None)
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip() if capture else ""
        raise SimError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{detail}")
    return proc


def _docker(*args: str, check: bool = True, timeout: float | None = 300) -> subprocess.CompletedProcess:
    return _run(["docker", *args], check=check, timeout=timeout)


# --- prerequisites ------------------------------------------------------------------------------------------------

def missing_prerequisites() -> list[str]:
    """What this machine lacks for the simulation, each with how to get it (empty when all is there)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("run as root: the simulation creates veth links between the containers' network namespaces")
    for tool, pkg in (("docker", "docker.io"), ("ssh", "openssh-client"), ("ssh-keygen", "openssh-client"),
                      ("nsenter", "util-linux"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            problems.append(f"no `{tool}` on PATH: apt-get install {pkg}")
    if shutil.which("docker") and _run(["docker", "info"], check=False, timeout=60).returncode != 0:
        if shutil.which("dockerd") is None:
            problems.append("no Docker engine: apt-get install docker.io")
        # else build.sh starts dockerd itself
    if shutil.which("docker") and _run(["docker", "image", "inspect", "sparkfold-sim/rootfs:bookworm"],
                                       check=False).returncode != 0 and shutil.which("debootstrap") is None:
        problems.append("no debootstrap to build the base image: apt-get install debootstrap")
    return problems


# --- build, keys, files -------------------------------------------------------------------------------------------

def build() -> None:
    env = dict(os.environ, SIM_PYTHON=os.environ.get("SIM_PYTHON", sys.executable))
    proc = subprocess.run(["bash", str(SIM_DIR / "build.sh")], env=env, stdout=sys.stderr)
    if proc.returncode != 0:
        raise SimError("tests/sim/build.sh failed (see its output above)")


def _keygen(path: Path, comment: str) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def ensure_keys() -> None:
    """The controller's key (both Sparks), the head's key (authorized on the worker), stable host keys."""
    _keygen(KEYS / "controller", "sparkfold-sim controller")
    _keygen(KEYS / "head", "nvidia@head (sparkfold-sim)")
    for role in ROLES:
        _keygen(WORK / "hostkeys" / role / "ssh_host_ed25519_key", f"root@{role} (sparkfold-sim)")
    lines = []
    for role in ROLES:
        key = (WORK / "hostkeys" / role / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        lines.append(f"[127.0.0.1]:{SSH_PORT[role]} {' '.join(key)}")
    KNOWN_HOSTS.parent.mkdir(parents=True, exist_ok=True)
    KNOWN_HOSTS.write_text("\n".join(lines) + "\n")


def _meminfo_path(role: str) -> Path:
    return PAIR_WORK / "meminfo" / role


def _write_meminfo(role: str, total_gib: float, avail_gib: float,
                   cma_total_kb: int = meminfo.CMA_TOTAL_KB) -> None:
    path = _meminfo_path(role)
    path.parent.mkdir(parents=True, exist_ok=True)
    meminfo.write_in_place(str(path), meminfo.text(total_gib, avail_gib, cma_total_kb))


def _memory_settings(role: str) -> dict:
    return meminfo.read_json(f"{_meminfo_path(role)}.json", meminfo.DEFAULTS)


def _set_memory(role: str, **changes: float) -> None:
    """Change ROLE's memory settings; on a running pair wait until its watcher has applied them."""
    cfg = {**_memory_settings(role), **changes}
    meminfo.write_json(f"{_meminfo_path(role)}.json", cfg)
    info = _inspect(role)
    if not info or not info["State"]["Running"]:
        _write_meminfo(role, MEM_TOTAL_GIB, cfg["base_gib"], int(cfg["cma_total_kb"]))
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        status = meminfo.read_json(f"{_meminfo_path(role)}.status", {})
        if (status.get("base_gib"), status.get("cma_total_kb")) == (cfg["base_gib"], int(cfg["cma_total_kb"])) and \
                _memory_settings(role) == cfg:
            time.sleep(1.0)  # one more tick: the watcher read the new rank figures too
            return
        time.sleep(0.2)
    raise SimError(f"{role}'s rank-memory watcher did not apply {changes} (log: /var/log/sim-rank-memory.log)")


def set_memavail(role: str, gib: float) -> None:
    """Make ROLE's /proc/meminfo show MemAvailable = gib GiB while no rank runs (a running rank holds its share
    on top: gib less rank_gib); MemTotal unchanged."""
    _check_role(role)
    if gib < 0 or gib > MEM_TOTAL_GIB:
        raise SimError(f"MemAvailable must be between 0 and {MEM_TOTAL_GIB} GiB, not {gib}")
    _set_memory(role, base_gib=float(gib))


def set_rank_memory(role: str, gib: float | None = None, load_s: float | None = None,
                    release_s: float | None = None) -> None:
    """What a running rank holds on ROLE (GiB), and how long it takes to build up after the start and to come back
    after the stop (seconds)."""
    _check_role(role)
    changes = {k: float(v) for k, v in (("rank_gib", gib), ("load_s", load_s), ("release_s", release_s))
               if v is not None}
    if any(v < 0 for v in changes.values()) or changes.get("rank_gib", 0) > MEM_TOTAL_GIB:
        raise SimError(f"rank memory figures must be >= 0 (and at most {MEM_TOTAL_GIB} GiB): {changes}")
    _set_memory(role, **changes)


def set_cma(role: str, kb: int = meminfo.CMA_TOTAL_KB) -> None:
    """ROLE's CmaTotal (and CmaFree) in /proc/meminfo, kB: 0 is a kernel that reserved no contiguous memory (RDMA
    registration then fails with ENOMEM, and the ib_write_bw stand-in fails as perftest does)."""
    _check_role(role)
    if kb < 0:
        raise SimError(f"CmaTotal must be >= 0 kB, not {kb}")
    _set_memory(role, cma_total_kb=int(kb))


def memory_status(role: str) -> dict:
    """What ROLE's watcher last wrote: base_gib, held_gib, avail_gib, ranks."""
    _check_role(role)
    return meminfo.read_json(f"{_meminfo_path(role)}.status", {})


def site_data() -> dict:
    """The site file for the simulated pair, in the format operations/settings/site.py reads."""
    key = str(KEYS / "controller")

    def spark(role: str) -> dict:
        entry = {
            "name": f"sim-{role}",
            "ssh": "127.0.0.1",
            "ssh_port": SSH_PORT[role],
            "ssh_user": SSH_USER,
            "ssh_key": key,
            "link": [{"netdev": nd, "address": f"{net}.{HOST_OCTET[role]}/24", "ibdev": ib} for nd, ib, net in RAILS],
            # pyinfra's SSH connector reads these from host data: keep the sim's host keys out of ~/.ssh
            "data": {"ssh_known_hosts_file": str(KNOWN_HOSTS), "ssh_strict_host_key_checking": "yes"},
        }
        if role == "worker":
            entry["reach_from_head"] = "worker"  # the management network's name for the worker
        return entry

    return {
        "head": spark("head"),
        "worker": spark("worker"),
        "data": {
            "base_image": ENGINE_BASE,
            "engine_context": "tests/sim/engine",
            "hf_endpoint": "http://127.0.0.1:5555",
            "hf_python": "python3",
            "worker_weights": "copy",
            # no CAP_SYS_RESOURCE in the simulation: limits cannot be raised above the hard limit
            "docker_ulimits": ["memlock=8388608:8388608"],
            "api_url": f"http://127.0.0.1:{API_PORT}",
            "allowed_arch": ["x86_64", "aarch64"],
            "allowed_os": ["debian", "ubuntu"],
            # this machine's disk is far smaller than a Spark's; the fake hub's files are tiny
            "disk_need_gb": 5,
            "image_free_gb": 2,
            # the stand-in lives in /usr/local/bin (a real DGX OS has /usr/bin/nvidia-smi)
            "nvidia_smi_path": "/usr/local/bin/nvidia-smi",
            # the e2e tests watch the timer put a reset lock back: a short period keeps that wait short
            "gpu_clock_period_s": GPU_CLOCK_PERIOD_S,
            # test_long_steps.py and test_resume.py wait for a copy's or a download's third progress line
            "progress_every_s": PROGRESS_EVERY_S,
            # a veth carries ~10 Gb/s here, not a CX7 twin's ~100 (the ib_write_bw stand-in moves real bytes)
            "link_min_gbps": LINK_MIN_GBPS,
            # each ib_write_bw run 1 s, not 3: the stand-in's bytes over a veth are steady, and 2 s saved per run
            "link_measure_s": 1,
        },
    }


def write_site() -> Path:
    SITE_FILE.parent.mkdir(parents=True, exist_ok=True)
    header = "# Generated by tests/sim/sim.py for the simulated pair; regenerated on every `up`.\n"
    SITE_FILE.write_text(header + yaml.safe_dump(site_data(), sort_keys=False, default_flow_style=None))
    return SITE_FILE


def site_path() -> Path:
    return SITE_FILE


# what this machine's environment would give the head's downloads (operations/settings/sources.py): HF_ENDPOINT,
# huggingface_hub's timeouts and switches, proxies, the token
HUB_VARIABLES = ("HF_ENDPOINT", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_DOWNLOAD_TIMEOUT",
                 "HF_HUB_ETAG_TIMEOUT", "HF_XET_HIGH_PERFORMANCE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                 "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy")


def deploy_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a deploy onto the simulated pair runs with: this machine's, without what would steer the
    head's downloads away from the fake hub on its loopback (HF_ENDPOINT, a proxy) and without this machine's
    Hugging Face token (HF_TOKEN_PATH names no file, so `hf auth login`'s token is not found either); `extra`
    (a test's HF_TOKEN, a proxy it checks) on top."""
    env = {k: v for k, v in os.environ.items() if k not in HUB_VARIABLES}
    env.update(SPARKFOLD_SITE=str(SITE_FILE), PYINFRA_PROGRESS="off", HF_TOKEN_PATH=str(WORK / "no-hf-token"))
    env.update(extra or {})
    return env


# --- containers ---------------------------------------------------------------------------------------------------

def _check_role(role: str) -> None:
    if role not in ROLES:
        raise SimError(f"role must be one of {ROLES}, not {role!r}")


def _image_id(image: str) -> str:
    return _docker("image", "inspect", "-f", "{{.Id}}", image).stdout.strip()


def _startup_files_hash() -> str:
    """What a container only reads at boot (entrypoint, the units, init.d, the fake hub): a change recreates the
    pair. The stand-ins in /usr/local/bin are symlinks into the mount, so their edits apply at once."""
    digest = hashlib.sha256()
    paths = [SIM_DIR / "entrypoint.sh", *sorted((SIM_DIR / "bin").glob("*")),
             *sorted(p for p in (SIM_DIR / "systemd").rglob("*") if p.is_file()),
             *sorted((SIM_DIR / "standins" / "init.d").glob("*")),
             *sorted(p for p in (SIM_DIR / "fakehub").rglob("*") if "__pycache__" not in p.parts)]
    for path in paths:
        if path.is_file():
            digest.update(str(path.relative_to(SIM_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _layout_key() -> str:
    parts = [LAYOUT_VERSION, _image_id(IMAGE), (WORK / "engine-base.id").read_text().strip(),
             json.dumps(SSH_PORT, sort_keys=True), str(API_PORT), SIM_ROCE, str(SIM_DIR), _startup_files_hash()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _inspect(role: str) -> dict | None:
    proc = _docker("inspect", CONTAINER[role], check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)[0]


def _pid(role: str) -> int:
    info = _inspect(role)
    if not info or not info["State"]["Running"]:
        raise SimError(f"{CONTAINER[role]} is not running")
    return int(info["State"]["Pid"])


def _nsenter(role: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["nsenter", "-t", str(_pid(role)), "-n", *cmd], check=check)


def _run_container(role: str, layout: str) -> None:
    peer = "worker" if role == "head" else "head"
    ports = ["-p", f"127.0.0.1:{SSH_PORT[role]}:22"]
    if role == "head":
        ports += ["-p", f"127.0.0.1:{API_PORT}:{HEAD_API_PORT}"]
    worker_ips = ",".join(f"{net}.{HOST_OCTET['worker']}" for _, _, net in RAILS)
    _docker(
        "run", "-d", "--name", CONTAINER[role], "--hostname", role,
        "--network", NETWORK, "--network-alias", role,
        # --privileged fails on this VM (no CAP_SYS_RESOURCE); everything else a nested dockerd needs
        "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        # systemd as PID 1 (kind's node images boot the same way): it is told it runs in a container
        "-e", "container=docker", "--tmpfs", "/run/lock",
        "--tmpfs", "/run:rw,exec,nosuid,size=512m,mode=755",
        "--tmpfs", "/tmp:rw,exec,nosuid,nodev,size=4g,mode=1777",
        "-v", f"{VOLUME[role]}:/var/lib/docker",
        "-v", f"{SIM_DIR}:/opt/sim:ro",
        "-v", f"{_meminfo_path(role)}:/proc/meminfo:ro",
        "-v", f"{_meminfo_path(role).parent}:/var/lib/sim-meminfo",  # bin/sim-rank-memory rewrites the above
        "-e", f"ROLE={role}", "-e", f"SIM_PEER={peer}", "-e", f"SIM_ROCE={SIM_ROCE}",
        "-e", f"SIM_WORKER_LINK_IPS={worker_ips}",
        "--label", f"sparkfold.sim.layout={layout}", "--label", f"sparkfold.sim.role={role}",
        *ports, IMAGE,
    )


def _link_ends(rail: int) -> tuple[str, str]:
    """The veth ends of a rail while they are in the machine's namespace (before the move): one name per pair."""
    return f"sfsim{PAIR}-h{rail}", f"sfsim{PAIR}-w{rail}"


def _make_link() -> None:
    """Two veth pairs, one per PCIe twin, renamed in each namespace to the Spark's netdev names; up, no address."""
    hpid, wpid = _pid("head"), _pid("worker")
    for i, (netdev, _, _) in enumerate(RAILS):
        h, w = _link_ends(i)
        for leftover in (h, w):
            _run(["ip", "link", "del", leftover], check=False)
        _run(["ip", "link", "add", h, "type", "veth", "peer", "name", w])
        _run(["ip", "link", "set", h, "netns", str(hpid)])
        _run(["ip", "link", "set", w, "netns", str(wpid)])
        for role, tmp in (("head", h), ("worker", w)):
            # after a reboot the peer's end of the old pair goes only once the kernel has cleaned up the rebooted
            # namespace (deferred work): removed here, which ends that pair at once
            _nsenter(role, "ip", "link", "del", netdev, check=False)
            _nsenter(role, "ip", "link", "set", tmp, "name", netdev)
            _nsenter(role, "ip", "link", "set", netdev, "mtu", str(LINK_MTU))
            _nsenter(role, "ip", "link", "set", netdev, "up")
    for role in ROLES:  # sim-link.service waits for this
        _docker("exec", CONTAINER[role], "sh", "-c", "mkdir -p /run/sim && touch /run/sim/link-ready")


def _link_present(role: str) -> bool:
    proc = _nsenter(role, "ip", "-o", "link", "show", check=False)
    return proc.returncode == 0 and all(f" {nd}:" in proc.stdout or f" {nd}@" in proc.stdout for nd, _, _ in RAILS)


def _ready(role: str) -> bool:
    return _docker("exec", CONTAINER[role], "test", "-e", "/run/sim/ready", check=False).returncode == 0


def _boot_failure(role: str) -> str | None:
    """What failed while ROLE booted: the first failed unit with its journal (sim-failed@.service writes it)."""
    failed = _docker("exec", CONTAINER[role], "cat", "/run/sim/failed", check=False)
    return failed.stdout.strip() if failed.returncode == 0 and failed.stdout.strip() else None


def _wait_ready(roles: tuple[str, ...] = ROLES, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    pending = set(roles)
    while pending:
        for role in sorted(pending):
            info = _inspect(role)
            if not info or not info["State"]["Running"]:
                logs = _docker("logs", "--tail", "40", CONTAINER[role], check=False)
                raise SimError(f"{CONTAINER[role]} exited while starting:\n{logs.stdout}{logs.stderr}")
            failure = _boot_failure(role)
            if failure:
                raise SimError(f"{CONTAINER[role]} did not boot: {failure}")
            if _ready(role):
                pending.discard(role)
        if pending and time.monotonic() > deadline:
            logs = "".join(_docker("logs", "--tail", "20", CONTAINER[r], check=False).stdout for r in pending)
            raise SimError(f"not ready after {timeout:.0f} s: {sorted(pending)}\n{logs}")
        if pending:
            time.sleep(0.5)


def ssh_argv(role: str) -> list[str]:
    """ssh as the Spark's user with the test key and the sim's known_hosts (as pyinfra connects)."""
    _check_role(role)
    return ["ssh", "-i", str(KEYS / "controller"), "-p", str(SSH_PORT[role]),
            "-o", f"UserKnownHostsFile={KNOWN_HOSTS}", "-o", "StrictHostKeyChecking=yes",
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
            f"{SSH_USER}@127.0.0.1"]


def _wait_ssh(timeout: float = 60, roles: tuple[str, ...] = ROLES) -> None:
    for role in roles:
        deadline = time.monotonic() + timeout
        while True:
            proc = _run([*ssh_argv(role), "true"], check=False, timeout=30)
            if proc.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise SimError(f"ssh to {role} (127.0.0.1:{SSH_PORT[role]}) fails: {proc.stderr.strip()}")
            time.sleep(0.5)


def _running_layout(role: str) -> str | None:
    info = _inspect(role)
    if not info or not info["State"]["Running"]:
        return None
    return info["Config"]["Labels"].get("sparkfold.sim.layout")


def up(fresh: bool = False) -> Path:
    """Build (cached) and start the pair, reusing a running pair of the same layout unless fresh; the site path."""
    problems = missing_prerequisites()
    if problems:
        raise SimError("the simulated pair cannot run here:\n  - " + "\n  - ".join(problems))
    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / "build.lock", "w") as lock:  # pairs brought up at once build the shared images and keys once
        fcntl.flock(lock, fcntl.LOCK_EX)
        build()
        ensure_keys()
    layout = _layout_key()
    reusable = (not fresh and all(_running_layout(r) == layout for r in ROLES)
                and all(_link_present(r) and _ready(r) for r in ROLES))
    if reusable:
        _log("reusing the running pair")
        for role in ROLES:  # pick up stand-ins added since the start; clear a test fault a failed test left
            _docker("exec", CONTAINER[role], "/opt/sim/entrypoint.sh", "link-standins")
            _docker("exec", CONTAINER[role], "/opt/sim/bin/sim-management-fault", "clear")
    else:
        down(quiet=True)
        for role in ROLES:
            meminfo.write_json(f"{_meminfo_path(role)}.json", {"base_gib": MEM_AVAIL_GIB, **RANK_MEMORY})
            _write_meminfo(role, MEM_TOTAL_GIB, MEM_AVAIL_GIB)
        _docker("network", "create", "--subnet", NETWORK_SUBNET, NETWORK)
        for role in ROLES:
            _docker("volume", "create", VOLUME[role])
            _run_container(role, layout)
        _make_link()
        _wait_ready()
        _log("pair ready")
    _wait_ssh()
    return write_site()


def down(quiet: bool = False) -> None:
    """Remove the containers, their docker volumes, the network and any leftover link ends."""
    for role in ROLES:
        _docker("rm", "-f", "-v", CONTAINER[role], check=False)
        _docker("volume", "rm", "-f", VOLUME[role], check=False)
    _docker("network", "rm", NETWORK, check=False)
    for i in range(len(RAILS)):
        for end in _link_ends(i):
            _run(["ip", "link", "del", end], check=False)
    if not quiet:
        _log("pair removed")


def reboot(role: str, hard: bool = False) -> float:
    """Reboot ROLE as a Spark reboots: systemd stops every unit and process (the inner dockerd its containers), the
    container starts again with /run and /tmp empty, its disk and volumes kept, a new boot id, the GPU clock at its
    default and the link plugged in again; then systemd boots it (units, timers, the inner dockerd's containers per
    their restart policy). hard: a power cut (SIGKILL, nothing stopped in order). Returns the seconds it took."""
    _check_role(role)
    start = time.monotonic()
    if hard:
        _docker("kill", CONTAINER[role])
        _docker("start", CONTAINER[role])
    else:
        _docker("restart", "-t", "60", CONTAINER[role], timeout=120)
    # the rebooted namespace took both veth pairs with it: the cable is plugged in again at both ends
    _make_link()
    peer = "worker" if role == "head" else "head"
    # the peer's link came back as new netdevs: its systemd-networkd configures them again from its netplan files
    _docker("exec", CONTAINER[peer], "/opt/sim/bin/sim-link-settled")
    _wait_ready((role,))
    _wait_ssh(roles=(role,))
    return time.monotonic() - start


def status() -> dict:
    out = {}
    for role in ROLES:
        info = _inspect(role)
        running = bool(info and info["State"]["Running"])
        entry = {"container": CONTAINER[role], "running": running, "ssh": f"127.0.0.1:{SSH_PORT[role]}"}
        if running:
            entry["ready"] = _ready(role)
            entry["link"] = _link_present(role)
            entry["system"] = _docker("exec", CONTAINER[role], "systemctl", "is-system-running",
                                      check=False).stdout.strip()
            failure = _boot_failure(role)
            if failure:
                entry["failed"] = failure
        out[role] = entry
    out["site_file"] = str(SITE_FILE) if SITE_FILE.exists() else None
    return out


def link_fault(kind: str, netdev: str, role: str = "head") -> None:
    """A fault on one twin: "slow" (tc shapes ROLE's end to SLOW_RATE), "down" (its RoCE port DOWN on ROLE, as
    `rdma link` would show; the netdev still pings), "mtu1500" (ROLE's end back to a fresh Spark's MTU, as a hand
    `ip link set` leaves it; the deploy's link step sets link_mtu again), "clear" (slow and down undone)."""
    _check_role(role)
    ibdev = {nd: ib for nd, ib, _ in RAILS}.get(netdev)
    if ibdev is None or kind not in LINK_FAULTS:
        raise SimError(f"link-fault takes {'|'.join(LINK_FAULTS)} and one of {[nd for nd, _, _ in RAILS]}")
    if kind == "mtu1500":
        _nsenter(role, "ip", "link", "set", "dev", netdev, "mtu", str(LINK_MTU))
        return
    if kind == "slow":
        _nsenter(role, "tc", "qdisc", "replace", "dev", netdev, "root", "tbf", "rate", SLOW_RATE, "burst", "32kb",
                 "latency", "400ms")
    elif kind == "down":
        exec_in(role, f"mkdir -p /run/sim/roce-down && touch /run/sim/roce-down/{ibdev} && {ROCE_SYNC}", check=True)
    else:
        _nsenter(role, "tc", "qdisc", "del", "dev", netdev, "root", check=False)
        exec_in(role, f"rm -f /run/sim/roce-down/{ibdev} && {ROCE_SYNC}", check=True)
    deadline = time.monotonic() + 10
    want = "DOWN" if kind == "down" else "ACTIVE"
    while kind != "slow" and time.monotonic() < deadline:
        if want in exec_in(role, f"cat /sys/class/infiniband/{ibdev}/ports/1/state").stdout:
            return
        time.sleep(0.2)
    if kind != "slow":
        raise SimError(f"{ibdev}'s port on {role} did not become {want}")


def exec_in(role: str, cmd: str | list[str], user: str | None = None, check: bool = False,
            timeout: float | None = 300) -> subprocess.CompletedProcess:
    """Run cmd (a shell string, or an argv list) in ROLE's container; root unless user is given."""
    _check_role(role)
    argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    return _docker("exec", *(["-u", user] if user else []), CONTAINER[role], *argv, check=check, timeout=timeout)


# --- CLI ----------------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.sim.sim", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="build and start the pair (reuses a running pair)")
    p_up.add_argument("--fresh", action="store_true", help="recreate the pair even if one is running")
    sub.add_parser("down", help="remove the pair")
    sub.add_parser("status", help="print the pair's state as JSON")
    sub.add_parser("env", help="print the site file path")
    p_exec = sub.add_parser("exec", help="run a command in a container (root)")
    p_exec.add_argument("--user", "-u", default=None)
    p_exec.add_argument("role", choices=ROLES)
    p_exec.add_argument("command", nargs=argparse.REMAINDER)
    p_ssh = sub.add_parser("ssh", help="ssh in as nvidia with the test key")
    p_ssh.add_argument("role", choices=ROLES)
    p_ssh.add_argument("command", nargs=argparse.REMAINDER)
    p_mem = sub.add_parser("set-memavail", help="set MemAvailable in ROLE's /proc/meminfo")
    p_mem.add_argument("role", choices=ROLES)
    p_mem.add_argument("gib", type=float)
    p_rank = sub.add_parser("set-rank-memory", help="what a running rank holds on ROLE, and how fast")
    p_rank.add_argument("role", choices=ROLES)
    p_rank.add_argument("--gib", type=float, default=None)
    p_rank.add_argument("--load-s", type=float, default=None)
    p_rank.add_argument("--release-s", type=float, default=None)
    p_fault = sub.add_parser("link-fault", help="slow a twin (tc), take its RoCE port down, MTU 1500, or clear")
    p_fault.add_argument("kind", choices=LINK_FAULTS)
    p_fault.add_argument("netdev")
    p_fault.add_argument("--role", choices=ROLES, default="head")
    p_cma = sub.add_parser("set-cma", help="set CmaTotal in ROLE's /proc/meminfo (kB; 0: none reserved)")
    p_cma.add_argument("role", choices=ROLES)
    p_cma.add_argument("kb", type=int, nargs="?", default=meminfo.CMA_TOTAL_KB)
    p_reboot = sub.add_parser("reboot", help="reboot ROLE as a Spark reboots, and wait until it is up again")
    p_reboot.add_argument("role", choices=ROLES)
    p_reboot.add_argument("--hard", action="store_true", help="a power cut: nothing is stopped in order")
    args = parser.parse_args(argv)

    try:
        if args.cmd == "up":
            start = time.monotonic()
            path = up(fresh=args.fresh)
            _log(f"up in {time.monotonic() - start:.1f} s; site file: {path}")
            print(path)
        elif args.cmd == "down":
            down()
        elif args.cmd == "status":
            print(json.dumps(status(), indent=2))
        elif args.cmd == "env":
            if not SITE_FILE.exists():
                raise SimError("no site file yet: run `python -m tests.sim.sim up` first")
            print(SITE_FILE)
        elif args.cmd == "exec":
            if not args.command:
                parser.error("exec needs a command")
            cmd = ["docker", "exec", "-i", *(["-u", args.user] if args.user else []), CONTAINER[args.role],
                   *args.command]
            return subprocess.call(cmd)
        elif args.cmd == "ssh":
            return subprocess.call([*ssh_argv(args.role), *args.command])
        elif args.cmd == "set-memavail":
            set_memavail(args.role, args.gib)
        elif args.cmd == "set-rank-memory":
            set_rank_memory(args.role, args.gib, args.load_s, args.release_s)
        elif args.cmd == "set-cma":
            set_cma(args.role, args.kb)
        elif args.cmd == "link-fault":
            link_fault(args.kind, args.netdev, args.role)
        elif args.cmd == "reboot":
            took = reboot(args.role, hard=args.hard)
            _log(f"{args.role} rebooted and up again in {took:.1f} s")
    except SimError as exc:
        print(f"sim: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
