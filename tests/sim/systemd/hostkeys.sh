#!/bin/bash
# ssh host key of this role, the controller's key authorized, and on the head the key it reaches the worker with.
set -euo pipefail
SIM=/opt/sim
KEYS="$SIM/.work/keys"
install -m 0600 "$SIM/.work/hostkeys/$ROLE/ssh_host_ed25519_key" /etc/ssh/ssh_host_ed25519_key
install -m 0644 "$SIM/.work/hostkeys/$ROLE/ssh_host_ed25519_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
home=/home/nvidia
install -d -m 0700 -o nvidia -g nvidia "$home/.ssh"
{
  cat "$KEYS/controller.pub"
  if [ "$ROLE" = worker ]; then cat "$KEYS/head.pub"; fi
} >"$home/.ssh/authorized_keys"
if [ "$ROLE" = head ]; then
  install -m 0600 -o nvidia -g nvidia "$KEYS/head" "$home/.ssh/id_ed25519"
  install -m 0644 -o nvidia -g nvidia "$KEYS/head.pub" "$home/.ssh/id_ed25519.pub"
  wkey="$(cut -d' ' -f1,2 "$SIM/.work/hostkeys/worker/ssh_host_ed25519_key.pub")"
  echo "worker,${SIM_WORKER_LINK_IPS:-192.168.100.2,192.168.101.2} $wkey" >"$home/.ssh/known_hosts"
  printf 'Host *\n  StrictHostKeyChecking accept-new\n' >"$home/.ssh/config"
fi
chown -R nvidia:nvidia "$home/.ssh"
chmod 0600 "$home/.ssh/authorized_keys"
