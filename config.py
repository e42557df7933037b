# pyinfra run configuration: the two ranks are a pair, so a failure on either Spark stops the run.
import os
import sys

from pyinfra import config

# The read-only tools show what they can when one Spark does not answer (its rows say so); whatever changes a
# Spark stops on the first failure of either.
READ_ONLY_TOOLS, CHANGING = {"status.py", "logs.py"}, {"deploy.py", "stop.py", "restart.py", "rollback.py"}
_files = {os.path.basename(a) for a in sys.argv[1:]}
config.FAIL_PERCENT = 50 if _files & READ_ONLY_TOOLS and not _files & CHANGING else 0
config.REQUIRE_PYINFRA_VERSION = "~=3.10"
config.CONNECT_TIMEOUT = 20
