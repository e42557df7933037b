"""The link measured before the ranks start (docs/link.md): RDMA write bandwidth per rail with perftest's
`ib_write_bw` (server on the worker, client on the head; each rail alone, then both at once), read beside each
twin's speed and state, CmaTotal, the MTU at both ends and the image's /etc/nccl.conf, and judged against
link_min_gbps (operations/network/link_bandwidth.py). Measured on the first run and whenever its inputs change
(addresses, MTU, GIDs, devices, kernel, link_min_gbps); the figures and their inputs are recorded on both Sparks,
so a converged run does not measure again. The image's /etc/nccl.conf is judged on every run: read from the image
once per image id and kept (Layout.nccl_conf_cache), so a converged run reads a small file and starts no container.
A finding stops the run before any rank starts (link_measure = "warn": a warning)."""

from __future__ import annotations

import base64
import json
import shlex
import time
from typing import Any

import gevent
from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.api.host import Host
from pyinfra.context import ctx_config, ctx_host
from pyinfra.operations import apt

from operations.build.image_hash import image_ref
from operations.facts.docker import DockerImageInfo, RankContainer, keep_command
from operations.facts.network import (
    BandwidthSide,
    ImageNcclConf,
    IpAddresses,
    LinkRecord,
    NcclConfDict,
    RailHardware,
    nccl_conf_kept_text,
)
from operations.network.link_bandwidth import (
    MESSAGE_BYTES,
    PERFTEST_PORT,
    failure_of,
    figures_line,
    judge,
    measure_inputs,
    measure_reasons,
    nccl_conf_finding,
    parse_write_bw,
    verdict_text,
)
from operations.settings import Settings
from operations.settings.context import peer_host
from operations.util import check_failed, function_failed, warned
from operations.util.commands import APT_CACHE_S
from operations.util.fact_reuse import fact_until_change
from operations.util.net import ip_of
from operations.util.peer_ssh import ssh_prefix

CHECK = "link bandwidth"
RUN_SLACK_S = 30  # one ib_write_bw may take this much longer than its -D seconds: its connection wait
GO_ON = ("To go on anyway: link_measure = \"warn\" (a warning, the ranks start) or \"off\" (not measured); "
         "docs/link.md explains each finding")
CHECK_TAIL = "deploy.py stops on the same finding unless link_measure = \"warn\"; docs/link.md explains each finding"


# --- pure helpers ---------------------------------------------------------------------------------------------

def write_bw_argv(ibdev: str, gid_index: int, port: int, seconds: int, server_ip: str | None = None) -> list[str]:
    """One ib_write_bw run: RoCE device and GID, its own TCP port, `seconds` long (link_measure_s), MESSAGE_BYTES,
    Gb/s."""
    argv = ["ib_write_bw", "-d", ibdev, "-i", "1", "-x", str(gid_index), "-p", str(port), "-D", str(int(seconds)),
            "-s", str(MESSAGE_BYTES), "-F", "--report_gbits"]
    return argv + ([server_ip] if server_ip else [])


def measure_script(head_rails: list[dict], worker_rails: list[dict], worker_ssh: str, seconds: int) -> str:
    """Shell text for the head: each rail alone, then all at once, each run `seconds` long (servers started on the
    worker over ssh, a client retried while its server is not listening yet); every output printed after a
    `==> run.rail[.server]` line."""
    limit = str(int(seconds) + RUN_SLACK_S)
    runs = [(f"alone{i}", [i]) for i in range(len(head_rails))]
    if len(head_rails) > 1:
        runs.append(("together", list(range(len(head_rails)))))
    lines = ["set -u", "d=$(mktemp -d)", "trap 'rm -rf \"$d\"' EXIT"]
    for label, indexes in runs:
        for i in indexes:
            w = worker_rails[i]
            server = shlex.join(["sudo", "-n", "timeout", limit,
                                 *write_bw_argv(w["ibdev"], w["gid_index"], PERFTEST_PORT + i, seconds)])
            lines.append(f"{ssh_prefix()} {shlex.quote(worker_ssh)} {shlex.quote(server)} "
                         f">\"$d/{label}.{i}.server\" 2>&1 &")
        for i in indexes:
            h = head_rails[i]
            client = shlex.join(["sudo", "-n", "timeout", limit,
                                 *write_bw_argv(h["ibdev"], h["gid_index"], PERFTEST_PORT + i, seconds,
                                                ip_of(worker_rails[i]["address"]))])
            out = f"\"$d/{label}.{i}\""
            # perftest's client gives up at once when its server does not listen yet: tried again for ~10 s
            lines.append(f"( for t in $(seq 20); do {client} >{out} 2>&1 && break; "
                         f"grep -q \"Couldn't connect\" {out} || break; sleep 0.5; done ) &")
        lines.append("wait")
    lines.append("for f in \"$d\"/*; do echo \"==> ${f##*/}\"; cat \"$f\"; done")
    return "\n".join(lines)


