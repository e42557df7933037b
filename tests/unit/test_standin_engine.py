"""The simulated pair's stand-in engine, run as subprocesses on 127.0.0.1 with a tiny model folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "tests" / "sim" / "engine"
BIN = ENGINE / "bin"
TEMPLATE = ROOT / "model" / "chat_template.jinja"
NAME = "DeepSeek-V4.1-Flash-1017"


def tool(name, *args, bin_dir=BIN, **kw):
    return subprocess.run([sys.executable, str(bin_dir / name), *map(str, args)], capture_output=True, text=True,
                          timeout=30, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def model(tmp_path):
    m = tmp_path / "snapshot"
    m.mkdir()
    (m / "config.json").write_text(json.dumps({"model_type": "deepseek_v41", "engram_compressed_vocab_size": 4}))
    weights = {f"model.layers.{i}.mlp.w{j}": "model-00001-of-00001.safetensors" for i in range(3) for j in range(2)}
    weights["model.embed_tokens.weight"] = "model-00001-of-00001.safetensors"
    (m / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weights}))
    (m / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"Hello": 0, "hello": 1, "\u0120world": 2,
                                                                      "World": 3, "caf\u00c3\u00a9": 4, "cafe": 5,
                                                                      "x": 6}}}))
    if TEMPLATE.exists():
        shutil.copy(TEMPLATE, m / "chat_template.jinja")
    else:
        (m / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    return m


@pytest.fixture
def inputs(tmp_path, model):
    d = tmp_path / "data"
    for sub in ("kit", "engram", "rank0", "rank1"):
        (d / sub).mkdir(parents=True)
    assert tool("tf-dsv41-rank-cache", model, d / "rank0", 0, 2).returncode == 0
    assert tool("tf-dsv41-rank-cache", model, d / "rank1", 1, 2).returncode == 0
    (d / "token_map.json").write_text("[0]")
    return d


# --- offline tools -----------------------------------------------------------------------------------------------

def test_rank_cache_writes_named_files_and_refuses_a_second(model, tmp_path):
    out = tmp_path / "rc"
    r = tool("tf-dsv41-rank-cache", model, out, 0, 2)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    index = tool("tf-dsv41-rank-cache", model, out, 0, 2, "--index-only").stdout.strip()
    name = f"rank0of2-{hashlib.sha256(index.encode()).hexdigest()[:20]}.bin"
    assert info["file"] == str(out / name) and info["rank"] == 0 and info["world"] == 2
    assert sorted(os.listdir(out)) == [name]
    data = (out / name).read_bytes()
    assert data.endswith(b"TFDSRK01") and info["entries"] == len(json.loads(index))
    again = tool("tf-dsv41-rank-cache", model, out, 0, 2)
    assert again.returncode == 1 and f"already holds {name}" in again.stderr
    assert tool("tf-dsv41-rank-cache", model, out, 1, 2).returncode == 0  # rank 1 may share the folder
    one = json.loads(tool("tf-dsv41-rank-cache", model, out, 1, 2, "--index-only").stdout)
    assert one != json.loads(index)
    bad = tool("tf-dsv41-rank-cache", model, out, 2, 2)
    assert bad.returncode == 2 and "WORLD is 1, 2 or 4" in bad.stderr


def test_make_token_map(model, tmp_path):
    out = tmp_path / "map.json"
    r = tool("make_token_map.py", model, out)
    assert r.returncode == 0, r.stderr
    mapping = json.loads(out.read_text())
    assert len(mapping) == 7 and mapping[0] == mapping[1] and mapping[4] == mapping[5] and mapping[2] != mapping[0]
    assert r.stdout.strip() == f"{out}: 7 token ids -> 4 compressed ids"


# --- rank 0's command line ---------------------------------------------------------------------------------------

def test_capabilities_shape():
    doc = json.loads(tool("tensorfold-native", "capabilities", "--json").stdout)
    assert list(doc)[:4] == ["schema", "engine", "version", "chip"]
    assert doc["families"]["deepseek_v41"] == ["exl3-mul1"]
    flags = doc["serve"]["flags"]
    assert flags["--chat-template"] == {} and flags["--reasoning-effort"] == {"values": ["low", "medium", "high",
                                                                                           "xhigh"]}
    assert "--kv-dtype" not in flags and "--tp" not in flags


def test_unknown_flag_is_a_usage_error(model):
    r = tool("tensorfold-native", "serve", model, "--context", "4096", "--kv-dtype", "fp8")
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == "tensorfold serve: error: unrecognized arguments: --kv-dtype fp8"
    assert r.stderr.startswith("usage: tensorfold serve")
    r = tool("tensorfold-native", "serve", model, "--reasoning-effort", "max")
    assert r.returncode == 2 and "invalid choice: 'max'" in r.stderr


def test_argument_check_path_and_model_type(tmp_path):
    r = tool("tensorfold-native", "serve", "/nonexistent/argument-check", "--no-drafts", "--port", "1")
    assert r.returncode == 1
    assert "is neither a directory nor a Hugging Face repo id" in r.stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "qwen3"}')
    r = tool("tensorfold-native", "serve", other)
    assert r.returncode == 1 and "model_type 'qwen3'" in r.stderr


def test_missing_environment(model, inputs):
    r = tool("tensorfold-native", "serve", model, env={**os.environ, "TF_TP_MASTER": "127.0.0.1"})
    assert r.returncode == 1 and "TF_DS_RANK_CACHE" in r.stderr
    env = rank0_env(inputs, 1)
    os.unlink(next((inputs / "rank0").iterdir()))
    r = tool("tensorfold-native", "serve", model, env=env)
    assert r.returncode == 1 and "no rank0of2-*.bin" in r.stderr


def test_lanes_arguments(model, inputs):
    r = tool("tf-dsv41-lanes", model, inputs / "rank1", 1, 2, "127.0.0.1", 1, inputs / "kit", "--bogus", "1")
    assert r.returncode == 2 and "unknown option --bogus" in r.stderr
    r = tool("tf-dsv41-lanes", model, inputs / "rank1", 1, 2)
    assert r.returncode == 2 and r.stderr.startswith("usage: tf-dsv41-lanes")
    env = {**os.environ, "TF_STANDIN_LOAD_S": "0", "TF_STANDIN_CONNECT_S": "0.6"}
    start = time.monotonic()
    r = tool("tf-dsv41-lanes", model, inputs / "rank1", 1, 2, "127.0.0.1", free_port(), inputs / "kit", env=env)
    assert r.returncode == 1 and '"follow": "ConnectFailed"' in r.stdout and time.monotonic() - start >= 0.5


# --- the pair ----------------------------------------------------------------------------------------------------

def rank0_env(inputs, link_port):
    return {**os.environ, "TF_TP_WORLD": "2", "TF_TP_MASTER": "127.0.0.1", "TF_TP_PORT": str(link_port),
            "TF_DS_RANK_CACHE": str(inputs / "rank0"), "TF_DS_KIT": str(inputs / "kit"),
            "TF_DS_ENGRAM": str(inputs / "engram"), "TF_DS_TOKEN_MAP": str(inputs / "token_map.json"),
            "TF_STANDIN_LOAD_S": "0.2"}


class Pair:
    def __init__(self, model, inputs, rank0_args=(), rank1_args=("--pool", "65536"), bin_dir=BIN):
        self.link, self.api = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.api}"
        self.model, self.inputs, self.bin_dir = model, inputs, bin_dir
        self.rank0 = subprocess.Popen(
            [sys.executable, str(bin_dir / "tensorfold-native"), "serve", str(model), "--name", NAME, "--host",
             "127.0.0.1", "--port", str(self.api), "--context", "65536", "--parallel", "4", *rank0_args],
            env=rank0_env(inputs, self.link), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.rank1_args = rank1_args
        self.rank1 = None

    def start_rank1(self):
        self.rank1 = subprocess.Popen(
            [sys.executable, str(self.bin_dir / "tf-dsv41-lanes"), str(self.model), str(self.inputs / "rank1"), "1",
             "2", "127.0.0.1", str(self.link), str(self.inputs / "kit"), "--engram", str(self.inputs / "engram"),
             "--token-map", str(self.inputs / "token_map.json"), *self.rank1_args],
            env={**os.environ, "TF_STANDIN_LOAD_S": "0.1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)

    def wait_ready(self, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.rank0.poll() is not None:
                raise AssertionError(f"rank 0 exited {self.rank0.returncode}: {self.rank0.stderr.read()}")
            try:
                return requests.get(f"{self.url}/health", timeout=1)
            except requests.ConnectionError:
                time.sleep(0.1)
        raise AssertionError("rank 0 never listened")

    def close(self):
        for p in (self.rank0, self.rank1):
            if p and p.poll() is None:
                p.kill()
                p.wait()
            if p:
                p.stdout.close()
                p.stderr.close()


@pytest.fixture
def pair(model, inputs):
    made = []

    def make(**kw):
        made.append(Pair(model, inputs, **kw))
        return made[-1]

    yield make
    for p in made:
        p.close()


def chat(url, headers=None, **extra):
    body = {"model": NAME, "max_tokens": 32, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False},
            "messages": [{"role": "user", "content": "Reply with OK."}], **extra}
    return requests.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}, timeout=10,
                         stream=bool(extra.get("stream")))


def test_api_waits_for_rank1_then_answers_through_both(pair):
    p = pair()
    time.sleep(1.0)  # loaded and blocked in accept: the API must not listen yet
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{p.url}/health", timeout=1)
    assert p.rank0.poll() is None
    p.start_rank1()
    health = p.wait_ready().json()
    assert health["status"] == "ok" and health["model"] == NAME
    assert requests.get(f"{p.url}/v1/models", timeout=5).json()["data"][0]["id"] == NAME

    reply = chat(p.url).json()
    text = reply["choices"][0]["message"]["content"]
    assert text.startswith("OK.") and "rank 1 lanes" in text and reply["choices"][0]["finish_reason"] == "stop"
    assert reply == {**reply, "model": NAME} and chat(p.url).json()["choices"] == reply["choices"]  # deterministic

    events = [ln for ln in chat(p.url, stream=True).iter_lines(decode_unicode=True) if ln]
    assert events[-1] == "data: [DONE]"
    streamed = "".join((json.loads(e[5:])["choices"][0]["delta"].get("content") or "") for e in events[:-1])
    assert streamed == text

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    call = chat(p.url, tools=tools).json()["choices"][0]
    assert call["finish_reason"] == "tool_calls"
    assert call["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(call["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "sparkfold"}

    # rank 1 goes away: rank 0 must exit 1
    p.rank1.kill()
    assert p.rank0.wait(timeout=10) == 1
    assert "PeerDown" in p.rank0.stderr.read()
    out = p.rank0.stdout.read()
    assert f"[tensorfold] serving {NAME} at http://127.0.0.1:{p.api}/v1 (" in out


def result_turn(url, content, stream=False, **extra):
    """The agent loop's second turn: the stand-in's own get_weather call and a `role: tool` result for it."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    question = {"role": "user", "content": "What is the weather in Paris?"}
    call = chat(url, tools=tools, messages=[question]).json()["choices"][0]["message"]["tool_calls"][0]
    messages = [question, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": content}]
    return chat(url, tools=tools, messages=messages, max_tokens=64, stream=stream, **extra)


def test_a_tool_result_is_answered_in_text_as_a_server_does(pair):
    p = pair()
    p.start_rank1()
    p.wait_ready()
    result = '{"city": "Paris", "forecast": "sunny"}'
    reply = result_turn(p.url, result).json()["choices"][0]
    assert reply["finish_reason"] == "stop" and "tool_calls" not in reply["message"]
    text = reply["message"]["content"]
    assert text.startswith("OK. Both ranks answered (rank 1 lanes ") and text.endswith(f"The tool returned: {result}")
    events = [ln for ln in result_turn(p.url, result, stream=True).iter_lines(decode_unicode=True) if ln]
    chunks = [json.loads(e[5:]) for e in events[:-1] if e[5:].strip().startswith("{")]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == text
    assert not any(d["delta"].get("tool_calls") for d in deltas) and deltas[-1]["finish_reason"] == "stop"
    assert events[-1] == "data: [DONE]"
    # content parts are read for their text, as the template renders them
    parts = result_turn(p.url, [{"type": "text", "text": "sunny,"}, {"type": "text", "text": "21 C"}]).json()
    assert parts["choices"][0]["message"]["content"].endswith("The tool returned: sunny, 21 C")
    # a request that forces a call still gets one; "none" gets text
    for forced in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        again = result_turn(p.url, result, tool_choice=forced).json()["choices"][0]
        assert again["finish_reason"] == "tool_calls" and again["message"]["tool_calls"][0]["function"]["name"] \
            == "get_weather"
    assert result_turn(p.url, result, tool_choice="none").json()["choices"][0]["finish_reason"] == "stop"


def test_a_new_question_after_a_tool_result_may_call_again(pair):
    """Only a conversation that ends in a tool result is answered from it: a later user turn is a new question."""
    p = pair()
    p.start_rank1()
    p.wait_ready()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "assistant", "content": "It is sunny."},
                {"role": "user", "content": "And in Rome?"}]
    reply = chat(p.url, tools=tools, messages=messages).json()["choices"][0]
    assert reply["finish_reason"] == "tool_calls"


