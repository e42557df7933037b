"""The one failure style (operations/util/checks.py): check_failed in both phases, the one warning helper, the
failing branch of a script, and no step that builds its own failing command."""

from __future__ import annotations

import re
from pathlib import Path

from harness import refused, run_op
from pyinfra.api import StringCommand, operation

from operations.util import check_failed, failing_shell, warned

OPERATIONS = Path(__file__).resolve().parents[2] / "operations"


@operation()
def _checked(problems: list, settled: bool = True, waits: bool = False):
    wait = (lambda message: StringCommand(f"wait-then-fail {message!r}")) if waits else None
    if (yield from check_failed("the thing", problems, settled=settled, fails_with=wait)):
        return
    yield "the change"


@operation()
def _only_checks(problems: list):
    yield from check_failed("the thing", problems)


def test_a_problem_fails_a_run_and_is_a_warning_while_planning(caplog):
    command, warnings = refused(caplog, _only_checks, {}, problems=["it is broken. Fix: mend it", None])
    assert command == "echo 'sparkfold: the thing: it is broken. Fix: mend it' >&2; exit 1"
    assert warnings == "spark: will fail: the thing: it is broken. Fix: mend it"


def test_planning_goes_on_and_an_unsettled_problem_waits_for_the_run(caplog):
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert run_op(_checked, {}, problems=["broken"])[0] == ["the change"]  # --dry shows what a run would do
        assert "will fail: the thing: broken" in caplog.text
        caplog.clear()
        assert run_op(_checked, {}, problems=["broken"], settled=False)[0] == ["the change"]
        assert caplog.text == ""  # an earlier step of the run changes what the check reads
        assert run_op(_checked, {}, problems=[None, ""])[0] == ["the change"]
    assert run_op(_checked, {}, executing=True, problems=["broken"], settled=False)[0][0].endswith("exit 1")
    assert run_op(_checked, {}, executing=True, problems=[])[0] == ["the change"]


def test_fails_with_replaces_the_failing_command_while_executing_only(caplog):
    assert run_op(_checked, {}, executing=True, problems=["low"], waits=True)[0] == [
        "wait-then-fail 'the thing: low'"]
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert run_op(_checked, {}, problems=["low"], waits=True)[0] == ["the change"]
    assert "will fail: the thing: low" in caplog.text


@operation()
def _warns():
    warned("the thing", "this stops something. Fix: allow it")
    yield "the change"


def test_a_warning_reads_the_same_in_both_phases(caplog):
    texts = []
    for executing in (False, True):
        caplog.clear()
        with caplog.at_level("WARNING", logger="pyinfra"):
            assert run_op(_warns, {}, executing=executing)[0] == ["the change"]
        texts.append([(r.levelname, r.getMessage()) for r in caplog.records])
    assert texts[0] == texts[1] == [("WARNING", "spark: warning: the thing: this stops something. Fix: allow it")]


def test_failing_shell_is_the_failing_branch_of_a_script():
    text = failing_shell("the copy", "it differs; rerun")
    assert text == "echo 'sparkfold: the copy: it differs; rerun' >&2; exit 1"


def test_no_step_builds_its_own_failing_command():
    """Steps fail through check_failed (or failing_shell inside a script): fail_command is util's own."""
    found = {str(path.relative_to(OPERATIONS)) for path in OPERATIONS.rglob("*.py")
             if "util" not in path.relative_to(OPERATIONS).parts and re.search(r"\bfail_command\(", path.read_text())}
    assert found == set(), "use operations/util/checks.py instead"
