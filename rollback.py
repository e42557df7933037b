# Switch the pair back to the previous good generation: pyinfra inventory.py rollback.py
# The newest generation that served before the one serving now starts again from its record (no build, no
# download), with the health wait, the smoke test and the LIVE line; refused, naming what is missing, when its image
# or weight folders are gone. The next deploy.py switches to what the settings ask for again (docs/upgrade.md).
# See docs/commands.md for its flags and exit statuses.
from operations.ranks import rolled_back
from operations.run_lock import locked, unlocked
from operations.settings.context import current_settings, refuse_part_of_pair

refuse_part_of_pair("rollback.py")
s, _problems = current_settings()  # the records hold the specs: settings problems do not stop a rollback

locked(s=s)
rolled_back(s=s)
unlocked(s=s)
