"""status.py and logs.py on the simulated pair: one table for both Sparks that changes nothing, exit 0 while the
pair serves and non-zero when it does not, the same as one JSON document with --json, refreshed with status_watch;
each rank's newest log lines from the controller.

Each test starts from a converged pair (converged_pair) and leaves one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import pytest
import yaml
from test_deploy import NAME, ROOT, changed_ops, chat, deploy, pair_ids

from operations.rank.commands import save_log_command

LOGS = "/home/nvidia/.cache/sparkfold/logs"  # data_dir's logs on the simulated Sparks
LOG_KEEP = 10  # log_keep's default
# the rows of the engine's /metrics (tests/sim/engine's counters), or the one row saying why they were not read
METRIC_ITEMS = {"requests_total", "request_errors_total", "prompt_tokens_total", "completion_tokens_total",
                "requests_inflight", "metrics"}

pytestmark = pytest.mark.usefixtures("converged_pair")


def run_tool(run_pyinfra, script: str, *extra: str):
    # no --json: these print for a person
    return run_pyinfra("inventory.py", script, "-y", *extra, as_json=False)


def rows_of(text: str) -> list[list[str]]:
    """The table's rows as words: mark, Spark, item words..., state..., detail..."""
    return [line.split() for line in text.splitlines() if line[:1] in "✔✘·" and len(line.split()) > 3]


def test_status_shows_both_sparks_and_changes_nothing(run_pyinfra, sim_exec):
    before = pair_ids(sim_exec)
    run = run_tool(run_pyinfra, "status.py")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert out.count("sparkfold status: head") == 1  # one table, printed once
    assert "serving: DeepSeek-V4.1-Flash-1017 at" in out and "NOT serving" not in out
    assert "sim-head" in out and "sim-worker" in out and "current" in out
    # the ranks run: their memory is shown against memguard's floor
    memory = [line for line in run.stdout.splitlines() if line[2:].split()[1:2] == ["memory"]]
    assert len(memory) == 2 and all(line.endswith("GiB above the memguard floor of 2.5 GiB") for line in memory), out
    assert ["·", "head", "requests_total"] in [r[:3] for r in rows_of(run.stdout)], out  # the engine's /metrics
    assert "deploy" not in [r[2] for r in rows_of(run.stdout) if r[1] == "pair"]  # the plan only when asked
    planned = run_tool(run_pyinfra, "status.py", "--data", "status_plan=true")
    assert ["✔", "pair", "deploy", "converged"] in [r[:4] for r in rows_of(planned.stdout)], planned.stderr[-4000:]
    assert pair_ids(sim_exec) == before


def test_status_json_is_one_document_of_the_rows_and_their_facts(run_pyinfra, sim_exec):
    chat()  # a request for the engine's counters
    run = run_pyinfra("inventory.py", "status.py", "--json")
    assert run.returncode == 0, run.stderr[-4000:]
    doc = json.loads(run.stdout)  # all of stdout: pyinfra's own document does not follow it
    assert doc["serving"] is True and doc["verdict"] is None
    assert doc["sparks"] == {"head": {"host": "sim-head", "ssh": True}, "worker": {"host": "sim-worker", "ssh": True}}
    facts = {(r["spark"], r["item"]): r["facts"] for r in doc["rows"]}
    assert facts[("head", "rank 0")]["spec"] == facts[("worker", "rank 1")]["spec"] == "current"
    assert facts[("head", "API")]["answers"] is True
    memory = facts[("worker", "memory")]
    assert memory["rank_running"] is True and memory["memguard_floor_gib"] == 2.5
    assert memory["mem_available_gib"] > memory["memguard_floor_gib"]
    assert facts[("worker", "GPU clock")]["state"] == "locked"
    assert facts[("head", "link rail 0")]["peer_answers"] is True
    assert facts[("head", "generations")]["last_good"]
    assert facts[("head", "requests_total")]["value"] >= 1