def split_outputs(lines: list[str]) -> dict[str, str]:
    """measure_script's output as {"alone0.0": text, "alone0.0.server": text, ...}."""
    outputs: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.startswith("==> "):
            current = line[4:].strip()
            outputs[current] = []
        elif current is not None:
            outputs[current].append(line)
    return {name: "\n".join(text) for name, text in outputs.items()}


def figures_of(outputs: dict[str, str], netdevs: list[str]) -> dict[str, Any]:
    """The figures judge() reads, from the client reports (a failed run: None, and why from either end)."""
    figures: dict[str, Any] = {"alone": {}, "together": {}, "errors": {}}
    for i, netdev in enumerate(netdevs):
        for key, label in (("alone", f"alone{i}"), ("together", "together" if len(netdevs) > 1 else f"alone{i}")):
            client = outputs.get(f"{label}.{i}", "")
            report = parse_write_bw(client)
            figures[key][netdev] = report["gbps"] if report else None
            if report is None and netdev not in figures["errors"]:
                server = outputs.get(f"{label}.{i}.server", "")
                why = failure_of(client)
                if why.startswith("Couldn't connect") or why == "no report":  # the server says why it was not there
                    why = failure_of(server) if failure_of(server) != "no report" else why
                figures["errors"][netdev] = why
    return figures


def side_readings(record: dict | None, side: Any, hardware: Any, addrs: Any) -> dict[str, Any]:
    """One Spark's readings for judge(): its link record's rails with the live MTU, speed and states, its kernel
    and CmaTotal."""
    rails = []
    for rail in (record or {}).get("rails") or []:
        netdev, ibdev = rail.get("netdev"), rail.get("ibdev")
        net = hardware.get("net", {}).get(netdev, {})
        rails.append({**{k: rail.get(k) for k in ("netdev", "ibdev", "gid_index", "address")},
                      "mtu": (addrs.get(netdev) or {}).get("mtu", rail.get("mtu")),
                      "speed_mbps": net.get("speed_mbps"), "operstate": net.get("operstate", ""),
                      "port_state": hardware.get("ib", {}).get(ibdev, "")})
    return {"rails": rails, "kernel": side.get("kernel", ""), "cma_total_kb": side.get("cma_total_kb")}


def unmeasurable(head: dict, worker: dict) -> str | None:
    """Why the link cannot be measured (no RDMA device or GID on a rail, no perftest), or None."""
    for role, side in (("head", head), ("worker", worker)):
        if not side["rails"]:
            return f"the {role} has no link record (the link step writes it)"
        for rail in side["rails"]:
            if rail.get("ibdev") is None or rail.get("gid_index") is None:
                return f"{rail.get('netdev')} on the {role} has no RDMA device or RoCE v2 GID"
    return None


def record_text(inputs: dict, figures: dict, findings: list[tuple[str, str]], passed: bool, mode: str = "stop") -> str:
    """<state_dir>/link-bandwidth.json: what the figures were taken with (inputs), when, the figures, the findings,
    and the link_measure mode that judged them (a short link let through with "warn" is not measured again)."""
    return json.dumps({"inputs": inputs, "taken": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "figures": figures, "findings": [text for _, text in findings], "passed": passed,
                       "mode": mode},
                      indent=2, sort_keys=True) + "\n"


