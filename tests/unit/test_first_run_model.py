"""The first-run model of docs/measurements.md (tests/bench/first_run_model.py): its schedule, and its streams
are the deploy's."""

from __future__ import annotations

import pytest
from settings_factory import make_settings

from operations import image, model_data
from operations.data import background as background_data
from tests.bench import first_run_model as m


def test_streams_sharing_a_resource_take_turns_and_the_rest_overlap():
    tasks = [m.Task("a", 10, "hub"), m.Task("b", 5, "hub"), m.Task("c", 7, "", ("a",)), m.Task("d", 1, "hub", ("c",))]
    assert m.sequential_s(tasks) == 23
    assert m.overlapped_s(tasks) == 18  # a 0-10, b 10-15 (the hub), c 10-17, d 17-18
    assert m.critical_path_s(tasks) == 18  # a → c → d
    with pytest.raises(ValueError, match="never end"):
        m.overlapped_s([m.Task("x", 1, "", ("y",))])


@pytest.mark.parametrize("download", [100e6, 500e6, 1e9])
@pytest.mark.parametrize("link", [450e6, 2e9])
def test_overlapped_lies_between_the_critical_path_and_the_sum(download, link):
    tasks = m.streams(m.Sizes(), m.Rates(download=download, link=link), checkpoint_copy=True)
    assert m.critical_path_s(tasks) <= m.overlapped_s(tasks) < m.sequential_s(tasks)


def test_the_downloads_set_the_pace_when_the_link_is_fast():
    tasks = m.streams(m.Sizes(), m.Rates(download=1e9, link=2e9))
    downloads = (m.Sizes().engram + m.Sizes().checkpoint) / 1e9
    assert m.overlapped_s(tasks) == pytest.approx(m.critical_path_s(tasks))
    assert downloads < m.overlapped_s(tasks) < downloads + 300  # then rank 1's file, its copy and check
    assert "| 1000 MB/s | 36 min | 17 min | 26 min | 11 min |" in m.table()


def test_the_model_has_the_deploys_streams_and_waits(monkeypatch):
    """Each modelled stream is one the deploy starts, waiting for what the deploy's waits for."""
    declared = {}

    def background(stream, name, upstream=(), work=()):
        declared[stream.name] = stream.after
        return stream.name

    for module in (image, model_data, background_data):
        monkeypatch.setattr(module, "background", background)
    monkeypatch.setattr(model_data, "_plan", lambda args: {"commit": "c" * 40, "total_bytes": 10})
    monkeypatch.setattr(model_data, "hf_plans_kept", lambda spark, requests: None)
    monkeypatch.setattr(model_data, "_hub_installed", lambda s: None)
    for op in ("engine_context_uploaded", "hf_snapshot", "folder_placed", "folder_verified"):
        for module in (image, model_data):
            if hasattr(module, op):
                monkeypatch.setattr(module, op, lambda **kw: None)
    s = make_settings("head", home="/home/n", worker_weights="copy")
    image.engine_image._inner(s)
    model_data.model_data._inner(s)
    for task in m.streams(m.Sizes(), m.Rates(download=1e9), checkpoint_copy=True):
        assert task.name in declared, task.name
        # the model leaves out the small streams (token map, blob list): their waits pass through
        passed = {"token-map": ("image", "checkpoint"), "blob-list": ("checkpoint",)}
        waits = {w for a in declared[task.name] for w in (passed.get(a, (a,)))}
        assert set(task.after) == waits, (task.name, declared[task.name])
