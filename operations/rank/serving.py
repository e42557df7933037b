"""Is the pair serving? A bounded wait for rank 0's API, a smoke test through both ranks, the LIVE line.

The controller makes the requests (api_base_url is its view of rank 0). The wait and smoke test run only when the
pair was (re)started in this run; a converged run does one quick check and logs the LIVE line, with no change.
The smoke test is the validator's (operations/validate/smoke.py), so a deploy and `python -m operations.validate
smoke` judge a pair the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import requests
from pyinfra import logger
from pyinfra.api import QuoteString, StringCommand

from operations.facts.docker import RankContainer
from operations.rank import exposure
from operations.validate.client import Client, ServerUnusable
from operations.validate.result import PASS
from operations.validate.smoke import smoke_parts

POLL_S = 3
# a stand-in or a warm restart answers within seconds: the first polls come quickly, then every POLL_S
FIRST_POLL_S, FIRST_POLLS_FOR_S = 0.5, 10
PROGRESS_S = 15
LOG_LINES = 25

SMOKE_TIMEOUT_S = 300  # per request: a first reply after a cold start can take minutes


def auth_headers(api_key: str) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def models_listed(base_url: str, served_name: str, api_key: str = "", timeout: float = 5) -> str | None:
    """None when GET /v1/models lists served_name; else what went wrong."""
    try:
        r = requests.get(f"{base_url}/v1/models", headers=auth_headers(api_key), timeout=timeout)
    except requests.RequestException as e:
        return f"no answer from {base_url}/v1/models ({type(e).__name__})"
    if r.status_code == 401:
        return f"{base_url}/v1/models refused the API key (401): check the key file rank 0 was given"
    if r.status_code != 200:
        return f"{base_url}/v1/models answered {r.status_code}"
    try:
        ids = [m.get("id") for m in r.json().get("data", [])]
    except (ValueError, AttributeError):
        return f"{base_url}/v1/models did not answer JSON"
    if served_name not in ids:
        return f"{base_url}/v1/models lists {ids}, not {served_name}: is another server on that port?"
    return None


def wait_for_api(base_url: str, served_name: str, api_key: str, timeout: float,
                 ranks_down: Callable[[], str | None], sleep=time.sleep, clock=time.monotonic,
                 progress: Callable[[str], None] = logger.info) -> str | None:
    """Poll until the API lists the model (None), a rank exits or the time runs out (the reason)."""
    start = clock()
    last_note = start
    while True:
        down = ranks_down()
        if down:
            return down
        problem = models_listed(base_url, served_name, api_key)
        if problem is None:
            return None
        now = clock()
        if now - start >= timeout:
            return f"rank 0's API did not come up within wait_timeout = {timeout:g} s ({problem})"
        if now - last_note >= PROGRESS_S:
            progress(f"waiting for rank 0's API at {base_url}: {int(now - start)} s of {timeout:g} s")
            last_note = now
        sleep(FIRST_POLL_S if now - start < FIRST_POLLS_FOR_S else POLL_S)


def smoke_test(base_url: str, served_name: str, api_key: str = "") -> tuple[bool, list[str]]:
    """The validator's smoke check through both ranks. (passed, a line per part; or one line naming what failed)"""
    client = Client(base_url, api_key or None, served_name, timeout=SMOKE_TIMEOUT_S)
    try:
        parts = smoke_parts(client)
    except ServerUnusable as gone:  # no answer, or the key refused: every part would say the same
        return False, [f"the smoke test failed: {gone}"]
    finally:
        client.session.close()
    failed = [part.line() for part in parts if part.status != PASS]
    if failed:
        return False, [f"the smoke test failed: {'; '.join(failed)}"]
    return True, [f"{part.name}: {part.detail}" for part in parts]


def open_api_note(s) -> str:
    """The plain warning for rank 0 answering the network without a key ("" when loopback-only or keyed)."""
    return exposure.open_note(exposure.of_settings(s), s.port)


def live_lines(served_name: str, port: int, base_url: str, api_key_file: str = "", open_note: str = "") -> list[str]:
    lines = [f"✔ {served_name} is now LIVE! on port {port}",
             f"  OpenAI API: {base_url}/v1 (model: {served_name})"]
    if open_note:
        lines.append(f"  ⚠ {open_note}")
    if api_key_file:
        lines.append(f"  API key: in {api_key_file} on the head (send it as Authorization: Bearer <key>)")
    return lines


# --- host helpers (the controller reaches the Sparks through pyinfra's connections) -----------------------------

def _shell(spark, command: StringCommand) -> list[str]:
    ok, out = spark.run_shell_command(command, print_output=False, print_input=False)
    return list(out.stdout_lines) + list(out.stderr_lines)


def read_api_key(spark, path: str) -> str:
    if not path:
        return ""
    lines = [ln.strip() for ln in _shell(spark, StringCommand("cat", QuoteString(path), "2>/dev/null", "||", "true"))]
    for line in lines:
        if line and not line.startswith("#"):
            return line.split(": ", 1)[-1].strip()
    return ""


def log_tails(head, worker, container_name: str, lines: int = LOG_LINES) -> str:
    parts = []
    for rank, spark in ((0, head), (1, worker)):
        out = _shell(spark, StringCommand("docker", "logs", "--tail", str(lines), QuoteString(container_name), "2>&1",
                                      "||", "true"))
        parts.append(f"--- rank {rank} ({spark.name}), last {lines} log lines ---\n" + "\n".join(out))
    return "\n".join(parts)


def load_status(head, worker, container_name: str) -> str:
    """One progress line's tail while the ranks load: unified memory in use and the newest log line of each rank."""
    parts = []
    for rank, spark in ((0, head), (1, worker)):
        out = _shell(spark, StringCommand(
            "awk '/^MemTotal:/ {t=$2} /^MemAvailable:/ {a=$2} END {printf \"%.1f of %.1f GiB in use\\n\", "
            "(t-a)/1048576, t/1048576}' /proc/meminfo;", "docker", "logs", "--tail", "1",
            QuoteString(container_name), "2>&1", "|", "tail", "-n", "1", "||", "true"))
        memory = out[0] if out else "?"
        last = newest_redraw(out[1]) if len(out) > 1 else ""
        parts.append(f"rank {rank}: {memory}" + (f", log: {last[:120]}" if last else ""))
    return "; ".join(parts)


def newest_redraw(line: str) -> str:
    """What a terminal would show of a log line an engine redraws with carriage returns (a loading bar): its last
    non-empty part, so the progress line stays one plain line."""
    parts = [part.strip() for part in line.split("\r") if part.strip()]
    return parts[-1] if parts else ""


def ranks_down(head, worker, container_name: str) -> str | None:
    for rank, spark in ((0, head), (1, worker)):
        container = spark.get_fact(RankContainer, container=container_name)
        if not container:
            return f"rank {rank}'s container is gone"
        if not container.get("running"):
            oom = " (killed by the OOM killer: free memory, or lower context)" if container.get("oom_killed") else ""
            return f"rank {rank} exited with code {container.get('exit_code')}{oom}"
    return None
