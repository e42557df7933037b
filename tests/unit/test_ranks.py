"""The pair step's operations (operations/ranks.py), each both ways, the composite fact they read, the shell they
yield (operations/rank/commands.py) and the step's call sites."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from types import SimpleNamespace

import pytest
from harness import FakeHost, first_planned, parse_fact, run_fact, run_op
from pyinfra.api import FileUploadCommand, StringCommand
from rank_inputs import (
    DAEMON_DRIFTED,
    DAEMON_OK,
    IMAGE,
    TEMPLATE,
    container,
    docker_facts,
    found,
    pair_plans,
    rank_facts,
)
from settings_factory import make_pair

from operations import ranks
from operations.facts.docker import RankContainer, listening_ports
from operations.facts.host import MemInfo, mem_available_gib
from operations.facts.network import InfinibandDevices, PortListeners
from operations.facts.rank import RankInputs
from operations.facts.systemd import UnitState
from operations.layout import GENERATIONS_DIR
from operations.rank import commands, switch
from operations.rank.plan import pair_plan

HS, WS = make_pair(head={"nccl_rails": 1}, worker={"nccl_rails": 1})
_CONVERGED = pair_plan(HS, WS, found(HS), found(WS), image=IMAGE, template_digest=TEMPLATE, force=False)
H0, H1 = _CONVERGED.rank(0).spec.spec_hash(), _CONVERGED.rank(1).spec.spec_hash()
NAME = HS.container_name
SUPERVISOR = "sparkfold-supervise.service"


def run(op, s, mine: dict, theirs: dict, executing: bool = True, extra: dict | None = None,
        daemon: tuple[dict, dict] = (DAEMON_OK, DAEMON_OK), plans=None, **kwargs):
    """op on Spark `s`, its RankInputs `mine`, the peer's `theirs`; daemon: daemon.json here, on the peer; plans:
    the step's handoff (a fresh one: the operation reads its phase's plan)."""
    peer = FakeHost({RankInputs: theirs, **docker_facts(daemon[1])}, name="peer")
    return run_op(op, {RankInputs: mine, **docker_facts(daemon[0]), **(extra or {})}, executing=executing,
                  plans=plans or pair_plans(s, peer), **kwargs)


# --- the composite fact -------------------------------------------------------------------------------------------

def test_rank_inputs_reads_every_section_in_one_command(tmp_path):
    served, kit, rank_link = tmp_path / "served", tmp_path / "kit", tmp_path / "active-rank0"
    (tmp_path / "snap").mkdir()
    served.symlink_to(tmp_path / "snap")
    record = tmp_path / "link.json"
    record.write_text(json.dumps({"rails": [{"netdev": "x"}]}))
    got = run_fact(RankInputs, container="no-such-container-here", link_record=str(record), served=str(served),
                   kit=str(kit), rank_link=str(rank_link), ports=(1,))
    assert got["link_record"] == {"rails": [{"netdev": "x"}]}
    assert got["served"] == str(tmp_path / "snap") and got["kit"] is None and got["rank_folder"] is None
    assert got["container"] == {} and got["capabilities"] == {} and got["ablit"] is None
    assert got["mem_available"] and got["mem_available"] > 0
    assert set(got["port_holders"]) <= {1}


def test_rank_inputs_parses_what_each_part_prints():
    line = json.dumps({"state": {"Running": True, "Status": "running"}, "labels": {"sparkfold.managed": "1"},
                       "image": IMAGE, "created": "", "args": ["--port", "8888"], "env": []})
    mark = "@@sparkfold-rank-input "
    output = [f"{mark}container", line, f"{mark}link_record", '{"rails": []}', f"{mark}served", "/hf/snap",
              f"{mark}kit", f"{mark}rank_folder", "/d/r", f"{mark}infiniband", "yes", f"{mark}meminfo",
              "MemAvailable:   125829120 kB", f"{mark}capabilities", '{"schema": 1}', f"{mark}port 8888",
              'LISTEN 0 5 0.0.0.0:8888 0.0.0.0:* users:(("python3",pid=42,fd=3))', f"{mark}port 29500"]
    got = parse_fact(RankInputs, output)
    assert got["container"]["running"] and got["container"]["ports"] == [8888]
    assert (got["served"], got["kit"], got["rank_folder"], got["infiniband"]) == ("/hf/snap", None, "/d/r", True)
    assert got["mem_available"] == 120 * 2**30 and got["capabilities"] == {"schema": 1}
    assert got["port_holders"] == {8888: ["python3 (pid 42)"], 29500: []}


def test_rank_inputs_reads_capabilities_only_when_an_image_is_given():
    args = dict(container=NAME, link_record="/s/link.json", served="/hf/x", kit="/d/kit", rank_link="/d/r")
    assert "capabilities" not in RankInputs().command(**args)
    assert "capabilities --json" in RankInputs().command(**args, image=IMAGE, capabilities_cache="/s/caps")


def test_the_parts_facts():
    line = json.dumps({"state": {"Running": False, "Status": "exited", "ExitCode": 137, "OOMKilled": True},
                       "labels": {"sparkfold.managed": "1"}, "image": "img:1", "created": "2026",
                       "args": ["/snap", "--port", "8888", "--host=0.0.0.0"], "env": ["TF_TP_PORT=29500", "A=1"]})
    assert parse_fact(RankContainer, [line], container=NAME)["ports"] == [8888, 29500]
    assert listening_ports(["--port=9000"], []) == [9000] and listening_ports(["--port"], []) == []
    assert parse_fact(RankContainer, [], container=NAME) == {}
    assert mem_available_gib(parse_fact(MemInfo, ["MemAvailable:   125829120 kB"])) == pytest.approx(120.0)
    assert parse_fact(InfinibandDevices, ["yes"]) is True and parse_fact(InfinibandDevices, ["no"]) is False
    line = 'LISTEN 0      5      0.0.0.0:8888      0.0.0.0:*    users:(("python3",pid=4242,fd=3))'
    assert parse_fact(PortListeners, [line], port=8888) == ["python3 (pid 4242)"]
    assert parse_fact(PortListeners, ["LISTEN 0 5 0.0.0.0:8888 0.0.0.0:*"], port=8888) == ["a process"]


# --- a Docker restart earlier in the run --------------------------------------------------------------------------

WORKER_RESTARTS = "the pair restarts: rank 1 restarts: Docker restarts on the worker (daemon.json changes)"


def test_the_restart_line_comes_before_the_supervisors_pause(caplog):
    """--dry stops an operation at its first command: with the supervisor running, that is its pause, so the line
    saying why the pair restarts is logged before it."""
    caplog.set_level("INFO")
    extra = {UnitState: {"enabled": "enabled", "active": "active", "sha256": "x"}}
    peer = FakeHost(rank_facts(found(WS, container(H1)), docker_facts(DAEMON_DRIFTED)), name="peer")
    first, _ = first_planned(ranks.stale_pair_stopped, rank_facts(found(HS, container(H0)), extra),
                             plans=pair_plans(HS, peer), pause_units=(SUPERVISOR,))
    assert first == f"systemctl stop {SUPERVISOR}" and WORKER_RESTARTS in caplog.text


def test_a_converged_run_asks_docker_no_more_than_the_docker_step_did():
    """The rank step asks the docker step's own answers (fact_until_change, as root): nothing more in a converged
    run."""
    from harness import _State
    from pyinfra.context import ctx_host, ctx_state

    from operations import docker_runtime
    peer = FakeHost(rank_facts(found(WS, container(H1))), name="peer")
    host = FakeHost(rank_facts(found(HS, container(H0))), name="head")
    with ctx_state.use(_State(False)), ctx_host.use(host):
        host.current_op_global_arguments = {"_sudo": True}  # deploy.py gives the docker step _sudo=True
        assert list(docker_runtime.daemon_uses_nvidia._inner()) == []
        host.current_op_global_arguments = {}
        assert list(ranks.rank_started._inner(plans=pair_plans(HS, peer))) == []
    asked = [name.rsplit(".", 1)[1] for name, _kwargs in host.fact_calls]
    assert asked.count("DaemonJson") == 1 and asked.count("DockerRuntimeInfo") == 1, asked


def _reads(*sparks: FakeHost) -> list[int]:
    return [sum(n.endswith(".RankInputs") for n, _ in spark.fact_calls) for spark in sparks]


def _counting(monkeypatch) -> list[int]:
    """pair_plan, counted each time an operation of the step computes it."""
    computed: list[int] = []
    monkeypatch.setattr(ranks, "pair_plan", lambda *args, **kwargs: computed.append(1) or pair_plan(*args, **kwargs))
    return computed


def test_a_converged_pass_reads_each_spark_once_and_computes_the_plan_once(monkeypatch):
    """Issue 30: every operation of a converged pass (the exact gate on) takes the plan before the stop as data: one
    read of each Spark, one verdict. The old step computed it again in the check, the gate's record and each start."""
    from harness import _State
    from pyinfra.context import ctx_host, ctx_state

    from operations.rank.generation import Generation

    computed = _counting(monkeypatch)
    good = Generation(_CONVERGED.wanted.id, _CONVERGED.wanted.specs, good_at=1.0)  # the pair passed its gate before
    records = {"files": {f"{good.id}.json": json.dumps(good.record())}, "last_good": good.id}
    peer = FakeHost(rank_facts(found(WS, container(H1), generations=records)), name="worker")
    host = FakeHost(rank_facts(found(HS, container(H0), generations=records)), name="head")
    plans, notes = pair_plans(HS.replace(upgrade_gate="exact"), peer), ranks.SwitchNotes()
    idle = SimpleNamespace(is_complete=lambda: False, will_change=False)  # planning: rank 0's start changes nothing
    with ctx_state.use(_State(False)), ctx_host.use(host):
        assert list(ranks.pair_checked._inner(plans=plans)) == []
        assert list(ranks.old_pair_replayed._inner(plans=plans, notes=notes)) == []
        assert list(ranks.stale_pair_stopped._inner(plans=plans, notes=notes)) == []
        assert list(ranks.rank_started._inner(plans=plans, notes=notes)) == []
        assert list(ranks.pair_serving._inner(plans=plans, rank0=idle, notes=notes)) == []
        assert list(ranks.generations_kept._inner(plans=plans, started=idle)) == []
    assert _reads(host, peer) == [1, 1] and len(computed) == 1
    assert host.noops == ["the head's launch checks pass", "no serving pair is replaced: nothing to record for the "
                          "exact gate", "both ranks run the wanted spec", "rank 0 runs the wanted spec",
                          "the pair is not restarted: one quick API check at execute time",
                          "this rank runs the last good generation"]


