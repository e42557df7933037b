"""NFS: the export file and table on the head, the docker volume on the worker."""

from __future__ import annotations

import subprocess
import types
from pathlib import Path

from harness import parse_fact, run_op, with_args

from operations import nfs
from operations.facts.nfs import DebInstalled, DockerVolumeInfo, ExportTable, FileContent, ServiceState, VolumeContainers
from operations.util import MANAGED_HEADER

FIX = Path(__file__).parent / "fixtures" / "nfs"
CACHE = "/home/nvidia/.cache/huggingface"
EXPORTS = "/etc/exports.d/sparkfold.exports"
CLIENTS = ["192.168.100.2", "192.168.101.2"]
OPTIONS = "nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600"


def fixture(name):
    return (FIX / name).read_text()


def run_sh(command) -> list[str]:
    return subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True,
                          check=True).stdout.splitlines()


# --- facts --------------------------------------------------------------------------------------------------

def test_export_table_parses_exportfs_v():
    table = parse_fact(ExportTable, fixture("exportfs-v.txt"))
    assert [(e["path"], e["client"]) for e in table] == [
        ("/srv/share", "10.0.0.0/24"), (CACHE, "192.168.100.2"), (CACHE, "192.168.101.2"),
        ("/data/my models", "<world>")]
    assert "ro" in table[1]["options"] and "rw" in table[0]["options"]
    assert parse_fact(ExportTable, "") == []


def test_file_text_exact_content_and_absence(tmp_path):
    path = tmp_path / "x.exports"
    fact = FileContent()
    assert fact.process(run_sh(fact.command(path=str(path)))) is None
    path.write_text("a\n\nb\n")
    assert fact.process(run_sh(fact.command(path=str(path)))) == "a\n\nb\n"


def test_deb_installed_and_service_state():
    assert parse_fact(DebInstalled, "install ok installed") is True
    assert parse_fact(DebInstalled, "deinstall ok config-files") is False
    assert parse_fact(DebInstalled, "") is False
    assert parse_fact(ServiceState, "active=active\nenabled=enabled") == {"active": "active", "enabled": "enabled"}
    assert parse_fact(ServiceState, "active=inactive\nenabled=") == {"active": "inactive", "enabled": ""}
    state = ServiceState()
    assert state.process(run_sh(state.command(service="sparkfold-no-such-unit"))) in (
        {"active": "", "enabled": ""}, {"active": "inactive", "enabled": ""}, {"active": "unknown", "enabled": ""})


def test_docker_volume_facts():
    volume = parse_fact(DockerVolumeInfo, fixture("volume-managed.json"))
    assert volume["Options"]["device"] == ":" + CACHE and volume["Labels"] == {"sparkfold.managed": "1"}
    assert parse_fact(DockerVolumeInfo, "[]") is None
    assert parse_fact(VolumeContainers, "dsv41-1017-exl3-tf\nmy-notebook\n") == ["dsv41-1017-exl3-tf", "my-notebook"]
    assert "--filter volume=sparkfold-hf" in VolumeContainers().command(volume="sparkfold-hf").get_raw_value()


# --- head ---------------------------------------------------------------------------------------------------

def test_rendered_exports_lines():
    text = nfs.render_exports(CACHE, CLIENTS)
    assert text.splitlines()[0] == MANAGED_HEADER
    assert [l for l in text.splitlines() if not l.startswith("#")] == [
        f"{CACHE} 192.168.100.2(ro,no_subtree_check)", f"{CACHE} 192.168.101.2(ro,no_subtree_check)"]
    assert nfs.render_exports("/data/my models", ["10.0.0.2"]).splitlines()[-1] == \
        '"/data/my models" 10.0.0.2(ro,no_subtree_check)'


def export_facts(current, table):
    return {FileContent: with_args({f"path={EXPORTS}": current}), ExportTable: table}


