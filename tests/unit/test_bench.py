"""bench and compare: against a fake server on 127.0.0.1 that answers right (usage, streamed deltas), and ones that
are wrong in exactly one way; compare both ways; the command line's matrix options."""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from operations.validate import bench, plot
from operations.validate.__main__ import main
from operations.validate.result import FAIL, NOT_RUN, PASS, UNVERIFIED, Result

# the smallest matrix: one prefill size, one condition, 1 and 3 streams
QUICK = ["--prefill-sizes", "500", "--decode-tokens", "16", "--streams", "1,3", "--temperatures", "0",
         "--thinking", "off", "--prompts", "prose"]


class Fake(BaseHTTPRequestHandler):
    """Counts 4 characters a prompt token; a streamed reply is one delta per token (ignore_eos: max_tokens).
    `server.fault` makes it wrong in one way."""

    def log_message(self, *args):
        pass

    def _send(self, status, body):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.server.fault == "key":
            return self._send(401, {"error": {"message": "A valid API key is required"}})
        self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        fault = self.server.fault
        prompt_tokens = sum(len(m["content"]) for m in body["messages"]) // 4
        if fault == "http-500" or (fault == "too-long" and prompt_tokens > 1500):
            return self._send(500, {"error": {"message": "the prompt and its max_tokens do not fit the context"}})
        if fault == "not-json":
            return self._send(200, b"<html>proxy error</html>")
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": body.get("max_tokens", 16)}
        if fault == "no-usage" or (fault == "no-stream-usage" and body.get("stream")):
            usage = None
        if not body.get("stream"):
            reply = {"object": "chat.completion", "model": body["model"], "tensorfold": {"prefill_s": 0.001},
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "Lighthouse."},
                                  "finish_reason": "length"}]}
            return self._send(200, reply | ({"usage": usage} if usage else {}))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
        if fault == "stream-error" and body["temperature"] > 0:
            chunks.append({"error": {"message": "engine lost rank 1"}})
        if fault != "no-deltas":
            chunks += [{"choices": [{"index": 0, "delta": {"content": "tok "}}]}] * body.get("max_tokens", 16)
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if usage:
            chunks.append({"choices": [], "usage": usage})
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    httpd.fault, httpd.requests = None, []
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def bench_run(server, *options):
    return main(["--base-url", server.url, *options, "bench"])


# --- moved unchanged from test_validate.py (the invocation shrinks the new matrix to the old shape) --------------

def test_bench_writes_figures_and_compare_flags_a_drop(server, tmp_path, capsys):
    a = tmp_path / "a.json"
    assert bench_run(server, *QUICK, "--out", str(a)) == PASS
    record = json.loads(a.read_text())
    assert record["kind"] == "sparkfold-bench"
    assert record["prefill"]["prompt_tokens"] > 400 and record["prefill"]["tok_s"] > 0
    assert record["decode"]["completion_tokens"] == 16 and record["decode"]["tok_s"] > 0
    assert record["multi"]["streams"] == 3 and record["multi"]["completion_tokens"] == 48
    posts = server.requests
    assert sum(1 for b in posts if b.get("stream")) == 1 + 3

    assert main(["compare", str(a), str(a)]) == PASS
    slow = dict(record, decode=dict(record["decode"], tok_s=record["decode"]["tok_s"] * 0.5))
    b = tmp_path / "b.json"
    b.write_text(json.dumps(slow))
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--json"]) == FAIL
    report = json.loads(capsys.readouterr().out.rsplit("\nFAIL", 1)[0])
    assert report["worse"] == ["decode.tok_s"] and report["figures"]["decode.tok_s"]["change_pct"] == -50.0


# --- a server that answers right -------------------------------------------------------------------------------

