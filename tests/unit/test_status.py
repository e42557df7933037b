"""status.py's table: rows built from fact values (pure), the rendering, the verdict, the deploy plan's count, and
the facts gathered through a Spark's Host."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import NamedTuple

import pytest
from harness import FakeHost
from settings_factory import make_pair

from operations.data.copy import listing_digest
from operations.facts.docker import DockerVolumeInfo
from operations.facts.files import FileText, FolderCheck, LinkTarget
from operations.facts.gpu import GpuClockState
from operations.facts.host import MemInfo
from operations.facts.model import HfPlan, RankFolder
from operations.facts.network import IpAddresses, PingOk, RoceDevices
from operations.facts.rank import RankInputs
from operations.facts.systemd import UnitState
from operations.layout import GPU_CLOCK_TIMER, MEMGUARD_UNIT, SUPERVISOR_UNIT
from operations.link import ipv4_mapped_gid
from operations.rank.spec import LABEL_HASH
from operations.tools import status_gather as sg
from operations.tools import status_render as sr
from operations.tools import status_watch as sw
from operations.util.net import ip_of

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HASH = {0: "0" * 32, 1: "1" * 32}
GIB = 2**30
IMAGE = "sparkfold/dsv41-tf:0123456789ab"
COMMIT = "c" * 40
SUMS_SHA = "5" * 64


def rank_inputs(container_: dict) -> dict:
    """RankInputs of a Spark whose data steps have not run (status reads its container from it)."""
    return {"container": container_, "link_record": None, "served": None, "kit": None, "rank_folder": None,
            "ablit": None, "infiniband": False, "capabilities": {}, "port_holders": {}, "mem_available": None}


def container(rank: int, running: bool = True, label: str | None = None, **changes) -> dict:
    c = {"exists": True, "running": running, "status": "running" if running else "exited", "exit_code": 0,
         "oom_killed": False, "labels": {"sparkfold.managed": "1", LABEL_HASH: label or HASH[rank]},
         "image": IMAGE, "created": "2026-03-01T09:29:58Z", "started_at": "2026-03-01T09:30:00.123456789Z",
         "finished_at": "0001-01-01T00:00:00Z"}
    return {**c, **changes}


GPU_LOCKED = {"smi": True, "error": "", "boot_id": "boot-1", "record_boot_id": "boot-1",
              "gpus": [{"index": 0, "bus_id": "0000000f:01:00.0", "name": "NVIDIA GB10", "clocks_sm": 2171,
                        "clocks_max_sm": 3003, "apps_clocks_reason": "Not Active"}],
              "recorded": {"0000000f:01:00.0": (0, 2200)}, "now": 1_790_000_000, "applied": 1_790_000_000 - 180,
              "failed_at": None, "failed": ""}


def verified(names: list[str]) -> dict:
    files = {n: [100, 1700000000] for n in names}
    return {"files": files, "sums_sha": SUMS_SHA, "names": names,
            "marker": listing_digest(files, names, SUMS_SHA)}


def sums_written(names: list[str]) -> dict:
    files = {n: [100, 1700000000] for n in names}
    return {"files": {**files, "SHA256SUMS": [80, 1700000001]}, "sums_sha": SUMS_SHA, "names": names,
            "marker": listing_digest(files, names)}


def link_facts(s) -> dict:
    addrs = {r["netdev"]: {"mtu": 9000, "operstate": "UP", "ipv4": [r["address"]]} for r in s.link_rails}
    roce = {f"rocep{i}": {"netdevs": [r["netdev"]],
                          "gids": {1: {3: {"gid": ipv4_mapped_gid(ip_of(r["address"])), "type": "RoCE v2",
                                           "ndev": r["netdev"]}}}}
            for i, r in enumerate(s.link_rails)}
    return {"addrs": addrs, "roce": roce, "pings": [True] * len(s.link_rails)}


UNIT_ON = {"enabled": "enabled", "active": "active", "sha256": "f" * 64}
UNIT_NONE = {"enabled": "", "active": "inactive", "sha256": None}


def up_facts(s) -> sr.SparkFacts:
    """A Spark of a converged, serving pair."""
    f: sr.SparkFacts = {
        "container": container(s.rank), "want_hash": HASH[s.rank], "spec_note": "",
        "gpu": GPU_LOCKED,
        "meminfo": {"MemTotal": 119 * GIB, "MemAvailable": 8 * GIB},
        "engram": sums_written(list(s.engram_files)) if s.is_head else verified(["a.safetensors"]),
        "kit": verified(["MANIFEST.txt", "rope-0.f32"]),
        "weights_symlink": f"{COMMIT}/rank{s.rank}",
        "weights": {"bins": {s.rank: [f"rank{s.rank}of2-abc.bin"]}, "partial": [], "source": COMMIT},
        "units": {MEMGUARD_UNIT: UNIT_ON, SUPERVISOR_UNIT: UNIT_NONE, GPU_CLOCK_TIMER: UNIT_ON},
        **link_facts(s),
    }
    if s.is_head:
        f["checkpoint"] = {"complete": True, "commit": COMMIT, "missing": [], "missing_bytes": 0, "offline": True,
                           "manifest": True, "total_bytes": 300 * GIB, "model_type": "deepseek_v41", "error": None}
    else:
        f["nfs_volume"] = {"Name": "sparkfold-hf", "Driver": "local"}
        f["weights_check"] = verified([f"rank{s.rank}of2-abc.bin"])
    return f


def nothing_facts(s) -> sr.SparkFacts:
    """A Spark nothing was deployed on: every fact's default."""
    f: sr.SparkFacts = {
        "container": {}, "want_hash": None, "gpu": GpuClockState.default(),
        "spec_note": f"rank {s.rank} cannot be launched yet: the link record (rails) missing",
        "addrs": {}, "roce": {}, "pings": [False, False], "meminfo": {"MemTotal": 119 * GIB, "MemAvailable": 117 * GIB},
        "engram": None, "kit": None, "weights_symlink": None, "weights": RankFolder.default(),
        "units": {MEMGUARD_UNIT: UNIT_NONE, SUPERVISOR_UNIT: UNIT_NONE},
    }
    if s.is_head:
        f["checkpoint"] = HfPlan.default()
    else:
        f["nfs_volume"], f["weights_check"] = None, None
    return f


API_OK: sr.ApiProbe = {"problem": None, "latency_ms": 12.4, "key_on": False, "key_read": False}
METRICS_URL = "http://spark-a.local:8888/metrics"
METRICS_NONE: sr.MetricsProbe = {"url": METRICS_URL, "problem": "not served by this engine (404)", "values": {},
                                 "kinds": {}, "read_at": None}
API_DOWN: sr.ApiProbe = {"problem": "no answer from http://spark-a.local:8888/v1/models (ConnectionError)",
                         "latency_ms": 3.0, "key_on": False, "key_read": False}


def rows_of(head_facts, worker_facts, api=API_OK, plan=None, settings=None):
    hs, ws = make_pair(**(settings or {}))
    head = head_facts(hs) if callable(head_facts) else head_facts
    worker = worker_facts(ws) if callable(worker_facts) else worker_facts
    return sr.build_rows(hs, ws, head, worker, api, plan, NOW, {"head": "spark-a", "worker": "spark-b"})


def by_item(rows, spark, item) -> sr.Row:
    found = [r for r in rows if r.spark == spark and r.item == item]
    assert len(found) == 1, (spark, item, rows)
    return found[0]


# --- rows from fact values ----------------------------------------------------------------------------------------

