"""GPU clock: the live fact parses nvidia-smi's real formats and the lock record; the drift rule (each reason both
ways); the op re-applies on drift, verifies the driver's answer and stays silent when the record shows the lock held;
the lock script against the stand-in; the service and timer templates; the stand-ins' idle/busy clock and timer."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from harness import parse_fact, run_op, with_args

from operations import gpu_clock as gc
from operations.facts.gpu import GpuClockState, parse_confirmation, query_command
from operations.facts.systemd import UnitState

FIX = Path(__file__).parent / "fixtures" / "host"
STANDIN = Path(__file__).resolve().parents[1] / "sim" / "standins" / "nvidia-smi"
SCRIPT = Path(__file__).resolve().parents[2] / "operations" / "remote" / "gpu_clock_lock.sh"
BOOT = "3f0c2a9e-1d2b-4c5e-8f7a-6b5c4d3e2f1a"
SMI = "/usr/bin/nvidia-smi"
KEY = f"nvidia_smi={SMI}, record_path=/var/lib/sparkfold/gpu-clock.record"
TIMER_KEY = "unit=sparkfold-gpu-clock.timer"
NOW = 1_790_000_000  # the Spark's clock (epoch s)
PERIOD = 300


def fact_output(query: str, record: str | None, boot=BOOT, now=NOW) -> str:
    out = "##QUERY##\n" + query + f"boot_id={boot}\nnow={now}\n"
    if record is not None:
        out += "".join(f"record: {line}\n" for line in record.splitlines())
    return out


def state(query_file="smi-query-unlocked.txt", record=None, boot=BOOT, query=None, now=NOW):
    q = query if query is not None else (FIX / query_file).read_text()
    return parse_fact(GpuClockState, fact_output(q, record, boot, now))


LOCKED_QUERY = "0, 0000000F:01:00.0, NVIDIA GB10, 2200, 3003, Active\n"  # under load, capped by the lock
IDLE_QUERY = "0, 0000000F:01:00.0, NVIDIA GB10, 345, 3003, Not Active\n"  # at rest: locked or not, it reads low
CONFIRMATION = (FIX / "smi-lgc-2200.txt").read_text().splitlines()[0]


def record(applied=NOW - 60, boot=BOOT, confirmation=CONFIRMATION):
    return f"boot={boot}\napplied={applied}\n{confirmation}\n"


RECORD_2200 = record()


# --- fact ----------------------------------------------------------------------------------------------------

def test_query_row_parses_real_csv():
    st = state()
    assert st["smi"] is True and st["error"] == ""
    assert st["gpus"] == [{"index": 0, "bus_id": "0000000f:01:00.0", "name": "NVIDIA GB10", "clocks_sm": 2405,
                           "clocks_max_sm": 3003, "apps_clocks_reason": "Not Active"}]
    assert st["boot_id"] == BOOT and st["recorded"] == {} and st["now"] == NOW
    assert st["applied"] is None and st["failed_at"] is None and st["failed"] == ""


def test_confirmation_parse_is_the_driver_text():
    assert parse_confirmation((FIX / "smi-lgc-2200.txt").read_text().splitlines()) == {
        "0000000f:01:00.0": (0, 2200)}
    st = state(query=LOCKED_QUERY, record=RECORD_2200)
    assert st["recorded"] == {"0000000f:01:00.0": (0, 2200)} and st["record_boot_id"] == BOOT
    assert st["applied"] == NOW - 60 and st["failed_at"] is None


def test_failed_record_parses_when_and_why():
    st = state(query=IDLE_QUERY, record=f"boot={BOOT}\nfailed={NOW - 120} nvidia-smi -lgc 0,2200 failed: no\n")
    assert st["failed_at"] == NOW - 120 and st["failed"] == "nvidia-smi -lgc 0,2200 failed: no"
    assert st["recorded"] == {} and st["applied"] is None


def test_na_fields_and_failures():
    st = state(query="0, 00000000:0F:01.0, NVIDIA GB10, [N/A], [N/A], [N/A]\n")
    assert st["gpus"][0]["clocks_sm"] is None
    bad = parse_fact(GpuClockState, '##QUERY##\nField "clocks_event_reasons.applications_clocks_setting" is not '
                                    'a valid field to query.\n##QUERY_FAILED##\nboot_id=x\n')
    assert bad["smi"] is False and "not a valid field" in bad["error"]
    none = GpuClockState.default()  # what pyinfra returns when requires_command finds no nvidia-smi
    assert none["smi"] is False and "not installed" in none["error"]


def test_standin_answers_the_exact_query(tmp_path):
    env = {"SIM_NVIDIA_STATE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([str(STANDIN), *query_command("nvidia-smi").split()[1:]], capture_output=True, text=True,
                         env=env, check=True).stdout
    st = state(query=out)
    assert st["gpus"][0]["name"] == "NVIDIA GB10" and st["gpus"][0]["clocks_sm"] == 345  # idle, like a real GPU


def test_fact_command_reads_the_sparks_clock():
    command = GpuClockState().command(nvidia_smi=SMI, record_path="/r")
    assert 'echo "now=$(date +%s)"' in command and "sed 's/^/record: /' /r" in command


# --- drift: each reason, and the converged record ------------------------------------------------------------

def drift(st, mhz=2200, timer_active=True):
    return gc.lock_drift(st, mhz, PERIOD, timer_active=timer_active)


def test_converged_record_is_no_drift_idle_or_busy():
    assert drift(state(query=IDLE_QUERY, record=RECORD_2200)) is None
    assert drift(state(query=LOCKED_QUERY, record=RECORD_2200)) is None
    assert gc.lock_verdict(state(query=IDLE_QUERY, record=RECORD_2200), 2200, PERIOD) is None


def test_no_record_or_another_boots_record():
    assert drift(state(query=IDLE_QUERY)) == "no lock recorded since this boot"
    assert drift(state(query=IDLE_QUERY, record=RECORD_2200, boot="other")) == "no lock recorded since this boot"
    assert gc.lock_verdict(state(query=IDLE_QUERY), 2200, PERIOD)[0] == gc.NOT_LOCKED


def test_failed_application_is_drift_even_when_idle():
    failed = f"boot={BOOT}\nfailed={NOW - 2400} sparkfold: -lgc refused\n"
    verdict = gc.lock_verdict(state(query=IDLE_QUERY, record=failed), 2200, PERIOD)
    assert verdict == (gc.FAILED, "the last application failed 40 min ago: sparkfold: -lgc refused")
    # a failure from an earlier boot is no lock at all
    assert drift(state(query=IDLE_QUERY, record=failed, boot="other")) == "no lock recorded since this boot"


def test_missing_gpu_and_other_ceiling():
    two = IDLE_QUERY + "1, 0000000F:02:00.0, NVIDIA GB10, 345, 3003, Not Active\n"
    assert drift(state(query=two, record=RECORD_2200)) == "1 of 2 GPUs have a recorded lock"
    assert drift(state(query=IDLE_QUERY, record=RECORD_2200), mhz=2100) == (
        "the recorded ceiling is 2200 MHz, not 2100")


def test_clock_above_the_ceiling_is_still_drift():
    # nvidia-smi -rgc on a busy GPU: the clock rises past the ceiling although the record is fresh
    reset = drift(state(record=RECORD_2200))
    assert reset == "GPU 0 runs at 2405 MHz, above the 2200 MHz ceiling (lock reset)"
    assert drift(state(query=LOCKED_QUERY.replace(", 2200,", ", 2215,"), record=RECORD_2200)) is None  # slack


def test_stale_record_names_its_age_and_the_stopped_timer():
    limit = gc.stale_after_s(PERIOD)
    assert limit == 2 * PERIOD + 60
    assert drift(state(query=IDLE_QUERY, record=record(applied=NOW - limit))) is None  # at the limit: fresh
    stale = state(query=IDLE_QUERY, record=record(applied=NOW - 2400))
    assert gc.lock_verdict(stale, 2200, PERIOD, timer_active=False) == (
        gc.STALE, "last applied 40 min ago, more than 2 timer periods of 300 s: sparkfold-gpu-clock.timer is not "
                  "running")
    assert drift(stale, timer_active=True) == "last applied 40 min ago, more than 2 timer periods of 300 s"
    assert drift(stale, timer_active=True).endswith("300 s")
    # a shorter period makes the same record stale sooner
    assert gc.lock_drift(state(query=IDLE_QUERY, record=record(applied=NOW - 200)), 2200, 60) is not None
    assert gc.lock_drift(state(query=IDLE_QUERY, record=record(applied=NOW - 200)), 2200, 300) is None


def test_record_without_a_time_is_stale():
    old_format = f"boot={BOOT}\n{CONFIRMATION}\n"  # written by an older sparkfold
    assert drift(state(query=IDLE_QUERY, record=old_format)) == "the record does not say when the lock was applied"


# --- operation -----------------------------------------------------------------------------------------------

def run_locked(st, timer="active", executing=True, **kw):
    facts = {GpuClockState: with_args({KEY: st}),
             UnitState: with_args({TIMER_KEY: {"enabled": "enabled", "active": timer, "sha256": None,
                                               "sub": "waiting" if timer == "active" else "dead"}})}
    return run_op(gc.gpu_clock_locked, facts, executing=executing, mhz=2200, nvidia_smi=SMI, period_s=PERIOD, **kw)


def test_converged_lock_changes_nothing():
    for executing in (False, True):
        cmds, h = run_locked(state(query=IDLE_QUERY, record=RECORD_2200), executing=executing)
        assert cmds == [] and h.noops == ["GPU clock ceiling is 2200 MHz"]


def test_each_drift_re_applies_and_verifies(caplog):
    caplog.set_level("INFO")
    cases = {
        "no lock recorded since this boot": state(query=IDLE_QUERY),
        "the last application failed": state(query=IDLE_QUERY, record=f"boot={BOOT}\nfailed={NOW} x\n"),
        "the recorded ceiling is 2100 MHz": state(query=IDLE_QUERY, record=RECORD_2200.replace("2200", "2100")),
        "above the 2200 MHz ceiling": state(record=RECORD_2200),
        "last applied 40 min ago": state(query=IDLE_QUERY, record=record(applied=NOW - 2400)),
    }
    for why, st in cases.items():
        caplog.clear()
        cmds, h = run_locked(st, timer="inactive")
        assert h.noops == [] and len(cmds) == 2, why
        assert cmds[0] == ("sh /usr/local/lib/sparkfold/gpu_clock_lock.sh /usr/bin/nvidia-smi 2200 "
                           "/var/lib/sparkfold/gpu-clock.record")
        assert "--query-gpu=clocks.sm" in cmds[1] and "-gt 2215" in cmds[1]
        assert why in caplog.text, (why, caplog.text)  # the run says why it re-applies
    assert "sparkfold-gpu-clock.timer is not running" in caplog.text


def test_no_nvidia_smi_fails_with_fix(caplog):
    cmds, _ = run_locked(GpuClockState.default())  # requires_command found no nvidia-smi
    assert len(cmds) == 1 and "nvidia-smi is not installed" in cmds[0] and "exit 1" in cmds[0]
    # planning: the check rule warns with the fix, and the plan still shows the lock it would make
    cmds, _ = run_locked(GpuClockState.default(), executing=False)
    assert "will fail: GPU clock: cannot read the GPU with /usr/bin/nvidia-smi" in caplog.text
    assert len(cmds) == 2 and "gpu_clock_lock.sh /usr/bin/nvidia-smi 2200" in cmds[0]


# --- the lock script, against the stand-in ----------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the stand-in, like nvidia-smi, locks only as root")


def _run_lock(tmp_path, **standin_state):
    """The lock script then the op's readback, against the nvidia-smi stand-in (state in tmp)."""
    (tmp_path / "nv").mkdir(exist_ok=True)
    if standin_state:
        (tmp_path / "nv" / "state.json").write_text(json.dumps(standin_state))
    rec = tmp_path / "rec" / "gpu-clock.record"
    env = {"SIM_NVIDIA_STATE": str(tmp_path / "nv"), "PATH": "/usr/bin:/bin"}
    lock = subprocess.run(["sh", str(SCRIPT), str(STANDIN), "2200", str(rec)], capture_output=True, text=True,
                          env=env)
    readback = subprocess.run(["sh", "-c", gc._readback_command(2200, str(STANDIN)).get_raw_value()],
                              capture_output=True, text=True, env=env)
    return lock, readback, rec