def test_default_matrix_measures_every_size_and_condition(server, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert bench_run(server, "--prefill-sizes", "1K,2K,500", "--decode-tokens", "8", "--out", str(out)) == PASS
    record = json.loads(out.read_text())
    assert record["version"] == bench.VERSION and record["complete"] is True and record["errors"] == []
    sweep = record["prefill_sweep"]
    assert [r["size"] for r in sweep] == [500, 1024, 2048]
    for r in sweep:  # sized as the server counts: usage.prompt_tokens near the asked size
        assert abs(r["prompt_tokens"] - r["size"]) <= 0.02 * r["size"] + 2 and r["server_prefill_s"] == 0.001
    runs = record["decode_runs"]
    assert len(runs) == 2 * 2 * 2 * 4  # prose/code x T 0/0.7 x thinking off/on x 1-4 streams
    assert {(r["prompt"], r["temperature"], r["thinking"]) for r in runs} == {
        (p, t, th) for p in ("prose", "code") for t in (0.0, 0.7) for th in (False, True)}
    for r in runs:
        assert r["completion_tokens"] == 8 * r["streams"] and r["tok_s_total"] > 0 and r["ttft_s"] <= r["ttft_max_s"]
    assert record["decode"]["condition"] == "prose, temperature 0, thinking off" and record["decode"]["streams"] == 1
    assert record["multi"]["streams"] == 4

    # the requests: thinking switch, temperature, ignore_eos and usage asked for, every prompt unique
    streamed = [b for b in server.requests if b.get("stream")]
    assert len(streamed) == 8 * (1 + 2 + 3 + 4)
    assert all(b["ignore_eos"] and b["stream_options"] == {"include_usage": True} for b in streamed)
    assert {b["chat_template_kwargs"]["enable_thinking"] for b in streamed} == {True, False}
    assert {b["temperature"] for b in streamed} == {0.0, 0.7}
    firsts = [b["messages"][0]["content"][:40] for b in server.requests if not b.get("stream")]
    assert len(firsts) == 1 + 3 and len(set(firsts)) == len(firsts)  # calibration + 3 sizes, no shared prefix

    captured = capsys.readouterr()
    # one progress line per measurement (plus the plan line), flushed to stderr, no carriage returns
    lines = captured.err.splitlines()
    assert len(lines) == 1 + 3 + 32 and all(line.startswith("bench: ") for line in lines)
    assert "\r" not in captured.err and "\r" not in captured.out
    # the tables: prefill (prompt tokens, seconds, tok/s), then decode per condition (streams, total, per stream, TTFT)
    assert "| prompt tokens | seconds | tok/s |" in captured.out
    assert captured.out.count("| streams | total tok/s | per-stream tok/s | TTFT |") == 8
    assert "## decode: code, temperature 0.7, thinking on" in captured.out
    assert "PASS bench:" in captured.out


def test_without_out_the_record_follows_the_tables(server, capsys):
    assert bench_run(server, *QUICK) == PASS
    out = capsys.readouterr().out
    record = json.loads(out[out.index("\n{") + 1:out.rindex("\n}") + 2])
    assert record["kind"] == bench.KIND and len(record["decode_runs"]) == 2


# --- servers wrong in exactly one way ------------------------------------------------------------------------------

@pytest.mark.parametrize("fault, status", [
    ("no-usage", UNVERIFIED),          # no usage at all
    ("no-stream-usage", UNVERIFIED),   # prefill counted, streams not (stream_options ignored)
    ("no-deltas", UNVERIFIED),         # a stream without content deltas: no TTFT
    ("http-500", FAIL),                # every request answered with an error
    ("not-json", FAIL),                # a body that is not JSON
    ("key", NOT_RUN),                  # the server wants a key
])
def test_a_server_wrong_in_one_way(server, fault, status):
    server.fault = fault
    assert bench_run(server, *QUICK) == status


def test_unreachable_server_could_not_run():
    assert main(["--base-url", "http://127.0.0.1:9", "--model", "m", *QUICK, "bench"]) == NOT_RUN


def test_an_error_on_one_size_fails_but_keeps_the_other_figures(server, tmp_path, capsys):
    server.fault = "too-long"
    out = tmp_path / "r.json"
    assert bench_run(server, *QUICK, "--prefill-sizes", "500,4K", "--out", str(out)) == FAIL
    record = json.loads(out.read_text())
    assert "tok_s" in record["prefill_sweep"][0] and "do not fit" in record["prefill_sweep"][1]["error"]
    assert record["errors"] == [f"prefill 4096: {record['prefill_sweep'][1]['error']}"]
    assert record["decode"]["tok_s"] > 0 and record["complete"] is True
    captured = capsys.readouterr()
    assert "prefill 4096: FAILED: HTTP 500" in captured.err and "| (4,096) | failed |" in captured.out


def test_an_error_inside_streams_fails_those_runs_only(server, tmp_path):
    server.fault = "stream-error"
    out = tmp_path / "r.json"
    assert bench_run(server, *QUICK, "--temperatures", "0,0.7", "--out", str(out)) == FAIL
    runs = json.loads(out.read_text())["decode_runs"]
    assert [("error" in r) for r in runs] == [False, False, True, True]  # the T 0.7 runs
    assert "engine lost rank 1" in runs[2]["error"]


# --- the command line ----------------------------------------------------------------------------------------------

def options(*argv):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(list(argv))


def test_matrix_options_and_their_defaults():
    d = options()
    assert d.prefill_sizes == [4096, 8192, 16384, 32768, 65536, 131072, 262144]
    assert d.streams == [1, 2, 3, 4] and d.temperatures == [0.0, 0.7] and d.thinking == [False, True]
    assert d.prompts == ["prose", "code"] and d.tolerance == 10.0
    o = options("--prefill-sizes", "4K,32k,1000", "--streams", "4", "--temperatures", "0.7", "--thinking", "on",
                "--prompts", "code")
    assert o.prefill_sizes == [4096, 32768, 1000] and o.streams == [4] and o.temperatures == [0.7]
    assert o.thinking == [True] and o.prompts == ["code"]
    assert options("--prefill-tokens", "500").prefill_sizes == [500]  # the earlier single-size option


@pytest.mark.parametrize("argv", [["--streams", "0"], ["--streams", "x"], ["--thinking", "maybe"],
                                  ["--temperatures", "3"], ["--prefill-sizes", ""], ["--prompts", "poetry"],
                                  ["--prefill-sizes", "4M"]])
def test_bad_matrix_options_could_not_run(server, argv):
    with pytest.raises(SystemExit) as e:
        bench_run(server, *argv)
    assert e.value.code == NOT_RUN


# --- compare -------------------------------------------------------------------------------------------------------

def record(tok_s=80.0, ttft=0.133, total=154.0, prefill=2100.0, version=2):
    r = {"kind": bench.KIND, "version": version, "prefill": {"prompt_tokens": 4100, "seconds": 1.95, "tok_s": prefill},
         "decode": {"completion_tokens": 256, "ttft_s": ttft, "seconds": 3.3, "tok_s": tok_s},
         "multi": {"streams": 4, "completion_tokens": 1024, "seconds": 6.6, "tok_s_total": total,
                   "tok_s_per_stream": total / 4}}
    if version == 2:
        r["prefill_sweep"] = [{"size": 4096, "prompt_tokens": 4100, "seconds": 1.95, "tok_s": prefill}]
        r["decode_runs"] = [{"prompt": "prose", "temperature": 0.0, "thinking": False, "streams": 4,
                             "tok_s_total": total, "tok_s_per_stream": total / 4, "ttft_s": ttft}]
    return r


def test_compare_fails_only_on_the_wrong_direction():
    base = record()
    assert bench.compare(base, record(tok_s=100, ttft=0.1, total=200, prefill=2500), 10)["worse"] == []  # better
    assert bench.compare(base, record(tok_s=75), 10)["worse"] == []  # -6%: inside the tolerance
    assert bench.compare(base, record(tok_s=70), 10)["worse"] == ["decode.tok_s"]
    worse = bench.compare(base, record(ttft=0.2), 10)["worse"]
    assert worse == ["decode.ttft_s", "decode@prose,t0.0,thinking-off,x4.ttft_s"]
    worse = bench.compare(base, record(total=120, prefill=1500), 10)["worse"]
    run = "decode@prose,t0.0,thinking-off,x4"
    assert worse == ["prefill.tok_s", "multi.tok_s_total", "multi.tok_s_per_stream", "prefill@4096.tok_s",
                     f"{run}.tok_s_total", f"{run}.tok_s_per_stream"]
    # and the other way round: B slower than A is A faster than B
    assert bench.compare(record(tok_s=70), base, 10)["worse"] == []
    assert bench.compare(record(ttft=0.2), base, 10)["worse"] == []


def test_compare_tolerance_and_figures_only_one_record_has():
    assert bench.compare(record(), record(tok_s=70), 20)["worse"] == []
    report = bench.compare(record(version=1), record(), 10)  # a version-1 record has the headline figures only
    assert report["worse"] == [] and report["figures"]["prefill@4096.tok_s"] == {"a": None, "b": 2100.0,
                                                                                "change_pct": None}


def test_compare_command_exit_codes(tmp_path, capsys):
    paths = {}
    for name, r in {"a": record(), "slower": record(tok_s=60), "faster": record(tok_s=100), "v1": record(version=1),
                    "other": {"kind": "other"}, "future": dict(record(), version=99)}.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(r))
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["compare", str(paths["a"]), str(paths["faster"])]) == PASS
    assert main(["compare", str(paths["a"]), str(paths["slower"])]) == FAIL
    assert main(["compare", str(paths["a"]), str(paths["slower"]), "--tolerance", "30"]) == PASS
    assert main(["compare", str(paths["v1"]), str(paths["a"])]) == PASS
    for unreadable in ("other", "future"):
        assert main(["compare", str(paths["a"]), str(paths[unreadable])]) == NOT_RUN
    assert main(["compare", str(paths["a"]), str(tmp_path / "broken.json")]) == NOT_RUN
    assert main(["compare", str(paths["a"]), str(tmp_path / "missing.json")]) == NOT_RUN
    out = capsys.readouterr().out
    assert "version 99" in out and "FAIL compare: worse than" in out


