"""health: the bounded API wait, the smoke test and the LIVE line, against tiny local HTTP servers (the smoke test
against the validator's fake, tests/unit/validate_fake.py, since it is the validator's smoke check)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from harness import FakeHost, run_op
from pyinfra.context import ctx_host
from settings_factory import make_pair
from validate_fake import MODEL
from validate_fake import serving as validate_serving

from operations import ranks
from operations.facts.docker import RankContainer
from operations.rank import serving as health
from operations.rank import switch

NAME = "DeepSeek-V4.1-Flash-1017"
HS, WS = make_pair(head={"nccl_rails": 1}, worker={"nccl_rails": 1})
UP = {"exists": True, "running": True, "status": "running", "exit_code": 0, "labels": {}}
DOWN = {**UP, "running": False, "status": "exited", "exit_code": 1}


class Api:
    """A fake rank 0's /v1/models. `behaviour` switches: models (status), key, fail_first (503s before the list)."""

    def __init__(self, **behaviour):
        self.b = {"models": 200, "key": "", "fail_first": 0, **behaviour}
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
    assert slept == [health.FIRST_POLL_S] * 3


def test_wait_for_api_polls_quickly_at_first_then_every_poll_s(api):
    a = api(fail_first=6)
    now = [0.0]
    slept: list[float] = []

    def sleep(s):
        slept.append(s)
        now[0] += s if s != health.FIRST_POLL_S else 4  # each quick poll is taken 4 s apart on this clock

    assert health.wait_for_api(a.url, NAME, "", 100, lambda: None, sleep=sleep, clock=lambda: now[0]) is None
    assert slept == [health.FIRST_POLL_S] * 3 + [health.POLL_S] * 3  # 0, 4, 8 s quick; from 12 s every POLL_S


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
    assert len(notes) == 2 and "16 s of 40 s" in notes[0]  # quick polls to 10 s, then 13, 16 (the first note)


@pytest.fixture
def fake():
    """The validator's fake server, answering well until a test names a fault in .bad."""
    with validate_serving() as httpd:
        yield httpd


def test_smoke_test_passes_with_a_line_per_part(fake):
    ok, lines = health.smoke_test(fake.url, MODEL)
    assert ok and [line.split(":", 1)[0] for line in lines] == ["health", "reply", "stream", "tool", "tool-result"]
    assert lines[1].startswith("reply: '1\\n2\\n3\\n4\\n5\\n6' (")
    assert lines[2].endswith("finish_reason stop, [DONE]")
    assert lines[3] == 'tool: get_weather({"city": "Paris"})'
    assert lines[4] == "tool-result: 'It is sunny in Paris.' (finish_reason stop)"
    assert {b["model"] for m, _, b in fake.requests if m == "POST"} == {MODEL}


@pytest.mark.parametrize("fault,message", [
    ("empty-reply", "FAIL reply: empty reply"),
    ("collapsed", "FAIL reply: one character repeated ('!!!!!!!!!!!!!!!!'): the model collapsed"),
    ("no-done", "FAIL stream: the stream ended without data: [DONE]"),
    ("stream-error", "FAIL stream: error in the stream"),
    ("no-tool-call", "FAIL tool: asked for a tool call and got none"),
    ("tool-result-empty", "FAIL tool-result: the reply to the tool's result has no text (finish_reason stop)"),
    ("tool-result-again", "FAIL tool-result: answered the tool's result with another tool call, not text"),
    ("stop-ignored", "FAIL reply: the stop string '7' is in the reply"),
    ("health-down", "FAIL health: HTTP 503"),
    ("wrong-shape", "FAIL tool: an answer of the wrong shape"),
])
def test_smoke_test_failures_say_what_failed(fake, fault, message):
    fake.bad = {fault}
    ok, lines = health.smoke_test(fake.url, MODEL)
    assert not ok and len(lines) == 1
    assert lines[0].startswith("the smoke test failed: ") and message in lines[0]


