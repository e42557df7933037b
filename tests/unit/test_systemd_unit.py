"""operations/owned/units.py and file_put.py: a unit's file through files.put (path, mode 644, content), the unit
through systemd.service; daemon-reload and the restart only when the file changed, enable/start only when needed;
one fact each when the file and the unit are already right. The operations on scripted facts (file_put,
owned_file_put, unit_service): tests/operations/owned.*/."""

import hashlib
from io import StringIO

import pytest
from core_facts import remote_file, run_put, unit
from harness import parse_fact, run_fact
from pyinfra.operations import systemd

from operations.facts.files import FileSum
from operations.facts.systemd import UnitState, unit_enabled, unit_running
from operations.owned import units
from operations.owned.files import already_there, file_put
from operations.util import MANAGED_HEADER

UNIT = "sparkfold-test.service"
PATH = f"/etc/systemd/system/{UNIT}"
CONTENT = "[Service]\nType=oneshot\nExecStart=/bin/true\n\n[Install]\nWantedBy=multi-user.target\n"


class PutResult:
    """What a files.put returns (its OperationMeta), as the recorded operations hand it on."""

    def __init__(self, changed: bool):
        self.changed_file = changed


@pytest.fixture
def calls(monkeypatch):
    """The file and service operations recorded; `changed` is what the unit file's put reports."""
    seen = {"changed": True, "ops": []}

    def recorder(kind):
        def op(**kw):
            seen["ops"].append((kind, kw))
            return PutResult(seen["changed"])
        return op

    monkeypatch.setattr(units, "owned_file_put", recorder("owned put"))
    monkeypatch.setattr(units, "file_put", recorder("put"))
    monkeypatch.setattr(units, "unit_service", recorder("service"))
    return seen


def test_unit_installed_puts_the_file_then_runs_its_service(calls):
    units.unit_installed(UNIT, CONTENT)
    (kind, put), (_, service) = calls["ops"]
    assert kind == "owned put"  # a foreign file at the unit's path is refused, never overwritten
    assert put["dest"] == PATH and put["mode"] == "644" and put["src"].getvalue() == CONTENT
    assert service["service"] == UNIT and (service["running"], service["enabled"]) == (True, True)
    assert isinstance(service["file_put"], PutResult) and service["restart_on_change"] is False
    calls["ops"].clear()
    units.unit_installed(UNIT, CONTENT, restart_on_change=True)
    assert calls["ops"][1][1]["restart_on_change"] is True


def test_unit_off_stops_and_disables(calls):
    units.unit_off(UNIT, _sudo=True)
    assert calls["ops"] == [("service", {"name": f"{UNIT} stopped and disabled (if present)", "service": UNIT,
                                         "file_put": None, "running": False, "enabled": False, "_sudo": True})]


def test_script_installed_uploads_the_remote_script(calls):
    units.script_installed("memguard.py")
    kind, put = calls["ops"][0]
    assert kind == "put" and put["dest"] == "/usr/local/lib/sparkfold/memguard.py" and put["mode"] == "755"
    assert put["src"] == str(units.REMOTE_SCRIPTS / "memguard.py")


# --- what the file operations do with the facts --------------------------------------------------------------

def test_a_local_file_is_compared_by_its_bytes(tmp_path):
    local = tmp_path / "script.sh"
    local.write_text("#!/bin/sh\necho hi\n")
    cmds, _, _ = run_put(file_put, remote_file(PATH, local.read_text(), mode=755), src=str(local), dest=PATH,
                         mode="755")
    assert cmds == []
    local.write_text("#!/bin/sh\necho bye\n")
    cmds, _, _ = run_put(file_put, remote_file(PATH, "#!/bin/sh\necho hi\n", mode=755), src=str(local), dest=PATH,
                         mode="755")
    assert cmds[0].startswith("FileUploadCommand")


