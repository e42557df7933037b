"""GPU clock ceiling: locked live with `nvidia-smi -lgc 0,<MHz>` and persisted by sparkfold-gpu-clock.service.

The live operation reads the lock back (operations.facts.gpu.GpuClockState: the driver's confirmation recorded
for this boot, and the live SM clock) so a reset (`nvidia-smi -rgc`) or a reboot without the unit is drift that
the next run repairs. After locking it checks the driver applied exactly the asked ceiling (a clamped request
fails this host), so both Sparks end with the same ceiling or the run stops."""

from __future__ import annotations

from pyinfra import host, logger, state
from pyinfra.api import StringCommand, deploy, operation

from operations.facts.gpu import GpuClockState, GpuClockStateDict
from operations.layout import GPU_CLOCK_RECORD, GPU_CLOCK_UNIT
from operations.util import check_failed, sh
from operations.util.templates import render
from operations.util.units import unit_installed

OVER_CEILING_MHZ = 15  # a locked GPU reads at most the ceiling (one clock step of slack)


def render_unit(mhz: int, nvidia_smi: str) -> str:
    return render("sparkfold-gpu-clock.service.j2", mhz=int(mhz), nvidia_smi=nvidia_smi)


def lock_drift(st: GpuClockStateDict, mhz: int) -> str | None:
    """Why the GPUs are not locked at `mhz` now, or None when they are.
    The record is matched by count, not bus id: the -lgc answer and --query-gpu=pci.bus_id may spell the id
    differently (a published GB10 query row reads 00000000:0F:01.0 against the journal's 0000000F:01:00.0)."""
    if not st["recorded"] or not st["boot_id"] or st["record_boot_id"] != st["boot_id"]:
        return "no lock recorded since this boot"
    if len(st["recorded"]) < len(st["gpus"]):
        return f"{len(st['recorded'])} of {len(st['gpus'])} GPUs have a recorded lock"
    ceilings = sorted({top for _, top in st["recorded"].values()})
    if ceilings != [mhz]:
        return f"the recorded ceiling is {', '.join(map(str, ceilings))} MHz, not {mhz}"
    for gpu in st["gpus"]:
        if gpu["clocks_sm"] is not None and gpu["clocks_sm"] > mhz + OVER_CEILING_MHZ:
            return f"GPU {gpu['index']} runs at {gpu['clocks_sm']} MHz, above the {mhz} MHz ceiling (lock reset)"
    return None


def _lock_command(mhz: int, nvidia_smi: str, record_path: str) -> StringCommand:
    """Lock, print the driver's answer, fail unless every GPU got gpuClkMax == mhz, then record the answer."""
    directory = record_path.rsplit("/", 1)[0] or "/"
    failed = sh(f"sparkfold: {nvidia_smi} -lgc 0,{mhz} failed (needs root and a Volta or newer GPU):")
    clamped = (f"MHz, not {mhz} MHz (it clamps requests it cannot run); set gpu_clock_mhz to a clock "
               f"the GPU supports (nvidia-smi -q -d SUPPORTED_CLOCKS) on both Sparks")
    return StringCommand(
        f"out=$({nvidia_smi} -lgc 0,{int(mhz)} 2>&1); rc=$?; printf '%s\\n' \"$out\"; "
        f"if [ $rc -ne 0 ]; then echo {failed} \"$out\" >&2; exit 1; fi; "
        "got=$(printf '%s\\n' \"$out\" | sed -n 's/.*gpuClkMax \\([0-9]*\\)).*/\\1/p' | sort -u "
        "| tr '\\n' ' ' | sed 's/ $//'); "
        f"if [ \"$got\" != {int(mhz)} ]; then "
        f"echo \"sparkfold: the driver applied a GPU clock ceiling of ${{got:-no}}\" {sh(clamped)} >&2; exit 1; fi; "
        f"mkdir -p {sh(directory)} && {{ echo \"boot=$(cat /proc/sys/kernel/random/boot_id)\"; "
        f"printf '%s\\n' \"$out\" | grep 'GPU clocks set to'; }} > {sh(record_path + '.tmp')} "
        f"&& chmod 644 {sh(record_path + '.tmp')} && mv {sh(record_path + '.tmp')} {sh(record_path)}"
    )


def _readback_command(mhz: int, nvidia_smi: str) -> StringCommand:
    """After locking: no GPU may read above the ceiling (a few tries: the clock settles within a moment)."""
    limit = int(mhz) + OVER_CEILING_MHZ
    message = sh(f"sparkfold: after nvidia-smi -lgc 0,{int(mhz)} a GPU still reads above {mhz} MHz:")
    return StringCommand(
        "for try in 1 2 3 4 5; do over=; "
        f"for c in $({nvidia_smi} --query-gpu=clocks.sm --format=csv,noheader,nounits); do "
        "case $c in *[!0-9]*|'') continue;; esac; "
        f"[ \"$c\" -gt {limit} ] && over=$c; done; "
        "[ -z \"$over\" ] && exit 0; sleep 1; done; "
        f"echo {message} \"$over MHz\" >&2; exit 1"
    )


@operation()
def gpu_clock_locked(mhz: int, nvidia_smi: str, record_path: str = GPU_CLOCK_RECORD):
    """Every GPU's clock ceiling is `mhz` right now (nvidia-smi -lgc 0,<mhz>), verified from the driver's answer.
    Custom: no core operation reads back a clock lock."""
    mhz = int(mhz)
    st = host.get_fact(GpuClockState, nvidia_smi=nvidia_smi, record_path=record_path)
    unreadable = [] if st["smi"] else [f"cannot read the GPU with {nvidia_smi} ({st['error'] or 'no answer'}); "
                                       "check the NVIDIA driver (nvidia-smi -L) and the nvidia_smi path"]
    if (yield from check_failed("GPU clock", unreadable)):
        return
    drift = lock_drift(st, mhz)
    if drift is None:
        host.noop(f"GPU clock ceiling is {mhz} MHz")
        return
    if state.config.DIFF:  # like files.put under --diff: say what differs
        host.log(f"GPU clock: {drift}", logger.info)
    yield _lock_command(mhz, nvidia_smi, record_path)
    yield _readback_command(mhz, nvidia_smi)


@deploy("GPU clock ceiling")
def gpu_clock(s) -> None:
    """The ceiling persisted by a unit (applied at boot) and locked now; every operation needs root."""
    unit_installed(GPU_CLOCK_UNIT, render_unit(s.gpu_clock_mhz, s.nvidia_smi_path))
    gpu_clock_locked(name=f"locked at {s.gpu_clock_mhz} MHz", mhz=s.gpu_clock_mhz, nvidia_smi=s.nvidia_smi_path)
