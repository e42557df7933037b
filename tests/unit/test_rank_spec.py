"""rank_spec: each rank's argv, environment, mounts and docker run options from the settings."""

from __future__ import annotations

import pytest
from settings_factory import make_settings

from operations.layout import InContainer
from operations.rank.spec import LABEL_HASH, LABEL_MANAGED, image_key, rail_problems, rank_spec

API_KEY_FILE, CHAT_TEMPLATE = InContainer.API_KEY_FILE, InContainer.CHAT_TEMPLATE

IMAGE = "sparkfold/dsv41-tf:0123456789ab"
SNAP = "/root/.cache/huggingface/hub/models--Mia-AiLab--X/snapshots/abc"
HEAD_RAILS = [
    {"netdev": "enp1s0f0np0", "ibdev": "rocep1s0f0", "address": "192.168.100.1/24", "gid_index": 3, "mtu": 9000},
    {"netdev": "enP2p1s0f0np0", "ibdev": "roceP2p1s0f0", "address": "192.168.101.1/24", "gid_index": 3,
     "mtu": 9000},
]
WORKER_RAILS = [dict(r, gid_index=5, address=r["address"].replace(".1/", ".2/")) for r in HEAD_RAILS]
CAPS = {"families": {"deepseek_v41": ["exl3-mul1"]}, "serve": {"flags": {"--chat-template": {}}}}
NO_TEMPLATE_CAPS = {"families": {"deepseek_v41": ["exl3-mul1"]}, "serve": {"flags": {}}}
SAMPLING_CAPS = {"families": {"deepseek_v41": ["exl3-mul1"]},
                 "serve": {"flags": {"--chat-template": {}, "--temperature": {}, "--top-p": {}, "--top-k": {}}}}


def spec_of(s, *args, **kw):
    """rank_spec with this rank's weight folder where the deploy's active-rank link would lead."""
    return rank_spec(s, *args, rank_folder=f"{s.layout.rank_cache}/rank{s.rank}", **kw)


def head(caps=CAPS, **kw):
    s = make_settings("head", **kw)
    return spec_of(s, IMAGE, HEAD_RAILS, ("/home/nvidia/.cache/huggingface", SNAP), caps)


def worker(**kw):
    s = make_settings("worker", **kw)
    return spec_of(s, IMAGE, WORKER_RAILS, ("sparkfold-hf", SNAP), None)


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_rank0_argv_defaults_in_contract_order():
    a = head().argv
    assert a[:3] == ["tensorfold-native", "serve", SNAP]
    assert flag(a, "--name") == "DeepSeek-V4.1-Flash-1017"
    assert flag(a, "--host") == "0.0.0.0" and flag(a, "--port") == "8888"
    assert flag(a, "--context") == "1048576" and flag(a, "--parallel") == "4"
    assert flag(a, "--max-tokens") == "32768"
    assert "--thinking" in a and "--no-thinking" not in a
    assert "--reasoning-effort" not in a and "--no-drafts" not in a and "--api-key-file" not in a
    assert a[-2:] == ["--backend", "cuda"]
    names = [w for w in a if w.startswith("--")]
    assert names == ["--name", "--host", "--port", "--context", "--parallel", "--max-tokens", "--thinking",
                     "--chat-template", "--backend"]


@pytest.mark.parametrize("setting,value,check", [
    ("served_name", "dsv", lambda a: flag(a, "--name") == "dsv"),
    ("host", "127.0.0.1", lambda a: flag(a, "--host") == "127.0.0.1"),
    ("port", 9999, lambda a: flag(a, "--port") == "9999"),
    ("context", 524288, lambda a: flag(a, "--context") == "524288"),
    ("parallel", 2, lambda a: flag(a, "--parallel") == "2"),
    ("max_tokens", 4096, lambda a: flag(a, "--max-tokens") == "4096"),
    ("thinking", False, lambda a: "--no-thinking" in a and "--thinking" not in a),
    ("reasoning_effort", "xhigh", lambda a: flag(a, "--reasoning-effort") == "xhigh"),
    ("drafts", False, lambda a: "--no-drafts" in a),
    ("api_key", True, lambda a: flag(a, "--api-key-file") == API_KEY_FILE),
])
def test_rank0_argv_follows_each_setting(setting, value, check):
    assert check(head(**{setting: value}).argv)


