"""status.py's table from fact values, pure: the rows, the text, the JSON document and the exit verdict.

`build_rows` takes each Spark's facts (`SparkFacts`), the API probe, the engine's /metrics and the deploy plan's
count, and each row builder decides one line of the table and the facts behind it; `render_text` prints the
table (a `Report`), `render_json` the same rows as one JSON document, and `not_serving` is the exit verdict.
The values come from operations/tools/status_gather.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

from operations.data.copy import listing_digest
from operations.data.verified_record import verified_at, verified_note
from operations.facts.files import FolderCheckDict
from operations.facts.gpu import GpuClockStateDict
from operations.facts.host import mem_available_gib
from operations.facts.model import HfPlanDict, RankFolderDict
from operations.facts.systemd import UnitStateDict
from operations.gpu_clock import lock_verdict
from operations.layout import GPU_CLOCK_TIMER, MEMGUARD_UNIT, SUPERVISOR_UNIT, InContainer
from operations.link import rails_from_facts
from operations.model_data import BLOB_SUMS, fetch_summary
from operations.network.link_bandwidth import figures_line, well_formed
from operations.rank.generation import Generation, read_records
from operations.rank.inputs import RankContainerDict, RankInputsDict
from operations.rank.sampling import SAMPLING_FLAGS, sampling_line, served_sampling
from operations.rank.spec import LABEL_HASH
from operations.settings import Settings
from operations.util.durations import duration
from operations.util.net import ip_of

_MARKS = {True: "✔", False: "✘", None: "·"}
METRIC_PREFIX = "tensorfold_"  # the engine's metric names; the table leaves it out


@dataclass(frozen=True)
class Row:
    spark: str  # "head", "worker" or "pair"
    item: str
    state: str  # a word or two
    detail: str = ""
    ok: bool | None = None  # None: information only
    facts: Mapping[str, Any] = field(default_factory=dict)  # what the row was decided from, for --json



class SparkFacts(TypedDict, total=False):
    """One Spark's fact values, as `gather` reads them (a missing key reads as "not known")."""

    unreachable: str  # set when the Spark did not answer over ssh: why, and no other key is read
    container: RankContainerDict
    rank_inputs: RankInputsDict  # what the pair plan reads (operations/facts/rank.py)
    generation_sizes: dict[str, int]  # the kept generations' weight folders: bytes on disk
    want_hash: str | None  # the pair plan's spec hash for this rank; None when the spec cannot be built
    spec_note: str  # why it cannot
    gpu: GpuClockStateDict
    addrs: dict[str, Any]  # IpAddresses
    roce: dict[str, Any]  # RoceDevices
    pings: list[bool]  # PingOk per rail, to the peer's address of the same rail
    meminfo: dict[str, int]
    checkpoint: HfPlanDict  # head
    nfs_volume: dict[str, Any] | None  # worker with worker_weights = "nfs"
    checkpoint_copy: FolderCheckDict | None  # worker with worker_weights = "copy"
    engram: FolderCheckDict | None
    kit: FolderCheckDict | None
    weights_symlink: str | None  # readlink of the active-rank symlink
    weights: RankFolderDict
    weights_check: FolderCheckDict | None  # worker: its copy verified against SHA256SUMS
    units: dict[str, UnitStateDict]
    data_verified: str | None  # <state_dir>/data-verified: when verify_data last passed here
    link_bandwidth: str | None  # <state_dir>/link-bandwidth.json: the link's last measurement



class ApiProbe(TypedDict):
    problem: str | None  # None: /v1/models lists the served model
    latency_ms: float | None
    key_on: bool  # rank 0 wants a key: as its running command line says, else as the settings ask
    key_read: bool | None  # the key file on the head gave a key; None: the head did not answer to be asked
    served_key: NotRequired[bool | None]  # running rank 0 has --api-key-file; None: no running rank 0 to read
    served_host: NotRequired[str | None]  # the --host it listens on; None: not known
    settings_key: NotRequired[bool]  # api_key
    settings_host: NotRequired[str]  # host



class MetricsProbe(TypedDict):
    url: str
    problem: str | None  # None: /metrics answered
    values: dict[str, float]  # metric -> its value summed over label sets (counters, gauges, untyped)
    kinds: dict[str, str]  # metric -> counter, gauge or untyped
    read_at: float | None  # time.time() of the answer: the rates between two refreshes



