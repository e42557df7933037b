"""pair_plan: the pair's plan from both Sparks' settings and rank inputs, table-driven (pure: plain data in and out).

Each scenario gives the settings changes, both Sparks' inputs (built from a converged pair and then spoiled) and the
expected plan: the pair's reasons, each rank's action, and the problems, memory and port findings per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from rank_inputs import CAPS, IMAGE, RAILS, TEMPLATE, container, found
from settings_factory import make_pair

from operations.rank.plan import KEEP, RECREATE, REFUSED, START, pair_plan

HEAD_DATA = {"nccl_rails": 1}


def settings(head: dict | None = None, worker: dict | None = None):
    return make_pair(head={**HEAD_DATA, **(head or {})}, worker={"nccl_rails": 1, **(worker or {})})


def wanted(head: dict | None = None, worker: dict | None = None, image: str = IMAGE) -> tuple[str, str]:
    """The spec hashes a converged pair with these settings runs."""
    hs, ws = settings(head, worker)
    plan = pair_plan(hs, ws, found(hs), found(ws), image=image, template_digest=TEMPLATE, force=False)
    return plan.rank(0).spec.spec_hash(), plan.rank(1).spec.spec_hash()


H0, H1 = wanted()
NOTHING: dict = {}


@dataclass
class Case:
    name: str
    head_in: dict[str, Any] = field(default_factory=dict)  # found(hs, **head_in)
    worker_in: dict[str, Any] = field(default_factory=dict)
    head_set: dict[str, Any] = field(default_factory=dict)  # settings changes (as --data)
    worker_set: dict[str, Any] = field(default_factory=dict)
    force: bool = False
    docker: tuple[str, str] = ("", "")  # why this run restarts Docker on the head, the worker ("": it does not)
    image: str = IMAGE
    reasons: list[str] = field(default_factory=list)
    actions: tuple[str, str] = (KEEP, KEEP)
    refusals: list[str] = field(default_factory=list)  # substrings, one per refusal
    problems: tuple[list[str], list[str]] = ([], [])  # substrings per rank
    memory: tuple[list[str], list[str]] = ([], [])
    ports: tuple[list[str], list[str]] = ([], [])
    settled: bool = True


def running(rank_hash: str, **kw):
    return {"container_": container(rank_hash, **kw)}


CONVERGED = dict(head_in=running(H0), worker_in=running(H1))

CASES = [
    Case("converged pair: both kept", **CONVERGED),
    Case("a restart was asked for", **CONVERGED, force=True, reasons=["a restart was asked for (restart = true)"],
         actions=(RECREATE, RECREATE)),
    Case("first run: no containers", reasons=["rank 0 has no container", "rank 1 has no container"],
         actions=(START, START)),
    Case("rank 1 missing, rank 0 runs", head_in=running(H0), reasons=["rank 1 has no container"],
         actions=(RECREATE, START)),
    Case("rank 0 missing, rank 1 runs", worker_in=running(H1), reasons=["rank 0 has no container"],
         actions=(START, RECREATE)),
    Case("rank 1 exited", head_in=running(H0), worker_in=running(H1, running=False, exit_code=1),
         reasons=["rank 1 is not running (exited, exit code 1)"], actions=(RECREATE, RECREATE)),
    Case("rank 0 killed by the OOM killer", worker_in=running(H1),
         head_in=running(H0, running=False, exit_code=137, oom=True),
         reasons=["rank 0 is not running (exited, exit code 137, killed by the OOM killer)"],
         actions=(RECREATE, RECREATE)),
    Case("rank 0's settings changed (context)", **CONVERGED, head_set={"context": 65536},
         reasons=["rank 0's settings or image changed"], actions=(RECREATE, RECREATE)),
    Case("a pair setting changed (parallel): both specs", **CONVERGED, head_set={"parallel": 2},
         worker_set={"parallel": 2},
         reasons=["rank 0's settings or image changed", "rank 1's settings or image changed"],
         actions=(RECREATE, RECREATE)),
    Case("a new image", **CONVERGED, image="sparkfold/dsv41-tf:def",
         reasons=["rank 0's settings or image changed", "rank 1's settings or image changed"],
         actions=(RECREATE, RECREATE)),
    Case("a new weight folder on the worker", head_in=running(H0),
         worker_in={**running(H1), "linked": True}, worker_set={"log_keep": 3},  # not in the spec: kept
         actions=(KEEP, KEEP)),
    Case("a foreign container on the head", head_in=running(None, managed=False), worker_in=running(H1),
         refusals=["a container named dsv41-1017-exl3-tf on the head was not started by sparkfold"],
         reasons=["rank 0's settings or image changed"], actions=(REFUSED, RECREATE)),
    Case("a foreign container on the worker", head_in=running(H0), worker_in=running(None, managed=False),
         refusals=["on the worker was not started by sparkfold"], reasons=["rank 1's settings or image changed"],
         actions=(RECREATE, REFUSED)),
    Case("no link record on the head yet", head_in={"rails": None}, reasons=["rank 0 has no container",
         "rank 1 has no container"], actions=(START, START), settled=False,
         problems=(["rank 0 cannot be launched yet: the link record (rails) missing"], [])),
    Case("no image yet: no capabilities", head_in={"caps": {}}, reasons=["rank 0 has no container",
         "rank 1 has no container"], actions=(START, START), settled=False,
         problems=(["the image's capabilities missing"], [])),
    Case("the worker's weight folder is not there yet", **{**CONVERGED, "worker_in": {**running(H1), "linked": False}},
         settled=False, problems=([], ["rank 1 cannot be launched yet: this rank's weight folder missing"])),
    Case("two rails asked, one recorded", worker_in=running(H1), head_set={"nccl_rails": 2}, settled=False,
         head_in={**running(H0), "rails": RAILS[:1]},
         problems=(["the link record lists 1 rail(s) but nccl_rails = 2"], [])),
    Case("a serve flag the image does not serve", **CONVERGED, head_set={"extra_serve_args": ["--kv-dtype", "fp8"]},
         reasons=["rank 0's settings or image changed"], actions=(RECREATE, RECREATE),
         problems=(["--kv-dtype is not served by this engine image"], [])),
    Case("a ported setting the image does not read", **CONVERGED, head_set={"spill_gib": 4},
         worker_set={"spill_gib": 4}, problems=(["spill_gib = 4 asks for spill v2"], [])),
    Case("too little memory for a rank that is not there", head_in={"mem_gib": 40.0}, worker_in={"mem_gib": 150.0},
         reasons=["rank 0 has no container", "rank 1 has no container"], actions=(START, START),
         memory=(["only 40.0 GiB of memory is available on the head but a rank needs min_avail_gib = 112"], [])),
    Case("memory our stopped rank gives back is waited for, not refused",
         head_in={**running(H0, running=False), "mem_gib": 40.0}, worker_in=running(H1),
         reasons=["rank 0 is not running (exited, exit code 0)"], actions=(RECREATE, RECREATE)),
    Case("a running rank holds its memory", **{**CONVERGED, "head_in": {**running(H0), "mem_gib": 2.0}}),
    Case("a port another process holds", worker_in=running(H1), head_in={"holders": {8888: ["python3 (pid 42)"]}},
         reasons=["rank 0 has no container"], actions=(START, RECREATE),
         ports=(["port 8888 is held by python3 (pid 42) on the head"], [])),
    Case("our running rank's own port is its own", **{**CONVERGED, "head_in": {
        **running(H0), "holders": {8888: ["tensorfold-nati (pid 7)"]}}}),
    Case("a changed port is checked while the old rank runs", worker_in=running(H1), head_set={"port": 9999},
         head_in={**running(H0), "holders": {9999: ["nginx (pid 12)"]}},
         reasons=["rank 0's settings or image changed"], actions=(RECREATE, RECREATE),
         ports=(["port 9999 is held by nginx (pid 12) on the head"], [])),
    Case("one Spark converged, the other's rank stopped", head_in=running(H0),
         worker_in=running(H1, running=False, status="exited", exit_code=2),
         reasons=["rank 1 is not running (exited, exit code 2)"], actions=(RECREATE, RECREATE)),
    Case("a spec not known yet does not judge a running rank", head_in={**running(H0), "caps": {}},
         worker_in=running(H1), settled=False, problems=(["the image's capabilities missing"], [])),
    # a Docker restart earlier in the run stops the rank on that Spark: the pair starts again, said with the cause
    Case("Docker restarts on the worker: the pair restarts", **CONVERGED, docker=("", "daemon.json changes"),
         reasons=["rank 1 restarts: Docker restarts on the worker (daemon.json changes)"],
         actions=(RECREATE, RECREATE)),
    Case("Docker restarts on the head: the pair restarts", **CONVERGED,
         docker=("its default runtime is runc, not nvidia", ""),
         reasons=["rank 0 restarts: Docker restarts on the head (its default runtime is runc, not nvidia)"],
         actions=(RECREATE, RECREATE)),
    Case("Docker restarts on both Sparks", **CONVERGED, docker=("daemon.json changes", "daemon.json changes"),
         reasons=["rank 0 restarts: Docker restarts on the head (daemon.json changes)",
                  "rank 1 restarts: Docker restarts on the worker (daemon.json changes)"],
         actions=(RECREATE, RECREATE)),
    Case("Docker restarts and rank 1's settings changed: both said", **CONVERGED, worker_set={"nccl_debug": "INFO"},
         docker=("", "daemon.json changes"),
         reasons=["rank 1 restarts: Docker restarts on the worker (daemon.json changes)",
                  "rank 1's settings or image changed"], actions=(RECREATE, RECREATE)),
    Case("Docker restarts where no rank runs: the missing rank is the reason", head_in=running(H0),
         docker=("", "Docker does not answer"), reasons=["rank 1 has no container"], actions=(RECREATE, START)),
    Case("Docker restarts where the rank already stopped: said as stopped", head_in=running(H0),
         worker_in=running(H1, running=False, exit_code=1), docker=("", "daemon.json changes"),
         reasons=["rank 1 is not running (exited, exit code 1)"], actions=(RECREATE, RECREATE)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_pair_plan(case: Case):
    hs, ws = settings(case.head_set, case.worker_set)
    plan = pair_plan(hs, ws, found(hs, **case.head_in), found(ws, **case.worker_in), image=case.image,
                     template_digest=TEMPLATE, force=case.force, docker_restarts=case.docker)
    assert list(plan.reasons) == case.reasons and plan.docker_restarts == case.docker
    assert (plan.rank(0).action, plan.rank(1).action) == case.actions
    assert len(plan.refusals) == len(case.refusals)
    for refusal, expected in zip(plan.refusals, case.refusals, strict=True):
        assert expected in refusal
    for rank in (0, 1):
        for got, expected in ((plan.rank(rank).problems, case.problems[rank]),
                              (plan.rank(rank).memory, case.memory[rank]), (plan.rank(rank).ports, case.ports[rank])):
            assert len(got) == len(expected), got
            for text, part in zip(got, expected, strict=True):
                assert part in text
    assert plan.settled is case.settled


def test_the_scenarios_cover_every_reason_and_action():
    reasons = " ".join(r for c in CASES for r in c.reasons)
    for kind in ("restart", "has no container", "is not running", "OOM killer", "settings or image changed",
                 "Docker restarts on the"):
        assert kind in reasons
    assert {a for c in CASES for a in c.actions} == {KEEP, RECREATE, START, REFUSED}
    assert len(CASES) >= 20


def test_the_worker_on_nfs_mounts_the_snapshot_the_head_serves():
    hs, ws = settings()
    head_in, worker_in = found(hs), found(ws, linked=True)
    worker_in["served"] = None  # the worker's own cache is not used with worker_weights = "nfs"
    head_in["served"] = f"{hs.layout.model_folder}/snapshots/def"
    spec = pair_plan(hs, ws, head_in, worker_in, image=IMAGE, template_digest=TEMPLATE, force=False).rank(1).spec
    assert spec is not None and (ws.nfs_volume, "/root/.cache/huggingface/hub", True) in spec.mounts
    assert spec.argv[1].endswith("/snapshots/def")
    head_in["served"] = None
    plan = pair_plan(hs, ws, head_in, worker_in, image=IMAGE, template_digest=TEMPLATE, force=False)
    assert plan.rank(1).spec is None and "the model snapshot" in plan.rank(1).problems[0]


def test_the_worker_with_its_own_copy_mounts_its_own_snapshot():
    hs, ws = settings(worker={"worker_weights": "copy"}, head={"worker_weights": "copy"})
    head_in, worker_in = found(hs), found(ws)
    head_in["served"] = None  # the head's snapshot does not matter to the worker's copy
    spec = pair_plan(hs, ws, head_in, worker_in, image=IMAGE, template_digest=TEMPLATE, force=False).rank(1).spec
    assert spec is not None and (ws.hf_cache, "/root/.cache/huggingface", True) in spec.mounts


def test_ablit_mounts_the_applied_pack_on_the_head():
    hs, ws = settings(head={"ablit": True}, worker={"ablit": True})
    spec = pair_plan(hs, ws, found(hs), found(ws), image=IMAGE, template_digest=TEMPLATE, force=False).rank(0).spec
    assert spec is not None and (hs.layout.ablit, "/root/.cache/huggingface", True) in spec.mounts
    assert "/root/.cache/huggingface/abc-overlay" in spec.argv


def test_a_new_chat_template_recreates_rank_0_only():
    hs, ws = settings()
    args = dict(image=IMAGE, force=False)
    before = pair_plan(hs, ws, found(hs), found(ws), template_digest="a", **args)
    after = pair_plan(hs, ws, found(hs), found(ws), template_digest="b", **args)
    assert before.rank(0).spec.spec_hash() != after.rank(0).spec.spec_hash()
    assert before.rank(1).spec.spec_hash() == after.rank(1).spec.spec_hash()


def test_the_plan_reads_nothing_but_its_arguments():
    hs, ws = settings()
    head_in, worker_in = found(hs, **running(H0)), found(ws, **running(H1))
    plans = [pair_plan(hs, ws, head_in, worker_in, image=IMAGE, template_digest=TEMPLATE, force=False)
             for _ in range(2)]
    assert plans[0] == plans[1] and plans[0].rank(0).spec.image == IMAGE
    assert CAPS["serve"]["flags"]  # the stand-in engine's document drives rank 0's flags