def test_extra_serve_args_come_last_after_backend():
    a = head(extra_serve_args=["--min-p", "0.05", "--keep-warm", "1"]).argv
    assert a[-6:] == ["--backend", "cuda", "--min-p", "0.05", "--keep-warm", "1"]


def test_rank0_serves_the_recipes_sampling_defaults_after_max_tokens():
    a = head(SAMPLING_CAPS).argv
    i = a.index("--max-tokens")
    assert a[i + 2:i + 8] == ["--temperature", "1.0", "--top-p", "0.95", "--top-k", "20"]
    assert a[i + 8] == "--thinking"


def test_each_sampling_setting_empty_or_not_served_is_left_to_the_engine():
    a = head(SAMPLING_CAPS, top_k="").argv
    assert flag(a, "--temperature") == "1.0" and flag(a, "--top-p") == "0.95" and "--top-k" not in a
    none = head(SAMPLING_CAPS, temperature="", top_p="", top_k="").argv
    assert not {"--temperature", "--top-p", "--top-k"} & set(none)
    only_temperature = dict(SAMPLING_CAPS, serve={"flags": {"--chat-template": {}, "--temperature": {}}})
    b = head(only_temperature, temperature="0.6").argv
    assert flag(b, "--temperature") == "0.6" and "--top-p" not in b and "--top-k" not in b
    assert not {"--temperature", "--top-p", "--top-k"} & set(head().argv)  # CAPS lists none of them


def test_chat_template_flag_or_snapshot_mount():
    with_flag = head()
    assert flag(with_flag.argv, "--chat-template") == CHAT_TEMPLATE
    assert ("/home/nvidia/.cache/sparkfold/chat_template.jinja", CHAT_TEMPLATE, True) in with_flag.mounts
    without = head(caps=NO_TEMPLATE_CAPS)
    assert "--chat-template" not in without.argv
    assert ("/home/nvidia/.cache/sparkfold/chat_template.jinja", f"{SNAP}/chat_template.jinja", True) \
        in without.mounts


def test_kit_mounted_from_its_current_version():
    s = make_settings("head")
    spec = spec_of(s, IMAGE, HEAD_RAILS, ("/home/nvidia/.cache/huggingface", SNAP), CAPS,
                   kit_folder=f"{s.layout.kit}.d/ab12")
    assert (f"{s.layout.kit}.d/ab12", "/kit", True) in spec.mounts
    assert (s.layout.kit, "/kit", True) in head().mounts  # no version yet (an older layout): the folder itself


def test_api_key_folder_mounted_read_only_only_with_api_key():
    # the folder, not the file: a key renamed into it reaches the running engine
    assert ("/home/nvidia/.local/state/sparkfold/api-key.d", InContainer.API_KEY_DIR, True) in head(api_key=True).mounts
    assert API_KEY_FILE.startswith(InContainer.API_KEY_DIR + "/")
    assert all(dst != InContainer.API_KEY_DIR for _s, dst, _ro in head().mounts)


