"""Preflight: the host facts parse real outputs; each check passes silently or fails naming problem and fix."""

import functools
import shlex
from pathlib import Path

import harness
import pytest
from harness import parse_fact, refused, run_fact, with_args
from pyinfra.context import ctx_host, ctx_state

from operations import preflight
from operations.facts.docker import DockerMemoryUse, DockerRuntimeInfo, RunningContainers, parse_size
from operations.facts.files import DiskFree, DiskSpace, PathUsage, ResolvedPaths
from operations.facts.host import HostTools, MemInfo, OsRelease, SshReachable, SudoWithoutPassword
from operations.rank.commands import MEMORY_POLL_S
from operations.util.checks import RunStopped

# the checks judged as a run judges them; test_a_problem_while_planning_is_a_warning covers --dry
run_op = functools.partial(harness.run_op, executing=True)

FIX = Path(__file__).parent / "fixtures" / "host"
GIB = 1024**3
GB = 1000**3


def fixture(name):
    return (FIX / name).read_text()


# --- facts ---------------------------------------------------------------------------------------------------

def test_os_release_dgx():
    info = parse_fact(OsRelease, fixture("os-release-dgx.txt"))
    assert info["arch"] == "aarch64" and info["id"] == "ubuntu" and info["id_like"] == ["debian"]
    assert info["pretty_name"] == "Ubuntu 24.04.3 LTS" and info["version_id"] == "24.04"


def test_meminfo_in_bytes():
    mem = parse_fact(MemInfo, fixture("meminfo-spark.txt"))
    assert mem["MemAvailable"] == 121216512 * 1024
    assert mem["MemTotal"] == 127535544 * 1024
    assert mem["HugePages_Total"] == 0


def test_docker_stats_sizes():
    use = parse_fact(DockerMemoryUse, fixture("docker-stats.txt"))
    assert use["ok"] is True
    by_name = {c["name"]: c["used_bytes"] for c in use["containers"]}
    assert by_name == {"open-webui": int(1.234 * GIB), "comfyui": int(38.5 * GIB), "redis": int(6.5 * 1024**2)}


def test_docker_stats_unreachable_and_sizes():
    assert parse_fact(DockerMemoryUse, "##DOCKER_UNREACHABLE##") == {"ok": False, "containers": []}
    assert parse_fact(DockerMemoryUse, "##NO_DOCKER##")["ok"] is False
    assert parse_size("0B") == 0 and parse_size("3.2kB") == 3200 and parse_size("junk") is None


def test_disk_free_parses_df_and_nearest_parent():
    d = parse_fact(DiskFree, fixture("df-home.txt"))
    assert d == {"measured": "/home/nvidia", "device": "/dev/nvme0n1p2", "mount": "/",
                 "free_bytes": 2417303144 * 1024}
    spaced = parse_fact(DiskFree, fixture("df-spaces.txt"))
    assert spaced["mount"] == "/mnt/big data" and spaced["free_bytes"] == 7813894044 * 1024
    assert parse_fact(DiskFree, "measured=/x") is None


def test_disk_free_command_walks_up_to_an_existing_parent(tmp_path):
    import subprocess
    cmd = DiskFree().command(str(tmp_path / "not" / "yet" / "there"))
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True).stdout
    d = parse_fact(DiskFree, out)
    assert d["measured"] == str(tmp_path) and d["free_bytes"] > 0


def test_path_usage_and_missing_path(tmp_path):
    import subprocess
    (tmp_path / "f").write_bytes(b"x" * 200_000)
    out = subprocess.run(["sh", "-c", PathUsage().command(str(tmp_path))], capture_output=True, text=True).stdout
    assert parse_fact(PathUsage, out) >= 200_000
    missing = subprocess.run(["sh", "-c", PathUsage().command(str(tmp_path / "nope"))],
                             capture_output=True, text=True).stdout
    assert parse_fact(PathUsage, missing) == 0


def test_tools_ssh():
    assert parse_fact(HostTools, "docker=yes\ngit=no\n") == {"docker": True, "git": False}
    ok = parse_fact(SshReachable, "rc=0\n")
    assert ok["ok"] is True
    bad = parse_fact(SshReachable, "rc=255\nnvidia@spark-2: Permission denied (publickey).")
    assert bad == {"ok": False, "rc": 255, "detail": "nvidia@spark-2: Permission denied (publickey)."}