def test_smoke_test_reads_the_stream_as_the_standard_says(fake):
    # U+2028 is no line end in an event stream: a reader splitting on it (requests' iter_lines) tore this chunk
    chunk = {"choices": [{"index": 0, "delta": {"content": "Hello\u2028there"}, "finish_reason": "stop"}]}
    fake.raw_stream = f"data: {json.dumps(chunk, ensure_ascii=False)}\r\n\r\ndata: [DONE]\r\n\r\n".encode()
    ok, lines = health.smoke_test(fake.url, MODEL)
    assert ok and lines[2] == "stream: 'Hello\\u2028there', finish_reason stop, [DONE]"  # repr shows it escaped


def test_smoke_test_sends_the_key(fake):
    fake.require_key = "sekrit"
    assert health.smoke_test(fake.url, MODEL)[0] is False
    assert health.smoke_test(fake.url, MODEL, api_key="sekrit")[0] is True
    assert {h.get("Authorization") for h in fake.headers[-3:]} == {"Bearer sekrit"}


def test_live_lines_name_the_key_file_not_the_key():
    lines = health.live_lines(NAME, 8888, "http://spark-a.local:8888", "/home/n/.local/state/sparkfold/api-key")
    assert lines[0] == f"✔ {NAME} is now LIVE! on port 8888"
    assert lines[1] == f"  OpenAI API: http://spark-a.local:8888/v1 (model: {NAME})"
    assert "/home/n/.local/state/sparkfold/api-key" in lines[2]
    assert len(health.live_lines(NAME, 8888, "http://x:1")) == 2


# --- the wait + smoke of a new pair (operations/rank/switch.py) -----------------------------------------------------

def keyed(url: str, keyed_: bool = False) -> switch.Api:
    return switch.Api(url, MODEL, keyed_, 8888)


def test_a_pair_that_serves_logs_each_smoke_part_and_never_the_key(fake):
    fake.require_key = "k1"
    head = Spark({RankContainer: UP}, "head", {"cat ": ["# key", "k1"]})
    worker = Spark({RankContainer: UP}, "worker")
    assert switch.pair_problem(ranks.switch_inputs(HS), head, worker, 60, keyed(fake.url, True)) is None
    smoke = [m for m in head.logged if m.startswith("smoke test ")]
    assert [m.split(":", 1)[0] for m in smoke] == [f"smoke test {p}" for p in ("health", "reply", "stream", "tool",
                                                                                  "tool-result")]
    assert not any("k1" in m for m in head.logged)


def test_a_failed_smoke_test_says_which_part(fake):
    fake.bad = {"no-done"}
    head, worker = Spark({RankContainer: UP}, "head"), Spark({RankContainer: UP}, "worker")
    problem = switch.pair_problem(ranks.switch_inputs(HS), head, worker, 60, keyed(fake.url))
    assert problem == "the smoke test failed: FAIL stream: the stream ended without data: [DONE]"


def test_a_rank_that_exits_ends_the_wait(api):
    a = api(models=503)
    head, worker = Spark({RankContainer: UP}, "head"), Spark({RankContainer: DOWN}, "worker")
    assert switch.pair_problem(ranks.switch_inputs(HS), head, worker, 60, keyed(a.url)) == "rank 1 exited with code 1"


def test_the_logs_of_both_ranks_are_shown_on_a_failure():
    head = Spark({}, "head", {"docker logs": ["rank0 says hi"]})
    worker = Spark({}, "worker", {"docker logs": ["rank1: PeerDown"]})
    text = health.log_tails(head, worker, "c")
    assert "rank 0 (head)" in text and "rank0 says hi" in text and "rank1: PeerDown" in text


def test_load_status_shows_memory_and_the_newest_log_text_of_each_rank():
    head = Spark({}, "head", {"/proc/meminfo": ["97.9 of 121.7 GiB in use", "loading layer 3/43"]})
    # an engine's loading bar redraws its line with carriage returns: only what a terminal shows last is kept
    worker = Spark({}, "worker", {"/proc/meminfo": ["12.0 of 121.7 GiB in use", "load  10%\rload  55%\rload  80%\r"]})
    line = health.load_status(head, worker, "c")
    assert line == ("rank 0: 97.9 of 121.7 GiB in use, log: loading layer 3/43; "
                    "rank 1: 12.0 of 121.7 GiB in use, log: load  80%")
    quiet = Spark({}, "worker", {"/proc/meminfo": ["1.0 of 121.7 GiB in use"]})  # no log yet
    assert health.load_status(head, quiet, "c").endswith("rank 1: 1.0 of 121.7 GiB in use")


