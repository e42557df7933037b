# Stop both ranks: pyinfra inventory.py stop.py
# Each rank's log is saved first (<data_dir>/logs), then its container is removed, which frees its GPU memory.
# The supervisor (if installed) is stopped first so it does not start the pair again; deploy.py starts it again.
from operations.context import current_settings
from operations.lifecycle import deploy_stop
from operations.memguard import unit_off
from operations.supervise import UNIT_NAME as SUPERVISOR

# stopping needs only the container name and paths: it goes ahead even when other settings need fixing
s, _problems = current_settings()

if s.is_head:
    unit_off(name=f"Supervisor {SUPERVISOR} stopped (if installed)", unit_name=SUPERVISOR, _sudo=True)
deploy_stop(s)
