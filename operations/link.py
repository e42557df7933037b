"""The CX7 link: this project's netplan file (with migration of other files' stanzas for the same netdevs),
an apply the Spark undoes by itself unless confirmed (network/netplan_apply.py), checks (addresses and MTU, DF ping per
rail, RoCE v2 GID), and the per-host link record the launch step reads."""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Callable
from io import StringIO

import gevent
import yaml
from pyinfra import host, logger, state
from pyinfra.api import deploy, operation
from pyinfra.operations import files as core_files
from pyinfra.operations.util.files import generate_color_diff

from operations.facts.network import (
    DefaultRouteDevice,
    DefaultRouteDevices,
    IpAddresses,
    LinkRecord,
    NetplanState,
    NetplanStateDict,
    RailPings,
    RoceDevices,
    SshServerAddress,
)
from operations.layout import NETPLAN_STAGE_DIR
from operations.network.netplan_apply import (
    Change,
    backup_path,
    guarded_apply,
    new_apply_dir,
    settle_command,
    staged_path,
    sudo_arguments,
)
from operations.settings.rules import rail_warnings
from operations.util import check_failed, warned
from operations.util.checks import is_settled, op_changed
from operations.util.fact_reuse import fact_until_change
from operations.util.net import ip_of
from operations.util.owned import foreign_file_problem
from operations.util.templates import render

ROCE_PORT = 1
NETPLAN_MODE = "600"  # netplan warns about a file others can read (it may hold secrets)
GID_WAIT_TRIES = 10  # x 0.5 s for the GIDs of addresses this run applied


# --- pure helpers -------------------------------------------------------------------------------------------

def render_netplan(rails: list[dict], mtu: int) -> str:
    return render("sparkfold-cx7.netplan.yaml.j2", rails=rails, mtu=int(mtu))


def ipv4_mapped_gid(ip: str) -> str:
    """The GID sysfs shows for an IPv4 address: ::ffff:a.b.c.d in 8 groups of 4 hex digits."""
    packed = ipaddress.IPv4Address(ip).packed
    return "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}".format(*packed)


def find_ibdev(netdev: str, roce: dict) -> str | None:
    """The RoCE device whose netdev is `netdev`: the sysfs device symlinks first, else the GID ndevs."""
    for ibdev in sorted(roce):
        if netdev in roce[ibdev]["netdevs"]:
            return ibdev
    for ibdev in sorted(roce):
        for table in roce[ibdev]["gids"].values():
            if any(e.get("ndev") == netdev for e in table.values()):
                return ibdev
    return None


def v2_gid_index(roce: dict, ibdev: str | None, ip: str, netdev: str | None = None) -> int | None:
    """Lowest index on port 1 whose GID holds `ip` with type RoCE v2 (never a pinned index)."""
    if not ibdev or ibdev not in roce:
        return None
    want = ipv4_mapped_gid(ip)
    table = roce[ibdev]["gids"].get(ROCE_PORT, {})
    for index in sorted(table):
        entry = table[index]
        if entry["gid"].lower() != want or "v2" not in entry["type"].lower():
            continue
        if netdev and entry.get("ndev") and entry["ndev"] != netdev:
            continue
        return index
    return None


def rails_from_facts(rails: list[dict], addrs: dict, roce: dict) -> list[dict]:
    """The link record's rails from the facts: [{"netdev", "ibdev", "address", "gid_index", "mtu"}].

    rails: s.link_rails; addrs: IpAddresses; roce: RoceDevices. "address" is the configured "ip/prefix";
    ibdev / gid_index / mtu are None where the facts do not show them (yet).
    """
    out = []
    for rail in rails:
        netdev = rail["netdev"]
        ibdev = rail.get("ibdev") or find_ibdev(netdev, roce)
        out.append({
            "netdev": netdev,
            "ibdev": ibdev,
            "address": rail["address"],
            "gid_index": v2_gid_index(roce, ibdev, ip_of(rail["address"]), netdev),
            "mtu": (addrs.get(netdev) or {}).get("mtu"),
        })
    return out


def link_record(rails: list[dict], addrs: dict, roce: dict) -> dict:
    records = rails_from_facts(rails, addrs, roce)
    return {"rails": records, "socket_ifname": records[0]["netdev"] if records else None}


