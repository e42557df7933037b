"""Facts about the network: netdevs and their addresses, the default route, netplan files and applies, the RoCE
devices and their GIDs, /dev/infiniband, do-not-fragment pings over the CX7 link, and the link record the deploy
writes.

Every command exits 0; those that only ask `ip` or `ping` declare it with requires_command.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from operations.facts.docker import image_id_or_kept, kept_file, split_kept
from operations.layout import NETPLAN_APPLY_DIR, NETPLAN_STAGE_DIR
from operations.util import sh

SYSFS_IB = "/sys/class/infiniband"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


class NetdevDict(TypedDict):
    mtu: int | None
    operstate: str
    ipv4: list[str]  # "a.b.c.d/prefix"
    ipv6: list[str]  # "x:y::z/prefix" (the ssh path may arrive over IPv6)


class IpAddresses(FactBase[dict[str, NetdevDict]]):
    """{netdev: its MTU, operstate, IPv4 and IPv6 addresses} from `ip -j addr show`: what the link step checks."""

    default = dict

    def requires_command(self) -> str:
        return "ip"

    def command(self) -> str:
        return "ip -j addr show 2>/dev/null || echo '[]'"

    def process(self, output: list[str]) -> dict[str, NetdevDict]:
        try:
            entries = json.loads("".join(output))
        except ValueError:
            return {}
        netdevs: dict[str, NetdevDict] = {}
        for entry in entries if isinstance(entries, list) else []:
            name = entry.get("ifname")
            if not name:
                continue
            # iproute2 sometimes emits empty {} entries in addr_info; skip anything without a local address
            found: dict[str, list[str]] = {"inet": [], "inet6": []}
            for addr in entry.get("addr_info") or []:
                if addr.get("family") in found and addr.get("local"):
                    full = 32 if addr["family"] == "inet" else 128
                    found[addr["family"]].append(f"{addr['local']}/{addr.get('prefixlen', full)}")
            netdevs[name] = {"mtu": entry.get("mtu"), "operstate": entry.get("operstate", ""), "ipv4": found["inet"],
                             "ipv6": found["inet6"]}
        return netdevs


class DefaultRouteDevice(FactBase[str | None]):
    """The netdev of the IPv4 default route (the management network, never a rail), or None."""

    def requires_command(self) -> str:
        return "ip"

    def command(self) -> str:
        return "ip -j -4 route show default 2>/dev/null || echo '[]'"

    def process(self, output: list[str]) -> str | None:
        try:
            routes = json.loads("".join(output))
        except ValueError:
            return None
        for route in routes if isinstance(routes, list) else []:
            if route.get("dev"):
                return route["dev"]
        return None


class DefaultRouteDevices(FactBase[list[str]]):
    """The netdevs of the IPv4 and the IPv6 default routes (either may be the management network), IPv4's first."""

    default = list

    def requires_command(self) -> str:
        return "ip"

    def command(self) -> str:
        # one JSON array per line, one per family
        return "ip -j -4 route show default 2>/dev/null || echo '[]'; echo; ip -j -6 route show default 2>/dev/null " \
               "|| echo '[]'"

    def process(self, output: list[str]) -> list[str]:
        devs: list[str] = []
        for line in output:
            try:
                routes = json.loads(line) if line.strip() else []
            except ValueError:
                continue
            for route in routes if isinstance(routes, list) else []:
                if isinstance(route, dict) and route.get("dev") and route["dev"] not in devs:
                    devs.append(route["dev"])
        return devs


class NetplanFileDict(TypedDict):
    mode: str  # octal, e.g. "600"
    text: str  # "" when unreadable


def _yaml_listing(directory: str) -> StringCommand:
    """One line per *.yaml of a folder: path, octal mode, base64 of the text (a file that cannot be read prints an
    empty text); base64 keeps any content on one line."""
    glob = StringCommand(QuoteString(directory.rstrip("/")), "/*.yaml", _separator="")
    return StringCommand(
        "for f in", glob, "; do [ -f \"$f\" ] || continue;",
        "printf '%s %s ' \"$f\" \"$(stat -c %a \"$f\")\";",
        "base64 -w0 \"$f\" 2>/dev/null; echo; done",
    )


