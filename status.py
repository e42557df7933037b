# Both Sparks in one table: pyinfra inventory.py status.py  (-y skips pyinfra's empty "Press enter" step)
# Read-only: it reads facts and asks rank 0's API, and no operation exists. It exits 1 when the pair is not serving.
# The head's run prints the table, reading the worker through the worker's connection (operations/tools/status.py); the
# worker's run prints it when the head does not answer over ssh (config.py lets these tools go on without one).
import sys

from pyinfra.api.exceptions import DeployError

from operations.settings.context import pair_hosts, pair_settings, reports_for_pair
from operations.tools.status import gather, render_table

# the table shows what it can even when settings need fixing; it lists the problems first
hs, ws, problems = pair_settings()

if reports_for_pair():
    head, worker = pair_hosts()
    report = gather(head, worker, hs, ws, sys.argv if hs.status_plan else None)
    lines = [f"sparkfold status: head {head.name}, worker {worker.name}"]
    lines += [f"  settings problem (deploy.py stops on it): {p}" for p in problems]
    lines += [render_table(report.rows), "", f"serving: {hs.served_name} at {hs.api_base_url}/v1" if report.verdict
              is None else f"NOT serving: {report.verdict}"]
    print("\n".join(lines), flush=True)
    if report.verdict is not None:
        raise DeployError(f"the pair is not serving: {report.verdict}")
