"""Docker with the NVIDIA runtime: daemon.json merge (other keys kept), restart exactly when needed, packages,
the docker group."""

import getpass
import grp
import json
import os
import re
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from core_facts import merged, remote_file, run_put, unit
from harness import first_planned, parse_fact, refused, run_fact, run_op, with_args
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, FileContents
from pyinfra.facts.server import Date

from operations import docker_runtime as dr
from operations.docker import daemon
from operations.facts.docker import ContainerRuntimeTools, DaemonJson, DockerRuntimeInfo, RunningContainers
from operations.facts.host import UserGroups

FIX = Path(__file__).parent / "fixtures" / "host"
PATH = "path=/etc/docker/daemon.json"
NVIDIA_LIVE = {"reachable": True, "default_runtime": "nvidia", "runtimes": ["io.containerd.runc.v2", "nvidia", "runc"],
               "root_dir": "/var/lib/docker"}
RUNC_LIVE = {"reachable": True, "default_runtime": "runc", "runtimes": ["io.containerd.runc.v2", "runc"],
             "root_dir": "/var/lib/docker"}


def daemon_facts(daemon_json, live, running=None):
    return {DaemonJson: with_args({PATH: daemon_json}), DockerRuntimeInfo: live,
            RunningContainers: {NAME: True} if running is None else running}


NAME = "dsv41-1017-exl3-tf"


# --- facts ---------------------------------------------------------------------------------------------------

def test_daemon_json_fact_reads_user_file():
    got = parse_fact(DaemonJson, (FIX / "daemon-json-user.json").read_text())
    assert got["exists"] and got["error"] is None
    assert got["config"]["data-root"] == "/data/docker" and "crun" in got["config"]["runtimes"]


def test_daemon_json_fact_missing_empty_malformed():
    assert parse_fact(DaemonJson, "##ABSENT##") == {"exists": False, "config": {}, "error": None}
    assert parse_fact(DaemonJson, "##EXISTS##\n") == {"exists": True, "config": {}, "error": None}
    bad = parse_fact(DaemonJson, (FIX / "daemon-json-bad.json").read_text())
    assert bad["config"] is None and "line" in bad["error"]
    assert parse_fact(DaemonJson, "##EXISTS##\n[1, 2]")["config"] is None


def test_runtime_info_and_tools():
    live = parse_fact(DockerRuntimeInfo, 'info=nvidia|/var/lib/docker|{"io.containerd.runc.v2":{"path":"runc"},'
                                          '"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}')
    assert live == NVIDIA_LIVE
    assert parse_fact(DockerRuntimeInfo, "##UNREACHABLE##")["reachable"] is False
    assert parse_fact(DockerRuntimeInfo, "##UNREACHABLE##")["root_dir"] == ""
    # a root dir that is not a path (an odd docker) reads as unknown, so the preflight measures its default
    assert parse_fact(DockerRuntimeInfo, 'info=runc|<no value>|{}')["root_dir"] == ""
    tools = parse_fact(ContainerRuntimeTools, "docker=yes\nnvidia-container-runtime=no\n")
    assert tools == {"docker": True, "nvidia-container-runtime": False}


# --- merge ---------------------------------------------------------------------------------------------------

def test_merge_keeps_every_other_key():
    user = parse_fact(DaemonJson, (FIX / "daemon-json-user.json").read_text())["config"]
    merged = daemon.merged_daemon_config(user)
    assert merged["runtimes"]["nvidia"] == {"path": "nvidia-container-runtime", "runtimeArgs": []}
    assert merged["runtimes"]["crun"] == {"path": "/usr/bin/crun"}
    assert merged["default-runtime"] == "nvidia"
    assert {k: v for k, v in merged.items() if k not in ("runtimes", "default-runtime")} == \
        {"log-driver": "json-file", "log-opts": {"max-size": "10m"}, "data-root": "/data/docker"}
    assert "default-runtime" not in user  # the input is not modified


# --- daemon_uses_nvidia --------------------------------------------------------------------------------------

DAEMON = "/etc/docker/daemon.json"


