"""A switch of the serving pair, judged from this machine: the new pair's health, smoke test and optional exact gate,
and the way back when it fails (the last good generation started again from its record: no rebuild, no download).

One stop and one start of a rank (`rank_stop`, `rank_start`), yielded by the switch's operations (operations/ranks.py:
deploy.py's and rollback.py's, which plans the record it starts as the wanted pair) and run by `pair_switched` for the
automatic rollback (`new_pair_served`), decided only once the health wait failed.
The head's operations of one run share a `SwitchNotes` (when the old pair was stopped, the old pair's exact record);
the functions that reach the Sparks run inside the head's FunctionCommands, through pyinfra's Host objects (so the
head is the context host that `warned` and `function_failed` speak for). They take `SwitchInputs`, the few values of
the settings a switch uses, made once by the pair step (operations/ranks.py), not the settings themselves.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FileUploadCommand, StringCommand
from pyinfra.api.host import Host

from operations.facts.docker import RankContainer
from operations.layout import SUPERVISOR_UNIT
from operations.rank import exposure
from operations.rank.commands import removal_commands, start_commands
from operations.rank.exposure import Exposure
from operations.rank.generation import Generation, Switch
from operations.rank.plan import foreign
from operations.rank.record_check import record_refusal
from operations.rank.serving import (
    live_lines,
    load_status,
    log_tails,
    ranks_down,
    read_api_key,
    smoke_test,
    wait_for_api,
)
from operations.rank.spec import ContainerSpec
from operations.util.checks import function_failed, warned
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


@dataclass(frozen=True)
class Api:
    """Where and how this machine asks a pair: its base URL, the model name it serves, whether it wants the key."""

    base_url: str
    served_name: str
    keyed: bool
    port: int  # rank 0's own port (the LIVE line's)


@dataclass(frozen=True)
class Side:
    """One Spark's rank as a switch stops and starts it (deploy.py's own stop and start), and where its records go."""

    role: str
    rank: int
    container_name: str
    stop_timeout: int
    log_dir: str
    log_keep: int
    min_avail_gib: float
    gpu_clock_mhz: int
    nvidia_smi_path: str
    rank_env: str
    generations: str
    progress_every_s: int  # seconds between the memory wait's lines before a start


@dataclass(frozen=True)
class SwitchInputs:
    """What a switch reads of the settings, made once by the pair step (operations/ranks.switch_inputs)."""

    sides: tuple[Side, Side]  # rank 0's (the head), rank 1's (the worker)
    api: Api  # the API the settings ask for
    api_url_given: bool  # api_url is the user's own view of the port: kept as given across a changed port
    api_key_file: str  # on the head
    asked: Exposure  # how open the settings ask rank 0's API to be
    wait_timeout: int
    upgrade_gate: str
    supervise: bool
    engine_image: str
    prebuilt_image: str


def _client(inputs: SwitchInputs, head: Host) -> Client:
    key = read_api_key(head, inputs.api_key_file) if inputs.api.keyed else ""
    return Client(inputs.api.base_url, key or None, inputs.api.served_name, timeout=300)


def replay_record(inputs: SwitchInputs, head: Host) -> dict[str, Any] | None:
    """The exact gate's record of the pair that serves now (None when it does not answer)."""
    client = _client(inputs, head)
    try:
        return exact.record(client, GATE_PROMPTS, say=lambda line: head.log(f"exact gate, old pair: {line}"))
    except (CouldNotRun, HttpError, OSError) as e:
        warned("exact gate", f"the old pair did not answer ({e}): only the smoke test judges the new one")
        return None
    finally:
        client.session.close()


def gate_problem(inputs: SwitchInputs, head: Host, before: dict[str, Any]) -> str | None:
    """The exact gate: the new pair's replies to the same prompts at temperature 0 must be the old pair's."""
    client = _client(inputs, head)
    try:
        after = exact.record(client, GATE_PROMPTS, say=lambda line: head.log(f"exact gate, new pair: {line}"))
    except (CouldNotRun, HttpError, OSError) as e:
        return f"the exact gate could not record the new pair's replies ({e})"
    finally:
        client.session.close()
    result = exact.compare_records(before, after, say=lambda line: head.log(f"exact gate: {line}"))
    return None if result.status == PASS else f"the exact gate found a difference: {result.detail}"


