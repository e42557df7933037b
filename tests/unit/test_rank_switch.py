"""A switch judged from this machine (operations/rank/switch.py) and the head's function that serves it or rolls
it back (operations/rank/switch.py `new_pair_served`), with Sparks that record the commands they are sent; and the one
switch path: deploy.py's switch, the automatic rollback and rollback.py stop and start ranks alike."""

from __future__ import annotations

from types import SimpleNamespace

from harness import FakeHost, _State, ran
from pyinfra.api import FileUploadCommand
from pyinfra.context import ctx_host, ctx_state
from rank_inputs import container, found, pair_plans, rank_facts
from settings_factory import make_pair
from test_rank_generation import EARLIER, SERVING, good, inputs_with_records

from operations import ranks
from operations.facts.docker import RankContainer
from operations.facts.rank import StartReady
from operations.layout import SUPERVISOR_UNIT
from operations.rank import switch
from operations.rank.generation import switch_of

HS, WS = make_pair(head={"nccl_rails": 1}, worker={"nccl_rails": 1})


class Spark:
    """A Host that answers RankContainer and records every command it runs (all succeed unless `fails` matches)."""

    def __init__(self, name: str, rank_container: dict, fails: str = ""):
        self.name, self.rank_container, self.fails = name, rank_container, fails
        self.ran: list[str] = []
        self.logged: list[str] = []
        self.reads = 0

    def get_fact(self, cls, **kwargs):
        assert cls is RankContainer
        self.reads += 1
        return self.rank_container

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        text = command.get_raw_value()
        self.ran.append(text)
        ok = not (self.fails and self.fails in text)
        return ok, SimpleNamespace(stdout_lines=[] if ok else ["no such image"], stderr_lines=[])

    def put_file(self, src, dest, print_output=False, print_input=False, **arguments):
        self.ran.append(f"(upload to {dest}: {src.getvalue()!r})")
        return not (self.fails and self.fails == "upload")

    def log(self, message, log_func=None):
        self.logged.append(message)


def test_a_rollback_stops_the_failed_pair_then_starts_the_old_one_rank_1_first(monkeypatch):
    monkeypatch.setattr(switch, "pair_problem", lambda s, head, worker, timeout, api=None: None)
    head, worker = Spark("head", {}), Spark("worker", {})
    pair = (container("new"), container("new"))
    assert switch.switched_to(ranks.switch_inputs(HS), head, worker, pair, good(EARLIER, 1)) is None
    assert head.ran[0].startswith("docker stop") and "docker rm -f" in head.ran[2]  # logs saved between
    assert worker.ran[0].startswith("docker stop") and "-rank1.log.gz" in worker.ran[1]
    assert f"sparkfold.spec-hash={EARLIER.specs[1].spec_hash()}" in worker.ran[-1]
    assert f"sparkfold.spec-hash={EARLIER.specs[0].spec_hash()}" in head.ran[-1]


def test_a_rollback_passes_the_recorded_environment_through_a_file(monkeypatch):
    monkeypatch.setattr(switch, "pair_problem", lambda s, head, worker, timeout, api=None: None)
    head, worker = Spark("head", {}), Spark("worker", {})
    assert switch.switched_to(ranks.switch_inputs(HS), head, worker, ({}, {}), good(EARLIER, 1)) is None
    env_file = f"{WS.layout.rank_env}/{EARLIER.specs[1].name}.env"
    upload = [c for c in worker.ran if c.startswith(f"(upload to {env_file}: ")]
    assert len(upload) == 1 and "HF_HUB_OFFLINE=1\\n" in upload[0]
    run = worker.ran[-1]
    assert f"--env-file {env_file}" in run and "HF_HUB_OFFLINE" not in run
    failed = Spark("worker", {}, fails="upload")
    problem = switch.switched_to(ranks.switch_inputs(HS), Spark("head", {}), failed, ({}, {}), good(EARLIER, 1))
    assert problem is not None and f"could not upload {env_file}" in problem


def test_a_rollback_that_cannot_start_says_which_rank(monkeypatch):
    monkeypatch.setattr(switch, "pair_problem", lambda s, head, worker, timeout, api=None: None)
    head, worker = Spark("head", {}), Spark("worker", {}, fails="docker run")
    problem = switch.switched_to(ranks.switch_inputs(HS), head, worker, ({}, {}), good(EARLIER, 1))
    assert problem == f"rank 1 of generation {EARLIER.id} did not start on worker: no such image"
    assert head.ran == []  # rank 0 is not started without rank 1