def test_both_up_and_current():
    rows = rows_of(up_facts, up_facts)
    assert [r for r in rows if r.ok is False] == []
    r0, r1 = by_item(rows, "head", "rank 0"), by_item(rows, "worker", "rank 1")
    assert r0.state == r1.state == "running"
    assert r0.detail == f"since 2026-03-01 09:30 UTC (2 h 29 min ago); spec current; image {IMAGE}"
    assert by_item(rows, "head", "API").detail == ("model DeepSeek-V4.1-Flash-1017 at http://spark-a.local:8888/v1 "
                                                   "in 12 ms; key off")
    gpu = by_item(rows, "worker", "GPU clock")
    assert gpu.state == "locked"
    assert gpu.detail == ("ceiling 2200 MHz; last applied 3 min ago; sparkfold-gpu-clock.timer every 300 s; "
                          "GPU 0 at 2171 MHz")
    rail = by_item(rows, "head", "link rail 1")
    assert (rail.state, rail.detail) == ("up", "enP2p1s0f0np0 192.168.101.1/24, MTU 9000, GID index 3 (rocep1), "
                                               "peer 192.168.101.2 answers")
    assert by_item(rows, "head", "checkpoint").state == "complete"
    assert by_item(rows, "worker", "checkpoint").state == "via NFS"
    assert by_item(rows, "head", "Engram tables").state == by_item(rows, "worker", "kit").state == "verified"
    assert by_item(rows, "head", "weight file").state == "whole (no checksum list)"
    assert by_item(rows, "worker", "weight file").state == "verified"
    assert by_item(rows, "head", "sparkfold-memguard").state == "active"
    assert by_item(rows, "head", "sparkfold-supervise").state == "not installed"  # supervise = false: as wanted
    assert by_item(rows, "head", "sparkfold-supervise").ok is True
    assert by_item(rows, "head", "memory").ok is None  # the rank runs: memory is information only
    assert sr.not_serving({0: container(0), 1: container(1)}, API_OK) is None


def test_worker_down():
    def worker(s):
        return {**up_facts(s), "container": container(1, running=False, exit_code=137, oom_killed=True,
                                                      finished_at="2026-03-01T11:50:00Z")}
    rows = rows_of(up_facts, worker, api=API_DOWN)
    r1 = by_item(rows, "worker", "rank 1")
    assert (r1.state, r1.ok) == ("exited", False)
    assert r1.detail.startswith("exit code 137, killed by the OOM killer at 2026-03-01 11:50 UTC (10 min ago); "
                                "spec current")
    assert by_item(rows, "head", "API").state == "no answer"
    mem = by_item(rows, "worker", "memory")  # not running: judged against min_avail_gib
    assert mem.ok is False and "a rank needs min_avail_gib = 112 GiB to start" in mem.detail
    verdict = sr.not_serving({0: container(0), 1: container(1, running=False, exit_code=137)}, API_DOWN)
    assert verdict == ("rank 1 is not running (exit code 137); no answer from "
                       "http://spark-a.local:8888/v1/models (ConnectionError)")


def test_spec_stale_is_marked_but_the_pair_still_serves():
    def head(s):
        return {**up_facts(s), "container": container(0, label="f" * 32)}
    rows = rows_of(head, up_facts)
    r0 = by_item(rows, "head", "rank 0")
    assert (r0.state, r0.ok) == ("running", False) and "spec stale" in r0.detail
    assert by_item(rows, "worker", "rank 1").ok is True
    assert sr.not_serving({0: container(0, label="f" * 32), 1: container(1)}, API_OK) is None


def test_spec_unknown_names_why():
    def head(s):
        return {**up_facts(s), "want_hash": None, "spec_note": "the engine image's capabilities missing"}
    r0 = by_item(rows_of(head, up_facts), "head", "rank 0")
    assert "spec unknown (the engine image's capabilities missing)" in r0.detail and r0.ok is True


def test_api_answering_with_a_key():
    api: sr.ApiProbe = {"problem": None, "latency_ms": 40.2, "key_on": True, "key_read": True}
    row = by_item(rows_of(up_facts, up_facts, api=api, settings={"head": {"api_key": True}}), "head", "API")
    assert (row.state, row.ok) == ("answers", True)
    assert row.detail.endswith("in 40 ms; key on")
    refused: sr.ApiProbe = {"problem": "http://h:8888/v1/models refused the API key (401)", "latency_ms": 5.0,
                            "key_on": True, "key_read": False}
    row = sr.api_row("http://h:8888", "m", refused)
    assert (row.state, row.ok) == ("no answer", False)
    assert row.detail == ("http://h:8888/v1/models refused the API key (401); key on, but the key file on the head "
                          "gave no key")


def test_nothing_deployed_yet():
    rows = rows_of(nothing_facts, nothing_facts, api=API_DOWN)
    r0 = by_item(rows, "head", "rank 0")
    assert (r0.state, r0.ok) == ("absent", False)
    assert r0.detail == ("no container dsv41-1017-exl3-tf; rank 0 cannot be launched yet: the link record (rails) "
                         "missing")
    assert by_item(rows, "head", "GPU clock").state == "unreadable"
    rail = by_item(rows, "worker", "link rail 0")
    assert rail.state == "down" and rail.detail.startswith("enp1s0f0np0 missing, MTU ? (want 9000), no RoCE v2 GID")
    assert by_item(rows, "head", "checkpoint").state == "unknown"
    assert by_item(rows, "worker", "checkpoint").state == "no volume"
    assert by_item(rows, "worker", "Engram tables").state == "missing"
    assert by_item(rows, "head", "weight file").state == "missing"
    assert by_item(rows, "worker", "sparkfold-memguard").ok is False  # memguard = true, not installed
    assert by_item(rows, "head", "memory").ok is True  # enough to start
    informational = ("memory", "sparkfold-supervise", "generations", "metrics", "sampling", "data verified",
                     "link bandwidth")
    assert {r.ok for r in rows if r.item not in informational} == {False}
    assert by_item(rows, "worker", "link bandwidth").state == "not measured"
    assert (by_item(rows, "head", "metrics").state, by_item(rows, "head", "metrics").ok) == ("not read", None)
    assert by_item(rows, "head", "generations").state == "none"  # information: nothing has served yet
    assert sr.not_serving({0: {}, 1: {}}, API_DOWN) == ("rank 0 has no container; rank 1 has no container; "
                                                        + API_DOWN["problem"])


def test_facts_that_were_not_read_still_give_every_row():
    rows = rows_of({}, {}, api=API_DOWN)
    assert len(rows) == len(rows_of(up_facts, up_facts))
    assert by_item(rows, "worker", "rank 1").state == "absent"


def test_gpu_lock_drift_is_shown():
    timer_on = {"enabled": "enabled", "active": "active"}
    reset = {**GPU_LOCKED, "gpus": [{**GPU_LOCKED["gpus"][0], "clocks_sm": 2405}]}
    row = sr.gpu_row("head", reset, 2200, 300, timer_on)
    assert (row.state, row.ok) == ("not locked", False)
    assert row.detail.startswith("GPU 0 runs at 2405 MHz, above the 2200 MHz ceiling (lock reset)")
    rebooted = {**GPU_LOCKED, "boot_id": "boot-2"}
    assert "no lock recorded since this boot" in sr.gpu_row("head", rebooted, 2200, 300, timer_on).detail


