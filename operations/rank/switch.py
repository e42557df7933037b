"""A switch of the serving pair, judged from this machine: the new pair's health, smoke test and optional exact gate,
and the way back when it fails (the last good generation started again from its record: no rebuild, no download).

The head's operations of one run share a `SwitchNotes` (when the old pair was stopped, the old pair's exact record);
these functions run inside their FunctionCommands and reach the Sparks through pyinfra's Host objects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pyinfra import logger
from pyinfra.api import FileUploadCommand, StringCommand

from operations.facts.docker import RankContainer
from operations.rank import exposure
from operations.rank.commands import removal_commands, start_commands
from operations.rank.generation import Generation
from operations.rank.plan import foreign
from operations.rank.record_check import record_refusal
from operations.rank.serving import load_status, ranks_down, read_api_key, smoke_test, wait_for_api
from operations.rank.spec import ContainerSpec
from operations.validate import exact
from operations.validate.client import Client, CouldNotRun, HttpError
from operations.validate.result import PASS

GATE_PROMPTS = ("prose", "no-think", "tool")  # the exact gate's small fixed set (the validator's prompts)


@dataclass
class SwitchNotes:
    """What one run's head operations tell each other about a switch."""

    stopped_at: float | None = None  # when the serving pair was stopped (this machine's clock)
    replay: dict[str, Any] | None = None  # the exact gate's record of the old pair
    start_problem: str | None = None  # why the head did not start rank 0 (the worker's rank 1 did not start)


def _client(s: Any, head: Any) -> Client:
    key = read_api_key(head, s.layout.api_key) if s.api_key else ""
    return Client(s.api_base_url, key or None, s.served_name, timeout=300)


def replay_record(s: Any, head: Any) -> dict[str, Any] | None:
    """The exact gate's record of the pair that serves now (None when it does not answer)."""
    client = _client(s, head)
    try:
        return exact.record(client, GATE_PROMPTS, say=lambda line: head.log(f"exact gate, old pair: {line}"))
    except (CouldNotRun, HttpError, OSError) as e:
        head.log(f"exact gate: the old pair did not answer ({e}): only the smoke test judges the new one",
                 log_func=logger.warning)
        return None
    finally:
        client.session.close()


def gate_problem(s: Any, head: Any, before: dict[str, Any]) -> str | None:
    """The exact gate: the new pair's replies to the same prompts at temperature 0 must be the old pair's."""
    client = _client(s, head)
    try:
        after = exact.record(client, GATE_PROMPTS, say=lambda line: head.log(f"exact gate, new pair: {line}"))
    except (CouldNotRun, HttpError, OSError) as e:
        return f"the exact gate could not record the new pair's replies ({e})"
    finally:
        client.session.close()
    result = exact.compare_records(before, after, say=lambda line: head.log(f"exact gate: {line}"))
    return None if result.status == PASS else f"the exact gate found a difference: {result.detail}"


@dataclass(frozen=True)
class Api:
    """Where and how this machine asks a pair: its base URL, the model name it serves, whether it wants the key."""

    base_url: str
    served_name: str
    keyed: bool
    port: int  # rank 0's own port (the LIVE line's)


def api_of(s: Any, spec: ContainerSpec | None = None) -> Api:
    """The API the settings ask for, or the one a recorded rank 0 serves (a rollback across a changed port, name or
    key is judged where the old pair answers)."""
    if spec is None:
        return Api(s.api_base_url, s.served_name, bool(s.api_key), s.port)
    port = exposure.flag_value(spec.argv, "--port") or str(s.port)
    base = s.api_base_url
    if port != str(s.port) and not s.api_url:  # api_url is the user's own view of the port: kept as given
        base = f"{base.rsplit(':', 1)[0]}:{port}"
    return Api(base, exposure.flag_value(spec.argv, "--name") or s.served_name, exposure.of_argv(spec.argv).keyed,
               int(port))


def pair_problem(s: Any, head: Any, worker: Any, timeout: float, api: Api | None = None) -> str | None:
    """Wait for rank 0's API (a rank that exits ends the wait), then the smoke test; None when both pass."""
    name, api = s.container_name, api or api_of(s)
    api_key = read_api_key(head, s.layout.api_key) if api.keyed else ""
    problem = wait_for_api(api.base_url, api.served_name, api_key, timeout, lambda: ranks_down(head, worker, name),
                           progress=lambda m: head.log(f"{m}; {load_status(head, worker, name)}"))
    if problem is not None:
        return problem
    ok, report = smoke_test(api.base_url, api.served_name, api_key)
    if not ok:
        return "; ".join(report)
    for line in report:
        head.log(f"smoke test {line}")
    return None