def _parse_listing(output: list[str]) -> dict[str, NetplanFileDict]:
    files: dict[str, NetplanFileDict] = {}
    for line in output:
        parts = line.split(" ")
        if len(parts) < 2 or not parts[0].startswith("/"):
            continue
        try:
            text = base64.b64decode(parts[2] if len(parts) > 2 else "").decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            text = ""
        files[parts[0]] = {"mode": parts[1], "text": text}
    return files


class NetplanStateDict(TypedDict):
    files: dict[str, NetplanFileDict]  # the netplan folder's *.yaml
    staged: dict[str, NetplanFileDict]  # the stage folder's *.yaml (/run/netplan): each shadows the file of its name
    undecided: dict[str, str]  # apply folder -> "pending" (nobody decided), "revert" or "confirm" (claimed, unfinished)


class NetplanState(FactBase[NetplanStateDict]):
    """In one round trip: the netplan folder's files, the stage folder's (an apply's files until it is confirmed)
    and the applies an interrupted run or a reboot left undecided or half done (root-only: call with sudo).

    An apply folder is decided by its `decided` symlink (-> revert or confirm) and done by its `reverted` or
    `confirmed` file. One an older sparkfold made (`decided` a folder) is listed only while it has no `decided`."""

    @staticmethod
    def default() -> NetplanStateDict:
        return {"files": {}, "staged": {}, "undecided": {}}

    def command(self, directory: str = "/etc/netplan", stage_dir: str = NETPLAN_STAGE_DIR,
                applies_dir: str = NETPLAN_APPLY_DIR) -> StringCommand:
        applies = StringCommand(QuoteString(applies_dir.rstrip("/")), "/*/", _separator="")
        return StringCommand(
            _yaml_listing(directory), "; echo staged;", _yaml_listing(stage_dir), ";",
            "for d in", applies, "; do d=${d%/}; [ -d \"$d\" ] || continue;",
            "if [ -e \"$d/confirmed\" ] || [ -e \"$d/reverted\" ]; then continue; fi;",
            "if [ -L \"$d/decided\" ]; then echo \"apply $d $(readlink \"$d/decided\")\";",
            "elif [ ! -e \"$d/decided\" ]; then echo \"apply $d pending\"; fi; done; true",
        )

    def process(self, output: list[str]) -> NetplanStateDict:
        cut = output.index("staged") if "staged" in output else len(output)
        undecided = {}
        for line in output[cut + 1:]:
            words = line.split(" ")
            if len(words) == 3 and words[0] == "apply" and words[2] in ("pending", "revert", "confirm"):
                undecided[words[1]] = words[2]
        return {"files": _parse_listing(output[:cut]), "staged": _parse_listing(output[cut + 1:]),
                "undecided": undecided}


class GidDict(TypedDict):
    gid: str
    type: str  # "RoCE v2", "IB/RoCE v1"
    ndev: str  # the netdev the GID belongs to


class RoceDeviceDict(TypedDict):
    netdevs: list[str]
    gids: dict[int, dict[int, GidDict]]  # port -> GID index -> entry


