"""Which simulated pair runs which end-to-end file when the tests run on several xdist workers (tests/conftest.py).

Two pairs run at once, each file on one of them, in the order tests/e2e/conftest.py gives: the files of PAIR_A (the
smoke test and test_deploy.py's fresh Sparks first) on one, every other file on the other. Each worker's sim module
names its own pair (SPARKSIM_PAIR: worker gw0 pair 0, gw1 pair 1, ...; tests/sim/sim.py).
"""

from __future__ import annotations

PAIR_A = ("test_sim_smoke.py", "test_deploy.py", "test_switches.py", "test_upgrade.py", "test_status_tools.py",
          "test_try_it.py")


def e2e_scope(nodeid: str) -> str | None:
    """The unit of work of an end-to-end test (one pair runs all of it, in order), or None for a unit test."""
    if not nodeid.startswith("tests/e2e/"):
        return None
    return "tests/e2e (pair A)" if nodeid.split("::", 1)[0].rsplit("/", 1)[-1] in PAIR_A else "tests/e2e (pair B)"


def pair_of_worker(worker: str) -> str | None:
    """SPARKSIM_PAIR for an xdist worker id (gw0 -> "0"), or None outside xdist."""
    return worker[2:] if worker.startswith("gw") and worker[2:].isdigit() else None
