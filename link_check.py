# Measure the link now: pyinfra inventory.py link_check.py -y [--data link_check_stop=true]
# Each rail alone, then both together, with perftest's ib_write_bw (server on the worker, client on the head), judged
# against link_min_gbps as deploy.py judges it; the figures are recorded on both Sparks (status.py shows them) and a
# finding ends the run non-zero, naming the most likely cause. A running rank is stopped first only with
# link_check_stop = true (deploy.py starts the pair again); otherwise the run refuses before anything changes.
# See docs/commands.md for its flags and exit statuses, docs/link.md for the figures and findings.

from operations.link_measure import link_check, ranks_idle_for_check
from operations.ranks import ranks_stopped
from operations.run_lock import locked, unlocked
from operations.settings.context import current_settings, refuse_part_of_pair
from operations.supervise import supervisor_paused
from operations.util.barrier import both_sparks_reached
from operations.util.checks import RunStopped

refuse_part_of_pair("link_check.py")
s, problems = current_settings()
if problems:
    raise RunStopped("the settings need fixing before anything is changed:\n  - " + "\n  - ".join(problems))

locked(s=s)
ranks_idle_for_check(name="Both ranks stopped, or agreed to be (link_check_stop)", s=s, stop_ok=s.link_check_stop)
both_sparks_reached(name="Ranks checked on both Sparks", step="the ranks' check")
if s.link_check_stop:
    supervisor_paused(s=s, _sudo=True)
    ranks_stopped(s=s)
    both_sparks_reached(name="Ranks stopped on both Sparks", step="the ranks' stop")
link_check(s=s)
unlocked(s=s)