def address_problems(rails: list[dict], addrs: dict, mtu: int, netplan_file: str) -> list[str]:
    problems = []
    for rail in rails:
        netdev, address = rail["netdev"], rail["address"]
        live = addrs.get(netdev)
        if live is None:
            problems.append(f"netdev {netdev} does not exist on this Spark: check link_rails in the site file "
                            f"(`ip -br link` lists the netdevs; the CX7 twins look like enp1s0f0np0/enP2p1s0f0np0)")
            continue
        if address not in live["ipv4"]:
            have = ", ".join(live["ipv4"]) or "none"
            problems.append(f"{netdev} lacks {address} (has: {have}): run `sudo netplan apply` "
                            f"(the address comes from {netplan_file}) and check the cable")
        if live["mtu"] != mtu:
            problems.append(f"{netdev} has MTU {live['mtu']}, not {mtu}: run `sudo netplan apply` "
                            f"(or set link_mtu to the same value on both Sparks)")
    return problems


def _same_address(a: str, b: str) -> bool:
    """Two address texts naming one address (IPv6 spelled differently, or an IPv4-mapped IPv6 from ssh)."""
    try:
        x, y = ipaddress.ip_address(a), ipaddress.ip_address(b)
    except ValueError:
        return a == b
    x = getattr(x, "ipv4_mapped", None) or x
    y = getattr(y, "ipv4_mapped", None) or y
    return x == y


def rail_hazards(rails: list[dict], addrs: dict, default_devs: list[str], ssh_address: str | None) -> list[str]:
    """Why addressing these rails could cut this Spark off: a rail on a default route's netdev (IPv4 or IPv6) or on
    the address the deploy's ssh arrives on (either family), or a rail subnet that overlaps another interface's."""
    problems = []
    netdevs = {r["netdev"] for r in rails}
    for rail in rails:
        netdev, mine = rail["netdev"], ipaddress.ip_interface(rail["address"])
        info = addrs.get(netdev) or {}
        live = [ipaddress.ip_interface(a) for a in info.get("ipv4", []) + info.get("ipv6", [])]
        if netdev in default_devs:
            problems.append(f"{netdev} carries this Spark's default route (the management network), so it is not a "
                            "CX7 link rail: list the cabled CX7 port's netdevs in link_rails (`ip -br link`; they "
                            "look like enp1s0f0np0 / enP2p1s0f0np0)")
        elif ssh_address and any(_same_address(str(a.ip), ssh_address) for a in live):
            problems.append(f"{netdev} holds {ssh_address}, the address this deploy reaches the Spark on over ssh: "
                            "re-addressing it would cut the connection; list the CX7 netdevs in link_rails instead")
        for other, info in sorted(addrs.items()):
            if other in netdevs or other == "lo":
                continue
            for text in info.get("ipv4", []):
                theirs = ipaddress.ip_interface(text)
                if theirs.network.overlaps(mine.network):
                    problems.append(f"{mine.network} (link rail {netdev}) overlaps {theirs.network} on {other}: "
                                    "routes to one would go to the other; give the link rails a subnet of their own "
                                    "(e.g. 192.168.100.0/24 and 192.168.101.0/24)")
    return problems


def _stanza_netdev_names(key: str, stanza) -> set[str]:
    names = {key}
    if isinstance(stanza, dict):
        if isinstance(stanza.get("set-name"), str):
            names.add(stanza["set-name"])
        match = stanza.get("match")
        if isinstance(match, dict) and isinstance(match.get("name"), str):
            names.add(match["name"])
    return names


class _Unchanged(Exception):
    """The text cannot lose the stanzas without changing something else; the message says why."""


def _content_end(node: yaml.Node) -> yaml.Mark:
    """Where a node's own text ends: a block collection's end mark lies at the next token, after any comments and
    blank lines that follow it, so its last child's end is taken instead."""
    if isinstance(node, yaml.ScalarNode) or getattr(node, "flow_style", False) or not node.value:
        return node.end_mark
    children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else node.value
    return max((_content_end(child) for child in children), key=lambda mark: mark.index)


def _lines_of(lines: list[str], key: yaml.Node, value: yaml.Node) -> range:
    """The whole lines a block mapping entry takes, from its key to the end of its value's text."""
    start, end = key.start_mark, _content_end(value)
    if lines[start.line][:start.column].strip():
        raise _Unchanged(f"{key.value} does not start its own line")
    last = end.line - 1 if end.column == 0 else end.line  # a block scalar ends after its line break
    if end.column and lines[last][end.column:].strip() and not lines[last][end.column:].lstrip().startswith("#"):
        raise _Unchanged(f"{key.value} shares its last line with other text")
    return range(start.line, last + 1)


