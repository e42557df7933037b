"""Where the validator finds its server and key (options, then the OpenAI SDK's variables, then API_URL/API_KEY) and
the note when two of them disagree, the one line for a URL or key file it cannot use, and the one line, naming the
fix, when the server does not answer or refuses the key: exit code 2 and no requests/urllib3 text."""

from __future__ import annotations

import errno
import socket
import ssl

import pytest
import requests
from validate_fake import serving

from operations.validate.__main__ import main
from operations.validate.client import CouldNotRun, ServerUnusable, base_url_from, no_answer_reason, request_failure
from operations.validate.result import NOT_RUN, PASS

KEY = "k" * 64
FIX_KEY = ("it expects the one in ~/.local/state/sparkfold/api-key.d/key on the head (--api-key-file FILE, "
           "or export OPENAI_API_KEY)")


@pytest.fixture
def server():
    with serving() as httpd:
        yield httpd


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- where the server and the key come from ------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
def test_openai_base_url_with_or_without_v1(server, monkeypatch, suffix, capsys):
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + suffix)
    assert main(["text"]) == PASS
    assert capsys.readouterr().out.startswith("PASS text:")
    assert [path for _m, path, _b in server.requests] == ["/v1/models", "/v1/chat/completions"]


def test_the_option_then_openai_base_url_then_api_url():
    env = {"API_URL": "http://ours:8888", "OPENAI_BASE_URL": "http://sdk:8888/v1"}
    assert base_url_from("http://given:8888", env) == "http://given:8888"
    assert base_url_from(None, env) == "http://sdk:8888/v1"
    assert base_url_from(None, {"API_URL": "http://ours:8888"}) == "http://ours:8888"
    assert base_url_from(None, {"OPENAI_BASE_URL": "", "API_URL": "https://ours"}) == "https://ours"


def test_openai_api_key_wins_over_api_key(server, monkeypatch, capsys):
    """The advice on a refused key is "export OPENAI_API_KEY": it must take effect even when API_KEY is set."""
    server.require_key = KEY
    monkeypatch.setenv("API_KEY", KEY)
    assert main(["--base-url", server.url, "text"]) == PASS  # the older name alone still works
    assert server.headers[-1]["Authorization"] == f"Bearer {KEY}"
    monkeypatch.setenv("API_KEY", "stale")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert main(["--base-url", server.url, "text"]) == PASS
    assert server.headers[-1]["Authorization"] == f"Bearer {KEY}"
    assert capsys.readouterr().err.splitlines() == [
        "note: using the API key from OPENAI_API_KEY; API_KEY holds a different key and is ignored"]


def test_sources_that_disagree_get_one_line_naming_the_one_used(server, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    monkeypatch.setenv("API_URL", server.url)  # the same server without /v1: no note
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("API_KEY", KEY)  # the same key: no note
    assert main(["text"]) == PASS
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("API_URL", "http://old-head:8888")
    assert main(["text"]) == PASS
    assert capsys.readouterr().err.splitlines() == [
        f"note: using the server from OPENAI_BASE_URL={server.url}/v1; API_URL=http://old-head:8888 names a "
        "different server and is ignored"]
    key_file = tmp_path / "key"
    key_file.write_text("# the head's key\nlocal: other-key\n")
    server.require_key = "other-key"
    assert main(["--base-url", server.url, "--api-key-file", str(key_file), "text"]) == PASS
    assert capsys.readouterr().err.splitlines() == [  # OPENAI_BASE_URL names the same server; no key is shown
        f"note: using the server from --base-url {server.url}; API_URL=http://old-head:8888 names a different "
        "server and is ignored",
        f"note: using the API key from --api-key-file {key_file}; OPENAI_API_KEY and API_KEY hold different keys "
        "and are ignored"]


@pytest.mark.parametrize("kind, problem", [
    ("missing", "no such file (copy ~/.local/state/sparkfold/api-key.d/key from the head)"),
    ("a folder", "cannot read it (Is a directory)"),
    ("no key", "no key in the file (copy ~/.local/state/sparkfold/api-key.d/key from the head)"),
])
def test_an_unusable_key_file_is_one_line_naming_the_option(server, tmp_path, capsys, kind, problem):
    path = {"missing": tmp_path / "missing", "a folder": tmp_path, "no key": tmp_path / "key"}[kind]
    if kind == "no key":
        path.write_text("# no key yet\n")
    assert main(["--base-url", server.url, "--api-key-file", str(path), "text"]) == NOT_RUN
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"NOT RUN: --api-key-file {path}: {problem}"] and captured.out == ""
    assert server.requests == []  # said before anything is sent


# --- a URL that cannot be used: one line, exit 2, nothing sent ----------------------------------------------------

@pytest.mark.parametrize("argv, env, line", [
    (["--base-url", "ftp://spark:8888"], {},
     "NOT RUN: --base-url ftp://spark:8888: the scheme is ftp, not http or https (e.g. http://<head>:8888)"),
    (["--base-url", "spark:8888"], {},
     "NOT RUN: --base-url spark:8888: no http:// or https:// at the start (e.g. http://<head>:8888)"),
    (["--base-url", "http:///v1"], {},
     "NOT RUN: --base-url http:///v1: no host after the scheme (e.g. http://<head>:8888)"),
    (["--base-url", "http://spark:88x8"], {},
     "NOT RUN: --base-url http://spark:88x8: the port is not a number from 0 to 65535 (e.g. http://<head>:8888)"),
    ([], {"OPENAI_BASE_URL": "ws://spark:8888/v1"},
     "NOT RUN: OPENAI_BASE_URL=ws://spark:8888/v1: the scheme is ws, not http or https (e.g. http://<head>:8888)"),
    ([], {}, "NOT RUN: no server given: --base-url http://<head>:8888, or export OPENAI_BASE_URL="
             "http://<head>:8888/v1"),
])
def test_a_url_it_cannot_use_is_one_line(monkeypatch, capsys, argv, env, line):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main([*argv, "text"]) == NOT_RUN
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [line] and captured.out == ""


