# pyinfra run configuration: the two ranks are a pair, so a failure on either Spark stops the run.
import os
import sys

from pyinfra import config

# The read-only tools show what they can when one Spark does not answer (its rows say so), and stop.py stops the
# rank it can reach (a rank left running holds ~98 GiB; the run names the Spark it missed and fails); whatever else
# changes a Spark stops on the first failure of either.
READ_ONLY_TOOLS, CHANGING = {"status.py", "logs.py"}, {"deploy.py", "restart.py", "rollback.py", "link_check.py"}
GO_ON_WITH_ONE = READ_ONLY_TOOLS | {"stop.py"}
_files = {os.path.basename(a) for a in sys.argv[1:]}
config.FAIL_PERCENT = 50 if _files & GO_ON_WITH_ONE and not _files & CHANGING else 0

# When neither Spark answers pyinfra ends before any deploy file runs: status.py still shows its table (the API is
# asked from here) and stop.py says that nothing was stopped (operations/tools/unreached.py).
if config.FAIL_PERCENT and _files & {"status.py", "stop.py"}:
    from operations.tools.unreached import after_no_spark_answers, status_anyway, stop_refused

    _status = next((a for a in sys.argv[1:] if os.path.basename(a) == "status.py"), None)
    after_no_spark_answers(status_anyway(_status) if _status else stop_refused)
config.REQUIRE_PYINFRA_VERSION = "~=3.10"
config.CONNECT_TIMEOUT = 20
