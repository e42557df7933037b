"""The three failure styles, and the one way a step warns (docs/architecture.md, "Conventions").

1. check_failed, at plan time: while planning (`--dry`, or the plan before a run), a problem is printed as a warning
   naming the Spark, the check and the fix ("will fail: ..."), and the operation goes on to report the change it
   would make; while executing, the same message fails that Spark (and so the run: FAIL_PERCENT is 0).
2. failing_shell, at run time: the failing branch of a script that finds the problem only when it runs on the Spark;
   function_failed is the same line from Python a FunctionCommand runs on this machine (the health wait, the link's
   measurement), where only execution-time Python can judge.
3. RunStopped, where a run must stop before anything changes (settings to fix, sudo that asks for a password): one
   exception type, its message naming the setting and the fix.
warned prints a step's warning the same way in both phases. Steps never build a failing command or log a warning or
an error themselves (tests/unit/test_failure_styles.py).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError

from operations.util.commands import fail_command


class RunStopped(DeployError):
    """The one exception where a run must stop: its message names the setting (or the Spark) and the fix. A
    DeployError, so pyinfra prints it as one line (`--> pyinfra error in <file> line <n>: <message>`), no traceback."""


def op_changed(op: Any) -> bool:
    """Whether an earlier operation changes its host. Asked inside a later operation: once it ran, its result, with
    no fact read again (OperationMeta.changed read while the deploy is declared would run its facts a second time);
    while planning, whether it will."""
    return op.did_change() if op.is_complete() else op.will_change


def is_settled(settled: bool | Callable[[], bool]) -> bool:
    """A check's `settled`, given as a value or asked when the check runs (e.g. `lambda: not op_changed(apply)`)."""
    return settled() if callable(settled) else bool(settled)


def check_failed(check: str, problems: Iterable[str | None], *, settled: bool | Callable[[], bool] = True,
                 fails_with: Callable[[str], StringCommand] | None = None) -> Generator[StringCommand, None, bool]:
    """`stop = yield from check_failed("CX7 link addresses", problems)`; return from the operation when stop is True.

    settled=False: an earlier operation of this run changes what the check reads (e.g. netplan apply), so while
    planning the problem is not reported yet; the executing run judges it.
    fails_with: while executing, the command that fails this host with the message (e.g. a wait that fails only
    if the problem lasts) instead of failing at once.
    """
    found = [p for p in problems if p]
    if not found:
        return False
    message = f"{check}: {'; '.join(found)}"
    if state.is_executing:  # why: the rule itself: a plan says "will fail", an executing run fails
        yield fails_with(message) if fails_with else fail_command(message)
        return True
    if is_settled(settled):
        logger.warning(f"{host.name}: will fail: {message}")
    return False


def failing_shell(check: str, problem: str) -> str:
    """Shell text that fails this host with `sparkfold: <check>: <problem>`, for a script that finds the problem
    only when it runs on the Spark (e.g. `if ...; then ...; else {failing_shell(...)}; fi`)."""
    return fail_command(f"{check}: {problem}").get_raw_value()


def warned(check: str, message: str) -> None:
    """A step's warning, printed the same way by --dry and by a run: `<host>: warning: <check>: <message>`."""
    logger.warning(f"{host.name}: warning: {check}: {message}")


def function_failed(check: str, problem: str) -> bool:
    """`return function_failed(check, problem)` from a FunctionCommand: failing_shell's line (`sparkfold: <check>:
    <problem>`) printed as this host's error, and False, which fails the host (and so the run)."""
    host.log(f"sparkfold: {check}: {problem}", log_func=logger.error)
    return False