# --- a server that cannot be asked: one line naming the fix, exit 2 ------------------------------------------------

def test_unreachable_server_is_one_line_naming_the_fix(capsys):
    port = closed_port()
    assert main(["--base-url", f"http://127.0.0.1:{port}", "all"]) == NOT_RUN
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"NOT RUN: no answer from http://127.0.0.1:{port} (connection refused): is the pair up? "
        "`pyinfra inventory.py status.py -y`"]
    assert captured.out == ""  # said once, not once per check


def test_unreachable_server_in_bench_and_exact_is_the_same_line(capsys):
    port = closed_port()
    line = (f"NOT RUN: no answer from http://127.0.0.1:{port} (connection refused): is the pair up? "
            "`pyinfra inventory.py status.py -y`")
    assert main(["--base-url", f"http://127.0.0.1:{port}", "--model", "m", "bench"]) == NOT_RUN
    err = capsys.readouterr().err.splitlines()  # bench's plan line, then the one line
    assert err[-1] == line and len(err) == 2 and err[0].startswith("bench: m at ")
    assert main(["--base-url", f"http://127.0.0.1:{port}", "exact", "record", "/nonexistent/x.json"]) == NOT_RUN
    assert capsys.readouterr().err.splitlines() == [line]


def test_https_to_the_plain_http_server_names_http(server, capsys):
    address = server.url.removeprefix("http://")
    assert main(["--base-url", f"https://{address}", "text"]) == NOT_RUN
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"NOT RUN: no answer from https://{address} (TLS failed: ")
    assert line.endswith(f"): the pair serves plain http; use http://{address}")


def test_a_key_needed_and_none_given_is_one_line(server, capsys):
    server.require_key = KEY
    assert main(["--base-url", server.url, "all"]) == NOT_RUN
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"NOT RUN: {server.url} wants an API key (HTTP 401): copy ~/.local/state/sparkfold/api-key.d/key from the "
        "head and pass --api-key-file FILE, or export OPENAI_API_KEY"]
    assert captured.out == ""


def test_a_wrong_key_names_where_it_came_from(server, monkeypatch, tmp_path, capsys):
    server.require_key = KEY
    monkeypatch.setenv("OPENAI_API_KEY", "stale")
    assert main(["--base-url", server.url + "/v1", "text"]) == NOT_RUN
    assert capsys.readouterr().err.splitlines() == [
        f"NOT RUN: {server.url} refused the API key from OPENAI_API_KEY (HTTP 401): {FIX_KEY}"]
    key_file = tmp_path / "key"
    key_file.write_text("stale\n")
    assert main(["--base-url", server.url, "--api-key-file", str(key_file), "text"]) == NOT_RUN
    assert capsys.readouterr().err.splitlines() == [
        f"NOT RUN: {server.url} refused the API key from --api-key-file {key_file} (HTTP 401): {FIX_KEY}"]


def test_checks_before_the_server_went_away_keep_their_lines(server, capsys):
    """A server lost between checks: the passed check's line stays, then the one line, exit 2."""
    from operations.validate import __main__ as cli

    def stop_server_after_text(name, client, args, real=cli.run_check):
        result = real(name, client, args)
        client.base = f"http://127.0.0.1:{closed_port()}"
        return result

    cli_run_check, cli.run_check = cli.run_check, stop_server_after_text
    try:
        assert main(["--base-url", server.url, "text", "thinking-off", "tools"]) == NOT_RUN
    finally:
        cli.run_check = cli_run_check
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith("PASS text:") and len(captured.out.splitlines()) == 1
    assert len(captured.err.splitlines()) == 1 and "(connection refused): is the pair up?" in captured.err


# --- the reasons, from the exceptions requests raises ---------------------------------------------------------------

def wrapped(cause: BaseException) -> requests.ConnectionError:
    """requests' shape: ConnectionError(MaxRetryError) whose reason's __cause__ is the socket error."""
    reason = Exception("HTTPConnection(host='h', port=1): Failed to establish a new connection")
    reason.__cause__ = cause
    retry = Exception("Max retries exceeded")
    retry.reason = reason  # type: ignore[attr-defined]
    return requests.ConnectionError(retry)


@pytest.mark.parametrize("cause, reason", [
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "connection refused"),
    (socket.gaierror(-2, "Name or service not known"), "host name not found"),
    (TimeoutError("timed out"), "no connection within the timeout"),
    (OSError(errno.EHOSTUNREACH, "No route to host"), "no route to host"),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), "network is unreachable"),
    (ConnectionResetError(errno.ECONNRESET, "reset"), "connection reset"),
    (ValueError("something else"), "ConnectionError"),
])
def test_no_answer_reason(cause, reason):
    assert no_answer_reason(wrapped(cause)) == reason


def test_tls_reason():
    error = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    error.reason = "WRONG_VERSION_NUMBER"  # type: ignore[misc]
    assert no_answer_reason(wrapped(error)) == "TLS failed: WRONG_VERSION_NUMBER"


def test_a_slow_reply_is_that_checks_not_run_not_the_end():
    failure = request_failure(requests.ReadTimeout("read timed out"), "http://h:8888", "POST /v1/chat/completions",
                              30)
    assert type(failure) is CouldNotRun and not isinstance(failure, ServerUnusable)
    assert str(failure) == "POST /v1/chat/completions: no reply from http://h:8888 within 30 s (--timeout)"
    assert isinstance(request_failure(wrapped(TimeoutError()), "http://h", "GET /", 1), ServerUnusable)