def rank_stop_refusal(role: str, rank: int, container: str, running: bool, stop_ok: bool) -> str | None:
    """link_check.py's refusal while a rank runs and link_check_stop is not set, else None."""
    if not running or stop_ok:
        return None
    return (f"rank {rank} runs on the {role} ({container}): the link is measured with both ranks stopped (a rank's "
            "traffic and memory share the rails and the CMA). Run it again with --data link_check_stop=true to stop "
            "both ranks first (deploy.py starts them again), or stop them with stop.py first")


def _write_command(path: str, text: str) -> StringCommand:
    encoded = base64.b64encode(text.encode()).decode()
    return StringCommand(f"echo {encoded} | base64 -d > {shlex.quote(path)}.tmp && mv -f {shlex.quote(path)}.tmp "
                         f"{shlex.quote(path)}")


def nccl_conf_kept(cache_dir: str, read: NcclConfDict) -> str | None:
    """The command that keeps an answer ImageNcclConf read whole from the image under the image's id, written aside
    then renamed as the capabilities cache is (so a reader never sees half of it); None when there is nothing to
    keep (read from the cache already, not whole, or no cache folder)."""
    if not (cache_dir and read["image_id"] and read["whole"]) or read["cached"]:
        return None
    return keep_command(cache_dir, read["image_id"], ".txt", nccl_conf_kept_text(read["text"]))


# --- reading both Sparks ----------------------------------------------------------------------------------------

def _read(spark: Host, s: Settings, fresh: bool) -> tuple[Any, Any]:
    """(the link record, BandwidthSide) of one Spark."""
    if fresh:
        return (spark.get_fact(LinkRecord, path=s.layout.link_record),
                spark.get_fact(BandwidthSide, path=s.layout.link_bandwidth))
    return (fact_until_change(spark, LinkRecord, path=s.layout.link_record),
            fact_until_change(spark, BandwidthSide, path=s.layout.link_bandwidth))


def _read_on(spark: Host, config: Any, s: Settings, fresh: bool) -> tuple[Any, Any]:
    with ctx_host.use(spark), ctx_config.use(config):  # a greenlet of its own starts with no pyinfra context
        return _read(spark, s, fresh)


def _readings(spark: Host, s: Settings, record: dict | None, side: dict) -> dict[str, Any]:
    rails = (record or {}).get("rails") or []
    with ctx_host.use(spark):
        hardware = spark.get_fact(RailHardware, netdevs=[r.get("netdev") for r in rails],
                                  ibdevs=[r.get("ibdev") for r in rails if r.get("ibdev")])
        addrs = spark.get_fact(IpAddresses)
    return side_readings(record, side, hardware, addrs)