def _entry(mapping: yaml.Node, name: str) -> tuple[yaml.Node, yaml.Node]:
    return next((k, v) for k, v in mapping.value if isinstance(k, yaml.ScalarNode) and k.value == name)


def _without_stanzas(text: str, ours: list[str], expected: dict) -> str:
    """`text` without the ethernets stanzas `ours` (without `ethernets:` itself when nothing else is left), every
    other line kept byte for byte (comments, quoting, the spelling of every value): cut as whole lines, then read
    back and compared with `expected`, the document as it should be. Raises _Unchanged when that cannot be done."""
    if "\ufffd" in text:
        raise _Unchanged("it holds bytes that are not UTF-8")
    root = yaml.compose(text, Loader=yaml.BaseLoader)
    if root is None:
        raise _Unchanged("it holds no document")
    eth_key, ethernets = _entry(_entry(root, "network")[1], "ethernets")
    if not isinstance(ethernets, yaml.MappingNode) or ethernets.flow_style:
        raise _Unchanged("its ethernets are written in flow style, {...}")
    lines = text.splitlines(keepends=True)
    entries = [(k, v) for k, v in ethernets.value if k.value in ours]
    if len(entries) == len(ethernets.value):
        cut = set(_lines_of(lines, eth_key, ethernets))
    else:
        cut = {n for k, v in entries for n in _lines_of(lines, k, v)}
    kept = "".join(line for n, line in enumerate(lines) if n not in cut)
    try:
        again = yaml.load(kept, Loader=yaml.BaseLoader) or {}
    except yaml.YAMLError:
        again = None
    if again != expected:
        raise _Unchanged("what is left would not read as the rest of the file did")
    return kept


def plan_migration(files: dict, own_file: str, netdevs: list[str]) -> tuple[list[dict], list[str]]:
    """Other netplan files that configure our netdevs: ([{"path", "netdevs", "new_text" | None}], errors).

    new_text None means the file configured only those netdevs and is moved to its backup as a whole. Otherwise
    new_text is the file without those stanzas and every other byte as written. Files are read with BaseLoader,
    every scalar a string, so an SSID 0123, a password 0755 or a MAC 12:34:56:12:34:56 is never a number (PyYAML's
    safe loader reads those as 83, 493 and a sexagesimal integer). A file whose stanzas cannot be taken out that
    way is refused, naming what to move by hand.
    """
    moves, errors = [], []
    wanted = set(netdevs)
    for path in sorted(files):
        if path == own_file:
            continue
        try:
            doc = yaml.load(files[path]["text"], Loader=yaml.BaseLoader) or {}
        except yaml.YAMLError as exc:
            errors.append(f"cannot parse {path} ({str(exc).splitlines()[0]}): fix it or move it out of "
                          f"{os.path.dirname(path)} (netplan reads every *.yaml there), then re-run")
            continue
        network = doc.get("network") if isinstance(doc, dict) else None
        if not isinstance(network, dict):
            continue
        ethernets = network.get("ethernets")
        if not isinstance(ethernets, dict):
            continue
        ours = sorted(k for k, v in ethernets.items() if _stanza_netdev_names(str(k), v) & wanted)
        if not ours:
            continue
        rest = {k: v for k, v in ethernets.items() if k not in ours}
        new_network = {k: v for k, v in network.items() if k != "ethernets"}
        if rest:
            new_network["ethernets"] = rest
        only_ours = set(new_network) <= {"version", "renderer"} and set(doc) == {"network"}
        if only_ours:
            moves.append({"path": path, "netdevs": ours, "new_text": None})
            continue
        try:
            kept = _without_stanzas(files[path]["text"], ours, {**doc, "network": new_network})
        except (_Unchanged, StopIteration, yaml.YAMLError) as exc:
            why = str(exc) if isinstance(exc, _Unchanged) else "its layout is not one stanza per block"
            errors.append(f"{path} configures {', '.join(ours)}, which sparkfold configures in {own_file}, but "
                          f"sparkfold cannot take {'that stanza' if len(ours) == 1 else 'those stanzas'} out of it "
                          f"without changing the rest ({why}): move network.ethernets.{' and '.join(ours)} out of "
                          f"{path} by hand (delete {'it' if len(ours) == 1 else 'them'} there, keeping the rest as "
                          "it is), then re-run")
            continue
        header = (f"# sparkfold moved {', '.join(ours)} to {own_file}; the original, with those stanzas as they were "
                  f"written, is kept beside this file as {os.path.basename(path)}.sparkfold-backup-<timestamp>\n")
        moves.append({"path": path, "netdevs": ours, "new_text": header + kept})
    return moves, errors