def test_a_switch_reads_both_sparks_once_per_phase(monkeypatch):
    """Executing a switch on the head: the plan before the stop serves the check, the stop and rank 0's spec; rank
    0's start reads once more after rank 1's start (the worker's rank 1 must run); pair_serving judges the checked
    switch without a read; the record reads once after the gate. The old step read both Sparks again in the start,
    in pair_serving and in the record, and computed the plan five times."""
    from harness import _State, ran
    from pyinfra.context import ctx_host, ctx_state

    from operations.facts.rank import PruneInputs

    computed = _counting(monkeypatch)
    state = _State(True)
    peer = FakeHost(rank_facts(found(WS, container("older"))), name="worker")
    host = FakeHost(rank_facts(found(HS, container("older")), {PruneInputs: PruneInputs.default()}), name="head")
    plans, notes = pair_plans(HS.replace(upgrade_gate="exact"), peer), ranks.SwitchNotes()

    def now(spark: FakeHost, inputs: dict, what: str) -> None:  # an operation of the run changed `spark`
        spark._facts["operations.facts.rank.RankInputs"] = inputs
        ran(state, spark, what)

    with ctx_state.use(state), ctx_host.use(host):
        assert list(ranks.pair_checked._inner(plans=plans)) == []
        assert list(ranks.old_pair_replayed._inner(plans=plans, notes=notes)) == []
        stop = [str(c) for c in ranks.stale_pair_stopped._inner(plans=plans, notes=notes)]
        assert stop[-1] == f"docker rm -f {NAME} >/dev/null" and _reads(host, peer) == [1, 1]
        now(host, found(HS), "the stop")
        now(peer, found(WS, container(H1)), "rank 1 started")
        start = [c.get_raw_value() for c in ranks.rank_started._inner(plans=plans, notes=notes)
                 if isinstance(c, StringCommand)]
        assert f"sparkfold.spec-hash={H0}" in start[-1] and _reads(host, peer) == [2, 2]
        now(host, found(HS, container(H0)), "rank 0 started")
        rank0 = SimpleNamespace(is_complete=lambda: True, did_change=lambda: True, did_succeed=lambda: True)
        judged = list(ranks.pair_serving._inner(plans=plans, rank0=rank0, notes=notes))
        assert len(judged) == 1 and judged[0].function is switch.new_pair_served and _reads(host, peer) == [2, 2]
        assert judged[0].args[2].to.id == _CONVERGED.wanted.id  # the switch checked before the stop
        ran(state, host, "the gate passed")
        kept = [c.get_raw_value() for c in ranks.generations_kept._inner(plans=plans, started=rank0)]
        assert f"{_CONVERGED.wanted.id}.json" in kept[0] and _reads(host, peer) == [3, 3]
    assert len(computed) == 3  # one plan per phase


