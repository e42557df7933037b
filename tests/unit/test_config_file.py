"""config.py, as pyinfra's CLI runs it before connecting: a Spark that fails stops whatever can change a Spark,
while the read-only tools go on with the one that answers."""

from __future__ import annotations

import runpy
import sys

import pytest
from pyinfra.api.config import Config
from pyinfra.context import ctx_config
from settings_factory import ROOT


def fail_percent(argv: list[str]) -> int | None:
    config = Config()
    with ctx_config.use(config):
        old = sys.argv
        sys.argv = argv
        try:
            runpy.run_path(str(ROOT / "config.py"))
        finally:
            sys.argv = old
    return config.FAIL_PERCENT


@pytest.mark.parametrize("script", ["deploy.py", "restart.py", "rollback.py", "link_check.py",
                                    "/home/me/sparkfold/deploy.py"])
def test_a_run_that_changes_a_spark_stops_on_either_failing(script):
    assert fail_percent(["pyinfra", "inventory.py", script, "-y"]) == 0


@pytest.mark.parametrize("script", ["stop.py", "/srv/sparkfold/stop.py"])
def test_stop_goes_on_with_the_spark_that_answers(script):
    # a rank left running on the Spark that answers would hold its ~98 GiB; the run still fails naming the other
    assert fail_percent(["pyinfra", "inventory.py", script, "-y"]) == 50
    assert fail_percent(["pyinfra", "inventory.py", script, "deploy.py", "-y"]) == 0


@pytest.mark.parametrize("script", ["status.py", "logs.py", "./status.py", "/srv/sparkfold/logs.py"])
def test_the_read_only_tools_go_on_without_one_spark(script):
    # 50: one Spark of two may fail to connect; pyinfra still stops when neither answers ("No hosts remaining")
    assert fail_percent(["pyinfra", "inventory.py", script, "-y"]) == 50


def test_a_data_value_that_only_looks_like_a_tool_does_not_count():
    assert fail_percent(["pyinfra", "inventory.py", "deploy.py", "--data", "note=status.py"]) == 0


def test_a_tool_run_together_with_the_deploy_stops_as_the_deploy_does():
    assert fail_percent(["pyinfra", "inventory.py", "status.py", "deploy.py", "-y"]) == 0
