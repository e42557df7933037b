# Restart both ranks in order (rank 1, then rank 0) even when nothing changed: pyinfra inventory.py restart.py
# It is deploy.py with the `restart` setting on: everything is converged and checked first (a bad flag leaves the
# running pair alone), then the pair is recreated, then the health wait and smoke test run.
# See docs/commands.md for its flags and exit statuses.
import os

from pyinfra import local

from operations.settings.context import refuse_part_of_pair

refuse_part_of_pair("restart.py")  # before deploy.py's own check, so the line names the script that was run
os.environ["SPARKFOLD_RESTART"] = "1"
local.include("deploy.py")
