"""status.py and logs.py on the simulated pair: one table for both Sparks that changes nothing, exit 0 while the
pair serves and non-zero when it does not; each rank's newest log lines from the controller.

Runs after test_deploy.py (file order) and leaves a converged, serving pair.
"""

from __future__ import annotations

import socket

import pytest
import yaml
from test_deploy import NAME, changed_ops, deploy, pair_ids


def run_tool(run_pyinfra, script: str, *extra: str):
    # no --json: these print for a person (the fixture adds --json only when asked to parse it)
    return run_pyinfra("inventory.py", script, "-y", *extra)


def test_status_shows_both_sparks_and_changes_nothing(run_pyinfra, sim_exec):
    before = pair_ids(sim_exec)
    run = run_tool(run_pyinfra, "status.py")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert out.count("sparkfold status: head") == 1  # one table, printed once
    assert "serving: DeepSeek-V4.1-Flash-1017 at" in out and "NOT serving" not in out
    assert "sim-head" in out and "sim-worker" in out and "current" in out
    assert pair_ids(sim_exec) == before


def test_status_exits_non_zero_when_a_rank_is_gone_and_logs_show_both_ranks(run_pyinfra, sim_exec):
    logs = run_tool(run_pyinfra, "logs.py", "--data", "log_lines=5")
    text = logs.stdout + logs.stderr
    assert logs.returncode == 0 and "rank 0" in text and "rank 1" in text, text[-3000:]
    assert sim_exec("worker", ["docker", "rm", "-f", NAME]).returncode == 0
    run = run_tool(run_pyinfra, "status.py", "--data", "status_plan=false")
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "NOT serving" in out, out[-4000:]
    logs = run_tool(run_pyinfra, "logs.py", "--data", "log_lines=5")  # rank 1 gone: its last saved log
    text = logs.stdout + logs.stderr
    assert logs.returncode == 0 and "--- rank 1 (worker sim-worker): saved log " in text, text[-3000:]
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
    run = run_pyinfra("inventory.py", "status.py", "-y", env=env)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and out.count("sparkfold status: head") == 1, out[-4000:]
    rows = [line.split() for line in out.splitlines() if line[:1] in "✔✘·" and len(line.split()) > 3]
    # one row says so and nothing read over ssh follows; the API is asked from here, not over ssh, so it still answers
    assert [r[:4] for r in rows if r[1] == gone and r[2] != "API"] == [["✘", gone, "ssh", "no"]], out[-4000:]
    assert ["✔", "head", "API", "answers"] in [r[:4] for r in rows], out[-4000:]
    answered = "head" if gone == "worker" else "worker"
    rank = 0 if answered == "head" else 1
    assert ["✔", answered, "rank", str(rank), "running"] in [r[:5] for r in rows], out[-4000:]
    logs = run_pyinfra("inventory.py", "logs.py", "-y", "--data", "log_lines=5", env=env)
    text = logs.stdout + logs.stderr
    assert f"--- rank {1 - rank} ({gone} sim-{gone}): no answer over ssh" in text, text[-3000:]
    assert f"--- rank {rank} ({answered} sim-{answered}): live log of {NAME}" in text, text[-3000:]