def test_gpu_stale_and_failed_applications_are_shown():
    stale = {**GPU_LOCKED, "applied": GPU_LOCKED["now"] - 2400}
    row = sr.gpu_row("worker", stale, 2200, 300, {"enabled": "enabled", "active": "inactive"})
    assert (row.state, row.ok) == ("stale", False)
    assert row.detail == ("last applied 40 min ago, more than 2 timer periods of 300 s: sparkfold-gpu-clock.timer "
                          "is not running; wanted ceiling 2200 MHz")
    failed = {**GPU_LOCKED, "recorded": {}, "applied": None, "failed_at": GPU_LOCKED["now"] - 60, "failed": "why"}
    row = sr.gpu_row("worker", failed, 2200, 300, {"active": "active"})
    assert (row.state, row.detail) == ("failed", "the last application failed 1 min ago: why; wanted ceiling 2200 MHz")
    # held, but nothing keeps it: not a problem yet, still marked
    row = sr.gpu_row("worker", GPU_LOCKED, 2200, 300, {"active": "inactive"})
    assert (row.state, row.ok) == ("locked", False) and "timer is not running" in row.detail


def test_a_rail_whose_peer_does_not_answer_is_down():
    def worker(s):
        return {**up_facts(s), "pings": [True, False]}
    rows = rows_of(up_facts, worker)
    assert by_item(rows, "worker", "link rail 0").state == "up"
    rail = by_item(rows, "worker", "link rail 1")
    assert (rail.state, rail.ok) == ("down", False) and rail.detail.endswith("peer 192.168.101.1 no reply")


def test_a_folder_changed_since_its_check_is_not_verified():
    def worker(s):
        kit = verified(["MANIFEST.txt", "rope-0.f32"])
        kit["files"]["rope-0.f32"] = [99, 1700000099]  # a copy rewrote it after the check
        return {**up_facts(s), "kit": kit}
    row = by_item(rows_of(up_facts, worker), "worker", "kit")
    assert (row.state, row.ok) == ("not verified", False)
    assert row.detail.endswith("2 of 2 files of MANIFEST in /home/nvidia/.cache/sparkfold/kit")


def test_weight_folder_with_an_interrupted_build():
    row = sr.weights_row("head", 0, "/d/rank-cache/active-rank0", f"{COMMIT}/rank0",
                         {"bins": {}, "partial": [0], "source": None}, None, verify=False)
    assert (row.state, row.ok) == ("incomplete", False) and "an interrupted build" in row.detail


def test_unit_wanted_off_but_running():
    row = sr.unit_row("head", SUPERVISOR_UNIT, UNIT_ON, "supervise", False)
    assert (row.item, row.state, row.ok) == ("sparkfold-supervise", "active", False)
    assert row.detail == "enabled: enabled; supervise = false"


def test_memory_is_shown_against_the_memguard_floor_while_the_rank_runs():
    mem = by_item(rows_of(up_facts, up_facts), "head", "memory")
    assert sr.render_table([mem]).splitlines()[1] == ("· head   memory  8.0 GiB  MemAvailable of 119.0 GiB; 5.5 GiB "
                                                      "above the memguard floor of 2.5 GiB")
    assert mem.ok is None and mem.facts == {"mem_available_gib": 8.0, "mem_total_gib": 119.0, "rank_running": True,
                                            "min_avail_gib": 112.0, "memguard": True, "memguard_floor_gib": 2.5}
    low = sr.memory_row("worker", {"MemTotal": 119 * GIB, "MemAvailable": 2 * GIB}, 112, True, True, 2.5)
    assert (low.state, low.detail, low.ok) == ("2.0 GiB", "MemAvailable of 119.0 GiB; below the memguard floor of "
                                               "2.5 GiB: memguard kills the rank", False)
    off = sr.memory_row("worker", {"MemTotal": 119 * GIB, "MemAvailable": 2 * GIB}, 112, True, False, 2.5)
    assert (off.detail, off.ok) == ("MemAvailable of 119.0 GiB; memguard off (memguard = false)", None)
    # no rank: the floor a start needs, as before
    idle = sr.memory_row("worker", {"MemTotal": 119 * GIB, "MemAvailable": 117 * GIB}, 112, False, True, 2.5)
    assert (idle.detail, idle.ok) == ("MemAvailable of 119.0 GiB; a rank needs min_avail_gib = 112 GiB to start", True)


METRIC_KINDS = {"tensorfold_requests_total": "counter", "tensorfold_completion_tokens_total": "counter",
                "tensorfold_requests_inflight": "gauge", "tensorfold_decode_seconds_total": "counter"}
METRICS_1: sr.MetricsProbe = {"url": METRICS_URL, "problem": None, "kinds": METRIC_KINDS, "read_at": 1000.0,
                              "values": {"tensorfold_requests_total": 12.0, "tensorfold_completion_tokens_total": 789.0,
                                         "tensorfold_requests_inflight": 1.0, "tensorfold_decode_seconds_total": 3.25}}
METRICS_2: sr.MetricsProbe = {**METRICS_1, "read_at": 1005.0,  # type: ignore[typeddict-item]
                              "values": {"tensorfold_requests_total": 14.0, "tensorfold_completion_tokens_total": 909.0,
                                         "tensorfold_requests_inflight": 0.0, "tensorfold_decode_seconds_total": 1.5}}


def test_metric_rows_show_each_metric_then_each_counters_rise_since_the_last_refresh():
    assert sr.render_table(sr.metric_rows(METRICS_1, None)).splitlines()[1:] == [
        "· head   requests_total           12     counter",
        "· head   completion_tokens_total  789    counter",
        "· head   requests_inflight        1      gauge",
        "· head   decode_seconds_total     3.25   counter",
    ]
    rows = sr.metric_rows(METRICS_2, METRICS_1)
    assert sr.render_table(rows).splitlines()[1:] == [
        "· head   requests_total           14     counter, +2 in 5 s (0.4/s)",
        "· head   completion_tokens_total  909    counter, +120 in 5 s (24.0/s)",
        "· head   requests_inflight        0      gauge",
        "· head   decode_seconds_total     1.50   counter, reset since the last refresh (was 3.25)",
    ]
    assert rows[1].facts == {"metric": "tensorfold_completion_tokens_total", "kind": "counter", "value": 909.0,
                             "rise": 120.0, "per_s": 24.0}
    assert {r.ok for r in rows} == {None}  # information: an engine without /metrics serves all the same


def test_metrics_that_were_not_read_give_one_row_saying_why():
    assert sr.render_table(sr.metric_rows(None, None)).splitlines()[1] == (
        "· head   metrics  not read  the API does not answer")
    assert sr.render_table(sr.metric_rows(METRICS_NONE, METRICS_1)).splitlines()[1] == (
        "· head   metrics  not read  http://spark-a.local:8888/metrics: not served by this engine (404)")
    empty = {**METRICS_1, "values": {}, "kinds": {}}
    assert sr.render_table(sr.metric_rows(empty, None)).splitlines()[1] == (  # type: ignore[arg-type]
        "· head   metrics  none   http://spark-a.local:8888/metrics lists no counter or gauge")


def test_the_metric_rows_follow_the_api_row():
    hs, ws = make_pair()
    rows = sr.build_rows(hs, ws, up_facts(hs), up_facts(ws), API_OK, None, NOW, None, METRICS_2, METRICS_1)
    assert [r.item for r in rows[:7]] == ["rank 0", "rank 1", "API", "requests_total", "completion_tokens_total",
                                          "requests_inflight", "decode_seconds_total"]
    assert rows[3].detail == "counter, +2 in 5 s (0.4/s)"