class PlanCount(TypedDict):
    changes: dict[str, int]  # host name -> operations a deploy would change
    conditional: dict[str, int]  # host name -> operations that may change
    error: str | None  # why the plan could not be read



@dataclass(frozen=True)
class Report:
    rows: list[Row]
    verdict: str | None  # None: serving
    hosts: Mapping[str, str] = field(default_factory=dict)  # role -> inventory name
    ssh: Mapping[str, bool] = field(default_factory=dict)  # role -> whether it answered over ssh
    metrics: MetricsProbe | None = None  # the next refresh's previous_metrics
    taken_at: datetime | None = None
    ssh_checks: Mapping[str, str] = field(default_factory=dict)  # role -> the command showing why it did not answer



# --- time -------------------------------------------------------------------------------------------------------------

def parse_time(text: str | None) -> datetime | None:
    """docker's RFC 3339 time (nanoseconds, Z) as an aware UTC datetime; None for empty or docker's zero time."""
    if not text or text.startswith("0001-01-01"):
        return None
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?", text.strip())
    if not match:
        return None
    fraction = f".{match.group(2)[:6]}" if match.group(2) else ""
    zone = "+00:00" if match.group(3) in (None, "Z") else match.group(3)
    return datetime.fromisoformat(match.group(1) + fraction + zone).astimezone(UTC)



def ago(then: datetime, now: datetime) -> str:
    return duration((now - then).total_seconds())



def iso(text: str | None) -> str | None:
    """docker's time as ISO 8601 UTC, None for its zero time."""
    then = parse_time(text)
    return then.isoformat() if then else None



def when(then: datetime | None, now: datetime) -> str:
    if then is None:
        return "?"
    if then.tzinfo is None:  # pyinfra's File fact gives naive UTC
        then = then.replace(tzinfo=UTC)
    return f"{then.astimezone(UTC):%Y-%m-%d %H:%M} UTC ({ago(then, now)} ago)"



# --- rows -------------------------------------------------------------------------------------------------------------

def spec_word(container: Mapping[str, Any], want_hash: str | None) -> str:
    """current / stale against the wanted spec, unknown when it cannot be built, - without a container."""
    if not container:
        return "-"
    if not want_hash:
        return "unknown"
    return "current" if (container.get("labels") or {}).get(LABEL_HASH) == want_hash else "stale"



def rank_row(role: str, rank: int, name: str, container: Mapping[str, Any], want_hash: str | None,
             spec_note: str, now: datetime) -> Row:
    item = f"rank {rank}"
    spec = spec_word(container, want_hash)
    spec_text = f"spec {spec}" + (f" ({spec_note})" if spec == "unknown" and spec_note else "")
    facts = {"rank": rank, "container": name, "exists": bool(container), "running": bool(container.get("running")),
             "status": container.get("status"), "exit_code": container.get("exit_code"),
             "oom_killed": container.get("oom_killed"), "started_at": iso(container.get("started_at")),
             "finished_at": iso(container.get("finished_at")), "image": container.get("image"), "spec": spec,
             "spec_note": spec_note}
    if not container:
        return Row(role, item, "absent", f"no container {name}" + (f"; {spec_note}" if spec_note else ""), False,
                   facts)
    image = f"image {container.get('image') or '?'}"
    if container.get("running"):
        started = when(parse_time(container.get("started_at")), now)
        return Row(role, item, "running", f"since {started}; {spec_text}; {image}", spec != "stale", facts)
    oom = ", killed by the OOM killer" if container.get("oom_killed") else ""
    ended = parse_time(container.get("finished_at"))
    ended_text = f" at {when(ended, now)}" if ended else ""
    return Row(role, item, container.get("status") or "stopped",
               f"exit code {container.get('exit_code')}{oom}{ended_text}; {spec_text}; {image}", False, facts)



def sampling_row(s: Settings, container: Mapping[str, Any]) -> Row:
    """What rank 0 serves as the default sampling, read from its own command line (a rollback may serve a pair
    recorded before the settings changed); the settings' values only while no rank 0 runs."""
    args = container.get("args") if container.get("running") else None
    if args is None:
        wanted = {name: str(getattr(s, name)) for name in SAMPLING_FLAGS}
        return Row("head", "sampling", "not served", f"{sampling_line(wanted)} (the settings: no running rank 0 "
                   "to read it from)", None, {"served": None, "settings": wanted})
    served = served_sampling(list(args))
    return Row("head", "sampling", "served", sampling_line(served), True, {"served": served})