class RoceDevices(FactBase[dict[str, RoceDeviceDict]]):
    """{ibdev: its netdevs and GID tables} from /sys/class/infiniband: the RoCE v2 GID index the ranks use.

    Only populated (non-zero) GID entries are listed. The netdev mapping comes from the real mlx5 layout:
    /sys/class/net/<netdev>/device/infiniband/<ibdev> and /sys/class/infiniband/<ibdev>/device/net/<netdev>.
    """

    default = dict

    def command(self, sysfs_ib: str = SYSFS_IB) -> StringCommand:
        base = QuoteString(sysfs_ib.rstrip("/"))

        def glob(tail):
            return StringCommand(base, tail, _separator="")

        # Reading types/ndevs of an empty slot fails (EINVAL) on real sysfs: grep -s skips those.
        return StringCommand(
            "{ grep -s -H .", glob("/*/ports/*/gids/*"), "| grep -v", QuoteString(":" + ZERO_GID + "$"), ";",
            "grep -s -H .", glob("/*/ports/*/gid_attrs/types/*"), glob("/*/ports/*/gid_attrs/ndevs/*"), ";",
            "ls -1d", glob("/*/device/net/*"), "/sys/class/net/*/device/infiniband/*", "2>/dev/null; } || true",
        )

    def process(self, output: list[str]) -> dict[str, RoceDeviceDict]:
        devices: dict[str, Any] = {}

        def device(name):
            return devices.setdefault(name, {"netdevs": [], "gids": {}})

        def add_netdev(ibdev, netdev):
            netdevs = device(ibdev)["netdevs"]
            if netdev not in netdevs:
                netdevs.append(netdev)

        for line in output:
            path, sep, value = line.strip().partition(":")
            parts = path.split("/")
            if len(parts) < 6:
                continue
            if sep and parts[-2] == "gids" and parts[-4] == "ports":
                ibdev, port, kind = parts[-5], parts[-3], "gid"
            elif sep and parts[-3] == "gid_attrs" and parts[-5] == "ports" and parts[-2] in ("types", "ndevs"):
                ibdev, port, kind = parts[-6], parts[-4], parts[-2][:-1]
            elif not sep and parts[-3:-1] == ["device", "net"]:
                add_netdev(parts[-4], parts[-1])
                continue
            elif not sep and parts[-3:-1] == ["device", "infiniband"]:
                add_netdev(parts[-1], parts[-4])
                continue
            else:
                continue
            if port.isdigit() and parts[-1].isdigit():
                table = device(ibdev)["gids"].setdefault(int(port), {})
                table.setdefault(int(parts[-1]), {})[kind] = value.strip()
        for dev in devices.values():
            for port, table in dev["gids"].items():
                # keep entries that have a GID (a types line alone belongs to a zero GID filtered above)
                dev["gids"][port] = {
                    i: {"gid": e["gid"], "type": e.get("type", ""), "ndev": e.get("ndev", "")}
                    for i, e in table.items()
                    if e.get("gid")
                }
        return devices


def _df_ping(netdev: str, address: str, size: int) -> StringCommand:
    # a probe every 0.2 s until the first reply, 2 s at most: a lost first probe (ARP) is not a failure, and an
    # answering peer costs one round trip instead of ping's default 1 s between probes
    return StringCommand("ping -c 1 -i 0.2 -w 2 -I", QuoteString(netdev), "-M do -s", int(size),
                         QuoteString(address), ">/dev/null 2>&1")


class PingOk(FactBase[bool]):
    """True when the peer answers a full-size do-not-fragment ping bound to one netdev (the MTU holds end to end)."""

    default = bool

    def requires_command(self, netdev: str, address: str, size: int) -> str:
        return "ping"

    def command(self, netdev: str, address: str, size: int) -> StringCommand:
        return StringCommand(_df_ping(netdev, address, size), "&& echo ok || echo fail")

    def process(self, output: list[str]) -> bool:
        return any(line.strip() == "ok" for line in output)


class RailPings(FactBase[dict[str, bool]]):
    """{netdev: the peer answers PingOk's ping on it} for every (netdev, peer address) pair, pinged all at once in one
    round trip (a rail that does not answer costs its 2 s once, not once per rail)."""

    default = dict

    def requires_command(self, pairs: list, size: int) -> str:
        return "ping"

    def command(self, pairs: list, size: int) -> StringCommand:
        parts: list = []
        for netdev, address in pairs:
            parts += ["{", _df_ping(netdev, address, size), "&& echo", QuoteString(f"ok {netdev}"), "|| echo",
                      QuoteString(f"fail {netdev}"), "; } &"]
        return StringCommand(*parts, "wait")

    def process(self, output: list[str]) -> dict[str, bool]:
        answers = {}
        for line in output:
            verdict, _, netdev = line.strip().partition(" ")
            if verdict in ("ok", "fail") and netdev:
                answers[netdev] = verdict == "ok"
        return answers


class LinkRecord(FactBase[dict[str, Any] | None]):
    """The rails the deploy recorded in <state_dir>/link.json, or None when absent or unreadable:
    {"rails": [{"netdev", "ibdev", "address" ("ip/prefix"), "gid_index", "mtu"}], "socket_ifname": netdev}."""

    def command(self, path: str) -> StringCommand:
        return StringCommand("cat", QuoteString(path), "2>/dev/null || true")

    def process(self, output: list[str]) -> dict[str, Any] | None:
        try:
            record = json.loads("\n".join(output))
        except ValueError:
            return None
        return record if isinstance(record, dict) else None