def _measured(state: Any, host: Any, s: Settings, worker: Host, image: str, mode: str) -> bool:
    """Execution: measure, judge, record on both Sparks, and fail the head with the findings unless mode is "warn".
    The deploy (mode = link_measure: "stop" or "warn") records a passing or a warned measurement, so a stopped run
    measures again; link_check.py (mode "check") records every measurement it prints and fails on a finding."""
    record_short = mode == "check"
    config = ctx_config.get()
    theirs = gevent.spawn(_read_on, worker, config, s.worker, True)
    mine = _read(host, s, True)
    (head_record, head_side), (worker_record, worker_side) = mine, theirs.get()
    head = _readings(host, s, head_record, head_side)
    wside = _readings(worker, s.worker, worker_record, worker_side)
    # the inputs as the link records hold them (the plan compared the same), the live MTU only judged
    inputs = measure_inputs(side_readings(head_record, head_side, {}, {}),
                            side_readings(worker_record, worker_side, {}, {}), s.link_min_gbps)
    missing = [role for role, side in (("head", head_side), ("worker", worker_side)) if not side["perftest"]]
    why_not = unmeasurable(head, wside) or (f"perftest's ib_write_bw is not installed on the {' and '.join(missing)}"
                                            " (apt-get install perftest)" if missing else None)
    if why_not:
        return _finding(mode, f"cannot measure the link: {why_not}")
    ok, out = host.run_shell_command(StringCommand(measure_script(head["rails"], wside["rails"], s.worker_link_ssh,
                                                                   s.link_measure_s)),
                                     print_output=False, print_input=False)
    netdevs = [r["netdev"] for r in head["rails"]]
    figures = figures_of(split_outputs(list(out.stdout_lines)), netdevs)
    # link_check.py before the first deploy: no image yet, so nothing of it can reach NCCL
    built = not record_short or bool(host.get_fact(DockerImageInfo, image=image))
    nccl_conf = _nccl_conf_read(host, image, s.layout.nccl_conf_cache) if built else None
    findings = judge(head, wside, figures, float(s.link_min_gbps), nccl_conf)
    passed = not findings
    if passed or mode == "warn" or record_short:
        text = record_text(inputs, figures, findings, passed, mode)
        for spark, side in ((host, s), (worker, s.worker)):
            written, _ = spark.run_shell_command(_write_command(side.layout.link_bandwidth, text), print_output=False,
                                                 print_input=False)
            if not written:  # the next deploy then measures again: worth a line, not a stop
                warned(CHECK, f"the record {side.layout.link_bandwidth} on {spark.name} could not be written")
    if passed:
        host.log(f"link measured: {figures_line(figures, netdevs)} (link_min_gbps {s.link_min_gbps:g})"
                 + ("" if built else f"; the image {image} is not built yet: its /etc/nccl.conf was not read"))
        return True
    return _finding(mode, verdict_text(findings, figures, netdevs))


def _nccl_conf_read(host: Any, image: str, cache_dir: str) -> str | None:
    """Execution: the image's /etc/nccl.conf (None: it has none), kept by image id when read from the image. A keep
    that fails costs only a container next run: a warning."""
    read = host.get_fact(ImageNcclConf, image=image, cache_dir=cache_dir)
    keep = nccl_conf_kept(cache_dir, read)
    if keep and not host.run_shell_command(StringCommand(keep), print_output=False, print_input=False)[0]:
        warned(CHECK, f"what {image} holds in /etc/nccl.conf could not be kept in {cache_dir} on {host.name}; the "
               "next run reads the image again")
    return read["text"]


def _nccl_conf_checked(state: Any, host: Any, image: str, cache_dir: str, mode: str) -> bool:
    """Execution, for an image built in this run: its /etc/nccl.conf judged as the plan judges a built one's."""
    nccl_conf = _nccl_conf_read(host, image, cache_dir)
    return True if nccl_conf is None else _finding(mode, nccl_conf_finding(nccl_conf)[1])


def _finding(mode: str, message: str) -> bool:
    """A finding as a warning (mode "warn": the run goes on) or as the failure of the head."""
    if mode == "warn":
        warned(CHECK, message)
        return True
    return function_failed(CHECK, f"{message}. {CHECK_TAIL if mode == 'check' else GO_ON}")


# --- operations -------------------------------------------------------------------------------------------------

@operation()
def perftest_installed(path: str):
    """perftest (ib_write_bw) installed with apt when missing (DGX OS packages it)."""
    if fact_until_change(host, BandwidthSide, path=path)["perftest"]:
        host.noop("perftest's ib_write_bw is installed")
        return
    yield from apt.packages._inner(packages=["perftest"], update=True, cache_time=APT_CACHE_S)


