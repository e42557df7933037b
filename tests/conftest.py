import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from tests.sim.pairs import PAIRS, e2e_scope, pair_of_worker  # noqa: E402 (found through the path set just above)

# before tests.sim.sim is imported: each xdist worker's sim module names its own pair (tests/sim/pairs.py)
_pair = pair_of_worker(os.environ.get("PYTEST_XDIST_WORKER", ""))
if _pair is not None and "SPARKSIM_PAIR" not in os.environ:
    os.environ["SPARKSIM_PAIR"] = _pair
# the worker past the pairs' runs the unit tests: it yields the CPU to the pairs' deploys (the critical path on two
# cores) and fills the time they wait
if _pair is not None and int(_pair) >= PAIRS:
    os.nice(10)


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist (pyproject.toml's addopts: one worker per simulated pair and one more) with each pair's
    end-to-end files as one unit of work (tests/sim/pairs.py): a worker runs them all, in the order
    tests/e2e/conftest.py gives them, on its own pair; the last worker takes the unit tests one by one meanwhile.
    Those units are the largest, so xdist hands them out first, one to each of the first workers. (xdist's own
    loadgroup cannot do it with this pytest: its group suffix no longer reaches the node id.)"""
    from xdist.scheduler import LoadScopeScheduling

    class PairScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return e2e_scope(nodeid) or nodeid

        def schedule(self) -> None:
            # the first units go to the workers in the order they registered: put gw0, gw1, ... first, so the pairs
            # the e2e units run on are pairs 0 and 1 (the ones .ci/run brought up), whichever worker started first
            self.assigned_work = dict(sorted(self.assigned_work.items(),
                                             key=lambda item: int(pair_of_worker(item[0].gateway.id) or 0)))
            super().schedule()

    return PairScheduling(config, log)


# --- where a parallel run's time went: per worker, its busy seconds and when its last test ended (CI's summary) --

_started = time.monotonic()
_workers: dict[str, dict] = {}


def pytest_runtest_logreport(report) -> None:
    node = getattr(report, "node", None)  # xdist's worker on the controller; absent in a run without xdist
    if node is None:
        return
    seen = _workers.setdefault(node.gateway.id, {"busy": 0.0, "end": 0.0, "tests": set(), "scopes": set()})
    seen["busy"] += report.duration
    seen["end"] = time.monotonic() - _started
    seen["tests"].add(report.nodeid)
    seen["scopes"].add(e2e_scope(report.nodeid) or "unit tests")


def pytest_terminal_summary(terminalreporter) -> None:
    if not _workers:
        return
    terminalreporter.section("time per worker")
    for worker, seen in sorted(_workers.items()):
        terminalreporter.write_line(
            f"{worker}: {len(seen['tests'])} tests, busy {seen['busy']:.0f} s, last ended at {seen['end']:.0f} s: "
            + ", ".join(sorted(seen["scopes"])))