def data_verified_row(role: str, text: str | None) -> Row:
    """When this Spark's data last passed a full re-hash (verify_data): nothing is wrong when it never did."""
    at = verified_at(text)
    return Row(role, "data verified", at or "never", verified_note(text), None, {"verified_at": at})



def bandwidth_row(role: str, text: str | None, now: datetime, measure: str = "stop") -> Row:
    """The link's last measured figures per rail and when they were taken, from the record the deploy (or
    link_check.py) writes on both Sparks (<state_dir>/link-bandwidth.json, operations/link_measure.py)."""
    item = "link bandwidth"
    if text is None:
        how = ("link_measure = \"off\": deploy.py does not measure it" if measure == "off" else
               "deploy.py measures it before the ranks start")
        return Row(role, item, "not measured", f"{how}; link_check.py measures it now", None, {"taken": None})
    try:  # a hand-edited or older record is said to be unreadable, never a crash of status.py
        record = json.loads(text)
        if not well_formed(record) or not isinstance(record.get("findings") or [], list):
            raise ValueError("not the shape the deploy writes")
        figures, inputs = record["figures"], record["inputs"]
        netdevs = [r["netdev"] for r in inputs["head"].get("rails") or []] or list(figures["alone"])
        shown = figures_line(figures, netdevs)
        minimum = f"; link_min_gbps {float(inputs['min_gbps']):g}" if "min_gbps" in inputs else ""
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return Row(role, item, "unreadable", f"{type(e).__name__} in the record: link_check.py measures again",
                   False, {"taken": None})
    passed = record.get("passed") is True
    findings = [str(f) for f in record.get("findings") or []]
    detail = f"{shown}; taken {when(parse_time(record.get('taken')), now)}{minimum}"
    if findings:
        detail += f"; {findings[0]}"
    facts = {"taken": record.get("taken"), "passed": passed, "min_gbps": inputs.get("min_gbps"),
             "alone": figures.get("alone"), "together": figures.get("together"), "findings": findings}
    return Row(role, item, "passed" if passed else "short", detail, passed and not findings, facts)



def unreachable_row(role: str, why: str) -> Row:
    return Row(role, "ssh", "no answer", f"{why}; nothing else of this Spark is known", False,
               {"answers": False, "problem": why})



def key_text(api: ApiProbe) -> str:
    """The key state rank 0 runs with (its command line's, not the settings': a keyless rank 0 accepts a keyed
    request, so the probe's answer cannot tell), and how it differs from the settings."""
    key = "key off"
    if api["key_on"]:
        key = {True: "key on", False: "key on, but the key file on the head gave no key",
               None: "key on, but the head did not answer: asked without it"}[api["key_read"]]
    served, wanted = api.get("served_key"), api.get("settings_key")
    if served is None and wanted is not None:
        return f"{key} (from the settings: no running rank 0 to read it from)"
    if served is not None and wanted is not None and served != wanted:
        return f"{key} (settings ask for {'a key' if wanted else 'none'}: a rollback?)"
    return key



def listen_text(api: ApiProbe) -> str:
    """The address the running rank 0 listens on, and the settings' when they differ ("" when not known)."""
    served, wanted = api.get("served_host"), api.get("settings_host")
    if served is None:
        return ""
    return f"; listens on {served}" + (f" (settings ask for {wanted}: a rollback?)" if wanted and wanted != served
                                       else "")



def api_row(base_url: str, served_name: str, api: ApiProbe) -> Row:
    key = key_text(api) + listen_text(api)
    facts = {"base_url": base_url, "model": served_name, "answers": api["problem"] is None, **api}
    if api["problem"] is None:
        latency = f" in {api['latency_ms']:.0f} ms" if api["latency_ms"] is not None else ""
        return Row("head", "API", "answers", f"model {served_name} at {base_url}/v1{latency}; {key}", True, facts)
    return Row("head", "API", "no answer", f"{api['problem']}; {key}", False, facts)