# --- operations ----------------------------------------------------------------------------------------------

def test_platform_passes_on_dgx_os():
    cmds, h = run_op(preflight.platform_supported, {OsRelease: parse_fact(OsRelease, fixture("os-release-dgx.txt"))})
    assert cmds == [] and h.noops


def test_platform_fails_on_x86_debian_unless_allowed():
    sim = parse_fact(OsRelease, fixture("os-release-sim.txt"))
    cmds, _ = run_op(preflight.platform_supported, {OsRelease: sim})
    assert len(cmds) == 1 and "x86_64" in cmds[0] and "exit 1" in cmds[0]
    cmds, _ = run_op(preflight.platform_supported, {OsRelease: sim}, allowed_arch=["x86_64"])
    assert "Debian GNU/Linux 12" in cmds[0] and "allowed_os setting" in cmds[0]
    cmds, _ = run_op(preflight.platform_supported, {OsRelease: sim}, allowed_arch=["x86_64"],
                     allowed_os_ids=["debian"])
    assert cmds == []


def _mem(avail_gib, total_gib=121.7):
    return {"MemAvailable": int(avail_gib * GIB), "MemTotal": int(total_gib * GIB)}


def test_memory_enough_is_silent_and_asks_no_container_its_use():
    facts = {MemInfo: _mem(115.6), RunningContainers: {"comfyui": False}}  # no DockerMemoryUse: not read
    cmds, h = run_op(preflight.memory_available, facts, min_avail_gib=112, every=10)
    assert cmds == [] and h.noops == ["enough memory available"]


def test_memory_short_while_executing_waits_for_memory_coming_back_before_refusing():
    # ranks stopped a moment ago (rank 0 exits when rank 1 dies) give ~98 GiB back over seconds
    facts = {MemInfo: _mem(46.0), RunningContainers: {}, DockerMemoryUse: {"ok": True, "containers": []}}
    cmds, _ = run_op(preflight.memory_available, facts, executing=True, min_avail_gib=112, every=10)
    assert len(cmds) == 1 and "MemAvailable" in cmds[0] and f"sleep {MEMORY_POLL_S}" in cmds[0]
    assert f"-ge {112 * 1024 * 1024}" in cmds[0] and "only 46.0 GiB MemAvailable, need 112 GiB" in cmds[0]
    assert f"i -ge {30 // MEMORY_POLL_S}" in cmds[0]  # about 30 s, then the refusal with the numbers
    planned, _ = run_op(preflight.memory_available, facts, executing=False, min_avail_gib=112, every=10)
    assert "sleep" not in " ".join(planned)  # planning only warns


def test_memory_short_names_the_containers():
    facts = {MemInfo: _mem(80.0), RunningContainers: {"comfyui": False, "open-webui": False},
             DockerMemoryUse: parse_fact(DockerMemoryUse, fixture("docker-stats.txt"))}
    cmds, _ = run_op(preflight.memory_available, facts, min_avail_gib=112, every=10)
    assert len(cmds) == 1
    msg = cmds[0]
    assert "only 80.0 GiB MemAvailable, need 112 GiB" in msg and "41.7 GiB of 121.7 GiB is in use" in msg
    assert msg.index("comfyui 38.5 GiB") < msg.index("open-webui 1.2 GiB")  # biggest first
    assert "docker stop" in msg


def test_memory_check_stands_aside_while_our_rank_runs():
    cmds, h = run_op(preflight.memory_available, {MemInfo: _mem(9.0), RunningContainers: {"dsv41-1017-exl3-tf": True}},
                     min_avail_gib=112, every=10, own_containers=["dsv41-1017-exl3-tf"])
    assert cmds == [] and "dsv41-1017-exl3-tf is running" in h.noops[0]


RANK = "dsv41-1017-exl3-tf"



def facts20(use) -> dict:
    """20 GiB available, `use` from docker stats, and docker ps showing the same containers."""
    return {MemInfo: _mem(20.0), DockerMemoryUse: use, RunningContainers: {c["name"]: False for c in use["containers"]}}


