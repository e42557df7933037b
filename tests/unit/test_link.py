"""CX7 link: facts parse real-looking output, the netplan op converges, the checks fail with the fix."""

from __future__ import annotations

import json
import os
import subprocess
import types
from pathlib import Path

import pytest
import yaml
from core_facts import merged, remote_file, run_put
from harness import parse_fact, refused, run_op, with_args

from operations import link
from operations.facts.network import (
    ZERO_GID,
    DefaultRouteDevice,
    IpAddresses,
    LinkRecord,
    NetplanState,
    PingOk,
    RailPings,
    RoceDevices,
)
from operations.util import MANAGED_HEADER

FIX = Path(__file__).parent / "fixtures" / "link"
OWN = "/etc/netplan/60-sparkfold-cx7.yaml"
RAILS = [{"netdev": "enp1s0f0np0", "address": "192.168.100.1/24", "ibdev": None},
         {"netdev": "enP2p1s0f0np0", "address": "192.168.101.1/24", "ibdev": None}]
PEER = [{"netdev": "enp1s0f0np0", "address": "192.168.100.2/24", "ibdev": None},
        {"netdev": "enP2p1s0f0np0", "address": "192.168.101.2/24", "ibdev": None}]


def fixture(name):
    return (FIX / name).read_text()


def addrs():
    return parse_fact(IpAddresses, fixture("ip-addr.json"))


def roce():
    return parse_fact(RoceDevices, fixture("roce-sysfs.txt"))


def run_sh(command) -> list[str]:
    text = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
    return subprocess.run(["sh", "-c", text], capture_output=True, text=True, check=True).stdout.splitlines()


# --- facts --------------------------------------------------------------------------------------------------

def test_ip_addresses_parses_ip_j_addr():
    a = addrs()
    assert a["enp1s0f0np0"] == {"mtu": 9000, "operstate": "UP", "ipv4": ["192.168.100.1/24"], "ipv6": []}
    assert a["enP2p1s0f0np0"]["ipv4"] == ["192.168.101.1/24"]  # the empty {} entry is skipped
    assert a["enp1s0f1np1"] == {"mtu": 1500, "operstate": "DOWN", "ipv4": [], "ipv6": []}
    assert a["enP7s7"]["ipv4"] == ["10.0.0.21/24"] and a["enP7s7"]["ipv6"] == ["fe80::4ebb:47ff:fe2a:1001/64"]
    assert parse_fact(IpAddresses, "not json") == {}
    assert parse_fact(IpAddresses, "") == {}


def test_default_route_device():
    assert parse_fact(DefaultRouteDevice, fixture("ip-route-default.json")) == "enP7s7"
    assert parse_fact(DefaultRouteDevice, "[]") is None


def test_default_route_devices_of_both_families():
    from operations.facts.network import DefaultRouteDevices
    v6 = '[{"dst":"default","gateway":"fe80::1","dev":"enP8s8","protocol":"ra","metric":1024,"pref":"medium"}]'
    assert parse_fact(DefaultRouteDevices, fixture("ip-route-default.json") + "\n\n" + v6) == ["enP7s7", "enP8s8"]
    assert parse_fact(DefaultRouteDevices, "[]\n\n[]") == [] and parse_fact(DefaultRouteDevices, "junk") == []


def netplan_state(etc: Path, run: Path, applies: Path) -> dict:
    fact = NetplanState()
    return fact.process(run_sh(fact.command(directory=str(etc), stage_dir=str(run), applies_dir=str(applies))))


def test_netplan_state_reads_the_netplan_folder_the_stage_folder_and_the_applies(tmp_path):
    etc, run, applies = tmp_path / "etc", tmp_path / "run", tmp_path / "applies"
    assert netplan_state(etc, run, applies) == {"files": {}, "staged": {}, "undecided": {}}  # none of them exist
    for folder in (etc, run, applies):
        folder.mkdir()
    assert netplan_state(etc, run, applies) == {"files": {}, "staged": {}, "undecided": {}}  # empty: no glob text
    (etc / "40-cx7.yaml").write_text(fixture("40-cx7.yaml"))
    (etc / "40-cx7.yaml").chmod(0o600)
    (etc / "empty.yaml").write_text("")
    (etc / "notes.txt").write_text("ignored")
    (run / "40-cx7.yaml").write_text("network: {version: 2}\n")
    (run / "40-cx7.yaml").chmod(0o600)

    def apply(name, decided=None, *done):
        folder = applies / name
        folder.mkdir()
        if decided == "old":  # an older sparkfold claimed with a folder
            (folder / "decided").mkdir()
        elif decided:
            (folder / "decided").symlink_to(decided)
        for marker in done:
            (folder / marker).write_text("2026-12-03\n")

    apply("1-pending")
    apply("2-reverting", "revert")
    apply("3-promoting", "confirm")
    apply("4-reverted", "revert", "reverted")
    apply("5-confirmed", "confirm", "confirmed")
    apply("6-old-confirmed", "old", "confirmed")
    apply("7-old-claimed", "old")  # half done by an older sparkfold: its own scripts cannot tell, left alone
    (applies / "stray-file").write_text("")
    found = netplan_state(etc, run, applies)
    assert found["files"] == {str(etc / "40-cx7.yaml"): {"mode": "600", "text": fixture("40-cx7.yaml")},
                              str(etc / "empty.yaml"): {"mode": "644", "text": ""}}
    assert found["staged"] == {str(run / "40-cx7.yaml"): {"mode": "600", "text": "network: {version: 2}\n"}}
    assert found["undecided"] == {str(applies / "1-pending"): "pending", str(applies / "2-reverting"): "revert",
                                  str(applies / "3-promoting"): "confirm"}


