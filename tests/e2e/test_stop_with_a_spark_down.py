"""stop.py with one Spark not answering over ssh: the rank on the Spark that answers is stopped all the same (a rank
left running holds its memory), and the run fails naming the Spark it missed and the ssh command that shows why.

Stops rank 0 of the simulated pair; deploys again at the end.
"""

from __future__ import annotations

import yaml
from test_deploy import deploy, pair_ids
from test_status_tools import site_without

from operations.settings.site import ssh_check


def test_stop_with_the_worker_down_stops_rank_0_and_names_the_worker(run_pyinfra, sim_exec, sim_pair, converged_pair,
                                                                     tmp_path):
    assert all(i.endswith("true") for i in pair_ids(sim_exec))
    site = site_without(sim_pair, tmp_path, "worker")  # the worker's ssh port: where nothing listens
    worker = yaml.safe_load(site.read_text())["worker"]
    check = ssh_check({**worker, "ssh_hostname": worker["ssh"]}, "sim-worker")
    assert check.startswith(f"ssh -p {worker['ssh_port']} ")
    try:
        run = run_pyinfra("inventory.py", "stop.py", "-y", env={"SPARKFOLD_SITE": str(site)}, as_json=False)
        out = run.stdout + run.stderr
        assert run.returncode == 1, out[-4000:]
        head_id, worker_id = pair_ids(sim_exec)
        # rank 0 removed; rank 1's container left as it was (the stand-in rank exits once rank 0 has gone)
        assert head_id == "" and worker_id != "", out[-4000:]
        assert "rank0.log.gz" in sim_exec("head", "ls /home/nvidia/.cache/sparkfold/logs").stdout
        assert (f"sim-worker (the worker) did not answer over ssh, so rank 1 there was not stopped and still holds "
                f"its memory: `{check}` shows why") in out, out[-4000:]
    finally:
        deploy(run_pyinfra)  # the pair again, for the tests after this one
    assert all(i.endswith("true") for i in pair_ids(sim_exec))