def test_export_written_and_reloaded_when_missing():
    commands, _ = run_op(nfs.nfs_exported, export_facts(None, []), path=CACHE, clients=CLIENTS, exports_file=EXPORTS)
    assert len(commands) == 2
    assert "mkdir -p /etc/exports.d" in commands[0] and f"{CACHE} 192.168.101.2(ro,no_subtree_check)" in commands[0]
    assert "chmod 644" in commands[0]
    assert commands[1] == "exportfs -ra"


def test_export_converged_yields_nothing():
    table = parse_fact(ExportTable, fixture("exportfs-v.txt"))
    commands, host = run_op(nfs.nfs_exported, export_facts(nfs.render_exports(CACHE, CLIENTS), table),
                            path=CACHE, clients=CLIENTS, exports_file=EXPORTS)
    assert commands == [] and host.noops


def test_export_reloaded_when_the_live_table_lacks_a_client():
    table = [e for e in parse_fact(ExportTable, fixture("exportfs-v.txt")) if e["client"] != "192.168.101.2"]
    commands, _ = run_op(nfs.nfs_exported, export_facts(nfs.render_exports(CACHE, CLIENTS), table),
                         path=CACHE, clients=CLIENTS, exports_file=EXPORTS)
    assert commands == ["exportfs -ra"]


def test_export_rewritten_when_the_worker_address_changes():
    table = parse_fact(ExportTable, fixture("exportfs-v.txt"))
    commands, _ = run_op(nfs.nfs_exported, export_facts(nfs.render_exports(CACHE, CLIENTS), table),
                         path=CACHE, clients=["192.168.100.3"], exports_file=EXPORTS)
    assert "192.168.100.3(ro,no_subtree_check)" in commands[0] and commands[-1] == "exportfs -ra"


def test_server_package_and_service():
    commands, _ = run_op(nfs.nfs_server_installed, {DebInstalled: with_args({"package=nfs-kernel-server": False})})
    assert commands == ["apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y nfs-kernel-server"]
    commands, _ = run_op(nfs.nfs_server_installed, {DebInstalled: with_args({"package=nfs-kernel-server": True})})
    assert commands == []
    running = {"active": "active", "enabled": "enabled"}
    assert run_op(nfs.nfs_server_running, {ServiceState: with_args({"service=nfs-server": running})})[0] == []
    stopped = {"active": "inactive", "enabled": "disabled"}
    commands, _ = run_op(nfs.nfs_server_running, {ServiceState: with_args({"service=nfs-server": stopped})})
    assert commands == ["systemctl enable --now nfs-server"]


# --- worker -------------------------------------------------------------------------------------------------

def volume_facts(volume, users=()):
    return {DockerVolumeInfo: with_args({"volume=sparkfold-hf": volume}),
            VolumeContainers: with_args({"volume=sparkfold-hf": list(users)})}


def run_volume(volume, users=(), server_ip="192.168.100.1"):
    return run_op(nfs.nfs_volume, volume_facts(volume, users), executing=True, volume="sparkfold-hf",
                  server_ip=server_ip, export_path=CACHE, options=OPTIONS)[0]


CREATE = ("docker volume create --driver local --opt type=nfs "
          f"--opt o=addr=192.168.100.1,{OPTIONS} --opt device=:{CACHE} --label sparkfold.managed=1 sparkfold-hf")


def test_volume_created_when_absent():
    assert run_volume(None) == [CREATE]


def test_volume_converged():
    assert run_volume(parse_fact(DockerVolumeInfo, fixture("volume-managed.json"))) == []


def test_volume_recreated_when_options_differ_and_unused():
    volume = parse_fact(DockerVolumeInfo, fixture("volume-managed.json"))
    commands = run_volume(volume, server_ip="192.168.101.1")
    assert commands == ["docker volume rm sparkfold-hf", CREATE.replace("addr=192.168.100.1", "addr=192.168.101.1")]


def test_volume_in_use_is_not_touched():
    volume = parse_fact(DockerVolumeInfo, fixture("volume-managed.json"))
    commands = run_volume(volume, users=["dsv41-1017-exl3-tf"], server_ip="192.168.101.1")
    assert len(commands) == 1 and "exit 1" in commands[0]
    assert "container(s) dsv41-1017-exl3-tf use it" in commands[0] and "docker rm -f dsv41-1017-exl3-tf" in commands[0]
    assert "volume rm" not in commands[0].split("sparkfold:")[0]