def test_a_foreign_container_is_not_stopped_by_a_rollback(monkeypatch):
    monkeypatch.setattr(switch, "pair_problem", lambda s, head, worker, timeout, api=None: None)
    head, worker = Spark("head", {}), Spark("worker", {})
    switch.switched_to(ranks.switch_inputs(HS), head, worker, (container(managed=False), {}), good(EARLIER, 1))
    assert not any("docker stop" in c or "docker rm" in c for c in head.ran)


def test_the_failure_message_says_what_failed_where_the_logs_are_and_what_serves():
    logs = ("/h/logs", "/w/logs")
    back = switch.failure_message("c3d4", "rank 0 exited with code 1", logs, good(EARLIER, 1), None)
    assert back == ("the new pair (generation c3d4) failed: rank 0 exited with code 1. Its ranks' logs are saved in "
                    "/h/logs on the head and /w/logs on the worker (the newest *-rank0.log.gz and *-rank1.log.gz; "
                    f"zcat shows them). Generation {EARLIER.id} "
                    "serves again (rolled back); run deploy.py again once the cause is fixed, or keep the old "
                    "settings.")
    first = switch.failure_message("c3d4", "x", logs, None, None)
    assert "nothing to roll back to: its ranks are left as they are" in first and "saved" not in first
    assert "failed too: disk full" in switch.failure_message("c3d4", "x", logs, good(EARLIER, 1), "disk full")


def test_the_downtime_is_said_only_when_a_serving_pair_was_stopped():
    assert switch.downtime_line(switch.SwitchNotes(stopped_at=100.0), 183.0) == \
        "  the API was down 83 s during the switch"
    assert switch.downtime_line(switch.SwitchNotes(), 183.0) == ""


def serve(monkeypatch, problem=None, gate=None, replay=None, back=None, upgrade_gate="smoke", failed_start=None,
          settings=HS):
    calls = []
    monkeypatch.setattr(switch, "pair_problem", lambda s, head, worker, timeout: calls.append("wait") or problem)
    monkeypatch.setattr(switch, "gate_problem", lambda s, head, before: calls.append("gate") or gate)
    monkeypatch.setattr(switch, "switched_to",
                        lambda s, head, worker, containers, target: calls.append(target.id) or back)
    monkeypatch.setattr(switch, "clock", lambda: 200.0)
    monkeypatch.setattr(switch, "log_tails", lambda head, worker, name: "(the logs)")
    head, worker = Spark("head", {}), Spark("worker", {})
    change = switch_of(SERVING.specs, SERVING.specs[0].image,
                       SimpleNamespace(get=lambda gid: good(EARLIER, 1), last_good=EARLIER.id))
    inputs = ranks.switch_inputs(settings.replace(upgrade_gate=upgrade_gate))
    with ctx_host.use(head):  # the head's FunctionCommand: the head is the host its failure line speaks for
        ok = switch.new_pair_served(None, head, worker, inputs, change,
                                    switch.SwitchNotes(stopped_at=170.0, replay=replay), failed_start)
    return ok, head.logged, calls


def test_a_new_pair_that_serves_says_live_and_the_downtime(monkeypatch):
    ok, logged, calls = serve(monkeypatch)
    assert ok and logged[0].startswith("✔ DeepSeek-V4.1-Flash-1017 is now LIVE!") and calls == ["wait"]
    assert logged[-1] == "  the API was down 30 s during the switch"


def test_a_new_pair_that_fails_rolls_back_and_fails_the_run(monkeypatch):
    ok, logged, calls = serve(monkeypatch, problem="rank 0 exited with code 1")
    assert not ok and calls == ["wait", EARLIER.id]
    assert logged[0] == "the new pair failed (rank 0 exited with code 1); its ranks' last log lines:\n(the logs)"
    assert logged[-1].startswith(f"sparkfold: the switch: the new pair (generation {SERVING.id}) failed: rank 0 exited")
    assert f"Generation {EARLIER.id} serves again (rolled back)" in logged[-1]


def test_a_start_that_failed_rolls_back_at_once_without_a_wait_or_a_gate(monkeypatch):
    ok, logged, calls = serve(monkeypatch, failed_start="rank 0 did not start on the head (its error is above)",
                              replay={"prompts": {}}, upgrade_gate="exact")
    assert not ok and calls == [EARLIER.id]  # neither the health wait nor the gate: straight back
    assert logged[-1].startswith(f"sparkfold: the switch: the new pair (generation {SERVING.id}) failed: rank 0 did "
                                 "not start")
    assert f"Generation {EARLIER.id} serves again (rolled back)" in logged[-1]


