"""Every operation scenario under tests/operations/<operation>/<case>.json, one test each: facts in, commands out.

The folder names the operation by its dotted path below the `operations` package (`owned.folders.owned_folders`);
a case is one JSON object (docs/testing.md, "Operation scenarios"):

  about       why the case exists, one line (required)
  settings    {"role": "head" or "worker", "home": ..., other names: overrides}: the operation's `s` (when it
              takes one; else what $pair_plans holds), built as tests/unit/settings_factory.make_settings builds it,
              paired with the peer's settings below
  peer        the other Spark, for an operation that reads both (the pair step): {"settings": the other role's
              overrides, "facts": its facts, as `facts` gives them}: a second fake host named "peer"
  args        the operation's other keyword arguments. Values JSON cannot hold are tagged objects:
              {"$text": "..."} an in-memory file (StringIO), {"$repo_file": "operations/remote/x.py"} a file of this
              checkout, {"$earlier_op": {"complete": bool, "changed": bool}} an operation run earlier (its
              OperationMeta, e.g. a unit file's put), {"$pair_plans": {"image": ..., "template": ...}} the pair
              step's handoff (operations/ranks.PairPlans) of `settings` and `peer`, no phase read yet ("rollback":
              true for rollback.py's),
              {"$peer_host": {}} the `peer` fake host itself (an operation given the other Spark, e.g. the link's)
  facts       {"module.FactClass": value} for a fact read without arguments, {"module.FactClass": {"k=v, k2=v2":
              value}} for one read with them (keyword arguments sorted, as pyinfra's own scenarios key them); an
              object key of digits is read as an int (JSON keys are strings; RankInputs' port_holders is keyed by port)
  executing   true: the run executes (pyinfra's state.is_executing); false (default): --dry plans
  commands    what the operation yields, in order: a command line; {"command": ..., "_sudo": true} for one with
              connector arguments; {"upload": dest, "text": ...} or {"upload": dest, "src": repo path}
  noop        what it reports when it yields nothing (absent: it reports nothing)
  logged      the lines it logs (pyinfra's logger, INFO and up), in order, when what it says is the point
              (absent: not checked)
  fails       the check it refuses with (operations/util/checks.check_failed), in place of commands: a run yields
              one failing command with it, --dry plans nothing and warns "will fail: " with it; with "executing": true
              only the run is checked (a refusal only the executing run judges, e.g. settled=False; what --dry plans
              instead is a case of its own)
  facts_read  the short names of the facts it reads, in order, when how many round trips matters
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
from io import BytesIO, StringIO
from pathlib import Path
from typing import Any

import pytest
from harness import FakeHost, _render, refused, run_op, with_args
from pyinfra.api import FileUploadCommand
from settings_factory import PEER, ROOT, make_pair

from operations.util.commands import fail_command

SCENARIOS = ROOT / "tests" / "operations"
KEYS = {"about", "settings", "peer", "args", "facts", "executing", "commands", "noop", "logged", "fails",
        "facts_read"}


def scenario_files() -> list[Path]:
    return sorted(SCENARIOS.glob("*/*.json"))


def _import(dotted: str, what: str) -> Any:
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise AssertionError(f"{what} {dotted!r} does not exist ({e})") from None


class EarlierOp:
    """An operation that ran before the one under test, as operations/util/checks.op_changed reads it: once complete,
    its result; asked whether it will change only while planning (asking a completed one would read its facts again)."""

    def __init__(self, complete: bool = True, changed: bool = True):
        self.complete, self.changed = complete, changed

    def is_complete(self) -> bool:
        return self.complete

    def did_change(self) -> bool:
        assert self.complete, "did_change asked of an operation that has not run"
        return self.changed

    @property
    def will_change(self) -> bool:
        assert not self.complete, "will_change asked of an operation that already ran: its facts would be read again"
        return self.changed


class Case:
    """What a tagged value may be built from besides its own fields: the case's settings and peer host."""

    def __init__(self, s: Any = None, peer: FakeHost | None = None):
        self.s, self.peer = s, peer


def _pair_plans(fields: dict, case: Case) -> Any:
    from operations.ranks import PairPlans

    assert case.s is not None and case.peer is not None, "$pair_plans needs the case's `settings` and `peer`"
    return PairPlans.of(case.s, case.peer, fields["image"], fields["template"], fields.get("rollback", False))


TAGS = {
    "$text": lambda text, case: StringIO(text),
    "$repo_file": lambda path, case: str(ROOT / path),
    "$earlier_op": lambda fields, case: EarlierOp(**fields),
    "$pair_plans": _pair_plans,
    "$peer_host": lambda _fields, case: case.peer,
}


def _arg(value: Any, case: Case) -> Any:
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in TAGS:
        tag, inner = next(iter(value.items()))
        return TAGS[tag](inner, case)
    if isinstance(value, dict):
        return {k: _arg(v, case) for k, v in value.items()}
    if isinstance(value, list):
        return [_arg(v, case) for v in value]
    return value