def serving_report(head_facts=up_facts, worker_facts=up_facts, api=API_OK, verdict=None, ssh=None):
    hs, ws = make_pair()
    hosts = {"head": "spark-a", "worker": "spark-b"}
    rows = sr.build_rows(hs, ws, head_facts(hs), worker_facts(ws), api, None, NOW, hosts, METRICS_1, None)
    return hs, sr.Report(rows, verdict, hosts, ssh or {"head": True, "worker": True}, METRICS_1, NOW)


def test_the_json_document_holds_every_row_with_its_facts():
    hs, report = serving_report()
    text = sr.render_json(report, hs, [])
    assert "\n" not in text  # one document, one line
    doc = json.loads(text)
    assert {k: doc[k] for k in ("time", "serving", "verdict", "api", "settings_problems", "sparks")} == {
        "time": "2026-03-01T12:00:00+00:00", "serving": True, "verdict": None,
        "api": {"url": "http://spark-a.local:8888/v1", "model": "DeepSeek-V4.1-Flash-1017"},
        "settings_problems": [],
        "sparks": {"head": {"host": "spark-a", "ssh": True}, "worker": {"host": "spark-b", "ssh": True}}}
    # the same rows as the table, in its order
    assert [(r["spark"], r["item"], r["state"], r["ok"], r["detail"]) for r in doc["rows"]] == [
        (r.spark, r.item, r.state, r.ok, r.detail) for r in report.rows]
    facts = {(r["spark"], r["item"]): r["facts"] for r in doc["rows"]}
    assert facts[("worker", "rank 1")] == {
        "rank": 1, "container": "dsv41-1017-exl3-tf", "exists": True, "running": True, "status": "running",
        "exit_code": 0, "oom_killed": False, "started_at": "2026-03-01T09:30:00.123456+00:00", "finished_at": None,
        "image": IMAGE, "spec": "current", "spec_note": ""}
    assert facts[("head", "API")] == {"base_url": "http://spark-a.local:8888", "model": "DeepSeek-V4.1-Flash-1017",
                                      "answers": True, "problem": None, "latency_ms": 12.4, "key_on": False,
                                      "key_read": False}
    assert facts[("worker", "memory")] == {"mem_available_gib": 8.0, "mem_total_gib": 119.0, "rank_running": True,
                                           "min_avail_gib": 112.0, "memguard": True, "memguard_floor_gib": 2.5}
    assert facts[("worker", "GPU clock")] == {"state": "locked", "ceiling_mhz": 2200, "period_s": 300,
                                              "timer_active": True, "applied_s_ago": 180, "clocks_sm_mhz": {"0": 2171}}
    assert facts[("head", "link rail 0")] == {
        "rail": 0, "netdev": "enp1s0f0np0", "address": "192.168.100.1/24", "present": True, "on_netdev": True,
        "mtu": 9000, "want_mtu": 9000, "ibdev": "rocep0", "gid_index": 3, "peer": "192.168.100.2",
        "peer_answers": True, "problems": []}
    assert facts[("head", "generations")] == {"kept": [], "last_good": None, "keep_generations": 2}
    assert facts[("head", "sparkfold-memguard")] == {"unit": "sparkfold-memguard.service", "enabled": "enabled",
                                                     "active": "active", "setting": "memguard", "wanted": True}
    assert facts[("head", "requests_total")] == {"metric": "tensorfold_requests_total", "kind": "counter",
                                                 "value": 12.0, "rise": None, "per_s": None}


def test_the_json_document_of_a_pair_that_is_not_serving():
    hs, report = serving_report(worker_facts=lambda s: {"unreachable": "spark-b did not answer over ssh"},
                                api=API_DOWN, verdict="rank 1's Spark does not answer over ssh",
                                ssh={"head": True, "worker": False})
    doc = json.loads(sr.render_json(report, hs, ["context = 3 must be a power of two"]))
    assert (doc["serving"], doc["verdict"]) == (False, "rank 1's Spark does not answer over ssh")
    assert doc["settings_problems"] == ["context = 3 must be a power of two"]
    assert doc["sparks"]["worker"] == {"host": "spark-b", "ssh": False}
    ssh = next(r for r in doc["rows"] if r["item"] == "ssh")
    assert ssh == {"spark": "worker", "item": "ssh", "state": "no answer", "ok": False,
                   "detail": "spark-b did not answer over ssh; nothing else of this Spark is known",
                   "facts": {"answers": False, "problem": "spark-b did not answer over ssh"}}
    assert [r["spark"] for r in doc["rows"] if r["item"] not in ("ssh", "API", "requests_total",
                                                                "completion_tokens_total", "requests_inflight",
                                                                "decode_seconds_total")] == ["head"] * 15


def test_the_watched_table_says_when_it_was_read_and_how_often():
    hs, report = serving_report()
    lines = sr.render_text(report, hs, [], every_s=5).splitlines()
    assert lines[0] == ("sparkfold status: head spark-a, worker spark-b; 2026-03-01 12:00:00 UTC, again every 5 s "
                        "(Ctrl-C stops)")
    assert sr.render_text(report, hs, []).splitlines()[0] == "sparkfold status: head spark-a, worker spark-b"
    assert lines[-1] == "serving: DeepSeek-V4.1-Flash-1017 at http://spark-a.local:8888/v1"


def test_each_refresh_replaces_the_last_on_a_terminal_and_follows_it_elsewhere():
    assert sw.watch_frame("table", terminal=True, as_json=False) == "\x1b[H\x1b[2Jtable"
    assert sw.watch_frame("table", terminal=False, as_json=False) == "table\n"  # a blank line between refreshes
    assert sw.watch_frame('{"serving": true}', terminal=True, as_json=True) == '{"serving": true}'  # a line each


def test_watch_reads_again_every_interval_from_the_start_of_each_read():
    ticks = iter([100.0, 101.5, 105.0, 112.0, 112.0])  # the second read takes 7 s, longer than the interval
    reads, shown, sleeps = [], [], []

    def read(previous):
        reads.append(previous)
        return f"report {len(reads)}"

    sw.watch(read, shown.append, 5, sleep=sleeps.append, clock=lambda: next(ticks), frames=3)
    assert shown == ["report 1", "report 2", "report 3"]
    assert reads == [None, "report 1", "report 2"]  # each read gets the last one: the counters' rates
    assert sleeps == [3.5, 0.0]  # none after the last frame


def test_time_parsing():
    assert sr.parse_time("2026-03-01T09:30:00.123456789Z") == datetime(2026, 3, 1, 9, 30, 0, 123456, tzinfo=UTC)
    assert sr.parse_time("2026-03-01T10:30:00+01:00") == datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    assert sr.parse_time("0001-01-01T00:00:00Z") is None and sr.parse_time("") is None
    assert sr.ago(datetime(2026, 2, 27, 10, 0, tzinfo=UTC), NOW) == "2 d 2 h"
    assert sr.ago(datetime(2026, 3, 1, 11, 59, 30, tzinfo=UTC), NOW) == "30 s"


# --- the table --------------------------------------------------------------------------------------------------

def test_render_table_aligns_columns_and_marks_rows():
    rows = [sr.Row("head", "rank 0", "running", "since x", True),
            sr.Row("worker", "rank 1", "exited", "exit code 1", False),
            sr.Row("head", "memory", "8.0 GiB", "", None)]
    assert sr.render_table(rows) == "\n".join([
        "  SPARK   ITEM    STATE    DETAIL",
        "✔ head    rank 0  running  since x",
        "✘ worker  rank 1  exited   exit code 1",
        "· head    memory  8.0 GiB",
    ])