def test_the_validators_tool_checks_pass_on_the_standin(pair):
    """Every deploy on the simulated pair runs the smoke test: its tool-result turn, and the tools check's result
    part (which wants the confirmation code back), pass against the stand-in."""
    from operations.validate import tools
    from operations.validate.client import Client
    from operations.validate.result import PASS

    p = pair()
    p.start_rank1()
    p.wait_ready()
    assert smoke(p.url) == []
    result = tools.result_turn(Client(p.url, model=NAME, timeout=10))
    assert result.status == PASS, result.line()


def test_rank1_follows_until_rank0_stops(pair):
    p = pair()
    p.start_rank1()
    p.wait_ready()
    p.rank0.send_signal(signal.SIGTERM)
    assert p.rank0.wait(timeout=10) == 0
    assert p.rank1.wait(timeout=10) == 0 and '"followed": true' in p.rank1.stdout.read()


def test_rank1_exits_when_rank0_dies(pair):
    p = pair()
    p.start_rank1()
    p.wait_ready()
    p.rank0.kill()
    assert p.rank1.wait(timeout=10) == 1
    assert '{"rank": 1, "follow": "PeerDown"}' in p.rank1.stdout.read()


def test_pool_must_equal_context(pair):
    p = pair(rank1_args=("--pool", "1048576"))
    p.start_rank1()
    assert p.rank0.wait(timeout=10) == 1
    assert "pool 1048576 but --context is 65536" in p.rank0.stderr.read()