def test_the_exact_gate_judges_only_with_a_record_of_the_old_pair(monkeypatch, caplog):
    ok, logged, calls = serve(monkeypatch, gate="the exact gate found a difference: 1 of 3 prompts differ: prose",
                              replay={"prompts": {}}, upgrade_gate="exact")
    assert not ok and calls == ["wait", "gate", EARLIER.id] and "exact gate found a difference" in logged[-1]
    with caplog.at_level("WARNING", logger="pyinfra"):
        ok, logged, calls = serve(monkeypatch, replay=None, upgrade_gate="exact")
    assert ok and calls == ["wait"] and "head: warning: exact gate: no record of the old pair" in caplog.text
    ok, _logged, calls = serve(monkeypatch, gate="differs", replay={"prompts": {}}, upgrade_gate="smoke")
    assert ok and calls == ["wait"]  # smoke: the replies are not compared


def test_a_rollback_is_judged_where_the_old_pair_answers():
    hs = HS.replace(port=9000)  # the switch moved the API from 8888 to 9000: the old pair still answers on 8888
    old = switch.api_of(ranks.switch_inputs(hs), EARLIER.specs[0])
    assert (old.base_url, old.port, old.served_name, old.keyed) == ("http://spark-a.local:8888", 8888,
                                                                    "DeepSeek-V4.1-Flash-1017", False)
    assert switch.api_of(ranks.switch_inputs(hs)).base_url == "http://spark-a.local:9000"
    own = HS.replace(port=9000, api_url="http://127.0.0.1:18888")  # a URL the user gave is theirs: kept
    assert switch.api_of(ranks.switch_inputs(own), EARLIER.specs[0]).base_url == "http://127.0.0.1:18888"


# --- one switch path ----------------------------------------------------------------------------------------------

def _shown(commands) -> list[str]:
    """Commands as the Spark stand-in records them."""
    return [f"(upload to {c.dest}: {c.src.getvalue()!r})" if isinstance(c, FileUploadCommand) else c.get_raw_value()
            for c in commands]


def _stops_and_starts(spark: Spark) -> list[str]:
    """What a Spark ran, but the supervisor's pause and start and the generation records."""
    return [c for c in spark.ran if not c.startswith("systemctl") and "last-good" not in c]


def _deploys_switch(running: tuple[str, str], rollback_to=None, kept=()) -> tuple[list[str], list[str]]:
    """deploy.py's switch from a pair running the spec hashes `running` to the pair the settings ask for (SERVING):
    each Spark's stale_pair_stopped and rank_started, executing, rank 1's start before rank 0's. rollback_to:
    rollback.py's switch instead, with the head's generation records `kept` (their newest the serving one)."""
    spark_of: dict[int, list[str]] = {}
    ready = {StartReady: {"image": True, "missing": []}}

    def inputs(s, running_hash):
        if rollback_to is not None and s.is_head:
            return inputs_with_records(s, container(running_hash), *kept, last_good=kept[-1].id)
        return found(s, container(running_hash))

    for s, other in ((WS, HS), (HS, WS)):  # rank 1 first, as the run does
        state = _State(True)
        peer = FakeHost(rank_facts(inputs(other, running[other.rank]), ready), name=other.role)
        here = FakeHost(rank_facts(inputs(s, running[s.rank]), ready), name=s.role)
        plans = pair_plans(s, peer, rollback=rollback_to is not None)
        with ctx_state.use(state), ctx_host.use(here):
            stop = list(ranks.stale_pair_stopped._inner(plans=plans))
            here._facts["operations.facts.rank.RankInputs"] = found(s)
            ran(state, here, "the stop")
            if s.is_head:  # rank 1 started on the worker in between
                peer._facts["operations.facts.rank.RankInputs"] = found(WS, container(SERVING.specs[1].spec_hash()))
                ran(state, peer, "rank 1 started")
            start = list(ranks.rank_started._inner(plans=plans))
            if rollback_to is not None:
                assert plans.rollback_choice().target == rollback_to
        spark_of[s.rank] = _shown(stop + start)
    return spark_of[0], spark_of[1]