def daemon_op(daemon_json, live, text=None, dir_exists=True, running=True):
    """daemon_uses_nvidia against the file's facts (`text` on disk) and docker.service running or not."""
    facts = merged(daemon_facts(daemon_json, live), remote_file(DAEMON, text, dir_exists=dir_exists),
                   unit("docker.service", running, True))
    return run_put(dr.daemon_uses_nvidia, facts)


def test_missing_file_is_written_and_docker_restarted_together():
    cmds, uploads, _ = daemon_op({"exists": False, "config": {}, "error": None}, RUNC_LIVE, dir_exists=False)
    assert cmds[0] == "mkdir -p /etc/docker"
    assert not any("sparkfold-backup" in c for c in cmds)  # nothing to back up
    assert list(uploads) == [DAEMON] and json.loads(uploads[DAEMON]) == daemon.merged_daemon_config({})
    assert f"chmod 644 {DAEMON}" in cmds
    assert cmds[-2] == "systemctl restart docker.service"
    assert "DefaultRuntime" in cmds[-1] and "exit 1" in cmds[-1]
    # docker not running yet: started (with the new file) instead
    cmds, _, _ = daemon_op({"exists": False, "config": {}, "error": None}, RUNC_LIVE, running=False)
    assert cmds[-2] == "systemctl start docker.service"


def test_user_file_is_merged_backed_up_and_restart_follows():
    text = (FIX / "daemon-json-user.json").read_text()
    current = parse_fact(DaemonJson, text)
    cmds, uploads, _ = daemon_op(current, NVIDIA_LIVE, text=text)
    assert "cp -p /etc/docker/daemon.json /etc/docker/daemon.json.sparkfold-backup" in cmds
    new = json.loads(uploads[DAEMON])
    assert new == daemon.merged_daemon_config(current["config"]) and new["data-root"] == "/data/docker"
    assert cmds.index("systemctl restart docker.service") > cmds.index(f"chmod 644 {DAEMON}")


def test_converged_changes_nothing():
    config = daemon.merged_daemon_config({"log-driver": "json-file"})
    cmds, _, h = daemon_op({"exists": True, "config": config, "error": None}, NVIDIA_LIVE,
                           text=daemon.render_daemon_json(config))
    assert cmds == [] and h.noops == ["docker uses the nvidia runtime"]


def test_same_settings_in_another_layout_are_left_alone():
    config = daemon.merged_daemon_config({"log-driver": "json-file"})
    cmds, _, _ = daemon_op({"exists": True, "config": config, "error": None}, NVIDIA_LIVE, text=json.dumps(config))
    assert cmds == []  # compared parsed: the user's formatting is not rewritten


def test_right_file_but_stale_daemon_restarts_only():
    config = daemon.merged_daemon_config({})
    cmds, uploads, _ = daemon_op({"exists": True, "config": config, "error": None}, RUNC_LIVE,
                                 text=daemon.render_daemon_json(config))
    assert cmds[0] == "systemctl restart docker.service" and len(cmds) == 2 and uploads == {}


def test_a_restart_that_would_stop_other_containers_is_refused_unless_allowed(caplog):
    running = {NAME: True, "grafana": False, "jupyter": False}
    # the file is right, the daemon still runs another default runtime: only a restart is needed
    config = daemon.merged_daemon_config({})
    facts = merged(daemon_facts({"exists": True, "config": config, "error": None}, RUNC_LIVE, running),
                   remote_file(DAEMON, daemon.render_daemon_json(config)), unit("docker.service", True, True))
    cmds, _, _ = run_put(dr.daemon_uses_nvidia, facts, executing=True)
    assert len(cmds) == 1 and "exit 1" in cmds[0]
    assert "would stop these containers that are not sparkfold" in cmds[0] and ": grafana, jupyter." in cmds[0]
    assert "docker_restart_ok = true" in cmds[0]
    with caplog.at_level("WARNING", logger="pyinfra"):
        run_put(dr.daemon_uses_nvidia, facts, executing=False)
    assert ("warning: a Docker restart: restarting Docker for the nvidia runtime stops: dsv41-1017-exl3-tf, grafana, "
            "jupyter") in caplog.text
    assert "will fail: a Docker restart" in caplog.text
    cmds, _, _ = run_put(dr.daemon_uses_nvidia, facts, executing=True, restart_ok=True)
    assert any("restart docker.service" in c for c in cmds)  # allowed: the restart goes ahead
    assert dr.restart_problem({NAME: True}, False) is None  # only our own rank would stop


