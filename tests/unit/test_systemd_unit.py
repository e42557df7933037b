"""operations/util/units.py: a unit's file through files.put (path, mode 644, content), the unit through
systemd.service; daemon-reload and the restart only when the file changed, enable/start only when needed."""

from io import StringIO

import pytest
from core_facts import remote_file, run_put, unit
from pyinfra.operations import files, systemd

from operations.util import units

UNIT = "sparkfold-test.service"
PATH = f"/etc/systemd/system/{UNIT}"
CONTENT = "[Service]\nType=oneshot\nExecStart=/bin/true\n\n[Install]\nWantedBy=multi-user.target\n"


class PutResult:
    """What a files.put returns: an OperationMeta that reports whether it changed the file (or will)."""

    def __init__(self, changed: bool, complete: bool = True):
        self.changed_file, self.complete = changed, complete
        self.facts_read = 0  # will_change evaluates the put again (its facts): counted

    def is_complete(self):
        return self.complete

    def did_change(self):
        assert self.complete
        return self.changed_file

    @property
    def will_change(self):
        self.facts_read += 1
        return self.changed_file


@pytest.fixture
def calls(monkeypatch):
    """files.put / the unit's service operation recorded; `changed` is what the unit file's put reports."""
    seen = {"changed": True, "ops": []}

    def put(**kw):
        seen["ops"].append(("put", kw))
        return PutResult(seen["changed"])

    monkeypatch.setattr(files, "put", put)
    monkeypatch.setattr(units, "owned_or_absent", lambda **kw: seen["ops"].append(("owned", kw)))
    monkeypatch.setattr(units, "unit_service", lambda **kw: seen["ops"].append(("service", kw)))
    monkeypatch.setattr(systemd, "service", lambda **kw: seen["ops"].append(("service", kw)))
    return seen


def test_unit_installed_puts_the_file_then_runs_its_service(calls):
    units.unit_installed(UNIT, CONTENT)
    (_, owned), (_, put), (_, service) = calls["ops"]
    assert owned["path"] == PATH  # a foreign file at the unit's path is refused before the put
    assert put["dest"] == PATH and put["mode"] == "644" and put["src"].getvalue() == CONTENT
    assert service["service"] == UNIT and (service["running"], service["enabled"]) == (True, True)
    assert isinstance(service["file_put"], PutResult) and service["restart_on_change"] is False
    calls["ops"].clear()
    units.unit_installed(UNIT, CONTENT, restart_on_change=True)
    assert calls["ops"][2][1]["restart_on_change"] is True


@pytest.mark.parametrize("changed, restart, want", [
    (True, False, ["systemctl daemon-reload"]),
    (True, True, ["systemctl daemon-reload", f"systemctl restart {UNIT}"]),
    (False, True, []),  # unchanged file: neither reload nor restart
])
def test_the_service_reloads_and_restarts_only_after_its_file_changed(changed, restart, want):
    put = PutResult(changed)
    cmds, _, _ = run_put(units.unit_service, unit(UNIT, True, True), service=UNIT, file_put=put, running=True,
                         enabled=True, restart_on_change=restart)
    assert cmds == want
    assert put.facts_read == 0  # the put already ran: its result, not its facts again


def test_while_planning_the_service_asks_whether_the_put_will_change():
    put = PutResult(True, complete=False)
    cmds, _, _ = run_put(units.unit_service, unit(UNIT, True, True), service=UNIT, file_put=put, running=True,
                         enabled=True)
    assert cmds == ["systemctl daemon-reload"] and put.facts_read == 1


def test_unit_off_stops_and_disables(calls):
    units.unit_off(UNIT, _sudo=True)
    assert calls["ops"] == [("service", {"name": f"{UNIT} stopped and disabled (if present)", "service": UNIT,
                                         "running": False, "enabled": False, "_sudo": True})]


def test_script_installed_uploads_the_remote_script(calls):
    units.script_installed("memguard.py")
    put = calls["ops"][0][1]
    assert put["dest"] == "/usr/local/lib/sparkfold/memguard.py" and put["mode"] == "755"
    assert put["src"] == str(units.REMOTE_SCRIPTS / "memguard.py")


# --- what the composed core operations do with the facts --------------------------------------------------------

def test_new_unit_file_is_uploaded_with_mode_644():
    cmds, uploads, _ = run_put(files.put, remote_file(PATH), src=StringIO(CONTENT), dest=PATH, mode="644")
    assert uploads == {PATH: CONTENT}
    assert cmds[0].startswith("FileUploadCommand") and cmds[1:] == [f"chmod 644 {PATH}"]


def test_converged_unit_file_yields_nothing():
    cmds, _, _ = run_put(files.put, remote_file(PATH, CONTENT), src=StringIO(CONTENT), dest=PATH, mode="644")
    assert cmds == []
    cmds, _, _ = run_put(files.put, remote_file(PATH, CONTENT, mode=600), src=StringIO(CONTENT), dest=PATH,
                         mode="644")
    assert cmds == [f"chmod 644 {PATH}"]


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