def gpu_row(role: str, gpu_state: GpuClockStateDict | None, mhz: int, period_s: int,
            timer: Mapping[str, Any] | None) -> Row:
    """The ceiling, when the lock was last applied (the Spark's own clock ages the record), and the timer that keeps
    it; stale or failed when the record says so."""
    if not gpu_state or not gpu_state.get("smi"):
        error = (gpu_state["error"] if gpu_state else "") or "no answer"
        return Row(role, "GPU clock", "unreadable", f"nvidia-smi: {error}", False,
                   {"state": "unreadable", "error": error, "ceiling_mhz": mhz})
    timer_active = (timer or {}).get("active") == "active"
    verdict = lock_verdict(gpu_state, mhz, period_s, timer_active)
    applied, now = gpu_state.get("applied"), gpu_state.get("now")
    facts = {"ceiling_mhz": mhz, "period_s": period_s, "timer_active": timer_active,
             "applied_s_ago": now - applied if applied is not None and now is not None else None,
             "clocks_sm_mhz": {str(gpu["index"]): gpu["clocks_sm"] for gpu in gpu_state["gpus"]}}
    if verdict is not None:
        word, why = verdict
        return Row(role, "GPU clock", word, f"{why}; wanted ceiling {mhz} MHz", False, {"state": word, **facts})
    age = f"last applied {duration(now - applied)} ago" if applied is not None and now is not None else ""
    clocks = ", ".join(f"GPU {gpu['index']} at {gpu['clocks_sm']} MHz" for gpu in gpu_state["gpus"]
                       if gpu["clocks_sm"] is not None)
    timer_text = (f"{GPU_CLOCK_TIMER} every {period_s} s" if timer_active else
                  f"{GPU_CLOCK_TIMER} is not running (deploy.py starts it)")
    detail = "; ".join(x for x in (f"ceiling {mhz} MHz", age, timer_text, clocks) if x)
    return Row(role, "GPU clock", "locked", detail, timer_active, {"state": "locked", **facts})



def rail_rows(role: str, rails: Sequence[Mapping[str, Any]], peer_rails: Sequence[Mapping[str, Any]],
              addrs: Mapping[str, Any], roce: Mapping[str, Any], pings: Sequence[bool], mtu: int) -> list[Row]:
    if not rails:
        return [Row(role, "link", "unknown", "no link rails in the site file", False, {"rails": 0})]
    rows = []
    records = rails_from_facts([dict(r) for r in rails], dict(addrs), dict(roce))
    for index, record in enumerate(records):
        netdev, address = record["netdev"], record["address"]
        live = addrs.get(netdev)
        bad = []
        if live is None:
            where = f"{netdev} missing"
            bad.append(where)
        else:
            where = f"{netdev} {address}"
            if address not in live.get("ipv4", []):
                where += " (not on the netdev)"
                bad.append("address")
        mtu_text = f"MTU {record['mtu'] or '?'}" + (f" (want {mtu})" if record["mtu"] != mtu else "")
        if record["mtu"] != mtu:
            bad.append("mtu")
        if record["gid_index"] is None:
            bad.append("gid")
            gid_text = f"no RoCE v2 GID ({record['ibdev'] or 'no RoCE device'})"
        else:
            gid_text = f"GID index {record['gid_index']} ({record['ibdev']})"
        parts = [where, mtu_text, gid_text]
        facts = {"rail": index, "netdev": netdev, "address": address, "present": live is not None,
                 "on_netdev": live is not None and address in live.get("ipv4", []), "mtu": record["mtu"],
                 "want_mtu": mtu, "ibdev": record["ibdev"], "gid_index": record["gid_index"], "peer": None,
                 "peer_answers": None}
        if index < len(peer_rails):
            answers = index < len(pings) and pings[index]
            parts.append(f"peer {ip_of(peer_rails[index]['address'])} " + ("answers" if answers else "no reply"))
            facts.update(peer=ip_of(peer_rails[index]["address"]), peer_answers=answers)
            if not answers:
                bad.append("ping")
        rows.append(Row(role, f"link rail {index}", "down" if bad else "up", ", ".join(parts), not bad,
                        {**facts, "problems": bad}))
    return rows



