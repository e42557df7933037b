"""The link's measured bandwidth, as pure code: perftest's `ib_write_bw` report read, what the measurement depends on
(its inputs, so a converged run does not measure again), and the judgment of the figures with the most likely cause
of a slow link named first (docs/link.md says what each finding means).

A side's readings: {"rails": [{"netdev", "ibdev", "gid_index", "address", "mtu", "speed_mbps", "operstate",
"port_state"}], "kernel": str, "cma_total_kb": int | None}. Figures: {"alone": {netdev: Gb/s | None},
"together": {netdev: Gb/s | None}, "errors": {netdev: text}} (None: no report, the run failed).
"""

from __future__ import annotations

import re
from typing import Any

WANT_MTU = 9000  # the link MTU the figures in docs/link.md were taken with
PERFTEST_PORT = 18515  # ib_write_bw's default port (-p); rail i uses PERFTEST_PORT + i
MESSAGE_BYTES = 65536  # ib_write_bw's own default size (-s): large enough for the line rate, small beside a rank
IDLE_SHARE = 0.2  # a rail carrying less than this share of the other's traffic, both at once, is idle

# perftest's result header: "BW average[MB/sec]" (4.5), "[MiB/sec]" (newer) or "[Gb/sec]" (--report_gbits)
_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(?P<unit>MB|MiB|Gb)/sec\]\s+BW average\[(?:MB|MiB|Gb)/sec\]")
# the message rate column is missing in older perftests' reports
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)(?:\s+([\d.]+))?\s*$")
# perftest's MB/sec and MiB/sec are both 2**20 bytes a second (format_factor 0x100000); Gb/sec is 10**9 bits
_TO_GBPS = {"MB": 2**20 * 8 / 1e9, "MiB": 2**20 * 8 / 1e9, "Gb": 1.0}