def api_of(inputs: SwitchInputs, spec: ContainerSpec | None = None) -> Api:
    """The API the settings ask for, or the one a recorded rank 0 serves (a rollback across a changed port, name or
    key is judged where the old pair answers)."""
    asked = inputs.api
    if spec is None:
        return asked
    port = exposure.flag_value(spec.argv, "--port") or str(asked.port)
    base = asked.base_url
    if port != str(asked.port) and not inputs.api_url_given:
        base = f"{base.rsplit(':', 1)[0]}:{port}"
    return Api(base, exposure.flag_value(spec.argv, "--name") or asked.served_name, exposure.of_argv(spec.argv).keyed,
               int(port))


def pair_problem(inputs: SwitchInputs, head: Host, worker: Host, timeout: float, api: Api | None = None) -> str | None:
    """Wait for rank 0's API (a rank that exits ends the wait), then the smoke test; None when both pass."""
    name, api = inputs.sides[0].container_name, api or api_of(inputs)
    api_key = read_api_key(head, inputs.api_key_file) if api.keyed else ""
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


def run(spark: Host, command: StringCommand | FileUploadCommand) -> tuple[bool, list[str]]:
    if isinstance(command, FileUploadCommand):  # a rank's environment file (start_commands)
        uploaded = spark.put_file(command.src, command.dest, print_output=False, print_input=False,
                                  **command.connector_arguments)
        return bool(uploaded), [] if uploaded else [f"could not upload {command.dest}"]
    ok, out = spark.run_shell_command(command, print_output=False, print_input=False, **command.connector_arguments)
    return bool(ok), list(out.stdout_lines) + list(out.stderr_lines)


def rank_stop(side: Side, container: Mapping[str, Any]) -> list[StringCommand]:
    """Spark `side`'s rank stopped (when it runs) and removed, its log saved first; nothing for no container, or one
    sparkfold did not start (the pair plan refuses that one before anything stops)."""
    if not container or foreign(side.role, side.container_name, container):
        return []
    return list(removal_commands(side.container_name, side.rank, bool(container.get("running")), side.stop_timeout,
                                 side.log_dir, side.log_keep))


def rank_start(side: Side, spec: ContainerSpec) -> list[StringCommand | FileUploadCommand]:
    """Spark `side`'s rank started as `spec`: mounts checked, memory waited for, the GPU clock lock, `docker run`."""
    return list(start_commands(spec, side.min_avail_gib, side.gpu_clock_mhz, side.nvidia_smi_path, side.rank_env,
                               every=side.progress_every_s))


def containers_now(inputs: SwitchInputs, head: Host, worker: Host) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """Both rank containers as they are now: the automatic rollback stops the pair this run started, whose containers
    no plan read (the health wait may have seen one exit, a failed start may have left none)."""
    return (head.get_fact(RankContainer, container=inputs.sides[0].container_name),
            worker.get_fact(RankContainer, container=inputs.sides[1].container_name))


def refusal_of(inputs: SwitchInputs, target: Generation) -> str | None:
    """Why `target`'s record may not be started (operations/rank/record_check.py), or None."""
    return record_refusal(target, inputs.engine_image, inputs.prebuilt_image,
                          tuple(side.container_name for side in inputs.sides))


def pair_switched(inputs: SwitchInputs, head: Host, worker: Host,
                  containers: tuple[Mapping[str, Any], Mapping[str, Any]], target: Generation) -> str | None:
    """The pair in `containers` (rank 0's, rank 1's) stopped and `target`'s ranks started from its record, rank 1
    first, with deploy.py's own stop and start (rank_stop, rank_start); None when both started. A record that fails
    its check stops nothing; rank 0 is not started when rank 1 did not start."""
    refused = refusal_of(inputs, target)
    if refused:
        return refused
    sides = ((head, inputs.sides[0]), (worker, inputs.sides[1]))
    for rank, (spark, side) in enumerate(sides):
        for command in rank_stop(side, containers[rank]):
            ok, out = run(spark, command)
            if not ok:
                return f"rank {rank} could not be stopped on {spark.name}: {' '.join(out)[-300:]}"
    for rank in (1, 0):
        spark, side = sides[rank]
        for started in rank_start(side, target.specs[rank]):
            ok, out = run(spark, started)
            if not ok:
                return f"rank {rank} of generation {target.id} did not start on {spark.name}: {' '.join(out)[-300:]}"
    return None


def switched_to(inputs: SwitchInputs, head: Host, worker: Host, containers: tuple[Mapping[str, Any], Mapping[str, Any]],
                target: Generation) -> str | None:
    """The pair replaced by `target` (stop, start, health wait, smoke test, judged where `target`'s rank 0 answers);
    None when it serves."""
    return (pair_switched(inputs, head, worker, containers, target)
            or pair_problem(inputs, head, worker, inputs.wait_timeout, api_of(inputs, target.specs[0])))


