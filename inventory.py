# The two Sparks, from the site file (sparks.yaml, or the file SPARKFOLD_SITE names).
# Groups: head (rank 0) and worker (rank 1). Settings come from group_data/ and the site file's `data:`.
# pyinfra loads this file before it connects: everything that needs nothing from a Spark is checked here, so a typo
# is named even when a Spark does not answer (operations/settings/before_connect.py).
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from operations.settings.before_connect import NotReady, checked_entries  # noqa: E402

try:
    _entries = checked_entries(Path(__file__).resolve().parent)
except NotReady as _exc:
    # printed as it is and exit 2: an exception would reach pyinfra's own error line, which names its source file
    sys.stderr.write(f"sparkfold: {_exc}\n")
    raise SystemExit(2) from None

head = [_entries["head"]]
worker = [_entries["worker"]]
