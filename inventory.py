# The two Sparks, from the site file (sparks.yaml, or the file SPARKFOLD_SITE names).
# Groups: head (rank 0) and worker (rank 1). Settings come from group_data/ and the site file's `data:`.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from operations.settings.site import SiteError, host_entries, read_site, site_path  # noqa: E402

try:
    _entries = host_entries(read_site(site_path(Path(__file__).resolve().parent)))
except SiteError as _exc:
    sys.stderr.write(f"sparkfold: {_exc}\n")
    raise SystemExit(2) from None

head = [_entries["head"]]
worker = [_entries["worker"]]
