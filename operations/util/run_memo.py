"""Facts read once per run where their answer cannot change for the rest of the run.

pyinfra 3 keeps no fact cache: every get_fact is a round trip. A fact whose answer is settled (a complete download
stays complete: nothing in the run removes it) is kept per host for this process, i.e. this run; an unsettled
answer is read afresh every time, since an operation of this run may change it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

_KEPT: WeakKeyDictionary[Any, dict[tuple, Any]] = WeakKeyDictionary()


def fact_once(h: Any, cls: type, settled: Callable[[Any], bool], **kwargs: Any) -> Any:
    """h.get_fact(cls, **kwargs); an answer `settled` accepts is reused for the rest of the run."""
    kept = _KEPT.setdefault(h, {})
    key = (cls, repr(sorted(kwargs.items())))
    if key in kept:
        return kept[key]
    value = h.get_fact(cls, **kwargs)
    if settled(value):
        kept[key] = value
    return value
