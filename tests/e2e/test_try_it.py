"""The README's try-it command, as a newcomer runs it: `bash tests/sim/try.sh` prints the LIVE line and a chat reply
through both ranks. Starts from a converged pair (converged_pair): try.sh reuses a running pair, so this is its
converged path; its first-run path is test_deploy.py's first run, through the same deploy.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("converged_pair")


def test_try_sh_prints_the_live_line_and_a_reply(site_file):
    run = subprocess.run(["bash", "tests/sim/try.sh"], cwd=ROOT, capture_output=True, timeout=900,
                         env=dict(os.environ, PYINFRA_PROGRESS="off"), stdin=subprocess.DEVNULL)
    out, err = run.stdout.decode("utf-8", "replace"), run.stderr.decode("utf-8", "replace")
    assert run.returncode == 0, (out + err)[-4000:]
    assert "DeepSeek-V4.1-Flash-1017 is now LIVE! on port 8888" in out + err, (out + err)[-4000:]
    reply = out.split("A chat through both ranks", 1)[1].splitlines()[1:]
    assert reply and reply[0].strip(), out[-2000:]  # the model's answer, on the line after the heading
    assert "Remove the simulated pair with: bash tests/sim/try.sh down" in out