@pytest.mark.parametrize("argv", [
    ["compare", "A", "B"],
    ["bench", "compare", "A", "B"],  # as the docs' bench section reads
    ["bench", "compare", "--tolerance", "30", "A", "B"],  # options between the words
    ["--json", "bench", "compare", "A", "B", "--tolerance", "30"],
])
def test_compare_as_a_newcomer_types_it(tmp_path, capsys, argv):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(record()))
    b.write_text(json.dumps(record(tok_s=75)))  # -6.25%: inside the default and the 30% tolerance
    words = [str(a) if w == "A" else str(b) if w == "B" else w for w in argv]
    assert main(words) == PASS
    out = capsys.readouterr().out
    tolerance = "30" if "30" in argv else "10"
    assert out.endswith(f"PASS compare: no figure worse by more than {tolerance}%\n")
    assert ('"tolerance_pct"' in out) == ("--json" in argv)


def test_bench_plot_is_plot(tmp_path, monkeypatch):
    seen = []

    def run_plot(paths, out):
        seen.append((paths, out))
        return Result("plot", PASS, "drawn")

    monkeypatch.setattr(plot, "run_plot", run_plot)
    assert main(["bench", "plot", "a.json", "-o", str(tmp_path / "x.png")]) == PASS
    assert seen == [(["a.json"], str(tmp_path / "x.png"))]


