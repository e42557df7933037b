"""The GPU clock lock as it stands right now (a LIVE fact: it runs nvidia-smi every time).

What real nvidia-smi offers, and what this relies on (researched in public sources, see docs in the report):
- `nvidia-smi -lgc MIN,MAX` confirms with one line per GPU, verbatim from a DGX Spark journal (driver 580.173.02):
  `GPU clocks set to "(gpuClkMin 0, gpuClkMax 2200)" for GPU 0000000F:01:00.0` then `All done.`. The numbers are
  what the driver applied, so a clamped request shows a different gpuClkMax. This is the only place nvidia-smi states
  the locked values. `-rgc` answers `All done.`.
- No query reports the locked range afterwards: `-q -d CLOCK` has Clocks / Applications Clocks / Default
  Applications Clocks / Max Clocks / Max Customer Boost Clocks / Clock Policy, and none moves with -lgc (Max Clocks
  are hardware maxima; on GB10 "Applications Clocks" stays at its default). A third party states driver 595.79 has
  no "locked clocks" field at all. So the applied value is recorded from the -lgc confirmation by the operation
  (record file, with the boot id: a reboot loses the lock), and this fact reads that record back.
- Live, it reads `--query-gpu=index,pci.bus_id,name,clocks.sm,clocks.max.sm,
  clocks_event_reasons.applications_clocks_setting --format=csv,noheader,nounits`: one CSV row per GPU, ", "
  separated, "[N/A]" for what the GPU does not report (GB10 reports memory as [N/A]). clocks.sm above the ceiling
  proves the lock is gone (a lock caps it: ~2171 MHz under load with 0,2200). An idle GPU sits far below any
  ceiling (an idle H200 reads 345 MHz of 1980), so a reset on an idle GPU is not seen here: the record's time says
  how fresh the lock is (a timer re-applies it), and that is what the deploy decides on. UNVERIFIED: when
  `applications_clocks_setting` reads "Active" under a lock with a 0 floor. It is reported for the log only.
- The record (operations/remote/gpu_clock_lock.sh writes it whole): `boot=<boot id>`, then `applied=<epoch s>` and
  the confirmation lines, or `failed=<epoch s> <why>` when the newest attempt failed.
"""

from __future__ import annotations

import re
import shlex
from typing import TypedDict

from pyinfra.api import FactBase

from operations.layout import GPU_CLOCK_RECORD as RECORD_PATH

QUERY_FIELDS = ("index", "pci.bus_id", "name", "clocks.sm", "clocks.max.sm",
                "clocks_event_reasons.applications_clocks_setting")
CONFIRM_RE = re.compile(r'GPU clocks set to "\(gpuClkMin (\d+), gpuClkMax (\d+)\)" for GPU (\S+)')


def _mhz(text: str) -> int | None:  # also seconds: a whole number or None
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse_confirmation(lines) -> dict[str, tuple[int, int]]:
    """{bus id: (min, max)} from nvidia-smi -lgc output lines."""
    found = {}
    for line in lines:
        match = CONFIRM_RE.search(line)
        if match:
            found[match.group(3).rstrip(".").lower()] = (int(match.group(1)), int(match.group(2)))
    return found


def query_command(nvidia_smi: str = "nvidia-smi") -> str:
    # the settings' pattern already makes the path safe; quoting keeps it one word whatever reaches here
    return f"{shlex.quote(nvidia_smi)} --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits"


class GpuDict(TypedDict):
    index: int
    bus_id: str  # lower case, e.g. "0000000f:01:00.0"
    name: str
    clocks_sm: int | None  # MHz; None for "[N/A]"
    clocks_max_sm: int | None
    apps_clocks_reason: str  # clocks_event_reasons.applications_clocks_setting, for the log


class GpuClockStateDict(TypedDict):
    smi: bool  # nvidia-smi answered the query with at least one GPU
    error: str  # why not
    boot_id: str
    gpus: list[GpuDict]
    record_boot_id: str  # the boot the record was written in
    recorded: dict[str, tuple[int, int]]  # bus id -> (min, max) the driver confirmed
    now: int | None  # the Spark's clock (epoch s), to age the record without trusting this machine's clock
    applied: int | None  # when the recorded lock was applied (epoch s)
    failed_at: int | None  # when the newest attempt failed (epoch s); None when it succeeded
    failed: str  # why it failed


class GpuClockState(FactBase[GpuClockStateDict]):
    """Each GPU's live clocks from nvidia-smi, the boot id, and the lock record written from the driver's -lgc
    confirmation: whether the clock ceiling still holds. nvidia-smi missing reads as the default (smi False)."""

    @staticmethod
    def default() -> GpuClockStateDict:
        return {"smi": False, "error": "nvidia-smi is not installed", "boot_id": "", "gpus": [], "record_boot_id": "",
                "recorded": {}, "now": None, "applied": None, "failed_at": None, "failed": ""}

    def requires_command(self, nvidia_smi: str = "nvidia-smi", record_path: str = RECORD_PATH) -> str:
        return shlex.quote(nvidia_smi.split()[-1])  # a path or a name: `command -v` takes either

    def command(self, nvidia_smi: str = "nvidia-smi", record_path: str = RECORD_PATH) -> str:
        record = shlex.quote(record_path)
        return (
            f"echo '##QUERY##'; {query_command(nvidia_smi)} 2>&1 || echo '##QUERY_FAILED##'; "
            "echo \"boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)\"; echo \"now=$(date +%s)\"; "
            f"if [ -f {record} ]; then sed 's/^/record: /' {record}; fi; true"
        )

    def process(self, output: list[str]) -> GpuClockStateDict:
        gpu_state: GpuClockStateDict = {"smi": False, "error": "", "boot_id": "", "gpus": [], "record_boot_id": "",
                                        "recorded": {}, "now": None, "applied": None, "failed_at": None, "failed": ""}
        errors = []
        in_query = False
        record = []
        for line in output:
            if line.startswith("##QUERY##"):
                gpu_state["smi"], in_query = True, True
            elif line.startswith("##QUERY_FAILED##"):
                gpu_state["smi"], in_query = False, False
            elif line.startswith("boot_id="):
                gpu_state["boot_id"], in_query = line[len("boot_id="):].strip(), False
            elif line.startswith("now="):
                gpu_state["now"], in_query = _mhz(line[len("now="):]), False
            elif line.startswith("record: "):
                record.append(line[len("record: "):])
            elif in_query:
                fields = [f.strip() for f in line.split(",")]
                if len(fields) == len(QUERY_FIELDS) and fields[0].isdigit():
                    gpu_state["gpus"].append({
                        "index": int(fields[0]), "bus_id": fields[1].lower(), "name": fields[2],
                        "clocks_sm": _mhz(fields[3]), "clocks_max_sm": _mhz(fields[4]),
                        "apps_clocks_reason": fields[5],
                    })
                elif line.strip():
                    errors.append(line.strip())
        for line in record:
            if line.startswith("boot="):
                gpu_state["record_boot_id"] = line[len("boot="):].strip()
            elif line.startswith("applied="):
                gpu_state["applied"] = _mhz(line[len("applied="):])
            elif line.startswith("failed="):
                when, _, why = line[len("failed="):].partition(" ")
                gpu_state["failed_at"], gpu_state["failed"] = _mhz(when), why.strip() or "no reason given"
        gpu_state["recorded"] = parse_confirmation(record)
        if not gpu_state["gpus"] and not errors:
            errors.append("nvidia-smi listed no GPU")
        if not gpu_state["gpus"]:
            gpu_state["smi"] = False
        gpu_state["error"] = "; ".join(errors)
        return gpu_state
