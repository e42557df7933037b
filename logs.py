# Each rank's newest log lines: pyinfra inventory.py logs.py  (log_lines lines, 100 unless --data log_lines=500)
# Live `docker logs` while a rank's container exists, else its newest saved log. Read-only: no operation exists.
# The head's run prints both ranks, rank 0 first, reading the worker through the worker's connection.
from operations.context import current_settings, pair_hosts
from operations.rank_logs import rank_log_text

# reading logs needs only the container name and paths: it goes ahead even when other settings need fixing
s, _problems = current_settings()

if s.is_head:
    head, worker = pair_hosts()
    print(rank_log_text(head, s) + "\n" + rank_log_text(worker, s.the_peer), flush=True)
