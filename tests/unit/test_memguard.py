"""memguard: the pure decision (above floor, below with the container running, below with nothing running,
hysteresis), the script run for real against a fake meminfo, /proc, cgroup tree and docker (tests/unit/memguard_box.py),
and the deploy's unit. The kill through the rank's cgroup: tests/unit/test_memguard_cgroup.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from core_facts import run_put, unit
from memguard_box import Box
from pyinfra.operations import systemd

import operations.memguard as mg
from operations.owned.units import REMOTE_SCRIPTS
from operations.remote import memguard as guard
from operations.remote.memguard import RETRY_KILL_S, GuardState, decide

FLOOR = 2.5
UNIT = "sparkfold-memguard.service"


def test_above_floor_does_nothing_and_tracks_the_low_water_mark():
    d = decide(10.0, FLOOR, None, GuardState(), now=0)
    assert not d.kill and d.reason == "" and d.state.low_gib == 10.0
    d = decide(7.5, FLOOR, None, d.state, now=1)
    assert d.state.low_gib == 7.5
    assert decide(9.0, FLOOR, None, d.state, now=2).state.low_gib == 7.5


def test_below_floor_with_the_container_running_kills_and_says_why():
    d = decide(2.0, FLOOR, True, GuardState(), now=5)
    assert d.kill
    assert "2.00 GiB is below the floor of 2.50 GiB" in d.reason
    assert d.state.armed is False and d.state.last_kill == 5 and d.state.low_gib == 2.0


def test_below_floor_with_nothing_running_does_not_kill():
    d = decide(1.0, FLOOR, False, GuardState(), now=0)
    assert not d.kill and d.state.armed is True and d.state.low_gib == 1.0
    assert not decide(1.0, FLOOR, None, GuardState(), now=0).kill  # docker inspect failed: no kill on a guess


def test_no_repeated_kills_while_the_first_one_takes_effect():
    d = decide(2.0, FLOOR, True, GuardState(), now=0)
    assert d.kill
    for t in (0.5, 1.0, RETRY_KILL_S - 0.5):
        d = decide(2.0, FLOOR, True, d.state, now=t)
        assert not d.kill
    # just above the floor is not enough to re-arm (hysteresis)
    d = decide(FLOOR + 0.5, FLOOR, None, d.state, now=RETRY_KILL_S - 0.2)
    assert not d.state.armed and d.reason == ""


def test_a_kill_that_did_not_take_is_retried_after_the_cooldown():
    d = decide(2.0, FLOOR, True, GuardState(), now=0)
    d = decide(2.0, FLOOR, True, d.state, now=RETRY_KILL_S)
    assert d.kill and "after the last kill" in d.reason and d.state.last_kill == RETRY_KILL_S


def test_recovery_above_the_margin_re_arms():
    d = decide(2.0, FLOOR, True, GuardState(), now=0)
    d = decide(FLOOR + guard.REARM_MARGIN_GIB + 0.1, FLOOR, None, d.state, now=1)
    assert d.state.armed and "re-armed" in d.reason
    assert decide(2.0, FLOOR, True, d.state, now=2).kill


def test_mem_available_is_read_in_gib(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       127000000 kB\nMemFree:  1 kB\nMemAvailable:    3145728 kB\n")
    assert guard.mem_available_gib(str(meminfo)) == 3.0


@pytest.fixture
def box(tmp_path):
    return Box(tmp_path)


def test_script_kills_once_and_records_the_low(box):
    cgroup = box.container("c" * 64, 4242)
    box.mem(2)
    rc, stderr = box.run_script()
    assert rc == 0
    assert (cgroup / "cgroup.kill").read_text() == "1" and not any(c.startswith("kill") for c in box.calls())
    assert stderr.count("memguard: killed rank cccccccccccc via cgroup.kill") == 1
    assert "MemAvailable 2.00 GiB is below the floor" in stderr
    assert box.low_file.read_text().startswith("2.00 ")
    assert "guard ends; lowest MemAvailable 2.00 GiB" in stderr


def test_script_leaves_a_stopped_container_and_ample_memory_alone(box):
    box.answer.write_text("cid123 false 0 1\n")
    box.mem(2)
    box.run_script()
    assert box.calls() and not any(c.startswith("kill") for c in box.calls())
    box.log.unlink()
    cgroup = box.container("c" * 64, 4242)
    box.mem(50)
    box.run_script()
    calls = box.calls()
    assert len(calls) == 1 and calls[0].startswith("inspect ")  # asked once, at the start
    assert (cgroup / "cgroup.kill").read_text() == ""
    assert box.low_file.read_text().startswith("50.00 ")


def test_script_never_kills_a_container_that_is_not_sparkfolds(box):
    cgroup = box.container("c" * 64, 4242, label="<no value>")
    box.mem(2)
    _, stderr = box.run_script()
    assert box.calls() and not any(c.startswith("kill") for c in box.calls())
    assert (cgroup / "cgroup.kill").read_text() == ""
    assert "lacks the label sparkfold.managed=1: not sparkfold's, left alone" in stderr


# --- the deploy ---------------------------------------------------------------------------------------------

def test_unit_runs_the_uploaded_script_and_carries_its_hash():
    unit = mg.render_unit("dsv41-1017-exl3-tf", 2.5)
    assert unit.startswith("# Managed by sparkfold")
    assert ("ExecStart=/usr/bin/python3 /usr/local/lib/sparkfold/memguard.py --container dsv41-1017-exl3-tf "
            "--floor-gib 2.5\n") in unit
    for line in ("Type=simple", "Restart=always", "RestartSec=5", "WantedBy=multi-user.target"):
        assert f"\n{line}\n" in unit
    assert mg.script_sha256("memguard.py") in unit  # a new script changes the unit, which restarts the guard
    assert "--floor-gib 3\n" in mg.render_unit("x", 3.0)


def _settings(**kw):
    base = dict(memguard=True, container_name="rank-c", memguard_gib=2.5)
    return SimpleNamespace(**{**base, **kw})


def test_deploy_uploads_then_installs_enabled_running_restart_on_change(monkeypatch):
    calls = []
    monkeypatch.setattr(mg, "script_installed", lambda script: calls.append(("put", script)))
    monkeypatch.setattr(mg, "unit_installed", lambda *a, **kw: calls.append(("unit", a, kw)))
    monkeypatch.setattr(mg, "unit_off", lambda unit: calls.append(("off", unit)))
    mg.memguard._inner(_settings())
    assert [c[0] for c in calls] == ["put", "unit"]
    assert calls[0][1] == "memguard.py" and guard.__file__ == str(REMOTE_SCRIPTS / "memguard.py")
    assert calls[1][1] == ("sparkfold-memguard.service", mg.render_unit("rank-c", 2.5))
    assert calls[1][2] == {"restart_on_change": True}  # enabled and running: unit_installed's only state

    calls.clear()
    mg.memguard._inner(_settings(memguard=False))
    assert calls == [("off", "sparkfold-memguard.service")]


def test_unit_off_stops_and_disables_a_present_unit():
    commands, _, _ = run_put(systemd.service, unit(UNIT, True, True), service=UNIT, running=False, enabled=False)
    assert commands == ["systemctl stop sparkfold-memguard.service", "systemctl disable sparkfold-memguard.service"]


def test_unit_off_is_a_noop_when_absent_or_already_off():
    commands, _, host = run_put(systemd.service, unit(UNIT, False, False), service=UNIT, running=False,
                                enabled=False)
    assert commands == [] and host.noops
