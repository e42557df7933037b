"""The simulated Sparks' rank footprint (tests/sim/meminfo.py): it builds up after a rank starts, comes back after it
stops, and the /proc/meminfo text keeps one length whatever the figures (the watcher rewrites it in place)."""

from __future__ import annotations

import pytest

from tests.sim import meminfo

CFG = {"base_gib": 118.0, "rank_gib": 98.0, "load_s": 10.0, "release_s": 6.0}


def test_a_rank_builds_its_footprint_up_over_the_load_and_gives_it_back_after_the_stop():
    fp = meminfo.Footprint()
    fp.follow(set(), 0.0, CFG)
    assert fp.held_gib(0.0, CFG) == 0
    fp.follow({"abc"}, 1.0, CFG)
    assert fp.held_gib(6.0, CFG) == pytest.approx(49.0)
    assert fp.held_gib(11.0, CFG) == pytest.approx(98.0)
    assert fp.held_gib(100.0, CFG) == pytest.approx(98.0)
    fp.follow(set(), 100.0, CFG)
    assert fp.held_gib(103.0, CFG) == pytest.approx(49.0)  # half given back
    assert fp.held_gib(106.0, CFG) == 0


def test_a_rank_running_when_the_watcher_starts_is_already_loaded():
    fp = meminfo.Footprint()
    fp.follow({"abc"}, 5.0, CFG)
    assert fp.held_gib(5.0, CFG) == pytest.approx(98.0)


def test_a_rank_stopped_during_its_load_gives_back_only_what_it_held():
    fp = meminfo.Footprint()
    fp.follow(set(), 0.0, CFG)
    fp.follow({"abc"}, 0.0, CFG)
    fp.follow(set(), 5.0, CFG)
    assert fp.held_gib(5.0, CFG) == pytest.approx(49.0)


def test_the_text_keeps_its_length_and_reads_like_the_kernels(tmp_path):
    full, empty = meminfo.text(121.0, 118.0), meminfo.text(121.0, 0.0)
    assert len(full) == len(empty)
    fields = {line.split(":")[0]: line.split()[1] for line in full.splitlines()}
    assert int(fields["MemAvailable"]) == 118 * 1024 * 1024 and int(fields["MemTotal"]) == 121 * 1024 * 1024
    path = tmp_path / "meminfo"
    meminfo.write_in_place(str(path), full)
    inode = path.stat().st_ino
    meminfo.write_in_place(str(path), empty)
    assert path.read_text() == empty and path.stat().st_ino == inode


def test_settings_are_written_into_a_folder_a_fresh_checkout_lacks(tmp_path):
    path = tmp_path / "fresh" / "meminfo" / "head.json"  # tests/sim/.work/meminfo is made on first use
    meminfo.write_json(str(path), {"base_gib": 118})
    assert meminfo.read_json(str(path), {}) == {"base_gib": 118}


def test_cma_total_is_shown_and_zero_keeps_the_length():
    usual, none = meminfo.text(121.0, 118.0), meminfo.text(121.0, 118.0, cma_total_kb=0)
    assert len(usual) == len(none)
    fields = {line.split(":")[0]: line.split()[1] for line in none.splitlines()}
    assert fields["CmaTotal"] == "0"
    assert f"{meminfo.CMA_TOTAL_KB} kB" in next(line for line in usual.splitlines() if line.startswith("CmaTotal:"))