def memory_row(role: str, meminfo: Mapping[str, int], min_avail_gib: float, rank_running: bool, memguard: bool,
               floor_gib: float) -> Row:
    """MemAvailable: against memguard's floor while the rank runs (below it memguard kills the rank), against
    min_avail_gib while it does not (a rank starts only above it)."""
    avail = mem_available_gib(dict(meminfo))
    total = meminfo.get("MemTotal")
    facts = {"mem_available_gib": None if avail is None else round(avail, 2),
             "mem_total_gib": round(total / 2**30, 2) if total else None, "rank_running": rank_running,
             "min_avail_gib": min_avail_gib, "memguard": memguard, "memguard_floor_gib": floor_gib}
    if avail is None:
        return Row(role, "memory", "unknown", "/proc/meminfo was not read", None, facts)
    total_text = f" of {total / 2**30:.1f} GiB" if total else ""
    if rank_running:
        if not memguard:
            return Row(role, "memory", f"{avail:.1f} GiB", f"MemAvailable{total_text}; memguard off (memguard = "
                       "false)", None, facts)
        above = avail - floor_gib
        if above <= 0:
            return Row(role, "memory", f"{avail:.1f} GiB", f"MemAvailable{total_text}; below the memguard floor of "
                       f"{floor_gib:g} GiB: memguard kills the rank", False, facts)
        return Row(role, "memory", f"{avail:.1f} GiB", f"MemAvailable{total_text}; {above:.1f} GiB above the memguard "
                   f"floor of {floor_gib:g} GiB", None, facts)
    enough = avail >= min_avail_gib
    need = f"a rank needs min_avail_gib = {min_avail_gib:g} GiB to start"
    return Row(role, "memory", f"{avail:.1f} GiB", f"MemAvailable{total_text}; {need}", enough, facts)



def marker_verified(check: Mapping[str, Any] | None) -> bool:
    """folder_verified's marker matches the folder as it is (the list's sha256 and the files' sizes/mtimes)."""
    return bool(check and check.get("sums_sha")
                and check.get("marker") == listing_digest(check["files"], check["names"], check["sums_sha"]))



def sums_current(check: Mapping[str, Any] | None, names: Sequence[str]) -> bool:
    """checksums_written's state file matches `names` as they are (the head's Engram list)."""
    return bool(check and check.get("sums_sha") and sorted(check["names"]) == sorted(names)
                and check.get("marker") == listing_digest(check["files"], names))



def folder_row(role: str, item: str, path: str, check: Mapping[str, Any] | None, sums: str, verified: bool) -> Row:
    facts: dict[str, Any] = {"path": path, "present": check is not None, "list": sums, "listed": None,
                             "files": None, "verified": False}
    if check is None:
        return Row(role, item, "missing", f"no {path}", False, facts)
    if not check.get("sums_sha"):
        return Row(role, item, "unchecked", f"no {sums} in {path}", False, facts)
    files = len([n for n in check["names"] if n in check["files"]])
    facts.update(listed=len(check["names"]), files=files, verified=verified)
    detail = f"{files} of {len(check['names'])} files of {sums} in {path}"
    return Row(role, item, "verified" if verified else "not verified", detail, verified, facts)



def checkpoint_row(s: Settings, facts: SparkFacts) -> Row:
    role = s.role or "?"
    if s.is_head:
        plan = facts.get("checkpoint") or {}
        detail = fetch_summary("", plan, s.active_model_repo, s.active_model_revision, s.layout.hub).lstrip(": ")
        found = {"repo": s.active_model_repo, "revision": s.active_model_revision,
                 **{k: plan.get(k) for k in ("complete", "commit", "missing_bytes", "total_bytes", "error")}}
        if plan.get("complete"):
            return Row(role, "checkpoint", "complete", detail, True, found)
        return Row(role, "checkpoint", "unknown" if plan.get("error") else "incomplete", detail, False, found)
    if s.worker_weights == "nfs":
        volume = facts.get("nfs_volume")
        found = {"volume": s.nfs_volume, "present": bool(volume)}
        if volume:
            return Row(role, "checkpoint", "via NFS", f"the head's cache through docker volume {s.nfs_volume}", True,
                       found)
        return Row(role, "checkpoint", "no volume", f"docker volume {s.nfs_volume} is missing", False, found)
    copy = facts.get("checkpoint_copy")
    return folder_row(role, "checkpoint", s.layout.model_folder, copy, BLOB_SUMS, marker_verified(copy))



