"""The fake Hugging Face endpoint (tests/sim/fakehub/server.py) as a subprocess on a free 127.0.0.1 port, run under
`python -I -S` (no site-packages: it must need nothing beyond the standard library), as start.sh runs it in the
simulated head."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FAKEHUB = Path(__file__).resolve().parents[2] / "tests" / "sim" / "fakehub"


@contextmanager
def running_fakehub(log: Path, *args: str) -> Iterator[str]:
    """Yields the server's URL while it runs; its request log (one line per request) goes to `log`."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-I", "-S", str(FAKEHUB / "server.py"), "--host", "127.0.0.1",
                                 "--port", "0", *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"fakehub exited: {log.read_text()}")
            for line in log.read_text().splitlines():
                if "listening on " in line:
                    yield line.split("listening on ")[1].split()[0]
                    return
            time.sleep(0.05)
        raise RuntimeError(f"fakehub did not start: {log.read_text()}")
    finally:
        proc.terminate()
        proc.wait(timeout=5)
