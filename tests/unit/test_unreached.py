"""A Spark that does not answer over ssh: status.py still shows its table when neither answers (the API asked from
this machine, and again every status_watch interval), and stop.py stops the rank it can reach, then fails naming the
Spark it missed and the ssh command that shows why. The CLI runs are pyinfra's own, against closed ports on
127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from harness import FakeHost
from settings_factory import ROOT, make_pair
from waiting import wait_for

from operations import ranks
from operations.settings.site import ssh_check
from operations.tools import unreached

MODEL = "DeepSeek-V4.1-Flash-1017"


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (the kernel's pick, released at once): a connect is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def site_file(tmp_path: Path, data: str = "{}") -> tuple[Path, dict[str, int]]:
    ports = {"head": closed_port(), "worker": closed_port()}
    text = ""
    for role, name, last in (("head", "spark-a", 1), ("worker", "spark-b", 2)):
        text += (f"{role}:\n  ssh: 127.0.0.1\n  ssh_port: {ports[role]}\n  ssh_user: nvidia\n  name: {name}\n"
                 f"  link:\n    - {{netdev: enp1s0f0np0, address: 192.168.100.{last}/24}}\n"
                 f"    - {{netdev: enP2p1s0f0np0, address: 192.168.101.{last}/24}}\n")
    site = tmp_path / "site.yaml"
    site.write_text(text + f"data: {data}\n")
    return site, ports


def pyinfra_env(site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKFOLD_")}
    return {**env, "SPARKFOLD_SITE": str(site), "PYINFRA_PROGRESS": "off", "HOME": str(site.parent)}


def run_pyinfra(site: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyinfra", "inventory.py", *args], cwd=ROOT, env=pyinfra_env(site),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture
def api_server():
    """An OpenAI-compatible /v1/models on 127.0.0.1 listing the default served model (no /metrics)."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            code, body = (200, json.dumps({"data": [{"id": MODEL}]}).encode()) if self.path == "/v1/models" else (
                404, b"{}")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


# --- status.py with neither Spark answering (pyinfra's CLI) --------------------------------------------------------

def test_status_py_prints_its_table_when_neither_spark_answers(tmp_path):
    site, ports = site_file(tmp_path)
    run = run_pyinfra(site, "status.py", "-y")
    lines = run.stdout.splitlines()
    assert lines[0] == "sparkfold status: head spark-a, worker spark-b", run.stderr
    head_check, worker_check = (f"ssh -p {ports[r]} nvidia@127.0.0.1 true" for r in ("head", "worker"))
    assert [line.split()[:4] for line in lines[2:4]] == [["✘", "head", "ssh", "no"], ["✘", "worker", "ssh", "no"]]
    assert f"`{head_check}` shows why" in lines[2] and f"`{worker_check}` shows why" in lines[3]
    assert lines[4].split()[:3] == ["✘", "head", "API"]  # asked from this machine all the same
    assert lines[-1] == (f"NOT serving: rank 0's Spark spark-a does not answer over ssh (`{head_check}` shows why); "
                         f"rank 1's Spark spark-b does not answer over ssh (`{worker_check}` shows why); no answer "
                         "from http://127.0.0.1:8888/v1/models (ConnectionError)")
    assert run.returncode == 1 and "No hosts remaining" not in run.stderr  # the not-serving line ends the run


def test_status_py_json_when_neither_spark_answers_asks_the_api_from_here(tmp_path, api_server):
    site, ports = site_file(tmp_path, data=f"{{api_url: '{api_server}'}}")
    run = run_pyinfra(site, "status.py", "-y", "--json")
    assert run.stdout.count("\n") == 1, run.stderr  # the document, and nothing else on stdout
    doc = json.loads(run.stdout)
    assert (doc["serving"], doc["verdict"]) == (True, None)  # the API answers though neither Spark does over ssh
    assert doc["sparks"] == {
        "head": {"host": "spark-a", "ssh": False, "ssh_check": f"ssh -p {ports['head']} nvidia@127.0.0.1 true"},
        "worker": {"host": "spark-b", "ssh": False, "ssh_check": f"ssh -p {ports['worker']} nvidia@127.0.0.1 true"}}
    assert [(r["spark"], r["item"], r["state"]) for r in doc["rows"]][:3] == [
        ("head", "ssh", "no answer"), ("worker", "ssh", "no answer"), ("head", "API", "answers")]
    assert run.returncode == 1  # a Spark did not answer


def test_status_py_keeps_watching_when_neither_spark_answers(tmp_path):
    site, ports = site_file(tmp_path)
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        watching = subprocess.Popen([sys.executable, "-m", "pyinfra", "inventory.py", "status.py", "-y", "--data",
                                     "status_watch=1"], cwd=ROOT, env=pyinfra_env(site), stdout=sink,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: out.read_text().count("sparkfold status: ") >= 3, "three refreshes", timeout=60,
                 running=watching, said=out.read_text)
    finally:
        os.killpg(watching.pid, signal.SIGINT)  # Ctrl-C, as a person ends it
        watching.wait(timeout=30)
    text = out.read_text()
    # each refresh tries ssh again, and says what it answered
    assert f"spark-b did not answer over ssh (Could not connect ([Errno None] Unable to connect to port " \
           f"{ports['worker']} on 127.0.0.1))" in text