def weights_row(role: str, rank: int, symlink: str, target: str | None, folder: Mapping[str, Any] | None,
                check: Mapping[str, Any] | None, verify: bool) -> Row:
    item = "weight file"
    folder = folder or {}
    bins = (folder.get("bins") or {}).get(rank, [])
    partial = rank in (folder.get("partial") or [])
    facts = {"link": symlink, "target": target, "files": list(bins), "partial": partial, "verified": None}
    if not target:
        return Row(role, item, "missing", f"no {symlink}", False, facts)
    if len(bins) != 1 or partial:
        what = "an interrupted build" if partial else f"{len(bins)} rank{rank} files"
        return Row(role, item, "incomplete", f"{what} in {symlink} -> {target}", False, facts)
    if verify:
        verified = marker_verified(check)
        return Row(role, item, "verified" if verified else "not verified", f"{bins[0]} in {symlink} -> {target}",
                   verified, {**facts, "verified": verified})
    # made on this Spark by the image's tool, whole when no partial build is left; no list to check it against
    return Row(role, item, "whole (no checksum list)", f"{bins[0]} in {symlink} -> {target}", True, facts)



def unit_row(role: str, unit: str, unit_state: Mapping[str, Any] | None, setting: str, wanted: bool) -> Row:
    unit_state = unit_state or {}
    installed = bool(unit_state.get("enabled"))
    active = unit_state.get("active") or "unknown"
    state = active if installed else "not installed"
    running = active in ("active", "activating", "reloading")
    detail = (f"enabled: {unit_state.get('enabled')}; " if installed else "") + f"{setting} = {str(wanted).lower()}"
    facts = {"unit": unit, "enabled": unit_state.get("enabled") or None, "active": active, "setting": setting,
             "wanted": wanted}
    return Row(role, unit.removesuffix(".service"), state, detail, running == wanted, facts)



def plan_row(plan: PlanCount, names: Mapping[str, str]) -> Row:
    """names: role -> inventory host name."""
    if plan["error"]:
        return Row("pair", "deploy", "unknown", f"deploy.py --dry: {plan['error']}", None,
                   {"changes": None, "may_change": None, "error": plan["error"]})
    counts = {role: plan["changes"].get(name, 0) for role, name in names.items()}
    maybe = {role: plan["conditional"].get(name, 0) for role, name in names.items()}
    facts = {"changes": counts, "may_change": maybe, "error": None}
    total = sum(counts.values())
    detail = ", ".join(f"{role} {n}" for role, n in counts.items()) + " operations would change"
    if any(maybe.values()):
        detail += " (" + ", ".join(f"{role} {n}" for role, n in maybe.items()) + " may change)"
    return Row("pair", "deploy", "converged" if total == 0 else f"{total} to change",
               detail + "; pyinfra inventory.py deploy.py --dry shows them", total == 0, facts)



def build_rows(head_settings: Settings, worker_settings: Settings, head: SparkFacts, worker: SparkFacts,
               api: ApiProbe, plan: PlanCount | None, now: datetime,
               host_names: Mapping[str, str] | None = None, metrics: MetricsProbe | None = None,
               previous_metrics: MetricsProbe | None = None) -> list[Row]:
    """The table: the ranks, the API and its /metrics, the deploy plan, then per Spark the GPU lock, the link,
    memory, data, units. host_names: role -> inventory name (the plan counts by host name); previous_metrics: the
    last refresh's, for the counters' rates."""
    both = ((head_settings, head), (worker_settings, worker))
    rows = [unreachable_row(s.role, facts["unreachable"]) if "unreachable" in facts else
            rank_row(s.role, s.rank, s.container_name, facts.get("container") or {}, facts.get("want_hash"),
                     facts.get("spec_note", ""), now) for s, facts in both]
    sparks = [(s, facts) for s, facts in both if "unreachable" not in facts]  # the rest: what they say
    rows.append(api_row(head_settings.api_base_url, head_settings.served_name, api))
    rows += metric_rows(metrics, previous_metrics)
    if "unreachable" not in head:
        rows.append(sampling_row(head_settings, head.get("container") or {}))
    if plan is not None:
        rows.append(plan_row(plan, host_names or {"head": "head", "worker": "worker"}))
    for s, facts in sparks:
        rows.append(gpu_row(s.role, facts.get("gpu"), s.gpu_clock_mhz, s.gpu_clock_period_s,
                            (facts.get("units") or {}).get(GPU_CLOCK_TIMER)))
    for s, facts in sparks:
        rows += rail_rows(s.role, s.link_rails, s.the_peer.link_rails, facts.get("addrs") or {},
                          facts.get("roce") or {}, facts.get("pings") or [], s.link_mtu)
    for s, facts in sparks:
        rows.append(bandwidth_row(s.role, facts.get("link_bandwidth"), now, s.link_measure))
    for s, facts in sparks:
        running = bool((facts.get("container") or {}).get("running"))
        rows.append(memory_row(s.role, facts.get("meminfo") or {}, s.min_avail_gib, running, s.memguard,
                               s.memguard_gib))
    for s, facts in sparks:
        layout = s.layout
        rows.append(checkpoint_row(s, facts))
        engram = facts.get("engram")
        rows.append(folder_row(s.role, "Engram tables", layout.engram, engram, "SHA256SUMS",
                               sums_current(engram, s.engram_files) if s.is_head else marker_verified(engram)))
        kit = facts.get("kit")
        rows.append(folder_row(s.role, "kit", layout.kit, kit, "MANIFEST", marker_verified(kit)))
        rows.append(weights_row(s.role, s.rank, layout.active_rank_link(), facts.get("weights_symlink"),
                                facts.get("weights"), facts.get("weights_check"), verify=not s.is_head))
        rows.append(data_verified_row(s.role, facts.get("data_verified")))
    for s, facts in sparks:
        rows.append(generations_row(s, facts))
    for s, facts in sparks:
        units = facts.get("units") or {}
        rows.append(unit_row(s.role, MEMGUARD_UNIT, units.get(MEMGUARD_UNIT), "memguard", s.memguard))
        if s.is_head:
            rows.append(unit_row(s.role, SUPERVISOR_UNIT, units.get(SUPERVISOR_UNIT), "supervise", s.supervise))
    return rows



