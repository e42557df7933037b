"""The copy benchmark's file set (tests/bench/copy_speed.py) and its split among clients, the copy's own
(operations/remote/link_copy.split_among); the copies themselves need the simulated pair and run only in the
benchmark."""

from __future__ import annotations

from operations.remote.link_copy import CLIENTS, split_among
from tests.bench.copy_speed import bench_files


def test_the_file_set_is_one_big_file_and_six_smaller_ones():
    files = bench_files(12 * 2**30)
    assert files[0] == ("big.bin", 6 * 2**30) and [size for _, size in files[1:]] == [2**30] * 6
    assert len({name for name, _ in files}) == 7


def test_every_file_goes_to_one_client_of_at_most_four_and_the_bytes_are_shared_out():
    files = bench_files(12 * 2**30)
    groups = split_among(files)
    assert CLIENTS == 4 and len(groups) == 4
    assert sorted(name for group in groups for name in group) == sorted(name for name, _ in files)
    sizes = dict(files)
    assert ["big.bin"] in groups  # half the bytes: alone on its client
    assert sorted(sum(sizes[n] for n in group) for group in groups) == [2 * 2**30] * 3 + [6 * 2**30]

