"""What needs nothing from a Spark is checked before pyinfra connects: with one Spark down, `--dry` still names a typo
in the site file, and nothing is asked of the Spark that answers.

Changes nothing on the simulated pair.
"""

from __future__ import annotations

import pytest
import yaml
from test_status_tools import site_without

LISTS = "(`python -m operations.settings` lists them)"


@pytest.mark.parametrize("gone", ["worker", "head"])
def test_dry_with_one_spark_down_names_a_typo_in_the_site_file(run_pyinfra, sim_pair, tmp_path, gone):
    site = site_without(sim_pair, tmp_path, gone)
    text = yaml.safe_load(site.read_text())
    text["data"] = {**(text.get("data") or {}), "contxt": 524288}
    site.write_text(yaml.safe_dump(text))
    run = run_pyinfra("inventory.py", "deploy.py", "--dry", env={"SPARKFOLD_SITE": str(site)})
    out = run.stdout + run.stderr
    assert run.returncode == 2, out[-4000:]
    assert ("sparkfold: the settings need fixing before anything is changed (checked before connecting to the "
            f"Sparks):\n  - contxt in the site file's data is not a sparkfold setting: did you mean context? {LISTS}"
            in run.stderr), out[-4000:]
    assert "Connecting to hosts" not in out and "Traceback" not in out


def test_dry_with_one_spark_down_names_every_site_file_problem_at_once(run_pyinfra, sim_pair, tmp_path):
    site = site_without(sim_pair, tmp_path, "worker")
    text = yaml.safe_load(site.read_text())
    text["head"]["ssh_usr"] = text["head"].get("ssh_user", "nvidia")
    text["worker"]["link"][0]["netdev"] = "eth 0"
    site.write_text(yaml.safe_dump(text))
    run = run_pyinfra("inventory.py", "deploy.py", "--dry", env={"SPARKFOLD_SITE": str(site)})
    out = run.stdout + run.stderr
    assert run.returncode == 2, out[-4000:]
    assert f"sparkfold: the site file {site} needs fixing (sparks.example.yaml shows the shape):" in run.stderr
    assert "  - head: unknown key(s) ['ssh_usr']" in run.stderr, out[-4000:]
    assert "  - worker.link[0].netdev = 'eth 0' must be an interface name" in run.stderr, out[-4000:]
    assert "Connecting to hosts" not in out
