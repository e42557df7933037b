"""The settings of this run's two Sparks: read once per host from pyinfra's data, paired, validated together."""

from __future__ import annotations

import os
import sys

from pyinfra import host as current_host
from pyinfra import inventory, state
from pyinfra.api.host import Host
from pyinfra.facts.server import Home

from operations.settings import Layers, Settings, load, pair, validate_all
from operations.settings.before_connect import limit_refusal  # inventory.py refuses the same before connecting
from operations.settings.site import ssh_target
from operations.settings.sources import saved_hf_token
from operations.util.checks import RunStopped
from operations.util.ssh_socket import send_without_delay

_loaded: dict[str, tuple[Settings, list[str]]] = {}


def layers_of(spark: Host) -> Layers:
    """The sources pyinfra merges into spark.data, kept apart so a problem can name where its value came from."""
    inv = spark.inventory
    return Layers(all=inv.get_data(), group=inv.get_groups_data(spark.groups), site=inv.get_host_data(spark.name),
                  override=inv.get_override_data())


def _load(spark: Host) -> tuple[Settings, list[str]]:
    if spark.name not in _loaded:
        send_without_delay(spark)  # every run reads its settings first: from here on, each command is sent at once
        # a Spark that did not answer (only the read-only tools go on without one) is not asked again
        home = (spark.get_fact(Home) if spark.connected else None) or f"/home/{spark.data.get('ssh_user') or 'root'}"
        _loaded[spark.name] = load(layers_of(spark), os.environ, home, saved_token=saved_hf_token)
    return _loaded[spark.name]


def pair_hosts() -> tuple[Host, Host]:
    """(head host, worker host) of the inventory."""
    return inventory.get_group("head")[0], inventory.get_group("worker")[0]


def reports_for_pair() -> bool:
    """Whether this host's run prints a read-only tool's report for both Sparks: the head's, or the worker's when
    the head did not answer."""
    head, _worker = pair_hosts()
    return current_host.name == head.name or not head.connected


def peer_host(s: Settings) -> Host:
    head, worker = pair_hosts()
    return worker if s.is_head else head


def pair_settings() -> tuple[Settings, Settings, list[str]]:
    """(the head's Settings, the worker's, each with the other's under .peer; every problem of the pair's
    settings)."""
    head, worker = pair_hosts()
    (head_settings, head_problems), (worker_settings, worker_problems) = _load(head), _load(worker)
    head_settings, worker_settings = pair(head_settings, worker_settings)
    problems = validate_all(head_settings, worker_settings, ssh_target(head.data, head.name),
                            ssh_target(worker.data, worker.name),
                            loaded=(head_problems, worker_problems))
    return head_settings, worker_settings, problems


def current_settings() -> tuple[Settings, list[str]]:
    """This host's Settings (with its peer's under .peer) and every problem of the pair's settings."""
    head_settings, worker_settings, problems = pair_settings()
    return (head_settings if current_host.name == pair_hosts()[0].name else worker_settings), problems


def refuse_part_of_pair(script: str) -> None:
    """Stop deploy.py, stop.py or restart.py run with --limit: the two ranks are one server, so a change to one Spark
    alone would leave the pair half changed (status.py and logs.py, which only read, accept it). inventory.py refuses
    it already before connecting; this is for a run without pyinfra's CLI."""
    limited = state.limit_hosts
    problem = limit_refusal(script, [spark.name for spark in inventory],
                            [spark.name for spark in limited] if isinstance(limited, list) else None, sys.argv)
    if problem:
        raise RunStopped(problem)
