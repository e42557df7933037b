# Both Sparks in one table: pyinfra inventory.py status.py  (-y skips pyinfra's empty "Press enter" step)
# Read-only: it reads facts and asks rank 0's API, and no operation exists. It exits 1 when the pair is not serving.
# The head's run prints the table, reading the worker through the worker's connection (operations/status.py).
import sys

from pyinfra.api.exceptions import DeployError

from operations.context import current_settings, pair_hosts
from operations.status import gather, render_table

# the table shows what it can even when settings need fixing; it lists the problems first
s, problems = current_settings()

if s.is_head:
    head, worker = pair_hosts()
    report = gather(head, worker, s, s.the_peer, sys.argv if s.status_plan else None)
    lines = [f"sparkfold status: head {head.name}, worker {worker.name}"]
    lines += [f"  settings problem (deploy.py stops on it): {p}" for p in problems]
    lines += [render_table(report.rows), "", f"serving: {s.served_name} at {s.api_base_url}/v1" if report.verdict
              is None else f"NOT serving: {report.verdict}"]
    print("\n".join(lines), flush=True)
    if report.verdict is not None:
        raise DeployError(f"the pair is not serving: {report.verdict}")
