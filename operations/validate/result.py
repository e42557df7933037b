"""A check's outcome, the exit code of several, and a check made of parts (each judged, then the worst kept)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from operations.validate.client import CouldNotRun, HttpError, ServerUnusable
from operations.validate.sse import StreamError

PASS, FAIL, NOT_RUN, UNVERIFIED = 0, 1, 2, 3
LABELS = {PASS: "PASS", FAIL: "FAIL", NOT_RUN: "NOT RUN", UNVERIFIED: "UNCHECKED"}
# A definite failure outranks "could not run", which outranks "could not verify".
_RANK = {FAIL: 3, NOT_RUN: 2, UNVERIFIED: 1, PASS: 0}


@dataclass
class Result:
    name: str
    status: int
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{LABELS[self.status]} {self.name}: {self.detail}"


def exit_code(results: list[Result]) -> int:
    if not results:
        return NOT_RUN
    return max((r.status for r in results), key=_RANK.__getitem__)


def attempt(name: str, judge: Callable[..., Result], *args: Any) -> Result:
    """Run a check (or a part of one): a missing route or a reply slower than --timeout is NOT RUN, an error answer
    or a broken stream is FAIL, so no exception ever reads as a pass. A server that cannot be asked at all (no answer,
    our key refused) goes up to the command, which says so once."""
    try:
        return judge(*args)
    except ServerUnusable:
        raise
    except CouldNotRun as e:
        return Result(name, NOT_RUN, str(e))
    except (HttpError, StreamError) as e:
        return Result(name, FAIL, str(e))


def combine(name: str, parts: list[Result]) -> Result:
    """One result for a check of several parts: the worst status, and every part's verdict in order."""
    detail = "; ".join(f"{p.name} {'ok' if p.status == PASS else LABELS[p.status]}: {p.detail}" for p in parts)
    return Result(name, exit_code(parts), detail, {p.name: p.status for p in parts})
