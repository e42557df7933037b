"""health: the bounded API wait, the smoke test and the LIVE line, against a tiny local HTTP server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from harness import FakeHost, run_op

from operations import health
from operations.facts.docker import RankContainer

NAME = "DeepSeek-V4.1-Flash-1017"
UP = {"exists": True, "running": True, "status": "running", "exit_code": 0, "labels": {}}
DOWN = {**UP, "running": False, "status": "exited", "exit_code": 1}


class Api:
    """A fake rank 0. `behaviour` switches: models (status), key, content, stream_done, tool."""

    def __init__(self, **behaviour):
        self.b = {"models": 200, "key": "", "content": "OK", "stream_done": True, "tool": True,
                  "fail_first": 0, **behaviour}
        self.seen = []
        api = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def authed(self):
                api.seen.append(self.headers.get("Authorization"))
                if api.b["key"] and self.headers.get("Authorization") != f"Bearer {api.b['key']}":
                    self.reply(401, {"error": {"message": "A valid API key is required"}})
                    return False
                return True

            def do_GET(self):
                if not self.authed():
                    return
                if api.b["fail_first"] > 0:
                    api.b["fail_first"] -= 1
                    return self.reply(503, {})
                self.reply(api.b["models"], {"object": "list", "data": [{"id": NAME}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not self.authed():
                    return
                if body.get("tools"):
                    msg = {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]} \
                        if api.b["tool"] else {"role": "assistant", "content": "no"}
                    return self.reply(200, {"choices": [{"message": msg}]})
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for word in api.b["content"].split(" "):
                        chunk = {"choices": [{"delta": {"content": word}}]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    if api.b["stream_done"]:
                        self.wfile.write(b"data: [DONE]\n\n")
                    return
                self.reply(200, {"choices": [{"message": {"role": "assistant", "content": api.b["content"]}}],
                                 "usage": {"completion_tokens": 2}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api():
    servers = []

    def make(**b):
        servers.append(Api(**b))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def closed_url():
    a = Api()
    a.close()
    return a.url


class Spark(FakeHost):
    """A FakeHost that answers shell commands (API key file, docker logs) and collects log lines."""

    def __init__(self, facts, name, shell=None):
        super().__init__(facts, name=name)
        self.shell = shell or {}
        self.logged = []

    def run_shell_command(self, command, **_kw):
        text = command.get_raw_value()
        for needle, lines in self.shell.items():
            if needle in text:
                return True, SimpleNamespace(stdout_lines=list(lines), stderr_lines=[])
        return True, SimpleNamespace(stdout_lines=[], stderr_lines=[])

    def log(self, message, log_func=None):
        self.logged.append(message)


# --- requests ----------------------------------------------------------------------------------------------------

def test_models_listed(api):
    a = api()
    assert health.models_listed(a.url, NAME) is None
    assert "not Other" in health.models_listed(a.url, "Other")
    assert "answered 500" in health.models_listed(api(models=500).url, NAME)
    assert "no answer" in health.models_listed(closed_url(), NAME, timeout=1)


def test_models_listed_with_the_key(api):
    a = api(key="sekrit")
    assert "401" in health.models_listed(a.url, NAME)
    assert health.models_listed(a.url, NAME, api_key="sekrit") is None
    assert a.seen[-1] == "Bearer sekrit"


def test_wait_for_api_until_ready(api):
    a = api(fail_first=3)
    slept = []
    assert health.wait_for_api(a.url, NAME, "", 100, lambda: None, sleep=slept.append) is None
    assert slept == [health.POLL_S] * 3


def test_wait_for_api_stops_when_a_rank_exits(api):
    a = api(models=503)
    assert health.wait_for_api(a.url, NAME, "", 100, lambda: "rank 1 exited with code 1",
                               sleep=lambda s: None) == "rank 1 exited with code 1"


def test_wait_for_api_times_out_with_progress(api):
    a = api(models=503)
    now = [0.0]
    notes = []

    def sleep(seconds):
        now[0] += seconds

    problem = health.wait_for_api(a.url, NAME, "", 40, lambda: None, sleep=sleep, clock=lambda: now[0],
                                  progress=notes.append)
    assert "within wait_timeout = 40 s" in problem and "answered 503" in problem
    assert len(notes) == 2 and "15 s of 40 s" in notes[0]


def test_smoke_test_passes(api):
    ok, lines = health.smoke_test(api(content="OK from both").url, NAME)
    assert ok and lines[0].startswith("reply: 'OK from both'") and "streamed: 'OKfromboth'" in lines[1]
    assert lines[2].startswith("tool call: get_weather(")


@pytest.mark.parametrize("behaviour,message", [
    ({"content": ""}, "reply is empty"),
    ({"content": "!!!!!!!!"}, "one character repeated"),
    ({"stream_done": False}, "without [DONE]"),
    ({"tool": False}, "asked for a tool call"),
])
def test_smoke_test_failures(api, behaviour, message):
    ok, lines = health.smoke_test(api(**behaviour).url, NAME)
    assert not ok and message in lines[0]


def test_live_lines_name_the_key_file_not_the_key():
    lines = health.live_lines(NAME, 8888, "http://spark-a.local:8888", "/home/n/.local/state/sparkfold/api-key")
    assert lines[0] == f"✔ {NAME} is now LIVE! on port 8888"
    assert lines[1] == f"  OpenAI API: http://spark-a.local:8888/v1 (model: {NAME})"
    assert "/home/n/.local/state/sparkfold/api-key" in lines[2]
    assert len(health.live_lines(NAME, 8888, "http://x:1")) == 2


# --- the wait + smoke as run by the FunctionCommand -------------------------------------------------------------

def test_wait_and_smoke_success_logs_live(api):
    a = api(key="k1")
    head = Spark({RankContainer: UP}, "head", {"cat ": ["# key", "k1"]})
    worker = Spark({RankContainer: UP}, "worker")
    assert health._wait_and_smoke(None, head, worker, a.url, NAME, 8888, "c", "/state/api-key", 60) is True
    assert any(f"✔ {NAME} is now LIVE! on port 8888" in m for m in head.logged)
    assert not any("k1" in m for m in head.logged)


def test_wait_and_smoke_failure_shows_both_ranks_logs(api):
    a = api(models=503)
    head = Spark({RankContainer: UP}, "head", {"docker logs": ["rank0 says hi"]})
    worker = Spark({RankContainer: DOWN}, "worker", {"docker logs": ["rank1: PeerDown"]})
    assert health._wait_and_smoke(None, head, worker, a.url, NAME, 8888, "c", "", 60) is False
    text = "\n".join(head.logged)
    assert "rank 1 exited with code 1" in text and "rank0 says hi" in text and "rank1: PeerDown" in text


def test_load_status_shows_memory_and_the_newest_log_text_of_each_rank():
    head = Spark({}, "head", {"/proc/meminfo": ["97.9 of 121.7 GiB in use", "loading layer 3/43"]})
    # an engine's loading bar redraws its line with carriage returns: only what a terminal shows last is kept
    worker = Spark({}, "worker", {"/proc/meminfo": ["12.0 of 121.7 GiB in use", "load  10%\rload  55%\rload  80%\r"]})
    line = health.load_status(head, worker, "c")
    assert line == ("rank 0: 97.9 of 121.7 GiB in use, log: loading layer 3/43; "
                    "rank 1: 12.0 of 121.7 GiB in use, log: load  80%")
    quiet = Spark({}, "worker", {"/proc/meminfo": ["1.0 of 121.7 GiB in use"]})  # no log yet
    assert health.load_status(head, quiet, "c").endswith("rank 1: 1.0 of 121.7 GiB in use")


# --- the operation -----------------------------------------------------------------------------------------------

def serving(url, executing, started=False, planned=False, worker_state=UP):
    worker = Spark({RankContainer: worker_state}, "worker")
    return run_op(health.api_serving, {RankContainer: UP}, executing=executing, base_url=url, served_name=NAME,
                  port=8888, container_name="c", worker=worker, api_key_file="", wait_timeout=60,
                  started=lambda: started, planned=lambda: planned)


def test_api_serving_plan(api):
    assert serving("http://unused", False, planned=True)[0][0].startswith("FunctionCommand(_wait_and_smoke")
    cmds, host = serving("http://unused", False, planned=False)
    assert cmds == [] and host.noops


def test_api_serving_after_a_start_waits(api):
    assert serving(api().url, True, started=True)[0][0].startswith("FunctionCommand(_wait_and_smoke")


def test_api_serving_converged_is_no_change(api, caplog):
    caplog.set_level("INFO")
    cmds, host = serving(api().url, True)
    assert cmds == [] and f"{NAME} serves at" in host.noops[0]
    assert f"✔ {NAME} is now LIVE! on port 8888" in caplog.text


def test_api_serving_not_answering_waits_and_dead_rank_fails(api):
    assert serving(closed_url(), True)[0][0].startswith("FunctionCommand(_wait_and_smoke")
    cmds, _ = serving(api().url, True, worker_state=DOWN)
    assert len(cmds) == 1 and cmds[0].startswith("FunctionCommand(_fail_with_logs")
    assert "rank 1 exited with code 1" in cmds[0]


def test_fail_with_logs_shows_both_ranks():
    head = Spark({}, "head", {"docker logs": ["r0 line"]})
    worker = Spark({}, "worker", {"docker logs": ["r1 line"]})
    assert health._fail_with_logs(None, head, worker, "c", "rank 1 exited") is False
    assert "rank 1 exited" in head.logged[0] and "r0 line" in head.logged[0] and "r1 line" in head.logged[0]
