"""GPU clock: the live fact parses nvidia-smi's real formats; the op locks on drift, verifies the driver's answer,
and stays silent when the ceiling holds. The unit template renders the persisted lock."""

import subprocess
from pathlib import Path

from harness import parse_fact, run_op, with_args

from operations import gpu_clock as gc
from operations.facts.gpu import GpuClockState, parse_confirmation, query_command

FIX = Path(__file__).parent / "fixtures" / "host"
STANDIN = Path(__file__).resolve().parents[1] / "sim" / "standins" / "nvidia-smi"
BOOT = "3f0c2a9e-1d2b-4c5e-8f7a-6b5c4d3e2f1a"
SMI = "/usr/bin/nvidia-smi"
KEY = f"nvidia_smi={SMI}, record_path=/var/lib/sparkfold/gpu-clock.record"


def fact_output(query: str, record: str | None, boot=BOOT) -> str:
    out = "##QUERY##\n" + query + f"boot_id={boot}\n"
    if record is not None:
        out += "".join(f"record: {line}\n" for line in record.splitlines())
    return out


def state(query_file="smi-query-unlocked.txt", record=None, boot=BOOT, query=None):
    q = query if query is not None else (FIX / query_file).read_text()
    return parse_fact(GpuClockState, fact_output(q, record, boot))


LOCKED_QUERY = "0, 0000000F:01:00.0, NVIDIA GB10, 2200, 3003, Active\n"
RECORD_2200 = f"boot={BOOT}\n" + (FIX / "smi-lgc-2200.txt").read_text().splitlines()[0] + "\n"


# --- fact ----------------------------------------------------------------------------------------------------

def test_query_row_parses_real_csv():
    st = state()
    assert st["smi"] is True and st["error"] == ""
    assert st["gpus"] == [{"index": 0, "bus_id": "0000000f:01:00.0", "name": "NVIDIA GB10", "clocks_sm": 2405,
                           "clocks_max_sm": 3003, "apps_clocks_reason": "Not Active"}]
    assert st["boot_id"] == BOOT and st["recorded"] == {}


def test_confirmation_parse_is_the_driver_text():
    assert parse_confirmation((FIX / "smi-lgc-2200.txt").read_text().splitlines()) == {
        "0000000f:01:00.0": (0, 2200)}
    st = state(query=LOCKED_QUERY, record=RECORD_2200)
    assert st["recorded"] == {"0000000f:01:00.0": (0, 2200)} and st["record_boot_id"] == BOOT


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
    assert st["gpus"][0]["name"] == "NVIDIA GB10" and st["gpus"][0]["clocks_sm"] == 2405


# --- drift ---------------------------------------------------------------------------------------------------

def test_lock_drift_cases():
    assert gc.lock_drift(state(query=LOCKED_QUERY, record=RECORD_2200), 2200) is None
    assert "no lock recorded" in gc.lock_drift(state(query=LOCKED_QUERY), 2200)
    assert "since this boot" in gc.lock_drift(state(query=LOCKED_QUERY, record=RECORD_2200, boot="other"), 2200)
    assert "2200 MHz, not 2100" in gc.lock_drift(state(query=LOCKED_QUERY, record=RECORD_2200), 2100)
    reset = gc.lock_drift(state(record=RECORD_2200), 2200)  # nvidia-smi -rgc: back at 2405
    assert "2405 MHz, above the 2200 MHz ceiling" in reset


# --- operation -----------------------------------------------------------------------------------------------

def test_converged_lock_changes_nothing():
    facts = {GpuClockState: with_args({KEY: state(query=LOCKED_QUERY, record=RECORD_2200)})}
    cmds, h = run_op(gc.gpu_clock_locked, facts, executing=True, mhz=2200, nvidia_smi=SMI)
    assert cmds == [] and h.noops == ["GPU clock ceiling is 2200 MHz"]


def test_reset_lock_is_relocked_and_verified():
    facts = {GpuClockState: with_args({KEY: state(record=RECORD_2200)})}
    cmds, _ = run_op(gc.gpu_clock_locked, facts, executing=True, mhz=2200, nvidia_smi=SMI)
    assert len(cmds) == 2
    assert cmds[0].startswith("out=$(/usr/bin/nvidia-smi -lgc 0,2200 2>&1)")
    assert "gpuClkMax" in cmds[0] and "/var/lib/sparkfold/gpu-clock.record" in cmds[0]
    assert "--query-gpu=clocks.sm" in cmds[1] and "-gt 2215" in cmds[1]