def netplan_changes(files: dict, netplan_file: str, want: str, moves: list[dict]) -> list[Change]:
    """What one apply changes: each migrated file (backed up, its mode kept; moved aside when new_text is None), then
    our file when its text or mode differs."""
    changes: list[Change] = [{"path": m["path"], "text": m["new_text"], "mode": files[m["path"]]["mode"],
                              "backup": True} for m in moves]
    current = files.get(netplan_file)
    if current is None or current["text"] != want or current["mode"] != NETPLAN_MODE:
        changes.append({"path": netplan_file, "text": want, "mode": NETPLAN_MODE, "backup": False})
    return changes


def shadow_problems(changes: list[Change], found: NetplanStateDict, stage_dir: str = NETPLAN_STAGE_DIR) -> list[str]:
    """A file already under the stage folder at a name this apply stages, while no apply of ours is left undecided:
    someone else's runtime override (it shadows the file under /etc/netplan), never overwritten."""
    if found["undecided"]:  # its staged files are ours; settling it removes them before this apply runs
        return []
    return [f"{staged_path(c['path'], stage_dir)} shadows {c['path']} (netplan reads the one under {stage_dir} "
            "until the next boot) and sparkfold did not put it there: remove it or reboot, then re-run"
            for c in changes if staged_path(c["path"], stage_dir) in found["staged"]]


def show_changes(changes: list[Change], files: dict, apply_dir: str) -> None:
    """--diff: each file as it will be once the apply is confirmed (files.put would diff the staged copy, a new
    file under /run/netplan, instead of the file it replaces)."""
    if not state.config.DIFF:
        return
    for change in changes:
        path, current = change["path"], files.get(change["path"])
        if change["text"] is None:
            logger.info(f"{host.name}: Will move {path} aside (to {backup_path(path, apply_dir)}) once the apply "
                        "is confirmed")
            continue
        logger.info(f"{host.name}: Will {'modify' if current else 'create'} {path} (staged under "
                    f"{NETPLAN_STAGE_DIR} until the apply is confirmed)")
        old = current["text"].splitlines(keepends=True) if current else []
        for line in generate_color_diff(old, change["text"].splitlines(keepends=True)):
            logger.info("  %s", line)
        logger.info("")


# --- operations ---------------------------------------------------------------------------------------------

@operation()
def netplan_applies_settled(netplan_file: str):
    """No netplan apply left undecided or half done by an interrupted run or a reboot: one never confirmed is undone
    (revert.sh: its files dropped from /run/netplan, /etc/netplan's applied again if it ran in this boot), a
    confirmed one whose files were not all written to /etc/netplan is finished (promote.sh)."""
    found = fact_until_change(host, NetplanState, directory=os.path.dirname(netplan_file))["undecided"]
    if not found:
        host.noop("no netplan apply is left undecided")
        return
    for apply_dir, decision in sorted(found.items()):
        warned("netplan", f"the apply in {apply_dir} was " + (
            "confirmed but not all written to /etc/netplan: its files are written now" if decision == "confirm"
            else "never confirmed (a run stopped, or the Spark rebooted, before it was): it is undone now"))
        yield settle_command(apply_dir, decision)


