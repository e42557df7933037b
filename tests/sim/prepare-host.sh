#!/usr/bin/env bash
# What the simulated pair needs on this machine (a fresh Debian machine, as root): Docker, debootstrap, ssh, rsync,
# a running dockerd, and the project's venv. Used by .ci/run and tests/sim/try.sh. --sim-only: the venv gets only
# what tests/sim/sim.py needs (the rest by a second call without it).
set -euo pipefail
cd "$(dirname "$0")/../.."

export DEBIAN_FRONTEND=noninteractive
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null || ! command -v rsync >/dev/null \
    || ! command -v ssh >/dev/null || ! python3 -c 'import ensurepip' 2>/dev/null; then
  apt-get update -qq
  # python3-venv: Debian's python3 makes no venv without it
  apt-get install -y -qq docker.io debootstrap openssh-client rsync python3-venv >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  setsid dockerd >/tmp/sparkfold-dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start:"; tail -20 /tmp/sparkfold-dockerd.log; exit 1; }
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
if [ "${1:-}" = "--sim-only" ]; then  # what tests/sim/sim.py needs to bring pairs up (.ci/run: while pip goes on)
  .venv/bin/pip install -q pyyaml -c tests/constraints.txt
  exit 0
fi
.venv/bin/pip install -q -e ".[test]" -c tests/constraints.txt  # the test tools at exact versions