def test_compare_prints_a_table_by_default(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(record(version=1)))
    b.write_text(json.dumps(record(tok_s=60, ttft=0.2)))
    assert main(["compare", str(a), str(b)]) == FAIL
    run = "decode@prose,t0.0,thinking-off,x4"
    assert capsys.readouterr().out.splitlines() == [
        f"A: {a}",
        f"B: {b}",
        "tolerance: 10%",
        "",
        "| figure                                             |       A |       B | change | beyond tolerance |",
        "|----------------------------------------------------|--------:|--------:|-------:|:----------------:|",
        "| prefill.tok_s                                      | 2,100.0 | 2,100.0 |  +0.0% |                  |",
        "| decode.tok_s                                       |    80.0 |    60.0 | -25.0% |        ✘         |",
        "| decode.ttft_s                                      |  133 ms |  200 ms | +50.4% |        ✘         |",
        "| multi.tok_s_total                                  |   154.0 |   154.0 |  +0.0% |                  |",
        "| multi.tok_s_per_stream                             |    38.5 |    38.5 |  +0.0% |                  |",
        "| prefill@4096.tok_s                                 |       — | 2,100.0 |        |                  |",
        f"| {run}.tok_s_total      |       — |   154.0 |        |                  |",
        f"| {run}.tok_s_per_stream |       — |    38.5 |        |                  |",
        f"| {run}.ttft_s           |       — |  200 ms |        |                  |",
        f"FAIL compare: worse than {a} by more than 10%: decode.tok_s, decode.ttft_s",
    ]


def test_compare_json_is_the_report(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(record()))
    b.write_text(json.dumps(record(tok_s=100)))
    assert main(["compare", str(a), str(b), "--json", "--tolerance", "5"]) == PASS
    out = capsys.readouterr().out
    report = json.loads(out[:out.rindex("\n}") + 2])
    assert report["figures"]["decode.tok_s"] == {"a": 80.0, "b": 100, "change_pct": 25.0}
    assert report["tolerance_pct"] == 5.0 and report["worse"] == []
    assert out.endswith("\nPASS compare: no figure worse by more than 5%\n") and "| figure" not in out


@pytest.mark.parametrize("lacking", ["a", "b"])
def test_compare_a_figure_one_record_lacks_shows_a_dash(tmp_path, capsys, lacking):
    """A sweep size (or decode run) in one record only, either way round: listed with "—", no change, never fails."""
    more = record()
    more["prefill_sweep"].append({"size": 32768, "prompt_tokens": 32770, "seconds": 15.6, "tok_s": 2100.6})
    more["decode_runs"].append({"prompt": "code", "temperature": 0.7, "thinking": True, "streams": 1,
                                "tok_s_total": 70.0, "tok_s_per_stream": 70.0, "ttft_s": 0.5})
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(record() if lacking == "a" else more))
    b.write_text(json.dumps(more if lacking == "a" else record()))
    assert main(["compare", str(a), str(b)]) == PASS
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    present = "2,100.6"
    assert rows["prefill@32768.tok_s"] == (["—", present, "", ""] if lacking == "a" else [present, "—", "", ""])
    assert rows["decode@code,t0.7,thinking-on,x1.ttft_s"][:2] == (["—", "500 ms"] if lacking == "a"
                                                                  else ["500 ms", "—"])
    assert main(["compare", str(a), str(b), "--json"]) == PASS
    out = capsys.readouterr().out
    figure = json.loads(out[:out.rindex("\n}") + 2])["figures"]["prefill@32768.tok_s"]
    assert figure == ({"a": None, "b": 2100.6, "change_pct": None} if lacking == "a"
                      else {"a": 2100.6, "b": None, "change_pct": None})
