"""The README's test command collects tests/unit and tests/e2e in one session: pytest's default import mode gives
each test file a module named after its basename, so two files with one basename stop the whole collection."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
SPECIAL = ("__init__.py", "conftest.py")  # pytest imports these by package path, not by basename


def test_every_test_file_has_its_own_basename():
    files = [p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts and p.parent.name != "bench"]
    names = Counter(p.name for p in files if p.name not in SPECIAL)
    assert not [n for n, k in names.items() if k > 1], "rename one of each pair (tests/ is collected as one session)"
