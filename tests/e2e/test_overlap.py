"""The first run overlapped (issue 21): a deploy killed while several background streams run at once (the image
build, the checkpoint download, the Engram tables' copy and check) leaves its work going (each stream is a systemd
unit of the Spark's, not of the run: issue 26), the next run adopts it, goes LIVE, and the one after changes
nothing.

The overlap is made from a converged pair: the Engram tables (both Sparks) and the checkpoint (head) removed, the
fake hub slowed down (its own rate, FAKEHUB_RATE) and a new image whose build takes 45 s (the stand-in's
bench-build-s knob, tests/sim/engine/faults/README.md). Starts from a converged pair (converged_pair) and leaves
one, serving on the fault-free engine.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

import pytest
from test_deploy import changed_ops, chat, deploy, deploy_killed_at

from operations.facts.streams import StreamStates

ROOT = Path(__file__).resolve().parents[2]
REPO = "Mia-AiLab/DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1-2.9-bpw"
CHECKPOINT = "/home/nvidia/.cache/huggingface/hub/models--" + REPO.replace("/", "--")
ENGRAM = "/home/nvidia/.cache/sparkfold/engram"
STREAMS = "/home/nvidia/.local/state/sparkfold/streams"
HUB_LOG = "/var/log/fakehub.log"
HUB_PID = "/run/fakehub.pid"  # tests/sim/fakehub/start.sh's
ENGRAM_SHARD = re.compile(r" GET /deepseek-ai/DeepSeek-V4\.1-Flash-1017/resolve/\w+/(model-0004[78]-of-00048\S*) 200")
CHECKPOINT_LINE = re.compile(r"Checkpoint download: .* of ")  # a progress line: the checkpoint is downloading


pytestmark = pytest.mark.usefixtures("converged_pair")


def streams(sim_exec) -> dict:
    return StreamStates().process(sim_exec("head", StreamStates().command(root=STREAMS), user="nvidia")
                                  .stdout.splitlines())


def slow_hub(sim_exec, on: bool) -> None:
    """The fake hub started again at 1 KiB/s for all its connections together (FAKEHUB_RATE), or at full speed: the
    Engram tables take ~20 s, the checkpoint ~1 min. Like a real slow server it answers every connection at once and
    trickles each body. (Not tc on the head's loopback: that holds every packet there, the handshakes and requests of
    the parallel downloads too, behind tens of seconds of their bytes, past huggingface_hub's 10 s timeouts.)"""
    rate = "FAKEHUB_RATE=1024 " if on else ""
    done = sim_exec("head", f"old=$(cat {HUB_PID}); kill $old; for i in $(seq 50); do kill -0 $old 2>/dev/null || "
                            "break; sleep 0.1; done; ! kill -0 $old 2>/dev/null && "
                            f"{rate}sh /opt/sim/fakehub/start.sh")
    assert done.returncode == 0, done.stdout + done.stderr  # a hub that did not stop would keep its old rate


def slow_build(tmp_path: Path) -> dict[str, str]:
    """A new engine image (its context differs) whose build takes 45 s, in the background from the data step: still
    building when the checkpoint starts (the Engram tables before it take ~20 s at the slowed hub's rate)."""
    context = tmp_path / "engine-slow-build"
    shutil.copytree(ROOT / "tests/sim/engine", context)
    (context / "faults" / "bench-build-s").write_text("45\n")
    # an image no earlier session built (an earlier one's is a kept generation on the Sparks: no build at all)
    (context / "test-session").write_text(f"{uuid.uuid4()}\n")
    return {"SPARKFOLD_ENGINE_CONTEXT": str(context)}


def engram_fetches(sim_exec, since: int) -> list[str]:
    return ENGRAM_SHARD.findall(sim_exec("head", f"tail -n +{since + 1} {HUB_LOG}").stdout)


def test_a_run_killed_during_the_overlap_is_resumed_by_the_next(site_file, run_pyinfra, sim_exec, tmp_path):
    env = slow_build(tmp_path)
    for role in ("head", "worker"):
        assert sim_exec(role, f"rm -rf {ENGRAM}").returncode == 0
    assert sim_exec("head", f"rm -rf {CHECKPOINT}").returncode == 0
    before = dict(os.environ)
    os.environ.update(env)  # start_deploy passes the environment on
    slow_hub(sim_exec, True)
    try:
        # 1. a run killed once the checkpoint downloads while the image still builds (the Engram tables, fetched
        # first, are whole by then and on their way to the worker)
        seen = deploy_killed_at(site_file, CHECKPOINT_LINE.search, 420)
        assert any(CHECKPOINT_LINE.search(text) for text in seen), "\n".join(seen[-60:])
        assert not any(re.search(r"build \S+: done in", text) for text in seen), "the build ended before the kill"
        # the work of the killed run goes on without it: two streams ran at once when it was killed, and still do
        killed = streams(sim_exec)
        running = {name for name, s in killed.items() if s["status"] == "running"}
        assert {"image", "checkpoint"} <= running, killed
        assert sim_exec("head", f"pgrep -f -- '--repo {REPO}'").returncode == 0  # the download goes on
        assert sim_exec("head", "systemctl is-active sparkfold-image").stdout.strip() == "active"
        # what was whole stays: the Engram tables, downloaded before the kill
        assert killed["engram"]["status"] == "done" and killed["engram"]["rc"] == 0
        whole = sim_exec("head", f"ls {ENGRAM}/model-00047-of-00048.safetensors "
                                 f"{ENGRAM}/model-00048-of-00048.safetensors")
        assert whole.returncode == 0, whole.stderr
    finally:
        slow_hub(sim_exec, False)

    try:
        # 2. the next run adopts the streams still going, resumes the rest and goes LIVE, without fetching the Engram
        # tables again
        mark = int(sim_exec("head", f"wc -l < {HUB_LOG}").stdout)
        run = deploy(run_pyinfra, env=env)
        assert "is now LIVE! on port 8888" in run.stderr, run.stderr[-4000:]
        assert engram_fetches(sim_exec, mark) == []
        assert re.search(r"background work: \d+ streams in .*; critical path ", run.stderr), run.stderr[-4000:]
        resumed = streams(sim_exec)
        assert {"image", "checkpoint", "engram-to-worker", "engram-checked"} <= set(resumed), resumed
        # this run's streams: those it started or adopted (the others, the killed run's and older runs', ended
        # before it looked)
        this_run = {s["run"] for s in resumed.values() if s["run"]} - {s["run"] for s in killed.values()}
        assert len(this_run) == 1, resumed
        assert all(s["status"] == "done" and s["rc"] == 0 for s in resumed.values() if s["run"] in this_run), resumed
        # the build and the download went on after the kill: finished by their own units, or followed by this run
        for name in ("image", "checkpoint"):
            assert resumed[name]["status"] == "done" and resumed[name]["rc"] == 0, resumed[name]
            if resumed[name]["run"] in this_run:  # still running when this run began: followed, not restarted
                assert f"running already (sparkfold-{name}), followed by this run" in run.stderr, run.stderr[-4000:]
        assert chat()["choices"][0]["message"]["content"]
        # 3. the run after changes nothing: no stream starts, the facts find everything in place
        again = deploy(run_pyinfra, env=env)
        assert changed_ops(again) == {}, changed_ops(again)
        assert "background work:" not in again.stderr
    finally:
        os.environ.clear()
        os.environ.update(before)
    # back to the fault-free engine (its image is a kept generation): converged again
    deploy(run_pyinfra)
    assert changed_ops(deploy(run_pyinfra)) == {}