def test_rendered_table_of_a_serving_pair_has_no_problem_mark():
    text = sr.render_table(rows_of(up_facts, up_facts))
    assert "✘" not in text and text.count("\n") == len(rows_of(up_facts, up_facts))
    assert "✘ worker  rank 1" in sr.render_table(rows_of(up_facts, {}, api=API_DOWN))


# --- the deploy plan's count ----------------------------------------------------------------------------------

PLAN = [
    {"name": "a", "hosts_with_change": ["spark-a", "spark-b"], "hosts_with_conditional_change": []},
    {"name": "b", "hosts_with_change": ["spark-b"], "hosts_with_conditional_change": ["spark-a"]},
    {"name": "c", "hosts_with_change": [], "hosts_with_conditional_change": []},
]


def test_count_changes_and_the_plan_row():
    assert sg.count_changes(PLAN) == ({"spark-a": 1, "spark-b": 2}, {"spark-a": 1})
    plan = sg.read_plan(json.dumps({"plan": PLAN, "results": None}), "", 0)
    row = sr.plan_row(plan, {"head": "spark-a", "worker": "spark-b"})
    assert (row.state, row.ok) == ("3 to change", False)
    assert row.detail.startswith("head 1, worker 2 operations would change (head 1, worker 0 may change)")
    converged = sg.read_plan(json.dumps({"plan": PLAN[2:], "results": None}), "", 0)
    assert sr.plan_row(converged, {"head": "spark-a", "worker": "spark-b"}).state == "converged"


def test_a_plan_that_cannot_be_read_says_why():
    plan = sg.read_plan("", "--> Loading config...\n--> \x1b[31mpyinfra error\x1b[0m in deploy.py line 22: the "
                            "settings need fixing\n", 1)
    assert plan["error"] == "--> pyinfra error in deploy.py line 22: the settings need fixing"
    assert sr.plan_row(plan, {"head": "a"}).state == "unknown"


def test_dry_run_argv_runs_deploy_py_with_the_same_options():
    argv = ["/x/.venv/bin/pyinfra", "inventory.py", "status.py", "-y", "--data", "context=524288", "--limit", "head"]
    assert sg.dry_run_argv(argv) == [sys.executable, "-m", "pyinfra", "inventory.py", "deploy.py", "--data",
                                     "context=524288", "--limit", "head", "--dry", "--json"]
    assert sg.dry_run_argv(["pyinfra", "inv.py", "/src/sparkfold/status.py"])[4] == "/src/sparkfold/deploy.py"


def test_the_plan_row_is_left_out_when_status_plan_is_off():
    assert not [r for r in rows_of(up_facts, up_facts, plan=None) if r.item == "deploy"]


# --- gathering through a Host -------------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ["head", "worker"])
def test_spark_facts_reads_each_fact_once_and_pings_the_peer(monkeypatch, role):
    hs, ws = make_pair()
    s = hs if role == "head" else ws
    facts = {RankInputs: rank_inputs(container(s.rank)), GpuClockState: GPU_LOCKED, "pyinfra.facts.files.File": None,
             IpAddresses: {}, RoceDevices: {}, PingOk: True, MemInfo: {}, FileText: None, FolderCheck: None,
             LinkTarget: None, RankFolder: RankFolder.default(), UnitState: UNIT_ON, HfPlan: HfPlan.default(),
             DockerVolumeInfo: None}
    h = FakeHost(facts, name=role)
    f = sg.spark_facts(h, s)
    assert f["container"] == container(s.rank) and f["pings"] == [True, True] and f["gpu"] == GPU_LOCKED
    calls = [(name.rsplit(".", 1)[1], kwargs) for name, kwargs in h.fact_calls]
    pings = [kw for name, kw in calls if name == "PingOk"]
    assert pings == [{"netdev": r["netdev"], "address": ip_of(p["address"]), "size": 8972}
                     for r, p in zip(s.link_rails, s.the_peer.link_rails, strict=True)]
    names = {name for name, _ in calls}
    assert ("HfPlan" in names) == (role == "head") and ("DockerVolumeInfo" in names) == (role == "worker")
    wanted = [MEMGUARD_UNIT, SUPERVISOR_UNIT] if role == "head" else [MEMGUARD_UNIT]
    assert sorted(f["units"]) == sorted([*wanted, GPU_CLOCK_TIMER])


def test_wanted_hashes_come_from_the_pair_plan_of_both_sparks(monkeypatch):
    hs, ws = make_pair(head={"nccl_rails": 1}, worker={"nccl_rails": 1})
    from rank_inputs import found
    head, worker = {"rank_inputs": found(hs)}, {"rank_inputs": found(ws)}
    sg.wanted_hashes(hs, ws, head, worker)
    assert len(head["want_hash"]) == len(worker["want_hash"]) == 32 and head["want_hash"] != worker["want_hash"]
    head, worker = {"rank_inputs": found(hs, caps={})}, {"unreachable": "no answer"}
    sg.wanted_hashes(hs, ws, head, worker)
    assert head["want_hash"] is None and head["spec_note"] == "the other Spark's inputs are not known"

    def broken(*args, **kwargs):
        raise ValueError("bad setting")

    monkeypatch.setattr(sg, "pair_plan", broken)
    head, worker = {"rank_inputs": found(hs)}, {"rank_inputs": found(ws)}
    sg.wanted_hashes(hs, ws, head, worker)
    assert (head["want_hash"], head["spec_note"]) == (None, "the spec cannot be built (ValueError: bad setting)")


# --- the deploy file ----------------------------------------------------------------------------------------------

class StatusRun(NamedTuple):
    out: str
    error: str | None  # the DeployError's message
    head: FakeHost
    worker: FakeHost
    exit_code: int | None = None  # a SystemExit's code (--json ends the run itself)


STATUS_ARGV = ("/x/.venv/bin/pyinfra", "inventory.py", "status.py", "-y")


def _run_status_py(monkeypatch, capsys, api_problem, unreachable: str = "", run_on: str = "head",
                   argv: tuple[str, ...] = STATUS_ARGV, settings: dict | None = None,
                   metrics: sr.MetricsProbe | None = None) -> StatusRun:
    """status.py's run on `run_on` ("head" or "worker") with the default settings (and `settings`); `unreachable`
    names a Spark pyinfra could not connect to; `metrics`: what /metrics gives (none by default)."""
    from pyinfra.api.exceptions import DeployError
    from pyinfra.context import ctx_host, ctx_state
    from settings_factory import ROOT

    import operations.settings.context as context

    hs, ws = make_pair(head=settings, worker=settings)
    facts = {GpuClockState: GPU_LOCKED, "pyinfra.facts.files.File": None, IpAddresses: {}, RoceDevices: {},
             PingOk: False, MemInfo: {}, FileText: None, FolderCheck: None, LinkTarget: None,
             RankFolder: RankFolder.default(),
             UnitState: UNIT_NONE, HfPlan: HfPlan.default(), DockerVolumeInfo: None}
    head = FakeHost({**facts, RankInputs: rank_inputs(container(0))}, name="spark-a")
    worker = FakeHost({**facts, RankInputs: rank_inputs({})}, name="spark-b")
    hosts = {"head": head, "worker": worker}
    if unreachable:
        hosts[unreachable].connected = False
    monkeypatch.setattr(context, "pair_settings", lambda: (hs, ws, ["context = 3 must be a power of two"]))
    monkeypatch.setattr(context, "pair_hosts", lambda: (head, worker))
    monkeypatch.setattr(sg, "models_listed", lambda url, name, key: api_problem)
    monkeypatch.setattr(sg, "probe_metrics", lambda url, key: metrics or METRICS_NONE)
    monkeypatch.setattr(sys, "argv", list(argv))
    monkeypatch.setenv("PYINFRA_PROGRESS", "on")  # restored after the test: status.py turns it off
    source = (ROOT / "status.py").read_text()
    error, code = None, None
    # pyinfra's run: the hosts it could not connect to are its failed hosts
    run_state = SimpleNamespace(failed_hosts={hosts[unreachable]} if unreachable else set())
    with ctx_host.use(hosts[run_on]), ctx_state.use(run_state):
        try:
            exec(compile(source, "status.py", "exec"), {"__name__": "status"})
        except DeployError as e:
            error = str(e)
        except SystemExit as e:
            code = e.code
    return StatusRun(capsys.readouterr().out, error, head, worker, code)