@operation()
def netplan_link(rails: list[dict], mtu: int, netplan_file: str, rollback_s: int = 120):
    """This project's netplan file for the link rails (mode 600), other files' stanzas for the same netdevs migrated
    (backup kept), and `netplan generate && netplan apply` only when something changed: the file, a migration, or
    the live addresses/MTU drifted from it. The apply is guarded (operations/network/netplan_apply.py): the new files
    are staged under /run/netplan and written to /etc/netplan only once a new ssh connection from this machine
    confirms the apply; else the Spark undoes it by itself after rollback_s, and a reboot boots the old files.
    Custom: core writes a file; this also migrates the others and applies with a way back."""
    if not netplan_file.endswith(".yaml"):
        yield from check_failed("link_netplan_file", [f"{netplan_file} must end in .yaml (netplan reads only *.yaml)"])
        return
    found = fact_until_change(host, NetplanState, directory=os.path.dirname(netplan_file))
    netplan_files = found["files"]
    current = netplan_files.get(netplan_file)
    if problem := foreign_file_problem(netplan_file, current["text"] if current else None):
        yield from check_failed("a file sparkfold would write", [problem])  # --dry: "will fail", nothing planned
        return
    moves, errors = plan_migration(netplan_files, netplan_file, [r["netdev"] for r in rails])
    if errors:
        yield from check_failed("netplan files", errors)  # --dry: "will fail", nothing planned
        return
    want = render_netplan(rails, mtu)
    addrs = fact_until_change(host, IpAddresses, _sudo=False)  # the same answer as the other checks'
    # drift: the file is right but an address or MTU is gone from a netdev (e.g. `ip addr del`): apply again
    drifted = bool(address_problems(rails, addrs, int(mtu), netplan_file))
    apply = bool(moves) or current is None or current["text"] != want or drifted  # a mode fix alone does not
    if not apply and current is not None:
        if current["mode"] != NETPLAN_MODE:
            yield from core_files.put._inner(src=StringIO(want), dest=netplan_file, mode=NETPLAN_MODE)
        host.noop(f"{netplan_file} is up to date")
        return
    changes = netplan_changes(netplan_files, netplan_file, want, moves)
    if problems := shadow_problems(changes, found):
        yield from check_failed("netplan stage folder", problems)  # --dry: "will fail", nothing planned
        return
    # the management address to keep: the default route's interface, unless it is one of the rails
    mgmt_dev = host.get_fact(DefaultRouteDevice)
    mgmt_netdev = None if mgmt_dev is None or mgmt_dev in {r["netdev"] for r in rails} else addrs.get(mgmt_dev)
    mgmt_ips = mgmt_netdev.get("ipv4", []) if mgmt_netdev else []
    apply_dir = new_apply_dir()
    show_changes(changes, netplan_files, apply_dir)  # before the first command: planning may stop reading there
    yield from guarded_apply(apply_dir, changes, int(rollback_s), mgmt_dev if mgmt_ips else None,
                             ip_of(mgmt_ips[0]) if mgmt_ips else None, sudo_arguments(host))


@operation()
def rails_safe(rails: list[dict]):
    """Check, before any network change: no rail is the management netdev, the ssh path, or in a subnet that overlaps
    another interface's."""
    problems = rail_hazards(rails, fact_until_change(host, IpAddresses), host.get_fact(DefaultRouteDevices),
                            host.get_fact(SshServerAddress))
    if not (yield from check_failed("link rails", problems)):
        host.noop("no rail touches the management network or another interface's subnet")


@operation()
def link_addresses(rails: list[dict], mtu: int, netplan_file: str, settled: bool | Callable[[], bool] = False):
    """Check: every rail netdev has its address and the link MTU. settled: no netplan apply in this run."""
    problems = address_problems(rails, fact_until_change(host, IpAddresses), int(mtu), netplan_file)
    if not problems:
        host.noop("link addresses and MTU are in place")
        return
    yield from check_failed("link addresses", problems, settled=settled)


@operation()
def link_ping(rails: list[dict], peer_rails: list[dict], mtu: int):
    """Check: the peer answers a full-size do-not-fragment ping on each rail (all rails pinged at once)."""
    problems = []
    pairs = [[rail["netdev"], ip_of(peer["address"])] for rail, peer in zip(rails, peer_rails, strict=False)]
    answers = host.get_fact(RailPings, pairs=pairs, size=int(mtu) - 28)
    for rail, peer in zip(rails, peer_rails, strict=False):
        peer_ip = ip_of(peer["address"])
        if not answers.get(rail["netdev"]):
            problems.append(
                f"no reply from {peer_ip} over {rail['netdev']} with a {mtu}-byte do-not-fragment ping "
                f"(`ping -I {rail['netdev']} -M do -s {int(mtu) - 28} {peer_ip}`): check the cable, that the "
                f"other Spark has {peer['address']} on {peer['netdev']}, that each rail is in its own subnet "
                f"or both share one, and that link_mtu is the same on both Sparks"
            )
    if not problems:
        host.noop("the peer answers on every rail")
        return
    # never settled while planning: the peer's netplan apply in this run may bring its end up
    yield from check_failed("link ping", problems, settled=False)