@operation()
def link_measured(s: Settings, worker: Host | None, image: str):
    """Head: measure the link when nothing passing is recorded or its inputs changed, judge, record, stop on a
    finding (docs/link.md). --dry says whether it will be measured and why. The worker's part is its facts and
    the ib_write_bw servers the head starts over ssh."""
    if worker is None:
        host.noop("the head measures the link for both Sparks")
        return
    theirs = gevent.spawn(_read_on, worker, ctx_config.get(), s.worker, False)
    (head_record, head_side), (worker_record, worker_side) = _read(host, s, False), theirs.get()
    head = side_readings(head_record, head_side, {}, {})
    inputs = measure_inputs(head, side_readings(worker_record, worker_side, {}, {}), s.link_min_gbps)
    why = measure_reasons(head_side["record"], worker_side["record"], inputs, s.link_measure)
    if not why:
        record = head_side["record"] or {}
        netdevs = [r["netdev"] for r in head["rails"]]
        shown = figures_line(record.get("figures") or {"alone": {}, "together": {}}, netdevs)
        # the image's /etc/nccl.conf judged on every run: read now (from the cache by image id, else from the image,
        # then kept), or once a new image is built (an earlier step)
        cache_dir = s.layout.nccl_conf_cache
        if not host.get_fact(DockerImageInfo, image=image):
            yield FunctionCommand(_nccl_conf_checked, (image, cache_dir, s.link_measure), {})
        else:
            read = host.get_fact(ImageNcclConf, image=image, cache_dir=cache_dir)
            if keep := nccl_conf_kept(cache_dir, read):
                yield keep  # before a finding stops the run: the next one judges the kept answer the same
            if read["text"] is not None:
                _, text = nccl_conf_finding(read["text"])
                if s.link_measure == "warn":
                    warned(CHECK, text)
                else:
                    yield from check_failed(CHECK, [f"{text}. {GO_ON}"])
                    return
        host.noop(f"the link was measured at {record.get('taken', '?')} ({shown}); its inputs are unchanged: not "
                  "measured again")
        return
    if not state.is_executing:  # why: the plan's line; an executing run says what it measured instead
        logger.info(f"{host.name}: link: will be measured before the ranks start ({', '.join(why)})")
    yield FunctionCommand(_measured, (s, worker, image, s.link_measure), {})


@deploy("Link measured")
def link_measure(s: Settings) -> None:
    """Both Sparks, before the ranks: perftest present, then the head measures (or says why not)."""
    if s.link_measure == "off":
        warned(CHECK, "link_measure = \"off\": the link's bandwidth is not measured before the ranks start")
        return
    perftest_installed(name="perftest installed", path=s.layout.link_bandwidth, _sudo=True)
    link_measured(name="Link bandwidth per rail (ib_write_bw)", s=s, worker=peer_host(s) if s.is_head else None,
                  image=image_ref(s))



@operation()
def ranks_idle_for_check(s: Settings, stop_ok: bool):
    """link_check.py: this Spark's rank is not running, or the user agreed to stop it (link_check_stop)."""
    running = bool(host.get_fact(RankContainer, container=s.container_name).get("running"))
    if (yield from check_failed("link_check.py", [rank_stop_refusal(s.role, s.rank, s.container_name, running,
                                                                    stop_ok)])):
        return
    host.noop(f"rank {s.rank} " + ("is stopped first (link_check_stop)" if running else "is not running"))


@operation()
def link_checked(s: Settings, worker: Host | None, image: str):
    """link_check.py, head: measure now whatever is recorded, print the judgment, record it on both Sparks, fail on a
    finding."""
    if worker is None:
        host.noop("the head measures the link for both Sparks")
        return
    if not state.is_executing:  # why: the plan's line; an executing run says what it measured instead
        logger.info(f"{host.name}: link: will be measured now (link_check.py)")
    yield FunctionCommand(_measured, (s, worker, image, "check"), {})


@deploy("Link measured now")
def link_check(s: Settings) -> None:
    """link_check.py, once the ranks are stopped: perftest present, then the head measures both rails alone and
    together."""
    perftest_installed(name="perftest installed", path=s.layout.link_bandwidth, _sudo=True)
    link_checked(name="Link bandwidth per rail now (ib_write_bw)", s=s, worker=peer_host(s) if s.is_head else None,
                 image=image_ref(s))