def test_rank0_env_contract_and_own_rails():
    e = head().env
    assert e["TF_TP_WORLD"] == "2" and e["TF_TP_MASTER"] == "192.168.100.1" and e["TF_TP_PORT"] == "29620"
    assert e["TF_DS_RANK_CACHE"] == "/rank-cache" and e["TF_DS_KIT"] == "/kit"
    assert e["TENSORFOLD_CUDA_KERNELS"] == "/kit/aot" and e["TF_DS_ENGRAM"] == "/engram"
    assert e["TF_DS_TOKEN_MAP"] == "/token-map/dsv41_token_map.json"
    for var in ("TF_DS_GRAPHS", "TF_DS_HC_SIDE", "TF_DS_L2_PREFETCH", "TF_DS_ENGRAM_AIO", "TF_DS_REPLAY_FLOOR",
                "HF_HUB_OFFLINE", "TENSORFOLD_NO_UPDATE_CHECK"):
        assert e[var] == "1", var
    assert e["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0" == e["TF_RDMA_DEVICES"]
    assert e["NCCL_IB_GID_INDEX"] == "3" == e["TF_RDMA_GID_INDEX"]
    assert e["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0"
    assert e["NCCL_MIN_NCHANNELS"] == "4" == e["NCCL_MAX_NCHANNELS"]
    assert "NCCL_DEBUG" not in e and "TF_SPILL_GIB" not in e and "TF_DS_KV_SHARD" not in e


def test_rank1_argv_contract():
    a = worker().argv
    assert a[:8] == ["tf-dsv41-lanes", SNAP, "/rank-cache", "1", "2", "192.168.100.1", "29620", "/kit"]
    assert flag(a, "--engram") == "/engram" and flag(a, "--token-map") == "/token-map/dsv41_token_map.json"
    assert flag(a, "--pool") == "1048576" and flag(a, "--parallel") == "4"
    assert flag(a, "--rdma") == "rocep1s0f0,roceP2p1s0f0"
    assert [flag(a, f) for f in ("--graphs", "--side", "--prefetch", "--aio")] == ["1", "1", "1", "1"]
    assert "--drafts" not in a


def test_rank1_follows_context_master_port_drafts_parallel():
    a = worker(context=524288, master_port=30000, drafts=False, parallel=2).argv
    assert flag(a, "--pool") == "524288" and a[6] == "30000" and flag(a, "--drafts") == "0"
    assert flag(a, "--parallel") == "2"


def test_pool_is_only_the_recipes_name_for_rank1s_pool_of_context_positions():
    assert worker(context=524288, pool=524288).argv == worker(context=524288).argv
    assert "--pool" not in head(context=524288, pool=524288).argv  # rank 0's pool is its --context


def test_rank1_env_uses_the_workers_own_gid_index():
    e = worker().env
    assert e["NCCL_IB_GID_INDEX"] == "5" == e["TF_RDMA_GID_INDEX"]
    assert e["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0" and e["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
    assert "TF_TP_MASTER" not in e and "TF_RDMA_DEVICES" not in e


def test_nccl_rails_one_uses_rail_zero_only():
    assert head(nccl_rails=1).env["NCCL_IB_HCA"] == "rocep1s0f0"
    assert flag(worker(nccl_rails=1).argv, "--rdma") == "rocep1s0f0"


def test_nccl_channels_and_debug():
    e = worker(nccl_channels=8, nccl_debug="INFO").env
    assert e["NCCL_MIN_NCHANNELS"] == "8" == e["NCCL_MAX_NCHANNELS"] and e["NCCL_DEBUG"] == "INFO"


def test_engine_env_spill_and_kv_shard_go_to_both_ranks_when_the_image_reads_them():
    env = {"TF_DS_STREAMS": "4", "TF_FILL_X": "2", "TENSORFOLD_SEED_SALT": "7", "TF_SPILL_DIR": "/cache/s",
           "OTHER": "no"}
    ported = dict(CAPS, env=["TF_SPILL_GIB", "TF_DS_KV_SHARD"])
    for spec in (head(caps=ported, engine_env=env, spill_gib=32, kv_shard=2),
                 worker(engine_env=env, spill_gib=32, kv_shard=2)):  # the worker trusts the head's launch check
        assert spec.env["TF_DS_STREAMS"] == "4" and spec.env["TF_FILL_X"] == "2"
        assert spec.env["TENSORFOLD_SEED_SALT"] == "7" and spec.env["TF_SPILL_DIR"] == "/cache/s"
        assert spec.env["TF_SPILL_GIB"] == "32" and spec.env["TF_DS_KV_SHARD"] == "2"
        assert "OTHER" not in spec.env


def test_ported_settings_are_not_passed_to_an_image_that_does_not_read_them():
    e = head(caps=dict(CAPS, env=["TF_SPILL_GIB"]), spill_gib=32, kv_shard=2).env
    assert e["TF_SPILL_GIB"] == "32" and "TF_DS_KV_SHARD" not in e
    e = head(spill_gib=32, kv_shard=2).env  # CAPS lists no env
    assert "TF_SPILL_GIB" not in e and "TF_DS_KV_SHARD" not in e


def test_engine_env_switch_overrides_reach_rank1_flags():
    assert head(engine_env={"TF_DS_GRAPHS": "0"}).env["TF_DS_GRAPHS"] == "0"
    assert flag(worker(engine_env={"TF_DS_GRAPHS": "0"}).argv, "--graphs") == "0"


def test_docker_options():
    o = head().options
    assert o[:3] == ["-d", "--name", "dsv41-1017-exl3-tf"]
    for pair in (["--gpus", "all"], ["--network", "host"], ["--ipc", "host"], ["--device", "/dev/infiniband"],
                 ["--cap-add", "IPC_LOCK"], ["--ulimit", "memlock=-1:-1"], ["--ulimit", "stack=67108864:67108864"],
                 ["--oom-score-adj", "1000"]):
        i = o.index(pair[0]) if pair[0] != "--ulimit" else o.index(pair[1]) - 1
        assert o[i:i + 2] == pair, pair
    s = make_settings("head", container_name="tf2", docker_ulimits=["memlock=-1:-1"], oom_score_adj=500)
    o2 = spec_of(s, IMAGE, HEAD_RAILS, ("/hf", SNAP), CAPS, has_infiniband=False).options
    assert "--device" not in o2 and o2.count("--ulimit") == 1 and o2[o2.index("--oom-score-adj") + 1] == "500"
    assert o2[2] == "tf2"


def test_mounts_read_only_except_the_cache():
    h, w = head(), worker()
    assert ("/home/nvidia/.cache/huggingface", "/root/.cache/huggingface", True) in h.mounts
    assert ("sparkfold-hf", "/root/.cache/huggingface/hub", True) in w.mounts  # the volume is the head's hub/
    assert ("/home/nvidia/.cache/sparkfold/rank-cache/rank0", "/rank-cache", True) in h.mounts
    assert ("/home/nvidia/.cache/sparkfold/rank-cache/rank1", "/rank-cache", True) in w.mounts
    writable = [m for m in h.mounts if not m[2]]
    assert writable == [("/home/nvidia/.cache/sparkfold/cache/0123456789ab", "/cache", False)]
    dsts = {d for _s, d, _r in w.mounts}
    assert {"/kit", "/engram", "/token-map", "/cache"} <= dsts


def test_run_argv_labels_env_mounts_then_image_and_argv():
    spec = worker()
    words = spec.run_argv()
    assert words[:2] == ["docker", "run"]
    assert f"{LABEL_MANAGED}=1" in words and f"{LABEL_HASH}={spec.spec_hash()}" in words
    assert "type=volume,src=sparkfold-hf,dst=/root/.cache/huggingface/hub,readonly" in words
    assert "type=bind,src=/home/nvidia/.cache/sparkfold/cache/0123456789ab,dst=/cache" in words
    i = words.index(IMAGE)
    assert words[i + 1:] == spec.argv


def test_spec_hash_stable_and_changes_with_every_input():
    base = head().spec_hash()
    assert head().spec_hash() == base
    changed = {head(context=524288).spec_hash(), head(nccl_debug="WARN").spec_hash(),
               head(api_key=True).spec_hash(), head(oom_score_adj=0).spec_hash(),
               spec_of(make_settings("head"), IMAGE.replace("0123", "9999"), HEAD_RAILS, ("/home/nvidia/.cache/"
                         "huggingface", SNAP), CAPS).spec_hash(),
               spec_of(make_settings("head"), IMAGE, HEAD_RAILS, ("/home/nvidia/.cache/huggingface", SNAP), CAPS,
                         template_digest="ab").spec_hash()}
    assert base not in changed and len(changed) == 6
    # the served sampling defaults are part of rank 0's spec: a new value recreates the pair
    served = head(SAMPLING_CAPS).spec_hash()
    assert len({base, served, head(SAMPLING_CAPS, temperature="0.7").spec_hash(),
                head(SAMPLING_CAPS, top_p="0.9").spec_hash(), head(SAMPLING_CAPS, top_k="40").spec_hash()}) == 5


def test_rail_problems():
    assert rail_problems(HEAD_RAILS, 2) == []
    assert "nccl_rails = 2" in rail_problems(HEAD_RAILS[:1], 2)[0]
    assert any("no ibdev" in p for p in rail_problems([dict(HEAD_RAILS[0], ibdev=None)], 1))
    mixed = [HEAD_RAILS[0], dict(HEAD_RAILS[1], gid_index=4)]
    assert any("different RoCE v2 GID" in p for p in rail_problems(mixed, 2))
    assert rail_problems(mixed, 1) == []


def test_image_key():
    assert image_key("sparkfold/dsv41-tf:abc") == "abc"
    assert image_key("reg:5000/x/y@sha256:" + "f" * 64) == "sha256-" + "f" * 16
    assert image_key("reg:5000/x/y") == "latest"