def test_api_key_file(pair, tmp_path):
    key = tmp_path / "api-key"
    key.write_text("# sparkfold\nsecret-key\n")
    key.chmod(0o644)
    p = pair(rank0_args=("--api-key-file", str(key)))
    assert p.rank0.wait(timeout=10) == 1 and "API key file cannot be opened safely" in p.rank0.stderr.read()
    key.chmod(0o600)
    p = pair(rank0_args=("--api-key-file", str(key)))
    p.start_rank1()
    assert p.wait_ready().json() == {"status": "ok"}
    denied = requests.get(f"{p.url}/v1/models", timeout=5)
    assert denied.status_code == 401 and denied.headers["WWW-Authenticate"] == "Bearer"
    assert denied.json()["error"]["code"] == "invalid_api_key"
    assert chat(p.url).status_code == 401
    ok = chat(p.url, headers={"Authorization": "Bearer secret-key"})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]


def test_api_key_file_is_re_read_when_it_changes(pair, tmp_path):
    """As the engine does: a key file renamed over the old one is read within about a second; an empty replacement
    closes the authenticated routes rather than opening them."""
    folder = tmp_path / "api-key.d"
    folder.mkdir()
    key = folder / "key"
    key.write_text("old-key\n")
    key.chmod(0o600)
    p = pair(rank0_args=("--api-key-file", str(key)))
    p.start_rank1()
    p.wait_ready()
    bearer = lambda k: {"Authorization": f"Bearer {k}"}  # noqa: E731
    assert requests.get(f"{p.url}/v1/models", headers=bearer("old-key"), timeout=5).status_code == 200
    new = folder / "key.new"
    new.write_text("new-key\n")
    new.chmod(0o600)
    new.rename(key)
    time.sleep(1.2)
    assert requests.get(f"{p.url}/v1/models", headers=bearer("new-key"), timeout=5).status_code == 200
    assert requests.get(f"{p.url}/v1/models", headers=bearer("old-key"), timeout=5).status_code == 401
    key.write_text("")
    time.sleep(1.2)
    assert requests.get(f"{p.url}/v1/models", timeout=5).status_code == 401
    assert requests.get(f"{p.url}/v1/models", headers=bearer("new-key"), timeout=5).status_code == 401


METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the engine's (engine-facts 3.2)


def test_metrics_count_the_requests_as_prometheus_text(pair):
    from operations.util import prometheus

    p = pair()
    p.start_rank1()
    p.wait_ready()
    first = requests.get(f"{p.url}/metrics", timeout=5)
    assert first.status_code == 200 and first.headers["Content-Type"] == METRICS_TYPE
    label = f'{{model="{NAME}"}}'
    assert first.text.splitlines()[:3] == ["# HELP tensorfold_requests_total Completion requests received.",
                                           "# TYPE tensorfold_requests_total counter",
                                           f"tensorfold_requests_total{label} 0"]
    usage = chat(p.url).json()["usage"]
    assert chat(p.url, messages=[]).status_code == 400  # counted, as an error
    after = requests.get(f"{p.url}/v1/metrics", timeout=5)  # the engine's second route
    values = prometheus.totals(prometheus.parse(after.text))
    assert values == {"tensorfold_requests_total": 2.0, "tensorfold_request_errors_total": 1.0,
                      "tensorfold_prompt_tokens_total": usage["prompt_tokens"],
                      "tensorfold_completion_tokens_total": usage["completion_tokens"],
                      "tensorfold_requests_inflight": 0.0}
    assert prometheus.parse(after.text).types["tensorfold_requests_inflight"] == "gauge"