def test_a_plan_read_while_planning_is_not_judged_by_the_executing_run():
    """pyinfra runs the generators while planning and again while executing, with the one handoff ranks_serving
    made: the executing pass reads its own plans (here Docker's restart stopped rank 1 in between)."""
    from harness import _State
    from pyinfra.context import ctx_host, ctx_state

    peer = FakeHost(rank_facts(found(WS, container(H1))), name="worker")
    host = FakeHost(rank_facts(found(HS, container(H0))), name="head")
    plans = pair_plans(HS, peer)
    with ctx_state.use(_State(False)), ctx_host.use(host):
        assert list(ranks.pair_checked._inner(plans=plans)) == []
        assert list(ranks.stale_pair_stopped._inner(plans=plans)) == []
    peer._facts["operations.facts.rank.RankInputs"] = found(WS, container(H1, running=False, exit_code=143))
    with ctx_state.use(_State(True)), ctx_host.use(host):
        assert list(ranks.pair_checked._inner(plans=plans)) == []
        stop = [str(c) for c in ranks.stale_pair_stopped._inner(plans=plans)]
    assert stop[-1] == f"docker rm -f {NAME} >/dev/null" and _reads(host, peer) == [2, 2]


# --- rank_started ------------------------------------------------------------------------------------------------

RELOCK = (f"sh /usr/local/lib/sparkfold/gpu_clock_lock.sh {WS.nvidia_smi_path} {WS.gpu_clock_mhz} "
          "/var/lib/sparkfold/gpu-clock.record")