def _parsed(rec):
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return state(query=IDLE_QUERY, record=rec.read_text(), boot=boot, now=int(time.time()))


@needs_root
def test_lock_script_records_the_answer_and_the_time(tmp_path):
    before = int(time.time())
    lock, readback, rec = _run_lock(tmp_path, busy=True)
    assert lock.returncode == 0, lock.stderr
    assert readback.returncode == 0, readback.stderr  # busy, yet capped at the ceiling
    st = _parsed(rec)
    assert st["recorded"] == {"0000000f:01:00.0": (0, 2200)} and before <= st["applied"] <= int(time.time())
    assert drift(st) is None
    assert [p.name for p in rec.parent.iterdir()] == ["gpu-clock.record"]  # no temporary file left


@needs_root
def test_clamped_lock_records_the_failure_naming_the_applied_ceiling(tmp_path):
    lock, _, rec = _run_lock(tmp_path, clamp_max=1976)
    assert lock.returncode == 1
    assert "sparkfold: the driver applied a GPU clock ceiling of 1976 MHz, not 2200 MHz" in lock.stderr
    st = _parsed(rec)
    assert st["recorded"] == {} and "1976 MHz, not 2200 MHz" in st["failed"]
    assert gc.lock_verdict(st, 2200, PERIOD)[0] == gc.FAILED