def test_malformed_file_fails_and_is_never_written(caplog):
    bad = parse_fact(DaemonJson, (FIX / "daemon-json-bad.json").read_text())
    command, warnings = refused(caplog, dr.daemon_uses_nvidia, daemon_facts(bad, RUNC_LIVE))
    assert "daemon.json: /etc/docker/daemon.json is not valid JSON" in command and "will not overwrite" in command
    assert "will fail: daemon.json: /etc/docker/daemon.json is not valid JSON" in warnings


ANSI = re.compile(r"\x1b\[[0-9;]*m")
UNREACHABLE = {"reachable": False, "default_runtime": "", "runtimes": [], "root_dir": ""}
FILE_OK = {"exists": True, "config": daemon.merged_daemon_config({"log-level": "warn"}), "error": None}
# the merged file with default-runtime dropped by hand (still running with nvidia: no restart since)
DRIFTED = {"exists": True, "config": {"log-level": "warn", "runtimes": {"nvidia": daemon.NVIDIA_RUNTIME}},
           "error": None}


@pytest.mark.parametrize("current, live, file_changes, restart", [
    (FILE_OK, NVIDIA_LIVE, False, ""),
    (DRIFTED, NVIDIA_LIVE, True, "daemon.json changes"),
    ({"exists": False, "config": {}, "error": None}, UNREACHABLE, True, "daemon.json changes"),
    (FILE_OK, RUNC_LIVE, False, "its default runtime is runc, not nvidia"),
    (FILE_OK, UNREACHABLE, False, "Docker does not answer"),
    (FILE_OK, {**RUNC_LIVE, "default_runtime": ""}, False, "its default runtime is unknown, not nvidia"),
])
def test_the_docker_restart_decision(current, live, file_changes, restart):
    change = daemon.daemon_change(current, live)
    assert change is not None and (change.file_changes, change.restart) == (file_changes, restart)
    assert change.wanted == daemon.merged_daemon_config(current["config"])
    assert daemon.docker_restart(current, live) == restart


def test_a_malformed_file_restarts_nothing():
    bad = {"exists": True, "config": None, "error": "Expecting value: line 1 column 1 (char 0)"}
    assert daemon.daemon_change(bad, RUNC_LIVE) is None  # the docker step refuses it
    assert daemon.docker_restart(bad, RUNC_LIVE) == ""


def test_the_step_restarts_exactly_when_the_decision_says():
    """The docker step and the rank step ask one function: the step restarts Docker for each case it names."""
    for current, live in ((FILE_OK, NVIDIA_LIVE), (DRIFTED, NVIDIA_LIVE), (FILE_OK, RUNC_LIVE)):
        text = daemon.render_daemon_json(current["config"])
        cmds, _, _ = daemon_op(current, live, text=text)
        restarts = any("restart docker.service" in c for c in cmds)
        assert restarts is bool(daemon.docker_restart(current, live)), (current, live, cmds)


def test_dry_diff_shows_the_daemon_json_it_writes(caplog):
    """--dry --diff: pyinfra stops the operation at its first command (the backup's cp), so files.put's unified
    diff must be printed before it, as for every other file sparkfold writes."""
    text = daemon.render_daemon_json(DRIFTED["config"])
    facts = merged(daemon_facts(DRIFTED, NVIDIA_LIVE), remote_file(DAEMON, text),
                   unit("docker.service", True, True), {FileContents: with_args({f"path={DAEMON}": text.splitlines()})})
    with caplog.at_level("INFO", logger="pyinfra"):
        first, _ = first_planned(dr.daemon_uses_nvidia, facts, diff=True)
    assert first == f"cp -p {DAEMON} {DAEMON}.sparkfold-backup"
    lines = [ANSI.sub("", r.getMessage()).strip() for r in caplog.records]
    assert f"[spark] Will modify {DAEMON}" in lines
    changed = [line for line in lines if line[:2] in ("- ", "+ ")]
    assert changed == ["-   }", "+   },", '+   "default-runtime": "nvidia"']
    caplog.clear()
    with caplog.at_level("INFO", logger="pyinfra"):
        first_planned(dr.daemon_uses_nvidia, facts, diff=False)
    assert "Will modify" not in caplog.text  # without --diff: only the plan