def test_rank_1_not_started_is_noted_for_pair_serving():
    """Executing, after the worker's start: rank 1 not running its wanted spec (a `docker run` that failed leaves a
    created container, or none; or its spec is not known) is noted for pair_serving, which judges the switch failed
    (the refusals themselves are scenarios: tests/operations/ranks.rank_started/rank_1_*)."""
    from operations.rank.switch import SwitchNotes

    created = dict(container(H1), running=False, status="created", exit_code=127)
    for theirs, said in ((found(WS, created), "its container is created, exit code 127"), (found(WS), "no container"),
                         (found(WS, container("old")), "its container is running"),
                         (found(WS, linked=False), "no container")):
        notes = SwitchNotes()
        cmds, _ = run(ranks.rank_started, HS, found(HS), theirs, notes=notes)
        assert len(cmds) == 1 and "rank 0 is not started" in cmds[0]
        assert notes.start_problem.startswith(f"rank 1 did not start on the worker ({said}")


def test_the_rank_path_reads_its_facts_failing_on_error_whatever_the_operation_ignores():
    """rank_started runs with _ignore_errors, and a fact read inside it takes the operation's arguments: each read
    says _ignore_errors=False, so a failed read fails instead of answering its default."""
    from harness import _State
    from pyinfra.context import ctx_host, ctx_state

    class Strict(FakeHost):
        def get_fact(self, cls, *args, **kwargs):
            self.raw = getattr(self, "raw", []) + [(cls.__name__, kwargs.get("_ignore_errors"))]
            return super().get_fact(cls, *args, **kwargs)

    held = {8888: ["docker-proxy (pid 7)"]}  # a held port: its holders are read as root too
    host = Strict(rank_facts(found(HS, container(H0), holders=held), {PortListeners: held[8888]}), name="head")
    peer = Strict(rank_facts(found(WS, container(H1))), name="worker")
    for spark in (host, peer):
        spark.current_op_global_arguments = {"_ignore_errors": True}
    with ctx_state.use(_State(True)), ctx_host.use(host):
        assert list(ranks.rank_started._inner(plans=pair_plans(HS, peer))) == []
    reads = host.raw + peer.raw
    assert {name for name, _ in reads} >= {"RankInputs", "PortListeners", "DaemonJson", "DockerRuntimeInfo"}
    assert all(strict is False for _, strict in reads), reads


