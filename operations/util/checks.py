"""The one rule for a check that only an executing run can judge.

While planning (`--dry`, or the plan before a run), a problem is printed as a warning naming the Spark, the check
and the fix ("will fail: ..."), and the operation goes on to report the change it would make; while executing, the
same message fails that Spark (and so the run: FAIL_PERCENT is 0).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import StringCommand

from .commands import fail_command


def op_changed(op: Any) -> bool:
    """Whether an earlier operation changes its host. Asked inside a later operation: once it ran, its result, with
    no fact read again (OperationMeta.changed read while the deploy is declared would run its facts a second time);
    while planning, whether it will."""
    return op.did_change() if op.is_complete() else op.will_change


def is_settled(settled: bool | Callable[[], bool]) -> bool:
    """A check's `settled`, given as a value or asked when the check runs (e.g. `lambda: not op_changed(apply)`)."""
    return settled() if callable(settled) else bool(settled)


def check_failed(check: str, problems: Iterable[str | None], *,
                 settled: bool | Callable[[], bool] = True) -> Generator[StringCommand, None, bool]:
    """`stop = yield from check_failed("CX7 link addresses", problems)`; return from the operation when stop is True.

    settled=False: an earlier operation of this run changes what the check reads (e.g. netplan apply), so while
    planning the problem is not reported yet; the executing run judges it.
    """
    found = [p for p in problems if p]
    if not found:
        return False
    message = f"{check}: {'; '.join(found)}"
    if state.is_executing:
        yield fail_command(message)
        return True
    if is_settled(settled):
        logger.warning(f"{host.name}: will fail: {message}")
    return False