@operation()
def roce_gids(rails: list[dict], settled: bool | Callable[[], bool] = False):
    """Check: each rail's RoCE device has a RoCE v2 GID holding this rail's IPv4 address. settled: no netplan
    apply in this run."""
    records = rails_from_facts(rails, {}, fact_until_change(host, RoceDevices))
    # the driver adds a new address's GIDs shortly after `netplan apply` (asynchronously): an executing run that
    # applied it waits for them a little before judging
    # why: only a run that applied netplan has GIDs worth waiting for; the plan judges what the Spark holds now
    for _ in range(GID_WAIT_TRIES if state.is_executing and not is_settled(settled) else 0):
        if all(r["ibdev"] is None or r["gid_index"] is not None for r in records):
            break
        gevent.sleep(0.5)
        records = rails_from_facts(rails, {}, fact_until_change(host, RoceDevices, _fresh=True))
    problems = []
    for record in records:
        ip = ip_of(record["address"])
        if record["ibdev"] is None:
            problems.append(f"no RoCE device found for {record['netdev']} (nothing under "
                            f"/sys/class/net/{record['netdev']}/device/infiniband/): set \"ibdev\" for this rail "
                            f"in link_rails (`ibdev2netdev` shows the pairs) or check the mlx5 driver")
        elif record["gid_index"] is None:
            problems.append(f"{record['ibdev']} has no RoCE v2 GID for {ip} (/sys/class/infiniband/"
                            f"{record['ibdev']}/ports/{ROCE_PORT}/gids; an all-zero or v1 entry is not enough): "
                            f"check that {record['netdev']} has {record['address']} (`ip -4 addr show "
                            f"{record['netdev']}`) and that {record['ibdev']} belongs to it")
    if not problems:
        host.noop("every rail has a RoCE v2 GID")
        return
    yield from check_failed("RoCE GIDs", problems, settled=settled)


@operation()
def link_recorded(rails: list[dict], path: str, settled: bool | Callable[[], bool] = False):
    """Write <state_dir>/link.json with the rails (GID index included) when its content differs (files.put).
    settled: no netplan apply in this run."""
    want = link_record(rails, fact_until_change(host, IpAddresses), fact_until_change(host, RoceDevices))
    if fact_until_change(host, LinkRecord, path=path) == want:
        host.noop(f"{path} is up to date")
        return
    if any(r["gid_index"] is None or r["ibdev"] is None for r in want["rails"]):  # the GID check names the cause
        yield from check_failed("link record", [f"cannot record the link in {path}: a rail has no RoCE device or "
                                                "v2 GID"], settled=settled)
        return
    yield from core_files.put._inner(src=StringIO(json.dumps(want, indent=2, sort_keys=True) + "\n"), dest=path)


@deploy("CX7 link")
def link(s) -> None:
    """On both Sparks at the same call sites (lock-step: both ends are addressed before the ping runs). The
    netplan file and the ping need root, the record belongs to the ssh user: _sudo is given per operation."""
    rails = [dict(r) for r in s.link_rails]
    peer_rails = [dict(r) for r in s.peer.link_rails]
    mtu = int(s.link_mtu)
    for note in rail_warnings(rails):  # a prefix wider than usual that link_prefix_min allowed: said once, planning
        warned("link_prefix_min", note)
    rails_safe(name="no rail on the management network", rails=rails)
    # an apply a killed run or a reboot left is settled before a new one is planned against /etc/netplan
    settle = netplan_applies_settled(name="netplan apply an earlier run left", netplan_file=s.link_netplan_file,
                                     _sudo=True)
    netplan = netplan_link(name="netplan file and apply", rails=rails, mtu=mtu, netplan_file=s.link_netplan_file,
                           rollback_s=s.link_rollback_s, _sudo=True)
    def settled() -> bool:  # the checks below read what an apply in this run changes; asked when they run
        return not (op_changed(settle) or op_changed(netplan))

    link_addresses(name="addresses and MTU", rails=rails, mtu=mtu, netplan_file=s.link_netplan_file,
                   settled=settled)
    # sudo: binding ping to a netdev (-I) needs CAP_NET_RAW where ping has no file capability
    link_ping(name="full-size DF ping per rail", rails=rails, peer_rails=peer_rails, mtu=mtu, _sudo=True)
    roce_gids(name="RoCE v2 GID per rail", rails=rails, settled=settled)
    link_recorded(name="record rails", rails=rails, path=s.layout.link_record, settled=settled, _sudo=False)
