import json
import shutil
import subprocess
import sys

import pytest
from settings_factory import ROOT, group_file, layers, load_one, make_pair, make_settings

from operations import settings as S
from operations.settings.sources import Layers


def problems(**overrides):
    return S.validate(make_settings("head", **overrides))


def load_problems(role="head", environ=None, **overrides):
    return load_one(role, environ, **overrides)[1]


def test_every_setting_is_in_all_py_with_a_meaning_and_a_typed_field():
    meanings, defaults = S.meanings(), group_file("all")
    for name in ("context", "parallel", "thinking", "reasoning_effort", "drafts", "eaq_v1_1", "ablit", "api_key",
                 "host", "port", "served_name", "min_avail_gib", "memguard_gib", "spill_gib", "kv_shard", "pool"):
        assert name in S.SETTING_NAMES and meanings[name], name
    assert defaults["context"] == 1048576 and defaults["port"] == 8888
    assert set(S.SETTING_NAMES) == set(defaults) and all(meanings[n] for n in S.SETTING_NAMES)
    assert load_problems() == [] and load_problems("worker") == []


def test_defaults_are_valid_for_both_sparks():
    head, worker = make_pair()
    assert S.validate(head) == [] and S.validate(worker) == []
    assert S.validate_pair(head, worker) == []


def test_derived_values():
    head, worker = make_pair()
    assert head.is_head and not worker.is_head and head.rank == 0 and worker.rank == 1
    assert head.head_link_ip == worker.head_link_ip == "192.168.100.1"
    assert head.worker_link_ip == "192.168.100.2" and head.worker_link_ssh == "nvidia@192.168.100.2"
    assert head.worker_ssh_from_head == worker.worker_ssh_from_head == "nvidia@spark-b.local"
    assert head.peer is worker and worker.peer is head and worker.head is head and head.worker is worker
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


def test_the_plan_names_the_engine_variables_taken_from_the_environment_never_their_values():
    from operations.settings import passthrough_note

    environ = {"TF_DS_STREAMS": "4", "TENSORFOLD_SECRET_THING": "s3cret-value", "TF_FILL_X": "1", "HOME": "/root",
               "TF_OTHER": "no"}
    note = passthrough_note(environ)
    assert note == ("engine variables taken from this machine's environment: TENSORFOLD_SECRET_THING, TF_DS_STREAMS, "
                    "TF_FILL_X")
    assert "s3cret-value" not in note and "4" not in note.split(": ", 1)[1]
    taken = {"TF_DS_STREAMS": "4", "TENSORFOLD_SECRET_THING": "s3cret-value", "TF_FILL_X": "1"}
    assert make_settings(environ=environ).engine_env == taken  # the same variables the line names
    assert passthrough_note({"HOME": "/root", "TF_OTHER": "no"}) == ""  # nothing taken: no line


def test_generic_environment_names_do_not_leak_in():
    s = make_settings(environ={"CONTAINER_NAME": "someone-else", "SPARKFOLD_LOG_KEEP": "3", "SPARKFOLD_PORT": "9001"})
    assert s.container_name == "dsv41-1017-exl3-tf" and s.log_keep == 3 and s.port == 9001
    assert S.env_names("container_name") == ("SPARKFOLD_CONTAINER_NAME",)
    assert S.env_names("context") == ("CONTEXT", "SPARKFOLD_CONTEXT")


def test_bare_host_port_and_api_key_are_not_read():
    s = make_settings(environ={"HOST": "zsh-sets-this", "PORT": "9000", "API_KEY": "s3cret-value"})
    assert (s.host, s.port, s.api_key) == ("0.0.0.0", 8888, False)
    assert load_problems(environ={"HOST": "x", "PORT": "y", "API_KEY": "z"}) == []
    s = make_settings(environ={"SPARKFOLD_HOST": "127.0.0.1", "SPARKFOLD_PORT": "9000", "SPARKFOLD_API_KEY": "1"})
    assert (s.host, s.port, s.api_key) == ("127.0.0.1", 9000, True)


