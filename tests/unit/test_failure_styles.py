"""The three failure styles (operations/util/checks.py, docs/architecture.md) kept by a scan of the source: warnings
and errors are printed by checks.py alone (warned, check_failed, function_failed), a run that must stop raises
RunStopped, and every `is_executing` branch says why it exists on its line or the line above (`# why: ...`)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pyinfra.api.exceptions as pyinfra_exceptions

ROOT = Path(__file__).resolve().parents[2]
CHECKS = "operations/util/checks.py"
ENTRY_SCRIPTS = {"deploy.py", "stop.py", "restart.py", "rollback.py", "status.py", "logs.py", "link_check.py",
                 "inventory.py", "config.py"}
# a line of its own, with the reason, for each file that may print an error itself
LOGS_ITSELF = {"operations/tools/unreached.py": "no Spark answered: there is no host to fail, the line is stop.py's"}
PYINFRA_ERRORS = {name for name, cls in inspect.getmembers(pyinfra_exceptions, inspect.isclass)
                  if issubclass(cls, Exception)}
STOPS = {"RunStopped"}  # and its subclasses, found below
DECORATORS = {"operation", "deploy"}


def sources(root: Path = ROOT) -> dict[str, ast.Module]:
    """Every module of operations/ (not the scripts sent to a Spark, whose exit status is their failure) and the
    entry scripts, parsed."""
    paths = [p for p in (root / "operations").rglob("*.py") if "remote" not in p.relative_to(root).parts]
    paths += [root / name for name in ENTRY_SCRIPTS if (root / name).exists()]
    return {str(p.relative_to(root)): ast.parse(p.read_text(), str(p)) for p in sorted(paths)}


def _name(node: ast.AST | None) -> str:
    """`X` of `raise X(...)`, `raise X`, `raise exceptions.X(...)`; `argparse.X` stays whole (not pyinfra's X)."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        owner = _name(node.value)
        return node.attr if owner in ("exceptions", "api", "pyinfra") else f"{owner}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _is_logger(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in ("warning", "warn", "error", "critical", "exception")
            and isinstance(node.value, ast.Name) and node.value.id == "logger")


def own_logging(trees: dict[str, ast.Module]) -> list[str]:
    """`logger.warning(...)`/`logger.error(...)` and `log_func=logger.warning|error` outside checks.py."""
    found = []
    for path, tree in trees.items():
        if path == CHECKS or path in LOGS_ITSELF:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (_is_logger(node.func)
                                               or any(_is_logger(k.value) for k in node.keywords)):
                found.append(f"{path}:{node.lineno}")
    return found


def _stops(trees: dict[str, ast.Module]) -> set[str]:
    """RunStopped and the classes that subclass it (NotReady...)."""
    stops = set(STOPS)
    classes = [n for tree in trees.values() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    while True:
        more = {c.name for c in classes if any(_name(b) in stops for b in c.bases)} - stops
        if not more:
            return stops
        stops |= more


def _where_a_run_stops(path: str, tree: ast.Module) -> list[ast.Raise]:
    """The raises that reach pyinfra: in an @operation or @deploy function's own body, and at an entry script's top
    level (not inside a def)."""
    raises: list[ast.Raise] = []

    def walk(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                decorated = isinstance(child, ast.FunctionDef) and any(
                    _name(d) in DECORATORS for d in child.decorator_list)
                walk(child, decorated)
            elif isinstance(child, ast.Raise) and inside and child.exc is not None:
                raises.append(child)
            else:
                walk(child, inside)

    walk(tree, path in ENTRY_SCRIPTS)
    return raises


def _exit_status(node: ast.Raise) -> bool:
    """`raise SystemExit(<a number>)`: an exit status, not a message."""
    call = node.exc
    return (_name(call) == "SystemExit" and isinstance(call, ast.Call) and len(call.args) == 1
            and not isinstance(call.args[0], ast.JoinedStr)
            and not (isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)))


def other_stops(trees: dict[str, ast.Module]) -> list[str]:
    """A pyinfra exception raised anywhere (RunStopped is the one), and a raise of anything but RunStopped where it
    stops a run."""
    stops = _stops(trees)
    found = set()
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and _name(node.exc) in PYINFRA_ERRORS - stops:
                found.add(f"{path}:{node.lineno} {_name(node.exc)}")
        for node in _where_a_run_stops(path, tree):
            if _name(node.exc) not in stops and not (path in ENTRY_SCRIPTS and _exit_status(node)):
                found.add(f"{path}:{node.lineno} {_name(node.exc)}")
    return sorted(found)


def unexplained_executing(trees: dict[str, ast.Module], root: Path = ROOT) -> list[str]:
    """Each `<state>.is_executing` whose line, or the line above, has no `# why:` comment."""
    found = []
    for path, tree in trees.items():
        lines = (root / path).read_text().splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "is_executing":
                near = lines[max(node.lineno - 2, 0):node.lineno]
                if not any(re.search(r"# why: \S", line) for line in near):  # a reason, not the bare tag
                    found.append(f"{path}:{node.lineno}")
    return found


def test_warnings_and_errors_are_printed_by_checks_py_alone():
    # before: link.py's and nfs.py's inline logger.warning, link_measure.py's host.log(log_func=logger.warning/error),
    # rank/switch.py's host.log(log_func=logger.warning/error) (the switch, its rollback, rollback.py)
    assert own_logging(sources()) == []


def test_a_run_stops_with_run_stopped_only():
    # before: DeployError in deploy.py, link_check.py, status.py and settings/context.py; OperationError in
    # preflight.py (sudo), streams/ops.py; ValueError in preflight.py (tools_present)
    assert other_stops(sources()) == []


def test_every_is_executing_branch_says_why():
    # before: link.py (the GID wait), nfs.py, link_measure.py (twice), run_lock.py (twice), fact_reuse.py, checks.py,
    # ranks.py (three: the plan's phase key, rank 1's start read by rank 0's, the quick API check)
    assert unexplained_executing(sources()) == []


def test_a_file_allowed_to_log_itself_still_exists():
    assert all((ROOT / path).exists() for path in LOGS_ITSELF)


def test_the_scan_finds_each_kind_of_site(tmp_path):
    # the rules' own check: each finds what it is for, and passes what is allowed
    (tmp_path / "operations").mkdir()
    (tmp_path / "operations" / "step.py").write_text(
        "from pyinfra import logger, state\n"
        "from pyinfra.api import OperationError, operation\n"
        "from operations.util.checks import RunStopped\n"
        "class Refused(RunStopped):\n    pass\n"
        "def helper(x):\n    raise ValueError(x)\n"  # a helper's own error: not where a run stops
        "@operation()\ndef op(x):\n"
        "    logger.warning('hand-made')\n"
        "    host.log('x', log_func=logger.error)\n"
        "    if state.is_executing:\n        raise OperationError('old style')\n"
        "    # why: a reason\n    if not state.is_executing:\n        raise Refused('the one type')\n"
        "    raise KeyError(x)\n"
        "    logger.exception('also hand-made')\n"
        "    x = state.is_executing  # why:\n")  # the bare tag gives no reason
    (tmp_path / "deploy.py").write_text("raise SystemExit(2)\nraise SystemExit('a message')\n")
    trees = sources(tmp_path)
    assert own_logging(trees) == ["operations/step.py:10", "operations/step.py:11", "operations/step.py:18"]
    assert other_stops(trees) == ["deploy.py:2 SystemExit", "operations/step.py:13 OperationError",
                                  "operations/step.py:17 KeyError"]
    assert unexplained_executing(trees, tmp_path) == ["operations/step.py:12", "operations/step.py:19"]
