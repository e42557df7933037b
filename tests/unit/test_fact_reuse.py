"""operations/util/fact_reuse.py: an answer is kept exactly as long as nothing in the run can have changed it."""

import gevent
from harness import FakeHost, _State, ran
from pyinfra.context import ctx_state

from operations.facts.network import IpAddresses
from operations.util.fact_reuse import fact_once, fact_until_change


def reads(host):
    return sum(name.endswith("IpAddresses") for name, _ in host.fact_calls)


def test_kept_until_an_operation_changes_a_spark():
    state, h = _State(True), FakeHost({IpAddresses: {"a": 1}}, name="head")
    peer = FakeHost({IpAddresses: {"b": 2}}, name="worker")
    with ctx_state.use(state):
        assert fact_until_change(h, IpAddresses) == {"a": 1}
        fact_until_change(h, IpAddresses)
        assert reads(h) == 1
        ran(state, h, "checks", changed=False)  # an operation that changed nothing keeps it
        fact_until_change(h, IpAddresses)
        assert reads(h) == 1
        ran(state, peer, "apply", complete=False)  # still running: not counted until it ends
        fact_until_change(h, IpAddresses)
        assert reads(h) == 1
        ran(state, peer, "apply")  # a change on either Spark (the head acts on the worker over ssh)
        h._facts["operations.facts.network.IpAddresses"] = {"a": 3}
        assert fact_until_change(h, IpAddresses) == {"a": 3}
        assert reads(h) == 2
        fact_until_change(peer, IpAddresses)  # kept per host
        assert reads(peer) == 1
        ran(state, peer, "logs", failed=True)  # ran its commands, then failed with its errors ignored: counted
        fact_until_change(h, IpAddresses)
        assert reads(h) == 3


def test_read_afresh_when_the_run_moves_from_planning_to_executing():
    state, h = _State(False), FakeHost({IpAddresses: {}})
    with ctx_state.use(state):
        fact_until_change(h, IpAddresses)
        state.is_executing = True  # a prompt may have waited between the plan and the run
        fact_until_change(h, IpAddresses)
    assert reads(h) == 2


def test_fresh_reads_now_and_keeps_that():
    state, h = _State(True), FakeHost({IpAddresses: {"gid": None}})
    with ctx_state.use(state):
        fact_until_change(h, IpAddresses)
        h._facts["operations.facts.network.IpAddresses"] = {"gid": 3}  # the driver added it meanwhile
        assert fact_until_change(h, IpAddresses, _fresh=True) == {"gid": 3}
        assert fact_until_change(h, IpAddresses) == {"gid": 3}
    assert reads(h) == 2


def test_root_and_user_reads_are_kept_apart():
    state, h = _State(True), FakeHost({IpAddresses: {}})
    with ctx_state.use(state):
        fact_until_change(h, IpAddresses)
        fact_until_change(h, IpAddresses, _sudo=False)  # the same as no sudo
        assert reads(h) == 1
        fact_until_change(h, IpAddresses, _sudo=True)
        h.current_op_global_arguments = {"_sudo": True}  # inside an operation run with sudo
        fact_until_change(h, IpAddresses)
    assert reads(h) == 2


def test_each_run_keeps_its_own():
    h = FakeHost({IpAddresses: {}})
    for _ in range(2):
        with ctx_state.use(_State(True)):
            fact_until_change(h, IpAddresses)
    assert reads(h) == 2


def test_fact_once_keeps_only_a_settled_answer():
    h = FakeHost({IpAddresses: {"complete": False}})
    settled = lambda value: value["complete"]  # noqa: E731
    fact_once(h, IpAddresses, settled)
    fact_once(h, IpAddresses, settled)
    assert reads(h) == 2
    h._facts["operations.facts.network.IpAddresses"] = {"complete": True}
    fact_once(h, IpAddresses, settled)
    fact_once(h, IpAddresses, settled)
    assert reads(h) == 3


def test_pyinfras_host_proxy_keeps_each_host_apart():
    # operations pass pyinfra's `host`: one proxy object whatever host the greenlet runs for
    from pyinfra import host as proxy
    from pyinfra.context import ctx_host
    head = FakeHost({IpAddresses: {"head": 1}}, name="head")
    worker = FakeHost({IpAddresses: {"worker": 1}}, name="worker")
    with ctx_state.use(_State(True)):
        for h, want in ((head, {"head": 1}), (worker, {"worker": 1}), (head, {"head": 1})):
            with ctx_host.use(h):
                assert fact_until_change(proxy, IpAddresses) == want
                assert fact_once(proxy, IpAddresses, lambda value: True) == want


class SlowHost(FakeHost):
    """A Spark whose answer takes a while, as a round trip does: other greenlets run meanwhile."""

    def __init__(self, facts, fail: bool = False, **kwargs):
        super().__init__(facts, **kwargs)
        self.fail = fail

    def get_fact(self, cls, *args, **kwargs):
        value = super().get_fact(cls, *args, **kwargs)
        gevent.sleep(0.05)
        if self.fail:
            raise RuntimeError("the Spark did not answer")
        return value


def test_a_read_in_flight_is_waited_for_not_repeated():
    state, h = _State(True), SlowHost({IpAddresses: {"a": 1}}, name="head")
    with ctx_state.use(state):
        both = [gevent.spawn(fact_until_change, h, IpAddresses) for _ in range(2)]
        gevent.joinall(both, raise_error=True)
        assert [g.value for g in both] == [{"a": 1}, {"a": 1}]
        assert reads(h) == 1
        ran(state, h, "apply")  # after a change, a new read
        gevent.joinall([gevent.spawn(fact_until_change, h, IpAddresses) for _ in range(2)], raise_error=True)
        assert reads(h) == 2


def test_a_failed_read_fails_every_waiter_and_is_not_kept():
    state, h = _State(True), SlowHost({IpAddresses: {"a": 1}}, fail=True, name="head")
    with ctx_state.use(state):
        both = [gevent.spawn(fact_until_change, h, IpAddresses) for _ in range(2)]
        gevent.joinall(both)
        assert [type(g.exception) for g in both] == [RuntimeError, RuntimeError] and reads(h) == 1
        h.fail = False
        assert fact_until_change(h, IpAddresses) == {"a": 1} and reads(h) == 2


def test_fact_once_waits_for_a_read_in_flight_too():
    state, h = _State(False), SlowHost({IpAddresses: {"a": 1}}, name="worker")
    with ctx_state.use(state):
        both = [gevent.spawn(fact_once, h, IpAddresses, bool) for _ in range(2)]
        gevent.joinall(both, raise_error=True)
    assert [g.value for g in both] == [{"a": 1}, {"a": 1}] and reads(h) == 1