def test_status_py_prints_one_table_then_fails_when_not_serving(monkeypatch, capsys):
    out, error, head, _worker, _ = _run_status_py(monkeypatch, capsys,
                                                  "no answer from http://spark-a.local:8888/v1/models")
    lines = out.splitlines()
    assert lines[0] == "sparkfold status: head spark-a, worker spark-b"
    assert lines[1] == "  settings problem (deploy.py stops on it): context = 3 must be a power of two"
    assert lines[2].split() == ["SPARK", "ITEM", "STATE", "DETAIL"]
    assert "✘ worker  rank 1" in out and "no container dsv41-1017-exl3-tf; rank 1 cannot be launched yet" in out
    assert "spec unknown (rank 0 cannot be launched yet: the link record (rails)" in out
    assert lines[-1] == "NOT serving: rank 1 has no container; no answer from http://spark-a.local:8888/v1/models"
    assert error == "the pair is not serving: rank 1 has no container; no answer from " \
                    "http://spark-a.local:8888/v1/models"
    assert head.noops == []  # nothing planned


def test_status_py_exits_quietly_while_serving(monkeypatch, capsys):
    out, error, _, _, code = _run_status_py(monkeypatch, capsys, None)
    assert code is None  # pyinfra ends the run
    assert error is None and out.splitlines()[-1] == ("serving: DeepSeek-V4.1-Flash-1017 at "
                                                      "http://spark-a.local:8888/v1")


def test_status_py_shows_the_head_when_the_worker_does_not_answer(monkeypatch, capsys):
    out, error, head, worker, _ = _run_status_py(monkeypatch, capsys,
                                                 "no answer from http://spark-a.local:8888/v1/models",
                                                 unreachable="worker")
    assert "✘ worker  ssh" in out and "spark-b did not answer over ssh" in out
    assert "✔ head    rank 0" in out and "head    GPU clock" in out
    assert [r for r in out.splitlines() if r[2:].startswith("worker") and "ssh" not in r] == []
    assert worker.fact_calls == []  # pyinfra would try to connect again for each
    assert error == ("the pair is not serving: rank 1's Spark spark-b does not answer over ssh (`ssh -p 22 spark-b "
                     "true` shows why); no answer from http://spark-a.local:8888/v1/models")


def test_status_py_is_printed_by_the_worker_when_the_head_does_not_answer(monkeypatch, capsys):
    out, error, head, worker, _ = _run_status_py(monkeypatch, capsys, "401 Unauthorized", unreachable="head",
                                                 run_on="worker")
    assert out.count("sparkfold status: head spark-a, worker spark-b") == 1
    assert "✘ head    ssh" in out and "spark-a did not answer over ssh" in out and "worker  rank 1" in out
    assert head.fact_calls == [] and worker.fact_calls != []
    assert error is not None and "rank 0's Spark spark-a does not answer over ssh" in error


def test_status_py_prints_nothing_on_the_worker_while_the_head_answers(monkeypatch, capsys):
    out, error, head, worker, _ = _run_status_py(monkeypatch, capsys, None, run_on="worker")
    assert out == "" and error is None and head.fact_calls == worker.fact_calls == []


def test_the_api_is_asked_without_a_key_the_head_could_not_give(monkeypatch):
    hs, _ws = make_pair(head={"api_key": True})
    head = FakeHost({}, name="spark-a")
    head.connected = False
    asked = []
    monkeypatch.setattr(sg, "models_listed", lambda url, name, key: asked.append(key) or "401 Unauthorized")
    api = sg.probe_api(hs, sg.api_key_for(head, hs))
    assert asked == [""] and api["key_on"] and api["key_read"] is None and head.fact_calls == []
    assert "key on, but the head did not answer" in sr.api_row(hs.api_base_url, hs.served_name, api).detail


# --- the API as the running rank 0 serves it -------------------------------------------------------------------------

def test_the_rank_container_fact_keeps_its_command_line():
    from harness import parse_fact

    from operations.facts.docker import RankContainer
    line = json.dumps({"state": {"Running": True, "Status": "running"}, "labels": {}, "image": "img:1",
                       "created": "2026", "args": ["serve", "/snap", "--host", "127.0.0.1", "--api-key-file", "/k"],
                       "env": []})
    assert parse_fact(RankContainer, [line], container="c")["args"] == ["serve", "/snap", "--host", "127.0.0.1",
                                                                        "--api-key-file", "/k"]


def _gather_api(monkeypatch, settings: dict, args: list[str] | None, running: bool = True):
    """The API row and the key the probe sent, for a head whose rank 0 was started with `args` (None: not read)."""
    hs, ws = make_pair(head=settings, worker=settings)
    rank0 = container(0, running=running, **({"args": args} if args is not None else {}))
    facts = {GpuClockState: GPU_LOCKED, "pyinfra.facts.files.File": None, IpAddresses: {}, RoceDevices: {},
             PingOk: False, MemInfo: {}, FileText: None, FolderCheck: None, LinkTarget: None,
             RankFolder: RankFolder.default(),
             UnitState: UNIT_NONE, HfPlan: HfPlan.default(), DockerVolumeInfo: None}
    head = FakeHost({**facts, RankInputs: rank_inputs(rank0)}, name="spark-a")
    worker = FakeHost({**facts, RankInputs: rank_inputs(container(1))}, name="spark-b")
    sent = []
    monkeypatch.setattr(sg, "models_listed", lambda url, name, key: sent.append(key))
    monkeypatch.setattr(sg, "read_api_key", lambda spark, path: "the-key")
    monkeypatch.setattr(sg, "probe_metrics", lambda url, key: METRICS_NONE)
    report = sg.gather(head, worker, hs, ws, None)
    return by_item(report.rows, "head", "API"), sent


SERVE = ["serve", "/snap", "--name", "DeepSeek-V4.1-Flash-1017", "--host", "0.0.0.0", "--port", "8888"]


def test_a_keyless_rank_0_shows_key_off_though_the_settings_ask_for_a_key(monkeypatch):
    # a rollback to a keyless pair: the keyless server would accept the keyed probe, so the answer cannot tell
    row, sent = _gather_api(monkeypatch, {"api_key": True}, SERVE)
    assert row.detail.endswith("; key off (settings ask for a key: a rollback?); listens on 0.0.0.0")
    assert sent == [""] and row.facts["served_key"] is False and row.facts["settings_key"] is True
    row, sent = _gather_api(monkeypatch, {}, [*SERVE, "--api-key-file", "/run/key"])
    assert row.detail.endswith("; key on (settings ask for none: a rollback?); listens on 0.0.0.0")
    assert sent == ["the-key"]
    row, sent = _gather_api(monkeypatch, {"api_key": True}, [*SERVE, "--api-key-file=/run/key"])
    assert row.detail.endswith("; key on; listens on 0.0.0.0") and sent == ["the-key"]


