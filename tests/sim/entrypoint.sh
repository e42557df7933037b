#!/bin/bash
# The container's entrypoint of one simulated Spark: prepare what systemd needs, then exec systemd as PID 1 (as
# kind's node images do). It runs again on every container start, so `docker restart` is a reboot. Everything the
# Spark runs is a unit from tests/sim/systemd, started and ordered by systemd: see tests/sim/README.md.
#   entrypoint.sh                 boot
#   entrypoint.sh link-standins   (re)link the stand-ins only (sim.py up does this on a reused pair)
# Environment (from sim.py): ROLE=head|worker, SIM_ROCE="ibdev:netdev,...", SIM_PEER, SIM_WORKER_LINK_IPS.
set -euo pipefail
SIM=/opt/sim
ROLE="${ROLE:?ROLE must be head or worker}"

link_standins() {
  # the stand-ins for what no real program can do here (no GPU, no RDMA; see tests/sim/README.md) come first on
  # every PATH (ssh sessions, sudo's secure_path)
  local f
  for f in "$SIM"/standins/*; do
    [ -f "$f" ] || continue
    ln -sfn "$f" "/usr/local/bin/$(basename "$f")"
  done
}

if [ "${1:-}" = link-standins ]; then
  link_standins
  exit 0
fi

# units do not inherit PID 1's environment: they read the role from here (ssh sessions too)
printf 'ROLE=%s\nSIM_ROCE=%s\nSIM_PEER=%s\nSIM_WORKER_LINK_IPS=%s\n' \
  "$ROLE" "${SIM_ROCE:-}" "${SIM_PEER:-}" "${SIM_WORKER_LINK_IPS:-}" >/etc/sparkfold-sim.env
mkdir -p /run/sim
# a boot id per boot: a container's is the host kernel's, the same across a restart, and sparkfold tells a reboot by
# it (the GPU clock record, the run lock); systemd and journald read it from here too
if [ ! -e /run/sim/boot_id ]; then
  cat /proc/sys/kernel/random/uuid >/run/sim/boot_id
  mount --bind -o ro /run/sim/boot_id /proc/sys/kernel/random/boot_id
fi
link_standins

# /sys read-only (so systemd-udevd never starts and never sees the host's devices) but for the netdevs, which are all
# virtual here (the veths of the link, eth0, docker0): netplan apply writes their uevents through `udevadm trigger`
if ! grep -q ' /sys/devices/virtual/net ' /proc/self/mountinfo; then
  mount -o remount,rw /sys
  mount --bind /sys/devices/virtual/net /sys/devices/virtual/net
  mount -o remount,bind,ro /sys
fi

# the sim's units, linked from the read-only mount (an edited unit applies at the next boot)
units=/etc/systemd/system
for f in "$SIM"/systemd/*.service "$SIM"/systemd/*.target; do
  if [ -f "$f" ]; then ln -sfn "$f" "$units/$(basename "$f")"; fi
done
for d in "$SIM"/systemd/*.d; do
  [ -d "$d" ] || continue
  mkdir -p "$units/$(basename "$d")"
  for f in "$d"/*.conf; do ln -sfn "$f" "$units/$(basename "$d")/$(basename "$f")"; done
done
# what cannot work in a container on this kernel (masks.txt says why), masked before systemd reads anything
grep -v '^#' "$SIM/systemd/masks.txt" | while read -r unit _; do
  if [ -n "$unit" ]; then ln -sfn /dev/null "$units/$unit"; fi
done
# sim-boot.target requires every boot unit (each init.d script an instance of sim-init@, the hub on the head only);
# sim-ready.service follows it
req="$units/sim-boot.target.requires"
rm -rf "$req" && mkdir -p "$req" "$units/multi-user.target.wants"
ln -sfn "$units/sim-ready.service" "$units/multi-user.target.wants/sim-ready.service"
for u in sim-gpu-reset.service sim-hostkeys.service sim-link.service sim-link-settled.service sim-management-fault.service sim-engine-base.service \
         sim-rank-memory.service ssh.service docker.service; do
  ln -sfn "$units/$u" "$req/$u"
done
for f in "$SIM"/standins/init.d/*.sh; do
  if [ -f "$f" ]; then ln -sfn "$units/sim-init@.service" "$req/sim-init@$(basename "$f").service"; fi
done
if [ "$ROLE" = head ]; then ln -sfn "$units/sim-fakehub.service" "$req/sim-fakehub.service"; fi

exec /lib/systemd/systemd "$@"