def test_foreign_volume_is_never_removed():
    commands = run_volume(parse_fact(DockerVolumeInfo, fixture("volume-user.json")))
    assert len(commands) == 1 and commands[0].endswith("exit 1")
    assert "sparkfold did not create it" in commands[0] and "set nfs_volume" in commands[0]
    assert "addr=169.254.10.1" in commands[0]


def test_foreign_volume_with_the_same_options_is_accepted():
    volume = parse_fact(DockerVolumeInfo, fixture("volume-managed.json"))
    volume["Labels"] = None
    assert run_volume(volume) == []


# --- deploy function ----------------------------------------------------------------------------------------

def settings(**over):
    base = dict(nfs=True, is_head=True, hf_cache=CACHE, nfs_exports_file=EXPORTS, nfs_volume="sparkfold-hf",
                nfs_options=OPTIONS, head_link_ip="192.168.100.1",
                peer_link_rails=[{"netdev": "enp1s0f0np0", "address": "192.168.100.2/24"},
                                 {"netdev": "enP2p1s0f0np0", "address": "192.168.101.2/24"}])
    base.update(over)
    return types.SimpleNamespace(**base)


def record_calls(monkeypatch):
    calls = []
    for op in ("nfs_server_installed", "nfs_server_running", "nfs_exported", "nfs_volume"):
        monkeypatch.setattr(nfs, op, lambda _op=op, **kw: calls.append((_op, kw)))
    monkeypatch.setattr(nfs.files, "directory", lambda **kw: calls.append(("directory", kw)))
    return calls


def test_deploy_nfs_head_and_worker(monkeypatch):
    calls = record_calls(monkeypatch)
    nfs.deploy_nfs(settings())
    assert [c[0] for c in calls] == ["nfs_server_installed", "nfs_server_running", "directory", "nfs_exported"]
    assert calls[3][1]["clients"] == CLIENTS and calls[3][1]["_sudo"] is True
    calls.clear()
    nfs.deploy_nfs(settings(is_head=False, hf_cache="/home/other/.cache/huggingface"), head_hf_cache=CACHE)
    assert calls == [("nfs_volume", {"name": "NFS: docker volume for the head's cache", "volume": "sparkfold-hf",
                                     "server_ip": "192.168.100.1", "export_path": CACHE, "options": OPTIONS})]


def test_deploy_nfs_off(monkeypatch):
    calls = record_calls(monkeypatch)
    nfs.deploy_nfs(settings(nfs=False))
    nfs.deploy_nfs(settings(nfs=False, is_head=False))
    assert calls == []


def test_sim_exportfs_standin_round_trip(tmp_path):
    """The simulated head's exportfs: -ra builds the table from our file, -v prints what ExportTable reads."""
    cache = tmp_path / "hf cache"
    cache.mkdir()
    (tmp_path / "exports.d").mkdir()
    (tmp_path / "exports.d" / "sparkfold.exports").write_text(nfs.render_exports(str(cache), CLIENTS))
    env = {"SIM_EXPORTS": str(tmp_path / "exports"), "SIM_EXPORTS_D": str(tmp_path / "exports.d"),
           "SIM_ETAB": str(tmp_path / "etab"), "SIM_EXPORTFS_LOG": str(tmp_path / "log"), "PATH": "/usr/bin:/bin"}
    standin = str(Path(__file__).resolve().parents[1] / "sim" / "standins" / "exportfs")
    subprocess.run([standin, "-ra"], env=env, check=True)
    shown = subprocess.run([standin, "-v"], env=env, check=True, capture_output=True, text=True).stdout
    table = parse_fact(ExportTable, shown)
    assert [(e["path"], e["client"]) for e in table] == [(str(cache), c) for c in CLIENTS]
    assert all("ro" in e["options"] and "no_subtree_check" in e["options"] for e in table)
    assert (tmp_path / "log").read_text().count("exportfs") == 2
