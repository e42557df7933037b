"""status.py's reading of both Sparks: facts through the Sparks' Host objects, the API and /metrics probes and the
deploy plan's count, into a `Report` (operations/tools/status_render.py builds its rows).

The head's run reads the worker's facts through the worker's Host, as operations/rank/serving.py does, and yields
nothing, so no operation exists.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import requests
from pyinfra.api.exceptions import ConnectError

from operations.build.image_hash import image_ref
from operations.data.copy import MARKER, SUMS_STATE
from operations.data.hub import checkpoint_plan_args
from operations.data.verified_record import record_path
from operations.facts.docker import DockerVolumeInfo
from operations.facts.files import FileText, FolderCheck, FolderSizes, LinkTarget
from operations.facts.gpu import GpuClockState
from operations.facts.host import MemInfo
from operations.facts.model import HfPlan, RankFolder
from operations.facts.network import IpAddresses, PingOk, RoceDevices
from operations.facts.rank import RankInputs
from operations.facts.systemd import UnitState
from operations.layout import GPU_CLOCK_RECORD, GPU_CLOCK_TIMER, MEMGUARD_UNIT, SUPERVISOR_UNIT, unit_path
from operations.model_data import BLOB_SUMS
from operations.rank import exposure
from operations.rank.generation import read_records
from operations.rank.plan import pair_plan
from operations.rank.serving import auth_headers, models_listed, read_api_key
from operations.rank.spec import template_digest
from operations.ranks import rank_inputs_args
from operations.settings import Settings
from operations.settings.site import ssh_check
from operations.tools.status_render import (
    ApiProbe,
    MetricsProbe,
    PlanCount,
    Report,
    SparkFacts,
    build_rows,
    generation_folder,
    not_serving,
)
from operations.util import prometheus
from operations.util.net import ip_of

PLAN_TIMEOUT_S = 900  # deploy.py --dry reads every fact of both Sparks once
_ANSI = re.compile(r"\x1b\[[0-9;]*m")



def served_api(container: Mapping[str, Any] | None) -> tuple[bool | None, str | None]:
    """(whether it wants a key, the address it listens on) as the running rank 0 was started, from its command
    line; (None, None) when no rank 0 runs (or its command line was not read)."""
    if not container or not container.get("running") or "args" not in container:
        return None, None
    args = list(container["args"])
    return exposure.of_argv(args).keyed, exposure.flag_value(args, "--host")



def count_changes(plan: Sequence[Mapping[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
    """deploy.py --dry --json's plan: (host -> operations that change, host -> operations that may change)."""
    changes: dict[str, int] = {}
    conditional: dict[str, int] = {}
    for op in plan:
        for name in op.get("hosts_with_change") or []:
            changes[name] = changes.get(name, 0) + 1
        for name in op.get("hosts_with_conditional_change") or []:
            conditional[name] = conditional.get(name, 0) + 1
    return changes, conditional



def _fact(spark: Any, cls: type, **kwargs: Any) -> Any:
    # a fact that fails (e.g. sudo refused) reads as its default instead of failing the run
    return spark.get_fact(cls, _ignore_errors=True, **kwargs)



def wanted_hashes(head_settings: Settings, worker_settings: Settings, head: SparkFacts, worker: SparkFacts) -> None:
    """Set each reachable Spark's want_hash and spec_note from the pair plan of both Sparks' rank inputs."""
    found = [facts.get("rank_inputs") for facts in (head, worker)]
    if found[0] is None or found[1] is None:
        for facts in (head, worker):
            facts["want_hash"], facts["spec_note"] = None, "the other Spark's inputs are not known"
        return
    try:
        plan = pair_plan(head_settings, worker_settings, found[0], found[1], image=image_ref(head_settings),
                         template_digest=template_digest(head_settings), force=False)
    except Exception as e:  # settings with problems: the rest of the table still shows
        for facts in (head, worker):
            facts["want_hash"], facts["spec_note"] = None, f"the spec cannot be built ({type(e).__name__}: {e})"
        return
    for rank, facts in enumerate((head, worker)):
        spec = plan.rank(rank).spec
        facts["want_hash"] = spec.spec_hash() if spec else None
        facts["spec_note"] = "" if spec else "; ".join(plan.rank(rank).problems) or "its inputs are missing"



def unanswered(spark: Any, said: str = "") -> str:
    """Why a Spark is not read: it did not answer over ssh (`said`: ssh's reason, when known), and the command that
    shows why."""
    return (f"{spark.name} did not answer over ssh" + (f" ({said})" if said else "") +
            f"; `{ssh_check(spark.data, spark.name)}` shows why")