def test_the_listen_address_comes_from_the_running_rank_0(monkeypatch):
    row, _ = _gather_api(monkeypatch, {}, ["serve", "/snap", "--host=127.0.0.1"])
    assert row.detail.endswith("; key off; listens on 127.0.0.1 (settings ask for 0.0.0.0: a rollback?)")
    assert (row.facts["served_host"], row.facts["settings_host"]) == ("127.0.0.1", "0.0.0.0")


def test_without_a_running_rank_0_the_key_state_is_the_settings_and_says_so(monkeypatch):
    row, sent = _gather_api(monkeypatch, {"api_key": True}, SERVE, running=False)
    assert row.detail.endswith("; key on (from the settings: no running rank 0 to read it from)")
    assert sent == ["the-key"] and "listens on" not in row.detail


class Reconnecting(FakeHost):
    """A Spark that did not answer at first; each connect fails with `answers` until it is empty."""

    def __init__(self, facts: dict, name: str, answers: list[str]):
        super().__init__(facts, name=name)
        self.connected, self.answers, self.tries = False, answers, 0

    def connect(self, reason=None, show_errors=True, raise_exceptions=False):
        from pyinfra.api.exceptions import ConnectError
        self.tries += 1
        if self.answers:
            raise ConnectError(self.answers.pop(0))
        self.connected = True


def test_a_refresh_connects_again_to_a_spark_that_did_not_answer(monkeypatch):
    hs, ws = make_pair()
    facts = {GpuClockState: GPU_LOCKED, "pyinfra.facts.files.File": None, IpAddresses: {}, RoceDevices: {},
             PingOk: False, MemInfo: {}, FileText: None, FolderCheck: None, LinkTarget: None,
             RankFolder: RankFolder.default(),
             UnitState: UNIT_NONE, HfPlan: HfPlan.default(), DockerVolumeInfo: None}
    head = FakeHost({**facts, RankInputs: rank_inputs(container(0))}, name="spark-a")
    worker = Reconnecting({**facts, RankInputs: rank_inputs(container(1))}, "spark-b", ["Connection refused"])
    monkeypatch.setattr(sg, "models_listed", lambda url, name, key: "no answer")
    first = sg.gather(head, worker, hs, ws, None)
    assert worker.tries == 0  # pyinfra has just tried: the first reading does not wait on it again
    assert by_item(first.rows, "worker", "ssh").detail == ("spark-b did not answer over ssh; `ssh -p 22 spark-b true` "
                                                           "shows why; nothing else of this Spark is known")
    second = sg.gather(head, worker, hs, ws, None, first)
    assert by_item(second.rows, "worker", "ssh").detail.startswith("spark-b did not answer over ssh (Connection "
                                                                   "refused); `ssh -p 22 spark-b true` shows why")
    third = sg.gather(head, worker, hs, ws, None, second)
    assert worker.tries == 2 and by_item(third.rows, "worker", "rank 1").state == "running"
    assert third.ssh == {"head": True, "worker": True} and third.ssh_checks == {}


def test_deploy_plan_counts_a_real_dry_run(tmp_path):
    # pyinfra's own --dry --json on this machine (@local): one operation would change, one would not
    (tmp_path / "deploy.py").write_text("from pyinfra.operations import files, server\n"
                                        "server.shell(name='would run', commands=['true'])\n"
                                        "files.directory(name='exists already', path='/tmp')\n")
    plan = sg.deploy_plan(["pyinfra", "@local", str(tmp_path / "status.py"), "-y"])
    assert plan == {"changes": {"@local": 1}, "conditional": {}, "error": None}
    (tmp_path / "deploy.py").write_text("from pyinfra.api.exceptions import DeployError\n"
                                        "raise DeployError('the settings need fixing')\n")
    failed = sg.deploy_plan(["pyinfra", "@local", str(tmp_path / "status.py")])
    assert failed["error"] is not None and failed["error"].endswith("the settings need fixing")


def test_status_py_with_json_prints_one_document_and_ends_the_run(monkeypatch, capsys):
    run = _run_status_py(monkeypatch, capsys, None, argv=(*STATUS_ARGV, "--json"), metrics=METRICS_1)
    assert run.out.count("\n") == 1 and run.exit_code == 0 and run.error is None  # nothing of pyinfra's after it
    doc = json.loads(run.out)
    assert doc["serving"] is True and doc["settings_problems"] == ["context = 3 must be a power of two"]
    items = [(r["spark"], r["item"], r["state"]) for r in doc["rows"]]
    assert items[:4] == [("head", "rank 0", "running"), ("worker", "rank 1", "absent"), ("head", "API", "answers"),
                         ("head", "requests_total", "12")]
    assert "sparkfold status" not in run.out


def test_status_py_with_json_exits_1_when_not_serving_or_a_spark_did_not_answer(monkeypatch, capsys):
    run = _run_status_py(monkeypatch, capsys, "no answer from http://spark-a.local:8888/v1/models",
                         argv=(*STATUS_ARGV, "--json"))
    assert run.out.count("\n") == 1 and json.loads(run.out)["serving"] is False
    assert run.error == ("the pair is not serving: rank 1 has no container; no answer from "
                         "http://spark-a.local:8888/v1/models")
    # serving, but pyinfra could not reach the worker: its exit status, as without --json
    run = _run_status_py(monkeypatch, capsys, None, unreachable="worker", argv=(*STATUS_ARGV, "--json"))
    assert json.loads(run.out)["sparks"]["worker"] == {"host": "spark-b", "ssh": False,
                                                       "ssh_check": "ssh -p 22 spark-b true"}
    assert run.exit_code == 1