@needs_root
def test_refused_lock_replaces_an_earlier_success(tmp_path):
    assert _run_lock(tmp_path)[0].returncode == 0
    lock, _, rec = _run_lock(tmp_path, fail_lgc=3)
    assert lock.returncode == 1 and "-lgc 0,2200 failed" in lock.stderr
    st = _parsed(rec)
    assert st["applied"] is None and "not supported" in st["failed"]  # the older success is not kept


def test_unprivileged_lock_fails_and_records_why(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("needs a user the stand-in refuses")
    lock, _, rec = _run_lock(tmp_path)
    assert lock.returncode == 1 and "Insufficient Permissions" in rec.read_text()


# --- stand-in nvidia-smi: idles low, rises under load, capped by a lock --------------------------------------------

@needs_root
def test_standin_idles_low_and_rises_under_load(tmp_path):
    env = {"SIM_NVIDIA_STATE": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def smi(*args):
        return subprocess.run([str(STANDIN), *args], capture_output=True, text=True, env=env, check=True).stdout

    def clock():
        return int(smi("--query-gpu=clocks.sm", "--format=csv,noheader,nounits"))

    assert clock() == 345
    smi("--sim-set", "busy=true")
    assert clock() == 2405  # unlocked under load: above the ceiling
    smi("-lgc", "0,2200")
    assert clock() == 2200
    smi("--sim-set", "busy=false")
    assert clock() == 345  # locked or not, an idle GPU reads low
    smi("-rgc")
    assert clock() == 345 and json.loads((tmp_path / "state.json").read_text())["locked"] is None


# --- units ---------------------------------------------------------------------------------------------------

def test_service_template_runs_the_lock_script():
    text = gc.render_unit(2200, SMI, PERIOD)
    assert text.startswith("# Managed by sparkfold")
    lines = text.splitlines()
    for line in ("Type=oneshot", "After=nvidia-persistenced.service", "Wants=nvidia-persistenced.service",
                 "ExecStart=/bin/sh /usr/local/lib/sparkfold/gpu_clock_lock.sh /usr/bin/nvidia-smi 2200 "
                 "/var/lib/sparkfold/gpu-clock.record"):
        assert line in lines
    # the timer starts it again: a unit that stayed active would make those starts no-ops
    assert not any(line.startswith(("RemainAfterExit", "[Install]")) for line in lines)
    pre = [line for line in lines if line.startswith("ExecStartPre=")][0]
    assert "timeout 60" in pre and "/dev/nvidia0" in pre and "/usr/bin/nvidia-smi -L" in pre
    assert "$" not in text and "%" not in text  # nothing systemd would expand
    assert "/usr/local/bin/nvidia-smi 1800 " in gc.render_unit(1800, "/usr/local/bin/nvidia-smi", PERIOD)


def test_timer_template_repeats_the_service():
    lines = gc.render_timer(2200, 120).splitlines()
    for line in ("OnBootSec=30s", "OnUnitActiveSec=120s", "Unit=sparkfold-gpu-clock.service",
                 "WantedBy=timers.target"):
        assert line in lines
    assert "OnUnitActiveSec=300s" in gc.render_timer(2200, 300).splitlines()


def test_timer_runs_after_boot_within_its_own_period():
    # a period shorter than the boot delay: the first run after boot comes no later than the period would have it
    assert "OnBootSec=10s" in gc.render_timer(2200, 10).splitlines()
    assert "OnBootSec=30s" in gc.render_timer(2200, 30).splitlines()


def test_deploy_installs_script_and_service_locks_then_starts_the_timer(monkeypatch):
    from types import SimpleNamespace
    calls = []
    service_put = SimpleNamespace(changed=True)
    monkeypatch.setattr(gc, "script_installed", lambda *a: calls.append(("script", a)))
    monkeypatch.setattr(gc, "unit_file", lambda *a: calls.append(("file", a)) or service_put)
    monkeypatch.setattr(gc, "unit_service", lambda **kw: calls.append(("service", kw)))
    monkeypatch.setattr(gc, "unit_installed", lambda *a, **kw: calls.append(("unit", a, kw)))
    monkeypatch.setattr(gc, "gpu_clock_locked", lambda **kw: calls.append(("lock", kw)))
    gc.gpu_clock._inner(SimpleNamespace(gpu_clock_mhz=2100, nvidia_smi_path="/opt/bin/nvidia-smi",
                                        gpu_clock_period_s=90))
    assert calls[0] == ("script", ("gpu_clock_lock.sh",))
    assert calls[1] == ("file", ("sparkfold-gpu-clock.service", gc.render_unit(2100, "/opt/bin/nvidia-smi", 90)))
    service = calls[2][1]
    assert (service["service"], service["running"], service["file_put"]) == (
        "sparkfold-gpu-clock.service", False, service_put)  # reloaded when its file changed
    assert "enabled" not in service  # the timer starts it: its enablement is left alone
    assert calls[3] == ("lock", {"name": "locked at 2100 MHz", "mhz": 2100, "nvidia_smi": "/opt/bin/nvidia-smi",
                                 "period_s": 90})
    assert calls[4] == ("unit", ("sparkfold-gpu-clock.timer", gc.render_timer(2100, 90)), {})


def test_nvidia_smi_is_quoted_in_every_command():
    # the settings' pattern already refuses such a path; the commands keep it one word regardless
    assert query_command("/opt/a b/nvidia-smi").startswith("'/opt/a b/nvidia-smi' --query-gpu=")
    readback = str(gc._readback_command(1500, "/opt/a b/nvidia-smi").get_raw_value())
    assert "$('/opt/a b/nvidia-smi' --query-gpu" in readback