def test_no_nvidia_smi_fails_with_fix(caplog):
    facts = {GpuClockState: with_args({KEY: GpuClockState.default()})}  # requires_command found no nvidia-smi
    cmds, _ = run_op(gc.gpu_clock_locked, facts, executing=True, mhz=2200, nvidia_smi=SMI)
    assert len(cmds) == 1 and "nvidia-smi is not installed" in cmds[0] and "exit 1" in cmds[0]
    # planning: the check rule warns with the fix, and the plan still shows the lock it would make
    cmds, _ = run_op(gc.gpu_clock_locked, facts, executing=False, mhz=2200, nvidia_smi=SMI)
    assert "will fail: GPU clock: cannot read the GPU with /usr/bin/nvidia-smi" in caplog.text
    assert len(cmds) == 2 and "-lgc 0,2200" in cmds[0]


def _run_lock(tmp_path, **standin_state):
    """Run the op's lock + readback commands against the nvidia-smi stand-in (as root or not, state in tmp)."""
    import json
    (tmp_path / "nv").mkdir()
    if standin_state:
        (tmp_path / "nv" / "state.json").write_text(json.dumps(standin_state))
    record = tmp_path / "rec" / "gpu-clock.record"
    env = {"SIM_NVIDIA_STATE": str(tmp_path / "nv"), "PATH": "/usr/bin:/bin"}
    results = []
    for cmd in (gc._lock_command(2200, str(STANDIN), str(record)), gc._readback_command(2200, str(STANDIN))):
        results.append(subprocess.run(["sh", "-c", cmd.get_raw_value()], capture_output=True, text=True, env=env))
    return results, record


def test_lock_command_against_standin_records_the_answer(tmp_path):
    import os
    if os.geteuid() != 0:
        import pytest
        pytest.skip("the stand-in, like nvidia-smi, locks only as root")
    (lock, readback), record = _run_lock(tmp_path)
    assert lock.returncode == 0, lock.stderr
    assert readback.returncode == 0, readback.stderr
    text = record.read_text()
    assert text.startswith("boot=") and 'gpuClkMax 2200)" for GPU 0000000F:01:00.0' in text


def test_clamped_lock_fails_naming_the_applied_ceiling(tmp_path):
    import os
    if os.geteuid() != 0:
        import pytest
        pytest.skip("the stand-in, like nvidia-smi, locks only as root")
    (lock, _), record = _run_lock(tmp_path, clamp_max=1976)
    assert lock.returncode == 1 and not record.exists()
    assert "sparkfold: the driver applied a GPU clock ceiling of 1976 MHz, not 2200 MHz" in lock.stderr


# --- unit ----------------------------------------------------------------------------------------------------

def test_unit_template():
    text = gc.render_unit(2200, SMI)
    assert text.startswith("# Managed by sparkfold")
    for line in ("Type=oneshot", "RemainAfterExit=yes", "After=nvidia-persistenced.service",
                 "Wants=nvidia-persistenced.service", "ExecStart=/usr/bin/nvidia-smi -lgc 0,2200",
                 "WantedBy=multi-user.target"):
        assert line in text.splitlines()
    pre = [line for line in text.splitlines() if line.startswith("ExecStartPre=")][0]
    assert "timeout 60" in pre and "/dev/nvidia0" in pre and "/usr/bin/nvidia-smi -L" in pre
    assert "$" not in text and "%" not in text  # nothing systemd would expand
    assert "ExecStart=/usr/local/bin/nvidia-smi -lgc 0,1800" in gc.render_unit(1800, "/usr/local/bin/nvidia-smi")


def test_deploy_persists_then_locks(monkeypatch):
    from types import SimpleNamespace
    calls = []
    monkeypatch.setattr(gc, "unit_installed", lambda *a, **kw: calls.append(("unit", a, kw)))
    monkeypatch.setattr(gc, "gpu_clock_locked", lambda **kw: calls.append(("lock", kw)))
    gc.gpu_clock._inner(SimpleNamespace(gpu_clock_mhz=2100, nvidia_smi_path="/opt/bin/nvidia-smi"))
    assert calls[0] == ("unit", ("sparkfold-gpu-clock.service", gc.render_unit(2100, "/opt/bin/nvidia-smi")), {})
    assert calls[1] == ("lock", {"name": "locked at 2100 MHz", "mhz": 2100, "nvidia_smi": "/opt/bin/nvidia-smi"})
