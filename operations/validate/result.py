"""A check's outcome and the exit code of several."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
