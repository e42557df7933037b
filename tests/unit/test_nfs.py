"""NFS: the export file and table on the head, the docker volume on the worker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from core_facts import merged, remote_file, run_put, unit
from harness import parse_fact, refused, run_fact, run_op, with_args
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from settings_factory import make_pair

from operations import nfs
from operations.facts.docker import DockerVolumeInfo, VolumeContainers
from operations.facts.files import FileText
from operations.facts.nfs import ExportTable
from operations.facts.systemd import UnitState
from operations.owned.units import unit_service
from operations.util import MANAGED_HEADER

FIX = Path(__file__).parent / "fixtures" / "nfs"
CACHE = "/home/nvidia/.cache/huggingface"
EXPORTS = "/etc/exports.d/sparkfold.exports"
CLIENTS = ["192.168.100.2", "192.168.101.2"]
OPTIONS = "nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600"


def fixture(name):
    return (FIX / name).read_text()


def run_sh(command) -> list[str]:
    text = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
    return subprocess.run(["sh", "-c", text], capture_output=True, text=True, check=True).stdout.splitlines()


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
    fact = FileText()
    assert fact.process(run_sh(fact.command(path=str(path)))) is None
    path.write_text("a\n\nb\n")
    assert fact.process(run_sh(fact.command(path=str(path)))) == "a\n\nb\n"


def service(state):
    """The part of UnitState the NFS service check reads."""
    return {"active": state["active"], "enabled": state["enabled"]}


def test_service_state():
    running = service(parse_fact(UnitState, "ActiveState=active\nUnitFileState=enabled"))
    assert running == {"active": "active", "enabled": "enabled"}
    assert service(parse_fact(UnitState, "ActiveState=inactive\nUnitFileState=")) == {"active": "inactive",
                                                                                     "enabled": ""}
    state = UnitState()
    assert service(state.process(run_sh(state.command(unit="sparkfold-no-such-unit")))) in (
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
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        f"{CACHE} 192.168.100.2(ro,subtree_check)", f"{CACHE} 192.168.101.2(ro,subtree_check)"]
    assert nfs.render_exports("/data/my models", ["10.0.0.2"]).splitlines()[-1] == \
        '"/data/my models" 10.0.0.2(ro,subtree_check)'


def export_facts(current, table, dir_exists=True):
    return merged(remote_file(EXPORTS, current, dir_exists=dir_exists), {ExportTable: table})


def export(current, table, clients=CLIENTS, dir_exists=True):
    return run_put(nfs.nfs_exported, export_facts(current, table, dir_exists), path=CACHE, clients=clients,
                   exports_file=EXPORTS)


def test_export_written_and_reloaded_when_missing():
    commands, uploads, _ = export(None, [], dir_exists=False)
    assert commands[0] == "mkdir -p /etc/exports.d" and commands[1].startswith("FileUploadCommand")
    assert f"{CACHE} 192.168.101.2(ro,subtree_check)" in uploads[EXPORTS]
    assert commands[2:] == [f"chmod 644 {EXPORTS}", "exportfs -ra"]


def test_export_converged_yields_nothing():
    table = parse_fact(ExportTable, fixture("exportfs-v.txt"))
    commands, _, host = export(nfs.render_exports(CACHE, CLIENTS), table)
    assert commands == [] and host.noops
    # one read of the file (content, mode, header) and the live table: not files.put's three
    assert [name.rsplit(".", 1)[1] for name, _ in host.fact_calls] == ["FileSum", "ExportTable"]


def test_export_refuses_an_exports_file_that_is_not_sparkfolds():
    table = parse_fact(ExportTable, fixture("exportfs-v.txt"))
    commands, uploads, _ = run_put(nfs.nfs_exported, export_facts("/srv/share 10.0.0.0/24(rw)\n", table),
                                   executing=True, path=CACHE, clients=CLIENTS, exports_file=EXPORTS)
    assert len(commands) == 1 and "was not written by sparkfold" in commands[0] and uploads == {}


def test_export_reloaded_when_the_live_table_lacks_a_client():
    table = [e for e in parse_fact(ExportTable, fixture("exportfs-v.txt")) if e["client"] != "192.168.101.2"]
    commands, _, _ = export(nfs.render_exports(CACHE, CLIENTS), table)
    assert commands == ["exportfs -ra"]


def test_export_rewritten_when_the_worker_address_changes():
    table = parse_fact(ExportTable, fixture("exportfs-v.txt"))
    commands, uploads, _ = export(nfs.render_exports(CACHE, CLIENTS), table, clients=["192.168.100.3"])
    assert "192.168.100.3(ro,subtree_check)" in uploads[EXPORTS] and commands[-1] == "exportfs -ra"


def test_server_package_both_ways():
    apt = {DebPackages: {}, File: with_args({"path=/var/lib/apt/periodic/update-success-stamp": None})}
    commands, _ = run_op(nfs.nfs_server_installed, apt)
    assert commands[0] == "apt-get update" and "install nfs-kernel-server" in commands[-1]
    commands, host = run_op(nfs.nfs_server_installed, {DebPackages: {"nfs-kernel-server": ["1:2.6.4"]}})
    assert commands == [] and host.noops  # no apt-get update on a converged run


def test_server_service_both_ways():
    commands, _, _ = run_put(unit_service, unit("nfs-server.service", False, False), service="nfs-server.service",
                             file_put=None, running=True, enabled=True)
    assert commands == ["systemctl start nfs-server.service", "systemctl enable nfs-server.service"]
    commands, _, _ = run_put(unit_service, unit("nfs-server.service", True, True), service="nfs-server.service",
                             file_put=None, running=True, enabled=True)
    assert commands == []


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


def refused_volume(caplog, volume, users=(), server_ip="192.168.100.1"):
    return refused(caplog, nfs.nfs_volume, volume_facts(volume, users), volume="sparkfold-hf", server_ip=server_ip,
                   export_path=CACHE, options=OPTIONS)


def test_volume_in_use_is_not_touched(caplog):
    volume = parse_fact(DockerVolumeInfo, fixture("volume-managed.json"))
    command, warnings = refused_volume(caplog, volume, users=["dsv41-1017-exl3-tf"], server_ip="192.168.101.1")
    assert "container(s) dsv41-1017-exl3-tf use it" in command and "docker rm -f dsv41-1017-exl3-tf" in command
    assert "volume rm" not in command.split("sparkfold:")[0]
    assert "will fail: the NFS volume: docker volume sparkfold-hf needs new options" in warnings


def test_foreign_volume_is_never_removed(caplog):
    command, warnings = refused_volume(caplog, parse_fact(DockerVolumeInfo, fixture("volume-user.json")))
    assert "sparkfold did not create it" in command and "set nfs_volume" in command
    assert "addr=169.254.10.1" in command
    assert "will fail: the NFS volume: docker volume sparkfold-hf exists" in warnings


def test_foreign_volume_with_the_same_options_is_accepted():
    volume = parse_fact(DockerVolumeInfo, fixture("volume-managed.json"))
    volume["Labels"] = None
    assert run_volume(volume) == []


# --- deploy function ----------------------------------------------------------------------------------------

def settings(is_head=True, **over):
    """Real settings of the example pair; `over` applies to the Spark asked for."""
    head, worker = make_pair(**{"head" if is_head else "worker": over})
    return head if is_head else worker


def record_calls(monkeypatch):
    calls = []
    for op in ("nfs_server_installed", "export_filesystem_checked", "nfs_exported", "nfs_volume", "nfs_unexported"):
        monkeypatch.setattr(nfs, op, lambda _op=op, **kw: calls.append((_op, kw)))
    monkeypatch.setattr(nfs, "unit_service", lambda **kw: calls.append(("service", kw)))
    monkeypatch.setattr(nfs.files, "directory", lambda **kw: calls.append(("directory", kw)))
    return calls


def test_deploy_nfs_head_and_worker(monkeypatch):
    calls = record_calls(monkeypatch)
    nfs.nfs._inner(settings())
    assert [c[0] for c in calls] == ["nfs_server_installed", "service", "directory", "export_filesystem_checked",
                                     "nfs_exported"]
    assert calls[3][1] == {"name": "the exported cache's file system", "cache": CACHE, "home": "/home/nvidia",
                           "_sudo": False}
    del calls[3]
    assert calls[1][1]["service"] == "nfs-server.service" and calls[1][1]["running"] and calls[1][1]["enabled"]
    assert calls[1][1]["file_put"] is None  # the package's unit: sparkfold writes no file for it
    assert calls[3][1]["exports_file"] == "/etc/exports.d/sparkfold.exports"
    assert calls[3][1]["clients"] == CLIENTS and calls[3][1]["_sudo"] is True
    assert calls[2][1]["_sudo"] is False  # the cache belongs to the ssh user
    # only hub/ is exported: the cache's top folder holds the token `hf auth login` writes
    assert calls[2][1]["path"] == calls[3][1]["path"] == f"{CACHE}/hub"
    calls.clear()
    nfs.nfs._inner(settings(is_head=False, hf_cache="/home/other/.cache/huggingface"))
    assert calls == [("nfs_volume", {"name": "docker volume of the head's cache", "volume": "sparkfold-hf",
                                     "server_ip": "192.168.100.1", "export_path": f"{CACHE}/hub", "options": OPTIONS,
                                     "_sudo": False})]


def test_deploy_nfs_off_removes_only_the_owned_export(monkeypatch):
    calls = record_calls(monkeypatch)
    nfs.nfs._inner(settings(nfs=False, worker_weights="copy"))
    nfs.nfs._inner(settings(nfs=False, worker_weights="copy", is_head=False))
    assert calls == [("nfs_unexported", {"name": f"{EXPORTS} removed (nfs is off)", "exports_file": EXPORTS,
                                         "_sudo": True})]


def test_nfs_unexported_both_ways():
    def run(text):
        return run_op(nfs.nfs_unexported, {FileText: with_args({f"path={EXPORTS}": text})}, executing=True,
                      exports_file=EXPORTS)[0]

    assert run(MANAGED_HEADER + "\n/x 10.0.0.2(ro)\n") == [f"rm -f {EXPORTS}", "exportfs -ra"]
    assert run(None) == []  # nothing to remove
    assert run("/srv 10.0.0.0/24(rw)\n") == []  # someone else's file at that path stays


# --- what the export reaches (subtree_check, and a file system shared with the home) ---------------------------

def test_the_export_checks_each_file_handle_against_the_exported_folder():
    assert nfs.EXPORT_OPTIONS == "ro,subtree_check"
    lines = [line for line in nfs.render_exports(CACHE, CLIENTS).splitlines() if not line.startswith("#")]
    assert lines and all(line.endswith("(ro,subtree_check)") and "no_subtree_check" not in line for line in lines)


def test_a_live_export_without_the_subtree_check_is_reloaded():
    table = parse_fact(ExportTable, fixture("exportfs-v.txt"))  # the cache's entries as exportfs -v shows them now
    for entry in table:
        if entry["path"] == CACHE:
            entry["options"].append("no_subtree_check")  # exported by an older sparkfold, not reloaded since
    commands, _, _ = export(nfs.render_exports(CACHE, CLIENTS), table)
    assert commands == ["exportfs -ra"]


def test_same_filesystem_fact_reads_the_device_of_each_or_its_nearest_folder(tmp_path):
    from operations.facts.nfs import SameFilesystem
    (tmp_path / "home").mkdir()
    assert run_fact(SameFilesystem, path=str(tmp_path / "cache" / "not-yet"), other=str(tmp_path / "home")) is True
    assert run_fact(SameFilesystem, path="/proc/self", other=str(tmp_path)) is False  # procfs is its own
    assert parse_fact(SameFilesystem, "path=2049\nother=2049") is True
    assert parse_fact(SameFilesystem, "path=2049\nother=66306") is False
    assert parse_fact(SameFilesystem, "path=\nother=66306") is None and parse_fact(SameFilesystem, "") is None


@pytest.mark.parametrize("same, executing, warned", [(True, False, True), (False, False, False),
                                                     (None, False, False), (True, True, False)])
def test_a_cache_on_the_homes_file_system_is_warned_about_while_planning(caplog, same, executing, warned):
    from operations.facts.nfs import SameFilesystem
    facts = {SameFilesystem: with_args({f"other=/home/nvidia, path={CACHE}": same})}
    with caplog.at_level("WARNING", logger="pyinfra"):
        commands, host = run_op(nfs.export_filesystem_checked, facts, executing=executing, cache=CACHE,
                                home="/home/nvidia")
    assert commands == [] and host.noops
    note = (f"spark: warning: hf_cache {CACHE} is on the same file system as /home/nvidia, the ssh user's home "
            "(~/.ssh, the Hugging Face token)")
    assert (note in caplog.text) is warned, caplog.text
    if warned:
        assert 'set worker_weights = "copy" and nfs = false to export nothing' in caplog.text