def supervisor_started(inputs: SwitchInputs, head: Host, unit: str) -> None:
    """The supervisor the switch paused, started again for the pair that serves now."""
    if inputs.supervise:
        ok, out = run(head, StringCommand("systemctl", "start", unit, _sudo=True))
        if not ok:
            warned("supervise", f"could not start {unit} again: {' '.join(out)[-200:]}")


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


def new_pair_served(state: Any, host: Host, worker: Host, inputs: SwitchInputs, change: Switch | None,
                    notes: SwitchNotes, failed_start: str | None = None) -> bool:
    """pair_serving's judgement of the new pair (health, smoke, the exact gate); when it fails, the last good
    generation again. failed_start: why a rank did not start (the pair is failed without a wait)."""
    problem = failed_start or pair_problem(inputs, host, worker, inputs.wait_timeout)
    if problem is None and inputs.upgrade_gate == "exact":
        if notes.replay is None:
            warned("exact gate", "no record of the old pair (none served before this run, or it did not answer): "
                   "the smoke test alone judged the new pair")
        else:
            problem = gate_problem(inputs, host, notes.replay)
    if problem is None:
        for line in live(inputs, inputs.api, inputs.asked):
            host.log(line)
        downtime = downtime_line(notes, clock())
        if downtime:
            host.log(downtime)
        return True
    tails = log_tails(host, worker, inputs.sides[0].container_name)  # read before the rollback replaces the failed pair
    host.log(f"the new pair failed ({problem}); its ranks' last log lines:\n{tails}")
    target = change.came_from if change else None
    # the way back is decided here, not planned: only the health wait (this function's) says the new pair failed
    back = switched_to(inputs, host, worker, containers_now(inputs, host, worker), target) if target else None
    if target is not None:
        supervisor_started(inputs, host, SUPERVISOR_UNIT)
    logs = (inputs.sides[0].log_dir, inputs.sides[1].log_dir)
    new_id = change.to.id if change and change.to else "?"
    opened = ""
    if target is not None and back is None:  # the old pair serves again, as it was recorded
        opened = exposure.rollback_warning(exposure.of_argv(target.specs[0].argv), inputs.asked)
        _log_live(host, inputs, target)
    return function_failed("the switch", failure_message(new_id, problem, logs, target, back, opened))


def live(inputs: SwitchInputs, api: Api, exposed: Exposure) -> list[str]:
    """The LIVE lines of the pair that answers at `api`, with the open-API warning of how `exposed` it is."""
    return live_lines(api.served_name, api.port, api.base_url, inputs.api_key_file if api.keyed else "",
                      exposure.open_note(exposed, api.port))


def _log_live(host: Host, inputs: SwitchInputs, target: Generation) -> None:
    """The LIVE lines of a recorded pair that serves again: its own port, name, key and open-API warning (a record
    may predate the settings), not the settings'."""
    for line in live(inputs, api_of(inputs, target.specs[0]), exposure.of_argv(target.specs[0].argv)):
        host.log(line)


def failed_with_logs(state: Any, host: Host, worker: Host, container_name: str, message: str) -> bool:
    """A pair that was not switched but has a rank down: both ranks' last log lines, then the failure line."""
    host.log(f"the ranks' last log lines:\n{log_tails(host, worker, container_name)}")
    return function_failed("the serving pair", f"{message} (the ranks' last log lines are above)")


def rollback_served(state: Any, host: Host, worker: Host, inputs: SwitchInputs, target: Generation, came_from: str,
                    notes: SwitchNotes, failed_start: str | None = None) -> bool:
    """rollback.py's judgement of the pair deploy.py's stop and start operations started from `target`'s record: the
    health wait and the smoke test where its rank 0 answers (failed_start: why a rank did not start, judged failed
    at once), the supervisor the stop paused started again, the LIVE line, the API's downtime."""
    problem = failed_start or pair_problem(inputs, host, worker, inputs.wait_timeout, api_of(inputs, target.specs[0]))
    supervisor_started(inputs, host, SUPERVISOR_UNIT)
    if problem is not None:
        return function_failed("rollback.py", f"the rollback to generation {target.id} failed: {problem}; run "
                               "deploy.py to start the pair the settings ask for")
    host.log(f"rolled back: generation {came_from} → {target.id}")
    _log_live(host, inputs, target)
    opened = exposure.more_open(exposure.of_argv(target.specs[0].argv), inputs.asked)
    if opened:  # asked for with rollback_open: said again where the run ends
        warned("rollback_open", f"generation {target.id} is more open than the settings ask: "
               f"{'; and '.join(opened)}. {exposure.CLOSE_IT}.")
    downtime = downtime_line(notes, clock())
    if downtime:
        host.log(downtime)
    return True