def test_a_key_given_as_sparkfold_api_key_points_to_api_key_file():
    """api_key is an on/off switch; a value that looks like the key itself is refused with where a key goes, and is
    never shown."""
    found = load_problems(environ={"SPARKFOLD_API_KEY": "sk-s3cret-value"})
    assert found == [
        "api_key = (hidden) from environment variable SPARKFOLD_API_KEY is not a switch: use true or false (1 or 0); "
        "api_key only turns the key on: to use your own key, put it alone in a file on this machine and set "
        "api_key_file to that file's path (SPARKFOLD_API_KEY_FILE=~/.sparkfold-key), with api_key = true"], found


def test_precedence_data_environment_site_role_file_all_py():
    base = layers("head")
    def value(environ=None, **layer):
        merged = Layers(all={**base.all, **layer.get("all", {})}, group={**base.group, **layer.get("group", {})},
                        site={**base.site, **layer.get("site", {})}, override=layer.get("override", {}))
        return S.load(merged, environ or {}, "/home/nvidia")[0].context
    assert value(all={"context": 4096}) == 4096
    assert value(all={"context": 4096}, group={"context": 8192}) == 8192
    assert value(group={"context": 8192}, site={"context": 16384}) == 16384
    assert value({"CONTEXT": "32768"}, site={"context": 16384}) == 32768
    assert value({"CONTEXT": "32768", "SPARKFOLD_CONTEXT": "65536"}) == 65536
    assert value({"CONTEXT": "32768"}, override={"context": 131072}) == 131072  # --data beats the environment


@pytest.mark.parametrize("environ, where", [
    ({"CONTEXT": "abc"}, "context = 'abc' from environment variable CONTEXT is not a whole number"),
    ({"THINKING": "maybe"}, "thinking = 'maybe' from environment variable THINKING is not a switch"),
    ({"SPARKFOLD_ENGINE_ENV": "[1]"},
     "engine_env = (hidden) from environment variable SPARKFOLD_ENGINE_ENV is not a mapping"),
    ({"SPARKFOLD_EXTRA_SERVE_ARGS": "[1, "}, "from environment variable SPARKFOLD_EXTRA_SERVE_ARGS is not a list"),
    ({"MEMGUARD_GIB": "nan"}, "memguard_gib = 'nan' from environment variable MEMGUARD_GIB is not a finite number"),
])
def test_a_wrong_type_from_the_environment_is_collected(environ, where):
    found = load_problems(environ=environ)
    assert any(where in p for p in found), found


def test_gnu_parallels_variable_is_refused_with_a_way_around_it():
    found = load_problems(environ={"PARALLEL": "-j4 --bar"})
    clash = [p for p in found if "environment variable PARALLEL" in p]
    assert clash and "env -u PARALLEL" in clash[0] and "SPARKFOLD_PARALLEL" in clash[0]
    # and the prefixed name wins over the bare one
    assert not load_problems(environ={"PARALLEL": "-j4 --bar", "SPARKFOLD_PARALLEL": "2"})
    assert not [p for p in load_problems(environ={"SPARKFOLD_CONTEXT": "x"}) if "env -u" in p]


@pytest.mark.parametrize("layer, where", [
    ("override", "thinking = 'maybe' from --data is not a switch"),
    ("site", "thinking = 'maybe' from the site file is not a switch"),
    ("group", "thinking = 'maybe' from group_data (role file) is not a switch"),
    ("all", "thinking = 'maybe' from group_data/all.py is not a switch"),
])
def test_a_wrong_type_from_each_data_source_is_collected(layer, where):
    base = layers("head")
    parts = {"all": dict(base.all), "group": dict(base.group), "site": dict(base.site), "override": {}}
    parts[layer]["thinking"] = "maybe"
    parts[layer]["context"] = "lots"
    s, found = S.load(Layers(**parts), {}, "/home/nvidia")
    assert any(where in p for p in found), found
    assert any("context = 'lots'" in p and "not a whole number" in p for p in found), found
    if layer != "all":  # all.py's default stands in, so the rules can check the rest
        assert s.thinking is True and s.context == 1048576


