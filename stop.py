# Stop both ranks: pyinfra inventory.py stop.py
# Each rank's log is saved first (<data_dir>/logs), then its container is removed, which frees its GPU memory.
# The supervisor (if installed) is stopped first so it does not start the pair again; deploy.py starts it again.
# Background work of a deploy still running (its systemd units, sparkfold-<stream>) is stopped too, keeping what is
# whole: the next deploy resumes the rest.
# See docs/commands.md for its flags and exit statuses.
# A Spark that does not answer over ssh is skipped (config.py): the other's rank is stopped all the same, and the
# run then fails naming the Spark it missed and the command that shows why.
from operations.ranks import peer_rank_reached, ranks_stopped
from operations.run_lock import locked, unlocked
from operations.settings.context import current_settings, refuse_part_of_pair
from operations.streams import streams_stopped
from operations.supervise import supervisor_paused

# stopping needs only the container name and paths: it goes ahead even when other settings need fixing
refuse_part_of_pair("stop.py")
s, _problems = current_settings()

locked(s=s)
supervisor_paused(s=s, _sudo=True)
streams_stopped(s=s)
ranks_stopped(s=s)
unlocked(s=s)
peer_rank_reached(s=s)

