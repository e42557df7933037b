"""Hostile input: every setting and site field that reaches a shell, a file or a docker argument is refused with a
message naming it, and the strangest accepted values stay one argument and one line wherever they are used."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from settings_factory import load_one, make_pair, make_settings

from operations import gpu_clock, link, memguard, nfs, supervise
from operations.rank.spec import rank0_argv, rank_spec
from operations.settings import SETTING_NAMES, validate, validate_pair
from operations.settings.rules import OWN_SERVE_FLAGS
from operations.settings.shapes import ITEM_SHAPES, SHAPES
from operations.settings.site import SiteError, read_site

# line breaks last: `$` matches before a final "\n", and "\u2028" / "\r" end a line for YAML and some readers
LINE_BREAKS = ["x\n", "x\u2028", "x\r"]
HOSTILE = ["x\ny", "x'y", 'x"y', "x;id", "$(id)", "`id`", "../x", "/a/../b", "-x", "x y", "x\ty", "x\x00y", "",
           *LINE_BREAKS]
# settings for which the empty string means "the default"
EMPTY_OK = {"hf_python", "hf_endpoint", "api_url", "nccl_debug"}
TEXT_SETTINGS = sorted(n for n, _ in SHAPES.items() if isinstance(getattr(make_settings(), n), str))


def refused(name: str, value) -> list[str]:
    return [p for p in validate(make_settings("head", **{name: value})) if name in p]


@pytest.mark.parametrize("name", TEXT_SETTINGS)
@pytest.mark.parametrize("value", HOSTILE)
def test_each_text_setting_refuses_each_hostile_value(name, value):
    if value == "" and name in EMPTY_OK:
        pytest.skip(f"{name} = '' is its documented default")
    if name in ("hf_cache", "data_dir", "state_dir") and value == "":
        pytest.skip("an empty path means the default under the ssh user's home")
    assert refused(name, value), f"{name} = {value!r} was accepted"


@pytest.mark.parametrize("name", sorted(ITEM_SHAPES))
@pytest.mark.parametrize("value", [v for v in HOSTILE if v not in ("-x", "x y")] + [5])
def test_each_list_setting_refuses_a_hostile_item(name, value):
    if name == "extra_serve_args" and value in ("x'y", 'x"y', "x;id", "$(id)", "`id`", "../x", "/a/../b"):
        pytest.skip("a serve argument is passed as one argv word, never through a shell")
    assert refused(name, [value]), f"{name} = [{value!r}] was accepted"


@pytest.mark.parametrize("overrides, fragment", [
    ({"port": 22}, "port = 22 is the port of ssh"),
    ({"master_port": 2049}, "master_port = 2049 is the port of NFS"),
    ({"port": 111}, "port = 111 is the port of rpcbind"),
    ({"oom_score_adj": 5000}, "oom_score_adj = 5000"),
    ({"disk_need_gb": float("inf")}, "disk_need_gb = inf from --data is not a finite whole number"),
    ({"disk_need_gb": 10**9}, "disk_need_gb = 1000000000 must be a number of GB"),
    ({"min_avail_gib": float("nan")}, "min_avail_gib = nan"),
    ({"docker_ulimits": ["memlokc=-1:-1"]}, "names no limit docker knows"),
    ({"engine_env": {"TF_DS_X": "1\nEVIL=1"}}, "engine_env: 'TF_DS_X'"),
    ({"engine_env": {"TENSORFOLD_API_KEY": "s3cret"}}, "TENSORFOLD_API_KEY is not allowed"),
    ({"extra_serve_args": ["--api-key", "s3cret"]}, "extra_serve_args: --api-key is not allowed"),
    ({"extra_serve_args": ["--api-key-file=/k"]}, "extra_serve_args: --api-key-file is not allowed"),
    ({"link_netplan_file": "/etc/netplan/sub/x.yaml"}, "must be a .yaml file in /etc/netplan/ (directly"),
    ({"nfs_exports_file": "/etc/exports.d/../exports"}, "nfs_exports_file"),
    ({"nfs_exports_file": "/etc/exports.d/a b.exports"}, "nfs_exports_file"),
    ({"hf_cache": "/data/hf,rw,no_root_squash"}, "hf_cache = '/data/hf,rw,no_root_squash' must be"),
    ({"nvidia_smi_path": "nvidia-smi; id"}, "nvidia_smi_path"),
    ({"container_name": "x\nExecStartPre=/bin/id"}, "container_name"),
    ({"model_revision": "main..x"}, "model_revision"),
    ({"hf_endpoint": "file:///etc/passwd"}, "hf_endpoint"),
    ({"nfs_options": "ro,hard addr=1.2.3.4"}, "nfs_options"),
])
def test_specific_hostile_values_are_refused_naming_the_setting(overrides, fragment):
    found = load_one("head", **overrides)[1] + validate(make_settings("head", **overrides))
    assert any(fragment in p for p in found), found


def site(tmp_path: Path, head: str, worker: str = "{ssh: b, link: [{netdev: eth1, address: 10.0.0.2/24}]}"):
    path = tmp_path / "sparks.yaml"
    path.write_text(f"head: {head}\nworker: {worker}\n")
    return path


@pytest.mark.parametrize("head, fragment", [
    ('{ssh: "a;id", link: [{netdev: eth1, address: 10.0.0.1/24}]}', "head.ssh = 'a;id'"),
    ('{ssh: "-oProxyCommand=id", link: [{netdev: eth1, address: 10.0.0.1/24}]}', "head.ssh = '-oProxyCommand=id'"),
    ('{ssh: a, ssh_user: "root\\nx", link: [{netdev: eth1, address: 10.0.0.1/24}]}', "head.ssh_user"),
    ('{ssh: a, ssh_port: 70000, link: [{netdev: eth1, address: 10.0.0.1/24}]}', "head.ssh_port"),
    ('{ssh: a, link: [{netdev: "eth1; id", address: 10.0.0.1/24}]}', "head.link[0].netdev"),
    ('{ssh: a, link: [{netdev: "../../x", address: 10.0.0.1/24}]}', "head.link[0].netdev"),
    ('{ssh: a, link: [{netdev: eth1, address: "10.0.0.1/24\\n- x"}]}', "head.link[0].address"),
    ('{ssh: a, link: [{netdev: eth1, address: 10.0.0.1/24, ibdev: "$(id)"}]}', "head.link[0].ibdev"),
    ('{ssh: a, reach_from_head: "b c", link: [{netdev: eth1, address: 10.0.0.1/24}]}', "head.reach_from_head"),
])
def test_hostile_site_fields_are_refused(tmp_path, head, fragment):
    with pytest.raises(SiteError) as exc:
        read_site(site(tmp_path, head))
    assert fragment in str(exc.value)


# --- the strangest values that are accepted stay one argument / one line ----------------------------------------

STRANGE = {"hf_cache": "/data/hf+x@y/c-d_e.f", "data_dir": "/d+x@y/sf-1.2_3", "state_dir": "/s@t/x+y",
           "container_name": "a.b-c_d", "nfs_volume": "v.1-x_y", "served_name": "org/model:v1.2-x_y",
           "nvidia_smi_path": "/opt/n+v@x/nvidia-smi", "nccl_debug": "INFO",
           "extra_serve_args": ["--min-p", "0.05", "a b 'c' \"d\" $(e) `f`;g"],
           "engine_env": {"TF_DS_X": "a b 'c' $(d) `e`;f"}}


def test_strange_accepted_values_pass_the_rules():
    head, worker = make_pair(head=STRANGE, worker=STRANGE)
    assert validate(head) == [] and validate(worker) == []


def one_word_on_one_line(text: str, value: str) -> bool:
    """`value` appears in `text`, and wherever it does it lies within one line and within one shell word of that line
    (a word that is itself a quoted `sh -c` script is split again)."""
    lines = [line for line in text.splitlines() if value in line]
    if value not in text or not lines or text.count(value) != sum(line.count(value) for line in lines):
        return False  # the value is missing or spans a line break

    def in_one_word(line: str) -> bool:
        words = shlex.split(line)
        return sum(w.count(value) for w in words) == line.count(value) or any(
            " " in w and value in w and in_one_word(w) for w in words)
    return all(in_one_word(line) for line in lines)


@pytest.mark.parametrize("text, value, ok", [
    ("ExecStart=/bin/x --name a.b\n", "a.b", True),
    ("ExecStart=/bin/sh -c 'x /opt/a/n -L'\n", "/opt/a/n", True),
    ("ExecStart=/bin/x --name 'a b'\n", "a b", True),
    ("ExecStart=/bin/x --name a b\n", "a b", False),  # unquoted: two words
    ("ExecStart=/bin/x --name a\nb\n", "a\nb", False),  # split over two lines
    ("ExecStart=/bin/x\n", "zz", False),  # missing
])
def test_the_one_word_check_can_fail(text, value, ok):
    assert one_word_on_one_line(text, value) is ok


def test_strange_values_stay_one_line_in_every_owned_file():
    head, worker = make_pair(head=STRANGE, worker=STRANGE)
    files = {
        "gpu unit": gpu_clock.render_unit(head.gpu_clock_mhz, head.nvidia_smi_path, head.gpu_clock_period_s),
        "gpu timer": gpu_clock.render_timer(head.gpu_clock_mhz, head.gpu_clock_period_s),
        "memguard unit": memguard.render_unit(head.container_name, head.memguard_gib),
        "supervisor unit": supervise.render_unit(head.container_name, head.worker_link_ssh, head.ssh_user, 3, 60, 30,
                                                 head.min_avail_gib),
        "exports": nfs.render_exports(head.hf_cache, ["192.168.100.2"], "ro"),
        "netplan": link.render_netplan([dict(r) for r in head.link_rails], head.link_mtu),
    }
    uses = {"gpu unit": [head.nvidia_smi_path], "memguard unit": [head.container_name],
            "supervisor unit": [head.container_name, head.worker_link_ssh], "exports": [head.hf_cache],
            "netplan": [r["netdev"] for r in head.link_rails]}
    for what, values in uses.items():
        for value in values:
            assert one_word_on_one_line(files[what], value), (what, value, files[what])
    exports = [line for line in files["exports"].splitlines() if line and not line.startswith("#")]
    assert len(exports) == 1 and exports[0].split()[0].startswith(head.hf_cache), exports
    exec_lines = [line for line in files["memguard unit"].splitlines() if line.startswith("ExecStart=")]
    assert len(exec_lines) == 1 and head.container_name in exec_lines[0]


def test_strange_values_stay_one_word_each_in_the_docker_run_line():
    head, _ = make_pair(head=STRANGE)
    rails = [{"netdev": "enp1s0f0np0", "ibdev": "rocep1s0f0", "address": "192.168.100.1/24", "gid_index": 3,
              "mtu": 9000}]
    spec = rank_spec(head.replace(nccl_rails=1), "sparkfold/dsv41-tf:abc", rails, (head.hf_cache, "/root/x"),
                     {"serve": {"flags": {}}}, rank_folder=f"{head.layout.rank_cache}/c/rank0")
    argv = spec.run_argv()
    assert shlex.split(" ".join(shlex.quote(w) for w in argv)) == argv  # quoting keeps every word whole
    assert "a b 'c' \"d\" $(e) `f`;g" in argv  # the odd serve argument is one argv word
    assert "TF_DS_X=a b 'c' $(d) `e`;f" in argv
    assert all("\n" not in w for w in argv)


# --- a trailing line break, on every setting and site field ---------------------------------------------------------

DEFAULTS = make_settings()
STRING_SETTINGS = sorted(n for n in SETTING_NAMES if isinstance(getattr(DEFAULTS, n), str))
LIST_SETTINGS = sorted(n for n in SETTING_NAMES if isinstance(getattr(DEFAULTS, n), list))


def _good(name: str) -> str:
    value = getattr(DEFAULTS, name)
    return (value[0] if value else "x") if isinstance(value, list) else value or "x"


@pytest.mark.parametrize("name", STRING_SETTINGS)
@pytest.mark.parametrize("brk", ["\n", "\u2028", "\r"])
def test_every_string_setting_refuses_a_trailing_line_break(name, brk):
    value = _good(name) + brk
    assert refused(name, value), f"{name} = {value!r} was accepted"


@pytest.mark.parametrize("name", LIST_SETTINGS)
@pytest.mark.parametrize("brk", ["\n", "\u2028", "\r"])
def test_every_list_setting_refuses_an_item_with_a_trailing_line_break(name, brk):
    item = _good(name) + brk
    assert refused(name, [item]), f"{name} = [{item!r}] was accepted"


@pytest.mark.parametrize("overrides, fragment", [
    ({"tf_ref": "abcdef0\n"}, "tf_ref"),
    ({"tools_ref": "abcdef0\n"}, "tools_ref"),
    ({"zig_sha256": "a" * 64 + "\n"}, "zig_sha256"),
    ({"docker_ulimits": ["nofile=1024\n"]}, "docker_ulimits"),
    ({"docker_ulimits": ["nofile=１０２４"]}, "docker_ulimits"),  # full-width digits are \d, not [0-9]
    ({"engine_env": {"TF_DS_X\n": "1"}}, "engine_env"),
    ({"engram_files": ["a.bin\n"]}, "engram_files"),
    ({"allowed_arch": ["aarch64\n"]}, "allowed_arch"),
    ({"host": "127.0.0.1\n"}, "host"),
])
def test_a_trailing_newline_is_refused(overrides, fragment):
    assert any(fragment in p for p in validate(make_settings("head", **overrides)))


SITE_FIELDS = {  # field -> the site-file text for the head with {} where the value goes, and a good value
    "ssh": ("{{ssh: {}, link: [{{netdev: eth1, address: 10.0.0.1/24}}]}}", "a"),
    "reach_from_head": ("{{ssh: a, reach_from_head: {}, link: [{{netdev: eth1, address: 10.0.0.1/24}}]}}", "a"),
    "name": ("{{ssh: a, name: {}, link: [{{netdev: eth1, address: 10.0.0.1/24}}]}}", "a"),
    "ssh_user": ("{{ssh: a, ssh_user: {}, link: [{{netdev: eth1, address: 10.0.0.1/24}}]}}", "nvidia"),
    "ssh_key": ("{{ssh: a, ssh_key: {}, link: [{{netdev: eth1, address: 10.0.0.1/24}}]}}", "~/.ssh/k"),
    "link[0].netdev": ("{{ssh: a, link: [{{netdev: {}, address: 10.0.0.1/24}}]}}", "enp1s0f0np0"),
    "link[0].address": ("{{ssh: a, link: [{{netdev: eth1, address: {}}}]}}", "10.0.0.1/24"),
    "link[0].ibdev": ("{{ssh: a, link: [{{netdev: eth1, address: 10.0.0.1/24, ibdev: {}}}]}}", "rocep1s0f0"),
}


@pytest.mark.parametrize("field", sorted(SITE_FIELDS))
@pytest.mark.parametrize("brk", ["\n", "\u2028", "\r"])
def test_every_site_field_refuses_a_trailing_line_break(tmp_path, field, brk):
    text, good = SITE_FIELDS[field]
    read_site(site(tmp_path, text.format(json.dumps(good))))  # the good value is accepted
    with pytest.raises(SiteError) as exc:
        read_site(site(tmp_path, text.format(json.dumps(good + brk))))
    assert f"head.{field}" in str(exc.value)


@pytest.mark.parametrize("netdev", ["..", ".", "-x", ".hidden"])
def test_site_netdev_dots_and_leading_dash_are_refused(tmp_path, netdev):
    with pytest.raises(SiteError, match=r"head\.link\[0\]\.netdev"):
        read_site(site(tmp_path, f'{{ssh: a, link: [{{netdev: "{netdev}", address: 10.0.0.1/24}}]}}'))


# --- per-host fields from the site file's data: or --data -----------------------------------------------------------

@pytest.mark.parametrize("overrides, fragment", [
    ({"ssh_port": "abc"}, "ssh_port = 'abc' for head from --data must be a port number"),
    ({"ssh_port": 70000}, "ssh_port = 70000 must be a port number"),
    ({"ssh_port": 0}, "ssh_port = 0 must be a port number"),
    ({"ssh_user": "root\n"}, "ssh_user = 'root\\n' must be a login name"),
    ({"ssh_user": "-oProxyCommand=id"}, "ssh_user"),
    ({"reach_from_head": "b c"}, "reach_from_head = 'b c' must be a host name"),
    ({"ssh_hostname": "a;id"}, "ssh_hostname must be a host name"),
    ({"link_rails": [{"netdev": "eth1\n", "address": "192.168.100.1/24"}]}, "netdev 'eth1\\n' is not an interface"),
    ({"link_rails": [{"netdev": "..", "address": "192.168.100.1/24"}]}, "netdev '..' is not an interface"),
    ({"link_rails": [{"netdev": "eth1", "address": "192.168.100.1/24", "ibdev": "$(id)"}]}, "ibdev '$(id)'"),
    ({"link_rails": [{"netdev": "eth1", "address": "192.168.100.1/24\n"}]}, "address '192.168.100.1/24\\n'"),
])
def test_per_host_fields_from_data_are_validated_naming_field_and_host(overrides, fragment):
    s, loaded = load_one("head", **overrides)  # no crash on a port that is no number
    found = loaded + validate(make_settings("head", **overrides))
    hits = [p for p in found if fragment in p]
    assert hits and all("head" in p for p in hits), found


# --- the NFS export carries hf_cache/hub only ------------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [("state_dir", "/data/hf/hub"), ("state_dir", "/data/hf/hub/s"),
                                         ("data_dir", "/data/hf/hub/models--x/d")])
def test_state_or_data_dir_inside_the_exported_hub_is_refused(name, value):
    found = [p for p in validate(make_settings("head", hf_cache="/data/hf", **{name: value})) if "hub" in p]
    assert found and f"{name} = " in found[0] and "hf_cache" in found[0] and "NFS" in found[0], found


def test_state_dir_beside_the_hub_is_fine():
    s = make_settings("head", hf_cache="/data/hf", state_dir="/data/hf/state", data_dir="/data/hubx")
    assert not [p for p in validate(s) if "hub folder" in p]


@pytest.mark.parametrize("name", ["hf_cache", "data_dir", "state_dir"])
def test_root_is_no_folder_for_sparkfold(name):
    assert refused(name, "/")


# each path setting with a value it accepts
GOOD_PATHS = {"hf_cache": "/srv/hf", "data_dir": "/srv/sf/data", "state_dir": "/srv/sf/state",
              "link_netplan_file": "/etc/netplan/60-x.yaml", "nfs_exports_file": "/etc/exports.d/x.exports",
              "nvidia_smi_path": "/usr/bin/nvidia-smi", "hf_python": "/opt/hf/bin/python3",
              "engine_context": "zig/ctx"}


@pytest.mark.parametrize("name", sorted(GOOD_PATHS))
@pytest.mark.parametrize("where", ["lead", "middle"])
def test_a_doubled_slash_in_a_path_setting_is_refused_with_the_single_slash_spelling(name, where):
    good = GOOD_PATHS[name]
    assert not refused(name, good)
    value = "/" + good if where == "lead" and good.startswith("/") else good[::-1].replace("/", "//", 1)[::-1]
    found = refused(name, value)
    assert any(f"{name} = {value!r} holds //: write it with single slashes, {good!r}" in p for p in found), found


@pytest.mark.parametrize("name", ["hf_cache", "data_dir", "state_dir"])
def test_a_root_of_slashes_is_not_a_folder_for_sparkfold(name):
    found = refused(name, "//")
    assert found and "single slashes" in found[0] and "not / itself" in found[0], found


@pytest.mark.parametrize("hf_cache, state_dir", [("//srv/hf", "/srv/hf/hub/state"), ("/srv/hf", "//srv/hf/hub/s"),
                                                 ("/srv/hf", "/srv/hf/./hub/s")])
def test_the_hub_containment_check_reads_each_spelling_of_a_path(hf_cache, state_dir):
    from operations.settings.rules import _outside_hub
    s = make_settings("head", hf_cache=hf_cache, state_dir=state_dir)
    found = _outside_hub(s)
    assert found and found[0].startswith(f"state_dir = {state_dir!r} is inside hf_cache's hub folder (/srv/hf/hub)")


def test_the_containment_check_normalises_both_paths():
    from operations.settings.rules import _inside
    assert _inside("/srv/hf/hub/state", "//srv/hf/hub") and _inside("//srv/hf/hub/x", "/srv/hf/hub/")
    assert _inside("/srv/hf/hub", "/srv/hf/hub/") and _inside("/srv/hf/hub/", "/srv/hf/hub")
    assert not _inside("/srv/hf/hubx", "//srv/hf/hub") and not _inside("/srv/hf", "/srv/hf/hub/")


# --- extra_serve_args cannot re-set what sparkfold sets ----------------------------------------------------------

@pytest.mark.parametrize("args, setting", [
    (["--host", "0.0.0.0"], "host"), (["--host=0.0.0.0"], "host"), (["--port", "22"], "port"),
    (["--port=2049"], "port"), (["--master-port", "111"], "master_port"), (["--name=x"], "served_name"),
    (["--context", "4096"], "context"), (["--no-drafts"], "drafts"), (["--backend=cpu"], "engine_image"),
])
def test_serve_flags_sparkfold_sets_are_refused_with_their_setting(args, setting):
    flag = args[0].split("=")[0]
    found = [p for p in validate(make_settings("head", extra_serve_args=args)) if "extra_serve_args" in p]
    assert found == [f"extra_serve_args: {flag} is not allowed: sparkfold sets it from the {setting} setting; set "
                     "that instead"] if setting != "engine_image" else found and f"{flag} is not allowed" in found[0]


def test_every_flag_rank0_gets_from_sparkfold_is_reserved():
    s = make_settings("head", api_key=True, reasoning_effort="high", drafts=False)
    argv = rank0_argv(s, "/snap", {"serve": {"flags": {"--chat-template": {}}}})
    assert {w for w in argv if w.startswith("--")} <= set(OWN_SERVE_FLAGS)
    argv = rank0_argv(s.replace(thinking=not s.thinking, drafts=True), "/snap", None)
    assert {w for w in argv if w.startswith("--")} <= set(OWN_SERVE_FLAGS)


# --- refusals never show a secret --------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [
    {"hf_endpoint": "https://user:hf_SECRET@hf.co"},
    {"api_url": "http://admin:SECRET@spark-a:8888"},
    {"api_url": "admin:SECRET@spark-a:8888"},
    {"tf_repo": "https://tok:SECRET@github.com/x/y"},
    {"extra_serve_args": ["--top-k", "SECRET\n"]},
    {"extra_serve_args": ["--foo=SECRET\n"]},
    {"extra_serve_args": ["--api-key", "SECRET"]},
    {"extra_serve_args": ["--api-key=SECRET"]},
    {"extra_serve_args": ["--host=SECRET"]},
    {"extra_serve_args": "--top-k 'SECRET"},  # no list: shlex cannot split it
    {"engine_env": '{"TF_DS_X": "SECRET"'},  # no mapping
])
def test_refusals_never_show_a_secret(overrides):
    found = load_one("head", **overrides)[1] + validate(make_settings("head", **overrides))
    assert found and not [p for p in found if "SECRET" in p], found


def test_a_pair_difference_never_shows_a_secret():
    head, worker = make_pair(head={"engine_env": {"TF_DS_X": "SECRET1"}, "tf_repo": "https://u:SECRET2@h/x"})
    found = validate_pair(head, worker)
    assert any(p.startswith("engine_env differs") for p in found) and any("tf_repo" in p for p in found)
    assert not [p for p in found if "SECRET" in p], found


# --- minor shapes ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["hf_endpoint", "api_url", "zig_url"])
@pytest.mark.parametrize("port", ["0", "65536", "99999"])
def test_url_ports_out_of_range_are_refused(name, port):
    assert refused(name, f"http://h:{port}/x")


def test_a_url_port_in_range_is_accepted():
    assert not refused("hf_endpoint", "http://h:65535/x")


def test_a_ulimit_set_twice_is_refused():
    found = validate(make_settings("head", docker_ulimits=["nofile=1:1", "memlock=-1:-1", "nofile=2:2"]))
    assert "docker_ulimits: nofile is set twice: keep one nofile=... entry" in found