def run(spark: Any, command: StringCommand | FileUploadCommand) -> tuple[bool, list[str]]:
    if isinstance(command, FileUploadCommand):  # a rank's environment file (start_commands)
        uploaded = spark.put_file(command.src, command.dest, print_output=False, print_input=False,
                                  **command.connector_arguments)
        return bool(uploaded), [] if uploaded else [f"could not upload {command.dest}"]
    ok, out = spark.run_shell_command(command, print_output=False, print_input=False, **command.connector_arguments)
    return bool(ok), list(out.stdout_lines) + list(out.stderr_lines)


def _stop_pair(s: Any, head: Any, worker: Any) -> str | None:
    """Both ranks stopped and removed, each log saved first (a container sparkfold did not start is left alone)."""
    for rank, spark, side in ((0, head, s.head), (1, worker, s.worker)):
        container = spark.get_fact(RankContainer, container=side.container_name)
        if not container or foreign("Spark", side.container_name, container):
            continue
        for command in removal_commands(side.container_name, rank, bool(container.get("running")), side.stop_timeout,
                                        side.layout.logs, side.log_keep):
            ok, out = run(spark, command)
            if not ok:
                return f"rank {rank} could not be stopped on {spark.name}: {' '.join(out)[-300:]}"
    return None


def refusal_of(s: Any, target: Generation) -> str | None:
    """Why `target`'s record may not be started (operations/rank/record_check.py), or None."""
    return record_refusal(target, s.engine_image, s.prebuilt_image, (s.head.container_name, s.worker.container_name))


def start_generation(s: Any, head: Any, worker: Any, target: Generation) -> str | None:
    """`target`'s ranks started from its record, rank 1 then rank 0, once the record is checked; None when both
    started."""
    refused = refusal_of(s, target)
    if refused:
        return refused
    for rank, spark, side in ((1, worker, s.worker), (0, head, s.head)):
        for command in start_commands(target.specs[rank], side.min_avail_gib, side.gpu_clock_mhz, side.nvidia_smi_path,
                                      side.layout.rank_env):
            ok, out = run(spark, command)
            if not ok:
                return f"rank {rank} of generation {target.id} did not start on {spark.name}: {' '.join(out)[-300:]}"
    return None


def switched_to(s: Any, head: Any, worker: Any, target: Generation) -> str | None:
    """The pair replaced by `target` (stop, start, health wait, smoke test); None when it serves. A record that
    fails its check stops nothing."""
    return (refusal_of(s, target) or _stop_pair(s, head, worker) or start_generation(s, head, worker, target)
            or pair_problem(s, head, worker, s.wait_timeout, api_of(s, target.specs[0])))


def supervisor_started(s: Any, head: Any, unit: str) -> None:
    """The supervisor the switch paused, started again for the pair that serves now."""
    if s.supervise:
        ok, out = run(head, StringCommand("systemctl", "start", unit, _sudo=True))
        if not ok:
            head.log(f"could not start {unit} again: {' '.join(out)[-200:]}", log_func=logger.warning)


def downtime_line(notes: SwitchNotes, now: float) -> str:
    return (f"  the API was down {now - notes.stopped_at:.0f} s during the switch"
            if notes.stopped_at is not None else "")


def failure_message(new_id: str, problem: str, logs: tuple[str, str], target: Generation | None,
                    back: str | None, opened: str = "") -> str:
    """The one message of a switch that failed: what failed, where its logs are, what serves now, and (opened) how
    the pair that serves again is more open than the settings ask."""
    said = f"the new pair (generation {new_id}) failed: {problem}."
    if target is None:
        return (said + " No earlier generation served on this pair, so there is nothing to roll back to: its ranks "
                "are left as they are (logs.py shows their logs); fix the cause and run deploy.py again.")
    said += (f" Its ranks' logs are saved in {logs[0]} on the head and {logs[1]} on the worker (the newest "
             "*-rank0.log.gz and *-rank1.log.gz; zcat shows them).")
    if back is None:
        said += (f" Generation {target.id} serves again (rolled back); run deploy.py again once the cause is "
                 "fixed, or keep the old settings.")
        return said + (f" ⚠ Beware: {opened}" if opened else "")
    return said + f" The rollback to generation {target.id} failed too: {back}. Run rollback.py or deploy.py."


def clock() -> float:
    return time.monotonic()