def test_status_py_counts_the_deploy_plan_only_with_status_plan(monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(sg, "deploy_plan", lambda argv: asked.append(list(argv)) or
                        {"changes": {}, "conditional": {}, "error": None})
    out = _run_status_py(monkeypatch, capsys, None).out
    assert asked == [] and not [line for line in out.splitlines() if line[2:].startswith("pair")]
    out = _run_status_py(monkeypatch, capsys, None, settings={"status_plan": True}).out
    assert asked == [list(STATUS_ARGV)]
    assert [line.split()[:4] for line in out.splitlines() if line[2:].startswith("pair")] == [
        ["✔", "pair", "deploy", "converged"]]


def test_status_py_turns_pyinfras_spinner_off(monkeypatch, capsys):
    _run_status_py(monkeypatch, capsys, None)
    assert os.environ["PYINFRA_PROGRESS"] == "off"


def test_status_py_with_status_watch_shows_the_table_again_until_stopped(monkeypatch, capsys):
    real_watch, intervals, sleeps = sw.watch, [], []

    def two_frames(read, show, every_s):  # the real loop, stopped after two refreshes
        intervals.append(every_s)
        real_watch(read, show, every_s, sleep=sleeps.append, frames=2)

    monkeypatch.setattr(sw, "watch", two_frames)
    run = _run_status_py(monkeypatch, capsys, "no answer from http://spark-a.local:8888/v1/models",
                         settings={"status_watch": 5})
    titles = [line for line in run.out.splitlines() if line.startswith("sparkfold status: ")]
    assert len(titles) == 2 and all(t.endswith(" UTC, again every 5 s (Ctrl-C stops)") for t in titles)
    assert intervals == [5] and len(sleeps) == 1 and 0 <= sleeps[0] <= 5
    assert run.out.count("\nNOT serving: rank 1 has no container") == 2
    assert run.error is None and run.exit_code is None  # it runs until Ctrl-C, whatever it shows


# --- /metrics from this machine --------------------------------------------------------------------------------

EXPOSITION = (
    "# HELP tensorfold_requests_total Completion requests received.\n"
    "# TYPE tensorfold_requests_total counter\n"
    'tensorfold_requests_total{model="DeepSeek-V4.1-Flash-1017"} 3\n'
    "# TYPE tensorfold_requests_inflight gauge\n"
    'tensorfold_requests_inflight{model="DeepSeek-V4.1-Flash-1017"} 1\n'
    "# TYPE tensorfold_ttft_seconds histogram\n"
    'tensorfold_ttft_seconds_bucket{le="1"} 2\n'
    "tensorfold_ttft_seconds_count 3\n"
)


@pytest.fixture
def metrics_server():
    """An engine's /metrics on 127.0.0.1: the key "k" when `key` is set, 404 when `served` is false."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            server = self.server
            if self.path != "/metrics" or not server.served:  # type: ignore[attr-defined]
                code, body = 404, b"{}"
            elif server.key and self.headers.get("Authorization") != "Bearer k":  # type: ignore[attr-defined]
                code, body = 401, b"{}"
            else:
                code, body = 200, EXPOSITION.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.key, httpd.served = False, True  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_probe_metrics_reads_the_engines_counters_with_the_key(metrics_server):
    base = f"http://127.0.0.1:{metrics_server.server_address[1]}"
    probe = sg.probe_metrics(base, "")
    assert probe["problem"] is None and probe["url"] == f"{base}/metrics" and probe["read_at"] is not None
    # the histogram's series are left out: its buckets do not add up
    assert probe["values"] == {"tensorfold_requests_total": 3.0, "tensorfold_requests_inflight": 1.0}
    assert probe["kinds"] == {"tensorfold_requests_total": "counter", "tensorfold_requests_inflight": "gauge"}
    metrics_server.key = True
    assert sg.probe_metrics(base, "")["problem"] == "refused the API key (401)"
    assert sg.probe_metrics(base, "k")["values"]["tensorfold_requests_total"] == 3.0
    metrics_server.served = False
    assert sg.probe_metrics(base, "k")["problem"] == "not served by this engine (404)"
    port = metrics_server.server_address[1]
    metrics_server.shutdown()
    metrics_server.server_close()
    assert sg.probe_metrics(f"http://127.0.0.1:{port}", "", timeout=2)["problem"] == "no answer (ConnectionError)"


def test_the_sampling_row_reads_what_rank_0_serves_not_the_settings():
    hs, _ = make_pair()
    running = {"running": True, "args": ["serve", "/x", "--temperature", "0.6", "--top-p", "0.9"]}
    row = sr.sampling_row(hs, running)
    assert row.state == "served" and row.detail == "sampling: temperature 0.6, top_p 0.9, top_k engine default"
    idle = sr.sampling_row(hs, {"running": False, "args": ["serve", "--temperature", "0.6"]})
    assert idle.state == "not served" and "temperature 1.0, top_p 0.95, top_k 20 (the settings" in idle.detail


LINK_RECORD = {"inputs": {"head": {"rails": [{"netdev": "enp1s0f0np0"}, {"netdev": "enP2p1s0f0np0"}]},
                          "worker": {"rails": [{"netdev": "enp1s0f0np0"}, {"netdev": "enP2p1s0f0np0"}]},
                          "min_gbps": 80.0},
               "taken": "2026-03-01T09:00:00Z", "passed": True, "findings": [],
               "figures": {"alone": {"enp1s0f0np0": 96.5, "enP2p1s0f0np0": 96.2},
                           "together": {"enp1s0f0np0": 94.8, "enP2p1s0f0np0": 94.6}, "errors": {}}}


def test_the_link_bandwidth_row_shows_the_last_figures_per_rail_and_when():
    row = sr.bandwidth_row("head", json.dumps(LINK_RECORD), NOW)
    assert (row.item, row.state, row.ok) == ("link bandwidth", "passed", True)
    assert row.detail == ("enp1s0f0np0 96.5 Gb/s alone, 94.8 Gb/s together; enP2p1s0f0np0 96.2 Gb/s alone, "
                          "94.6 Gb/s together; both 189.4 Gb/s; taken 2026-03-01 09:00 UTC (3 h 0 min ago); "
                          "link_min_gbps 80")
    assert row.facts["alone"] == {"enp1s0f0np0": 96.5, "enP2p1s0f0np0": 96.2} and row.facts["taken"] == LINK_RECORD[
        "taken"]


def test_a_warned_measurement_shows_short_with_its_first_finding():
    warned = {**LINK_RECORD, "passed": False, "findings": ["the twin enP2p1s0f0np0 is slow", "also"],
              "figures": {**LINK_RECORD["figures"], "alone": {"enp1s0f0np0": 96.5, "enP2p1s0f0np0": 0.1}}}
    row = sr.bandwidth_row("worker", json.dumps(warned), NOW)
    assert (row.state, row.ok) == ("short", False)
    assert "enP2p1s0f0np0 0.1 Gb/s alone" in row.detail and row.detail.endswith("; the twin enP2p1s0f0np0 is slow")


def test_no_link_record_says_how_it_gets_measured():
    row = sr.bandwidth_row("head", None, NOW)
    assert (row.state, row.ok) == ("not measured", None) and "link_check.py measures it now" in row.detail
    assert "link_measure = \"off\"" in sr.bandwidth_row("head", None, NOW, "off").detail
    broken = sr.bandwidth_row("head", "{not json", NOW)
    assert (broken.state, broken.ok) == ("unreadable", False)


def test_the_link_bandwidth_record_is_read_on_each_spark():
    hs, _ = make_pair()
    facts = {RankInputs: rank_inputs(container(0)), GpuClockState: GPU_LOCKED, "pyinfra.facts.files.File": None,
             IpAddresses: {}, RoceDevices: {}, PingOk: True, MemInfo: {}, FileText: json.dumps(LINK_RECORD),
             FolderCheck: None, LinkTarget: None, RankFolder: RankFolder.default(), UnitState: UNIT_ON,
             HfPlan: HfPlan.default(), DockerVolumeInfo: None}
    h = FakeHost(facts, name="head")
    f = sg.spark_facts(h, hs)
    assert json.loads(f["link_bandwidth"]) == LINK_RECORD
    assert ("FileText", {"path": hs.layout.link_bandwidth}) in [(n.rsplit(".", 1)[1], kw) for n, kw in h.fact_calls]


def test_the_data_verified_row_says_when_and_how_to_ask_again():
    row = sr.data_verified_row("worker", "2026-12-06T01:00:00Z\n")
    assert (row.state, row.ok) == ("2026-12-06T01:00:00Z", None) and "--data verify_data=true" in row.detail
    never = sr.data_verified_row("head", None)
    assert never.state == "never" and "never verified in full" in never.detail


@pytest.mark.parametrize("change", [{"findings": "one finding"}, {"inputs": {"head": []}},
                                    {"inputs": {**LINK_RECORD["inputs"], "min_gbps": "eighty"}}])
def test_a_link_record_of_another_shape_is_unreadable_not_a_crash(change):
    row = sr.bandwidth_row("head", json.dumps({**LINK_RECORD, **change}), NOW)
    assert (row.state, row.ok) == ("unreadable", False)
