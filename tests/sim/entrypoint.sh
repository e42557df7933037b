#!/bin/bash
# PID-1 payload (under tini) of one simulated Spark. tests/sim is mounted read-only at /opt/sim.
#   entrypoint.sh              start: stand-ins, ssh keys, wait for the link, init.d, dockerd, engine base,
#                              the rank-memory watcher, sshd
#   entrypoint.sh link-standins  (re)install the stand-ins only (sim.py up does this on a reused pair)
# Environment (from sim.py): ROLE=head|worker, SIM_ROCE="ibdev:netdev,...", SIM_PEER (the other role's name).
set -euo pipefail

SIM=/opt/sim
KEYS="$SIM/.work/keys"
STATE=/run/sim
ROLE="${ROLE:?ROLE must be head or worker}"

log() { echo "[sim $ROLE] $*"; }
die() { echo "[sim $ROLE] FATAL: $*" >&2; echo "$*" >"$STATE/failed" 2>/dev/null || true; exit 1; }

link_standins() {
  # The sim's copies shadow real tools: /usr/local/bin comes first on every PATH (ssh sessions, sudo's secure_path).
  local f
  for f in "$SIM"/standins/*; do
    [ -f "$f" ] || continue
    ln -sfn "$f" "/usr/local/bin/$(basename "$f")"
  done
  ln -sfn "$SIM/bin/sim-dockerd-restart" /usr/local/sbin/sim-dockerd-restart
}

install_ssh() {
  install -m 0600 "$SIM/.work/hostkeys/$ROLE/ssh_host_ed25519_key" /etc/ssh/ssh_host_ed25519_key
  install -m 0644 "$SIM/.work/hostkeys/$ROLE/ssh_host_ed25519_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
  local home=/home/nvidia
  install -d -m 0700 -o nvidia -g nvidia "$home/.ssh"
  {
    cat "$KEYS/controller.pub"
    # the head's own key, so the head reaches the worker (image shipping, rsync) as a real site must allow
    [ "$ROLE" = worker ] && cat "$KEYS/head.pub"
  } >"$home/.ssh/authorized_keys"
  if [ "$ROLE" = head ]; then
    install -m 0600 -o nvidia -g nvidia "$KEYS/head" "$home/.ssh/id_ed25519"
    install -m 0644 -o nvidia -g nvidia "$KEYS/head.pub" "$home/.ssh/id_ed25519.pub"
    # the worker by management name and by its link addresses; accept-new covers any other name the deploy uses
    local wkey; wkey="$(cut -d' ' -f1,2 "$SIM/.work/hostkeys/worker/ssh_host_ed25519_key.pub")"
    echo "worker,${SIM_WORKER_LINK_IPS:-192.168.100.2,192.168.101.2} $wkey" >"$home/.ssh/known_hosts"
    printf 'Host *\n  StrictHostKeyChecking accept-new\n' >"$home/.ssh/config"
  fi
  chown -R nvidia:nvidia "$home/.ssh"
  chmod 0600 "$home/.ssh/authorized_keys"
}

wait_for_link() {
  # sim.py moves the veth ends in, renames them and then touches the marker
  local i
  for i in $(seq 120); do
    [ -e "$STATE/link-ready" ] && return 0
    sleep 0.5
  done
  die "the link was not set up within 60 s (sim.py creates it after starting both containers)"
}

run_init_d() {
  local f
  : >"$STATE/init.d-done"
  for f in "$SIM"/standins/init.d/*.sh; do
    [ -f "$f" ] || continue
    log "init.d: $(basename "$f")"
    ROLE="$ROLE" SIM_ROCE="$SIM_ROCE" bash "$f" || die "init.d script $(basename "$f") failed (exit $?)"
    basename "$f" >>"$STATE/init.d-done"
  done
}

load_engine_base() {
  # skip the load when this dockerd already holds exactly that image (a restarted container keeps its volume)
  local want have
  want="$(cat "$SIM/.work/engine-base.id")"
  have="$(docker image inspect -f '{{.Id}}' sparkfold-sim/engine-base:bookworm 2>/dev/null || true)"
  if [ "$want" != "$have" ]; then
    log "loading sparkfold-sim/engine-base:bookworm into the inner dockerd"
    docker load -q -i "$SIM/.work/engine-base.tar" >/dev/null || die "docker load of the engine base failed"
  fi
}

start_fakehub() {
  # contract: start.sh starts the hub in the background and returns once it answers
  if [ "$ROLE" = head ] && [ -x "$SIM/fakehub/start.sh" -o -f "$SIM/fakehub/start.sh" ]; then
    log "starting the fake hub"
    ROLE="$ROLE" bash "$SIM/fakehub/start.sh" >>/var/log/sim-fakehub.log 2>&1 \
      || die "tests/sim/fakehub/start.sh failed (log: /var/log/sim-fakehub.log)"
  fi
}

if [ "${1:-}" = link-standins ]; then
  link_standins
  exit 0
fi

mkdir -p "$STATE" /run/sshd
rm -f "$STATE/ready" "$STATE/failed"
# settings the stand-ins may read at any time (ssh sessions do not inherit the container's environment)
printf 'ROLE=%s\nSIM_ROCE=%s\n' "$ROLE" "$SIM_ROCE" >/etc/sparkfold-sim.env
link_standins
install_ssh
wait_for_link
run_init_d
/usr/local/sbin/sim-dockerd-restart || die "the inner dockerd did not start (log: /var/log/sim-dockerd.log)"
load_engine_base
# a running rank holds its memory in /proc/meminfo (bin/sim-rank-memory follows the inner dockerd)
setsid /opt/sim/bin/sim-rank-memory >>/var/log/sim-rank-memory.log 2>&1 </dev/null &
start_fakehub
/usr/sbin/sshd -t || die "sshd configuration is invalid"
/usr/sbin/sshd -D -e &
sshd_pid=$!
# the link as the deploy first finds it (tests compare against this, whatever later runs changed)
ip -j addr show >"$STATE/initial-addr.json"
touch "$STATE/ready"
log "ready"
# the container lives as long as sshd does
wait "$sshd_pid"
