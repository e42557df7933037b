# Each rank's newest log lines: pyinfra inventory.py logs.py  (log_lines lines, 100 unless --data log_lines=500)
# Live `docker logs` while a rank's container exists, else its newest saved log. Read-only: no operation exists.
# The head's run prints both ranks, rank 0 first, reading the worker through the worker's connection; the worker's
# run prints them when the head does not answer over ssh (its block says so).
# See docs/commands.md for its flags and exit statuses.
from operations.settings.context import pair_hosts, pair_settings, reports_for_pair
from operations.tools.rank_logs import rank_log_text

# reading logs needs only the container name and paths: it goes ahead even when other settings need fixing
hs, ws, _problems = pair_settings()

if reports_for_pair():
    head, worker = pair_hosts()
    print(rank_log_text(head, hs) + "\n" + rank_log_text(worker, ws), flush=True)
