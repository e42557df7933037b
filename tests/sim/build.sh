#!/usr/bin/env bash
# Build the images of the simulated pair of Sparks, caching every step by content:
#   sparkfold-sim/rootfs:bookworm       debootstrap'd Debian (no registry can be pulled from here)
#   sparkfold-sim/host:bookworm         what a simulated Spark runs (sshd, sudo, docker, python3 + huggingface_hub)
#   sparkfold-sim/engine-base:bookworm  base of the stand-in engine image, saved to .work/engine-base.tar and loaded
#                                       into each simulated Spark's own dockerd at start
# Needs root, docker (dockerd is started here if it is not running) and, on the first build, debootstrap.
# Environment: SIM_PYTHON (a python with pip, for the huggingface_hub wheels), SIM_DEBIAN_MIRROR, SIM_REBUILD=1.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="$HERE/.work"
ROOTFS_IMAGE=sparkfold-sim/rootfs:bookworm
HOST_IMAGE=sparkfold-sim/host:bookworm
ENGINE_BASE_IMAGE=sparkfold-sim/engine-base:bookworm
# Only what every later image needs; the rest comes from apt in the Dockerfiles (cached by docker build).
ROOTFS_INCLUDE="ca-certificates,python3"
MIRROR="${SIM_DEBIAN_MIRROR:-}"

log() { echo "[sim build] $*" >&2; }
die() { echo "[sim build] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (debootstrap, docker and veth links need it)"
command -v docker >/dev/null || die "no docker CLI: apt-get install docker.io"
mkdir -p "$WORK"

# --- the Docker engine -------------------------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || die "docker is not running and there is no dockerd: apt-get install docker.io"
  log "starting dockerd (log: /tmp/dockerd.log)"
  setsid dockerd >/tmp/dockerd.log 2>&1 </dev/null &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 /tmp/dockerd.log >&2; die "dockerd did not start"; }
fi

# --- rootfs: debootstrap once, keyed by the suite, include list and mirror -----------------------------------------
if [ -z "$MIRROR" ]; then
  # the mirror apt already uses on this machine (deb822 or one-line format), else Debian's CDN
  MIRROR="$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | grep -v security | head -1 || true)"
  [ -n "$MIRROR" ] || MIRROR="$(awk '$1=="deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
  [ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
fi
ROOTFS_KEY="$(printf 'bookworm minbase %s %s' "$ROOTFS_INCLUDE" "$MIRROR" | sha256sum | cut -c1-16)"
have_key="$(docker image inspect -f '{{ index .Config.Labels "sparkfold.sim.rootfs" }}' "$ROOTFS_IMAGE" 2>/dev/null || true)"
if [ "$have_key" != "$ROOTFS_KEY" ] || [ "${SIM_REBUILD:-0}" = 1 ]; then
  command -v debootstrap >/dev/null || die "no debootstrap: apt-get install debootstrap"
  log "debootstrap bookworm from $MIRROR (about a minute)"
  rm -rf "$WORK/rootfs"
  debootstrap --variant=minbase --include="$ROOTFS_INCLUDE" bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
  rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb "$WORK/rootfs/var/lib/apt/lists/"*
  tar -C "$WORK/rootfs" -c . | docker import --change "LABEL sparkfold.sim.rootfs=$ROOTFS_KEY" - "$ROOTFS_IMAGE" >/dev/null
  rm -rf "$WORK/rootfs"
else
  log "rootfs image is current ($ROOTFS_IMAGE)"
fi

# --- huggingface_hub wheels for the simulated Sparks' system python ------------------------------------------------
PY="${SIM_PYTHON:-}"
if [ -z "$PY" ]; then
  for c in "$HERE/../../.venv/bin/python" /work/venv/bin/python python3; do
    if "$c" -m pip --version >/dev/null 2>&1; then PY="$c"; break; fi
  done
fi
[ -n "$PY" ] || die "no python with pip to download the huggingface_hub wheels (set SIM_PYTHON)"
# the deploy's pin (group_data/all.py's hf_hub_version, which tests/constraints.txt gives the controller too): the
# simulated head's python3 (the sim's hf_python) has exactly what a Spark's venv gets (hf_xet comes with it on x86_64
# and aarch64)
ALL_PY="$HERE/../../group_data/all.py"
HF_VER="$("$PY" -c 'import runpy, sys; print(runpy.run_path(sys.argv[1])["hf_hub_version"])' "$ALL_PY")"
HF_REQ="huggingface_hub==$HF_VER"
WHEELS="$WORK/wheels"
if [ "$(cat "$WHEELS/.requirement" 2>/dev/null || true)" != "$HF_REQ" ]; then
  log "downloading wheels for $HF_REQ"
  rm -rf "$WHEELS"; mkdir -p "$WHEELS"
  # the simulated Sparks run Debian bookworm's python 3.11 on this machine's architecture
  "$PY" -m pip download -q --only-binary=:all: --python-version 3.11 --implementation cp \
    --dest "$WHEELS" "$HF_REQ" >"$WORK/pip-download.log" 2>&1 \
    || { tail -20 "$WORK/pip-download.log" >&2; die "pip download $HF_REQ failed (log: $WORK/pip-download.log)"; }
  echo "$HF_REQ" >"$WHEELS/.requirement"
fi

# --- images built FROM the rootfs (docker build's cache makes a warm run take seconds) --------------------------------
build() {  # build TAG DOCKERFILE [CONTEXT]; without a context the Dockerfile comes on stdin
  local blog="$WORK/build-${1//[\/:]/_}.log" rc=0
  log "docker build $1"
  if [ -n "${3:-}" ]; then
    docker build -t "$1" -f "$2" "$3" >"$blog" 2>&1 || rc=$?
  else
    docker build -t "$1" - <"$2" >"$blog" 2>&1 || rc=$?
  fi
  [ "$rc" = 0 ] || { tail -30 "$blog" >&2; die "docker build $1 failed (log: $blog)"; }
}
build "$ENGINE_BASE_IMAGE" "$HERE/Dockerfile.engine-base"
build "$HOST_IMAGE" "$HERE/Dockerfile" "$WHEELS"

# --- the engine base tarball each simulated Spark loads into its own dockerd --------------------------------------
ENGINE_ID="$(docker image inspect -f '{{.Id}}' "$ENGINE_BASE_IMAGE")"
if [ "$(cat "$WORK/engine-base.id" 2>/dev/null || true)" != "$ENGINE_ID" ] || [ ! -s "$WORK/engine-base.tar" ]; then
  log "saving $ENGINE_BASE_IMAGE to $WORK/engine-base.tar"
  docker save -o "$WORK/engine-base.tar.tmp" "$ENGINE_BASE_IMAGE"
  mv "$WORK/engine-base.tar.tmp" "$WORK/engine-base.tar"
  echo "$ENGINE_ID" >"$WORK/engine-base.id"
fi
log "images ready"
