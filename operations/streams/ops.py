"""The streams' operations: one starts a stream, one waits for a run's streams (see the package's docstring)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta

from operations.facts.streams import StreamDict, StreamStates
from operations.remote import heredoc_command
from operations.remote.progress_command import LiveCommand
from operations.remote.stream_runner import adopt_command, inputs_digest, launch_command, stop_command
from operations.remote.stream_unit import stream_action
from operations.settings import Settings
from operations.util.checks import RunStopped, op_changed
from operations.util.peer_ssh import RUN_TOKEN

# the stream operations declared so far, per run (pyinfra's State) and Spark: what streams_finished waits for
_DECLARED: WeakKeyDictionary[Any, dict[str, list[OperationMeta]]] = WeakKeyDictionary()


@dataclass(frozen=True)
class Stream:
    """One stream on one Spark. name: its folder under root (Layout.streams), unique on the Spark; lane: what kind
    of work (download, build, weights, hash, to worker); label: what its summary line calls it; after: the streams
    it waits for when they run in the same run; commands: its work as a fresh start runs it (used when a stream it
    reads starts in this run)."""

    name: str
    lane: str
    label: str
    root: str
    after: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()


def stream_plan(state: StreamDict | None, inputs: str, run: str) -> tuple[str, str | None]:
    """stream_action (operations/remote/stream_unit.py) for the stream's state as its fact reads it."""
    if state is None:
        return stream_action("none", inputs, "", False)
    return stream_action(state["status"], inputs, state["unit_inputs"], state["run"] == run)


def _text(command: Any) -> str:
    if isinstance(command, str):
        return command
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    raise RunStopped(f"a stream runs shell commands only, not {type(command).__name__}: upload files before "
                    "the stream starts")


@operation()
def stream_started(stream: Stream, upstream: tuple = (), work: tuple = ()):
    """`stream` running in the background on this Spark when its work is to be done.

    work: (operation, arguments) pairs, the operations that converge what the stream makes: it runs what they
    yield now (their facts decide), and nothing when they change nothing. upstream: operations starting streams
    this one reads; when one of them starts in this run, what is to be done cannot be read yet, and the stream runs
    stream.commands, the work as a fresh start does it."""
    if any(op_changed(op) for op in upstream):
        commands = list(stream.commands)
    else:
        commands = [_text(c) for op, arguments in work for c in op._inner(**arguments)]
    if not commands:
        return  # converged: the work's operations said so themselves (host.noop)
    inputs = inputs_digest(commands, stream.after)
    state = host.get_fact(StreamStates, root=stream.root).get(stream.name)
    action, free = stream_plan(state, inputs, RUN_TOKEN)
    if action == "ours":
        host.noop(f"{stream.label}: started already by this run")
        return
    # shown at any verbosity: which work this run started and which it found going and follows
    if action == "adopt":
        yield LiveCommand(adopt_command(stream.root, stream.name, stream.label))
        return
    yield LiveCommand(launch_command(stream.root, stream.name, stream.lane, stream.label, stream.after, commands,
                                       free))


def background(stream: Stream, name: str, upstream: Iterable[OperationMeta] = (),
               work: Iterable[tuple[Any, dict]] = ()) -> OperationMeta:
    """Declare `stream_started` (named `name`) and remember it for streams_finished; its OperationMeta, for the
    streams that read this one (their `upstream`)."""
    started = stream_started(name=name, stream=stream, upstream=tuple(upstream), work=tuple(work))
    _DECLARED.setdefault(host.state, {}).setdefault(host.name, []).append(started)
    return started


def declared() -> tuple[OperationMeta, ...]:
    """This Spark's stream operations declared so far in this run."""
    return tuple(_DECLARED.get(host.state, {}).get(host.name, []))


@operation()
def streams_awaited(root: str, started: tuple = ()):
    """Every stream this run started on this Spark (`started`: their operations) finished: one progress line each
    as its work prints it (every progress_every_s), a line at once when one fails, and at the end each stream's time
    and the critical path. Fails this Spark when a stream failed or was stopped (what is whole stays). The streams do
    not depend on it: a run cut while it waits leaves them going, and the next run adopts them."""
    if not any(op_changed(op) for op in started):
        host.noop("no background work in this run")
        return
    yield LiveCommand(heredoc_command(f"python3 - {shlex.quote(root)} {shlex.quote(RUN_TOKEN)}", "stream_wait"))


@operation()
def streams_ended(root: str):
    """No background stream runs on this Spark (stop.py): each running unit stopped, what is whole kept (the next
    deploy resumes the rest); finished ones keep their result."""
    running = sorted(name for name, state in host.get_fact(StreamStates, root=root).items()
                     if state["status"] in ("running", "stopping"))
    if not running:
        host.noop("no background stream runs")
        return
    for name in running:
        yield stop_command(name)


@deploy("Background work stopped")
def streams_stopped(s: Settings) -> None:
    streams_ended(name="background streams stopped", root=s.layout.streams)


@deploy("Background work")
def streams_finished(s: Settings) -> None:
    """Both Sparks at one call site: nothing after it starts before every stream of the run on both has ended."""
    streams_awaited(name="every background stream of this run finished", root=s.layout.streams, started=declared())
