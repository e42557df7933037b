# Both Sparks in one table: pyinfra inventory.py status.py  (-y skips pyinfra's empty "Press enter" step)
# Read-only: it reads facts and asks rank 0's API and /metrics, and no operation exists. It exits 1 when the pair is
# not serving. With pyinfra's --json it prints one JSON document instead of the table; with status_watch = N
# (--data status_watch=5) it shows it again every N seconds until Ctrl-C; with status_plan = true it also counts
# what a deploy would change (deploy.py --dry, seconds more).
# The head's run prints the table, reading the worker through the worker's connection
# (operations/tools/status_gather.py; status_render.py the table, status_watch.py the refreshes); the worker's run
# prints it when the head does not answer over ssh (config.py lets these tools go on without one).
# See docs/commands.md for its flags and exit statuses.
import os
import sys

from pyinfra import state

from operations.settings.context import pair_hosts, pair_settings, reports_for_pair
from operations.tools.status_gather import gather
from operations.tools.status_render import render_json, render_text
from operations.tools.status_watch import watch, watch_frame
from operations.util.checks import RunStopped

# pyinfra's spinner would draw over the table and its refreshes: it reads this once it starts, which is after this
# file's first fact read
os.environ["PYINFRA_PROGRESS"] = "off"

# the table shows what it can even when settings need fixing; it lists the problems first
hs, ws, problems = pair_settings()

if reports_for_pair():
    head, worker = pair_hosts()
    as_json = "--json" in sys.argv[1:]  # pyinfra's own flag: stdout then holds status's document and nothing else
    plan_argv = sys.argv if hs.status_plan else None

    def render(report):
        return render_json(report, hs, problems) if as_json else render_text(report, hs, problems, hs.status_watch)

    if hs.status_watch:  # until Ctrl-C, which pyinfra turns into the end of the run
        terminal = sys.stdout.isatty()
        watch(lambda previous: gather(head, worker, hs, ws, plan_argv, previous),
              lambda report: print(watch_frame(render(report), terminal, as_json), flush=True), hs.status_watch)
    else:
        report = gather(head, worker, hs, ws, plan_argv)
        print(render(report), flush=True)
        if report.verdict is not None:
            raise RunStopped(f"the pair is not serving: {report.verdict}")
        if as_json:  # pyinfra would print its own (empty) run document after ours: end here, with its exit status
            raise SystemExit(1 if state.failed_hosts else 0)