def test_metrics_need_the_key_unless_metrics_open(pair, tmp_path):
    key = tmp_path / "api-key"
    key.write_text("secret-key\n")
    key.chmod(0o600)
    p = pair(rank0_args=("--api-key-file", str(key)))
    p.start_rank1()
    p.wait_ready()
    denied = requests.get(f"{p.url}/metrics", timeout=5)
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    ok = requests.get(f"{p.url}/metrics", headers={"Authorization": "Bearer secret-key"}, timeout=5)
    assert ok.status_code == 200 and "tensorfold_requests_total" in ok.text
    p.close()
    p = pair(rank0_args=("--api-key-file", str(key), "--metrics-open"))
    p.start_rank1()
    p.wait_ready()
    assert requests.get(f"{p.url}/metrics", timeout=5).status_code == 200
    assert requests.get(f"{p.url}/v1/models", timeout=5).status_code == 401  # only the metrics routes open


def test_a_broken_template_fails_visibly(pair, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    p = pair(rank0_args=("--chat-template", str(bad)))
    assert p.rank0.wait(timeout=10) == 1 and "does not parse" in p.rank0.stderr.read()
    raising = tmp_path / "raising.jinja"
    raising.write_text("{% if messages[0].content == 'boom' %}{{ raise_exception('no boom here') }}{% endif %}ok")
    p = pair(rank0_args=("--chat-template", str(raising)))
    p.start_rank1()
    p.wait_ready()
    r = chat(p.url, messages=[{"role": "user", "content": "boom"}])
    assert r.status_code == 500 and "no boom here" in r.json()["error"]["message"]
    assert chat(p.url).status_code == 200


# --- test-only faults (tests/sim/engine/faults/README.md) ---------------------------------------------------------

CRASH_LINE = "sim fault crash-on-load: exiting while loading"
DIFFER_MARK = " [sim fault replies-differ]"
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture
def engine_copy(tmp_path):
    """A copy of the build context, as a test that wants a faulty image makes one: its programs read its faults/."""
    copy = tmp_path / "engine-copy"
    shutil.copytree(ENGINE, copy)
    return copy


def test_faults_folder_ships_with_no_fault_on():
    """The folder always exists (its README), the image copies it beside the programs' resolved bin/, and no fault
    file is committed: the checkout's image is the fault-free one."""
    assert sorted(p.name for p in (ENGINE / "faults").iterdir()) == ["README.md"]
    readme = (ENGINE / "faults" / "README.md").read_text()
    assert "`crash-on-load`" in readme and "`replies-differ`" in readme
    dockerfile = (ENGINE / "Dockerfile").read_text()
    assert "COPY faults/ /opt/tensorfold/faults/" in dockerfile
    assert "COPY bin/tensorfold-native bin/tf-dsv41-lanes bin/tf-dsv41-rank-cache /opt/tensorfold/bin/" in dockerfile
    for name in ("tensorfold-native", "tf-dsv41-lanes", "tf-dsv41-rank-cache"):
        assert f"ln -sf /opt/tensorfold/bin/{name} /usr/local/bin/{name}" in dockerfile


def test_crash_on_load_fault(pair, model, inputs, engine_copy, tmp_path):
    bin_dir = engine_copy / "bin"
    # without the fault file the copy's pair serves as before
    p = pair(bin_dir=bin_dir)
    p.start_rank1()
    assert p.wait_ready().json()["status"] == "ok" and chat(p.url).status_code == 200
    p.close()

    (engine_copy / "faults" / "crash-on-load").write_text("")
    # run through symlinks, as the image runs /usr/local/bin/X -> /opt/tensorfold/bin/X: the fault is found beside
    # the resolved bin/, not beside the link
    links = tmp_path / "usr-local-bin"
    links.mkdir()
    for name in ("tensorfold-native", "tf-dsv41-lanes"):
        (links / name).symlink_to(bin_dir / name)
    start = time.monotonic()
    p = pair(bin_dir=links)
    p.start_rank1()
    assert p.rank0.wait(timeout=15) == 1 and p.rank1.wait(timeout=15) == 1
    assert time.monotonic() - start >= 1.9  # they ran (loading) before they exited, not a refused start
    out, err = p.rank0.stdout.read(), p.rank0.stderr.read()
    assert out.startswith("[tensorfold] CUDA sm_121 device 0") and "serving" not in out
    assert err.splitlines() == [f"tensorfold: {CRASH_LINE}"]  # it never waited for rank 1
    assert p.rank1.stdout.read() == ""
    assert p.rank1.stderr.read().splitlines() == [f"tf-dsv41-lanes: {CRASH_LINE}"]

    # what the deploy runs before it launches the ranks still works from the faulty image
    caps = tool("tensorfold-native", "capabilities", "--json", bin_dir=bin_dir)
    assert caps.returncode == 0 and caps.stdout == tool("tensorfold-native", "capabilities", "--json").stdout
    assert tool("tensorfold-native", "--version", bin_dir=bin_dir).returncode == 0
    r = tool("tf-dsv41-rank-cache", model, tmp_path / "rc", 0, 2, bin_dir=bin_dir)
    assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])["rank"] == 0
    r = tool("make_token_map.py", model, tmp_path / "map.json", bin_dir=bin_dir)
    assert r.returncode == 0 and len(json.loads((tmp_path / "map.json").read_text())) == 7
    # the fault comes after the argument and input checks: a usage error is still one, at once
    r = tool("tensorfold-native", "serve", model, "--kv-dtype", "fp8", bin_dir=bin_dir)
    assert r.returncode == 2 and CRASH_LINE not in r.stderr
    r = tool("tf-dsv41-lanes", model, inputs / "rank1", 1, 2, bin_dir=bin_dir)
    assert r.returncode == 2 and CRASH_LINE not in r.stderr