class InfinibandDevices(FactBase[bool]):
    """True when /dev/infiniband exists (the RDMA devices a rank container is given)."""

    default = bool

    def command(self) -> str:
        return "test -d /dev/infiniband && echo yes || echo no"

    def process(self, output: list[str]) -> bool:
        return any(line.strip() == "yes" for line in output)


_SS_USER = re.compile(r'users:\(\("([^"]+)",pid=(\d+)')


class PortListeners(FactBase[list[str]]):
    """Who listens on TCP `port` (`ss -ltnp`): "name (pid N)" per socket, or "a process" when ss may not name it
    (another user's process, seen without root); [] when the port is free."""

    default = list

    def requires_command(self, port: int) -> str:
        return "ss"

    def command(self, port: int) -> StringCommand:
        return StringCommand("ss -ltnpH", QuoteString(f"sport = :{int(port)}"), "2>/dev/null || true")

    def process(self, output: list[str]) -> list[str]:
        found = []
        for line in output:
            if not line.strip().startswith("LISTEN"):
                continue
            match = _SS_USER.search(line)
            found.append(f"{match.group(1)} (pid {match.group(2)})" if match else "a process")
        return found


class SshServerAddress(FactBase[str | None]):
    """The address of this Spark that the run's ssh connection arrived on (SSH_CONNECTION's third field)."""

    def command(self) -> str:
        return 'echo "${SSH_CONNECTION:-}" | cut -d" " -f3'

    def process(self, output: list[str]) -> str | None:
        return output[0].strip() or None if output else None


class RailHardwareDict(TypedDict):
    net: dict[str, dict[str, Any]]  # netdev -> {"speed_mbps": int | None, "operstate": str}
    ib: dict[str, str]  # ibdev -> port 1's state as sysfs prints it ("4: ACTIVE")


class RailHardware(FactBase[RailHardwareDict]):
    """Each twin's link speed (Mb/s; None when the netdev cannot say, e.g. no carrier) and operstate from
    /sys/class/net, and its RoCE port's state from /sys/class/infiniband (what `rdma link` shows)."""

    @staticmethod
    def default() -> RailHardwareDict:
        return {"net": {}, "ib": {}}

    def command(self, netdevs: list[str], ibdevs: list[str]) -> StringCommand:
        parts: list[Any] = []
        for netdev in netdevs:
            base = f"/sys/class/net/{netdev}"
            parts += ["printf 'net %s %s %s\\n'", QuoteString(netdev),
                      StringCommand('"$(cat', QuoteString(f"{base}/speed"), '2>/dev/null || echo -)"'),
                      StringCommand('"$(cat', QuoteString(f"{base}/operstate"), '2>/dev/null || echo -)";')]
        for ibdev in ibdevs:
            parts += ["printf 'ib %s %s\\n'", QuoteString(ibdev),
                      StringCommand('"$(cat', QuoteString(f"{SYSFS_IB}/{ibdev}/ports/1/state"),
                                    '2>/dev/null || echo -)";')]
        return StringCommand(*parts, "true")

    def process(self, output: list[str]) -> RailHardwareDict:
        found: RailHardwareDict = {"net": {}, "ib": {}}
        for line in output:
            words = line.strip().split(" ", 2)
            if len(words) < 3:
                continue
            if words[0] == "net":
                speed, _, oper = words[2].partition(" ")
                found["net"][words[1]] = {"speed_mbps": int(speed) if speed.lstrip("-").isdigit() and
                                          int(speed) > 0 else None, "operstate": oper.strip("- ")}
            elif words[0] == "ib":
                found["ib"][words[1]] = words[2].strip("- ")
        return found


class BandwidthSideDict(TypedDict):
    kernel: str
    perftest: bool  # ib_write_bw is on the PATH
    cma_total_kb: int | None  # CmaTotal in /proc/meminfo (None: the line is absent)
    record: dict[str, Any] | None  # the last measurement (<state_dir>/link-bandwidth.json)