# --- the connect stage, as config.py wraps it -----------------------------------------------------------------------

def fake_cli(monkeypatch, error: Exception | None, active: set, failed: set) -> tuple[ModuleType, SimpleNamespace]:
    """pyinfra_cli.cli as far as after_no_spark_answers uses it, and the State its connect stage leaves."""
    from pyinfra.api.config import Config

    head, worker = FakeHost({}, name="spark-a"), FakeHost({}, name="spark-b")
    groups = {"head": [head], "worker": [worker]}
    state = SimpleNamespace(active_hosts=active, failed_hosts=failed, config=Config(),
                            inventory=SimpleNamespace(get_group=groups.__getitem__))

    def connect_all(_state):
        if error is not None:
            raise error

    cli = ModuleType("pyinfra_cli.cli")
    cli.connect_all = connect_all  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyinfra_cli.cli", cli)
    return cli, state


def test_when_no_spark_answers_the_tool_runs_as_the_head_then_the_run_ends_as_pyinfras(monkeypatch):
    from pyinfra import host
    from pyinfra.api.exceptions import PyinfraError

    said = []
    cli, state = fake_cli(monkeypatch, PyinfraError("No hosts remaining!"), set(), {"spark-a", "spark-b"})
    unreached.after_no_spark_answers(lambda st: said.append((st, host.name)))
    with pytest.raises(PyinfraError, match="No hosts remaining!"):
        cli.connect_all(state)
    assert said == [(state, "spark-a")]


def test_any_other_failure_of_the_connect_stage_is_pyinfras_own(monkeypatch):
    from pyinfra.api.exceptions import PyinfraError

    said = []
    # FAIL_PERCENT's refusal leaves a Spark that answered
    cli, state = fake_cli(monkeypatch, PyinfraError("Over 0% of hosts failed (50%)"), {"spark-a"}, {"spark-b"})
    unreached.after_no_spark_answers(said.append)
    with pytest.raises(PyinfraError, match="Over 0%"):
        cli.connect_all(state)
    cli, state = fake_cli(monkeypatch, None, {"spark-a", "spark-b"}, set())
    unreached.after_no_spark_answers(said.append)
    cli.connect_all(state)
    assert said == []


def test_outside_pyinfras_cli_nothing_is_wrapped(monkeypatch):
    monkeypatch.delitem(sys.modules, "pyinfra_cli.cli", raising=False)
    unreached.after_no_spark_answers(lambda st: None)  # must not import the CLI (it patches gevent in)
    assert "pyinfra_cli.cli" not in sys.modules


# --- stop.py ---------------------------------------------------------------------------------------------------------

def test_stop_py_says_nothing_was_stopped_when_neither_spark_answers(tmp_path):
    site, ports = site_file(tmp_path)
    run = run_pyinfra(site, "stop.py", "-y")
    assert run.returncode == 1
    assert (f"stop.py: neither Spark answered over ssh (spark-a and spark-b), so no rank was stopped: "
            f"`ssh -p {ports['head']} nvidia@127.0.0.1 true` and `ssh -p {ports['worker']} nvidia@127.0.0.1 true` "
            "show why; run stop.py again once they answer") in run.stderr


def test_the_ssh_check_names_the_port_login_and_key():
    assert ssh_check({"ssh_hostname": "10.0.0.2", "ssh_port": 2222, "ssh_user": "nvidia"}, "spark-b") == (
        "ssh -p 2222 nvidia@10.0.0.2 true")
    assert ssh_check({"ssh_key": "/home/me/my key"}, "spark-b.local") == (
        "ssh -p 22 -i '/home/me/my key' spark-b.local true")


HS, WS = make_pair()


def _peer_step(monkeypatch, s, peer: FakeHost) -> list[tuple[str, dict]]:
    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(ranks, "peer_host", lambda _s: peer)
    monkeypatch.setattr(ranks, "peer_rank_stopped", lambda **kw: calls.append(("peer_rank_stopped", kw)))
    ranks.peer_rank_reached._inner(s)
    return calls


def test_stop_on_the_head_names_the_worker_it_could_not_reach(monkeypatch):
    worker = FakeHost({}, {"ssh_hostname": "spark-b.local", "ssh_port": 2222, "ssh_user": "nvidia"}, name="spark-b")
    worker.connected = False
    [(_, call)] = _peer_step(monkeypatch, HS, worker)
    assert call["problem"] == ("spark-b (the worker) did not answer over ssh, so rank 1 there was not stopped and "
                               "still holds its memory: `ssh -p 2222 nvidia@spark-b.local true` shows why; run "
                               "stop.py again once it answers")
    head = FakeHost({}, name="spark-a")
    head.connected = False
    [(_, call)] = _peer_step(monkeypatch, WS, head)
    assert call["problem"].startswith("spark-a (the head) did not answer over ssh, so rank 0 there was not stopped")
    [(_, call)] = _peer_step(monkeypatch, HS, FakeHost({}, name="spark-b"))
    assert call["problem"] is None


def test_stop_py_runs_the_reach_check_last(monkeypatch):
    source = (ROOT / "stop.py").read_text()
    steps = [line.split("(")[0] for line in source.splitlines() if line.endswith("(s=s)") or "(s=s," in line]
    assert steps == ["locked", "supervisor_paused", "streams_stopped", "ranks_stopped", "unlocked", "peer_rank_reached"]