def test_a_restart_counts_our_ranks_memory_as_coming_back():
    # our rank holds 98 GiB in driver allocations (docker stats sees 2): a restart frees it before the start
    use = {"ok": True, "containers": [{"name": RANK, "used_bytes": 2 * GIB, "usage": ""}]}
    cmds, h = run_op(preflight.memory_available, facts20(use),
                     min_avail_gib=112, every=10, own_containers=[RANK], restart=True)
    assert cmds == [] and f"once {RANK} stops" in h.noops[0]


def test_a_restart_is_refused_when_other_containers_keep_too_much_after_our_rank_stops():
    use = {"ok": True, "containers": [{"name": RANK, "used_bytes": 2 * GIB, "usage": ""},
                                      {"name": "comfyui", "used_bytes": 30 * GIB, "usage": ""}]}
    cmds, _ = run_op(preflight.memory_available, facts20(use),
                     min_avail_gib=112, every=10, own_containers=[RANK], restart=True)
    assert len(cmds) == 1 and "only 91.7 GiB MemAvailable, need 112 GiB" in cmds[0] and "comfyui 30.0 GiB" in cmds[0]
    assert cmds[0].startswith("echo 'sparkfold: memory: ")  # at once: our rank's stop, later, frees no more
    # the same Spark without a restart: the rank keeps its memory, nothing starts, nothing to refuse
    cmds, _ = run_op(preflight.memory_available, facts20(use),
                     min_avail_gib=112, every=10, own_containers=[RANK], restart=False)
    assert cmds == []


def test_a_restart_without_our_rank_running_counts_nothing_extra():
    use = {"ok": True, "containers": []}
    cmds, _ = run_op(preflight.memory_available, facts20(use),
                     min_avail_gib=112, every=10, own_containers=[RANK], restart=True)
    assert len(cmds) == 1 and "only 20.0 GiB MemAvailable" in cmds[0]


def test_counted_meminfo_never_lowers_what_is_available():
    mem = _mem(100.0)
    counted = preflight.counted_meminfo(mem, {"ok": False, "containers": []}, [RANK])
    assert counted["MemAvailable"] == _mem(121.7)["MemAvailable"]
    # other containers' figures from docker stats can exceed what the kernel says is used; keep the reading then
    counted = preflight.counted_meminfo(mem, {"ok": True, "containers": [
        {"name": "big", "used_bytes": 60 * GIB, "usage": ""}]}, [RANK])
    assert counted["MemAvailable"] == mem["MemAvailable"]


def _df(mount, free_gb, device="/dev/nvme0n1p2"):
    return {"measured": mount, "device": device, "mount": mount, "free_bytes": int(free_gb * GB)}


DISK_ARGS = dict(need_gb=505, data_paths=["/home/nvidia/.cache/huggingface", "/home/nvidia/.cache/sparkfold"],
                 image_gb=35, held_paths=["/home/nvidia/.cache/sparkfold", "/hf/models--a--b"])


def _disk_facts(hf, data, docker, root="/var/lib/docker", usage=0, asked_root=None):
    """The one DiskSpace read (data paths, then the docker root) and docker info; asked_root: what docker says."""
    paths = (*DISK_ARGS["data_paths"], root)
    key = f"held={tuple(DISK_ARGS['held_paths'])}, paths={paths}, resolve=()"
    info = {"reachable": True, "default_runtime": "nvidia", "runtimes": ["nvidia", "runc"],
            "root_dir": root if asked_root is None else asked_root}
    return {DiskSpace: with_args({key: {"free": [hf, data, docker], "held": usage}}), DockerRuntimeInfo: info}


def test_disk_same_filesystem_sums_data_and_image():
    root = _df("/", 530)  # 505 + 35 = 540 needed
    cmds, _ = run_op(preflight.disk_free, _disk_facts(root, root, root), **DISK_ARGS)
    assert len(cmds) == 1 and "need 540 GB" in cmds[0] and "have 530 GB" in cmds[0]
    root = _df("/", 545)
    cmds, _ = run_op(preflight.disk_free, _disk_facts(root, root, root), **DISK_ARGS)
    assert cmds == []


