"""tests/bench/first_run.py's scaling, without the simulated pair: the fake hub's padding makes the downloads the real
ones / scale, the engine copy carries the knobs, and its model is the deploy's at that scale."""

from __future__ import annotations

import argparse
import json

import pytest

from tests.bench import first_run
from tests.bench import first_run_model as model


def test_the_padding_makes_the_downloads_the_real_ones_scaled():
    repos = first_run.hub_repos()
    for scale in (100, 200):
        padded = repos.padded(repos.build_repos(), first_run.pads(scale))
        checkpoint = sum(f.size for f in padded[repos.EAQ_V1].files.values())
        engram = sum(padded[repos.ENGRAM].files[p].size for p in ("config.json", "model.safetensors.index.json",
                                                                  "model-00047-of-00048.safetensors",
                                                                  "model-00048-of-00048.safetensors"))
        assert checkpoint == pytest.approx(model.Sizes().checkpoint / scale, rel=1e-3)
        assert engram == pytest.approx(model.Sizes().engram / scale, rel=1e-3)


def test_the_engine_copy_carries_the_bench_knobs(tmp_path, monkeypatch):
    monkeypatch.setattr(first_run, "ENGINE_COPY", tmp_path / "engine")
    copy = first_run.engine_copy(360.0, 5e6)
    assert (copy / "faults" / "bench-build-s").read_text() == "360\n"
    assert json.loads((copy / "faults" / "bench-rank-write").read_text()) == {"fraction": 0.5, "rate": 5e6}
    assert (copy / "Dockerfile").is_file() and (copy / "bin" / "tf-dsv41-rank-cache").is_file()


def test_the_model_at_the_bench_scale_is_the_real_one_scaled_in_time():
    args = argparse.Namespace(scale=200.0, speedup=2.0, download_mb_s=1000.0, link_mb_s=2000.0, write_mb_s=1000.0)
    real = model.streams(model.Sizes(), model.Rates(download=1e9, link=2e9, hashing=1e9 * 200 / 2, write=1e9),
                         checkpoint_copy=True)
    assert first_run.modelled(args) == pytest.approx(model.overlapped_s(real) / 2)  # hashing: this machine's
