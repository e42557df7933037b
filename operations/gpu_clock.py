"""GPU clock ceiling: locked with `nvidia-smi -lgc 0,<MHz>` and kept locked by sparkfold-gpu-clock.timer.

A lock is lost at a reboot, a driver reload or an `nvidia-smi -rgc`, and no query reports it; an idle GPU clocks far
below any ceiling, so a reset cannot be seen from the live clock until the GPU is busy. So the lock is re-applied
rather than watched: operations/remote/gpu_clock_lock.sh applies it and records the driver's confirmation with the
boot id and the time (or why it failed); the timer runs it at boot and every gpu_clock_period_s, the deploy runs it
when the record is missing, failed, stale or at another ceiling (or a GPU reads above the ceiling), and the pair
step runs it right before a rank starts. After locking the deploy checks the driver applied exactly the asked
ceiling (a clamped request fails this host), so both Sparks end with the same ceiling or the run stops."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import StringCommand, deploy, operation

from operations.facts.gpu import GpuClockState, GpuClockStateDict
from operations.facts.systemd import UnitState, unit_running
from operations.layout import GPU_CLOCK_RECORD, GPU_CLOCK_SCRIPT, GPU_CLOCK_TIMER, GPU_CLOCK_UNIT, script_path
from operations.owned.units import script_installed, unit_file, unit_installed, unit_service
from operations.rank.commands import lock_command
from operations.util import check_failed, sh
from operations.util.durations import duration
from operations.util.fact_reuse import fact_until_change
from operations.util.templates import render

OVER_CEILING_MHZ = 15  # a locked GPU reads at most the ceiling (one clock step of slack)
STALE_PERIODS = 2  # a record older than this many timer periods (plus slack) means the timer is not doing its job
BOOT_DELAY_S = 30  # the timer's first run after boot (OnBootSec), at most gpu_clock_period_s
STALE_SLACK_S = 60  # the timer's OnBootSec and a slow run of the service
NOT_LOCKED, FAILED, STALE = "not locked", "failed", "stale"  # lock_verdict's words (status.py shows them)


def stale_after_s(period_s: int) -> int:
    return STALE_PERIODS * int(period_s) + STALE_SLACK_S


def render_unit(mhz: int, nvidia_smi: str, period_s: int) -> str:
    return render("sparkfold-gpu-clock.service.j2", mhz=int(mhz), nvidia_smi=nvidia_smi, period_s=int(period_s),
                  script=script_path(GPU_CLOCK_SCRIPT), record=GPU_CLOCK_RECORD)


def render_timer(mhz: int, period_s: int) -> str:
    # after boot: once the driver is up (BOOT_DELAY_S), and never later than the period would have it
    return render("sparkfold-gpu-clock.timer.j2", mhz=int(mhz), period_s=int(period_s),
                  boot_s=min(BOOT_DELAY_S, int(period_s)), service=GPU_CLOCK_UNIT)


def lock_verdict(gpu_state: GpuClockStateDict, mhz: int, period_s: int,
                 timer_active: bool | None = None) -> tuple[str, str] | None:
    """(NOT_LOCKED, FAILED or STALE, why) when the lock must be applied now, or None when the record shows it held:
    from this boot, not failed, for every GPU at `mhz`, no GPU above it, and applied within stale_after_s(period_s).
    timer_active (the timer's state) only explains a stale record.
    The record is matched by count, not bus id: the -lgc answer and --query-gpu=pci.bus_id may spell the id
    differently (a published GB10 query row reads 00000000:0F:01.0 against the journal's 0000000F:01:00.0)."""
    now = gpu_state.get("now")
    if (not gpu_state["boot_id"] or gpu_state["record_boot_id"] != gpu_state["boot_id"]
            or not (gpu_state["recorded"] or gpu_state.get("failed_at"))):
        return NOT_LOCKED, "no lock recorded since this boot"
    failed_at = gpu_state.get("failed_at")
    if failed_at is not None:
        when = f" {duration(now - failed_at)} ago" if now is not None else ""
        return FAILED, f"the last application failed{when}: {gpu_state.get('failed') or 'no reason given'}"
    if len(gpu_state["recorded"]) < len(gpu_state["gpus"]):
        return NOT_LOCKED, f"{len(gpu_state['recorded'])} of {len(gpu_state['gpus'])} GPUs have a recorded lock"
    ceilings = sorted({top for _, top in gpu_state["recorded"].values()})
    if ceilings != [mhz]:
        return NOT_LOCKED, f"the recorded ceiling is {', '.join(map(str, ceilings))} MHz, not {mhz}"
    for gpu in gpu_state["gpus"]:
        if gpu["clocks_sm"] is not None and gpu["clocks_sm"] > mhz + OVER_CEILING_MHZ:
            return NOT_LOCKED, (f"GPU {gpu['index']} runs at {gpu['clocks_sm']} MHz, above the {mhz} MHz ceiling "
                                "(lock reset)")
    applied = gpu_state.get("applied")
    if applied is None or now is None:
        return STALE, "the record does not say when the lock was applied"
    if now - applied > stale_after_s(period_s):
        why = f": {GPU_CLOCK_TIMER} is not running" if timer_active is False else ""
        return STALE, (f"last applied {duration(now - applied)} ago, more than {STALE_PERIODS} timer periods of "
                       f"{int(period_s)} s{why}")
    return None


def lock_drift(gpu_state: GpuClockStateDict, mhz: int, period_s: int, timer_active: bool | None = None) -> str | None:
    """Why the lock must be applied now (lock_verdict's reason), or None."""
    verdict = lock_verdict(gpu_state, mhz, period_s, timer_active)
    return verdict[1] if verdict else None


def _readback_command(mhz: int, nvidia_smi: str) -> StringCommand:
    """After locking: no GPU may read above the ceiling (a few tries: the clock settles within a moment)."""
    limit = int(mhz) + OVER_CEILING_MHZ
    message = sh(f"sparkfold: after nvidia-smi -lgc 0,{int(mhz)} a GPU still reads above {mhz} MHz:")
    return StringCommand(
        "for try in 1 2 3 4 5; do over=; "
        f"for c in $({sh(nvidia_smi)} --query-gpu=clocks.sm --format=csv,noheader,nounits); do "
        "case $c in *[!0-9]*|'') continue;; esac; "
        f"[ \"$c\" -gt {limit} ] && over=$c; done; "
        "[ -z \"$over\" ] && exit 0; sleep 1; done; "
        f"echo {message} \"$over MHz\" >&2; exit 1"
    )


@operation()
def gpu_clock_locked(mhz: int, nvidia_smi: str, period_s: int, record_path: str = GPU_CLOCK_RECORD):
    """Every GPU's clock ceiling is `mhz`, applied recently (the timer's record) or now, verified from the driver's
    answer. Custom: no core operation reads back a clock lock."""
    mhz = int(mhz)
    gpu_state = host.get_fact(GpuClockState, nvidia_smi=nvidia_smi, record_path=record_path)
    unreadable = [] if gpu_state["smi"] else [
        f"cannot read the GPU with {nvidia_smi} ({gpu_state['error'] or 'no answer'}); check the NVIDIA driver "
        "(nvidia-smi -L) and the nvidia_smi path"]
    if (yield from check_failed("GPU clock", unreadable)):
        return
    timer = fact_until_change(host, UnitState, unit=GPU_CLOCK_TIMER)  # the timer's own step asks it again
    drift = lock_drift(gpu_state, mhz, period_s, timer_active=unit_running(timer))
    if drift is None:
        host.noop(f"GPU clock ceiling is {mhz} MHz")
        return
    logger.info(f"{host.name}: GPU clock: {drift}")  # why the lock is applied now (--dry says it too)
    yield lock_command(mhz, nvidia_smi, record_path)
    yield _readback_command(mhz, nvidia_smi)


@deploy("GPU clock ceiling")
def gpu_clock(s) -> None:
    """The lock script and its oneshot unit, the lock itself, then the timer that repeats it; all need root."""
    script_installed(GPU_CLOCK_SCRIPT)
    service = unit_file(GPU_CLOCK_UNIT, render_unit(s.gpu_clock_mhz, s.nvidia_smi_path, s.gpu_clock_period_s))
    # the timer's start is a no-op on an active unit: an older sparkfold's unit (RemainAfterExit) is stopped once
    unit_service(name=f"{GPU_CLOCK_UNIT} idle between the timer's runs", service=GPU_CLOCK_UNIT, file_put=service,
                 running=False)
    # locked before the timer starts: the run judges (and reports) the record the timer left, not its own first run
    gpu_clock_locked(name=f"locked at {s.gpu_clock_mhz} MHz", mhz=s.gpu_clock_mhz, nvidia_smi=s.nvidia_smi_path,
                     period_s=s.gpu_clock_period_s)
    unit_installed(GPU_CLOCK_TIMER, render_timer(s.gpu_clock_mhz, s.gpu_clock_period_s))