def test_disk_separate_docker_filesystem_is_checked_alone():
    data = _df("/", 510)
    docker = _df("/var/lib/docker", 20, "/dev/sdb1")
    cmds, _ = run_op(preflight.disk_free, _disk_facts(data, data, docker), **DISK_ARGS)
    assert len(cmds) == 1 and "under the Docker root dir /var/lib/docker" in cmds[0] and "need 35 GB" in cmds[0]
    assert "for the data" not in cmds[0]


def test_disk_counts_what_is_already_held():
    root = _df("/", 100)  # a converged head: the data is already there
    cmds, _ = run_op(preflight.disk_free, _disk_facts(root, root, root, usage=460 * GB), **DISK_ARGS)
    assert cmds == []
    cmds, _ = run_op(preflight.disk_free, _disk_facts(root, root, root, usage=300 * GB), **DISK_ARGS)
    assert "need 240 GB" in cmds[0] and "300 GB of it already held" in cmds[0]


def test_disk_uses_default_docker_root_when_docker_cannot_be_asked():
    root = _df("/", 900)
    cmds, h = run_op(preflight.disk_free, _disk_facts(root, root, root, asked_root=""), **DISK_ARGS)
    assert cmds == []
    assert [n.rsplit(".", 1)[1] for n, _ in h.fact_calls] == ["DockerRuntimeInfo", "DiskSpace"]  # two round trips
    assert h.fact_calls[1][1]["paths"][-1] == "/var/lib/docker"
    cmds, h = run_op(preflight.disk_free, _disk_facts(root, root, root, root="/data/docker"), **DISK_ARGS)
    assert cmds == [] and h.fact_calls[1][1]["paths"][-1] == "/data/docker"  # docker's own root dir is measured


def test_disk_names_a_path_df_cannot_measure():
    root = _df("/", 900)
    cmds, _ = run_op(preflight.disk_free, _disk_facts(root, None, root), executing=True, **DISK_ARGS)
    assert len(cmds) == 1 and "cannot measure free disk at /home/nvidia/.cache/sparkfold" in cmds[0]


def test_disk_space_fact_measures_every_path_at_once(tmp_path):
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "blob").write_bytes(b"x" * 300_000)
    got = run_fact(DiskSpace, paths=(str(tmp_path / "not" / "yet"), str(tmp_path)),
                   held=(str(tmp_path / "held"), str(tmp_path / "nope")))
    assert [d["measured"] for d in got["free"]] == [str(tmp_path), str(tmp_path)]
    assert all(d["free_bytes"] > 0 for d in got["free"]) and got["held"] >= 300_000
    assert got["real"] == {}  # nothing asked to resolve