def metric_number(value: float) -> str:
    return f"{value:.0f}" if value.is_integer() else f"{value:.2f}"



def metric_rows(probe: MetricsProbe | None, previous: MetricsProbe | None) -> list[Row]:
    """One row per metric rank 0's /metrics serves (summed over its labels), with each counter's rise since the
    previous refresh; one row saying why when it was not read. Information only: an engine without /metrics
    serves all the same."""
    if probe is None:
        return [Row("head", "metrics", "not read", "the API does not answer", None,
                    {"url": None, "problem": "the API does not answer"})]
    if probe["problem"] is not None:
        return [Row("head", "metrics", "not read", f"{probe['url']}: {probe['problem']}", None,
                    {"url": probe["url"], "problem": probe["problem"]})]
    if not probe["values"]:
        return [Row("head", "metrics", "none", f"{probe['url']} lists no counter or gauge", None,
                    {"url": probe["url"], "problem": None})]
    seconds = None
    if previous and previous["problem"] is None and probe["read_at"] and previous["read_at"]:
        seconds = probe["read_at"] - previous["read_at"] if probe["read_at"] > previous["read_at"] else None
    rows = []
    for name, value in probe["values"].items():
        kind = probe["kinds"].get(name, "untyped")
        before = previous["values"].get(name) if previous and seconds else None
        facts: dict[str, Any] = {"metric": name, "kind": kind, "value": value, "rise": None, "per_s": None}
        detail = kind
        if kind == "counter" and before is not None and seconds:
            if value < before:  # the engine started again: its counters begin at 0
                detail += f", reset since the last refresh (was {metric_number(before)})"
            else:
                facts.update(rise=value - before, per_s=(value - before) / seconds)
                detail += f", +{metric_number(value - before)} in {seconds:.0f} s ({facts['per_s']:.1f}/s)"
        rows.append(Row("head", name.removeprefix(METRIC_PREFIX), metric_number(value), detail, None, facts))
    return rows



def generation_folder(s: Settings, generation: Generation) -> str:
    """The weight folder this Spark's rank of `generation` mounts (its bulk on disk)."""
    return next((src for src, dst, _ro in generation.specs[s.rank].mounts if dst == InContainer.RANK_CACHE), "")