def test_a_link_or_an_unreadable_file_goes_to_files_put():
    have = {"link": False, "sha1": hashlib.sha1(CONTENT.encode()).hexdigest(), "mode": 644, "user": "root",
            "group": "root", "head": ""}
    assert already_there(have, StringIO(CONTENT), "644") and already_there(have, StringIO(CONTENT), "0644")
    assert not already_there({**have, "link": True}, StringIO(CONTENT), "644")
    assert not already_there({**have, "sha1": None}, StringIO(CONTENT), "644")
    assert not already_there(have, StringIO(CONTENT), "u+x")  # a symbolic mode: files.put decides
    assert not already_there(None, StringIO(CONTENT), "644")


def test_file_sum_fact_on_real_files(tmp_path):
    path = tmp_path / "unit.service"
    assert run_fact(FileSum, path=str(path)) is None
    path.write_text(f"{MANAGED_HEADER}\n{CONTENT}")
    path.chmod(0o640)
    got = run_fact(FileSum, path=str(path))
    assert got["sha1"] == hashlib.sha1(path.read_bytes()).hexdigest() and got["mode"] == 640
    assert got["head"].splitlines() == path.read_text().splitlines()[:3] and got["link"] is False
    link = tmp_path / "link.service"
    link.symlink_to(path)
    assert run_fact(FileSum, path=str(link))["link"] is True
    empty = tmp_path / "empty"
    empty.write_text("")
    assert run_fact(FileSum, path=str(empty))["sha1"] == hashlib.sha1(b"").hexdigest()
    assert run_fact(FileSum, path=str(tmp_path)) is None  # a folder is not a file


# --- what the service operation does with the facts ------------------------------------------------------------

def test_unit_state_fact_reads_pyinfras_words():
    waiting = parse_fact(UnitState, "UnitFileState=enabled\nActiveState=active\nSubState=waiting\n")
    assert waiting == {"enabled": "enabled", "active": "active", "sub": "waiting", "sha256": None}
    assert unit_running(waiting) and unit_enabled(waiting)  # a timer that waits runs
    static = parse_fact(UnitState, "UnitFileState=static\nActiveState=inactive\nSubState=dead\n")
    assert not unit_running(static) and unit_enabled(static)
    unknown = parse_fact(UnitState, "UnitFileState=\nActiveState=inactive\nSubState=dead\n")
    assert unknown["enabled"] == "" and not unit_running(unknown) and not unit_enabled(unknown)
    assert parse_fact(UnitState, "") == UnitState.default() and not unit_running(UnitState.default())


def test_unit_state_reads_the_unit_files_sum_only_when_given_its_path(tmp_path):
    path = tmp_path / UNIT
    command = UnitState().command(unit=UNIT, path=str(path))
    assert command.startswith(f"systemctl show --property UnitFileState --property ActiveState --property SubState "
                              f"{UNIT} 2>/dev/null || true")
    assert "sha256sum" not in UnitState().command(unit=UNIT)
    assert run_fact(UnitState, unit=UNIT, path=str(path))["sha256"] is None  # no file
    path.write_text(CONTENT)
    assert run_fact(UnitState, unit=UNIT, path=str(path))["sha256"] == hashlib.sha256(CONTENT.encode()).hexdigest()


def test_service_reloads_enables_starts_or_restarts():
    cmds, _, _ = run_put(systemd.service, unit(UNIT, False, False), service=UNIT, running=True, enabled=True,
                         daemon_reload=True, restarted=True)
    assert cmds == ["systemctl daemon-reload", f"systemctl start {UNIT}", f"systemctl enable {UNIT}"]
    cmds, _, _ = run_put(systemd.service, unit(UNIT, True, True), service=UNIT, running=True, enabled=True,
                         daemon_reload=True, restarted=True)
    assert cmds == ["systemctl daemon-reload", f"systemctl restart {UNIT}"]
    cmds, _, host = run_put(systemd.service, unit(UNIT, True, True), service=UNIT, running=True, enabled=True)
    assert cmds == [] and host.noops


def test_service_off_both_ways():
    cmds, _, _ = run_put(systemd.service, unit(UNIT, True, True), service=UNIT, running=False, enabled=False)
    assert cmds == [f"systemctl stop {UNIT}", f"systemctl disable {UNIT}"]
    cmds, _, host = run_put(systemd.service, unit(UNIT, False, False), service=UNIT, running=False, enabled=False)
    assert cmds == [] and host.noops