def test_rollback_and_the_automatic_rollback_stop_and_start_as_deploys_switch(monkeypatch):
    """Issue 30: one switch path. Switching a running pair to generation SERVING, deploy.py's operations, the
    automatic rollback (new_pair_served after a failed gate) and rollback.py (deploy.py's own operations, its plan
    retargeted at the record) send each Spark the same stop and start commands, in the same order."""
    running = (EARLIER.specs[0].spec_hash(), EARLIER.specs[1].spec_hash())
    deployed = _deploys_switch(running)
    assert deployed[0][0].startswith("docker stop") and "sparkfold.spec-hash=" in deployed[0][-1]

    # the automatic rollback: the new pair (EARLIER here) failed its wait; the last good one is SERVING
    judged = iter(["rank 0 exited with code 1", None])  # the new pair fails, the one started again serves
    monkeypatch.setattr(switch, "pair_problem", lambda s, head, worker, timeout, api=None: next(judged))
    monkeypatch.setattr(switch, "log_tails", lambda head, worker, name: "(the logs)")
    head, worker = Spark("head", container(running[0])), Spark("worker", container(running[1]))
    change = switch_of(EARLIER.specs, EARLIER.specs[0].image,
                       SimpleNamespace(get=lambda gid: good(SERVING, 1), last_good=SERVING.id))
    with ctx_host.use(head):
        inputs = ranks.switch_inputs(HS)
        assert switch.new_pair_served(None, head, worker, inputs, change, switch.SwitchNotes()) is False
    assert (_stops_and_starts(head), _stops_and_starts(worker)) == deployed

    # rollback.py: EARLIER serves, SERVING is the previous good generation
    assert _deploys_switch(running, rollback_to=good(SERVING, 1), kept=(good(SERVING, 1), good(EARLIER, 2))) == deployed


def _rollback_py(monkeypatch, problem=None, settings=HS, failed_start=None):
    """rollback.py's judgement of the pair started from EARLIER's record (rollback_served, the head's
    FunctionCommand): (its result, the head's lines, what the head ran)."""
    monkeypatch.setattr(switch, "pair_problem", lambda s, head, worker, timeout, api=None: problem)
    head, worker = Spark("head", {}), Spark("worker", {})
    with ctx_host.use(head):
        ok = switch.rollback_served(None, head, worker, ranks.switch_inputs(settings), good(EARLIER, 1), SERVING.id,
                                    switch.SwitchNotes(), failed_start)
    return ok, head.logged, head.ran


def test_rollback_py_fails_with_one_line_naming_what_failed_and_the_way_on(monkeypatch):
    ok, logged, _ran = _rollback_py(monkeypatch, problem="rank 0 exited with code 1")
    assert not ok and logged[-1] == (f"sparkfold: rollback.py: the rollback to generation {EARLIER.id} failed: rank 0 "
                                     "exited with code 1; run deploy.py to start the pair the settings ask for")
    ok, logged, _ran = _rollback_py(monkeypatch, failed_start="rank 1 did not start on the worker")
    assert not ok and "failed: rank 1 did not start on the worker; run deploy.py" in logged[-1]
    ok, logged, _ran = _rollback_py(monkeypatch)
    assert ok and f"rolled back: generation {SERVING.id} → {EARLIER.id}" in logged


def test_rollback_py_starts_the_paused_supervisor_again_whether_or_not_the_pair_serves(monkeypatch):
    for problem in (None, "rank 0 exited with code 1"):
        _ok, _logged, ran_ = _rollback_py(monkeypatch, problem=problem, settings=HS.replace(supervise=True))
        assert ran_ == [f"systemctl start {SUPERVISOR_UNIT}"], problem
    assert _rollback_py(monkeypatch)[2] == []  # not supervised: nothing to start


def test_rollback_py_warns_when_the_generation_it_started_is_more_open_than_the_settings(monkeypatch, caplog):
    with caplog.at_level("WARNING", logger="pyinfra"):
        ok, _logged, _ran = _rollback_py(monkeypatch, settings=HS.replace(api_key=True))  # EARLIER: keyless
    assert ok and (f"head: warning: rollback_open: generation {EARLIER.id} is more open than the settings ask: the "
                   "API answers without a key") in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert _rollback_py(monkeypatch)[0]
    assert caplog.text == ""


def test_an_old_pair_that_does_not_answer_and_a_supervisor_that_does_not_start_are_warnings(monkeypatch, caplog):
    def refused(*_args, **_kwargs):
        raise OSError("connection refused")

    monkeypatch.setattr(switch.exact, "record", refused)
    head = Spark("head", {}, fails="systemctl start")
    with ctx_host.use(head), caplog.at_level("WARNING", logger="pyinfra"):
        assert switch.replay_record(ranks.switch_inputs(HS), head) is None
        switch.supervisor_started(ranks.switch_inputs(HS.replace(supervise=True)), head, SUPERVISOR_UNIT)
    assert ("head: warning: exact gate: the old pair did not answer (connection refused): only the smoke test judges "
            "the new one") in caplog.text
    assert f"head: warning: supervise: could not start {SUPERVISOR_UNIT} again: no such image" in caplog.text