def reconnected(spark: Any) -> str:
    """Connect again to a Spark that did not answer (a refresh of status_watch): "" once it answers, else ssh's
    reason."""
    try:
        spark.connect(show_errors=False, raise_exceptions=True)
    except ConnectError as e:
        return str(e.args[0] if e.args else e)
    return ""



def spark_facts(spark: Any, s: Settings, said: str = "") -> SparkFacts:
    """said: why connecting failed, when this run knows (else pyinfra printed it above)."""
    if not spark.connected:  # asking a fact would try to connect again
        return {"unreachable": unanswered(spark, said)}
    layout = s.layout
    inputs = _fact(spark, RankInputs, **rank_inputs_args(s, image_ref(s)))
    facts: SparkFacts = {"container": inputs["container"], "rank_inputs": inputs}
    found = dict(inputs.get("generations") or {})
    folders = tuple(generation_folder(s, g) for g in read_records(found.get("files") or {}, "").generations)
    facts["generation_sizes"] = _fact(spark, FolderSizes, paths=folders) if folders else {}
    facts["gpu"] = _fact(spark, GpuClockState, nvidia_smi=s.nvidia_smi_path, record_path=GPU_CLOCK_RECORD)
    facts["addrs"], facts["roce"] = _fact(spark, IpAddresses), _fact(spark, RoceDevices)
    # sudo: binding ping to a netdev (-I) needs CAP_NET_RAW, as in the link step
    facts["pings"] = [bool(_fact(spark, PingOk, netdev=r["netdev"], address=ip_of(peer["address"]),
                                 size=int(s.link_mtu) - 28, _sudo=True))
                      for r, peer in zip(s.link_rails, s.the_peer.link_rails, strict=False)]
    facts["meminfo"] = _fact(spark, MemInfo)
    facts["data_verified"] = _fact(spark, FileText, path=record_path(layout.state_dir))
    facts["link_bandwidth"] = _fact(spark, FileText, path=layout.link_bandwidth)
    facts["engram"] = _fact(spark, FolderCheck, path=layout.engram, sums="SHA256SUMS",
                            marker=SUMS_STATE if s.is_head else MARKER)
    facts["kit"] = _fact(spark, FolderCheck, path=layout.kit, sums="MANIFEST", marker=MARKER)
    facts["weights_symlink"] = _fact(spark, LinkTarget, path=layout.active_rank_link())
    facts["weights"] = _fact(spark, RankFolder, path=layout.active_rank_link())
    units = [MEMGUARD_UNIT, SUPERVISOR_UNIT] if s.is_head else [MEMGUARD_UNIT]
    facts["units"] = {u: _fact(spark, UnitState, unit=u, path=unit_path(u)) for u in units}
    facts["units"][GPU_CLOCK_TIMER] = _fact(spark, UnitState, unit=GPU_CLOCK_TIMER)  # read by the GPU row
    if s.is_head:
        facts["checkpoint"] = _fact(spark, HfPlan, **checkpoint_plan_args(s))
    else:
        facts["weights_check"] = _fact(spark, FolderCheck, path=layout.active_rank_link(), sums="SHA256SUMS",
                                       marker=MARKER)
        if s.worker_weights == "nfs":
            facts["nfs_volume"] = _fact(spark, DockerVolumeInfo, volume=s.nfs_volume)
        else:
            facts["checkpoint_copy"] = _fact(spark, FolderCheck, path=layout.model_folder, sums=BLOB_SUMS,
                                             marker=MARKER)
    return facts



def api_key_for(head: Any, s: Settings, keyed: bool | None = None) -> str | None:
    """The key rank 0 wants, from the head's key file ("" when it wants none, or when the file gives none); None when
    the head did not answer to be asked. keyed: whether the running rank 0 wants one (served_api); None: as the
    settings ask."""
    if not head.connected:
        return None
    return read_api_key(head, s.layout.api_key) if (s.api_key if keyed is None else keyed) else ""



def probe_api(s: Settings, key: str | None, served: tuple[bool | None, str | None] = (None, None)) -> ApiProbe:
    """GET /v1/models from this machine (with `key`, from api_key_for), timed. served: served_api's answer for the
    running rank 0."""
    start = time.monotonic()
    problem = models_listed(s.api_base_url, s.served_name, key or "")
    served_key, served_host = served
    return {"problem": problem, "latency_ms": (time.monotonic() - start) * 1000,
            "key_on": s.api_key if served_key is None else served_key, "key_read": None if key is None else bool(key),
            "served_key": served_key, "served_host": served_host, "settings_key": s.api_key, "settings_host": s.host}



