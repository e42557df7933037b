"""unit_installed: file + daemon-reload only on change, enable/start only when needed, restart when asked."""

import hashlib

import pytest

from harness import parse_fact, run_op, with_args
from operations.facts.systemd import UnitState
from operations.systemd_unit import unit_installed

UNIT = "sparkfold-test.service"
KEY = f"path=/etc/systemd/system/{UNIT}, unit={UNIT}"
CONTENT = "[Service]\nType=oneshot\nExecStart=/bin/true\n\n[Install]\nWantedBy=multi-user.target\n"
SHA = hashlib.sha256(CONTENT.encode()).hexdigest()


def facts(enabled, active, sha):
    return {UnitState: with_args({KEY: {"enabled": enabled, "active": active, "sha256": sha}})}


def test_fact_parses_systemctl_and_hash():
    got = parse_fact(UnitState, f"enabled=enabled\nactive=active\nsha256={SHA}\n")
    assert got == {"enabled": "enabled", "active": "active", "sha256": SHA}
    unknown = parse_fact(UnitState, "enabled=\nactive=inactive\nsha256=\n")
    assert unknown == {"enabled": "", "active": "inactive", "sha256": None}


def test_fact_command_always_exits_zero():
    import subprocess
    cmd = UnitState().command(unit="no-such-unit.service", path="/nonexistent/no-such-unit.service")
    done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True)
    assert done.returncode == 0
    got = parse_fact(UnitState, done.stdout)
    assert got["sha256"] is None and got["enabled"] in ("", "not-found")


def test_new_unit_is_written_reloaded_enabled_started():
    cmds, _ = run_op(unit_installed, facts("", "inactive", None), unit_name=UNIT, content=CONTENT)
    assert cmds[0] == "mkdir -p /etc/systemd/system"
    assert cmds[1].startswith("FileUploadCommand") and UNIT in cmds[1]
    assert cmds[2:] == [f"chmod 644 /etc/systemd/system/{UNIT}", "systemctl daemon-reload",
                        f"systemctl enable {UNIT}", f"systemctl start {UNIT}"]


def test_converged_unit_changes_nothing():
    cmds, h = run_op(unit_installed, facts("enabled", "active", SHA), unit_name=UNIT, content=CONTENT)
    assert cmds == [] and h.noops


def test_changed_content_reloads_without_restart_by_default():
    cmds, _ = run_op(unit_installed, facts("enabled", "active", "0" * 64), unit_name=UNIT, content=CONTENT)
    assert "systemctl daemon-reload" in cmds
    assert not any("restart" in c or "start" in c.split()[1:2] for c in cmds if c.startswith("systemctl"))


def test_changed_content_restarts_when_asked():
    cmds, _ = run_op(unit_installed, facts("enabled", "active", "0" * 64), unit_name=UNIT, content=CONTENT,
                     restart_on_change=True)
    assert cmds[-1] == f"systemctl restart {UNIT}"
    assert cmds.index("systemctl daemon-reload") < cmds.index(f"systemctl restart {UNIT}")


def test_same_content_no_reload_but_start_and_enable_when_drifted():
    cmds, _ = run_op(unit_installed, facts("disabled", "failed", SHA), unit_name=UNIT, content=CONTENT,
                     restart_on_change=True)
    assert cmds == [f"systemctl enable {UNIT}", f"systemctl start {UNIT}"]


def test_disabled_and_stopped_when_asked():
    cmds, _ = run_op(unit_installed, facts("enabled", "active", SHA), unit_name=UNIT, content=CONTENT,
                     enabled=False, running=False)
    assert cmds == [f"systemctl disable {UNIT}", f"systemctl stop {UNIT}"]
    cmds, h = run_op(unit_installed, facts("disabled", "inactive", SHA), unit_name=UNIT, content=CONTENT,
                     enabled=False, running=False)
    assert cmds == [] and h.noops


def test_bad_unit_name():
    with pytest.raises(ValueError):
        run_op(unit_installed, facts("", "", None), unit_name="etc/x.service", content=CONTENT)
