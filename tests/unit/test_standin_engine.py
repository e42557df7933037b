"""The simulated pair's stand-in engine, run as subprocesses on 127.0.0.1 with a tiny model folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "tests" / "sim" / "engine" / "bin"
TEMPLATE = ROOT / "model" / "chat_template.jinja"
NAME = "DeepSeek-V4.1-Flash-1017"


def tool(name, *args, **kw):
    return subprocess.run([sys.executable, str(BIN / name), *map(str, args)], capture_output=True, text=True,
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
    def __init__(self, model, inputs, rank0_args=(), rank1_args=("--pool", "65536")):
        self.link, self.api = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.api}"
        self.model, self.inputs = model, inputs
        self.rank0 = subprocess.Popen(
            [sys.executable, str(BIN / "tensorfold-native"), "serve", str(model), "--name", NAME, "--host",
             "127.0.0.1", "--port", str(self.api), "--context", "65536", "--parallel", "4", *rank0_args],
            env=rank0_env(inputs, self.link), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.rank1_args = rank1_args
        self.rank1 = None

    def start_rank1(self):
        self.rank1 = subprocess.Popen(
            [sys.executable, str(BIN / "tf-dsv41-lanes"), str(self.model), str(self.inputs / "rank1"), "1", "2",
             "127.0.0.1", str(self.link), str(self.inputs / "kit"), "--engram", str(self.inputs / "engram"),
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