def test_disk_space_fact_also_says_where_paths_lead(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    got = run_fact(DiskSpace, paths=(str(tmp_path),), held=(str(tmp_path / "real"),),
                   resolve=(str(tmp_path / "link" / "state"), str(tmp_path / "plain")))
    assert got["real"] == {str(tmp_path / "link" / "state"): str(tmp_path / "real" / "state"),
                           str(tmp_path / "plain"): str(tmp_path / "plain")}
    assert [d["measured"] for d in got["free"]] == [str(tmp_path)] and got["held"] >= 0
    assert parse_fact(DiskSpace, "#REAL\n/a\t/b\n#FREE\nmeasured=/\n#HELD\n4 /x\n") == {
        "free": [None], "held": 4096, "real": {"/a": "/b"}}
    assert parse_fact(DiskSpace, "") == {"free": [], "held": 0, "real": {}}


def test_tools_missing_and_installed_later():
    facts = {HostTools: {"docker": False, "git": True, "python3": True, "rsync": False}}
    cmds, _ = run_op(preflight.tools_present, facts, installed_later=["docker"])
    assert len(cmds) == 1 and "missing on this Spark: rsync" in cmds[0] and "apt-get install rsync" in cmds[0]
    cmds, _ = run_op(preflight.tools_present, facts)
    assert "docker, rsync" in cmds[0]
    facts = {HostTools: {"docker": True, "git": True, "python3": True, "rsync": True}}
    assert run_op(preflight.tools_present, facts)[0] == []
    with pytest.raises(RunStopped, match="tools_present cannot check"):
        run_op(preflight.tools_present, facts, required=["hf"])


def test_peer_reachable_both_ways():
    key = "target=nvidia@spark-2"
    ok = {SshReachable: with_args({key: {"ok": True, "rc": 0, "detail": ""}})}
    assert run_op(preflight.peer_reachable, ok, target="nvidia@spark-2")[0] == []
    bad = {SshReachable: with_args({key: {"ok": False, "rc": 255, "detail": "Permission denied (publickey)."}})}
    cmds, _ = run_op(preflight.peer_reachable, bad, target="nvidia@spark-2")
    assert "rc 255: Permission denied" in cmds[0] and "ssh-copy-id nvidia@spark-2" in cmds[0]


def test_ssh_fact_command_is_batch_mode_with_timeout():
    cmd = SshReachable().command("nvidia@spark-2")
    assert "ssh -o BatchMode=yes -o ConnectTimeout=10 nvidia@spark-2 true" in cmd


def test_preflight_passes_settings(monkeypatch):
    from settings_factory import make_settings
    calls = []
    for name in ("sudo_without_password", "platform_supported", "paths_placed", "memory_available", "disk_free",
                 "tools_present", "peer_reachable"):
        monkeypatch.setattr(preflight, name, lambda _n=name, **kw: calls.append((_n, kw)))
    monkeypatch.setattr(preflight, "peer_host", lambda s: f"the host of {s.the_peer.role}")
    preflight.preflight._inner(make_settings("head"))
    got = dict(calls)
    assert calls[0] == ("sudo_without_password", {"name": "sudo without a password", "user": "nvidia",
                                                  "peer": "the host of worker", "peer_user": "nvidia"})
    assert got["paths_placed"]["paths"]["hub"] == "/home/nvidia/.cache/huggingface/hub"
    # the two ask one question together: each is given the other's folders
    assert got["disk_free"]["placed"] == got["paths_placed"]["paths"]
    assert {k: got["paths_placed"][k] for k in ("data_paths", "held_paths")} == {
        k: got["disk_free"][k] for k in ("data_paths", "held_paths")}
    assert got["platform_supported"]["allowed_arch"] == ["aarch64"]
    assert got["memory_available"]["own_containers"] == ["dsv41-1017-exl3-tf"]
    assert got["memory_available"]["restart"] is False
    assert got["disk_free"]["need_gb"] == 505 and got["disk_free"]["data_paths"][0].endswith("/huggingface")
    assert any(p.endswith("hub/models--Mia-AiLab--DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1-2.9-bpw")
               for p in got["disk_free"]["held_paths"])
    assert got["peer_reachable"]["target"]
    calls.clear()
    preflight.preflight._inner(make_settings("worker"))
    assert "peer_reachable" not in dict(calls) and dict(calls)["sudo_without_password"]["peer"] is None


def test_a_problem_while_planning_is_a_warning_naming_the_spark_check_and_fix(caplog):
    facts = {MemInfo: _mem(40.0), RunningContainers: {}, DockerMemoryUse: {"ok": True, "containers": []}}
    with caplog.at_level("WARNING", logger="pyinfra"):
        cmds, _ = harness.run_op(preflight.memory_available, facts, executing=False, min_avail_gib=112, every=10)
    assert cmds == []  # --dry changes nothing and exits 0
    assert any("spark: will fail: memory: only 40.0 GiB MemAvailable, need 112 GiB" in r.getMessage()
               for r in caplog.records), caplog.text
    cmds, _ = run_op(preflight.memory_available, facts, min_avail_gib=112, every=10)
    assert len(cmds) == 1 and "exit 1" in cmds[0] and "only 40.0 GiB MemAvailable" in cmds[0]


# --- sudo without a password ---------------------------------------------------------------------------------

SUDO_LINE = ("run `sudo visudo -f /etc/sudoers.d/sparkfold`, add the line `nvidia ALL=(ALL) NOPASSWD: ALL` and save "
             "(visudo refuses a broken line, which would stop sudo altogether)")


def test_the_sudo_fact_asks_sudo_without_a_prompt_and_keeps_its_answer():
    assert SudoWithoutPassword().command() == (
        "out=$(sudo -n true 2>&1 </dev/null); rc=$?; echo \"rc=$rc\"; printf '%s\\n' \"$out\" | tail -n 3")
    assert parse_fact(SudoWithoutPassword, "rc=1\nsudo: a password is required\n") == {
        "ok": False, "rc": 1, "detail": "sudo: a password is required"}
    assert parse_fact(SudoWithoutPassword, "rc=0\n")["ok"] is True


def test_sudo_without_a_password_passes_quietly():
    cmds, spark = run_op(preflight.sudo_without_password, {SudoWithoutPassword: {"ok": True, "rc": 0, "detail": ""}},
                         user="nvidia")
    assert cmds == [] and spark.noops == ["nvidia uses sudo without a password"]


@pytest.mark.parametrize("executing", [False, True])
def test_sudo_that_asks_for_a_password_stops_the_plan_with_the_sudoers_line(executing):
    facts = {SudoWithoutPassword: {"ok": False, "rc": 1, "detail": "sudo: a password is required"}}
    with pytest.raises(RunStopped) as exc:
        harness.run_op(preflight.sudo_without_password, facts, executing=executing, user="nvidia")
    assert str(exc.value) == (
        "spark: sudo: nvidia cannot use sudo without a password (`sudo -n true` gave rc 1: sudo: a password is "
        "required); every step after the preflight runs as root through sudo, which must not ask. Fix: on this "
        f"Spark, {SUDO_LINE}")


def test_a_spark_without_sudo_is_told_to_install_it_first():
    facts = {SudoWithoutPassword: {"ok": False, "rc": 127, "detail": "sh: 1: sudo: not found"}}
    with pytest.raises(RunStopped) as exc:
        run_op(preflight.sudo_without_password, facts, user="nvidia")
    assert str(exc.value) == (
        "spark: sudo: sudo is not installed on this Spark (`sudo -n true` gave rc 127: sh: 1: sudo: not found); "
        "every step after the preflight runs as root through sudo. Fix: as root, apt-get install sudo; then, as "
        f"nvidia, {SUDO_LINE}")


def test_the_head_asks_for_the_worker_too_whose_facts_its_plan_reads_as_root():
    worked = {"ok": True, "rc": 0, "detail": ""}
    worker = harness.FakeHost({SudoWithoutPassword: {"ok": False, "rc": 1, "detail": "sudo: a password is required"}},
                              name="spark-b")
    with pytest.raises(RunStopped) as exc:
        run_op(preflight.sudo_without_password, {SudoWithoutPassword: worked}, user="nvidia", peer=worker,
               peer_user="dgx")
    assert str(exc.value).startswith("spark-b: sudo: dgx cannot use sudo without a password (`sudo -n true` gave rc 1")
    assert str(exc.value).endswith("add the line `dgx ALL=(ALL) NOPASSWD: ALL` and save (visudo refuses a broken "
                                   "line, which would stop sudo altogether)")
    worker = harness.FakeHost({SudoWithoutPassword: worked}, name="spark-b")
    cmds, head = run_op(preflight.sudo_without_password, {SudoWithoutPassword: worked}, user="nvidia", peer=worker,
                        peer_user="dgx")
    assert cmds == [] and head.noops == ["nvidia uses sudo without a password, and dgx on spark-b"]


def test_a_run_given_a_sudo_password_goes_on():
    spark = harness.FakeHost({SudoWithoutPassword: {"ok": False, "rc": 1, "detail": "sudo: a password is required"}})
    spark.current_op_global_arguments = {"_sudo_password": "pw"}  # pyinfra's --same-sudo-password
    with ctx_state.use(harness._State(False)), ctx_host.use(spark):
        assert list(preflight.sudo_without_password._inner(user="nvidia")) == []
    assert spark.noops == ["sudo asks spark for the password this run was given"]


# --- where the folders lead, symlinks followed ----------------------------------------------------------------

def placed(**changes) -> dict[str, str]:
    from settings_factory import make_settings

    from operations.settings import placed_paths
    return placed_paths(make_settings("head", hf_cache="/srv/hf", data_dir="/srv/sf/data", state_dir="/srv/sf/state",
                                      **changes))


def resolved_fact(paths: dict[str, str], leads: dict[str, str]) -> dict:
    """The DiskSpace fact as a Spark answers paths_placed (asked alone: the docker root dir's free disk besides):
    each path where it leads (`leads` overrides, else itself)."""
    asked = tuple(sorted(set(paths.values())))
    answer = {"free": [_df("/", 900)], "held": 0, "real": {p: leads.get(p, p) for p in asked}}
    return {DiskSpace: with_args({f"held=(), paths=('/var/lib/docker',), resolve={asked}": answer}),
            DockerRuntimeInfo: {"root_dir": "/var/lib/docker"}}


def test_the_resolved_paths_fact_follows_symlinks_and_takes_missing_parts_as_written(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    got = run_fact(ResolvedPaths, paths=(str(tmp_path / "link" / "not" / "yet"), str(tmp_path / "x" / ".." / "y")))
    assert got == {str(tmp_path / "link" / "not" / "yet"): str(tmp_path / "real" / "not" / "yet"),
                   str(tmp_path / "x" / ".." / "y"): str(tmp_path / "y")}
    assert parse_fact(ResolvedPaths, "/a\t/b\nnoise\n/c\trelative\n") == {"/a": "/b"}
    assert run_fact(ResolvedPaths, paths=("/", "")) == {"/": "/"}  # realpath fails on "": left out, exit 0


def test_folders_that_lead_where_their_text_says_pass():
    paths = placed()
    cmds, spark = run_op(preflight.paths_placed, resolved_fact(paths, {}), paths=paths)
    assert cmds == [] and spark.noops == ["the folders and files lead where the settings say"]


def test_a_state_folder_that_a_symlink_leads_into_the_exported_hub_is_refused(caplog):
    paths = placed()  # the text passes: /srv/sf/state is not below /srv/hf/hub
    facts = resolved_fact(paths, {"/srv/sf/state": "/home/nvidia/.cache/huggingface/hub/state",
                                  "/srv/hf/hub": "/home/nvidia/.cache/huggingface/hub"})
    command, warnings = refused(caplog, preflight.paths_placed, facts, paths=paths)
    line = ("where the folders lead: state_dir = '/srv/sf/state' resolves to "
            "/home/nvidia/.cache/huggingface/hub/state on this Spark (symlinks followed), inside hf_cache's hub folder "
            "/home/nvidia/.cache/huggingface/hub, which the head exports over NFS (its hf token and API key folder "
            "would be exported): point state_dir at a folder outside /home/nvidia/.cache/huggingface/hub, or hf_cache "
            "elsewhere (`realpath -m /srv/sf/state /srv/hf/hub` on the Spark shows where each leads)")
    assert warnings == f"spark: will fail: {line}"
    assert shlex.split(command)[:2] == ["echo", f"sparkfold: {line}"]  # what a run fails with


def test_a_hub_that_a_symlink_leads_over_the_data_folder_is_refused():
    from operations.settings import resolved_path_problems
    paths = placed()
    assert resolved_path_problems(paths, {**paths, "hub": "/srv/sf"}) == [
        "state_dir = '/srv/sf/state' resolves to /srv/sf/state on this Spark (symlinks followed), inside hf_cache's "
        "hub folder /srv/sf, which the head exports over NFS (its hf token and API key folder would be exported): "
        "point state_dir at a folder outside /srv/sf, or hf_cache elsewhere (`realpath -m /srv/sf/state /srv/hf/hub` "
        "on the Spark shows where each leads)",
        "data_dir = '/srv/sf/data' resolves to /srv/sf/data on this Spark (symlinks followed), inside hf_cache's hub "
        "folder /srv/sf, which the head exports over NFS (its hf token and API key folder would be exported): point "
        "data_dir at a folder outside /srv/sf, or hf_cache elsewhere (`realpath -m /srv/sf/data /srv/hf/hub` on the "
        "Spark shows where each leads)"]


def test_a_data_folder_that_resolves_to_root_is_refused():
    from operations.settings import resolved_path_problems
    paths = placed()
    assert resolved_path_problems(paths, {**paths, "data_dir": "/"}) == [
        "data_dir = '/srv/sf/data' resolves to / on this Spark (symlinks followed): sparkfold writes below data_dir, "
        "so it must be a folder of its own; point data_dir at one (`realpath -m /srv/sf/data` on the Spark shows "
        "where it leads)"]


def test_an_owned_file_that_is_a_symlink_to_elsewhere_is_refused_but_a_moved_folder_is_fine():
    from operations.settings import resolved_path_problems
    paths = placed()
    netplan = paths["link_netplan_file"]
    assert resolved_path_problems(paths, {**paths, "link_netplan_file": "/home/nvidia/net.yaml"}) == [
        f"link_netplan_file = {netplan!r} leads to /home/nvidia/net.yaml on this Spark (a symlink): sparkfold owns "
        "that file and writes it in /etc/netplan/ itself, never through a symlink to elsewhere; remove the symlink, "
        "or set link_netplan_file to a free name in /etc/netplan/"]
    moved = {**paths, "link_netplan_file": "/lib/netplan/" + netplan.rsplit("/", 1)[1],
             "link_netplan_file folder": "/lib/netplan"}
    assert resolved_path_problems(paths, moved) == []


def _paths_placed_here(paths: dict[str, str], root: str) -> list[str]:
    """paths_placed in a run on this machine: its facts read by a local shell (Docker root dir `root` given)."""

    class Here(harness.FakeHost):
        def get_fact(self, cls, *args, **kwargs):
            return run_fact(cls, **{k: v for k, v in kwargs.items() if not k.startswith("_")})

    with ctx_state.use(harness._State(True)), ctx_host.use(Here({})):
        return [harness._render(c) for c in preflight.paths_placed._inner(paths=paths, docker_root=root)]


def test_the_folders_are_followed_on_the_spark_itself(tmp_path):
    """The round trip shared with disk_free still follows symlinks: a state folder led into the hub is refused, a
    plain layout passes."""
    (tmp_path / "hf" / "hub").mkdir(parents=True)
    plain = {"hf_cache": f"{tmp_path}/hf", "hub": f"{tmp_path}/hf/hub", "data_dir": f"{tmp_path}/sf/data",
             "state_dir": f"{tmp_path}/sf/state"}  # placed_paths' root folders and hub
    assert _paths_placed_here(plain, str(tmp_path)) == []
    (tmp_path / "elsewhere").symlink_to(tmp_path / "hf" / "hub")
    linked = {**plain, "state_dir": str(tmp_path / "elsewhere" / "state")}
    commands = _paths_placed_here(linked, str(tmp_path))
    assert len(commands) == 1 and commands[0].endswith("exit 1")
    assert shlex.split(commands[0])[1].startswith(
        f"sparkfold: where the folders lead: state_dir = '{tmp_path}/elsewhere/state' resolves to "
        f"{tmp_path}/hf/hub/state on this Spark (symlinks followed), inside hf_cache's hub folder {tmp_path}/hf/hub")


def test_the_placed_folders_and_free_disk_are_read_in_one_round_trip():
    """paths_placed asks disk_free's question too, and disk_free takes that answer (no operation changed a Spark
    between them): one DiskSpace and one docker info per Spark."""
    paths = placed()
    asked = {"held": tuple(DISK_ARGS["held_paths"]), "paths": (*DISK_ARGS["data_paths"], "/var/lib/docker"),
             "resolve": tuple(sorted(set(paths.values())))}
    root = _df("/", 900)
    answer = {"free": [root, root, root], "held": 0, "real": {p: p for p in paths.values()}}
    facts = {DiskSpace: with_args({harness._kwargs_key(asked): answer}),
             DockerRuntimeInfo: {"root_dir": "/var/lib/docker"}}
    spark = harness.FakeHost(facts)
    with ctx_state.use(harness._State(True)), ctx_host.use(spark):
        assert list(preflight.paths_placed._inner(paths=paths, data_paths=DISK_ARGS["data_paths"],
                                                  held_paths=DISK_ARGS["held_paths"])) == []
        assert list(preflight.disk_free._inner(placed=paths, **{**DISK_ARGS, "need_gb": 1})) == []
    assert [n.rsplit(".", 1)[1] for n, _ in spark.fact_calls] == ["DockerRuntimeInfo", "DiskSpace"]
    assert spark.noops == ["the folders and files lead where the settings say", "enough free disk"]


def test_a_path_the_spark_could_not_resolve_is_not_judged():
    from operations.settings import resolved_path_problems
    only_data = resolved_path_problems(placed(), {"data_dir": "/"})  # nothing else answered
    assert [p.split(" on this Spark")[0] for p in only_data] == ["data_dir = '/srv/sf/data' resolves to /"]
    assert resolved_path_problems(placed(), {}) == []