def test_roce_devices_parses_a_sysfs_listing():
    r = roce()
    assert r["rocep1s0f0"]["netdevs"] == ["enp1s0f0np0"]
    assert r["roceP2p1s0f0"]["gids"][1][5] == {"gid": "0000:0000:0000:0000:0000:ffff:c0a8:6501",
                                              "type": "RoCE v2", "ndev": "enP2p1s0f0np0"}
    assert sorted(r["rocep1s0f1"]["gids"][1]) == [0, 1]


def _mlx5_tree(root: Path, ibdev: str, netdev: str, entries: list[tuple[str, str]], size: int = 8):
    """A /sys/class/infiniband-like tree: populated entries first, all-zero entries (no type) after."""
    port = root / ibdev / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs" / "types").mkdir(parents=True)
    (port / "gid_attrs" / "ndevs").mkdir(parents=True)
    (root / ibdev / "device" / "net" / netdev).mkdir(parents=True)
    for i in range(size):
        gid, kind = entries[i] if i < len(entries) else (ZERO_GID, "")
        (port / "gids" / str(i)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(i)).write_text(kind + "\n" if kind else "")
        (port / "gid_attrs" / "ndevs" / str(i)).write_text(netdev + "\n" if kind else "")


def test_roce_devices_command_on_a_tree(tmp_path):
    _mlx5_tree(tmp_path, "rocep1s0f0", "enp1s0f0np0", [
        ("fe80:0000:0000:0000:4ebb:47ff:fe2a:2000", "IB/RoCE v1"),
        ("fe80:0000:0000:0000:4ebb:47ff:fe2a:2000", "RoCE v2"),
        ("0000:0000:0000:0000:0000:ffff:c0a8:6401", "IB/RoCE v1"),
        ("0000:0000:0000:0000:0000:ffff:c0a8:6401", "RoCE v2"),
    ])
    fact = RoceDevices()
    r = fact.process(run_sh(fact.command(sysfs_ib=str(tmp_path))))
    assert r["rocep1s0f0"]["netdevs"] == ["enp1s0f0np0"]
    assert sorted(r["rocep1s0f0"]["gids"][1]) == [0, 1, 2, 3]  # zero entries are not listed
    assert r["rocep1s0f0"]["gids"][1][3]["type"] == "RoCE v2"
    assert link.v2_gid_index(r, "rocep1s0f0", "192.168.100.1", "enp1s0f0np0") == 3
    assert fact.process(run_sh(fact.command(sysfs_ib=str(tmp_path / "none")))) == {}


def test_ping_fact_command_and_result():
    command = PingOk().command(netdev="enp1s0f0np0", address="192.168.100.2", size=8972).get_raw_value()
    assert command.startswith("ping -c 1 -i 0.2 -w 2 -I enp1s0f0np0 -M do -s 8972 192.168.100.2 ")
    assert parse_fact(PingOk, "ok") is True
    assert parse_fact(PingOk, "fail") is False