@pytest.mark.parametrize("layer, where", [
    ("all", "contxt in group_data/all.py is not a sparkfold setting: did you mean context?"),
    ("group", "contxt in a group_data role file is not a sparkfold setting: did you mean context?"),
    ("site", "contxt in the site file's data is not a sparkfold setting: did you mean context?"),
    ("override", "contxt in --data is not a sparkfold setting: did you mean context?"),
])
def test_an_unknown_name_from_each_data_source_is_refused_with_a_suggestion(layer, where):
    base = layers("head")
    parts = {"all": dict(base.all), "group": dict(base.group), "site": dict(base.site), "override": {}}
    parts[layer]["contxt"] = 524288
    found = S.load(Layers(**parts), {}, "/home/nvidia")[1]
    assert any(p.startswith(where) for p in found), found


def test_an_unknown_environment_name_is_refused_with_a_suggestion():
    found = load_problems(environ={"SPARKFOLD_CONTXT": "524288", "SPARKFOLD_SITE": "/x.yaml", "CONTXT": "1"})
    assert found == ["environment variable SPARKFOLD_CONTXT is not a sparkfold setting: did you mean "
                     "SPARKFOLD_CONTEXT?"]


def test_a_setting_missing_from_all_py_is_named():
    base = layers("head")
    all_py = {k: v for k, v in base.all.items() if k != "port"}
    found = S.load(Layers(all=all_py, group=base.group, site=base.site, override={}), {}, "/home/nvidia")[1]
    assert any("group_data/all.py lacks port" in p for p in found), found


def test_a_problem_both_sparks_share_is_listed_once():
    head, worker = make_pair()
    found = S.validate_all(head, worker, "a:22", "b:22",
                           loaded=(["context = 'abc' from environment variable CONTEXT is not a whole number"],
                                   ["context = 'abc' from environment variable CONTEXT is not a whole number",
                                    "contxt in a group_data role file is not a sparkfold setting"]))
    assert found == ["context = 'abc' from environment variable CONTEXT is not a whole number",
                     "worker: contxt in a group_data role file is not a sparkfold setting"]


def test_group_data_is_read_as_pyinfra_reads_it_so_expressions_work(tmp_path):
    shutil.copytree(ROOT / "group_data", tmp_path / "group_data")
    with open(tmp_path / "group_data" / "worker.py", "a") as f:
        f.write("context = 2**19  # an expression, not a literal\n")
    (tmp_path / "inv.py").write_text("head = [('spark-a', {'ssh_hostname': 'spark-a'})]\n"
                                     "worker = [('spark-b', {'ssh_hostname': 'spark-b'})]\n")
    # pyinfra's CLI loader patches gevent into the process: run it in a child of its own
    script = f"""
import json, types
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory
from operations.settings.context import layers_of
from operations.settings import load
with ctx_state.use(types.SimpleNamespace(current_exec_filename=None)):
    inventory = make_inventory({str(tmp_path / "inv.py")!r}, override_data={{"parallel": 2}}, cwd={str(tmp_path)!r})
out = {{}}
for name in ("spark-a", "spark-b"):
    s, found = load(layers_of(inventory.get_host(name)), {{}}, "/home/nvidia")
    out[name] = [s.context, s.parallel, s.role, s.rank, found]
print(json.dumps(out))
"""
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["spark-b"] == [524288, 2, "worker", 1, []]
    assert out["spark-a"] == [1048576, 2, "head", 0, []]


def test_sampling_settings_take_numbers_or_empty_for_the_engines_default():
    s = make_settings(temperature=0, top_p=1, top_k=0)
    assert (s.temperature, s.top_p, s.top_k) == ("0", "1", "0") and S.validate(s) == []
    empty = make_settings(temperature="", top_p="", top_k="")
    assert S.validate(empty) == []


def test_pyinfra_data_strings_are_coerced():
    s = make_settings(context="524288", drafts=0, memguard_gib=3)
    assert s.context == 524288 and s.drafts is False and s.memguard_gib == 3.0


