#!/bin/sh
# Managed by sparkfold: edits are replaced on the next deploy.
# gpu_clock_lock.sh NVIDIA_SMI MHZ RECORD
# Locks every GPU's clock ceiling at MHZ (nvidia-smi -lgc 0,MHZ), checks the driver applied exactly MHZ (it clamps
# requests it cannot run), and replaces RECORD at once (write, then rename) with the boot id, the time and the
# driver's confirmation. A failed attempt replaces it with the boot id, the time and why, and exits 1: the deploy
# and status.py read the record, so a failure is reported, not hidden behind an older success.
# Run by sparkfold-gpu-clock.service (its timer repeats it), by the deploy, and right before a rank starts.
set -u
smi=$1 mhz=$2 record=$3
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)
now=$(date +%s)
mkdir -p "$(dirname "$record")" || exit 1
tmp="$record.tmp.$$"

replace_record() {  # stdin -> RECORD, whole or not at all
    cat > "$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$record"
}

fail() {
    why=$(printf '%s' "$*" | tr '\n' ' ')
    printf 'boot=%s\nfailed=%s %s\n' "$boot" "$now" "$why" | replace_record
    echo "sparkfold: $why" >&2
    exit 1
}

out=$("$smi" -lgc "0,$mhz" 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || fail "$smi -lgc 0,$mhz failed (needs root and a Volta or newer GPU): $out"
got=$(printf '%s\n' "$out" | sed -n 's/.*gpuClkMax \([0-9]*\)).*/\1/p' | sort -u | tr '\n' ' ' | sed 's/ $//')
[ "$got" = "$mhz" ] || fail "the driver applied a GPU clock ceiling of ${got:-no} MHz, not $mhz MHz (it clamps" \
    "requests it cannot run); set gpu_clock_mhz to a clock the GPU supports (nvidia-smi -q -d SUPPORTED_CLOCKS)" \
    "on both Sparks"
{ printf 'boot=%s\napplied=%s\n' "$boot" "$now"; printf '%s\n' "$out" | grep 'GPU clocks set to'; } | replace_record
