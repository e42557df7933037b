"""Optional supervision (s.supervise): on the head, sparkfold-supervise.service runs operations/remote/supervise.py,
which restarts the pair in order (rank 1, then rank 0, each right after its Spark's GPU clock lock unit ran, and only
once both Sparks have s.min_avail_gib of MemAvailable again) with a doubling backoff and gives up after
s.supervise_retries (then it stops both ranks and exits 1; systemd restarts it only when killed). Nothing is
installed unless s.supervise is True; turned off, an earlier unit is stopped and disabled (never deleted). The
worker gets nothing."""

from __future__ import annotations

from pyinfra.api import deploy

from operations.layout import GPU_CLOCK_UNIT, SUPERVISOR_UNIT, script_path
from operations.owned.units import script_installed, script_sha256, unit_installed, unit_off
from operations.util.templates import render

SCRIPT = "supervise.py"


def render_unit(container: str, worker_ssh: str, user: str, retries: int, backoff_s: int, stop_timeout: int,
                min_avail_gib: float) -> str:
    return render("sparkfold-supervise.service.j2", container=container, worker_ssh=worker_ssh, user=user,
                  retries=int(retries), backoff_s=int(backoff_s), stop_timeout=int(stop_timeout),
                  min_avail_gib=f"{float(min_avail_gib):g}", script=script_path(SCRIPT),
                  script_sha256=script_sha256(SCRIPT), relock_unit=GPU_CLOCK_UNIT)


@deploy("Supervision")
def supervision(s) -> None:
    """The head's supervisor installed and running, or (supervise off) stopped and disabled; needs root."""
    if not s.is_head:
        return
    if not s.supervise:
        unit_off(SUPERVISOR_UNIT)
        return
    script_installed(SCRIPT)
    unit_installed(SUPERVISOR_UNIT, render_unit(s.container_name, s.worker_link_ssh, s.ssh_user, s.supervise_retries,
                                                s.supervise_backoff_s, s.stop_timeout, s.min_avail_gib),
                   restart_on_change=True)


@deploy("Supervisor paused")
def supervisor_paused(s) -> None:
    """stop.py: the head's supervisor stopped and disabled (if present) so it does not start the pair again;
    deploy.py's supervision starts it again. Needs root."""
    if s.is_head:
        unit_off(SUPERVISOR_UNIT)