def probe_metrics(base_url: str, key: str, timeout: float = 5) -> MetricsProbe:
    """GET /metrics from this machine (the engine asks for the key there as on /v1), parsed."""
    url = f"{base_url}/metrics"
    probe: MetricsProbe = {"url": url, "problem": None, "values": {}, "kinds": {}, "read_at": None}
    try:
        r = requests.get(url, headers=auth_headers(key), timeout=timeout)
    except requests.RequestException as e:
        return {**probe, "problem": f"no answer ({type(e).__name__})"}
    if r.status_code != 200:
        said = {401: "refused the API key (401)", 404: "not served by this engine (404)"}
        return {**probe, "problem": said.get(r.status_code, f"answered {r.status_code}")}
    exposition = prometheus.parse(r.text)
    values = prometheus.totals(exposition)
    kinds = {name: prometheus.family_type(name, exposition.types) for name in values}
    return {**probe, "values": values, "kinds": kinds, "read_at": time.time()}



def dry_run_argv(argv: Sequence[str]) -> list[str]:
    """This pyinfra command line with deploy.py in status.py's place, as a --dry --json plan (prompts dropped)."""
    args = []
    for arg in argv[1:]:
        if arg in ("-y", "--yes", "--dry", "--json"):
            continue
        if os.path.basename(arg) == "status.py":
            arg = os.path.join(os.path.dirname(arg), "deploy.py")
        args.append(arg)
    return [sys.executable, "-m", "pyinfra", *args, "--dry", "--json"]



def read_plan(stdout: str, stderr: str, returncode: int) -> PlanCount:
    """The counts from deploy.py --dry --json's output, or why there are none."""
    try:
        plan = json.loads(stdout)["plan"] if returncode == 0 else None
    except (ValueError, KeyError, TypeError):
        plan = None
    if not isinstance(plan, list):
        said = [ln.strip() for ln in _ANSI.sub("", stderr).splitlines() if ln.strip()]
        return {"changes": {}, "conditional": {}, "error": (said[-1] if said else f"exit status {returncode}")[:300]}
    changes, conditional = count_changes(plan)
    return {"changes": changes, "conditional": conditional, "error": None}



def deploy_plan(argv: Sequence[str]) -> PlanCount:
    """Run deploy.py --dry --json from this machine with this run's command line and environment."""
    try:
        done = subprocess.run(dry_run_argv(argv), capture_output=True, text=True, timeout=PLAN_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, env=os.environ.copy())
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"changes": {}, "conditional": {}, "error": f"{type(e).__name__}: {e}"}
    return read_plan(done.stdout, done.stderr, done.returncode)



def gather(head: Any, worker: Any, head_settings: Settings, worker_settings: Settings,
           argv: Sequence[str] | None, previous: Report | None = None) -> Report:
    """Read both Sparks (and, with argv, the deploy plan) and build the table. argv: this run's command line;
    previous: the last refresh's report (status_watch), for the counters' rates."""
    # a refresh connects again to a Spark that did not answer, so a watch shows it once it is back
    said = {spark.name: reconnected(spark) for spark in (head, worker) if previous is not None and not spark.connected}
    head_facts = spark_facts(head, head_settings, said.get(head.name, ""))
    worker_facts = spark_facts(worker, worker_settings, said.get(worker.name, ""))
    wanted_hashes(head_settings, worker_settings, head_facts, worker_facts)
    served = served_api(None if "unreachable" in head_facts else head_facts.get("container"))
    key = api_key_for(head, head_settings, served[0])
    api = probe_api(head_settings, key, served)
    metrics = probe_metrics(head_settings.api_base_url, key or "") if api["problem"] is None else None
    # deploy.py --dry stops at a Spark that does not answer: its plan would say only that, after a timeout
    plan = deploy_plan(argv) if argv is not None and head.connected and worker.connected else None
    now = datetime.now(UTC)
    hosts = {"head": head.name, "worker": worker.name}
    rows = build_rows(head_settings, worker_settings, head_facts, worker_facts, api, plan, now, hosts, metrics,
                      previous.metrics if previous else None)
    both = ((head_settings, head_facts, head), (worker_settings, worker_facts, worker))
    containers = {s.rank: None if "unreachable" in facts else facts.get("container") or {} for s, facts, _ in both}
    unreached = {s.rank: (spark.name, ssh_check(spark.data, spark.name)) for s, facts, spark in both
                 if "unreachable" in facts}
    return Report(rows, not_serving(containers, api, unreached), hosts,
                  {"head": head.connected, "worker": worker.connected}, metrics, now,
                  {s.role or "?": unreached[s.rank][1] for s, _, _ in both if s.rank in unreached})