# --- the shell the commands run ----------------------------------------------------------------------------------

def test_the_lock_before_a_start_runs_as_root():
    spec = _CONVERGED.rank(1).spec
    started = list(commands.start_commands(spec, 112.0, WS.gpu_clock_mhz, WS.nvidia_smi_path, WS.layout.rank_env,
                                           every=10))
    relock = [c for c in started if isinstance(c, StringCommand) and c.get_raw_value() == RELOCK]
    assert len(relock) == 1 and relock[0].connector_arguments == {"_sudo": True}
    assert started.index(relock[0]) < len(started) - 3  # before the environment file and the docker run


def test_a_ranks_environment_goes_through_a_0600_file_never_through_an_argv():
    """Issue 27 (Low): engine_env may hold secrets; `docker run -e NAME=value` put them in every user's `ps`."""
    secret = "TENSORFOLD_TOKEN_FOR_X"
    s = WS.replace(engine_env={secret: "s3cr3t-value"})
    spec = _CONVERGED.rank(1).spec
    spec = type(spec)(**{**spec.__dict__, "env": {**spec.env, secret: "s3cr3t-value"}})
    started = list(commands.start_commands(spec, 112.0, s.gpu_clock_mhz, s.nvidia_smi_path, s.layout.rank_env,
                                           every=10))
    shell = [c.get_raw_value() for c in started if isinstance(c, StringCommand)]
    assert not any("s3cr3t-value" in line for line in shell)
    uploads = [c for c in started if isinstance(c, FileUploadCommand)]
    env_file = f"{s.layout.rank_env}/{spec.name}.env"
    assert len(uploads) == 1 and uploads[0].dest == env_file
    assert f"{secret}=s3cr3t-value\n" in uploads[0].src.getvalue() and "HF_HUB_OFFLINE=1\n" in uploads[0].src.getvalue()
    prepare, run = shell[-2], shell[-1]
    assert f"mkdir -p -m 700 {s.layout.rank_env}" in prepare and f"install -m 600 /dev/null {env_file}" in prepare
    assert started.index(uploads[0]) == len(started) - 2  # made 0600 first, filled, then read by docker run
    assert f"--env-file {env_file}" in run and " -e " not in run and f"rm -f -- {env_file}" in run


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
    cmd = commands.save_log_command(NAME, 1, str(logs), 3).get_raw_value()
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
    ok = subprocess.run(["sh", "-c", commands.memory_wait_command(0, 0.0, tries=1, every=10).get_raw_value()],
                        capture_output=True, text=True)
    assert ok.returncode == 0
    bad = subprocess.run(["sh", "-c", commands.memory_wait_command(1, 1e9, tries=1, every=10).get_raw_value()],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "rank 1 needs min_avail_gib = 1e+09 GiB" in bad.stderr


def test_the_memory_wait_says_so_every_progress_every_s():
    """progress_every_s = 2: a line every 2 s while memory comes back (a read every MEMORY_POLL_S)."""
    wait = commands.memory_wait_command(1, 1e9, tries=3, every=2).get_raw_value()
    assert f"$((i % {max(2 // commands.MEMORY_POLL_S, 1)}))" in wait
    done = subprocess.run(["sh", "-c", wait], capture_output=True, text=True, timeout=30)
    lines = done.stdout.splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("rank 1: waiting for memory: ")
    assert lines[0].endswith(f"GiB available ({2 // commands.MEMORY_POLL_S * commands.MEMORY_POLL_S} s)")


def test_a_rank_start_waits_for_memory_with_the_settings_interval():
    every = {"nccl_rails": 1, "progress_every_s": 2}
    head, _worker = make_pair(head=every, worker=every)
    for side in ranks.switch_inputs(head).sides:
        started = switch.rank_start(side, _CONVERGED.rank(side.rank).spec)
        shell = [c.get_raw_value() for c in started if isinstance(c, StringCommand)]
        waits = [line for line in shell if "MemAvailable" in line]
        assert len(waits) == 1 and f"$((i % {max(2 // commands.MEMORY_POLL_S, 1)}))" in waits[0]


# --- the step's call sites ---------------------------------------------------------------------------------------

def _recording(monkeypatch):
    calls = []

    def rec(kind):
        def op(**kw):
            calls.append((kind, kw))
            return SimpleNamespace(did_change=lambda: True, will_change=True)
        return op

    for kind in ("generation_records_moved", "pair_checked", "old_pair_replayed", "stale_pair_stopped",
                 "rank_started", "pair_serving", "generations_kept", "rank_stopped"):
        monkeypatch.setattr(ranks, kind, rec(kind))
    monkeypatch.setattr(ranks, "file_put", rec("put"))
    head_host, worker_host = FakeHost({}, name="head"), FakeHost({}, name="worker")
    monkeypatch.setattr(ranks, "peer_host", lambda s: worker_host if s.is_head else head_host)
    return calls, head_host, worker_host


def test_the_pair_step_on_each_spark(monkeypatch):
    from pyinfra.context import ctx_host
    calls, head_host, worker_host = _recording(monkeypatch)
    with ctx_host.use(head_host):
        ranks.ranks_serving._inner(ranks.pair_plans(HS.replace(api_key=True)))
    kinds = [k for k, _ in calls]
    assert kinds == ["put", "generation_records_moved", "pair_checked", "stale_pair_stopped", "rank_started",
                     "pair_serving", "generations_kept"]  # old generations go only once the new one serves
    assert calls[1][1]["folder"] == GENERATIONS_DIR and calls[1][1]["legacy"] == HS.layout.legacy_generations
    del calls[1]
    start = calls[3][1]
    plans = start["plans"]
    assert start["name"] == "Start rank 0 (head)" and plans.peer is worker_host and plans.image.startswith(
        HS.engine_image + ":")
    assert len(plans.template) == 64  # the checkout's chat template, hashed once for the run
    assert plans.switch_inputs == ranks.switch_inputs(HS.replace(api_key=True))  # made once, with the plans
    serving_ = calls[4][1]
    assert serving_["plans"] is plans and serving_["rank0"].did_change() is True
    assert serving_["notes"] is calls[2][1]["notes"]  # the stop's time reaches the LIVE line
    # a failed start reaches pair_serving's judgement (the last good pair again) instead of ending the run
    assert start["_ignore_errors"] is True and start["notes"] is serving_["notes"]
    calls.clear()
    with ctx_host.use(head_host):
        ranks.ranks_serving._inner(ranks.pair_plans(HS.replace(upgrade_gate="exact")))
    assert [k for k, _ in calls][2:4] == ["pair_checked", "old_pair_replayed"]  # recorded before the stop
    calls.clear()
    with ctx_host.use(worker_host):
        ranks.ranks_serving._inner(ranks.pair_plans(WS))
    assert [k for k, _ in calls] == ["generation_records_moved", "pair_checked", "stale_pair_stopped", "rank_started",
                                     "generations_kept"]
    del calls[0]
    assert calls[2][1]["name"] == "Start rank 1 (worker)" and calls[2][1]["plans"].peer is head_host
    assert calls[2][1]["_ignore_errors"] is True
    assert calls[1][1]["notes"] is None


def test_both_sparks_hand_the_switch_the_same_ranks():
    """Each Spark's stop and start take its own rank's side (sides[s.rank]) of inputs both Sparks make alike."""
    head, worker = ranks.switch_inputs(HS), ranks.switch_inputs(WS)
    assert head.sides == worker.sides and [side.rank for side in head.sides] == [0, 1]
    assert head.sides[1].role == "worker" and head.sides[1].log_dir == WS.layout.logs
    assert head.sides[0].rank_env == HS.layout.rank_env and head.sides[1].generations == WS.layout.generations


def test_stop_on_each_spark(monkeypatch):
    from pyinfra.context import ctx_host
    calls, head_host, worker_host = _recording(monkeypatch)
    with ctx_host.use(head_host):
        ranks.ranks_stopped._inner(HS)
    with ctx_host.use(worker_host):
        ranks.ranks_stopped._inner(WS)
    assert [(k, kw["rank"]) for k, kw in calls] == [("rank_stopped", 0), ("rank_stopped", 1)]
    assert calls[0][1]["name"].startswith("Stop rank 0")


def test_a_part_that_ends_early_does_not_cut_the_parts_after_it(tmp_path, monkeypatch):
    # the capabilities part exits as soon as the cache answers: the ports after it must still be read
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text("#!/bin/sh\ncase \"$*\" in 'image inspect -f'*) echo sha256:abc;; *) exit 1;; "
                                   "esac\n")
    (bindir / "docker").chmod(0o755)
    (tmp_path / "caps").mkdir()
    (tmp_path / "caps" / "abc.json").write_text('{"schema": 1}\n')
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    got = run_fact(RankInputs, container=NAME, link_record="/nonexistent", served="/a", kit="/b", rank_link="/c",
                   image=IMAGE, capabilities_cache=str(tmp_path / "caps"), ports=(1, 2))
    assert got["capabilities"] == {"schema": 1} and set(got["port_holders"]) == {1, 2}


def test_the_stop_judges_the_checked_plan_without_asking_again():
    plans = pair_plans(HS, FakeHost(rank_facts(found(WS, container(H1))), name="peer"))
    _cmds, checked = run(ranks.pair_checked, HS, found(HS, container(H0)), {}, plans=plans)
    cmds, stopped = run(ranks.stale_pair_stopped, HS, {}, {}, plans=plans)  # no inputs: the plan is data
    assert cmds == [] and stopped.fact_calls == [] and stopped.noops == ["both ranks run the wanted spec"]
    cmds, started = run(ranks.rank_started, HS, {}, {}, plans=plans)
    assert cmds == [] and started.fact_calls == [] and started.noops == ["rank 0 runs the wanted spec"]


def test_the_pair_step_hands_one_handoff_to_each_operation(monkeypatch):
    from pyinfra.context import ctx_host
    calls, head_host, _worker_host = _recording(monkeypatch)
    with ctx_host.use(head_host):
        ranks.ranks_serving._inner(ranks.pair_plans(HS.replace(upgrade_gate="exact")))
    handoffs = {kind: kw.get("plans") for kind, kw in calls if kind not in ("put", "generation_records_moved")}
    assert set(handoffs) == {"pair_checked", "old_pair_replayed", "stale_pair_stopped", "rank_started",
                             "pair_serving", "generations_kept"}
    assert len({id(h) for h in handoffs.values()}) == 1 and isinstance(handoffs["pair_checked"], ranks.PairPlans)
