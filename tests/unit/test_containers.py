"""The pair's container lifecycle: facts, the shared stale verdict, and each operation both ways."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
from harness import FakeHost, parse_fact, run_op
from settings_factory import make_settings

from operations import containers as c
from operations.facts.docker import EngineCapabilities, RankContainer, SpecRecord, listening_ports
from operations.facts.files import LinkTarget
from operations.facts.host import MemInfo, mem_available_gib
from operations.facts.network import InfinibandDevices, LinkRecord
from operations.launch_spec import LABEL_HASH, rank_spec

NAME = "dsv41-1017-exl3-tf"
RAILS = [{"netdev": "enp1s0f0np0", "ibdev": "rocep1s0f0", "address": "192.168.100.1/24", "gid_index": 3,
          "mtu": 9000}]
SNAP = "/root/.cache/huggingface/hub/models--x--y/snapshots/r"


def spec(role="head", **kw):
    s = make_settings(role, nccl_rails=1, **kw)
    return rank_spec(s, "sparkfold/dsv41-tf:abc", RAILS, ("/hf", SNAP), {"serve": {"flags": {}}},
                     rank_folder=f"/home/nvidia/.cache/sparkfold/rank-cache/r/rank{s.rank}")


class FixedLaunch:
    """A Launch whose answers are given (operations/launch.py reads them from facts)."""

    def __init__(self, spec, problems=()):
        self._spec, self._problems = spec, list(problems)

    def spec(self):
        return self._spec

    def problems(self):
        return list(self._problems)


HEAD, WORKER = spec("head"), spec("worker")


def container(sp=None, running=True, managed=True, hash_=None, status=None, exit_code=0, ports=(8888, 29500)):
    labels = {"sparkfold.managed": "1"} if managed else {}
    if sp is not None or hash_:
        labels[LABEL_HASH] = hash_ or sp.spec_hash()
    return {"exists": True, "running": running, "status": status or ("running" if running else "exited"),
            "exit_code": exit_code, "oom_killed": False, "labels": labels, "image": "x", "created": "",
            "ports": list(ports)}


def facts(mine, record=None, mem=200.0):
    return {RankContainer: mine, SpecRecord: record, MemInfo: {"MemAvailable": int(mem * 2**30)}}


def peer(theirs, record=None):
    return FakeHost(facts(theirs, record), name="worker")


COMMON = dict(container_name=NAME, rank=0, peer_rank=1, peer_record="/w/rank.spec", force=False, stop_timeout=30,
              log_dir="/logs", log_keep=10)


# --- facts -------------------------------------------------------------------------------------------------------

def test_rank_container_fact():
    line = json.dumps({"state": {"Running": False, "Status": "exited", "ExitCode": 137, "OOMKilled": True},
                       "labels": {"sparkfold.managed": "1"}, "image": "img:1", "created": "2026",
                       "args": ["/snap", "--port", "8888", "--host=0.0.0.0"], "env": ["TF_TP_PORT=29500", "A=1"]})
    got = parse_fact(RankContainer, [line], container=NAME)
    assert got == {"exists": True, "running": False, "status": "exited", "exit_code": 137, "oom_killed": True,
                   "labels": {"sparkfold.managed": "1"}, "image": "img:1", "created": "2026", "started_at": "",
                   "finished_at": "", "ports": [8888, 29500]}
    assert listening_ports(["--port=9000"], []) == [9000] and listening_ports(["--port"], []) == []
    assert parse_fact(RankContainer, [], container=NAME) == {}
    assert parse_fact(RankContainer, ["null"], container=NAME) == {}
    assert "|| true" in RankContainer().command(container=NAME).get_raw_value()


def test_small_facts():
    assert parse_fact(SpecRecord, ["# Managed by sparkfold", "spec-hash=abc"], path="/x") == "abc"
    assert parse_fact(SpecRecord, [], path="/x") is None
    assert mem_available_gib(parse_fact(MemInfo, ["MemAvailable:   125829120 kB"])) == pytest.approx(120.0)
    assert mem_available_gib(parse_fact(MemInfo, [])) is None
    assert parse_fact(InfinibandDevices, ["yes"]) is True and parse_fact(InfinibandDevices, ["no"]) is False


# --- the verdict -------------------------------------------------------------------------------------------------

def test_pair_verdict():
    h, w = HEAD.spec_hash(), WORKER.spec_hash()
    good = [(0, container(HEAD), h), (1, container(WORKER), w)]
    assert c.pair_verdict(good, False) == []
    assert c.pair_verdict(list(reversed(good)), True) == ["a restart was asked for (restart = true)"]
    assert c.pair_verdict([(0, container(HEAD), h), (1, {}, w)], False) == ["rank 1 has no container"]
    stopped = c.pair_verdict([(1, container(WORKER, running=False, exit_code=1), w), (0, container(HEAD), h)], False)
    assert stopped == ["rank 1 is not running (exited, exit code 1)"]
    assert c.pair_verdict([(0, container(HEAD), "other"), (1, container(WORKER), w)], False) == [
        "rank 0's settings or image changed"]
    assert c.pair_verdict([(0, container(HEAD), h), (1, container(WORKER), None)], False) == []


def test_both_sparks_reach_the_same_verdict():
    h, w = HEAD.spec_hash(), "new-worker-hash"
    head_view = c.pair_verdict([(0, container(HEAD), h), (1, container(WORKER), w)], False)
    worker_view = c.pair_verdict([(1, container(WORKER), w), (0, container(HEAD), h)], False)
    assert head_view == worker_view == ["rank 1's settings or image changed"]


# --- launch_checked ----------------------------------------------------------------------------------------------

def check(mine, theirs, problems=(), sp=HEAD, mem=200.0, executing=True):
    return run_op(c.launch_checked, facts(mine, mem=mem), executing=executing, container_name=NAME,
                  peer=peer(theirs), launch=FixedLaunch(sp, problems), min_avail_gib=112.0, here="head",
                  there="worker")


def test_launch_checked_passes_quietly():
    cmds, host = check(container(HEAD), container(WORKER))
    assert cmds == [] and host.noops


def test_launch_checked_refuses_foreign_containers_here_and_there():
    cmds, _ = check(container(managed=False), {})
    assert len(cmds) == 1 and "exit 1" in cmds[0] and "on the head was not started by sparkfold" in cmds[0]
    cmds, _ = check({}, container(managed=False))
    assert "on the worker was not started by sparkfold" in cmds[0] and "docker rm -f" in cmds[0]


def test_launch_checked_fails_on_flag_problems():
    cmds, _ = check(container(HEAD), container(WORKER), ["--foo is not served: remove --foo from extra_serve_args"])
    assert "remove --foo from extra_serve_args" in cmds[0] and "exit 1" in cmds[0]


def test_launch_checked_tolerates_missing_inputs_while_planning_only():
    missing = ["rank 0 cannot be launched yet: the link record (rails) missing"]
    assert check({}, {}, missing, sp=None, executing=False)[0] == []
    assert "cannot be launched yet" in check({}, {}, missing, sp=None, executing=True)[0][0]


def test_launch_checked_refuses_a_port_another_process_holds_only_before_a_start():
    from operations.facts.network import PortListeners

    def run(mine, holders):
        f = {**facts(mine), PortListeners: holders}
        return run_op(c.launch_checked, f, executing=True, container_name=NAME, peer=peer({}),
                      launch=FixedLaunch(HEAD), min_avail_gib=112.0, here="head", there="worker", ports=(8888,))[0]

    cmds = run({}, ["python3 (pid 4242)"])
    assert len(cmds) == 1 and "port 8888 is held by python3 (pid 4242) on the head" in cmds[0] and "exit 1" in cmds[0]
    assert run({}, []) == []  # free
    assert run(container(HEAD), ["tensorfold-nati (pid 7)"]) == []  # our running rank holds it
    # port changed while the old rank runs on 9999: the new port is still checked
    cmds = run(container(HEAD, ports=(9999, 29500)), ["nginx (pid 12)"])
    assert len(cmds) == 1 and "port 8888 is held by nginx (pid 12)" in cmds[0]


def test_port_listeners_fact_names_the_process():
    from operations.facts.network import PortListeners
    line = 'LISTEN 0      5      0.0.0.0:8888      0.0.0.0:*    users:(("python3",pid=4242,fd=3))'
    assert parse_fact(PortListeners, [line], port=8888) == ["python3 (pid 4242)"]
    assert parse_fact(PortListeners, ["LISTEN 0 5 0.0.0.0:8888 0.0.0.0:*"], port=8888) == ["a process"]
    assert parse_fact(PortListeners, [], port=8888) == []
    assert "sport = :8888" in PortListeners().command(port=8888).get_raw_value()


def test_launch_checked_memory_only_when_the_rank_is_not_running():
    cmds, _ = check({}, {}, mem=40.0)
    assert "only 40.0 GiB" in cmds[0] and "min_avail_gib = 112" in cmds[0]
    assert check(container(HEAD), {}, mem=40.0)[0] == []
    assert check({}, {}, mem=150.0)[0] == []


# --- spec_recorded -----------------------------------------------------------------------------------------------

def test_spec_recorded_both_ways():
    cmds, _ = run_op(c.spec_recorded, {SpecRecord: "old"}, path="/state/rank.spec", launch=FixedLaunch(HEAD))
    assert len(cmds) == 1 and f"spec-hash={HEAD.spec_hash()}" in cmds[0] and "/state/rank.spec" in cmds[0]
    assert run_op(c.spec_recorded, {SpecRecord: HEAD.spec_hash()}, path="/state/rank.spec",
                  launch=FixedLaunch(HEAD))[0] == []
    assert run_op(c.spec_recorded, {SpecRecord: None}, path="/p", launch=FixedLaunch(None))[0] == []
    assert "exit 1" in run_op(c.spec_recorded, {SpecRecord: None}, executing=True, path="/p",
                              launch=FixedLaunch(None))[0][0]


# --- stale_pair_removed ------------------------------------------------------------------------------------------

def remove(mine, theirs, their_record, record=None, force=False, sp=HEAD):
    return run_op(c.stale_pair_removed, facts(mine, record), executing=True, launch=FixedLaunch(sp),
                  peer=peer(theirs, their_record), here="head", there="worker", **{**COMMON, "force": force})


def test_converged_pair_is_left_alone():
    cmds, host = remove(container(HEAD), container(WORKER), WORKER.spec_hash())
    assert cmds == [] and host.noops == ["both ranks run the wanted spec"]


def test_a_stale_peer_recreates_this_rank_too():
    cmds, _ = remove(container(HEAD), container(WORKER, hash_="older"), WORKER.spec_hash())
    assert cmds[0] == f"docker stop -t 30 {NAME} >/dev/null"
    assert "docker logs --timestamps" in cmds[1] and "-rank0.log.gz" in cmds[1]
    assert cmds[2] == f"docker rm -f {NAME} >/dev/null" and len(cmds) == 3


def test_a_running_supervisor_is_paused_only_when_the_pair_is_recreated():
    from operations.facts.systemd import UnitState
    unit = "sparkfold-supervise.service"

    def run(head_hash, active):
        f = {**facts(container(HEAD, hash_=head_hash)), UnitState: {"enabled": "enabled", "active": active,
                                                                     "sha256": "x"}}
        return run_op(c.stale_pair_removed, f, executing=True, launch=FixedLaunch(HEAD), peer=peer(container(WORKER),
                      WORKER.spec_hash()), here="head", there="worker", pause_units=(unit,), **COMMON)[0]

    stale = run("older", "active")
    assert stale[0] == f"systemctl stop {unit}" and f"docker rm -f {NAME} >/dev/null" in stale
    assert run("older", "failed")[0].startswith("docker stop")  # a supervisor that gave up stays down
    assert run(HEAD.spec_hash(), "active") == []  # converged pair: the supervisor keeps running


def test_own_change_peer_missing_and_restart():
    assert len(remove(container(HEAD, hash_="older"), container(WORKER), WORKER.spec_hash())[0]) == 3
    assert len(remove(container(HEAD), {}, WORKER.spec_hash())[0]) == 3
    assert len(remove(container(HEAD), container(WORKER), WORKER.spec_hash(), force=True)[0]) == 3


def test_a_stopped_rank_is_not_docker_stopped_but_its_log_is_saved():
    cmds, _ = remove(container(HEAD, running=False), container(WORKER), WORKER.spec_hash())
    assert len(cmds) == 2 and "docker logs" in cmds[0] and "docker rm -f" in cmds[1]


def test_nothing_to_remove_here():
    cmds, host = remove({}, container(WORKER), WORKER.spec_hash())
    assert cmds == [] and "no rank container here" in host.noops[0]


def test_never_removes_a_foreign_container():
    cmds, _ = remove(container(managed=False), container(WORKER, hash_="x"), WORKER.spec_hash())
    assert len(cmds) == 1 and "not started by sparkfold" in cmds[0] and "docker rm" not in cmds[0].split("(")[0]


# --- rank_started ------------------------------------------------------------------------------------------------

def start(mine, theirs=None, their_record=None, executing=True, sp=WORKER, force=False):
    theirs = container(HEAD) if theirs is None else theirs
    return run_op(c.rank_started, facts(mine), executing=executing, launch=FixedLaunch(sp), min_avail_gib=112.0,
                  peer=peer(theirs, their_record or HEAD.spec_hash()), gpu_clock_mhz=2100, nvidia_smi="/opt/nvidia-smi",
                  **{**COMMON, "rank": 1, "peer_rank": 0, "force": force})


RELOCK = "sh /usr/local/lib/sparkfold/gpu_clock_lock.sh /opt/nvidia-smi 2100 /var/lib/sparkfold/gpu-clock.record"


def test_rank_started_converged_both_phases():
    assert start(container(WORKER), executing=False)[0] == []
    assert start(container(WORKER), executing=True)[0] == []


def test_rank_started_plans_a_start_when_the_pair_is_stale():
    cmds, _ = start(container(WORKER), theirs=container(HEAD, hash_="old"), executing=False)
    assert cmds[-1].startswith("docker run -d --name dsv41-1017-exl3-tf")
    assert any("MemAvailable" in x for x in cmds)
    assert start(container(WORKER), executing=False, force=True)[0][-1].startswith("docker run")


def test_rank_started_after_the_removal():
    cmds, _ = start({})
    assert cmds[0].startswith("mkdir -p /home/nvidia/.cache/sparkfold/cache/abc")
    assert any(x.startswith("test -e /home/nvidia/.cache/sparkfold/kit ||") for x in cmds)
    assert "tf-dsv41-lanes" in cmds[-1] and f"sparkfold.spec-hash={WORKER.spec_hash()}" in cmds[-1]
    assert cmds[-2] == RELOCK  # the GPU clock lock applied again right before the start


def test_the_lock_before_a_start_runs_as_root_and_only_with_a_start():
    commands = list(c.start_commands(WORKER, 112.0, 2100, "/opt/nvidia-smi"))
    relock = commands[-2]
    assert relock.get_raw_value() == RELOCK and relock.connector_arguments == {"_sudo": True}
    assert all(RELOCK not in x for x in start(container(WORKER), executing=True)[0])  # converged: no lock, no start


def test_rank_started_replaces_a_leftover():
    cmds, _ = start(container(WORKER, running=False))
    assert "docker logs" in cmds[0] and "docker rm -f" in cmds[1] and cmds[-1].startswith("docker run")
    cmds, _ = start(container(managed=False, running=False))
    assert len(cmds) == 1 and "not started by sparkfold" in cmds[0]


def test_rank_started_needs_a_spec_at_execute():
    assert "exit 1" in start({}, sp=None)[0][0]
    assert start({}, sp=None, executing=False)[0][0].startswith("docker run ...")


# --- rank_stopped ------------------------------------------------------------------------------------------------

def stop(mine):
    return run_op(c.rank_stopped, {RankContainer: mine}, executing=True, container_name=NAME, rank=1,
                  stop_timeout=12, log_dir="/logs", log_keep=3)


def test_rank_stopped_both_ways():
    assert stop({})[0] == []
    cmds, _ = stop(container(WORKER))
    assert cmds[0] == f"docker stop -t 12 {NAME} >/dev/null" and "-rank1.log.gz" in cmds[1]
    assert cmds[2] == f"docker rm -f {NAME} >/dev/null" and "nvidia-smi" in cmds[3]
    assert "not started by sparkfold" in stop(container(managed=False))[0][0]


# --- the shell the commands run ----------------------------------------------------------------------------------

def test_save_log_command_saves_and_keeps_the_newest(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text("#!/bin/sh\necho \"log of $3\"\necho oops >&2\n")
    (bindir / "docker").chmod(0o755)
    logs = tmp_path / "logs dir"
    logs.mkdir()
    for i in range(4):
        old = logs / f"2020010{i}-000000-rank1.log.gz"
        old.write_bytes(b"")
        os.utime(old, (1_600_000_000 + i, 1_600_000_000 + i))
    (logs / "20200101-000000-rank0.log.gz").write_bytes(b"")  # the other rank's logs are not counted
    cmd = c.save_log_command(NAME, 1, str(logs), 3).get_raw_value()
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    out = subprocess.run(["sh", "-c", cmd], env=env, capture_output=True, text=True, check=True).stdout
    saved = out.strip().split(" log in ", 1)[1]
    assert gzip.decompress(open(saved, "rb").read()).decode() == f"log of {NAME}\noops\n"
    rank1 = sorted(p.name for p in logs.glob("*-rank1*.log.gz"))
    assert len(rank1) == 3 and os.path.basename(saved) in rank1
    assert "20200102-000000-rank1.log.gz" in rank1 and "20200100-000000-rank1.log.gz" not in rank1
    assert (logs / "20200101-000000-rank0.log.gz").exists()
    subprocess.run(["sh", "-c", cmd], env=env, check=True, capture_output=True)  # same second: a .N name
    assert len(list(logs.glob("*-rank1*.log.gz"))) == 3


def test_memory_wait_command():
    ok = subprocess.run(["sh", "-c", c.memory_wait_command(0, 0.0, tries=1).get_raw_value()], capture_output=True,
                        text=True)
    assert ok.returncode == 0
    bad = subprocess.run(["sh", "-c", c.memory_wait_command(1, 1e9, tries=1).get_raw_value()], capture_output=True,
                         text=True)
    assert bad.returncode == 1 and "rank 1 needs min_avail_gib = 1e+09 GiB" in bad.stderr


# --- lifecycle: the deploy functions' call sites and the launch they give the operations ------------------------

def _recording(monkeypatch):
    from types import SimpleNamespace

    from settings_factory import make_pair

    from operations import lifecycle
    calls = []

    def rec(kind):
        def op(**kw):
            calls.append((kind, kw))
            return SimpleNamespace(did_change=lambda: True, will_change=True)
        return op

    for kind in ("launch_checked", "spec_recorded", "stale_pair_removed", "rank_started", "rank_stopped"):
        monkeypatch.setattr(lifecycle.containers, kind, rec(kind))
    monkeypatch.setattr(lifecycle.health, "api_serving", rec("api_serving"))
    monkeypatch.setattr(lifecycle, "file_put", rec("put"))
    monkeypatch.setattr(lifecycle, "folder_versions_pruned", rec("folder_versions_pruned"))
    hs, ws = make_pair(worker={"data_dir": "/home/w/.cache/sparkfold", "state_dir": "/home/w/.local/state/sparkfold"})
    head_host, worker_host = FakeHost({}, name="head"), FakeHost({}, name="worker")
    monkeypatch.setattr(lifecycle, "peer_host", lambda s: worker_host if s.is_head else head_host)
    return lifecycle, calls, hs, ws, head_host, worker_host


CAPS = json.loads(subprocess.run([sys.executable, str(__import__("pathlib").Path(__file__).resolve().parents[2] /
                                                 "tests/sim/engine/bin/tensorfold-native"), "capabilities", "--json"],
                                 capture_output=True, text=True, check=True).stdout)
RAILS2 = [dict(RAILS[0]), dict(RAILS[0], netdev="enP2p1s0f0np0", ibdev="roceP2p1s0f0")]


def state_of(s, rails=RAILS2, caps=CAPS, infiniband=True, linked=True):
    """The facts a Launch reads on this Spark: the link record, where the served links lead, the image."""
    from harness import with_args
    p = s.layout
    links = {f"path={p.served_link}, resolve=True": f"{p.model_folder}/snapshots/abc" if linked else None,
             f"path={p.active_rank_link()}, resolve=True": f"{p.rank_cache}/abc/rank{s.rank}" if linked else None,
             f"path={p.kit}, resolve=True": f"{p.kit}.d/0123abcd" if linked else None}
    return {LinkRecord: {"rails": rails} if rails else None, LinkTarget: with_args(links),
            EngineCapabilities: {"image_id": "sha256:" + "a" * 64, "document": caps, "cached": True},
            InfinibandDevices: infiniband}


def test_pair_on_each_host(monkeypatch):
    from pyinfra.context import ctx_host
    lifecycle, calls, hs, ws, head_host, worker_host = _recording(monkeypatch)
    with ctx_host.use(head_host):
        lifecycle.pair._inner(hs)
    kinds = [k for k, _ in calls]
    assert kinds == ["put", "launch_checked", "spec_recorded", "stale_pair_removed", "rank_started", "api_serving",
                     "folder_versions_pruned"]  # old kit versions go only once the pair runs on the new one
    start = calls[4][1]
    assert start["name"] == "Start rank 0 (head)" and start["peer"] is worker_host and start["peer_rank"] == 1
    assert start["peer_record"] == "/home/w/.local/state/sparkfold/rank.spec"
    launch = calls[1][1]["launch"]
    with ctx_host.use(FakeHost(state_of(hs), name="head")):
        built = launch.spec()
        assert built.argv[0] == "tensorfold-native" and "--device" in built.options
        assert built.inputs.get("chat_template")  # the project's template digest
        assert (f"{hs.layout.rank_cache}/abc/rank0", "/rank-cache", True) in built.mounts
        assert any(a.endswith("/hub/models--Mia-AiLab--DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1-2.9-bpw/snapshots/abc")
                   for a in built.argv)
        assert launch.problems() == []
    calls.clear()
    with ctx_host.use(worker_host):
        lifecycle.pair._inner(ws.replace(worker_weights="copy"))
    assert [k for k, _ in calls] == ["launch_checked", "spec_recorded", "stale_pair_removed", "rank_started"]
    assert calls[-1][1]["name"] == "Start rank 1 (worker)" and calls[-1][1]["force"] is False
    with ctx_host.use(FakeHost(state_of(ws, infiniband=False), name="worker")):
        assert calls[0][1]["launch"].spec().argv[0] == "tf-dsv41-lanes"


def test_pair_launch_problems(monkeypatch):
    from pyinfra.context import ctx_host
    lifecycle, calls, hs, _ws, head_host, _w = _recording(monkeypatch)
    with ctx_host.use(head_host):
        lifecycle.pair._inner(hs.replace(extra_serve_args=["--kv-dtype", "fp8"]))
    launch = calls[1][1]["launch"]
    with ctx_host.use(FakeHost(state_of(hs, infiniband=False), name="head")):
        assert launch.problems() == ["--kv-dtype is not served by this engine image "
                                     "(1.0.2-sparkfold-standin): remove --kv-dtype from extra_serve_args"]
    with ctx_host.use(FakeHost(state_of(hs, rails=None, caps={}, infiniband=False), name="head")):
        assert launch.spec() is None
        assert "the link record (rails), the image's capabilities missing" in launch.problems()[0]


def test_restart_health_and_stop(monkeypatch):
    from pyinfra.context import ctx_host
    lifecycle, calls, hs, ws, head_host, worker_host = _recording(monkeypatch)
    with ctx_host.use(head_host):
        lifecycle.pair._inner(hs.replace(restart=True, api_key=True))  # restart.py
        lifecycle.stopped._inner(hs)
    assert all(kw["force"] for k, kw in calls if k in ("stale_pair_removed", "rank_started"))
    serving = [kw for k, kw in calls if k == "api_serving"][0]
    assert serving["worker"] is worker_host and serving["started"]() is True and serving["planned"]() is True
    assert serving["api_key_file"] == "/home/nvidia/.local/state/sparkfold/api-key.d/key"
    assert serving["base_url"] == "http://spark-a.local:8888"
    stop = [kw for k, kw in calls if k == "rank_stopped"]
    assert len(stop) == 1 and stop[0]["rank"] == 0 and stop[0]["name"].startswith("Stop rank 0")
    calls.clear()
    with ctx_host.use(worker_host):
        lifecycle.stopped._inner(ws)
    assert [k for k, _ in calls] == ["rank_stopped"] and calls[0][1]["rank"] == 1


def test_the_launch_inputs_are_read_again_only_after_a_change():
    from types import SimpleNamespace

    from harness import _State
    from pyinfra.context import ctx_host, ctx_state

    from operations.launch import Launch
    s = make_settings("head")
    h = FakeHost(state_of(s), name="head")
    launch = Launch(s)
    with ctx_state.use(_State(executing=False)), ctx_host.use(h):  # planning
        h.current_op_hash = "check"
        assert launch.spec() is not None and launch.problems() == []
        once = len(h.fact_calls)
        assert once <= 7
    executing = _State(executing=True)
    with ctx_state.use(executing), ctx_host.use(h):  # executing: what earlier steps made, afresh
        h.current_op_hash = "check"
        launch.spec()
        assert len(h.fact_calls) == 2 * once
        for op in ("record", "stop", "start"):  # operations that changed nothing: no round trip
            h.current_op_hash = op
            assert launch.spec() is not None and launch.problems() == []
        assert len(h.fact_calls) == 2 * once
        assert sum(name.endswith("LinkRecord") for name, _ in h.fact_calls) == 2
        # an operation that changed a Spark (a new weight file linked, say): the inputs are read again
        changed = SimpleNamespace(is_complete=lambda: True, did_change=lambda: True, executed=True)
        executing.ops = {h: {"weights": SimpleNamespace(operation_meta=changed)}}
        launch.spec()
        assert len(h.fact_calls) == 3 * once