def generations_row(s: Settings, facts: SparkFacts) -> Row:
    """The generations kept on this Spark, newest first: which one runs, which is the last good one, their weight
    folders' sizes."""
    found: dict[str, Any] = dict(facts.get("rank_inputs", {}).get("generations") or {})
    records = read_records(found.get("files") or {}, found.get("last_good") or "", found.get("now") or 0.0)
    label = ((facts.get("container") or {}).get("labels") or {}).get(LABEL_HASH)
    sizes = facts.get("generation_sizes") or {}
    parts, kept = [], []
    for generation in records.good():
        current = generation.specs[s.rank].spec_hash() == label
        marks = (["current"] if current else []) + (["last good"] if generation.id == records.last_good else [])
        size = sizes.get(generation_folder(s, generation))
        parts.append(f"{generation.id} ({', '.join(marks + [gib(size) if size is not None else 'weights gone'])})")
        kept.append({"id": generation.id, "current": current, "last_good": generation.id == records.last_good,
                     "weights_bytes": size})
    kept_facts = {"kept": kept, "last_good": records.last_good or None, "keep_generations": s.keep_generations}
    if not parts:
        return Row(s.role, "generations", "none", "no pair has passed its smoke test here yet", None, kept_facts)
    return Row(s.role, "generations", f"{len(parts)} kept", "; ".join(parts) + f" (keep_generations = "
               f"{s.keep_generations})", None, kept_facts)



def gib(size: int) -> str:
    return f"{size / 1024**3:.1f} GiB"



def not_serving(containers: Mapping[int, Mapping[str, Any] | None], api: ApiProbe,
                unreached: Mapping[int, tuple[str, str]] | None = None) -> str | None:
    """None while rank 0's API lists the model; else one line saying why the pair is not serving. A container
    None: its Spark did not answer (unreached: rank -> its Spark's name and the command that shows why)."""
    if api["problem"] is None:
        return None
    reasons = []
    for rank, container in sorted(containers.items()):
        if container is None:
            name, check = (unreached or {}).get(rank, ("", ""))
            reasons.append(f"rank {rank}'s Spark{' ' + name if name else ''} does not answer over ssh" +
                           (f" (`{check}` shows why)" if check else ""))
        elif not container:
            reasons.append(f"rank {rank} has no container")
        elif not container.get("running"):
            reasons.append(f"rank {rank} is not running (exit code {container.get('exit_code')})")
    return "; ".join(reasons + [api["problem"]])



def render_table(rows: Sequence[Row]) -> str:
    """Rows as aligned text columns: mark, Spark, item, state, detail."""
    header = Row("SPARK", "ITEM", "STATE", "DETAIL")
    cells = [(" ", header)] + [(_MARKS[r.ok], r) for r in rows]
    w_spark = max(len(r.spark) for _, r in cells)
    w_item = max(len(r.item) for _, r in cells)
    w_state = max(len(r.state) for _, r in cells)
    lines = [f"{mark} {r.spark:<{w_spark}}  {r.item:<{w_item}}  {r.state:<{w_state}}  {r.detail}".rstrip()
             for mark, r in cells]
    return "\n".join(lines)



# --- what status.py prints --------------------------------------------------------------------------------------------

def render_text(report: Report, s: Settings, problems: Sequence[str], every_s: int = 0) -> str:
    """The table for a person: who, the settings problems, the rows, then whether the pair serves."""
    title = f"sparkfold status: head {report.hosts.get('head')}, worker {report.hosts.get('worker')}"
    if every_s and report.taken_at:
        title += f"; {report.taken_at:%Y-%m-%d %H:%M:%S} UTC, again every {every_s} s (Ctrl-C stops)"
    lines = [title, *[f"  settings problem (deploy.py stops on it): {p}" for p in problems], render_table(report.rows),
             ""]
    lines.append(f"serving: {s.served_name} at {s.api_base_url}/v1" if report.verdict is None
                 else f"NOT serving: {report.verdict}")
    return "\n".join(lines)



def render_json(report: Report, s: Settings, problems: Sequence[str]) -> str:
    """The same as one JSON document on one line (pyinfra's --json): each row with the facts it was decided from."""
    doc = {
        "time": report.taken_at.isoformat() if report.taken_at else None,
        "serving": report.verdict is None,
        "verdict": report.verdict,
        "api": {"url": f"{s.api_base_url}/v1", "model": s.served_name},  # what an OpenAI client is given
        "settings_problems": list(problems),
        "sparks": {role: {"host": name, "ssh": report.ssh.get(role),
                          **({"ssh_check": report.ssh_checks[role]} if role in report.ssh_checks else {})}
                   for role, name in report.hosts.items()},
        "rows": [{"spark": r.spark, "item": r.item, "state": r.state, "ok": r.ok, "detail": r.detail,
                  "facts": dict(r.facts)} for r in report.rows],
    }
    return json.dumps(doc, default=str)

