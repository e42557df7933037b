#!/bin/sh
# Starts the fake Hugging Face endpoint in the background (run on the simulated head at its start).
# Env: FAKEHUB_HOST (127.0.0.1), FAKEHUB_PORT (5555), FAKEHUB_LOG (/var/log/fakehub.log),
# FAKEHUB_PIDFILE (/run/fakehub.pid), FAKEHUB_TOKENS (hf_simtoken), FAKEHUB_CUT_ONCE (none), FAKEHUB_PAD (none),
# FAKEHUB_RATE (0: unlimited): read by server.py.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
host=${FAKEHUB_HOST:-127.0.0.1}
port=${FAKEHUB_PORT:-5555}
log=${FAKEHUB_LOG:-/var/log/fakehub.log}
pidfile=${FAKEHUB_PIDFILE:-/run/fakehub.pid}

up() {
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1).read()' \
        "http://$host:$port/healthz" >/dev/null 2>&1
}

if up; then
    echo "fakehub: already serving on http://$host:$port"
    exit 0
fi
mkdir -p "$(dirname "$log")" "$(dirname "$pidfile")"
# setsid: the server outlives the init script's process group; all fds detached from the caller.
setsid python3 "$here/server.py" --host "$host" --port "$port" >>"$log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$pidfile"
i=0
while [ "$i" -lt 100 ]; do
    if up; then
        echo "fakehub: serving on http://$host:$port (pid $pid, log $log)"
        exit 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
        break
    fi
    sleep 0.1
    i=$((i + 1))
done
echo "fakehub: did not come up on http://$host:$port; last log lines:" >&2
tail -n 20 "$log" >&2 || true
exit 1
