#!/usr/bin/env bash
# Try sparkfold without Sparks, on a fresh Debian machine as root:
#   bash tests/sim/try.sh        bring up the simulated pair, deploy onto it end to end, print a chat reply
#   bash tests/sim/try.sh down   remove the simulated pair
# The simulated pair is tests/sim (two containers standing in for the Sparks); nothing of it enters operations/.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "${1:-up}" = down ]; then
  exec .venv/bin/python -m tests.sim.sim down
fi

bash tests/sim/prepare-host.sh
site=$(.venv/bin/python -m tests.sim.sim up | tail -n 1)
SPARKFOLD_SITE="$site" .venv/bin/pyinfra -y inventory.py deploy.py
api=$(.venv/bin/python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["data"]["api_url"])' "$site")
echo
echo "A chat through both ranks ($api/v1/chat/completions):"
.venv/bin/python - "$api" <<'PY'
import sys

import requests

reply = requests.post(f"{sys.argv[1]}/v1/chat/completions", timeout=120, json={
    "model": "DeepSeek-V4.1-Flash-1017", "max_tokens": 64, "temperature": 0,
    "messages": [{"role": "user", "content": "Say hello from both Sparks."}]}).json()
print(reply["choices"][0]["message"]["content"])
PY
echo
echo "Remove the simulated pair with: bash tests/sim/try.sh down"