def parse_write_bw(text: str) -> dict[str, Any] | None:
    """ib_write_bw's result row under its header: {"bytes", "iterations", "peak", "average", "msg_rate_mpps",
    "unit", "gbps"} (gbps: the average in Gb/s), or None when the output holds no report (the run failed)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        header = _HEADER.search(line)
        if not header:
            continue
        for row_line in lines[i + 1:]:
            row = _ROW.match(row_line)
            if row:
                unit = header.group("unit")
                average = float(row.group(4))
                return {"bytes": int(row.group(1)), "iterations": int(row.group(2)), "peak": float(row.group(3)),
                        "average": average, "msg_rate_mpps": float(row.group(5)) if row.group(5) else None,
                        "unit": unit, "gbps": round(average * _TO_GBPS[unit], 3)}
            if row_line.startswith("---"):
                break
    return None


def failure_of(text: str) -> str:
    """The line of a failed run that says why (perftest's own words), or "no report"."""
    for line in text.splitlines():
        words = line.strip()
        if words and not words.startswith(("-", "*", "#")) and ("Couldn't" in words or "Unable" in words
                                                                 or "state is" in words or "error" in words.lower()
                                                                 or words.startswith("sudo:")):
            return words
    return "no report"


def measure_inputs(head: dict[str, Any], worker: dict[str, Any], min_gbps: float) -> dict[str, Any]:
    """What a measurement and its judgment depend on: each side's rails (addresses, MTU, GIDs, devices) and kernel,
    and link_min_gbps. Equal inputs and a passing record: the link is not measured again. The image is not one:
    what it changes is its /etc/nccl.conf, judged on every run (nccl_conf_finding; read once per image id and kept,
    Layout.nccl_conf_cache), and an upgrade or a rollback would otherwise measure the rails while the old pair serves
    on them."""
    def side(found: dict[str, Any]) -> dict[str, Any]:
        keys = ("netdev", "ibdev", "gid_index", "address", "mtu")
        return {"rails": [{k: rail.get(k) for k in keys} for rail in found.get("rails", [])],
                "kernel": found.get("kernel", "")}
    return {"head": side(head), "worker": side(worker), "min_gbps": float(min_gbps)}


def changed_inputs(record: dict[str, Any] | None, inputs: dict[str, Any], mode: str = "stop") -> list[str]:
    """Why the link is measured in this run ([] when it is not): nothing recorded (or a record of another shape),
    the last measurement did not pass, or which inputs changed. A short measurement the user let through
    (link_measure = "warn" then and now) stands: measuring it again each run would change nothing."""
    if not well_formed(record):
        return ["nothing is recorded"]
    assert record is not None
    old = record["inputs"]
    why = []
    for role in ("head", "worker"):
        before, now = old.get(role) or {}, inputs[role]
        if before.get("kernel") != now["kernel"]:
            why.append(f"the {role}'s kernel")
        old_rails, new_rails = before.get("rails") or [], now["rails"]
        for key, what in (("address", "addresses"), ("mtu", "MTU"), ("gid_index", "GIDs"),
                          ("netdev", "devices"), ("ibdev", "devices")):
            if [r.get(key) for r in old_rails] != [r.get(key) for r in new_rails]:
                label = f"the {role}'s {what}"
                if label not in why:
                    why.append(label)
    if old.get("min_gbps") != inputs["min_gbps"]:
        why.append("link_min_gbps")
    if not why and record.get("passed") is not True and not (record.get("mode") == "warn" and mode == "warn"):
        why.append("the last measurement did not pass")
    return why


def well_formed(record: Any) -> bool:
    """A record as record_text writes it, in the parts the decision reads (a hand-edited or older file is measured
    again rather than trusted or crashed on)."""
    if not isinstance(record, dict) or not isinstance(record.get("inputs"), dict):
        return False
    sides = [record["inputs"].get(role) for role in ("head", "worker")]
    return all(isinstance(side, dict) and isinstance(side.get("rails", []), list)
               and all(isinstance(rail, dict) for rail in side.get("rails", [])) for side in sides) \
        and isinstance(record.get("figures"), dict) \
        and all(isinstance(record["figures"].get(key), dict) for key in ("alone", "together"))


def measure_reasons(head_record: dict[str, Any] | None, worker_record: dict[str, Any] | None,
                    inputs: dict[str, Any], mode: str = "stop") -> list[str]:
    """Why the deploy measures ([] when it does not): the head's record judged by changed_inputs, and the worker's
    record must hold the same inputs (both Sparks keep the figures)."""
    why = changed_inputs(head_record, inputs, mode)
    if not why and (worker_record or {}).get("inputs") != inputs:
        why = ["the worker has no record of it"]
    return why


def rate(gbps: float) -> str:
    """A figure in Gb/s as shown: one decimal, or two significant digits below 1 (a throttled twin is not 0.0)."""
    return f"{gbps:.1f}" if gbps >= 1 or gbps == 0 else f"{gbps:.2g}"


def figures_line(figures: dict[str, Any], rails: list[str]) -> str:
    """`enp1s0f0np0 92.1 Gb/s alone, 91.0 together; ...; both 182.3 Gb/s` (a failed run: `no report`)."""
    def shown(value: float | None) -> str:
        return "no report" if value is None else f"{rate(value)} Gb/s"
    parts = [f"{n} {shown(figures['alone'].get(n))} alone, {shown(figures['together'].get(n))} together"
             for n in rails]
    if len(rails) > 1:
        parts.append(f"both {shown(together_sum(figures, rails))}")
    return "; ".join(parts)


def together_sum(figures: dict[str, Any], rails: list[str]) -> float | None:
    values = [figures["together"].get(n) for n in rails]
    return None if all(v is None for v in values) else round(sum(v or 0.0 for v in values), 3)


def _ends(head: dict, worker: dict) -> list[tuple[dict, dict]]:
    """(the head's rail, the worker's rail) per rail index."""
    return list(zip(head["rails"], worker["rails"], strict=False))


def nccl_conf_finding(nccl_conf: str) -> tuple[str, str]:
    """The finding for an image that carries /etc/nccl.conf (its text): whatever the figures, NCCL reads it."""
    return ("nccl.conf", "the engine image carries /etc/nccl.conf, which NCCL reads before the variables sparkfold "
            "sets" + (f" ({_one_line(nccl_conf)})" if nccl_conf.strip() else "") + ": a stale one freezes the "
            "warm-up or pins the wrong HCA. Fix: remove it from the image (engine_context's Dockerfile or the base "
            "image)")


def judge(head: dict[str, Any], worker: dict[str, Any], figures: dict[str, Any], min_gbps: float,
          nccl_conf: str | None) -> list[tuple[str, str]]:
    """The findings, most likely cause first: [(cause, text naming the fix)]. Causes, in this order: "twin" (one
    twin down, idle or slow), "mtu", "cma", "speed", "server" (the worker's ib_write_bw server did not answer:
    a firewall, sudo), "cabling", "nccl.conf", "figures" (short, no cause known).
    A short link always yields at least one finding; a stale /etc/nccl.conf in the image is one even when the
    figures pass (it reaches NCCL, which perftest never reads)."""
    rails = [r["netdev"] for r in head["rails"]]
    alone = {n: figures["alone"].get(n) for n in rails}
    together = {n: figures["together"].get(n) for n in rails}
    short_rails = [n for n in rails if (alone[n] or 0.0) < min_gbps]
    total = together_sum(figures, rails)
    need_total = min_gbps * len(rails)
    short_total = len(rails) > 1 and (total or 0.0) < need_total
    findings: list[tuple[str, str]] = []
    if short_rails or short_total:
        ends = _ends(head, worker)
        # one twin down, idle or slow: NCCL then runs at the slow twin's pace (or on one twin, ~half the cable)
        for h, w in ends:
            for role, rail in (("head", h), ("worker", w)):
                port = str(rail.get("port_state") or "")
                oper = str(rail.get("operstate") or "")
                if (port and "ACTIVE" not in port.upper()) or (oper and oper.lower() not in ("up", "unknown")):
                    findings.append(("twin", f"the twin {rail['netdev']} ({rail.get('ibdev')}) on the {role} is down "
                                     f"(RoCE port {port or '?'}, netdev {oper or '?'}): both twins must carry "
                                     "traffic to reach the cable's 200 Gb/s. Fix: check `rdma link` and "
                                     f"`ip link show {rail['netdev']}` on the {role}, bring it up, reseat the cable"))
        if not any(c == "twin" for c, _ in findings) and len(rails) > 1:
            good = [n for n in rails if n not in short_rails]
            for n in short_rails:
                if good and alone[n] is not None:
                    findings.append(("twin", f"the twin {n} is slow: {rate(alone[n])} Gb/s alone while {good[0]} "
                                     f"carries {rate(alone[good[0]])} (each twin should carry ~100 Gb/s). Fix: look "
                                     f"for a shaper (`tc qdisc show dev {n}`), the PCIe link (`lspci -vv`, LnkSta) "
                                     "and that nothing else loads that twin"))
            values = [together[n] or 0.0 for n in rails]
            ran = all(together[n] is not None for n in rails)  # a rail with no report at all: the cabling below
            if not findings and ran and max(values) > 0 and min(values) < IDLE_SHARE * max(values):
                idle = rails[values.index(min(values))]
                findings.append(("twin", f"the twin {idle} stays idle while both run ({rate(min(values))} of "
                                 f"{rate(max(values))} Gb/s): one PCIe half carries the link. Fix: check that both "
                                 "twins have their address and GID and that nothing pins traffic to one"))
        for h, w in ends:
            netdev = h["netdev"]
            mtus = {"head": h.get("mtu"), "worker": w.get("mtu")}
            if any(m is not None and m < WANT_MTU for m in mtus.values()) or len(set(mtus.values())) > 1:
                findings.append(("mtu", f"the MTU on {netdev} is {mtus['head']} on the head and {mtus['worker']} "
                                 f"on the worker: RoCE runs at ~3 GB/s with 1500-byte frames. Fix: set link_mtu = "
                                 f"{WANT_MTU} (both Sparks) and let the deploy apply it; check `ip link show {netdev}` "
                                 "at both ends"))
        for role, side in (("head", head), ("worker", worker)):
            if side.get("cma_total_kb") == 0:
                findings.append(("cma", f"CmaTotal is 0 kB in the {role}'s /proc/meminfo: this kernel reserves no "
                                 "contiguous memory, and ibv_reg_mr fails with ENOMEM without it. Fix: boot the DGX "
                                 "OS kernel (its command line reserves CMA), or add a cma= size to the kernel "
                                 "command line, then reboot"))
        for h, w in ends:
            for role, rail in (("head", h), ("worker", w)):
                speed = rail.get("speed_mbps")
                if speed is not None and 0 < speed < min_gbps * 1000:
                    findings.append(("speed", f"{rail['netdev']} on the {role} links at {speed / 1000:g} Gb/s, below "
                                     f"the {min_gbps:g} Gb/s a rail must carry. Fix: `ethtool {rail['netdev']}`; "
                                     "reseat or replace the cable (a 200G QSFP112 DAC between the Sparks)"))
        for i, n in enumerate(rails):
            if alone[n] is None and together[n] is None and not any(c in ("twin", "cma") for c, _ in findings):
                why = figures.get("errors", {}).get(n, "no report")
                # the link step's pings crossed this rail before: a refused TCP exchange is the server's side
                if why.startswith("Couldn't connect") or why.startswith("sudo:"):
                    findings.append(("server", f"the ib_write_bw server on the worker did not answer on {n} "
                                     f"({why}). Fix: let TCP {PERFTEST_PORT + i} in on {n} on the worker "
                                     "(`ufw allow in on <netdev> to any port 18515:18516 proto tcp`), give the ssh "
                                     "user passwordless sudo (README: Set up the Sparks), and run "
                                     "`ib_write_bw -d <ibdev>` there by hand to see it start"))
                    continue
                findings.append(("cabling", f"nothing crossed {n} ({why}): its RoCE pair did not connect. Fix: "
                                 "check that the cable joins the same port on both Sparks (two cables on the same "
                                 "port index break NCCL's pairing), and `ibdev2netdev` on both"))
    if nccl_conf is not None:
        findings.append(nccl_conf_finding(nccl_conf))
    if (short_rails or short_total) and not any(c != "nccl.conf" for c, _ in findings):
        need = f"{min_gbps:g} Gb/s per rail" + (f", {need_total:g} together" if len(rails) > 1 else "")
        findings.append(("figures", f"the link is short of link_min_gbps ({need}) with no known cause found "
                         f"({figures_line(figures, rails)}). Fix: run ib_write_bw by hand (docs/link.md), check the "
                         "NCCL build and the cabling; or set link_min_gbps to what this pair should reach"))
    return findings


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return "; ".join(lines)[:120]


def verdict_text(findings: list[tuple[str, str]], figures: dict[str, Any], rails: list[str]) -> str:
    """One message: the figures, the most likely cause, then the others."""
    first, *rest = [text for _, text in findings]
    also = "".join(f"; also: {text}" for text in rest)
    return f"measured {figures_line(figures, rails)}. Most likely cause: {first}{also}"