class BandwidthSide(FactBase[BandwidthSideDict]):
    """What the link measurement reads on one Spark in one round trip: the kernel, whether perftest's ib_write_bw is
    installed, CmaTotal, and the last measurement's record."""

    @staticmethod
    def default() -> BandwidthSideDict:
        return {"kernel": "", "perftest": False, "cma_total_kb": None, "record": None}

    def command(self, path: str) -> StringCommand:
        # each probe prints only what it finds: an absent tool, line or record is an absent line, not an error
        return StringCommand("echo \"kernel $(uname -r)\"; if command -v ib_write_bw >/dev/null; then echo perftest",
                             "yes; fi; grep -s '^CmaTotal:' /proc/meminfo; echo record; if [ -f", QuoteString(path),
                             "]; then cat", QuoteString(path), "; fi")

    def process(self, output: list[str]) -> BandwidthSideDict:
        found = self.default()
        cut = output.index("record") if "record" in output else len(output)
        for line in output[:cut]:
            if line.startswith("kernel "):
                found["kernel"] = line[len("kernel "):].strip()
            elif line.strip() == "perftest yes":
                found["perftest"] = True
            elif match := re.match(r"CmaTotal:\s+(\d+)", line.strip()):
                found["cma_total_kb"] = int(match.group(1))
        try:
            record = json.loads("\n".join(output[cut + 1:]))
        except ValueError:
            record = None
        found["record"] = record if isinstance(record, dict) else None
        return found


NCCL_CONF = "/etc/nccl.conf"
NCCL_CONF_MARK = "#sparkfold: nccl.conf present"  # the last line after the file's text
NCCL_CONF_NONE = "#sparkfold: no nccl.conf"  # the only line when the image has none


class NcclConfDict(TypedDict):
    image_id: str  # Docker's id of the image read ("sha256:...")
    text: str | None  # the file's text ("" for an empty one); None when the image has no /etc/nccl.conf
    cached: bool  # read from the cache file, not from a container
    whole: bool  # the answer ended with its mark (only such an answer is kept)


def nccl_conf_cache_file(cache_dir: str, image_id: str) -> str:
    """Where the answer for image `image_id` is kept: `<cache_dir>/<id without "sha256:">.txt`, the same lines a
    container prints (NCCL_CONF_NONE, or the text then NCCL_CONF_MARK)."""
    return kept_file(cache_dir, image_id, ".txt")


def nccl_conf_kept_text(text: str | None) -> str:
    """The cache file's content for an answer, but its last newline: what ImageNcclConf's container prints for it."""
    return NCCL_CONF_NONE if text is None else f"{text}\n\n{NCCL_CONF_MARK}"


class ImageNcclConf(FactBase[NcclConfDict]):
    """The text of /etc/nccl.conf in an image (NCCL reads it before the environment), None when it has none, with
    the image's id.

    cache_dir: the answer is read from nccl_conf_cache_file when that holds one whole (it ends with its mark), so a
    converged run reads a small file instead of starting a container; `cached` says which. An image's content
    cannot change under its id: a rebuilt or re-pulled image has a new one and is read afresh. This fact only reads
    (it also runs under --dry): link_measure keeps what it read from the image.
    """

    @staticmethod
    def default() -> NcclConfDict:
        return {"image_id": "", "text": None, "cached": False, "whole": False}

    def requires_command(self, image: str, cache_dir: str = "") -> str:
        return "docker"

    def command(self, image: str, cache_dir: str = "") -> str:
        # a missing image or docker failing fails the fact: only a file that is not there reads as None
        script = (f"if [ -f {NCCL_CONF} ]; then cat {NCCL_CONF}; echo; echo '{NCCL_CONF_MARK}'; "
                  f"else echo '{NCCL_CONF_NONE}'; fi")
        # whole: the one line of an image without the file, or anything ending with the mark
        kept = image_id_or_kept(image, cache_dir, ".txt", f"{sh(NCCL_CONF_NONE)}|*{sh(NCCL_CONF_MARK)}",
                                missing_fails=True)
        return kept + f"docker run --rm --network none --entrypoint sh {sh(image)} -c {sh(script)}"

    def process(self, output: list[str]) -> NcclConfDict:
        found = self.default()
        found["image_id"], found["cached"], lines = split_kept(output)
        last = lines[-1].strip() if lines else ""
        if last == NCCL_CONF_MARK:
            found["text"] = "\n".join(lines[:-1]).rstrip()
        found["whole"] = last in (NCCL_CONF_MARK, NCCL_CONF_NONE)
        found["cached"] = found["cached"] and found["whole"]
        return found