# --- packages and group --------------------------------------------------------------------------------------

def apt_facts(tools, apt_index_age_s=None):
    """ContainerRuntimeTools, and what apt.packages reads: installed packages, the apt index stamp and the date."""
    now = datetime(2025, 6, 1, 12, 0, 0)
    stamp = None if apt_index_age_s is None else {"mtime": now - timedelta(seconds=apt_index_age_s)}
    return {ContainerRuntimeTools: tools, DebPackages: {}, Date: now,
            File: with_args({"path=/var/lib/apt/periodic/update-success-stamp": stamp})}


def test_runtime_installed_both_ways(caplog):
    have = {ContainerRuntimeTools: {"docker": True, "nvidia-container-runtime": True}}
    assert run_op(dr.runtime_installed, have)[0] == []
    cmds, _ = run_op(dr.runtime_installed, apt_facts({"docker": True, "nvidia-container-runtime": False}),
                     install=True)
    assert cmds[0] == "apt-get update" and "touch /var/lib/apt/periodic/update-success-stamp" in cmds
    assert "install nvidia-container-toolkit" in cmds[-1] and "docker.io" not in cmds[-1]
    command, warnings = refused(caplog, dr.runtime_installed, {ContainerRuntimeTools: {}}, install=False)
    assert "missing: docker.io, nvidia-container-toolkit" in command and "docker_install = True" in command
    assert "will fail: the container runtime: missing: docker.io, nvidia-container-toolkit" in warnings


def test_runtime_install_skips_a_fresh_apt_index():
    cmds, _ = run_op(dr.runtime_installed, apt_facts({"docker": True}, apt_index_age_s=60), install=True)
    assert "apt-get update" not in cmds and len(cmds) == 1 and "install nvidia-container-toolkit" in cmds[0]
    cmds, _ = run_op(dr.runtime_installed, apt_facts({"docker": True}, apt_index_age_s=dr.APT_CACHE_S + 60),
                     install=True)
    assert cmds[0] == "apt-get update"


def test_user_in_group_both_ways(monkeypatch, caplog):
    calls, op = [], dr.user_in_group
    monkeypatch.setattr(dr, "user_in_group", lambda **kw: calls.append(kw))
    monkeypatch.setattr(dr, "runtime_installed", lambda **kw: None)
    monkeypatch.setattr(dr, "daemon_uses_nvidia", lambda **kw: None)
    dr.docker_runtime._inner(SimpleNamespace(ssh_user="nvidia", docker_install=True, docker_restart_ok=False))
    wanted = {k: v for k, v in calls[0].items() if k != "name"}
    assert wanted == {"user": "nvidia", "group": "docker"}
    cmds, _ = run_op(op, {UserGroups: with_args({"user=nvidia": ["nvidia", "sudo"]})}, **wanted)
    assert cmds == ["usermod -a -G docker nvidia"]  # appended: the other groups kept
    cmds, h = run_op(op, {UserGroups: with_args({"user=nvidia": ["nvidia", "docker"]})}, **wanted)
    assert cmds == [] and h.noops
    command, warnings = refused(caplog, op, {UserGroups: with_args({"user=nvidia": None})}, **wanted)
    assert "ssh_user: there is no user nvidia" in command and "will fail: ssh_user: there is no user nvidia" in warnings


def test_user_groups_fact_reads_id(tmp_path):
    assert parse_fact(UserGroups, "nvidia adm sudo docker\n") == ["nvidia", "adm", "sudo", "docker"]
    assert parse_fact(UserGroups, "#NOUSER\n") is None
    me = run_fact(UserGroups, user=getpass.getuser())  # the real `id -nG` of whoever runs the tests
    assert me and grp.getgrgid(os.getgid()).gr_name in me
    assert run_fact(UserGroups, user="no-such-user-sparkfold") is None
