"""Run a sparkfold operation or fact outside pyinfra's CLI, with scripted facts.

run_op(op, facts, executing=False, **kwargs) -> (commands as strings, host); host.yielded keeps the commands as
  yielded (their connector arguments, an upload's source), as tests/unit/test_operation_scenarios.py renders them.
  facts: {FactClass or "module.Class": value} for facts called without arguments, or
         {FactClass: {"k=v, k2=v2": value}} keyed like pyinfra-testing (sorted kwargs) for facts with arguments.
first_planned(op, facts, diff=False, **kwargs) -> (the first command or None, host): what --dry (--diff) runs of an
  operation: pyinfra's change check stops at its first command, so only what is printed before it is seen.
refused(caplog, op, facts, **kwargs) -> (the failing command a run yields, the warnings --dry logs instead)
ran(state, host, op_hash, ...): an operation of the run ended on host (executed or not), as fact_reuse counts it.
parse_fact(FactClass, output_lines, **kwargs) -> what process() returns (default() for empty output).
run_fact(FactClass, **kwargs) -> the fact run in a local shell as pyinfra runs it (requires_command guard included).
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace
from typing import Any

from pyinfra import logger
from pyinfra.api.facts import _MISSING_COMMAND_MARKER
from pyinfra.context import ctx_host, ctx_state


class _State:
    def __init__(self, executing: bool, diff: bool = False):
        self.is_executing = executing
        self.config = type("C", (), {"DIFF": diff})()  # --diff
        self.ops: dict = {}  # no operation has run: run_memo keeps what it read for the operation under test
        self.cwd = ""  # files.put joins it to a relative src


def _kwargs_key(kwargs: dict) -> str:
    return ", ".join(f"{k}={kwargs[k]}" for k in sorted(kwargs))


class FakeHost:
    def __init__(self, facts: dict, data: dict | None = None, name: str = "spark"):
        self._facts = {}
        for key, value in facts.items():
            name_ = key if isinstance(key, str) else f"{key.__module__}.{key.__name__}"
            self._facts[name_] = value
        self.name = name
        self.data = data or {}
        self.connected = True  # pyinfra's Host: False for a Spark that did not answer over ssh
        self.noops: list[str] = []
        self.fact_calls: list[tuple[str, dict]] = []
        self.current_op_global_arguments = {}
        self.yielded: list = []  # run_op: the operation's commands as yielded

    def get_fact(self, cls, *args, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith("_")}
        name = f"{cls.__module__}.{cls.__name__}"
        self.fact_calls.append((name, kwargs))
        if name not in self._facts:
            raise KeyError(f"missing test fact {name} {kwargs}")
        value = self._facts[name]
        if kwargs and isinstance(value, dict) and "__args__" in value:
            table = value["__args__"]
            key = _kwargs_key(kwargs)
            if key not in table:
                raise KeyError(f"missing test fact {name} for {key}")
            return table[key]
        return value

    @property
    def state(self):
        """The run this host is in: the state run_op set, else one planning run of its own (pyinfra's Host keeps
        its own)."""
        if ctx_state.get() is not None:
            return ctx_state.get()
        if "_own_state" not in self.__dict__:
            self._own_state = _State(False)
        return self._own_state

    def noop(self, description: str) -> None:
        self.noops.append(description)

    def log(self, message: str, log_func=logger.info) -> None:
        log_func(f"[{self.name}] {message}")  # as pyinfra's Host.log, which files.put's --diff uses

    def get_temp_filename(self, hash_key: str | None = None, hash_filename: bool = True, *, temp_directory=None):
        return f"{temp_directory or '/tmp'}/pyinfra-{hash_key or 'temp'}"  # files.put uploads through it


def run_op(op, facts: dict, executing: bool = False, data: dict | None = None, **kwargs) -> tuple[list[str], FakeHost]:
    state = _State(executing)
    host = FakeHost(facts, data)
    with ctx_state.use(state), ctx_host.use(host):
        host.yielded = list(op._inner(**kwargs))
    return [_render(c) for c in host.yielded], host


def first_planned(op, facts: dict, diff: bool = False, **kwargs) -> tuple[str | None, FakeHost]:
    """The operation planned as pyinfra's --dry plans it (api/operation.py: the generator is left at its first
    command), with --diff when `diff`. Returns (that command or None, host)."""
    host = FakeHost(facts)
    with ctx_state.use(_State(False, diff=diff)), ctx_host.use(host):
        first = next(iter(op._inner(**kwargs)), None)
    return (None if first is None else _render(first)), host


def refused(caplog, op, facts: dict, **kwargs) -> tuple[str, str]:
    """An operation refused the check_failed way (operations/util/checks.py), in both phases: a run yields exactly
    one command, which fails; --dry plans nothing and logs the "will fail" warning. Returns (command, warnings)."""
    commands, _ = run_op(op, facts, executing=True, **kwargs)
    assert len(commands) == 1 and commands[0].endswith("exit 1"), commands
    caplog.clear()
    with caplog.at_level("WARNING", logger="pyinfra"):
        planned, _ = run_op(op, facts, executing=False, **kwargs)
    assert planned == [], planned
    warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert ": will fail: " in warnings, warnings
    return commands[0], warnings


def _render(command: Any) -> str:
    get = getattr(command, "get_raw_value", None)
    if get is not None:
        return get()
    return str(command)


def with_args(table: dict) -> dict:
    """Fact value that depends on the fact's arguments: {"k=v": value}."""
    return {"__args__": table}


def parse_fact(cls, output, **kwargs):
    fact = cls()
    lines = output.splitlines() if isinstance(output, str) else list(output)
    if not lines:
        return fact.default() if hasattr(fact, "default") else None
    return fact.process(lines)


def run_fact(cls, **kwargs):
    """Run a fact's command in a local `sh` the way pyinfra does: behind its requires_command guard, which gives
    default() when the tool is missing. The command must exit 0 (facts never fail the host)."""
    fact = cls()
    command = _render(fact.command(**kwargs) if callable(fact.command) else fact.command)
    tool = fact.requires_command(**kwargs)
    if tool:
        command = f"if command -v {tool} >/dev/null 2>&1; then ( {command} ); else echo '{_MISSING_COMMAND_MARKER}'; fi"
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    return fact.default() if lines == [_MISSING_COMMAND_MARKER] else parse_fact(cls, lines, **kwargs)


def unwrap_progress(text: str) -> tuple[str, str, list[str]]:
    """(label, the command it runs, its options) of an operations.remote.progress_command wrapper rendered to text."""
    import shlex

    head = text[: text.rindex(" <<'SPARKFOLD_PY_EOF'\n")]  # the progress script follows the last marker
    words = shlex.split(head)
    assert words[:2] == ["python3", "-"], words[:2]
    rest = words[3:]
    inner = rest.pop(0) if rest and not rest[0].startswith("--") else ""
    return words[2], inner, rest


class Meta:
    """An OperationMeta as far as fact_reuse reads it."""

    def __init__(self, complete: bool, changed: bool, failed: bool = False):
        self.complete, self.changed, self.failed = complete, changed, failed

    def is_complete(self):
        return self.complete

    @property
    def executed(self):  # commands ran, whether or not the operation then succeeded
        return self.changed

    def did_change(self):
        return self.complete and self.changed and not self.failed


def ran(state, host, op_hash, complete=True, changed=True, failed=False):
    """An operation of the run has ended on `host` (changing it or not)."""
    state.ops.setdefault(host, {})[op_hash] = SimpleNamespace(operation_meta=Meta(complete, changed, failed))