def test_rail_pings_ask_every_rail_in_one_command(tmp_path, monkeypatch):
    from harness import run_fact
    fake = tmp_path / "ping"  # answers on enp1s0f0np0 only, and only for a do-not-fragment probe
    fake.write_text("#!/bin/sh\necho \"$*\" >> " + str(tmp_path / "calls") + "\n"
                    "case \"$*\" in *'-I enp1s0f0np0 -M do '*) exit 0;; esac; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    pairs = [["enp1s0f0np0", "192.168.100.2"], ["enP2p1s0f0np0", "192.168.101.2"]]
    assert run_fact(RailPings, pairs=pairs, size=8972) == {"enp1s0f0np0": True, "enP2p1s0f0np0": False}
    calls = (tmp_path / "calls").read_text().splitlines()
    assert sorted(calls) == [f"-c 1 -i 0.2 -w 2 -I {n} -M do -s 8972 {a}" for n, a in sorted(pairs)]
    assert parse_fact(RailPings, "ok a\nfail b\nnoise") == {"a": True, "b": False}


def test_link_record_fact():
    record = {"rails": [{"netdev": "a", "ibdev": "b", "address": "1.2.3.4/24", "gid_index": 3, "mtu": 9000}],
              "socket_ifname": "a"}
    assert parse_fact(LinkRecord, json.dumps(record, indent=2)) == record
    assert parse_fact(LinkRecord, "{broken") is None
    assert parse_fact(LinkRecord, "") is None


# --- pure helpers -------------------------------------------------------------------------------------------

def test_ipv4_mapped_gid():
    assert link.ipv4_mapped_gid("192.168.100.1") == "0000:0000:0000:0000:0000:ffff:c0a8:6401"
    assert link.ipv4_mapped_gid("10.0.0.255") == "0000:0000:0000:0000:0000:ffff:0a00:00ff"


def test_v2_gid_index_never_takes_v1_or_another_address():
    r = roce()
    assert link.v2_gid_index(r, "rocep1s0f0", "192.168.100.1") == 3
    assert link.v2_gid_index(r, "roceP2p1s0f0", "192.168.101.1") == 5  # a different index: never pinned
    assert link.v2_gid_index(r, "rocep1s0f0", "192.168.100.9") is None
    r["rocep1s0f0"]["gids"][1][3]["type"] = "IB/RoCE v1"
    assert link.v2_gid_index(r, "rocep1s0f0", "192.168.100.1") is None
    assert link.v2_gid_index(r, "missing", "192.168.100.1") is None


def test_rails_from_facts_finds_ibdevs_and_indexes():
    records = link.rails_from_facts(RAILS, addrs(), roce())
    assert records == [
        {"netdev": "enp1s0f0np0", "ibdev": "rocep1s0f0", "address": "192.168.100.1/24", "gid_index": 3,
         "mtu": 9000},
        {"netdev": "enP2p1s0f0np0", "ibdev": "roceP2p1s0f0", "address": "192.168.101.1/24", "gid_index": 5,
         "mtu": 9000},
    ]


def test_find_ibdev_falls_back_to_gid_ndevs():
    r = roce()
    for dev in r.values():
        dev["netdevs"] = []
    assert link.find_ibdev("enP2p1s0f0np0", r) == "roceP2p1s0f0"
    assert link.find_ibdev("enP7s7", r) is None


def test_rendered_netplan_is_the_managed_yaml():
    text = link.render_netplan(RAILS, 9000)
    assert text.splitlines()[0] == MANAGED_HEADER
    doc = yaml.safe_load(text)
    assert doc["network"]["ethernets"]["enP2p1s0f0np0"] == {
        "dhcp4": False, "link-local": [], "optional": True, "mtu": 9000, "addresses": ["192.168.101.1/24"]}
    assert list(doc["network"]["ethernets"]) == ["enp1s0f0np0", "enP2p1s0f0np0"]


def test_plan_migration_rewrites_or_moves():
    files = {"/etc/netplan/40-cx7.yaml": {"mode": "600", "text": fixture("40-cx7.yaml")},
             "/etc/netplan/50-mixed.yaml": {"mode": "600", "text": fixture("50-mixed.yaml")},
             OWN: {"mode": "600", "text": "whatever"}}
    moves, errors = link.plan_migration(files, OWN, ["enp1s0f0np0", "enP2p1s0f0np0"])
    assert errors == []
    by_path = {m["path"]: m for m in moves}
    assert set(by_path) == {"/etc/netplan/40-cx7.yaml", "/etc/netplan/50-mixed.yaml"}
    cx7 = yaml.safe_load(by_path["/etc/netplan/40-cx7.yaml"]["new_text"])
    assert cx7["network"]["ethernets"] == {"enp1s0f1np1": {"link-local": ["ipv4"]}}  # the other port stays
    mixed = yaml.safe_load(by_path["/etc/netplan/50-mixed.yaml"]["new_text"])
    assert mixed["network"] == {"version": 2, "renderer": "NetworkManager", "ethernets": {"enP7s7": {"dhcp4": True}}}
    # a file that configured only our netdevs moves out whole
    moves, _ = link.plan_migration(files, OWN, ["enp1s0f0np0", "enp1s0f1np1"])
    assert {m["path"]: m["new_text"] for m in moves}["/etc/netplan/40-cx7.yaml"] is None


def test_plan_migration_refuses_an_unparseable_file():
    files = {"/etc/netplan/broken.yaml": {"mode": "600", "text": fixture("broken.yaml")}}
    moves, errors = link.plan_migration(files, OWN, ["enp1s0f0np0"])
    assert moves == [] and len(errors) == 1
    assert "cannot parse /etc/netplan/broken.yaml" in errors[0] and "move it out of /etc/netplan" in errors[0]


# --- netplan op ---------------------------------------------------------------------------------------------

STATE = "directory=/etc/netplan"  # how the link step asks NetplanState


def netplan_facts(files, route="enP7s7", staged=None, undecided=None):
    """NetplanState holding `files` (and a stage folder, undecided applies), and the same files as files.put sees
    them (sha1 and mode)."""
    found = {"files": files, "staged": staged or {}, "undecided": undecided or {}}
    facts = [{NetplanState: with_args({STATE: found}), DefaultRouteDevice: route, IpAddresses: addrs()},
             remote_file(OWN)]
    facts += [remote_file(path, f["text"], mode=int(f["mode"])) for path, f in files.items()]
    return merged(*facts)


def netplan(files, rails=RAILS, route="enP7s7", **kwargs):
    return run_put(link.netplan_link, netplan_facts(files, route, **kwargs), rails=rails, mtu=9000, netplan_file=OWN)


APPLY = "setsid sh -c "  # the detached apply (operations/network/netplan_apply.py)


def guarded(commands, uploads):
    """The guarded apply of a netplan op's commands, or None: prepare (its folder, revert.sh, promote.sh), uploads
    into that folder, arm, stage under /run/netplan, apply, confirm. The revert is armed before anything is staged,
    and nothing before the confirmation writes /etc/netplan: a reboot in between boots the files as they were."""
    if not commands or not commands[0].startswith("umask 077 && mkdir -p /var/lib/sparkfold/netplan-apply/"):
        return None
    folder = commands[0].split()[5].rsplit("/new", 1)[0]
    arm = next(n for n, c in enumerate(commands) if c.startswith("systemd-run --quiet --unit=sparkfold-netplan-"))
    assert all(c.startswith("FileUploadCommand") for c in commands[1:arm])
    assert all(dest.startswith(f"{folder}/new/") for dest in uploads)
    staged = commands[arm + 1] if uploads else None
    assert staged is None or staged.startswith("mkdir -p /run/netplan && install -m 600 ")
    assert commands[-2].startswith(f"cat /proc/sys/kernel/random/boot_id > {folder}/boot; {APPLY}")
    assert "netplan generate && netplan apply" in commands[-2]
    assert commands[-1].startswith("FunctionCommand(netplan_confirmed")
    assert len(commands) == arm + (4 if uploads else 3)
    assert not any("/etc/netplan" in c for c in commands[1:])  # only promote.sh, written by prepare, writes there
    return types.SimpleNamespace(folder=folder, prepare=commands[0], arm=commands[arm], stage=staged,
                                 confirm=commands[-1], uploads={d[len(folder) + 1:]: t for d, t in uploads.items()})


def test_netplan_stages_applies_and_guards_management():
    commands, uploads, _ = netplan({})
    apply = guarded(commands, uploads)
    assert "--on-active=120s" in apply.arm and f"{apply.folder}/revert.sh" in apply.arm
    assert apply.uploads == {"new/0": link.render_netplan(RAILS, 9000)}
    assert "dhcp4: false" in apply.uploads["new/0"] and "192.168.101.1/24" in apply.uploads["new/0"]
    assert apply.stage == (f"mkdir -p /run/netplan && install -m 600 {apply.folder}/new/0 "
                           "/run/netplan/60-sparkfold-cx7.yaml")
    # the revert drops the staged file; the confirmation's promote.sh writes ours to /etc/netplan, mode 600
    assert "rm -f /run/netplan/60-sparkfold-cx7.yaml" in apply.prepare
    assert (f'install -m 600 "$d/new/0" /etc/netplan/.60-sparkfold-cx7.yaml.sparkfold-new\n'
            f"mv -f /etc/netplan/.60-sparkfold-cx7.yaml.sparkfold-new {OWN}") in apply.prepare
    assert "'enP7s7', '10.0.0.21', 120" in apply.confirm  # the management address the confirmation checks


def test_netplan_rollback_window_is_the_setting():
    commands, uploads, _ = run_put(link.netplan_link, netplan_facts({}), rails=RAILS, mtu=9000, netplan_file=OWN,
                                   rollback_s=45)
    assert "--on-active=45s" in guarded(commands, uploads).arm


def test_netplan_converged_yields_nothing():
    files = {OWN: {"mode": "600", "text": link.render_netplan(RAILS, 9000)}}
    commands, _, host = netplan(files)
    assert commands == []
    assert host.noops[-1] == f"{OWN} is up to date"


def test_netplan_converged_reads_the_listing_and_the_addresses_only():
    files = {OWN: {"mode": "600", "text": link.render_netplan(RAILS, 9000)}}
    _, _, host = netplan(files)
    # the listing holds the file's text and mode: files.put's own three facts are not read for a file that is right
    assert [name.rsplit(".", 1)[1] for name, _ in host.fact_calls] == ["NetplanState", "IpAddresses"]


def test_netplan_refuses_a_file_at_its_path_that_is_not_sparkfolds():
    files = {OWN: {"mode": "600", "text": "network:\n  version: 2\n"}}
    commands, uploads, _ = run_put(link.netplan_link, netplan_facts(files), executing=True, rails=RAILS, mtu=9000,
                                   netplan_file=OWN)
    assert len(commands) == 1 and "was not written by sparkfold" in commands[0] and "exit 1" in commands[0]
    assert uploads == {}


def test_netplan_mode_only_fix_does_not_apply():
    files = {OWN: {"mode": "644", "text": link.render_netplan(RAILS, 9000)}}
    commands, _, _ = netplan(files)
    assert commands == [f"chmod 600 {OWN}"]


def test_netplan_mtu_change_stages_the_new_file_and_keeps_the_old_one_in_place():
    files = {OWN: {"mode": "600", "text": link.render_netplan(RAILS, 1500)}}
    commands, uploads, _ = netplan(files)
    apply = guarded(commands, uploads)
    assert "mtu: 9000" in apply.uploads["new/0"]
    # /etc/netplan keeps the old file until the confirmation: nothing to copy back, the revert drops the staged one
    assert "cp -p" not in apply.prepare and "rm -f /run/netplan/60-sparkfold-cx7.yaml" in apply.prepare


def test_netplan_migrates_nvidias_file_with_a_backup():
    other = "/etc/netplan/40-cx7.yaml"
    files = {other: {"mode": "600", "text": fixture("40-cx7.yaml")},
             OWN: {"mode": "600", "text": link.render_netplan(RAILS, 9000)}}
    commands, uploads, _ = netplan(files)
    apply = guarded(commands, uploads)  # our file is unchanged, but the other one changed: applied
    assert list(apply.uploads) == ["new/0"]  # only the other file is staged
    assert list(yaml.safe_load(apply.uploads["new/0"])["network"]["ethernets"]) == ["enp1s0f1np1"]
    assert apply.stage.endswith(f"install -m 600 {apply.folder}/new/0 /run/netplan/40-cx7.yaml")
    stamp = apply.folder.rsplit("/", 1)[1].rsplit("-", 1)[0]
    assert f"cp -p {other} {other}.sparkfold-backup-{stamp}" in apply.prepare  # backed up once confirmed


def test_netplan_migration_moves_a_file_of_only_our_netdevs_aside_and_hides_it_until_then():
    rails = [{"netdev": "enp1s0f0np0", "address": "192.168.100.1/24"},
             {"netdev": "enp1s0f1np1", "address": "192.168.101.1/24"}]
    other = "/etc/netplan/40-cx7.yaml"
    files = {other: {"mode": "600", "text": fixture("40-cx7.yaml")}}
    commands, uploads, _ = netplan(files, rails=rails)
    apply = guarded(commands, uploads)
    assert yaml.safe_load(apply.uploads["new/0"]) == {"network": {"version": 2}}  # its shadow configures nothing
    assert "/run/netplan/40-cx7.yaml" in apply.stage and "/run/netplan/60-sparkfold-cx7.yaml" in apply.stage
    stamp = apply.folder.rsplit("/", 1)[1].rsplit("-", 1)[0]
    assert f"mv {other} {other}.sparkfold-backup-{stamp}" in apply.prepare  # moved whole, nothing deleted


def test_netplan_refuses_unparseable_other_file(caplog):
    files = {"/etc/netplan/broken.yaml": {"mode": "600", "text": fixture("broken.yaml")}}
    command, warnings = refused(caplog, link.netplan_link, netplan_facts(files, "enP7s7"), rails=RAILS, mtu=9000,
                                netplan_file=OWN)
    assert "netplan files: cannot parse /etc/netplan/broken.yaml" in command
    assert "will fail: netplan files: cannot parse /etc/netplan/broken.yaml" in warnings


def test_netplan_no_management_check_when_management_is_on_a_rail_or_absent():
    for route in (None, "enp1s0f0np0"):
        commands, uploads, _ = netplan({}, route=route)
        assert "None, None, 120" in guarded(commands, uploads).confirm


def test_netplan_refuses_to_stage_over_a_file_sparkfold_did_not_put_there(caplog):
    staged = {"/run/netplan/60-sparkfold-cx7.yaml": {"mode": "600", "text": "network: {version: 2}\n"}}
    command, warnings = refused(caplog, link.netplan_link, netplan_facts({}, staged=staged), rails=RAILS, mtu=9000,
                                netplan_file=OWN)
    assert ("netplan stage folder: /run/netplan/60-sparkfold-cx7.yaml shadows /etc/netplan/60-sparkfold-cx7.yaml"
            in command) and "remove it or reboot" in warnings
    # an apply an earlier run left staged it: settled before this operation runs, so planning goes on
    pending = {"/var/lib/sparkfold/netplan-apply/20261203-101010-abc123": "pending"}
    commands, uploads, _ = netplan({}, staged=staged, undecided=pending)
    assert guarded(commands, uploads) is not None


def test_netplan_diff_shows_the_file_in_etc_netplan_as_it_changes(caplog):
    from harness import FakeHost, _render, _State
    from pyinfra.context import ctx_host, ctx_state

    other = "/etc/netplan/40-cx7.yaml"  # configures only our netdevs: moved aside
    rails = [{"netdev": "enp1s0f0np0", "address": "192.168.100.1/24"},
             {"netdev": "enp1s0f1np1", "address": "192.168.101.1/24"}]
    files = {OWN: {"mode": "600", "text": link.render_netplan(rails, 9000) + "# edited by hand\n"},
             other: {"mode": "600", "text": fixture("40-cx7.yaml")}}
    diffing = _State(False)
    diffing.config.DIFF = True
    with caplog.at_level("INFO", logger="pyinfra"), ctx_state.use(diffing), \
            ctx_host.use(FakeHost(netplan_facts(files))):
        commands = [_render(c) for c in link.netplan_link._inner(rails=rails, mtu=9000, netplan_file=OWN)]
    assert commands
    said = [r.getMessage() for r in caplog.records]
    assert f"spark: Will modify {OWN} (staged under /run/netplan until the apply is confirmed)" in said
    assert any(line.strip().endswith("- # edited by hand") for line in said), said
    assert any(line.startswith(f"spark: Will move {other} aside (to {other}.sparkfold-backup-") for line in said)


# --- an apply an earlier run left --------------------------------------------------------------------------------

UNDECIDED = {"/var/lib/sparkfold/netplan-apply/20261203-101010-abc123": "pending",
             "/var/lib/sparkfold/netplan-apply/20261203-111111-def456": "confirm",
             "/var/lib/sparkfold/netplan-apply/20261203-121212-aaa111": "revert"}


def test_applies_settled_does_nothing_when_none_is_left():
    found = {"files": {}, "staged": {}, "undecided": {}}
    commands, host = run_op(link.netplan_applies_settled, {NetplanState: with_args({STATE: found})},
                            netplan_file=OWN)
    assert commands == [] and host.noops == ["no netplan apply is left undecided"]


@pytest.mark.parametrize("executing", [False, True])
def test_applies_settled_undoes_the_unconfirmed_and_finishes_the_confirmed(caplog, executing):
    found = {"files": {}, "staged": {}, "undecided": UNDECIDED}
    with caplog.at_level("WARNING", logger="pyinfra"):
        commands, _ = run_op(link.netplan_applies_settled, {NetplanState: with_args({STATE: found})},
                             executing=executing, netplan_file=OWN)
    folder = "/var/lib/sparkfold/netplan-apply/20261203-"
    assert commands == [f"sh {folder}101010-abc123/revert.sh", f"sh {folder}111111-def456/promote.sh",
                        f"sh {folder}121212-aaa111/revert.sh"]
    said = caplog.text  # --dry says what it will do, and so does the run
    assert f"{folder}101010-abc123 was never confirmed (a run stopped, or the Spark rebooted" in said
    assert f"{folder}111111-def456 was confirmed but not all written to /etc/netplan" in said


# --- checks -------------------------------------------------------------------------------------------------

def test_addresses_converged_and_failing():
    commands, _ = run_op(link.link_addresses, {IpAddresses: addrs()}, executing=True, rails=RAILS, mtu=9000,
                         netplan_file=OWN)
    assert commands == []
    bad = addrs()
    bad["enP2p1s0f0np0"] = {"mtu": 1500, "operstate": "UP", "ipv4": []}
    commands, _ = run_op(link.link_addresses, {IpAddresses: bad}, executing=False, rails=RAILS, mtu=9000,
                         netplan_file=OWN)
    assert commands == []  # planning tolerates: the netplan op may fix it
    commands, _ = run_op(link.link_addresses, {IpAddresses: bad}, executing=True, rails=RAILS, mtu=9000,
                         netplan_file=OWN)
    assert len(commands) == 1 and "exit 1" in commands[0]
    assert "enP2p1s0f0np0 lacks 192.168.101.1/24" in commands[0] and "MTU 1500, not 9000" in commands[0]
    assert "sudo netplan apply" in commands[0]


def test_addresses_warned_while_planning_only_when_no_apply_comes(caplog):
    bad = addrs()
    bad["enP2p1s0f0np0"] = {"mtu": 9000, "operstate": "UP", "ipv4": []}
    args = dict(rails=RAILS, mtu=9000, netplan_file=OWN)
    assert run_op(link.link_addresses, {IpAddresses: bad}, settled=False, **args)[0] == []
    assert "will fail" not in caplog.text
    assert run_op(link.link_addresses, {IpAddresses: bad}, settled=True, **args)[0] == []
    assert "will fail: link addresses: enP2p1s0f0np0 lacks 192.168.101.1/24" in caplog.text


def test_addresses_missing_netdev_names_link_rails():
    rails = [{"netdev": "enp9s0", "address": "192.168.100.1/24"}]
    commands, _ = run_op(link.link_addresses, {IpAddresses: addrs()}, executing=True, rails=rails, mtu=9000,
                         netplan_file=OWN)
    assert "netdev enp9s0 does not exist" in commands[0] and "link_rails" in commands[0]


def ping_facts(results):
    pairs = [[r["netdev"], p["address"].split("/")[0]] for r, p in zip(RAILS, PEER, strict=True)]
    return {RailPings: with_args({f"pairs={pairs}, size=8972": {r["netdev"]: ok for r, ok in
                                                                 zip(RAILS, results, strict=True)}})}


def test_ping_converged_and_failing():
    commands, _ = run_op(link.link_ping, ping_facts([True, True]), executing=True, rails=RAILS, peer_rails=PEER,
                         mtu=9000)
    assert commands == []
    commands, _ = run_op(link.link_ping, ping_facts([True, False]), executing=False, rails=RAILS,
                         peer_rails=PEER, mtu=9000)
    assert commands == []
    commands, _ = run_op(link.link_ping, ping_facts([True, False]), executing=True, rails=RAILS,
                         peer_rails=PEER, mtu=9000)
    assert len(commands) == 1 and "no reply from 192.168.101.2 over enP2p1s0f0np0" in commands[0]
    assert "192.168.100.2" not in commands[0] and "-M do -s 8972" in commands[0]


def test_roce_gids_converged_and_failing():
    commands, _ = run_op(link.roce_gids, {RoceDevices: roce()}, executing=True, rails=RAILS)
    assert commands == []
    r = roce()
    r["roceP2p1s0f0"]["gids"][1][5]["type"] = "IB/RoCE v1"  # only v1 left for 192.168.101.1
    commands, _ = run_op(link.roce_gids, {RoceDevices: r}, executing=False, rails=RAILS)
    assert commands == []
    commands, _ = run_op(link.roce_gids, {RoceDevices: r}, executing=True, rails=RAILS, settled=True)
    assert len(commands) == 1 and "roceP2p1s0f0 has no RoCE v2 GID for 192.168.101.1" in commands[0]
    assert "rocep1s0f0 " not in commands[0]


def test_roce_gids_wait_for_the_gids_of_addresses_this_run_applied(monkeypatch):
    r = roce()
    entry = r["roceP2p1s0f0"]["gids"][1][5]
    entry["type"] = "IB/RoCE v1"  # the driver has not added the v2 GID yet
    waits = []

    def gid_appears(seconds):
        waits.append(seconds)
        entry["type"] = "RoCE v2"

    monkeypatch.setattr(link.gevent, "sleep", gid_appears)
    commands, _ = run_op(link.roce_gids, {RoceDevices: r}, executing=True, rails=RAILS, settled=False)
    assert commands == [] and waits == [0.5]
    entry["type"] = "IB/RoCE v1"
    waits.clear()
    commands, _ = run_op(link.roce_gids, {RoceDevices: r}, executing=True, rails=RAILS, settled=True)
    assert len(commands) == 1 and waits == []  # no apply in this run: judged at once


def test_roce_gids_uses_the_given_ibdev_and_reports_a_missing_device():
    rails = [dict(RAILS[0], ibdev="rocep1s0f1")]  # a wrong pairing: that device has no GID for the address
    commands, _ = run_op(link.roce_gids, {RoceDevices: roce()}, executing=True, rails=rails, settled=True)
    assert "rocep1s0f1 has no RoCE v2 GID for 192.168.100.1" in commands[0]
    commands, _ = run_op(link.roce_gids, {RoceDevices: {}}, executing=True, rails=RAILS[:1])
    assert "no RoCE device found for enp1s0f0np0" in commands[0] and '"ibdev"' in commands[0]


# --- record -------------------------------------------------------------------------------------------------

RECORD_PATH = "/home/nvidia/.local/state/sparkfold/link.json"


def record_facts(current, roce_devices=None, path=RECORD_PATH):
    return merged({IpAddresses: addrs(), RoceDevices: roce() if roce_devices is None else roce_devices,
                   LinkRecord: with_args({f"path={path}": current})}, remote_file(path, dir_exists=False))


def test_record_written_when_different_and_not_when_equal():
    commands, uploads, _ = run_put(link.link_recorded, record_facts(None), executing=True, rails=RAILS,
                                   path=RECORD_PATH)
    assert commands[0] == "mkdir -p /home/nvidia/.local/state/sparkfold" and commands[1].startswith("FileUpload")
    want = link.link_record(RAILS, addrs(), roce())
    assert want["socket_ifname"] == "enp1s0f0np0" and want["rails"][1]["gid_index"] == 5
    assert uploads[RECORD_PATH] == json.dumps(want, indent=2, sort_keys=True) + "\n"
    stale = json.loads(json.dumps(want))
    stale["rails"][0]["gid_index"] = 4
    assert run_put(link.link_recorded, record_facts(stale), rails=RAILS, path=RECORD_PATH)[0] != []
    commands, _, host = run_put(link.link_recorded, record_facts(want), executing=True, rails=RAILS,
                                path=RECORD_PATH)
    assert commands == [] and host.noops


def test_record_upload_is_the_json_the_fact_reads():
    _, uploads, _ = run_put(link.link_recorded, record_facts(None), executing=True, rails=RAILS, path=RECORD_PATH)
    assert parse_fact(LinkRecord, uploads[RECORD_PATH]) == link.link_record(RAILS, addrs(), roce())


def test_record_waits_for_a_gid(caplog):
    facts = record_facts(None, roce_devices={})
    assert run_put(link.link_recorded, facts, executing=False, rails=RAILS, path=RECORD_PATH)[0] == []
    assert "will fail" not in caplog.text  # an apply in this run may still bring the GID
    assert run_put(link.link_recorded, facts, rails=RAILS, path=RECORD_PATH, settled=True)[0] == []
    assert "will fail: link record: cannot record the link" in caplog.text
    commands, _, _ = run_put(link.link_recorded, facts, executing=True, rails=RAILS, path=RECORD_PATH)
    assert "cannot record the link" in commands[0]


# --- deploy function ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("settles, applies", [(True, False), (False, True), (False, False)])
def test_link_calls_each_op_once_with_settings(monkeypatch, settles, applies):
    calls = []
    changes = {"netplan_applies_settled": settles, "netplan_link": applies}
    for op in ("rails_safe", "netplan_applies_settled", "netplan_link", "link_addresses", "link_ping", "roce_gids",
               "link_recorded"):
        monkeypatch.setattr(link, op, lambda _op=op, **kw: calls.append((_op, kw)) or types.SimpleNamespace(
            is_complete=lambda: True, did_change=lambda _op=_op: changes.get(_op, False)))
    s = types.SimpleNamespace(link_rails=RAILS, peer=types.SimpleNamespace(link_rails=PEER), link_mtu=9000,
                              link_netplan_file=OWN, link_rollback_s=90,
                              layout=types.SimpleNamespace(link_record=RECORD_PATH))
    link.link._inner(s)
    safe = calls.pop(0)  # before any network change: no rail on the management network
    assert safe[0] == "rails_safe" and safe[1]["rails"] == RAILS
    assert [c[0] for c in calls] == ["netplan_applies_settled", "netplan_link", "link_addresses", "link_ping",
                                     "roce_gids", "link_recorded"]
    # an apply an earlier run left is settled first, as root, against the same netplan folder
    assert calls[0][1]["_sudo"] is True and calls[0][1]["netplan_file"] == OWN
    calls.pop(0)
    assert calls[0][1]["_sudo"] is True and calls[0][1]["netplan_file"] == OWN and calls[0][1]["rollback_s"] == 90
    assert calls[2][1]["peer_rails"] == PEER and calls[2][1]["_sudo"] is True
    assert calls[4][1]["path"] == RECORD_PATH and calls[4][1]["_sudo"] is False
    # the checks an apply in this run changes (its own, or settling an earlier one) are judged while planning only
    # when nothing applies, asked when they run (the operations' results, not their facts read again)
    assert [calls[i][1]["settled"]() for i in (1, 3, 4)] == [not (settles or applies)] * 3


@pytest.mark.parametrize("name", ["60-sparkfold-cx7.yml", "sparkfold"])
def test_netplan_file_must_be_yaml(name, caplog):
    command, warnings = refused(caplog, link.netplan_link, {}, rails=RAILS, mtu=9000,
                                netplan_file="/etc/netplan/" + name)
    assert f"link_netplan_file: /etc/netplan/{name} must end in .yaml" in command
    assert f"will fail: link_netplan_file: /etc/netplan/{name} must end in .yaml" in warnings


# --- never strand a Spark: a rail on the management network is refused ------------------------------------------

MGMT = {"eth0": {"mtu": 1500, "operstate": "UP", "ipv4": ["10.20.0.5/24"]},
        "enp1s0f0np0": {"mtu": 9000, "operstate": "UP", "ipv4": []},
        "enP2p1s0f0np0": {"mtu": 9000, "operstate": "UP", "ipv4": []}}


def test_rail_hazards_both_ways():
    ok = link.rail_hazards(RAILS, MGMT, ["eth0"], "10.20.0.5")
    assert ok == []
    on_mgmt = [{"netdev": "eth0", "address": "192.168.100.1/24"}]
    assert "carries this Spark's default route" in link.rail_hazards(on_mgmt, MGMT, ["eth0"], None)[0]
    # an IPv6-only default route is the management network too
    on_v6_mgmt = [{"netdev": "eth2", "address": "192.168.100.1/24"}]
    assert "carries this Spark's default route" in link.rail_hazards(on_v6_mgmt, MGMT, ["eth0", "eth2"], None)[0]
    addrs = dict(MGMT, eth1={"mtu": 1500, "operstate": "UP", "ipv4": ["10.30.0.7/24"],
                             "ipv6": ["2001:db8::7/64"]})
    via_ssh = [{"netdev": "eth1", "address": "10.30.0.7/24"}]
    for arrived_on in ("10.30.0.7", "::ffff:10.30.0.7", "2001:db8:0::7"):  # as SSH_CONNECTION may spell it
        assert "the address this deploy reaches the Spark on over ssh" in link.rail_hazards(
            via_ssh, addrs, ["eth0"], arrived_on)[0], arrived_on
    assert link.rail_hazards(via_ssh, addrs, ["eth0"], "2001:db8::8") == []
    overlapping = [{"netdev": "enp1s0f0np0", "address": "10.20.0.200/16"}]
    found = link.rail_hazards(overlapping, MGMT, ["eth0"], None)
    assert len(found) == 1 and "10.20.0.0/16 (link rail enp1s0f0np0) overlaps 10.20.0.0/24 on eth0" in found[0]


def test_rails_safe_refuses_before_any_change(caplog):
    from operations.facts.network import DefaultRouteDevices, SshServerAddress
    facts = {IpAddresses: MGMT, DefaultRouteDevices: ["eth0"], SshServerAddress: "10.20.0.5"}
    assert run_op(link.rails_safe, facts, executing=True, rails=RAILS)[0] == []
    bad = [{"netdev": "eth0", "address": "192.168.100.1/24"}]
    cmds, _ = run_op(link.rails_safe, facts, executing=True, rails=bad)
    assert len(cmds) == 1 and "exit 1" in cmds[0] and "default route" in cmds[0]
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert run_op(link.rails_safe, facts, executing=False, rails=bad)[0] == []
    assert "will fail: link rails: eth0 carries this Spark" in caplog.text


# --- the migration keeps every other byte as written -------------------------------------------------------------

def without_lines(text: str, first: int, last: int) -> str:
    """`text` without its lines first..last (1-based, inclusive)."""
    lines = text.splitlines(keepends=True)
    return "".join(lines[:first - 1] + lines[last:])


def test_migration_keeps_ssids_passwords_macs_and_comments_as_written():
    text = fixture("55-desk.yaml")
    moves, errors = link.plan_migration({"/etc/netplan/55-desk.yaml": {"mode": "600", "text": text}}, OWN,
                                        ["enP2p1s0f0np0"])
    assert errors == [] and len(moves) == 1 and moves[0]["netdevs"] == ["enP2p1s0f0np0"]
    header, _, rest = moves[0]["new_text"].partition("\n")
    assert header.startswith("# sparkfold moved enP2p1s0f0np0 to /etc/netplan/60-sparkfold-cx7.yaml; the original")
    assert rest == without_lines(text, 12, 15)  # the stanza's four lines, and not one other byte
    for kept in ("        0123:\n          password: 0755\n", "macaddress: 12:34:56:12:34:56   # the LAN port",
                 "# the desk Spark", "dhcp4: yes", "'office'", '"0x1F"'):
        assert kept in rest, kept
    # what netplan reads is what it read before, less the stanza
    doc = yaml.load(rest, Loader=yaml.BaseLoader)
    assert doc["network"]["wifis"]["wlP9s9"]["access-points"] == {"0123": {"password": "0755"},
                                                                   "office": {"password": "0x1F"}}
    assert list(doc["network"]["ethernets"]) == ["enP7s7", "enp1s0f1np1"]
    assert doc["network"]["ethernets"]["enP7s7"]["match"]["macaddress"] == "12:34:56:12:34:56"


def test_migration_drops_an_emptied_ethernets_block_and_keeps_the_rest():
    text = ("network:\n  version: 2\n  ethernets:\n    enP2p1s0f0np0:\n      dhcp4: true  # old\n\n"
            "  # the office\n  wifis:\n    wl0:\n      access-points:\n        \"0123\": {password: \"0755\"}\n")
    moves, errors = link.plan_migration({"/etc/netplan/x.yaml": {"mode": "600", "text": text}}, OWN,
                                        ["enP2p1s0f0np0"])
    assert errors == [] and moves[0]["new_text"].partition("\n")[2] == without_lines(text, 3, 5)


@pytest.mark.parametrize("text, why", [
    ("# mine\nnetwork: {version: 2, ethernets: {enP2p1s0f0np0: {dhcp4: true}, enP7s7: {dhcp4: true}}}\n",
     "flow style"),
    ("network:\n  version: 2\n  ethernets:\n    enP2p1s0f0np0:\n      nameservers: &dns\n        addresses: [1.1.1.1]\n"
     "    enP7s7:\n      nameservers: *dns\n", "would not read as the rest of the file did"),
    ("network:\n  version: 2\n  ethernets:\n    enP7s7: {dhcp4: true}\n    enP2p1s0f0np0: {dhcp4: \"\ufffd\"}\n",
     "not UTF-8"),
])
def test_migration_refuses_a_file_it_cannot_cut_cleanly_naming_the_stanza_to_move(text, why):
    path = "/etc/netplan/50-mine.yaml"
    moves, errors = link.plan_migration({path: {"mode": "600", "text": text}}, OWN, ["enP2p1s0f0np0"])
    assert moves == [] and len(errors) == 1, errors
    assert errors[0].startswith(f"{path} configures enP2p1s0f0np0, which sparkfold configures in {OWN}") and \
        why in errors[0] and f"move network.ethernets.enP2p1s0f0np0 out of {path} by hand" in errors[0], errors[0]


def test_netplan_stages_the_cut_file_and_writes_it_with_its_mode_once_confirmed():
    other = "/etc/netplan/55-desk.yaml"
    files = {other: {"mode": "640", "text": fixture("55-desk.yaml")},
             OWN: {"mode": "600", "text": link.render_netplan(RAILS, 9000)}}
    commands, uploads, _ = netplan(files)
    apply = guarded(commands, uploads)
    assert apply.uploads["new/0"].partition("\n")[2] == without_lines(fixture("55-desk.yaml"), 12, 15)
    assert 'install -m 640 "$d/new/0" /etc/netplan/.55-desk.yaml.sparkfold-new' in apply.prepare
