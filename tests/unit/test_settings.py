import pytest

from operations import settings as S
from settings_factory import make_pair, make_settings


def problems(**overrides):
    return S.validate(make_settings("head", **overrides))


def test_registry_has_every_recipe_setting_with_a_meaning():
    reg = S.registry()
    for name in ("context", "parallel", "thinking", "reasoning_effort", "drafts", "eaq_v1_1", "ablit", "api_key",
                 "host", "port", "served_name", "min_avail_gib", "memguard_gib", "spill_gib", "kv_shard", "pool"):
        assert name in reg and reg[name].meaning, name
    assert reg["context"].default == 1048576 and reg["port"].default == 8888
    assert all(d.meaning for d in reg.values())


def test_defaults_are_valid_for_both_sparks():
    head, worker = make_pair()
    assert S.validate(head) == [] and S.validate(worker) == []
    assert S.validate_pair(head, worker) == []


def test_derived_values():
    head, worker = make_pair()
    assert head.is_head and not worker.is_head and head.rank == 0 and worker.rank == 1
    assert head.head_link_ip == worker.head_link_ip == "192.168.100.1"
    assert head.worker_link_ip == "192.168.100.2" and head.worker_link_ssh == "nvidia@192.168.100.2"
    assert head.worker_ssh_from_head == "nvidia@spark-b.local"
    assert head.hf_cache == "/home/nvidia/.cache/huggingface" and head.data_dir == "/home/nvidia/.cache/sparkfold"
    assert head.pool_positions == head.context
    assert head.api_base_url == "http://spark-a.local:8888"
    assert worker.api_base_url == "http://spark-a.local:8888"
    assert head.active_model_repo.endswith("EAQ-v1-2.9-bpw")
    assert make_settings(eaq_v1_1=True).active_model_repo.endswith("EAQ-v1.1-2.9-bpw")


def test_environment_overrides_use_the_recipe_names():
    s = make_settings(environ={"CONTEXT": "524288", "THINKING": "0", "MEMGUARD_GIB": "3.5",
                               "SPARKFOLD_EXTRA_SERVE_ARGS": "--top-k 20", "TF_DS_STREAMS": "4"})
    assert s.context == 524288 and s.thinking is False and s.memguard_gib == 3.5
    assert s.extra_serve_args == ["--top-k", "20"]
    assert s.engine_env == {"TF_DS_STREAMS": "4"}


def test_generic_environment_names_do_not_leak_in():
    s = make_settings(environ={"CONTAINER_NAME": "someone-else", "SPARKFOLD_LOG_KEEP": "3", "SPARKFOLD_PORT": "9001"})
    assert s.container_name == "dsv41-1017-exl3-tf" and s.log_keep == 3 and s.port == 9001
    assert S.registry()["container_name"].env == "SPARKFOLD_CONTAINER_NAME"
    assert S.registry()["context"].env == "CONTEXT"


def test_environment_beats_group_data_and_bad_env_value_names_the_variable():
    assert make_settings(environ={"PORT": "9000"}, port=8000).port == 9000
    with pytest.raises(S.SettingsError, match="environment variable CONTEXT"):
        make_settings(environ={"CONTEXT": "lots"})
    with pytest.raises(S.SettingsError, match="THINKING"):
        make_settings(environ={"THINKING": "maybe"})


def test_pyinfra_data_strings_are_coerced():
    s = make_settings(context="524288", drafts=0, memguard_gib=3)
    assert s.context == 524288 and s.drafts is False and s.memguard_gib == 3.0


