"""The checks that need nothing from a Spark, run by inventory.py before pyinfra connects: the site file, each
Spark's ssh key file, and (for the scripts that stop on them) the settings of both Sparks, read from the sources
pyinfra is about to merge. A typo is named even when a Spark does not answer, and every problem in one run.

The settings are read again after connecting (operations/settings/context.py), where each Spark's home is known:
a problem that depends on the home (an empty path setting resolves under it) is left to that check.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from operations.settings.model import PROJECT_ROOT, pair
from operations.settings.rules import validate_all
from operations.settings.site import (
    ROLES,
    SiteError,
    host_entries,
    parse_site,
    settings_only,
    site_heading,
    site_path,
    ssh_target,
)
from operations.settings.sources import Layers, load, saved_hf_token
from operations.settings.ssh_login import Run, hint_unanswered, ssh_config_login
from operations.util.checks import RunStopped

# The scripts that stop on a settings problem (restart.py includes deploy.py); the others go on despite one (stop.py,
# rollback.py) or list it (status.py).
STOP_ON_SETTINGS = frozenset(("deploy.py", "restart.py", "link_check.py"))
# The scripts that change the pair: run on both Sparks or on none (--limit and --exclude are refused).
WHOLE_PAIR = frozenset(("deploy.py", "restart.py", "stop.py", "rollback.py", "link_check.py"))
# pyinfra gives every host of inventory.py the group `inventory` too (the file's name), after its role's group
INVENTORY_GROUP = "inventory"
# Two homes, neither below the other: a problem found under one only depends on the home, which only the Spark knows.
_HOMES = ("/home/sparkfold-check-a", "/srv/sparkfold-check-b")
TITLE = "the settings need fixing before anything is changed (checked before connecting to the Sparks)"
Entries = dict[str, tuple[str, dict]]  # role -> (pyinfra's host name, host data): host_entries of the site file


class NotReady(RunStopped):
    """What must be fixed before pyinfra connects; the message lists every problem with its fix (inventory.py prints
    it and exits 2 itself: pyinfra's own error line would name its source file)."""


@dataclass(frozen=True)
class CommandLine:
    """What pyinfra's command line adds: its override data (--data, and --user/--port/--key), the extra
    --group-data folders, the scripts it runs (their file names), its --limit and --exclude patterns."""

    override: Mapping[str, Any] = field(default_factory=dict)
    group_data_folders: tuple[str, ...] = ()
    scripts: frozenset[str] = frozenset()
    limit: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()


def command_line() -> CommandLine:
    """The options of the pyinfra run that is loading inventory.py (its click context); empty outside one."""
    # imported here: pyinfra_cli patches gevent into whatever imports it (the CLI that runs inventory.py has already)
    import click
    from pyinfra_cli.util import parse_cli_arg

    context = click.get_current_context(silent=True)
    if context is None:
        return CommandLine()
    params = context.params
    # as pyinfra builds its override data: each --data key=value parsed, then the ssh options
    override: dict[str, Any] = {key: parse_cli_arg(value)
                                for key, _, value in (arg.partition("=") for arg in params.get("data") or ())}
    for key in ("ssh_user", "ssh_key", "ssh_port"):
        if params.get(key):
            override[key] = params[key]
    return CommandLine(override=override, group_data_folders=tuple(params.get("group_data") or ()),
                       scripts=frozenset(os.path.basename(op) for op in params.get("operations") or ()),
                       limit=tuple(params.get("limit") or ()), exclude=tuple(params.get("exclude") or ()))


def limit_refusal(script: str, hosts: Sequence[str], limited_to: Sequence[str] | None,
                  argv: Sequence[str]) -> str | None:
    """The line refusing a run of `script` that pyinfra's --limit (or --exclude) narrowed to part of the pair, else
    None. hosts: the inventory's names; limited_to: the names the run is limited to (None: no limit)."""
    if limited_to is None or set(hosts) <= set(limited_to):
        return None
    given = {arg.split("=", 1)[0] for arg in argv}
    option = "--exclude" if "--exclude" in given and "--limit" not in given else "--limit"
    return f"{option} is not used with {script}: the two Sparks are one server; run it without {option}"


def limited_names(entries: Entries, limit: Sequence[str], exclude: Sequence[str]) -> list[str] | None:
    """The host names a run with these --limit/--exclude patterns reaches, matched as pyinfra's CLI matches them
    (a group's name, else a glob over host names); None without either option."""
    groups = {role: [entries[role][0]] for role in ROLES}
    groups[INVENTORY_GROUP] = [entries[role][0] for role in ROLES]
    names = groups[INVENTORY_GROUP]

    def matches(patterns: Sequence[str]) -> set[str]:
        return {name for pattern in patterns for name in groups.get(pattern) or fnmatch.filter(names, pattern)}

    limited = sorted(matches(limit)) if limit else None
    if exclude:
        limited = [name for name in (limited if limited is not None else names) if name not in matches(exclude)]
    return limited


def whole_pair_problems(entries: Entries, cli: CommandLine) -> list[str]:
    """A script that changes the pair, narrowed by --limit or --exclude to one Spark: refused before connecting, so
    a Spark that does not answer cannot hide it behind pyinfra's connection error."""
    scripts = sorted(cli.scripts & WHOLE_PAIR)
    given = ["--limit"] * bool(cli.limit) + ["--exclude"] * bool(cli.exclude)
    refusal = scripts and limit_refusal(scripts[0], [entries[role][0] for role in ROLES],
                                        limited_names(entries, cli.limit, cli.exclude), given)
    return [refusal] if refusal else []


def with_ssh_logins(entries: Entries, groups: Mapping[str, Mapping[str, Any]], override: Mapping[str, Any],
                    run: Run | None = None) -> tuple[Entries, list[str]]:
    """entries with the ssh user (and port) `ssh -G` resolves for each Spark that no source names a user for (as
    ssh, and pyinfra, would log in: ~/.ssh/config, else this machine's user), and a problem for each ssh could not
    resolve."""
    layers = host_layers(entries, groups, override)
    resolved, problems = dict(entries), []
    for role in ROLES:
        data = layers[role].merged()
        if data.get("ssh_user"):
            continue
        port = data.get("ssh_port")
        found = ssh_config_login(str(data.get("ssh_hostname")), int(str(port)) if str(port or "").isdigit() else None,
                                 *([run] if run else []))
        if isinstance(found, str):
            problems.append(f"{role}: no ssh_user is set and {found}: set {role}.ssh_user in the site file to the "
                            "login on that Spark")
            continue
        name, host_data = entries[role]
        resolved[role] = (name, {**host_data, "ssh_user": found[0], **({} if port else {"ssh_port": found[1]})})
    return resolved, problems


def group_data(folders: Sequence[str]) -> dict[str, dict[str, Any]]:
    """group name -> its data, read from `folders` in order as pyinfra reads group_data (its own reader: the same
    names kept, imports and dunders dropped)."""
    # private, but a reader of our own could disagree with pyinfra's; imported here as in command_line
    from pyinfra_cli.inventory import _get_group_data

    merged: dict[str, dict[str, Any]] = {}
    for folder in folders:
        for group, data in _get_group_data(folder).items():
            merged.setdefault(group, {}).update(data)
    return merged


def group_data_folders(project_root: Path, cwd: Path, extra: Sequence[str] = ()) -> list[str]:
    """The folders pyinfra reads group data from, in its order: the working directory's group_data, the inventory
    file's (when that is another folder), then --group-data."""
    folders = [str(cwd / "group_data")]
    if project_root.resolve() != cwd.resolve():
        folders.append(str(project_root / "group_data"))
    return folders + list(extra)


def host_layers(entries: Entries, groups: Mapping[str, Mapping[str, Any]],
                override: Mapping[str, Any]) -> dict[str, Layers]:
    """role -> the Layers pyinfra will merge into that Spark's host.data."""
    return {role: Layers(all=groups.get("all", {}),
                         group={**groups.get(role, {}), **groups.get(INVENTORY_GROUP, {})},
                         site=entries[role][1], override=override)
            for role in ROLES}


def settings_problems(layers: Mapping[str, Layers], names: Mapping[str, str], environ: Mapping[str, str],
                      saved_token: Callable[[], str | None] | None = None) -> list[str]:
    """validate_all's problems of both Sparks that hold whatever each Spark's home is (names: role -> pyinfra's
    host name; saved_token: where the Hugging Face token comes from without HF_TOKEN, as in context.py)."""
    found = []
    for home in _HOMES:
        (head, head_problems), (worker, worker_problems) = (load(layers[role], environ, home, saved_token)
                                                            for role in ROLES)
        head, worker = pair(head, worker)
        head_target, worker_target = (ssh_target(layers[role].merged(), names[role]) for role in ROLES)
        found.append(validate_all(head, worker, head_target, worker_target, loaded=(head_problems, worker_problems)))
    return [problem for problem in found[0] if problem in found[1]]


def ssh_key_problems(layers: Mapping[str, Layers], cwd: Path) -> list[str]:
    """A Spark whose ssh_key names no file on this machine: pyinfra would stop with a traceback as it connects."""
    problems = []
    for role in ROLES:
        data = layers[role].merged()
        key = data.get("ssh_key")
        if not key or not isinstance(key, str):
            continue
        path = Path(key).expanduser()
        if path.is_file() or (cwd / path).is_file():  # pyinfra also tries a relative key below its working folder
            continue
        where = layers[role].source_of("ssh_key").replace("--data", "--data or --key")
        port, user = str(data.get("ssh_port") or 22), f"{data['ssh_user']}@" if data.get("ssh_user") else ""
        target = f"{'' if port == '22' else f'-p {port} '}{user}{data.get('ssh_hostname', '')}"
        problems.append(
            f"{role}: ssh_key = {str(path)!r} (from {where}) is no file on this machine: make the key with "
            f"`ssh-keygen -t ed25519 -f {path}` and put it on the Spark with `ssh-copy-id -i {path} {target}`, or "
            "set ssh_key to the private key you use (without ssh_key, your ssh agent and ~/.ssh/config are used)")
    return problems


def listed(title: str, problems: Sequence[str]) -> str:
    """A title and its problems, one per line: how sparkfold prints a list that stops a run."""
    return title + ":\n  - " + "\n  - ".join(problems)


def problems_before_connect(entries: Entries, groups: Mapping[str, Mapping[str, Any]],
                            cli: CommandLine, environ: Mapping[str, str], cwd: Path,
                            saved_token: Callable[[], str | None] | None = None) -> list[str]:
    """Every problem a run of cli.scripts stops on that needs nothing from a Spark. entries: host_entries of the site
    file; groups: group_data; saved_token: as for settings_problems."""
    layers = host_layers(entries, groups, cli.override)
    problems = ssh_key_problems(layers, cwd)
    if cli.scripts & STOP_ON_SETTINGS:
        problems += settings_problems(layers, {role: entries[role][0] for role in ROLES}, environ, saved_token)
    return problems


def checked_entries(project_root: Path = PROJECT_ROOT, environ: Mapping[str, str] = os.environ,
                    run: Run | None = None) -> Entries:
    """inventory.py's hosts (role -> (pyinfra host name, host data)) once everything that needs no Spark is clean
    for the pyinfra run loading it; raises NotReady naming every problem, the site file's and the settings' in one
    run. A Spark without ssh_user gets the user `ssh -G` resolves (run: how ssh is run; tests pass their own), and
    pyinfra's error for a Spark that does not answer gets the ssh line that shows why."""
    named_by = "SPARKFOLD_SITE" if environ.get("SPARKFOLD_SITE") else None
    path = site_path(project_root, environ)
    try:
        site, site_problems = parse_site(path, named_by=named_by)
    except SiteError as exc:
        raise NotReady(str(exc)) from None
    # a site file with problems still gives the settings: theirs are listed with the file's, not a run later
    entries = host_entries(settings_only(site) if site_problems else site)
    cli, cwd = command_line(), Path.cwd()
    groups = group_data(group_data_folders(project_root, cwd, cli.group_data_folders))
    login_problems: list[str] = []
    refused: list[str] = []
    if not site_problems:  # else the Sparks' names and ssh are not known yet
        entries, login_problems = with_ssh_logins(entries, groups, cli.override, run)
        refused = whole_pair_problems(entries, cli)
    problems = login_problems + problems_before_connect(entries, groups, cli, environ, cwd, saved_token=saved_hf_token)
    found = ([listed(site_heading(path), site_problems)] if site_problems else []) + refused
    found += [listed(TITLE, problems)] if problems else []
    if found:
        raise NotReady("\n".join(found))
    layers = host_layers(entries, groups, cli.override)
    hint_unanswered({entries[role][0]: layers[role].merged() for role in ROLES})
    return entries
