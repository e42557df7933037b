"""The on-Spark layout: every path derives from the three roots, and the settings give each Spark its own."""

from settings_factory import make_pair

from operations.layout import InContainer, Layout, unit_path


def test_paths_derive_from_the_roots():
    p = Layout("/c/hf", "/d", "/s", 1, "Org/M")
    assert p.hub == "/c/hf/hub" and p.model_folder == "/c/hf/hub/models--Org--M"
    assert p.served_link == "/c/hf/hub/models--Org--M/sparkfold-current"
    assert (p.engram, p.kit, p.kit_src, p.token_map) == ("/d/engram", "/d/kit", "/d/kit-src",
                                                          "/d/token-map/dsv41_token_map.json")
    assert p.active_rank_link() == "/d/rank-cache/active-rank1" and p.active_rank_link(0).endswith("active-rank0")
    assert (p.ablit_current, p.logs, p.build_dir("abc")) == ("/d/ablit/current", "/d/logs", "/d/build/abc")
    assert (p.api_key, p.link_record, p.hf_token) == ("/s/api-key.d/key", "/s/link.json", "/s/hf-token")
    assert p.relative_to_cache(p.served_link) == f"{InContainer.HF}/hub/models--Org--M/sparkfold-current"
    assert unit_path("x.service") == "/etc/systemd/system/x.service"


def test_each_spark_has_its_own_layout_and_sees_the_other():
    head, worker = make_pair(worker={"data_dir": "/data/w", "eaq_v1_1": True}, head={"eaq_v1_1": True})
    assert head.layout.rank == 0 and worker.layout.rank == 1
    assert head.worker.layout.rank_cache == "/data/w/rank-cache"
    assert head.layout.model_folder.endswith("EAQ-v1.1-2.9-bpw")  # the served pack follows eaq_v1_1
    assert worker.head.layout.hf_cache == "/home/nvidia/.cache/huggingface"