@pytest.mark.parametrize("overrides, fragment", [
    ({"context": 500000}, "context = 500000 must be a power of two"),
    ({"context": 2097152}, "from 4096 to 1048576"),
    ({"pool": 262144}, "pool = 262144 must equal context"),
    ({"parallel": 8}, "parallel = 8 is outside 1..4"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort = 'extreme'"),
    ({"port": 70000}, "port = 70000"),
    ({"master_port": 8888}, "master_port = 8888 must differ from port"),
    ({"memguard_gib": 200.0}, "memguard_gib = 200.0 must be above 0 and below min_avail_gib"),
    ({"served_name": " "}, "served_name is empty"),
    ({"engine_env": {"FOO": "1"}}, "engine_env: FOO is not an engine variable"),
    ({"worker_weights": "smb"}, "worker_weights = 'smb'"),
    ({"nfs": False}, "worker_weights = 'nfs' needs nfs = true"),
    ({"prebuilt_image": "ghcr.io/x/y:latest"}, "pinned by digest"),
    ({"prebuilt_image": "name:tag"}, "name@sha256"),
    ({"prebuilt_image": "x@sha256:abc"}, "pinned by digest"),
    ({"tf_ref": "main"}, "tf_ref = 'main'"),
    ({"data_dir": "relative/dir"}, "data_dir = 'relative/dir' must be an absolute path"),
    ({"link_netplan_file": "/etc/netplan/x.conf"}, "must be a .yaml file in /etc/netplan/"),
    ({"nfs_exports_file": "/etc/exports"}, "must be a .exports file in /etc/exports.d/"),
    ({"docker_ulimits": ["memlock unlimited"]}, "docker_ulimits"),
    ({"link_mtu": 100}, "link_mtu = 100"),
    ({"gpu_clock_mhz": 9000}, "gpu_clock_mhz = 9000"),
    ({"nccl_rails": 3}, "nccl_rails = 3"),
    ({"host": "not a host!"}, "host = 'not a host!'"),
    ({"max_tokens": 0}, "max_tokens = 0"),
    ({"api_url": "spark-a:8888"}, "api_url = 'spark-a:8888'"),
    ({"extra_serve_args": [5]}, "extra_serve_args: 5 is not a string"),
])
def test_each_rule_names_the_setting(overrides, fragment):
    found = problems(**overrides)
    assert any(fragment in p for p in found), found


def test_a_pinned_prebuilt_image_is_accepted():
    assert S.validate(make_settings(prebuilt_image="ghcr.io/x/y@sha256:" + "a" * 64)) == []


def test_ablit_needs_a_token():
    assert any("HF_TOKEN" in p for p in problems(ablit=True))
    assert S.validate(make_settings(ablit=True, environ={"HF_TOKEN": "hf_x"})) == []


def test_link_rules():
    rails = lambda *addrs: [{"netdev": f"enp1s0f{i}np{i}", "address": a} for i, a in enumerate(addrs)]
    assert any("not in one subnet" in p for p in problems(peer_link_rails=rails("10.9.0.2/24", "192.168.101.2/24")))
    assert any("both use 192.168.100.1" in p for p in problems(peer_link_rails=rails("192.168.100.1/24", "192.168.101.2/24")))
    assert any("private IPv4" in p for p in problems(link_rails=rails("8.8.8.8/24", "192.168.101.1/24")))
    assert any("private IPv4" in p for p in problems(link_rails=rails("169.254.1.1/16", "192.168.101.1/24")))
    assert any("IPv4 with a prefix" in p for p in problems(link_rails=rails("nonsense", "192.168.101.1/24")))
    assert any("different number of link rails" in p for p in problems(link_rails=rails("192.168.100.1/24")))
    assert any("nccl_rails = 2" in p for p in problems(link_rails=rails("192.168.100.1/24"),
                                                       peer_link_rails=rails("192.168.100.2/24")))
    assert any("no link addresses" in p for p in problems(link_rails=[]))


def test_pair_rules():
    head, worker = make_pair(worker={"context": 524288})
    found = S.validate_pair(head, worker)
    assert any(p.startswith("context differs between the head (1048576) and the worker (524288)") for p in found)
    head, worker = make_pair()
    assert any("same machine" in p for p in S.validate_all(head, worker, "a:22", "a:22"))
    assert S.validate_all(head, worker, "a:22", "b:22") == []
