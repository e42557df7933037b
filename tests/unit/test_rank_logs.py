"""logs.py: the RankLogTail fact (parsed, and run in a local shell against saved logs) and each rank's block."""

from __future__ import annotations

import gzip
import os

from harness import FakeHost, parse_fact, run_fact
from settings_factory import make_pair

from operations.facts.docker import RankLogTail
from operations.tools.rank_logs import log_section, rank_log_text

NAME = "sparkfold-test-no-such-container"


def test_fact_parses_each_source():
    assert parse_fact(RankLogTail, ["#LIVE", "2026-03-01T09:30:00Z a", "b"]) == {
        "source": "live", "path": None, "lines": ["2026-03-01T09:30:00Z a", "b"]}
    assert parse_fact(RankLogTail, ["#STOPPED", "x"])["source"] == "stopped"
    assert parse_fact(RankLogTail, ["#SAVED /d/logs/1-rank1.log.gz", "x"]) == {
        "source": "saved", "path": "/d/logs/1-rank1.log.gz", "lines": ["x"]}
    assert parse_fact(RankLogTail, ["#NONE"]) == parse_fact(RankLogTail, []) == RankLogTail.default()


def _saved(folder, name: str, lines: list[str], mtime: int) -> None:
    path = folder / name
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    os.utime(path, (mtime, mtime))


def test_without_a_container_the_newest_saved_log_of_that_rank_is_read(tmp_path):
    _saved(tmp_path, "20260301-090000-rank1.log.gz", ["old 1", "old 2"], 1000)
    _saved(tmp_path, "20260301-100000-rank1.1.log.gz", ["new 1", "new 2", "new 3"], 2000)
    _saved(tmp_path, "20260301-110000-rank0.log.gz", ["rank 0"], 3000)
    got = run_fact(RankLogTail, container=NAME, log_dir=str(tmp_path), rank=1, lines=2)
    assert got == {"source": "saved", "path": f"{tmp_path}/20260301-100000-rank1.1.log.gz",
                   "lines": ["new 2", "new 3"]}
    assert run_fact(RankLogTail, container=NAME, log_dir=str(tmp_path / "none"), rank=1, lines=2) == \
        RankLogTail.default()


def test_each_block_says_where_its_lines_come_from():
    live = {"source": "live", "path": None, "lines": ["a", "b"]}
    assert log_section(0, "head", "spark-a", "c", "/d/logs", 2, live) == (
        "--- rank 0 (head spark-a): live log of c, last 2 lines ---\na\nb")
    saved = {"source": "saved", "path": "/d/logs/x-rank1.log.gz", "lines": ["z"]}
    assert log_section(1, "worker", "spark-b", "c", "/d/logs", 5, saved).splitlines()[0] == (
        "--- rank 1 (worker spark-b): saved log /d/logs/x-rank1.log.gz (no container c), last 5 lines ---")
    nothing = log_section(1, "worker", "spark-b", "c", "/d/logs", 5, RankLogTail.default())
    assert nothing == "--- rank 1 (worker spark-b): no container c and no saved log in /d/logs, last 5 lines ---"


def test_log_lines_setting_reaches_the_fact():
    hs, ws = make_pair(environ={"SPARKFOLD_LOG_LINES": "500"})
    assert hs.log_lines == ws.log_lines == 500 and make_pair()[0].log_lines == 100
    h = FakeHost({RankLogTail: {"source": "live", "path": None, "lines": ["x"]}}, name="spark-b")
    assert rank_log_text(h, ws).startswith("--- rank 1 (worker spark-b): live log of dsv41-1017-exl3-tf, last 500")
    assert h.fact_calls == [("operations.facts.docker.RankLogTail",
                             {"container": "dsv41-1017-exl3-tf", "log_dir": "/home/nvidia/.cache/sparkfold/logs",
                              "rank": 1, "lines": 500})]


def test_a_spark_that_did_not_answer_is_not_asked_and_its_block_says_so():
    _hs, ws = make_pair()
    h = FakeHost({}, name="spark-b")
    h.connected = False
    assert rank_log_text(h, ws) == ("--- rank 1 (worker spark-b): no answer over ssh (pyinfra's message is above), "
                                    "last 100 lines ---")
    assert h.fact_calls == []
