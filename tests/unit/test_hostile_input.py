"""Hostile input: every setting and site field that reaches a shell, a file or a docker argument is refused with a
message naming it, and the strangest accepted values stay one argument and one line wherever they are used."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from settings_factory import load_one, make_pair, make_settings

from operations import gpu_clock, link, memguard, nfs, supervise
from operations.launch_spec import rank_spec
from operations.settings import validate
from operations.settings.shapes import ITEM_SHAPES, SHAPES
from operations.site import SiteError, read_site

HOSTILE = ["x\ny", "x'y", 'x"y', "x;id", "$(id)", "`id`", "../x", "/a/../b", "-x", "x y", "x\ty", "x\x00y", ""]
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
           "extra_serve_args": ["--top-k", "20", "a b 'c' \"d\" $(e) `f`;g"],
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
        "supervisor unit": supervise.render_unit(head.container_name, head.worker_link_ssh, head.ssh_user, 3, 60, 30),
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


# --- files sparkfold owns: a foreign file at the path is refused, never overwritten -------------------------------

def test_a_foreign_file_at_an_owned_path_is_refused_both_phases(caplog):
    from harness import run_op, with_args

    from operations.facts.files import FileText
    from operations.util.commands import MANAGED_HEADER
    from operations.util.owned import owned_or_absent

    path = "/etc/netplan/50-cloud-init.yaml"

    def run(text, executing):
        return run_op(owned_or_absent, {FileText: with_args({f"path={path}": text})}, executing=executing,
                      path=path)

    cmds, host = run(None, True)
    assert cmds == [] and host.noops  # absent: free to write
    cmds, host = run(MANAGED_HEADER + "\nnetwork: {}\n", True)
    assert cmds == [] and host.noops  # ours
    cmds, _ = run("network:\n  version: 2\n", True)
    assert len(cmds) == 1 and "exit 1" in cmds[0] and f"{path} exists and was not written by sparkfold" in cmds[0]
    with caplog.at_level("WARNING", logger="pyinfra"):
        cmds, _ = run("network:\n  version: 2\n", False)
    assert cmds == [] and "will fail: a file sparkfold would write: " + path in caplog.text
