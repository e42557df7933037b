"""Optional supervision (s.supervise): on the head, sparkfold-supervise.service runs operations/remote/supervise.py,
which restarts the pair in order (rank 1, then rank 0) with a doubling backoff and gives up after
s.supervise_retries (then it stops both ranks and exits 1; the unit has Restart=no). Nothing is installed unless
s.supervise is True; turned off, an earlier unit is stopped and disabled (never deleted). The worker gets nothing."""

from __future__ import annotations

from pyinfra.operations import files

from operations.memguard import LOCAL_REMOTE, REMOTE_DIR, render_template, script_sha256, unit_off
from operations.systemd_unit import unit_installed

UNIT_NAME = "sparkfold-supervise.service"
SCRIPT = "supervise.py"


def render_unit(container: str, worker_ssh: str, user: str, retries: int, backoff_s: int, stop_timeout: int) -> str:
    return render_template("sparkfold-supervise.service.j2", container=container, worker_ssh=worker_ssh, user=user,
                           retries=int(retries), backoff_s=int(backoff_s), stop_timeout=int(stop_timeout),
                           script=f"{REMOTE_DIR}/{SCRIPT}", script_sha256=script_sha256(SCRIPT))


def deploy_supervise(s) -> None:
    if not s.is_head:
        return
    if not s.supervise:
        unit_off(name=f"supervision off: {UNIT_NAME} stopped and disabled if present", unit_name=UNIT_NAME,
                 _sudo=True)
        return
    files.put(name=f"supervisor script {REMOTE_DIR}/{SCRIPT}", src=str(LOCAL_REMOTE / SCRIPT),
              dest=f"{REMOTE_DIR}/{SCRIPT}", mode="755", create_remote_dir=True, _sudo=True)
    unit_installed(
        name=f"supervision unit {UNIT_NAME} ({s.supervise_retries} restarts, backoff {s.supervise_backoff_s} s)",
        unit_name=UNIT_NAME,
        content=render_unit(s.container_name, s.worker_link_ssh, s.ssh_user, s.supervise_retries,
                            s.supervise_backoff_s, s.stop_timeout),
        enabled=True,
        running=True,
        restart_on_change=True,
        _sudo=True,
    )
