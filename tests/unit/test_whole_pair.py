"""deploy.py, stop.py and restart.py refuse pyinfra's --limit (and --exclude) when it leaves a Spark out: the two
ranks are one server. status.py and logs.py only read, and accept it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_inventory, ctx_state

from operations.settings.context import limit_refusal, refuse_part_of_pair
from operations.util.checks import RunStopped

ROOT = Path(__file__).resolve().parents[2]
PAIR = ["spark-a", "spark-b"]


@pytest.mark.parametrize("script, limited_to, argv, line", [
    ("deploy.py", ["spark-a"], ["pyinfra", "inventory.py", "deploy.py", "--limit", "head"],
     "--limit is not used with deploy.py: the two Sparks are one server; run it without --limit"),
    ("stop.py", ["spark-b"], ["pyinfra", "inventory.py", "stop.py", "--limit=worker"],
     "--limit is not used with stop.py: the two Sparks are one server; run it without --limit"),
    ("restart.py", [], ["pyinfra", "inventory.py", "restart.py", "--limit", "nothing-matches"],
     "--limit is not used with restart.py: the two Sparks are one server; run it without --limit"),
    ("deploy.py", ["spark-a"], ["pyinfra", "inventory.py", "deploy.py", "--exclude", "worker"],
     "--exclude is not used with deploy.py: the two Sparks are one server; run it without --exclude"),
])
def test_a_limit_that_leaves_a_spark_out_is_refused(script, limited_to, argv, line):
    assert limit_refusal(script, PAIR, limited_to, argv) == line


@pytest.mark.parametrize("limited_to", [None, PAIR, [*PAIR, "elsewhere"]])
def test_no_limit_or_one_that_keeps_both_goes_ahead(limited_to):
    assert limit_refusal("deploy.py", PAIR, limited_to, ["pyinfra", "inventory.py", "deploy.py"]) is None


def pair_inventory() -> Inventory:
    return Inventory((PAIR, {}), head=(["spark-a"], {}), worker=(["spark-b"], {}))


def cli_limit(inventory: Inventory, limit: tuple, exclude: tuple) -> list | None:
    """State's initial_limit as pyinfra_cli/cli.py builds it (_apply_inventory_limit, _apply_inventory_exclude): the
    hosts or groups named, None without either option. (Importing pyinfra_cli would monkey-patch the test process.)"""
    def matches(names: tuple) -> list:
        return [h for n in names for h in (inventory.get_group(n, None) or [inventory.get_host(n)]) if h]
    hosts = matches(limit) if limit else None
    if exclude:
        hosts = [h for h in (hosts if hosts is not None else list(inventory)) if h not in matches(exclude)]
    return hosts


@pytest.mark.parametrize("limit, exclude, line", [
    ((), (), None),
    (("head",), (), "--limit is not used with deploy.py: the two Sparks are one server; run it without --limit"),
    (("spark-b",), (), "--limit is not used with deploy.py: the two Sparks are one server; run it without --limit"),
    (("head", "worker"), (), None),
    ((), ("worker",), "--exclude is not used with deploy.py: the two Sparks are one server; run it without --exclude"),
])
def test_the_limit_in_pyinfras_state(monkeypatch, limit, exclude, line):
    """pyinfra's State with the limit the CLI gives it, read through pyinfra's context as deploy.py reads it."""
    inventory = pair_inventory()
    state = State(inventory, Config(), initial_limit=cli_limit(inventory, limit, exclude))
    argv = ["pyinfra", "inventory.py", "deploy.py", *(f"--limit={x}" for x in limit),
            *(f"--exclude={x}" for x in exclude)]
    monkeypatch.setattr(sys, "argv", argv)
    with ctx_state.use(state), ctx_inventory.use(inventory):
        if line is None:
            refuse_part_of_pair("deploy.py")
        else:
            with pytest.raises(RunStopped) as refused:
                refuse_part_of_pair("deploy.py")
            assert str(refused.value) == line


@pytest.mark.parametrize("script", ["deploy.py", "stop.py", "restart.py"])
def test_the_changing_scripts_refuse_before_reading_settings(script):
    text = (ROOT / script).read_text()
    call = f'refuse_part_of_pair("{script}")'
    assert text.count(call) == 1
    if "current_settings()" in text:
        assert text.index(call) < text.index("current_settings()")
    else:  # restart.py: before it includes deploy.py, whose own check would name deploy.py
        assert text.index(call) < text.index('local.include("deploy.py")')


@pytest.mark.parametrize("script", ["status.py", "logs.py"])
def test_the_read_only_tools_accept_a_limit(script):
    assert "refuse_part_of_pair" not in (ROOT / script).read_text()
