"""Which simulated pair runs which end-to-end file when the tests run on several xdist workers (tests/conftest.py).

Three pairs run at once, each file on one of them, in the order tests/e2e/conftest.py gives: the files of
GROUPS[0] (the smoke test and test_deploy.py's fresh Sparks first) on one, GROUPS[1] on the next, every other file
on the last. The groups are
balanced by the files' durations in CI (`--durations` in .ci/run; its "time per worker" section says when each
pair's last test ended). Each worker's sim module names its own pair
(SPARKSIM_PAIR: worker gw0 pair 0, gw1 pair 1, ...; tests/sim/sim.py). With two pairs the two
cores were idle a third of the time (a deploy waits on its Sparks, timers, the shaped link); a third pair fills
them (CI 1028 s -> 925 s, every test about 15% slower). Once a simulated Spark polled nothing while idle
(tests/sim/README.md), a third pair paid; before, six idle Sparks took most of a core and it did not.
"""

from __future__ import annotations

GROUPS = (
    ("test_sim_smoke.py", "test_deploy.py", "test_switches.py", "test_status_tools.py", "test_try_it.py"),
    ("test_upgrade.py", "test_cut_ssh_reverts.py", "test_reboot.py", "test_data_at_rest.py", "test_long_steps.py"),
)
PAIRS = len(GROUPS) + 1  # the last takes every file no group names


def e2e_scope(nodeid: str) -> str | None:
    """The unit of work of an end-to-end test (one pair runs all of it, in order), or None for a unit test."""
    if not nodeid.startswith("tests/e2e/"):
        return None
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    group = next((n for n, files in enumerate(GROUPS) if name in files), len(GROUPS))
    return f"tests/e2e (pair group {group})"


def pair_of_worker(worker: str) -> str | None:
    """SPARKSIM_PAIR for an xdist worker id (gw0 -> "0"), or None outside xdist."""
    return worker[2:] if worker.startswith("gw") and worker[2:].isdigit() else None
