"""NFS: the export file and table on the head, the docker volume on the worker. The operations on scripted facts
(nfs_exported, nfs_unexported, nfs_server_installed, nfs_volume): tests/operations/nfs.*/."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from harness import parse_fact, run_fact, run_op, with_args
from settings_factory import make_pair

from operations import nfs
from operations.facts.docker import DockerVolumeInfo, VolumeContainers
from operations.facts.files import FileText
from operations.facts.nfs import ExportTable
from operations.facts.systemd import UnitState
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


# --- what the export reaches (subtree_check, and a file system shared with the home) ---------------------------

def test_the_export_checks_each_file_handle_against_the_exported_folder():
    assert nfs.EXPORT_OPTIONS == "ro,subtree_check"
    lines = [line for line in nfs.render_exports(CACHE, CLIENTS).splitlines() if not line.startswith("#")]
    assert lines and all(line.endswith("(ro,subtree_check)") and "no_subtree_check" not in line for line in lines)


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
    note = (f"spark: warning: the NFS export: hf_cache {CACHE} is on the same file system as /home/nvidia, the ssh "
            "user's home (~/.ssh, the Hugging Face token)")
    assert (note in caplog.text) is warned, caplog.text
    if warned:
        assert 'set worker_weights = "copy" and nfs = false to export nothing' in caplog.text