def test_status_watch_shows_the_table_again_with_the_counters_rise(site_file):
    env = dict(os.environ, SPARKFOLD_SITE=str(site_file), PYINFRA_PROGRESS="off")
    watching = subprocess.Popen([sys.executable, "-m", "pyinfra", "inventory.py", "status.py", "-y", "--data",
                                 "status_watch=2"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    stuck = threading.Timer(180, os.killpg, (watching.pid, signal.SIGKILL))  # never wait on it forever
    stuck.start()
    frames: list[list[str]] = []  # each refresh's lines, its title first
    try:
        assert watching.stdout is not None
        for line in watching.stdout:
            if line.startswith("sparkfold status: "):
                if len(frames) == 2:  # the third refresh begins: the second is whole
                    break
                frames.append([])
            if frames:
                frames[-1].append(line.rstrip("\n"))
            if len(frames) == 1 and line.startswith(("serving: ", "NOT serving: ")):
                chat()  # the first refresh has read the counters; the second reads them after this request
    finally:
        stuck.cancel()
        os.killpg(watching.pid, signal.SIGINT)  # Ctrl-C
        try:
            watching.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(watching.pid, signal.SIGKILL)
            watching.wait()
    assert len(frames) == 2, frames
    assert all(f[0].endswith(" UTC, again every 2 s (Ctrl-C stops)") for f in frames), frames
    assert any(line.startswith("serving: DeepSeek-V4.1-Flash-1017 at") for line in frames[1]), frames[1]
    rise = [line for line in frames[1] if line[2:].split()[1:2] == ["requests_total"]]
    assert len(rise) == 1 and re.search(r"counter, \+1 in \d+ s \(", rise[0]), frames[1]


def test_status_exits_non_zero_when_a_rank_is_gone_and_logs_show_both_ranks(run_pyinfra, sim_exec, sim):
    logs = run_tool(run_pyinfra, "logs.py", "--data", "log_lines=5")
    text = logs.stdout + logs.stderr
    assert logs.returncode == 0 and "rank 0" in text and "rank 1" in text, text[-3000:]
    # rank 1 removed as the deploy removes a rank: its log saved first, by the deploy's own command over ssh
    saved = subprocess.run([*sim.ssh_argv("worker"), save_log_command(NAME, 1, LOGS, LOG_KEEP).get_raw_value()],
                           capture_output=True, text=True, timeout=120)
    path = saved.stdout.strip().rpartition(" in ")[2]
    assert saved.returncode == 0 and re.fullmatch(rf"{LOGS}/\d{{8}}-\d{{6}}-rank1(\.\d+)?\.log\.gz", path), saved
    assert sim_exec("worker", ["docker", "rm", "-f", NAME]).returncode == 0
    run = run_tool(run_pyinfra, "status.py")
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "NOT serving" in out, out[-4000:]
    logs = run_tool(run_pyinfra, "logs.py", "--data", "log_lines=5")  # rank 1 gone: its last saved log
    text = logs.stdout + logs.stderr
    assert logs.returncode == 0 and f"--- rank 1 (worker sim-worker): saved log {path} " in text, text[-3000:]
    assert "Start rank 1 (worker)" in " ".join(changed_ops(deploy(run_pyinfra)))


def site_without(sim_pair, tmp_path, role: str):
    """The sim's site file with `role`'s ssh port pointing where nothing listens: a Spark that does not answer."""
    site = yaml.safe_load(sim_pair.read_text())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        site[role]["ssh_port"] = sock.getsockname()[1]
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


@pytest.mark.parametrize("gone", ["worker", "head"])
def test_status_and_logs_show_the_spark_that_answers_when_the_other_does_not(run_pyinfra, sim_pair, tmp_path, gone):
    env = {"SPARKFOLD_SITE": str(site_without(sim_pair, tmp_path, gone))}
    run = run_pyinfra("inventory.py", "status.py", "-y", env=env, as_json=False)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and out.count("sparkfold status: head") == 1, out[-4000:]
    rows = rows_of(out)
    # one row says so and nothing read over ssh follows; the API (and its /metrics) are asked from here, not over
    # ssh, so they still answer
    assert [r[:4] for r in rows if r[1] == gone and r[2] != "API" and r[2] not in METRIC_ITEMS] == [
        ["✘", gone, "ssh", "no"]], out[-4000:]
    assert ["✔", "head", "API", "answers"] in [r[:4] for r in rows], out[-4000:]
    answered = "head" if gone == "worker" else "worker"
    rank = 0 if answered == "head" else 1
    assert ["✔", answered, "rank", str(rank), "running"] in [r[:5] for r in rows], out[-4000:]
    logs = run_pyinfra("inventory.py", "logs.py", "-y", "--data", "log_lines=5", env=env)
    text = logs.stdout + logs.stderr
    assert f"--- rank {1 - rank} ({gone} sim-{gone}): no answer over ssh" in text, text[-3000:]
    assert f"--- rank {rank} ({answered} sim-{answered}): live log of {NAME}" in text, text[-3000:]