def replies(url):
    """The replies a fault can change: plain, streamed (assembled), with reasoning, and a tool call."""
    plain = chat(url).json()["choices"][0]
    events = [ln for ln in chat(url, stream=True).iter_lines(decode_unicode=True) if ln]
    chunks = [json.loads(e[5:]) for e in events[:-1]]
    thinking = chat(url, chat_template_kwargs={"enable_thinking": True}).json()["choices"][0]
    call = chat(url, tools=WEATHER).json()["choices"][0]
    return {"plain": plain["message"]["content"], "finish": plain["finish_reason"], "done": events[-1],
            "streamed": "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks),
            "stream_finish": chunks[-1]["choices"][0]["finish_reason"],
            "reasoning": thinking["message"]["reasoning_content"], "thought_content": thinking["message"]["content"],
            "call": call["message"]["tool_calls"][0]["function"], "call_finish": call["finish_reason"]}


def exact_record(url, path):
    from operations.validate import exact
    from operations.validate.client import Client

    path.write_text(json.dumps(exact.record(Client(url, model=NAME, timeout=10))))
    return json.loads(path.read_text())


def smoke(url):
    from operations.validate.client import Client
    from operations.validate.result import PASS
    from operations.validate.smoke import smoke_parts

    results = smoke_parts(Client(url, model=NAME, timeout=10))
    assert [r.name for r in results] == ["health", "reply", "stream", "tool", "tool-result"]
    return [r.line() for r in results if r.status != PASS]