@pytest.mark.parametrize("overrides, fragment", [
    ({"context": 500000}, "context = 500000 must be a power of two"),
    ({"context": 2097152}, "from 4096 to 1048576"),
    ({"pool": 262144}, "pool = 262144 must equal context"),
    ({"parallel": 8}, "parallel = 8 is outside 1..4"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort = 'extreme'"),
    ({"temperature": -0.5}, "temperature = '-0.5' must be a number >= 0"),
    ({"temperature": "hot"}, "temperature = 'hot' must be a number >= 0 (e.g. 1.0; 0 is greedy), or \"\" to leave"),
    ({"temperature": "1e3"}, "temperature = '1e3' must be a number >= 0"),
    ({"top_p": 0}, "top_p = '0' must be a number above 0 and at most 1"),
    ({"top_p": 1.5}, "top_p = '1.5' must be a number above 0 and at most 1"),
    ({"top_k": 2.5}, "top_k = '2.5' must be a whole number >= 0"),
    ({"top_k": "-1"}, "top_k = '-1' must be a whole number >= 0"),
    ({"extra_serve_args": ["--top-k", "40"]}, "--top-k is not allowed: sparkfold sets it from the top_k setting"),
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
    ({"gpu_clock_period_s": 5}, "gpu_clock_period_s = 5 must be a number of seconds from 10 to 3600"),
    ({"gpu_clock_period_s": 7200}, "gpu_clock_period_s = 7200"),
    ({"progress_every_s": 0}, "progress_every_s = 0 must be a whole number of seconds from 1 to 600"),
    ({"progress_every_s": 601}, "progress_every_s = 601 must be a whole number of seconds from 1 to 600"),
    ({"link_measure_s": 0}, "link_measure_s = 0 must be a whole number of seconds from 1 to 60"),
    ({"link_measure_s": 61}, "link_measure_s = 61 must be a whole number of seconds from 1 to 60"),
    ({"nccl_rails": 3}, "nccl_rails = 3"),
    ({"host": "not a host!"}, "host = 'not a host!'"),
    ({"max_tokens": 0}, "max_tokens = 0"),
    ({"log_lines": 0}, "log_lines = 0"),
    ({"status_watch": -1}, "status_watch = -1 is outside 0..3600: 0 prints the table once"),
    ({"api_url": "spark-a:8888"}, "api_url = 'spark-a:8888'"),
    ({"extra_serve_args": [5]}, "extra_serve_args: argument 1 is not a string"),
])
def test_each_rule_names_the_setting(overrides, fragment):
    found = problems(**overrides)
    assert any(fragment in p for p in found), found


@pytest.mark.parametrize("value, where", [(2.5, "from --data"), ("often", "from --data"), ("", "from --data")])
def test_progress_every_s_must_be_a_whole_number_of_seconds(value, where):
    found = load_problems(progress_every_s=value)
    assert any(p.startswith(f"progress_every_s = {value!r} {where} is not a") and "whole number" in p
               for p in found), found
    assert problems(progress_every_s=1) == [] and problems(progress_every_s=600) == []


def test_status_is_quick_unless_asked_for_more():
    # status.py reads facts and the API; the deploy's plan (seconds more) and the refreshes only when asked
    s = make_settings()
    assert (s.status_plan, s.status_watch) == (False, 0)
    s = make_settings(environ={"SPARKFOLD_STATUS_WATCH": "5", "SPARKFOLD_STATUS_PLAN": "1"})
    assert (s.status_plan, s.status_watch) == (True, 5)


def test_a_pinned_prebuilt_image_is_accepted():
    assert S.validate(make_settings(prebuilt_image="ghcr.io/x/y@sha256:" + "a" * 64)) == []


def test_ablit_needs_a_token():
    assert any("HF_TOKEN" in p for p in problems(ablit=True))
    assert S.validate(make_settings(ablit=True, environ={"HF_TOKEN": "hf_x"})) == []


def test_link_rules():
    rails = lambda *addrs: [{"netdev": f"enp1s0f{i}np{i}", "address": a} for i, a in enumerate(addrs)]

    def with_peer(peer_rails, **head):
        return S.validate(make_pair(head=head, worker={"link_rails": peer_rails})[0])
    assert any("not in one subnet" in p for p in with_peer(rails("10.9.0.2/24", "192.168.101.2/24")))
    assert any("both use 192.168.100.1" in p for p in with_peer(rails("192.168.100.1/24", "192.168.101.2/24")))
    assert any("private IPv4" in p for p in problems(link_rails=rails("8.8.8.8/24", "192.168.101.1/24")))
    assert any("private IPv4" in p for p in problems(link_rails=rails("169.254.1.1/16", "192.168.101.1/24")))
    assert any("IPv4 with a prefix" in p for p in problems(link_rails=rails("nonsense", "192.168.101.1/24")))
    assert any("different number of link rails" in p for p in problems(link_rails=rails("192.168.100.1/24")))
    assert any("nccl_rails = 2" in p
               for p in with_peer(rails("192.168.100.2/24"), link_rails=rails("192.168.100.1/24")))
    assert any("no link addresses" in p for p in problems(link_rails=[]))


def rails_of(*addrs):
    return [{"netdev": f"enp1s0f{i}np{i}", "address": a} for i, a in enumerate(addrs)]


def prefix_problems(head_addrs, worker_addrs, **both):
    """The rail problems of both Sparks with these addresses (and `both` as settings of both)."""
    head, worker = make_pair(head={"link_rails": rails_of(*head_addrs), **both},
                             worker={"link_rails": rails_of(*worker_addrs), **both})
    return [p for p in S.validate(head) + S.validate(worker) if "link rail" in p or "link_prefix_min" in p]


@pytest.mark.parametrize("prefix", [1, 4, 8, 12, 15])
def test_a_rail_prefix_wider_than_16_is_refused_naming_link_prefix_min(prefix):
    found = prefix_problems([f"10.0.0.1/{prefix}"], [f"10.0.0.2/{prefix}"], nccl_rails=1)
    assert found and all(f"/{prefix} prefix would route {2 ** (32 - prefix)} addresses over the cable: use /16 to "
                         "/31" in p for p in found), found
    assert ("link_prefix_min allows /8 at the widest" if prefix < 8 else f"set link_prefix_min = {prefix}") in found[0]


def test_a_rail_prefix_of_32_is_refused_with_the_reason_and_the_sparks_own_example():
    found = [p for p in prefix_problems(["10.0.0.1/32"], ["10.0.0.0/32"], nccl_rails=1) if "/32 prefix" in p]
    assert found == [
        "head link rail 0: 10.0.0.1/32: its /32 prefix holds this one address, leaving none for the other end of the "
        "cable: use /31 (a point-to-point pair, RFC 3021) or wider, e.g. 192.168.100.1/24",
        "worker link rail 0: 10.0.0.0/32: its /32 prefix holds this one address, leaving none for the other end of the "
        "cable: use /31 (a point-to-point pair, RFC 3021) or wider, e.g. 192.168.100.2/24"], found


@pytest.mark.parametrize("head, worker", [("10.0.0.1/16", "10.0.0.2/16"), ("10.0.0.1/24", "10.0.0.2/24"),
                                          ("10.0.0.1/30", "10.0.0.2/30"),
                                          # RFC 3021: both addresses of a /31 are hosts, either way round
                                          ("10.0.0.0/31", "10.0.0.1/31"), ("192.168.100.1/31", "192.168.100.0/31")])
def test_rail_prefixes_from_16_to_31_pass_by_default(head, worker):
    assert prefix_problems([head], [worker], nccl_rails=1) == []


def test_the_two_ends_of_a_31_must_be_its_two_addresses():
    assert prefix_problems(["10.0.0.1/31"], ["10.0.0.2/31"], nccl_rails=1) == [
        "link rail 0: 10.0.0.1/31 and the peer's 10.0.0.2/31 are not in one subnet: use the same subnet on both ends "
        "of a rail", "link rail 0: 10.0.0.2/31 and the peer's 10.0.0.1/31 are not in one subnet: use the same subnet "
        "on both ends of a rail"]


@pytest.mark.parametrize("worker, end", [("10.0.0.0/24", "first"), ("10.0.0.255/24", "last"), ("10.0.0.3/30", "last")])
def test_a_wider_subnets_own_and_broadcast_address_are_refused(worker, end):
    network = worker.rpartition(".")[0] + (".0/24" if worker.endswith("/24") else ".0/30")
    assert prefix_problems([f"10.0.0.1/{worker[-2:]}"], [worker], nccl_rails=1) == [
        f"worker link rail 0: {worker} is the {end} address of {network}, which is no host's (the subnet's own or its "
        "broadcast): use one between them, e.g. 192.168.100.2/24"]


def test_a_workers_bad_rail_address_is_shown_a_workers_example():
    found = prefix_problems(["192.168.100.1/24", "192.168.101.1/24"], ["192.168.100.2/24", "nonsense"])
    assert found == ["worker link rail 1: address 'nonsense' must be IPv4 with a prefix, e.g. 192.168.101.2/24"], found


def test_link_prefix_min_widens_the_range_and_the_link_step_warns(caplog):
    assert prefix_problems(["10.0.0.1/12"], ["10.0.0.2/12"], nccl_rails=1, link_prefix_min=12) == []
    assert prefix_problems(["10.0.0.1/8"], ["10.0.0.2/8"], nccl_rails=1, link_prefix_min=12)
    head, _ = make_pair(head={"link_rails": rails_of("10.0.0.1/12"), "link_prefix_min": 12, "nccl_rails": 1},
                        worker={"link_rails": rails_of("10.0.0.2/12"), "link_prefix_min": 12, "nccl_rails": 1})
    from operations.settings.rules import rail_warnings
    notes = rail_warnings(head.link_rails)
    assert len(notes) == 1, notes
    assert "enp1s0f0np0 has 10.0.0.1/12: its /12 subnet (1048576 addresses) is routed over the cable" in notes[0]
    assert rail_warnings(make_settings().link_rails) == []
    # the link step prints it while the deploy is planned, naming the Spark
    from harness import FakeHost
    from pyinfra.context import ctx_host

    from operations import link
    calls = []
    ops = ("rails_safe", "netplan_applies_settled", "netplan_link", "link_addresses", "link_ping", "roce_gids",
           "link_recorded")
    with pytest.MonkeyPatch.context() as mp, ctx_host.use(FakeHost({}, name="spark-a")), \
            caplog.at_level("WARNING", logger="pyinfra"):
        for op in ops:
            mp.setattr(link, op, lambda _op=op, **kw: calls.append(_op))
        link.link._inner(head)
    assert f"spark-a: warning: link_prefix_min: {notes[0]}" in caplog.text and calls == list(ops)


@pytest.mark.parametrize("value", [4, 32])
def test_link_prefix_min_has_a_range(value):
    assert any(f"link_prefix_min = {value} is outside 8..31" in p for p in problems(link_prefix_min=value))


def test_a_wide_rail_subnet_must_stay_private():
    found = prefix_problems(["192.168.100.1/8"], ["192.168.100.2/8"], nccl_rails=1, link_prefix_min=8)
    assert any("its subnet 192.0.0.0/8 reaches beyond the private ranges" in p for p in found), found


def test_the_site_file_and_the_settings_agree_on_rail_prefixes(tmp_path):
    """The site file refuses exactly the prefixes no link_prefix_min allows; the settings, at the widest
    link_prefix_min, refuse the same ones."""
    from operations.settings.site import SiteError, read_site
    for prefix in range(33):
        site = tmp_path / f"sparks-{prefix}.yaml"
        site.write_text(f"head: {{ssh: a, link: [{{netdev: eth1, address: 10.0.0.1/{prefix}}}]}}\n"
                        f"worker: {{ssh: b, link: [{{netdev: eth1, address: 10.0.0.2/{prefix}}}]}}\n")
        try:
            read_site(site)
            site_ok = True
        except SiteError as exc:
            site_ok = False
            assert f"head.link[0].address = '10.0.0.1/{prefix}': its /{prefix} prefix" in str(exc)
        found = [p for p in prefix_problems([f"10.0.0.1/{prefix}"], [f"10.0.0.2/{prefix}"], nccl_rails=1,
                                            link_prefix_min=8) if "prefix" in p]
        assert site_ok == (found == []), (prefix, found)
        assert site_ok == (8 <= prefix <= 31), prefix


def test_pair_rules():
    head, worker = make_pair(worker={"context": 524288})
    found = S.validate_pair(head, worker)
    assert any(p.startswith("context differs between the head (1048576) and the worker (524288)") for p in found)
    head, worker = make_pair()
    assert any("same machine" in p for p in S.validate_all(head, worker, "a:22", "a:22"))
    assert S.validate_all(head, worker, "a:22", "b:22") == []
