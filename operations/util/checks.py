"""The one rule for a check that only an executing run can judge.

While planning (`--dry`, or the plan before a run), a problem is printed as a warning naming the Spark, the check
and the fix ("will fail: ..."), and the operation goes on to report the change it would make; while executing, the
same message fails that Spark (and so the run: FAIL_PERCENT is 0).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable

from pyinfra import host, logger, state
from pyinfra.api import StringCommand

from .commands import fail_command


def check_failed(check: str, problems: Iterable[str | None], *,
                 settled: bool = True) -> Generator[StringCommand, None, bool]:
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
    if settled:
        logger.warning(f"{host.name}: will fail: {message}")
    return False