def test_replies_differ_fault(pair, engine_copy, tmp_path, capsys):
    clean = pair()
    (engine_copy / "faults" / "replies-differ").write_text("")
    faulty = pair(bin_dir=engine_copy / "bin")
    clean.start_rank1()
    faulty.start_rank1()
    clean.wait_ready()
    faulty.wait_ready()

    old, new = replies(clean.url), replies(faulty.url)
    # without the fault: the replies as before
    assert old["plain"].startswith("OK. Both ranks answered (rank 1 lanes ") and old["plain"].endswith(").")
    assert old["streamed"] == old["plain"] and old["reasoning"] == "The user wants a short reply."
    assert old["call"]["arguments"] == '{"city": "sparkfold"}'
    # with it: every text differs, deterministically, and the reply is as good
    assert new["plain"] == old["plain"] + DIFFER_MARK and new == replies(faulty.url)
    assert new["streamed"] == new["plain"] and new["done"] == "data: [DONE]"
    assert new["reasoning"] == old["reasoning"] + DIFFER_MARK and new["thought_content"] != old["thought_content"]
    assert new["call"] == {"name": "get_weather", "arguments": '{"city":"sparkfold"}'}
    assert json.loads(new["call"]["arguments"]) == json.loads(old["call"]["arguments"])
    assert {k: new[k] for k in ("finish", "stream_finish", "call_finish", "done")} == {
        k: old[k] for k in ("finish", "stream_finish", "call_finish", "done")}

    # the smoke test passes on both; an exact record tells them apart on every prompt
    assert smoke(clean.url) == [] and smoke(faulty.url) == []
    from operations.validate import exact
    from operations.validate.result import FAIL, PASS

    a, a2, b = (exact_record(u, tmp_path / f) for u, f in ((clean.url, "a.json"), (clean.url, "a2.json"),
                                                            (faulty.url, "b.json")))
    assert exact.compare(str(tmp_path / "a.json"), str(tmp_path / "a2.json")).status == PASS
    differ = exact.compare(str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert differ.status == FAIL and differ.detail.startswith(f"{len(exact.PROMPTS)} of {len(exact.PROMPTS)} prompts")
    for name, one in a["prompts"].items():
        other = b["prompts"][name]
        assert one["text_sha256"] != other["text_sha256"], name
        assert {k: v for k, v in one.items() if k not in ("text", "text_sha256")} == {
            k: v for k, v in other.items() if k not in ("text", "text_sha256")}, name
    assert a2["prompts"] == a["prompts"]

    # rank 0 says so in its log, the fault-free one does not
    for p in (clean, faulty):
        p.rank0.send_signal(signal.SIGTERM)
        assert p.rank0.wait(timeout=10) == 0
    fault_line = "[tensorfold] sim fault replies-differ: every reply's text differs from the fault-free image's"
    assert fault_line in faulty.rank0.stdout.read().splitlines()
    assert "sim fault" not in clean.rank0.stdout.read()
    capsys.readouterr()  # exact.record's progress lines


def test_the_bench_knob_makes_a_weight_file_of_half_the_pack_at_its_rate(model, engine_copy, tmp_path):
    """tests/bench/first_run.py's weight files: a rank's share of a scaled-up pack, written at the real tool's
    pace; the engine still reads its index from the end."""
    (model / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 4 * 2**20)  # a 4 MiB pack
    plain = tmp_path / "plain"
    assert tool("tf-dsv41-rank-cache", model, plain, 1, 2, bin_dir=engine_copy / "bin").returncode == 0
    (engine_copy / "faults" / "bench-rank-write").write_text(json.dumps({"fraction": 0.5, "rate": 8 * 2**20}))
    out = tmp_path / "rc"
    t0 = time.monotonic()
    done = tool("tf-dsv41-rank-cache", model, out, 1, 2, bin_dir=engine_copy / "bin")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 >= 0.2  # 2 MiB at 8 MiB/s
    (big,), (small,) = out.iterdir(), plain.iterdir()
    assert big.name == small.name and big.stat().st_size == small.stat().st_size + 2 * 2**20
    data = big.read_bytes()
    assert data[-8:] == b"TFDSRK01"
    index_at = struct.unpack("<Q", data[-16:-8])[0]
    assert json.loads(data[index_at:-16]) == json.loads(small.read_bytes()[index_at - 2 * 2**20:-16])
    (engine_copy / "faults" / "bench-build-s").write_text("1")
    assert 'sleep "$(cat /opt/tensorfold/faults/bench-build-s)"' in (engine_copy / "Dockerfile").read_text()
