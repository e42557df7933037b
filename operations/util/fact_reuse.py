"""Facts read once where their answer cannot have changed since.

pyinfra 3 keeps no fact cache: every get_fact is a round trip, and a converged run asks the same questions in
several operations (the addresses, the link record, an image, a unit). Two rules keep an answer:

- fact_once: an answer that stays true for the rest of the run (a complete download: nothing in the run removes
  it) is kept for this process, i.e. this run.
- fact_until_change: any answer is kept until an operation of this run has run a command on a Spark, or the run moves
  from planning to executing (a prompt may lie between them). Read it before the operation yields its first
  command: the operation's own commands are not seen until it ends.

Under both rules, a read another greenlet has in flight for the same answer is waited for, not repeated.

Worth its rule, measured (tests/bench/deploy_speed.py --runs 3 --skip copy, simulated pair, 2026-12-04): a converged
deploy.py took 3.76 s with every answer read again and 3.26 s with these rules (bare pyinfra 0.62 s: converged_ratio
6.05 against 5.16). Used by the link, image, GPU clock, preflight and docker steps, unit_service, the
downloads' plans (facts/model.hf_plan, with hf_plans_kept reading the complete ones in one round trip) and the rank
path (its composite fact of each Spark, the holders of a held port, the docker step's answers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

from gevent.event import AsyncResult

# per run (pyinfra's State), then per host by name: `host` is pyinfra's context proxy, one object for every host
_KEPT: WeakKeyDictionary[Any, dict[tuple, Any]] = WeakKeyDictionary()
_SINCE: WeakKeyDictionary[Any, dict[tuple, tuple[tuple, Any]]] = WeakKeyDictionary()
_READING: WeakKeyDictionary[Any, dict[tuple, tuple[tuple, AsyncResult]]] = WeakKeyDictionary()  # reads in flight
_SUDO_ARGS = ("_sudo", "_sudo_user", "_su_user", "_use_sudo_login", "_use_su_login")  # they change what is read


def _key(spark: Any, cls: type, kwargs: dict) -> tuple:
    # the fact's own arguments, and who it runs as (the operation's, or given here as _sudo=...)
    context = dict(getattr(spark, "current_op_global_arguments", None) or {}, **kwargs)
    fact_args = sorted((k, v) for k, v in kwargs.items() if not k.startswith("_"))
    return spark.name, cls, repr(fact_args), tuple(context.get(a) or None for a in _SUDO_ARGS)


def fact_once(spark: Any, cls: type, settled: Callable[[Any], bool], **kwargs: Any) -> Any:
    """spark.get_fact(cls, **kwargs); an answer `settled` accepts is reused for the rest of the run."""
    kept = _KEPT.setdefault(spark.state, {})
    key = _key(spark, cls, kwargs)
    if key in kept:
        return kept[key]
    value = _read(spark, cls, kwargs, key, "once")
    if settled(value):
        kept[key] = value
    return value


def kept(spark: Any, cls: type, **kwargs: Any) -> bool:
    """fact_once would answer `cls(**kwargs)` on `spark` without asking."""
    return _key(spark, cls, kwargs) in _KEPT.setdefault(spark.state, {})


def keep(spark: Any, cls: type, value: Any, **kwargs: Any) -> None:
    """Keep `value` as fact_once's answer for `cls(**kwargs)` on `spark`: an answer read together with others (one
    round trip for several questions), which must be one `settled` would accept."""
    _KEPT.setdefault(spark.state, {})[_key(spark, cls, kwargs)] = value


def _generation(spark: Any) -> tuple[int, bool]:
    """(operations of this run that changed a Spark so far, executing): counted from pyinfra's own results, so any
    run mode (lock-step, --serial, --no-wait) is seen the moment an operation ends on a host."""
    state = spark.state
    # executed, not did_change: an operation that ran commands and then failed (ignored errors) changed things too
    changed = sum(1 for ops in state.ops.values() for data in ops.values()
                  if data.operation_meta.is_complete() and data.operation_meta.executed)
    # why: a plan's answer is stale once the run executes (the plan changed nothing), so the phase is part of the key
    return changed, bool(state.is_executing)


def fact_until_change(spark: Any, cls: type, _fresh: bool = False, **kwargs: Any) -> Any:
    """spark.get_fact(cls, **kwargs), reused until an operation of this run changes either Spark (see above).
    _fresh: read it now (an operation that waits for a change outside pyinfra, e.g. the driver's GIDs), and keep
    that."""
    since = _SINCE.setdefault(spark.state, {})
    key, now = _key(spark, cls, kwargs), _generation(spark)
    if not _fresh and key in since and since[key][0] == now:
        return since[key][1]
    value = _read(spark, cls, kwargs, key, now, join=not _fresh)
    since[key] = (now, value)
    return value


def _read(spark: Any, cls: type, kwargs: dict, key: tuple, tag: Any, join: bool = True) -> Any:
    """spark.get_fact(cls, **kwargs), or the answer of the same read (key and tag) another greenlet has in flight
    (join): both Sparks' parts of one operation ask each other's answers at once, and one round trip serves both. A
    failed read fails its waiters too."""
    reading = _READING.setdefault(spark.state, {})
    if join and key in reading and reading[key][0] == tag:
        return reading[key][1].get()
    mine = (tag, AsyncResult())
    reading[key] = mine
    try:
        value = spark.get_fact(cls, **kwargs)
    except BaseException as error:
        mine[1].set_exception(error)
        raise
    finally:
        if reading.get(key) is mine:
            del reading[key]
    mine[1].set(value)
    return value
