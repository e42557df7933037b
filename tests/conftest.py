import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "unit"))


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist (pyproject.toml's addopts) with the end-to-end tests as one unit of work: one worker runs them
    all, in the order tests/e2e/conftest.py gives them (there is one simulated pair, and test_deploy.py starts from
    fresh Sparks), while the others take the unit tests one by one. (xdist's own loadgroup cannot do it with this
    pytest: its group suffix no longer reaches the node id.)"""
    from xdist.scheduler import LoadScopeScheduling

    class OnePairScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/e2e" if nodeid.startswith("tests/e2e/") else nodeid

    return OnePairScheduling(config, log)