def _settings(given: dict, peer: dict) -> Any:
    """This role's settings with the case's overrides, paired with the other role's (settings_factory.make_pair)."""
    given = dict(given)
    role, home, environ = given.pop("role", "head"), given.pop("home", "/home/nvidia"), given.pop("environ", None)
    head, worker = make_pair(environ, **{role: given, PEER[role]: peer}, home=home)  # type: ignore[arg-type]
    return head if role == "head" else worker


def _int_keys(value: Any) -> Any:
    """A fact value with its digit keys as ints, as the fact's process() gives them (JSON keys are strings)."""
    if isinstance(value, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k: _int_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_int_keys(v) for v in value]
    return value


def _facts(facts: dict) -> dict:
    """The harness's fact table (tests/unit/harness.py): a value keyed by "k=v" strings is the table of a fact read
    with arguments."""
    out = {}
    for name, value in facts.items():
        _import(name, "fact")
        value = _int_keys(value)
        keyed = isinstance(value, dict) and value and all("=" in key for key in value)
        out[name] = with_args(value) if keyed else value
    return out


def _shown(command: Any) -> Any:
    """A yielded command as a scenario writes it."""
    if isinstance(command, FileUploadCommand):
        src = command.src
        if isinstance(src, StringIO | BytesIO):
            text = src.getvalue()
            return {"upload": command.dest, "text": text.decode() if isinstance(text, bytes) else text}
        path = Path(str(src))
        return {"upload": command.dest, "src": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)}
    arguments = {k: v for k, v in getattr(command, "connector_arguments", {}).items() if v}
    return {"command": _render(command), **arguments} if arguments else _render(command)


def _same(got: Any, want: Any, what: str, path: Path) -> None:
    __tracebackhide__ = True  # the diff says it all
    if got == want:
        return
    wanted, found = (json.dumps(x, indent=2, sort_keys=True).splitlines() for x in (want, got))
    diff = "\n".join(difflib.unified_diff(wanted, found, "scenario", "operation", lineterm=""))
    raise AssertionError(f"{path.relative_to(ROOT)}: {what} differ (- the scenario, + the operation)\n{diff}")


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_operation_scenario(path: Path, caplog) -> None:
    case = json.loads(path.read_text())
    unknown = set(case) - KEYS
    assert not unknown, f"{path.name}: unknown keys {sorted(unknown)} (known: {sorted(KEYS)})"
    assert case.get("about"), f"{path.name}: say in `about` why the case exists"
    assert ("fails" in case) != ("commands" in case), f"{path.name}: give `commands` or `fails`, one of them"
    op = _import(f"operations.{path.parent.name}", "operation")
    peer = case.get("peer", {})
    assert not set(peer) - {"settings", "facts"}, f"{path.name}: `peer` takes `settings` and `facts`"
    tagged = Case(_settings(case["settings"], peer.get("settings", {})) if "settings" in case else None,
                  FakeHost(_facts(peer.get("facts", {})), name="peer") if "peer" in case else None)
    kwargs = {k: _arg(v, tagged) for k, v in case.get("args", {}).items()}
    if tagged.s is not None and "s" in inspect.signature(op._inner).parameters:  # else only $pair_plans reads it
        kwargs["s"] = tagged.s
    facts = _facts(case.get("facts", {}))
    if "fails" in case and case.get("executing"):  # judged by the executing run alone
        _, host = run_op(op, facts, executing=True, **kwargs)
        _same([_shown(c) for c in host.yielded], [fail_command(case["fails"]).get_raw_value()], "failing commands",
              path)
        return
    if "fails" in case:
        command, warnings = refused(caplog, op, facts, **kwargs)
        _same(command, fail_command(case["fails"]).get_raw_value(), "failing commands", path)
        assert f": will fail: {case['fails']}" in warnings, f"{path.name}: --dry warns\n{warnings}"
        return
    caplog.clear()
    with caplog.at_level("INFO", logger="pyinfra"):
        _, host = run_op(op, facts, executing=case.get("executing", False), **kwargs)
    _same([_shown(c) for c in host.yielded], case["commands"], "commands", path)
    _same(host.noops, [case["noop"]] if "noop" in case else [], "noop descriptions", path)
    if "logged" in case:
        _same([r.getMessage() for r in caplog.records if r.name.startswith("pyinfra")], case["logged"], "log lines",
              path)
    if "facts_read" in case:
        _same([name.rsplit(".", 1)[1] for name, _kwargs in host.fact_calls], case["facts_read"], "facts read", path)


def test_every_scenario_folder_names_an_operation_and_holds_a_case() -> None:
    folders = sorted(p for p in SCENARIOS.iterdir() if p.is_dir())
    assert folders, "no scenarios found"
    for folder in folders:
        assert list(folder.glob("*.json")), f"{folder} holds no scenario"
        assert hasattr(_import(f"operations.{folder.name}", "operation"), "_inner"), f"{folder.name}: not an operation"