# --- the operation (operations/ranks.py pair_serving) ---------------------------------------------------------------

def pair_serving(url, executing, restarted=False, worker_state=UP, judged=True, start_failed=False, notes=None):
    """pair_serving on the head; judged: the running pair is the recorded last good generation."""
    import json as json_

    from rank_inputs import container, found, pair_plans, rank_facts

    from operations.rank.generation import Generation
    from operations.rank.plan import pair_plan
    s = HS.replace(api_url=url)
    wanted = pair_plan(s, WS, found(s), found(WS), image="img", template_digest="t", force=False).wanted
    good = Generation(wanted.id, wanted.specs, good_at=1.0)
    records = {"files": {f"{good.id}.json": json_.dumps(good.record())}, "last_good": good.id if judged else ""}
    head_inputs = found(s, container(wanted.specs[0].spec_hash()), generations=records)
    worker = Spark(rank_facts(found(WS, container(wanted.specs[1].spec_hash())), {RankContainer: worker_state}),
                   "worker")
    rank0 = SimpleNamespace(is_complete=lambda: executing, did_change=lambda: restarted and not start_failed,
                            did_succeed=lambda: not start_failed, will_change=restarted)
    return run_op(ranks.pair_serving, rank_facts(head_inputs, {RankContainer: UP}), executing=executing,
                  plans=pair_plans(s, worker, "img", "t"), rank0=rank0, notes=notes or switch.SwitchNotes())


def test_a_start_that_failed_is_judged_failed_without_a_wait(api):
    """rank_started ignores its errors: its failure reaches pair_serving, which fails the switch at once (the last
    good pair started again) with the reason the head noted, or rank 0's own failure."""
    cmds, _ = pair_serving(api().url, True, restarted=True, start_failed=True)
    assert len(cmds) == 1 and cmds[0].startswith("FunctionCommand(new_pair_served")
    assert "'rank 0 did not start on the head (its error is above)'" in cmds[0]
    noted = switch.SwitchNotes(start_problem="rank 1 did not start on the worker (no container; its error is above)")
    cmds, _ = pair_serving(api().url, True, start_failed=True, notes=noted)  # even a pair judged before the check
    assert "'rank 1 did not start on the worker" in cmds[0]


def test_a_running_pair_never_judged_is_judged_before_it_becomes_the_last_good(api):
    cmds, _ = pair_serving(api().url, True, judged=False)  # a run cut short after the start, say
    assert len(cmds) == 1 and cmds[0].startswith("FunctionCommand(new_pair_served")


def test_pair_serving_plans_the_wait_only_after_a_start(api):
    assert pair_serving("http://unused", False, restarted=True)[0][0].startswith("FunctionCommand(new_pair_served")


def test_pair_serving_after_a_start_waits(api):
    assert pair_serving(api().url, True, restarted=True)[0][0].startswith("FunctionCommand(new_pair_served")


def test_pair_serving_converged_is_no_change(api, caplog):
    caplog.set_level("INFO")
    cmds, host = pair_serving(api().url, True)
    assert cmds == [] and f"{NAME} serves at" in host.noops[0]
    assert f"✔ {NAME} is now LIVE! on port 8888" in caplog.text


def test_pair_serving_not_answering_waits_and_a_dead_rank_fails(api):
    assert pair_serving(closed_url(), True)[0][0].startswith("FunctionCommand(new_pair_served")
    cmds, _ = pair_serving(api().url, True, worker_state=DOWN)
    assert len(cmds) == 1 and cmds[0].startswith("FunctionCommand(failed_with_logs")
    assert "rank 1 exited with code 1" in cmds[0]


def test_fail_with_logs_shows_both_ranks():
    head = Spark({}, "head", {"docker logs": ["r0 line"]})
    worker = Spark({}, "worker", {"docker logs": ["r1 line"]})
    with ctx_host.use(head):  # the head's FunctionCommand
        assert switch.failed_with_logs(None, head, worker, HS.container_name, "rank 1 exited") is False
    tails, failure = head.logged  # the logs first, then the failure line that ends the output
    assert "r0 line" in tails and "r1 line" in tails
    assert failure == "sparkfold: the serving pair: rank 1 exited (the ranks' last log lines are above)"
