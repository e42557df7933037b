"""When neither Spark answers over ssh, pyinfra ends at its connect stage ("No hosts remaining!") before any deploy
file runs. status.py and stop.py still have something to say then: status.py its table (both Sparks unreachable,
the API asked from this machine), stop.py that nothing was stopped and how to see why. config.py hands one of them
to `after_no_spark_answers`, which runs it in the head's place once pyinfra has found no Spark to run on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_config, ctx_host

from operations.settings.site import ssh_check

Say = Callable[[Any], None]  # given pyinfra's State, with the head as the current host


def after_no_spark_answers(say: Say) -> None:
    """Wrap the connect stage of the pyinfra CLI that is running: when it leaves no Spark, run `say` as the head's
    run (its Host unconnected), then end as pyinfra would have. Any other failure of the stage is pyinfra's own;
    outside the CLI (a test running config.py) nothing is wrapped."""
    cli = sys.modules.get("pyinfra_cli.cli")  # never imported here: importing it patches gevent into the process
    if cli is None:
        return
    connect_all = cli.connect_all

    def connect_or_say(state: Any) -> None:
        try:
            connect_all(state)
        except PyinfraError:
            if state.active_hosts or not state.failed_hosts:  # not "no Spark answered"
                raise
            with ctx_config.use(state.config.copy()), ctx_host.use(state.inventory.get_group("head")[0]):
                say(state)
            raise

    setattr(cli, "connect_all", connect_or_say)  # noqa: B010 (a module's attribute: mypy refuses the plain assignment)


def status_anyway(path: str) -> Say:
    """Run status.py (at `path`) as pyinfra would on the head: it shows both Sparks unreachable, asks the API from
    this machine and, with status_watch, keeps trying every interval."""
    def run(_state: Any) -> None:
        exec(compile(Path(path).read_text(), path, "exec"), {"__file__": path, "__name__": "status"})
    return run


def nothing_stopped(sparks: Sequence[Any]) -> str:
    """stop.py's line when no Spark answered. sparks: pyinfra's hosts, head first."""
    checks = " and ".join(f"`{ssh_check(spark.data, spark.name)}`" for spark in sparks)
    names = " and ".join(spark.name for spark in sparks)
    return (f"stop.py: neither Spark answered over ssh ({names}), so no rank was stopped: {checks} show why; run "
            "stop.py again once they answer")


def stop_refused(state: Any) -> None:
    logger.error(nothing_stopped([*state.inventory.get_group("head"), *state.inventory.get_group("worker")]))
